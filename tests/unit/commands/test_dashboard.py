"""webhook/commands/dashboard: the fence of the local server (its own Host only, a token for every
change, same-origin only, the headers of every answer), on its own and through a real server
on loopback; and the pages' data from what the feeds hold (waves in the controller's order,
who uses which key, names and never values).

The browser tests (tests/browser) drive the same against the API server in chromium."""

from __future__ import annotations

import contextlib
import http.client
import json
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from harness.manifests import configmap, container, deployment, env_from, env_key_ref, pod_spec
from webhook.commands.dashboard import changes, views
from webhook.commands.dashboard.app import App, Request
from webhook.commands.dashboard.feeds import FeedState, Note, Snapshot, Source, _source
from webhook.commands.dashboard.guard import CSP, TOKEN_HEADER, Fence
from webhook.commands.dashboard.http import Server
from webhook.core.constants import (
    ANN_APPROVED,
    ANN_CHANGED_BY,
    ANN_ROLLOUT,
    ANN_SOURCES,
    ANN_WAVE,
)
from webhook.core.model import SourceKind
from webhook.core.waves import Member, parse_waves, wave_plan

PORT = 3100
TOKEN = "t" * 43
FENCE = Fence("127.0.0.1", PORT, TOKEN)
HOST = {"host": f"localhost:{PORT}"}
JSON = {"content-type": "application/json"}


# --- the fence ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "host",
    [
        f"localhost:{PORT}",
        f"127.0.0.1:{PORT}",
        f"[::1]:{PORT}",
        f"LOCALHOST:{PORT}",
        f"127.0.0.2:{PORT}",
    ],
)
def test_its_own_addresses_are_answered(host: str) -> None:
    assert FENCE.host_allowed(host)


@pytest.mark.parametrize(
    "host",
    [
        f"evil.example:{PORT}",  # DNS rebinding: the attacker's name, resolving to 127.0.0.1
        f"localhost.evil.example:{PORT}",
        f"127.0.0.1.nip.io:{PORT}",
        "localhost",  # port 80: another server's
        f"localhost:{PORT + 1}",
        f"192.168.1.5:{PORT}",  # an address it does not listen on
        f"localhost:{PORT}@evil.example",
        f"[::1:{PORT}",
        "",
    ],
)
def test_any_other_host_is_refused(host: str) -> None:
    assert not FENCE.host_allowed(host)
    refusal = FENCE.refusal("GET", "/api/changes", {"host": host})
    assert refusal is not None and refusal.status == 421


def test_bound_to_every_address_it_answers_ip_addresses_but_never_a_name() -> None:
    fence = Fence("0.0.0.0", PORT, TOKEN)
    assert fence.host_allowed(f"192.168.1.5:{PORT}")
    assert fence.host_allowed(f"localhost:{PORT}")
    assert not fence.host_allowed(f"workstation.example:{PORT}")
    bound = Fence("192.168.1.5", PORT, TOKEN)
    assert bound.host_allowed(f"192.168.1.5:{PORT}")
    assert not bound.host_allowed(f"192.168.1.6:{PORT}")


def test_a_change_needs_the_token_as_json() -> None:
    def post(**headers: str) -> int | None:
        refusal = FENCE.refusal("POST", "/api/approve", {**HOST, **headers})
        return None if refusal is None else refusal.status

    token = TOKEN_HEADER.lower()
    assert post(**JSON) == 403  # no token
    assert post(**JSON, **{token: "t" * 42}) == 403
    assert post(**JSON, **{token: ""}) == 403
    assert post(**{token: TOKEN, "content-type": "text/plain"}) == 415  # a form's type
    assert post(**{token: TOKEN}) == 415
    assert post(**JSON, **{token: TOKEN}) is None
    assert post(**JSON, **{token: TOKEN, "origin": f"http://localhost:{PORT}"}) is None


