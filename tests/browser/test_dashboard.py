"""`kubectl configpin dashboard` in a real browser (Debian's chromium, Playwright), against the
control plane with configpin registered as the chart registers it (two replicas, the
webhook's workloads and sources entries), on 1.20.2 and 1.36.2 (shared/SPEC.md "Dashboard"):

- a change rolls in waves and the timeline shows each wave in order as it happens, updated
  without a reload;
- Approve in the page releases the waves after `approve`; a user without the right to update
  the source sees it greyed with the reason (tests/browser/test_buttons.py: more), and nothing
  moves;
- "Used by" lists exactly the consumers of each key; the preview lists what
  `kubectl configpin plan` lists;
- a forged Host, a POST without the token and a cross-origin request are refused;
- no seeded Secret value appears in any page or JSON answer.

Each view's screenshot is taken here (docs/dashboard.md shows them). No kubelet: the fake
`Kubelet` reports pods Ready.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import http.server
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from kubernetes import client

from harness.configpin import Configpin, instance_namespace
from harness.controlplane import ControlPlane, service_account_kubeconfig, wait_for
from harness.kubelet import Kubelet
from harness.manifests import configmap, container, deployment, env_from, env_key_ref, pod_spec
from tests.browser.dashboards import Dashboard, running_dashboard, viewer_kubeconfig
from tests.integration.instances import replicas_fixture
from tests.integration.workloads import (
    As,
    get,
    kubectl_configpin,
    quiet,
    reader,
    set_cm,
    sources,
    stamped,
    state,
    wait_healthy,
)
from webhook.core.constants import ANN_APPROVED, ANN_CHANGED_BY
from webhook.kube.raw import Kube, path

INSTANCE = "dash"
WAVES = "1,1,approve,100%"
RESYNC = 2.0
ARGS = [
    "--coalesce-window", "0.5",
    "--min-rollout-interval", "0",
    "--resync-period", str(RESYNC),
    "--rollout-waves", WAVES,
]  # fmt: skip
ALICE = "alice@example.com"
SEEKRIT = "pa55-Seekrit-9xq"  # a Secret value: in no page, in no JSON answer
LIVE = 30_000  # ms the page has to show what the cluster did (it is told within a second)

replicas = replicas_fixture(INSTANCE, "dash", ARGS)


@pytest.fixture
def ns(k8s: client.ApiClient, replicas: list[Configpin]) -> Iterator[str]:
    with instance_namespace(k8s, INSTANCE, "dash") as name:
        yield name


# --- helpers ----------------------------------------------------------------------------------


def _workloads(kube: Kube, ns: str, names: list[str]) -> dict[str, dict[str, str]]:
    """ConfigMap `cfg` (a: "1") and Deployments `names` reading its key `a`, Ready and
    healthy; the template record each was stamped with."""
    with Kubelet(kube, ns) as kubelet:
        kubelet.allow(*names)
        kube.create(path("configmaps", ns), configmap("cfg", {"a": "1"}))
        for name in names:
            kube.create(path("deployments", ns), reader(name))
        before = {n: sources(stamped(kube, ns, n)) for n in names}
        wait_healthy(kube, ns, names)
    return before


def _rows(page: Any) -> dict[str, tuple[int, str]]:
    """The timeline as the page shows it: workload name -> (wave, state)."""
    found = page.eval_on_selector_all(
        "tr[data-workload]",
        "rows => rows.map(r => [r.dataset.workload, r.dataset.rowWave, r.dataset.rowState])",
    )
    return {w.rsplit("/", 1)[1]: (int(wave), st) for w, wave, st in found}


def _shot(page: Any, folder: Path, name: str) -> None:
    page.wait_for_timeout(300)  # (fonts settle)
    page.screenshot(path=str(folder / name), full_page=False)


def _get(d: Dashboard, route: str, host: str | None = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=30)
    try:
        conn.putrequest("GET", route, skip_host=True)
        conn.putheader("Host", host or f"localhost:{d.port}")
        conn.endheaders()
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def _post(
    d: Dashboard, route: str, body: Mapping[str, Any], headers: Mapping[str, str]
) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=30)
    try:
        data = json.dumps(body).encode()
        conn.putrequest("POST", route, skip_host=True)
        for name, value in {"Host": f"localhost:{d.port}", **headers}.items():
            conn.putheader(name, value)
        conn.putheader("Content-Length", str(len(data)))
        conn.endheaders(data)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def _approved(kube: Kube, ns: str) -> str | None:
    meta = get(kube, ns, "cfg", "configmaps")["metadata"]
    found = (meta.get("annotations") or {}).get(ANN_APPROVED)
    return str(found) if found is not None else None


# --- the timeline and Approve -------------------------------------------------------------------


def test_a_change_rolls_in_waves_shown_in_order_as_it_happens_and_approve_releases_the_rest(
    kube: Kube,
    k8s: client.ApiClient,
    control_plane: ControlPlane,
    ns: str,
    page: Any,
    browser: Any,
    shots: Path,
    tmp_path: Path,
) -> None:
    """configpin rolls a change of `cfg` to five Deployments in waves 1, 1, approve, 100%.
    The page, opened before the change and never reloaded, shows the change, then each wave
    rolling and complete in the order configpin rolled them (the records' start times), the
    last wave waiting for an approval. The viewer's Approve is greyed with the reason and
    nothing moves; the admin's releases the last wave, which the page shows rolling
    to complete."""
    names = [f"web-{i}" for i in range(5)]
    before = _workloads(kube, ns, names)
    viewer = viewer_kubeconfig(control_plane, kube, ns, tmp_path)
    seen: dict[str, list[tuple[float, int, str]]] = {n: [] for n in names}

    def look() -> dict[str, tuple[int, str]]:
        rows = _rows(page)
        for name, (wave, st) in rows.items():
            if not seen[name] or seen[name][-1][2] != st:
                seen[name].append((time.monotonic(), wave, st))
        return rows

    with (
        running_dashboard(control_plane.kubeconfig, ns) as admin,
        running_dashboard(viewer, ns) as refused,
        Kubelet(kube, ns) as kubelet,
    ):
        kubelet.allow(*names, after=4.0)  # each pod Ready 4 s after it appears
        page.goto(admin.url)
        page.wait_for_selector("text=No change of a consumed ConfigMap", timeout=LIVE)
        set_cm(As(k8s, ALICE), ns, "2")
        page.wait_for_selector("tr[data-change]", timeout=LIVE)  # no reload: it came live
        _shot(page, shots, "changes.png")
        page.click("tr[data-change]")
        page.wait_for_selector("tr[data-workload]", timeout=LIVE)
        change_url = page.url

        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            rows = look()
            done = [n for n, (w, st) in rows.items() if w <= 2 and st == "complete"]
            waiting = [n for n, (w, st) in rows.items() if w == 3 and st == "waiting"]
            if len(rows) == 5 and len(done) == 2 and len(waiting) == 3:
                break
            time.sleep(0.2)
        else:
            raise AssertionError(f"the page never showed waves 1 and 2 complete: {seen}")
        page.wait_for_selector("[data-testid=approve]", timeout=LIVE)
        assert page.is_visible("text=an approval")
        _shot(page, shots, "change.png")

        # The page's waves are configpin's: the records' start times in the page's order.
        waves = {n: w for n, (w, _) in _rows(page).items()}
        assert sorted(waves.values()) == [1, 2, 3, 3, 3], waves
        started = {n: get(kube, ns, n)["metadata"]["annotations"] for n in names}
        first, second = (next(n for n, w in waves.items() if w == k) for k in (1, 2))
        since = {
            n: json.loads(started[n]["configpin.io/rollout"])["since"] for n in (first, second)
        }
        assert since[first] < since[second]
        assert all(state(get(kube, ns, n)) is None for n, w in waves.items() if w == 3)
        # ... and the page showed them as they happened: wave 1 rolling, then complete, before
        # wave 2 was shown rolling; each first shown rolling, then complete
        for name in (first, second):
            states = [st for _, _, st in seen[name]]
            assert "rolling" in states and states.index("rolling") < states.index("complete"), (
                name,
                seen[name],
            )
        first_complete = next(t for t, _, st in seen[first] if st == "complete")
        second_rolling = next(t for t, _, st in seen[second] if st == "rolling")
        assert first_complete <= second_rolling, seen

        # The viewer may not update the source: Approve greyed with the reason before anything
        # is pressed (the API server asked: a SelfSubjectAccessReview); pressed, nothing moves.
        other = browser.new_page()
        try:
            other.goto(refused.url + change_url.split("/", 3)[3])
            button = other.wait_for_selector(
                "[data-testid=approve][aria-disabled=true]", timeout=LIVE
            )
            reason = other.inner_text("#" + (button.get_attribute("aria-describedby") or "none"))
            assert "do not allow updating ConfigMap " + ns + "/cfg" in reason, reason
            other.focus("[data-testid=approve]")
            other.keyboard.press("Enter")
            other.wait_for_timeout(1000)
            assert not other.query_selector("[data-testid=approve-message]")
        finally:
            other.close()
        assert _approved(kube, ns) is None
        later = {n: s for n, s in before.items() if waves[n] == 3}
        quiet(kube, ns, later, 2 * RESYNC)

        # The admin's Approve releases the last wave; the page shows it roll to complete.
        page.click("[data-testid=approve]")
        message = page.wait_for_selector("[data-testid=approve-message]", timeout=LIVE)
        assert "approved" in message.inner_text()
        assert json.loads(_approved(kube, ns) or "{}").get("user") == "admin"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            rows = look()
            if all(st == "complete" for st in (s for _, s in rows.values())) and len(rows) == 5:
                break
            time.sleep(0.2)
        else:
            raise AssertionError(f"the page never showed the last wave complete: {seen}")
        for name in later:
            assert "rolling" in [st for _, _, st in seen[name]], seen[name]
        _shot(page, shots, "change-complete.png")
    assert "Traceback" not in admin.log() + refused.log(), admin.log() + refused.log()


# --- Used by ------------------------------------------------------------------------------------


def _volume(name: str, source: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, **source}


def test_used_by_lists_exactly_the_consumers_of_each_key(
    kube: Kube, control_plane: ControlPlane, ns: str, page: Any, shots: Path
) -> None:
    """ConfigMap `app` (keys host, port, mode, unused) and Secret `creds` (user, pass), read
    by env, envFrom, an items volume, a whole volume, a subPath mount; a workload of another
    ConfigMap. Each key lists exactly its readers, how, and what a change does there."""
    kube.create(
        path("configmaps", ns),
        configmap("app", {"host": "h", "port": "1", "mode": "m", "unused": "u"}),
    )
    kube.create(path("configmaps", ns), configmap("other", {"host": "x"}))
    kube.create(
        path("secrets", ns),
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "creds"},
            "stringData": {"user": "u", "pass": SEEKRIT},
        },
    )
    env_host = container(env=[env_key_ref("configmap", "app", "host", "HOST")])
    from_all = container(env_from=[env_from("configmap", "app")])
    secret_pass = container(env=[env_key_ref("secret", "creds", "pass", "PASS")])
    other = container(env=[env_key_ref("configmap", "other", "host", "HOST")])
    items = pod_spec(container())
    items["containers"][0]["volumeMounts"] = [{"name": "cfg", "mountPath": "/etc/app"}]
    items["volumes"] = [
        _volume("cfg", {"configMap": {"name": "app", "items": [{"key": "port", "path": "p"}]}})
    ]
    sub = pod_spec(container())
    sub["containers"][0]["volumeMounts"] = [
        {"name": "cfg", "mountPath": "/etc/mode", "subPath": "mode"}
    ]
    sub["volumes"] = [_volume("cfg", {"configMap": {"name": "app"}})]
    refresh = pod_spec(container())
    refresh["containers"][0]["volumeMounts"] = [{"name": "cfg", "mountPath": "/etc/app"}]
    refresh["volumes"] = [_volume("cfg", {"configMap": {"name": "app"}})]
    made = {
        "env-host": deployment("env-host", pod_spec(env_host)),
        "from-all": deployment("from-all", pod_spec(from_all)),
        "items-port": deployment("items-port", items),
        "sub-mode": deployment("sub-mode", sub),
        "refresher": deployment(
            "refresher", refresh, annotations={"configpin.io/on-change": "refresh"}
        ),
        "secret-pass": deployment("secret-pass", pod_spec(secret_pass)),
        "reads-other": deployment("reads-other", pod_spec(other)),
    }
    for obj in made.values():
        kube.create(path("deployments", ns), obj)
    for name in made:
        stamped(kube, ns, name)
    every = {"from-all", "sub-mode", "refresher"}  # (envFrom, whole volumes)
    expected = {
        "host": every | {"env-host"},
        "port": every | {"items-port"},
        "mode": every,
        "unused": every,
    }
    with running_dashboard(control_plane.kubeconfig, ns) as d:
        page.goto(d.url + "#/sources")
        page.wait_for_selector(f"tr[data-source='configmap/{ns}/app']", timeout=LIVE)
        _shot(page, shots, "used-by.png")
        page.click(f"tr[data-source='configmap/{ns}/app']")
        page.wait_for_selector("[data-key=host] tr[data-consumer]", timeout=LIVE)
        for key, names in expected.items():
            shown = page.eval_on_selector_all(
                f"[data-key='{key}'] tr[data-consumer]", "rows => rows.map(r => r.dataset.consumer)"
            )
            assert sorted(shown) == sorted(f"Deployment/{n}" for n in names), (key, shown)
        assert page.eval_on_selector_all("[data-key]", "b => b.map(x => x.dataset.key)") == [
            "host",
            "mode",
            "port",
            "unused",
        ]
        row = page.inner_text("[data-key=mode] tr[data-consumer='Deployment/sub-mode']")
        assert "subPath" in row and "/etc/mode" in row and "roll" in row, row
        row = page.inner_text("[data-key=host] tr[data-consumer='Deployment/refresher']")
        assert "refresh" in row and "volume cfg" in row, row
        row = page.inner_text("[data-key=host] tr[data-consumer='Deployment/env-host']")
        assert "env HOST" in row, row
        _shot(page, shots, "used-by-keys.png")

        page.goto(d.url + f"#/source/secret/{ns}/creds")
        page.wait_for_selector("[data-key=pass] tr[data-consumer]", timeout=LIVE)
        assert page.eval_on_selector_all(
            "[data-key=pass] tr[data-consumer]", "rows => rows.map(r => r.dataset.consumer)"
        ) == ["Deployment/secret-pass"]
        assert not page.query_selector_all("[data-key=user] tr[data-consumer]")
        assert SEEKRIT not in page.content()


# --- Preview ------------------------------------------------------------------------------------


def test_the_preview_lists_what_plan_lists(
    kube: Kube, control_plane: ControlPlane, ns: str, page: Any, shots: Path, tmp_path: Path
) -> None:
    """A manifest changing key `a` of `cfg`, read by three Deployments and not by a fourth:
    the page's rows are `kubectl configpin plan -o json`'s, and nothing is changed."""
    names = ["api", "web", "worker"]
    _workloads(kube, ns, names)
    kube.create(path("deployments", ns), reader("batch", keys=("b",), optional=True))
    stamped(kube, ns, "batch")
    manifest = (
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n"
        f"  name: cfg\n  namespace: {ns}\ndata:\n  a: '7'\n  b: new\n"
    )
    file = tmp_path / "cfg.yaml"
    file.write_text(manifest)
    planned = kubectl_configpin(["plan", "-o", "json", "-f", str(file)], control_plane.kubeconfig)
    assert planned.returncode == 0, planned.stderr
    [plan] = json.loads(planned.stdout)
    want = sorted(
        (r["namespace"], r["kind"], r["name"], ",".join(r["keys"]) or "-", r["action"])
        for r in plan["rows"]
    )
    assert len(want) == 4
    version = get(kube, ns, "cfg", "configmaps")["metadata"]["resourceVersion"]
    with running_dashboard(control_plane.kubeconfig, ns) as d:
        page.goto(d.url + "#/preview")
        page.fill("#manifest", manifest)
        page.click("[data-testid=preview]")
        page.wait_for_selector("[data-plan] tr[data-plan-row]", timeout=LIVE)
        cells = page.eval_on_selector_all(
            "[data-plan] tr[data-plan-row]",
            "rows => rows.map(r => Array.from(r.cells).map(c => c.innerText))",
        )
        shown = sorted((c[0], *c[1].split("/"), c[2], c[3]) for c in cells)
        assert shown == want
        assert page.is_visible("text=keys a, b")
        _shot(page, shots, "preview.png")
    assert get(kube, ns, "cfg", "configmaps")["metadata"]["resourceVersion"] == version


# --- the fence ------------------------------------------------------------------------------------


class _Evil(http.server.BaseHTTPRequestHandler):
    """Another site (another origin: 127.0.0.1 on another port) whose page tries to read the
    dashboard's JSON and to approve through it."""

    target = ""

    def log_message(self, *_: object) -> None:
        pass

    def do_GET(self) -> None:
        body = f"""<!doctype html><body><pre id=out></pre><script>
const out = document.getElementById("out");
const say = (t) => {{ out.textContent += t + "\\n"; }};
fetch("{self.target}api/changes").then(r => r.text()).then(
  t => say("read:" + t), e => say("read-blocked"));
fetch("{self.target}api/approve", {{method: "POST", mode: "no-cors",
  headers: {{"Content-Type": "text/plain"}}, body: "{{}}"}}).then(
  () => say("posted"), () => say("post-blocked"));
fetch("{self.target}api/approve", {{method: "POST",
  headers: {{"Content-Type": "application/json", "X-Configpin-Token": "guess"}},
  body: JSON.stringify({{kind: "configmap", namespace: "x", name: "cfg"}})}}).then(
  () => say("json-posted"), () => say("json-blocked"));
</script></body>""".encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@contextlib.contextmanager
def _evil_site(target: str) -> Iterator[str]:
    handler = type("Evil", (_Evil,), {"target": target})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def test_a_forged_host_a_post_without_the_token_and_a_cross_origin_request_are_refused(
    kube: Kube, control_plane: ControlPlane, ns: str, page: Any
) -> None:
    kube.create(path("configmaps", ns), configmap("cfg", {"a": "1"}))
    with running_dashboard(control_plane.kubeconfig, ns) as d:
        status, _ = _get(d, "/api/overview")
        assert status == 200
        # DNS rebinding: a name of the attacker's, resolved to 127.0.0.1
        for host in (f"evil.example:{d.port}", f"localhost.evil.example:{d.port}", "localhost"):
            status, body = _get(d, "/api/overview", host=host)
            assert status == 421, (host, status, body)
            status, _ = _get(d, "/", host=host)
            assert status == 421
        body = {"kind": "configmap", "namespace": ns, "name": "cfg"}
        json_type = {"Content-Type": "application/json"}
        status, answer = _post(d, "/api/approve", body, json_type)
        assert status == 403 and b"token" in answer
        status, answer = _post(d, "/api/approve", body, {**json_type, "X-Configpin-Token": "x"})
        assert status == 403
        status, answer = _post(d, "/api/preview", {"manifest": "kind: ConfigMap"}, json_type)
        assert status == 403
        # the page's own token is in the page and nowhere else
        page.goto(d.url)
        token = page.get_attribute("meta[name=configpin-token]", "content")
        assert token and len(token) >= 32
        for route in ("/api/overview", "/api/changes", "/api/sources", "/api/workloads"):
            assert token.encode() not in _get(d, route)[1]
        status, _ = _post(
            d,
            "/api/approve",
            body,
            {**json_type, "X-Configpin-Token": token, "Origin": "http://evil.example"},
        )
        assert status == 403
        headers = page.goto(d.url).all_headers()  # type: ignore[union-attr]
        csp = headers["content-security-policy"]
        assert "script-src 'self'" in csp and "default-src 'none'" in csp
        assert "unsafe-inline" not in csp

        # A page of another origin in the same browser reads nothing and approves nothing.
        with _evil_site(d.url) as evil:
            page.goto(evil)
            page.wait_for_function(
                "document.getElementById('out').textContent.split('\\n').length > 3",
                timeout=LIVE,
            )
            said = page.inner_text("#out").split()
        assert "read-blocked" in said and "json-blocked" in said, said
        assert not any(s.startswith("read:") for s in said), said
        assert _approved(kube, ns) is None
    assert "POST" not in d.log() or "Traceback" not in d.log()


# --- no Secret value ------------------------------------------------------------------------------


def _everything(d: Dashboard, fetch: Callable[[str], bytes]) -> dict[str, bytes]:
    """Every JSON answer the dashboard gives for its namespace: each list, each change, each
    source, each page of workloads."""
    out = {route: fetch(route) for route in ("/api/overview", "/api/changes", "/api/sources")}
    for change in json.loads(out["/api/changes"])["changes"]:
        route = "/api/change?id=" + quote(change["id"], safe="")
        out[route] = fetch(route)
    for src in json.loads(out["/api/sources"])["sources"]:
        route = f"/api/source?kind={src['kind']}&namespace={src['namespace']}&name={src['name']}"
        out[route] = fetch(route)
    out["/api/workloads"] = fetch("/api/workloads")
    return out


def test_no_seeded_secret_value_reaches_the_browser(
    kube: Kube,
    k8s: client.ApiClient,
    control_plane: ControlPlane,
    ns: str,
    page: Any,
    shots: Path,
) -> None:
    """A Secret applied as kubectl applies it (its values also in the last-applied
    annotation), read by env, envFrom and a volume, then changed (a rollout, records, Events);
    a pasted Secret manifest previewed. No page and no JSON answer holds a value, plain or in
    base64."""
    values = [SEEKRIT, "second-" + SEEKRIT]
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "db"},
        "stringData": {"password": values[0], "dsn": "postgres://u:" + values[0] + "@db"},
    }
    secret["metadata"]["annotations"] = {
        "kubectl.kubernetes.io/last-applied-configuration": json.dumps(secret)
    }
    kube.create(path("secrets", ns), secret)
    by_env = container(env=[env_key_ref("secret", "db", "password", "PASSWORD")])
    by_from = container(env_from=[env_from("secret", "db")])
    by_volume = pod_spec(container())
    by_volume["containers"][0]["volumeMounts"] = [{"name": "db", "mountPath": "/etc/db"}]
    by_volume["volumes"] = [{"name": "db", "secret": {"secretName": "db"}}]
    names = ["by-env", "by-from", "by-volume"]
    with Kubelet(kube, ns) as kubelet:
        kubelet.allow(*names)
        kube.create(path("deployments", ns), deployment("by-env", pod_spec(by_env), replicas=1))
        kube.create(path("deployments", ns), deployment("by-from", pod_spec(by_from), replicas=1))
        kube.create(path("deployments", ns), deployment("by-volume", by_volume, replicas=1))
        for name in names:
            stamped(kube, ns, name)
        wait_healthy(kube, ns, names)
        As(k8s, ALICE).patch(
            path("secrets", ns, "db"),
            {"stringData": {"password": values[1]}},
            content_type="application/merge-patch+json",
        )
        wait_for(
            lambda: (
                ANN_CHANGED_BY
                in (get(kube, ns, "db", "secrets")["metadata"].get("annotations") or {})
            ),
            what="the Secret's record of who changed it",
        )
        wait_for(
            lambda: any(state(get(kube, ns, n)) is not None for n in names),
            what="a rollout record (the first wave's)",
        )
        pasted = (
            "apiVersion: v1\nkind: Secret\nmetadata:\n  name: db\n"
            f"stringData:\n  password: {values[0]}\n"
        )
        with running_dashboard(control_plane.kubeconfig, ns) as d:
            forbidden = [v.encode() for v in values]
            forbidden += [base64.b64encode(v.encode()) for v in values]

            def fetch(route: str) -> bytes:
                status, body = _get(d, route)
                assert status == 200, (route, status, body)
                return body

            wait_for(lambda: json.loads(fetch("/api/changes"))["changes"], what="the change listed")
            answers = _everything(d, fetch)
            assert any("secret%2Fdb%40" in r for r in answers), list(answers)
            page.goto(d.url)
            token = page.get_attribute("meta[name=configpin-token]", "content") or ""
            status, preview = _post(
                d,
                "/api/preview",
                {"manifest": pasted, "namespace": ns},
                {"Content-Type": "application/json", "X-Configpin-Token": token},
            )
            assert status == 200, preview
            answers["/api/preview"] = preview
            pages = {}
            views = {
                "changes": "tr[data-change]",
                "sources": "tr[data-source]",
                f"source/secret/{ns}/db": "[data-key=password] tr[data-consumer]",
                "workloads": "tr[data-workload]",
            }
            for view, drawn in views.items():
                page.goto(d.url + "#/" + view)
                page.wait_for_selector(drawn, timeout=LIVE)
                pages[view] = page.content().encode()
            change = json.loads(answers["/api/changes"])["changes"][0]["id"]
            page.goto(d.url + "#/change/" + quote(change, safe=""))
            page.wait_for_selector("tr[data-workload]", timeout=LIVE)
            pages["change"] = page.content().encode()
            page.goto(d.url + "#/workloads")
            page.wait_for_selector("text=asking the API server", state="detached", timeout=LIVE)
            _shot(page, shots, "workloads.png")
            pages["workloads"] = page.content().encode()
        for where, body in {**answers, **pages}.items():
            for value in forbidden:
                assert value not in body, (where, value)