def test_a_cross_origin_request_is_refused() -> None:
    token = {TOKEN_HEADER.lower(): TOKEN, **JSON}
    for origin in ("http://evil.example", f"https://localhost:{PORT}", "null"):
        for method in ("GET", "POST"):
            refusal = FENCE.refusal(method, "/api/approve", {**HOST, **token, "origin": origin})
            assert refusal is not None and refusal.status == 403, (origin, method)
    for site in ("cross-site", "same-site"):
        refusal = FENCE.refusal("GET", "/api/changes", {**HOST, "sec-fetch-site": site})
        assert refusal is not None and refusal.status == 403
        # a person following a link to the page reads nothing: allowed
        navigate = {**HOST, "sec-fetch-site": site, "sec-fetch-mode": "navigate"}
        assert FENCE.refusal("GET", "/", navigate) is None
        assert FENCE.refusal("GET", "/api/changes", navigate) is not None
    assert FENCE.refusal("GET", "/api/changes", {**HOST, "sec-fetch-site": "same-origin"}) is None


def test_other_methods_are_not_served() -> None:
    for method in ("PUT", "DELETE", "PATCH", "OPTIONS"):
        refusal = FENCE.refusal(method, "/api/approve", HOST)
        assert refusal is not None and refusal.status == 405


# --- the app and the server ---------------------------------------------------------------------


class _Store:
    """What the app reads of the feeds: a snapshot."""

    namespace = "shop"

    def __init__(self, snapshot: Snapshot) -> None:
        self.snap = snapshot
        self.stopped = threading.Event()

    def snapshot(self) -> Snapshot:
        return self.snap

    def ready(self) -> bool:
        return True

    def bump(self) -> None:
        pass

    def wait_newer(self, version: int, timeout: float) -> int:
        return self.snap.version

    def secret_keys(self, namespace: str, name: str) -> tuple[tuple[str, ...] | None, str]:
        return ("password",), ""


class _Book:
    def get(self, obj: Any, version: Any) -> dict[str, Any]:
        return {"state": "current", "mode": "default", "sources": [], "copies": []}


def _snapshot(
    workloads: list[dict[str, Any]] | None = None,
    sources: list[Source] | None = None,
    notes: list[Note] | None = None,
) -> Snapshot:
    return Snapshot(
        7, 1_800_000_100.0, workloads or [], sources or [], notes or [], [FeedState("x")]
    )


def _app(snapshot: Snapshot | None = None) -> App:
    return App(
        FENCE,
        _Store(snapshot or _snapshot()),  # type: ignore[arg-type]
        _Book(),  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        steps=parse_waves("1,approve,100%"),
        scope="namespace shop",
        context="",
    )


ROUTES = ["/", "/assets/app.js", "/assets/app.css", "/api/overview", "/api/changes",
          "/api/sources", "/api/workloads", "/api/nothing"]  # fmt: skip


def test_every_answer_carries_the_strict_policy_and_the_token_is_only_in_the_page() -> None:
    app = _app()
    for route in ROUTES:
        response = app.handle(Request("GET", route, headers=HOST))
        headers = response.all_headers()
        assert headers["Content-Security-Policy"] == CSP
        assert headers["X-Content-Type-Options"] == "nosniff"
        assert headers["X-Frame-Options"] == "DENY"
        assert "Access-Control-Allow-Origin" not in headers
        if route == "/":
            assert f'<meta name="configpin-token" content="{TOKEN}">' in response.body.decode()
        else:
            assert TOKEN.encode() not in response.body
    refused = app.handle(Request("GET", "/", headers={"host": f"evil.example:{PORT}"}))
    assert refused.status == 421 and refused.all_headers()["Content-Security-Policy"] == CSP
    assert "'unsafe-inline'" not in CSP and "script-src 'self'" in CSP


def test_the_page_has_no_inline_script_or_style_and_loads_nothing_from_elsewhere() -> None:
    page = _app().handle(Request("GET", "/", headers=HOST)).body.decode()
    assert "<script>" not in page and " style=" not in page and "<style" not in page
    assert "http://" not in page and "https://" not in page
    script = _app().handle(Request("GET", "/assets/app.js", headers=HOST)).body.decode()
    assert "innerHTML" not in script and "eval(" not in script
    assert ".style." not in script and 'setAttribute("style"' not in script


def test_approve_and_preview_are_refused_without_the_token() -> None:
    app = _app()
    body = json.dumps({"kind": "configmap", "namespace": "shop", "name": "cfg"}).encode()
    for route in ("/api/approve", "/api/preview"):
        response = app.handle(Request("POST", route, headers={**HOST, **JSON}, body=body))
        assert response.status == 403


@contextlib.contextmanager
def _serving(app: App) -> Iterator[int]:
    server = Server(("127.0.0.1", 0))
    server.app = app
    server.store = app.store
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_port
    finally:
        server.shutdown()
        server.server_close()


def _ask(
    port: int,
    method: str,
    route: str,
    headers: Mapping[str, str],
    body: bytes = b"",
    length: int | None = None,
) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.putrequest(method, route, skip_host=True, skip_accept_encoding=True)
        for name, value in headers.items():
            conn.putheader(name, value)
        conn.putheader("Content-Length", str(len(body) if length is None else length))
        conn.endheaders(body)
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def test_the_server_refuses_a_forged_host_and_a_post_without_the_token() -> None:
    app = _app()
    with _serving(app) as port:
        object.__setattr__(app, "fence", Fence("127.0.0.1", port, TOKEN))
        own = {"Host": f"localhost:{port}"}
        assert _ask(port, "GET", "/api/overview", own) == 200
        assert _ask(port, "GET", "/api/overview", {"Host": f"evil.example:{port}"}) == 421
        assert _ask(port, "GET", "/api/overview", {}) == 421
        body = b'{"kind":"configmap","namespace":"shop","name":"cfg"}'
        assert (
            _ask(port, "POST", "/api/approve", {**own, "Content-Type": "application/json"}, body)
            == 403
        )
        headers = {**own, "Content-Type": "application/json", TOKEN_HEADER: TOKEN}
        # (refused before a byte of it is read: none is sent)
        assert _ask(port, "POST", "/api/preview", headers, length=2 * 1024 * 1024) == 413
        assert _ask(port, "DELETE", "/api/approve", own) == 405


# --- the pages' data ------------------------------------------------------------------------------

NS = "shop"
CONTENT = "c0ffee00c0ffee00c0ff"
CHANGE = f"{NS}/configmap/cfg@{CONTENT}"
T0 = 1_800_000_000.0