# --- what it may not read, and an API server it cannot reach ------------------------------------


def test_a_missing_right_and_an_unreachable_api_server_are_said_plainly(
    kube: Kube, control_plane: ControlPlane, ns: str, page: Any, tmp_path: Path
) -> None:
    """A user who may read workloads, ConfigMaps and Events but not Secrets: the page says
    which right is missing (the API server's answer) and Used by still lists the ConfigMaps.
    A kubeconfig whose API server does not answer: the page says it cannot reach it."""
    kube.create(path("configmaps", ns), configmap("cfg", {"a": "1"}))
    kube.create(path("serviceaccounts", ns), {"metadata": {"name": "nosecrets"}})
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    read = ["get", "list", "watch"]
    rules = [
        {"apiGroups": [""], "resources": ["configmaps", "events"], "verbs": read},
        {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": read},
    ]
    kube.create(f"{rbac}/namespaces/{ns}/roles", {"metadata": {"name": "r"}, "rules": rules})
    kube.create(
        f"{rbac}/namespaces/{ns}/rolebindings",
        {
            "metadata": {"name": "r"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "r"},
            "subjects": [{"kind": "ServiceAccount", "name": "nosecrets", "namespace": ns}],
        },
    )
    limited = service_account_kubeconfig(
        control_plane, kube.api, ns, "nosecrets", tmp_path / "limited.kubeconfig"
    )
    with running_dashboard(limited, ns) as d:
        page.goto(d.url + "#/sources")
        page.wait_for_selector(f"tr[data-source='configmap/{ns}/cfg']", timeout=LIVE)
        said = page.wait_for_selector("#problems p:has-text('you may not list')", timeout=LIVE)
        text = said.inner_text()
        assert "Secrets" in text and "Forbidden" in text and "nosecrets" in text, text
        assert "ConfigMaps" not in text.split("The API server said")[0], text
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # bound, never listening: connections are refused
        unreachable = tmp_path / "unreachable.kubeconfig"
        unreachable.write_text(
            control_plane.kubeconfig.read_text().replace(
                control_plane.host, f"https://127.0.0.1:{port}"
            )
        )
        with running_dashboard(unreachable, ns) as d:
            page.goto(d.url)
            said = page.wait_for_selector(
                "#problems p:has-text('cannot reach the API server')", timeout=LIVE
            )
            assert "cannot reach the API server" in said.inner_text()
            page.wait_for_selector("text=No change of a consumed ConfigMap", timeout=LIVE)