def _reader(
    name: str, *, wave: int | None = None, record: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    annotations = {} if wave is None else {ANN_WAVE: str(wave)}
    if record is not None:
        annotations[ANN_ROLLOUT] = json.dumps(record)
    dep = deployment(
        name,
        pod_spec(container(env=[env_key_ref("configmap", "cfg", "a", "A")])),
        replicas=1,
        annotations=annotations,
    )
    dep["metadata"]["namespace"] = NS
    dep["metadata"]["creationTimestamp"] = "2020-01-01T00:00:00Z"
    dep["spec"]["template"]["metadata"]["annotations"] = {ANN_SOURCES: '{"configmap/cfg":"d"}'}
    dep["status"] = {"observedGeneration": 1, "replicas": 1, "readyReplicas": 1}
    dep["metadata"]["generation"] = 1
    return dep


def _record(state: str, since: float) -> dict[str, Any]:
    return {
        "state": state,
        "since": since,
        "changes": [CHANGE],
        "healthy": True,
        "by": "alice at x",
    }


def _cfg(**annotations: str) -> Source:
    return Source("configmap", NS, "cfg", "9", annotations, ("a", "b"))


def _in_order(names: list[str]) -> list[str]:
    return [m.name for m in wave_plan([Member(0, NS, "Deployment", n) for n in names], None)[0]]


def _change_page(
    names: list[str], records: Mapping[str, Any], notes: list[Note], waves: str
) -> tuple[Snapshot, dict[str, Any]]:
    """The page of CHANGE (alice's write of key a) over its readers `names`, their rollout
    `records` and the controller's `notes`, cut as `waves` cuts them."""
    workloads = [_reader(n, record=records.get(n)) for n in names]
    who = json.dumps({"user": "alice", "at": T0, "content": CONTENT, "keys": ["a"], "more": 0})
    snap = _snapshot(workloads, [_cfg(**{ANN_CHANGED_BY: who})], notes)
    found = changes.change(snap, CHANGE, parse_waves(waves), lambda _o: None)
    assert found is not None
    return snap, found


def test_a_wait_for_an_earlier_wave_that_has_completed_since_is_not_shown_as_one() -> None:
    """`1,1,approve,100%`: the last wave's workloads were said to wait for wave 2 while it
    rolled; wave 2 has completed since, and the controller's Event for what comes next (an
    approval) is not there yet. The page says they wait for an approval, not for an earlier
    wave that is complete (it did, in the dashboard's own screenshot of this moment)."""
    names = [f"w{i}" for i in range(4)]
    order = _in_order(names)
    records = {order[0]: _record("complete", T0 + 1), order[1]: _record("complete", T0 + 5)}
    notes = [
        Note(NS, "Deployment", order[0], "ConfigRolloutComplete", "done", "Normal", T0 + 4),
        Note(NS, "Deployment", order[1], "ConfigRolloutComplete", "done", "Normal", T0 + 8),
    ]
    for n in order[2:]:
        notes.append(
            Note(NS, "Deployment", n, "ConfigRolloutWaiting",
                 f"not rolled yet: {CHANGE} rolls in waves: this workload rolls when wave 2 is "
                 "complete (0 of 1 complete)", "Normal", T0 + 6)
        )  # fmt: skip
    _, found = _change_page(names, records, notes, "1,1,approve,100%")
    rows = {r["name"]: r for r in found["rows"]}
    assert [rows[n]["wave"] for n in order] == [1, 2, 3, 3]
    for n in order[2:]:
        assert rows[n]["waits_for"] == "approval", rows[n]
        assert "wave 2" not in rows[n]["detail"], rows[n]
    assert found["approval"]["asked"] is True
    # before wave 2 completed, the same Events are what the workloads wait for
    records[order[1]] = _record("rolling", T0 + 5)
    _, found = _change_page(names, records, notes[:1] + notes[2:], "1,1,approve,100%")
    rows = {r["name"]: r for r in found["rows"]}
    assert {rows[n]["waits_for"] for n in order[2:]} == {"wave"}
    assert rows[order[2]]["detail"] == "wave 2: 0 of 1 complete"


def test_a_change_is_shown_in_the_controllers_wave_order_with_what_each_waits_for() -> None:
    """Ten readers of a change: three rolled (complete, complete, rolling), five said to wait
    for an earlier wave, two for an approval. The rows come in wave_order, cut as
    `1,approve,100%` cuts them; the page says who waits for what and when each ended."""
    names = [f"w{i}" for i in range(10)]
    order = _in_order(names)
    records = {order[0]: _record("complete", T0 + 1), order[1]: _record("rolling", T0 + 9)}
    notes = [Note(NS, "Deployment", order[0], "ConfigRolloutComplete", "done", "Normal", T0 + 6)]
    for n in order[2:]:
        notes.append(
            Note(NS, "Deployment", n, "ConfigRolloutAwaitingApproval",
                 f"not rolled yet: {CHANGE} waits for an approval (wave 2 of 2 comes after "
                 "approve): kubectl configpin approve configmap/cfg -n shop", "Normal", T0 + 2)
        )  # fmt: skip
    snap, found = _change_page(names, records, notes, "1,approve,100%")
    rows = found["rows"]
    assert [r["name"] for r in rows] == order
    assert [r["wave"] for r in rows] == [1] + [2] * 9
    assert found["wave_sizes"] == [1, 9] and found["by"] == "alice" and found["keys"] == ["a"]
    assert rows[0]["state"] == "complete" and rows[0]["end"] == T0 + 6
    assert rows[0]["start"] == T0 + 1
    assert rows[1]["state"] == "rolling" and rows[1]["end"] is None
    assert {r["state"] for r in rows[2:]} == {"waiting"}
    assert {r["waits_for"] for r in rows[2:]} == {"approval"}
    assert found["approval"] == {
        "asked": True,
        "after_wave": 1,
        "approved": [],
        "namespaces": [NS],
    }
    listed = changes.changes(snap)["changes"]
    assert [c["id"] for c in listed] == [CHANGE]
    assert listed[0]["counts"] == {"complete": 1, "rolling": 1, "waiting": 8}


@pytest.mark.parametrize("now", [False, True])
def test_an_approval_is_shown_as_the_source_records_it_and_says_now_when_it_was(
    now: bool,
) -> None:
    """`approve --now` is said as such (issue 40): the page reads `now` from the record."""
    record = {"user": "oncall", "at": T0, "content": CONTENT, "sig": "x"}
    if now:
        record["now"] = True
    who = json.dumps({"user": "alice", "at": T0, "content": CONTENT, "keys": ["a"], "more": 0})
    source = _cfg(**{ANN_CHANGED_BY: who, ANN_APPROVED: json.dumps(record)})
    snap = _snapshot([_reader("w0", record=_record("complete", T0 + 1))], [source])
    found = changes.change(snap, CHANGE, parse_waves("1,approve,100%"), lambda _o: None)
    assert found is not None
    assert found["approval"]["approved"] == [
        {"namespace": NS, "user": "oncall", "at": T0, "now": now}
    ]


def test_a_change_not_acted_on_yet_lists_its_stale_readers_as_the_dry_run_says() -> None:
    """The source's record says alice changed key `a`; nothing rolled or waited yet: the
    readers of `a` are listed as the status dry run finds them (stale: pending; not checked
    yet: checking; current: not a member), a reader of `b` only is no member."""
    who = json.dumps({"user": "alice", "at": T0, "content": CONTENT, "keys": ["a"], "more": 0})
    other = _reader("reads-b")
    other["spec"]["template"]["spec"]["containers"][0]["env"][0]["valueFrom"]["configMapKeyRef"][
        "key"
    ] = "b"
    workloads = [_reader("stale"), _reader("unchecked"), _reader("current"), other]
    states = {
        "stale": {"state": "stale", "reason": "configmap/cfg stale"},
        "current": {"state": "current"},
    }
    snap = _snapshot(workloads, [_cfg(**{ANN_CHANGED_BY: who})])
    found = changes.change(
        snap, CHANGE, parse_waves("1,10%,100%"), lambda o: states.get(o["metadata"]["name"])
    )
    assert found is not None
    shown = {r["name"]: r["state"] for r in found["rows"]}
    assert shown == {"stale": "pending", "unchecked": "checking"}


def test_used_by_lists_the_readers_of_each_key_and_how() -> None:
    items = pod_spec(container())
    items["containers"][0]["volumeMounts"] = [{"name": "v", "mountPath": "/etc/c"}]
    items["volumes"] = [
        {"name": "v", "configMap": {"name": "cfg", "items": [{"key": "b", "path": "b"}]}}
    ]
    sub = pod_spec(container())
    sub["containers"][0]["volumeMounts"] = [{"name": "v", "mountPath": "/x", "subPath": "a"}]
    sub["volumes"] = [{"name": "v", "configMap": {"name": "cfg"}}]
    made = [
        _reader("env-a"),
        deployment("from-all", pod_spec(container(env_from=[env_from("configmap", "cfg")]))),
        deployment("items-b", items),
        deployment("sub", sub),
        deployment("elsewhere", pod_spec()),
    ]
    for obj in made:
        obj["metadata"]["namespace"] = NS
    snap = _snapshot(made, [_cfg()])
    doc = views.source(snap, "configmap", NS, "cfg", lambda _n, _m: (None, ""))
    by_key = {k["key"]: {(c["name"], c["how"]) for c in k["consumers"]} for k in doc["keys"]}
    assert by_key == {
        "a": {("env-a", "env"), ("from-all", "envFrom"), ("sub", "subPath")},
        "b": {("from-all", "envFrom"), ("items-b", "volume"), ("sub", "subPath")},
    }
    assert doc["workloads"] == 4


def test_a_source_is_kept_as_names_never_values() -> None:
    """A ConfigMap as the feed keeps it: its key names and configpin's annotations; no value,
    no other annotation (kubectl's last-applied copy holds every value)."""
    obj = configmap(
        "cfg",
        {"password": "hunter2"},
        annotations={
            "kubectl.kubernetes.io/last-applied-configuration": '{"data":{"password":"hunter2"}}',
            ANN_CHANGED_BY: "{}",
        },
    )
    obj["binaryData"] = {"blob": "aHVudGVyMg=="}
    kept = _source(SourceKind.CONFIGMAP, obj, with_keys=True)
    assert kept.keys == ("blob", "password")
    assert kept.annotations == {ANN_CHANGED_BY: "{}"}
    assert "hunter2" not in repr(kept) and "aHVudGVyMg" not in repr(kept)
    secret = _source(
        SourceKind.SECRET, {"metadata": {"name": "s", "namespace": NS}}, with_keys=False
    )
    assert secret.keys is None


def test_the_command_answers_help(capsys: pytest.CaptureFixture[str]) -> None:
    from webhook.commands.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["dashboard", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "--port" in out and "--address" in out and "1,10%,100%" in out
