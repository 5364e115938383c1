"""The dashboard's buttons (issue 47, part 3; shared/SPEC.md "Dashboard", "Acting on a
change"), in Debian's chromium against the control plane with configpin registered as the chart
registers it, waves `1,approve,100%` (the canary, an approval, then `b`), on 1.20.2 and 1.36.2:

- an admin presses Pause while the canary rolls: the change reads Paused (its ConfigRollout
  Stalled, reason Paused, and still so once the canary completes); Resume, and it goes on to
  the approval; Approve, and `b` rolls. The source is a Secret: no value of it is in any page
  or JSON answer on the way;
- a view-only user (a ServiceAccount that may read, not update) sees Approve and Pause greyed
  with the reason in words before pressing anything, and the header names them (the
  SelfSubjectReview's name on 1.36; the kubeconfig's user, said as such, on 1.20); pressing one
  anyway changes nothing; axe-core passes and Tab reaches them (screenshot view-only.png);
- given the right, the buttons are pressable; the right taken away after the page asked, a
  press is refused by the API server: its answer (403) beside the button, which stays greyed
  with it (screenshot refused.png). That dashboard keeps its answers on the user's rights for
  an hour (`--rights-ttl`), so the page still offers the press when it is made, however slow
  the machine: the refusal is the API server's RBAC, as a real user's would be.

No kubelet: the fake `Kubelet` reports the pods Ready it is told to.
"""

from __future__ import annotations

import base64
import http.client
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from kubernetes import client

from harness.configpin import Configpin, instance_namespace
from harness.controlplane import ControlPlane, wait_for
from harness.kubelet import Kubelet
from harness.manifests import configmap, container, deployment, env_key_ref, pod_spec
from tests.browser.accessible import check
from tests.browser.dashboards import Dashboard, running_dashboard, viewer_kubeconfig
from tests.integration.instances import replicas_fixture
from tests.integration.workloads import (
    As,
    Impersonating,
    get,
    reader,
    set_cm,
    stamped,
    state,
    wait_healthy,
)
from webhook.core.constants import ANN_ACTED, ANN_WAVE
from webhook.kube.errors import NotFound
from webhook.kube.raw import MERGE_PATCH, Kube, path

INSTANCE = "buttons"
ARGS = [
    "--coalesce-window", "0.5",
    "--min-rollout-interval", "0",
    "--resync-period", "2",
    "--rollout-waves", "1,approve,100%",
]  # fmt: skip
ALICE = "alice@example.com"
SEEKRIT = "pa55-Buttons-7qz"  # a Secret value: in no page, in no JSON answer
LIVE = 30_000
RBAC = "/apis/rbac.authorization.k8s.io/v1"

replicas = replicas_fixture(INSTANCE, "buttons", ARGS)


@pytest.fixture
def ns(k8s: client.ApiClient, replicas: list[Configpin]) -> Iterator[str]:
    with instance_namespace(k8s, INSTANCE, "buttons") as name:
        yield name


def _secret_reader(name: str, wave: str | None = None) -> dict[str, Any]:
    env = [env_key_ref("secret", "db", "password", "PASSWORD")]
    annotations = {ANN_WAVE: wave} if wave else {}
    return deployment(name, pod_spec(container(env=env)), replicas=1, annotations=annotations)


def _rollout(kube: Kube, ns: str, name: str) -> dict[str, Any]:
    try:
        return kube.get(f"/apis/configpin.io/v1alpha1/namespaces/{ns}/configrollouts/{name}")
    except NotFound:
        return {}


def _condition(obj: dict[str, Any]) -> tuple[str, str] | None:
    for c in (obj.get("status") or {}).get("conditions") or ():
        if c.get("status") == "True":
            return str(c.get("type")), str(c.get("reason"))
    return None


def _open_change(page: Any, url: str) -> str:
    page.goto(url)
    page.wait_for_selector("tr[data-change]", timeout=LIVE)
    ident = page.get_attribute("tr[data-change]", "data-change")
    assert ident
    page.goto(url + "#/change/" + quote(ident, safe=""))
    page.wait_for_selector("tr[data-workload]", timeout=LIVE)
    return ident


def _fetch(d: Dashboard, route: str) -> bytes:
    conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=30)
    try:
        conn.request("GET", route, headers={"Host": f"localhost:{d.port}"})
        resp = conn.getresponse()
        body = resp.read()
        assert resp.status == 200, (route, resp.status, body)
        return body
    finally:
        conn.close()


def _shot(page: Any, folder: Path, name: str) -> None:
    page.wait_for_timeout(300)  # (fonts settle)
    page.screenshot(path=str(folder / name), full_page=False)


def test_an_admin_pauses_resumes_and_approves_a_secrets_change_and_no_value_reaches_the_page(
    kube: Kube, k8s: client.ApiClient, control_plane: ControlPlane, ns: str, page: Any
) -> None:
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "db"},
              "stringData": {"password": "first-" + SEEKRIT}}  # fmt: skip
    kube.create(path("secrets", ns), secret)
    with Kubelet(kube, ns) as kubelet:
        kubelet.allow("canary", "b")
        kube.create(path("deployments", ns), _secret_reader("canary", "-1"))
        kube.create(path("deployments", ns), _secret_reader("b"))
        for name in ("canary", "b"):
            stamped(kube, ns, name)
        wait_healthy(kube, ns, ["canary", "b"])
    As(k8s, ALICE).patch(
        path("secrets", ns, "db"), {"stringData": {"password": SEEKRIT}}, content_type=MERGE_PATCH
    )
    wait_for(lambda: state(get(kube, ns, "canary")) == "rolling", what="wave 1 started")
    forbidden = [v.encode() for v in (SEEKRIT, "first-" + SEEKRIT)]
    forbidden += [base64.b64encode(v) for v in list(forbidden)]
    seen: dict[str, bytes] = {}
    with running_dashboard(control_plane.kubeconfig, ns) as d:
        ident = _open_change(page, d.url)

        def look(moment: str) -> None:
            seen[moment] = page.content().encode()
            for route in ("/api/overview", "/api/changes", "/api/change?id=" + quote(ident)):
                seen[f"{moment}: {route}"] = _fetch(d, route)

        def press(verb: str) -> None:
            with page.expect_response(lambda r: r.url.endswith("/api/" + verb)) as answer:
                page.click(f"[data-testid={verb}]:not([aria-disabled])")
            seen[f"POST /api/{verb}"] = answer.value.body()
            assert answer.value.status == 200, seen[f"POST /api/{verb}"]

        assert page.inner_text("[data-testid=who-user]") == "admin"
        page.wait_for_selector("[data-testid=pause]:not([aria-disabled])", timeout=LIVE)
        assert not page.query_selector("[data-testid=resume]")
        look("rolling")
        press("pause")
        page.wait_for_selector("[data-testid=moment][data-moment=paused]", timeout=LIVE)
        page.wait_for_selector("[data-testid=resume]:not([aria-disabled])", timeout=LIVE)
        assert "paused secret/db in " + ns + " by admin" in page.inner_text(
            "[data-testid=pause-message]"
        )
        acted = json.loads(get(kube, ns, "db", "secrets")["metadata"]["annotations"][ANN_ACTED])
        assert (acted["verb"], acted["user"]) == ("pause", "admin")
        wait_for(
            lambda: _condition(_rollout(kube, ns, "secret-db")) == ("Stalled", "Paused"),
            what="the ConfigRollout says Paused",
        )
        look("paused")
        with Kubelet(kube, ns) as kubelet:
            kubelet.allow("canary", "b")
            wait_for(lambda: state(get(kube, ns, "canary")) == "complete", what="canary done")
            time.sleep(3)  # (a resync and more)
            assert _condition(_rollout(kube, ns, "secret-db")) == ("Stalled", "Paused")
            assert state(get(kube, ns, "b")) is None
            page.wait_for_selector("[data-testid=moment][data-moment=paused]", timeout=LIVE)
            press("resume")
            page.wait_for_selector("[data-testid=resume-message]", timeout=LIVE)
            wait_for(
                lambda: (
                    _condition(_rollout(kube, ns, "secret-db"))
                    == ("Reconciling", "AwaitingApproval")
                ),
                what="resumed: it waits for the approval",
            )
            page.wait_for_selector("[data-testid=moment]", state="detached", timeout=LIVE)
            page.wait_for_selector("[data-testid=approve]:not([aria-disabled])", timeout=LIVE)
            assert page.query_selector("[data-testid=pause]:not([aria-disabled])")
            look("awaiting approval")
            press("approve")
            page.wait_for_selector("[data-testid=approve-message]", timeout=LIVE)
            wait_for(lambda: state(get(kube, ns, "b")) is not None, what="b rolls")
            page.wait_for_selector(
                "tr[data-workload$='/b']:not([data-row-state=waiting])", timeout=LIVE
            )
            look("rolled on")
    for where, body in seen.items():
        for value in forbidden:
            assert value not in body, (where, value)
    assert "Traceback" not in d.log(), d.log()


def test_a_view_only_user_sees_the_buttons_greyed_with_the_reason_and_a_refusal_stays_said(
    kube: Kube,
    k8s: client.ApiClient,
    control_plane: ControlPlane,
    ns: str,
    page: Any,
    shots: Path,
    tmp_path: Path,
) -> None:
    with Kubelet(kube, ns) as kubelet:
        kubelet.allow("canary", "b")
        kube.create(path("configmaps", ns), configmap("cfg", {"a": "1"}))
        kube.create(path("deployments", ns), reader("canary", annotations={ANN_WAVE: "-1"}))
        kube.create(path("deployments", ns), reader("b"))
        for name in ("canary", "b"):
            stamped(kube, ns, name)
        wait_healthy(kube, ns, ["canary", "b"])
        set_cm(As(k8s, ALICE), ns, "2")
        wait_for(
            lambda: (
                _condition(_rollout(kube, ns, "configmap-cfg"))
                == ("Reconciling", "AwaitingApproval")
            ),
            what="wave 1 done, the rest waiting for an approval",
        )
    viewer = viewer_kubeconfig(control_plane, kube, ns, tmp_path)
    account = f"system:serviceaccount:{ns}:viewer"
    reviewed = control_plane.minor >= 28
    named = account if reviewed else "user viewer of your kubeconfig"
    reason = f"your rights ({named}) do not allow updating ConfigMap {ns}/cfg"
    with running_dashboard(viewer, ns) as d:
        _open_change(page, d.url)
        # before anything is pressed: greyed, with the reason, and whose rights these are
        page.wait_for_selector("[data-testid=approve][aria-disabled=true]", timeout=LIVE)
        who = page.inner_text("[data-testid=who]")
        if reviewed:
            assert page.inner_text("[data-testid=who-user]") == account, who
            assert "SelfSubjectReview" in who, who
        else:
            assert page.inner_text("[data-testid=who-user]") == "viewer", who
            assert "kubeconfig" in who and "configpin-test" in who, who
        for verb in ("approve", "pause"):
            button = page.query_selector(f"[data-testid={verb}]")
            assert button is not None, verb
            assert button.get_attribute("aria-disabled") == "true"
            described = button.get_attribute("aria-describedby")
            assert described, verb
            said = page.inner_text(f"#{described}")
            assert reason in said, said
        assert not page.query_selector("[data-testid=resume]")
        _shot(page, shots, "view-only.png")
        check(page, "a view-only user's change")
        # pressed anyway (by keyboard: it is focusable), nothing is sent and nothing changes
        page.focus("[data-testid=pause]")
        page.keyboard.press("Enter")
        page.wait_for_timeout(1000)
        assert not page.query_selector("[data-testid=pause-message]")
        meta = get(kube, ns, "cfg", "configmaps")["metadata"]
        assert ANN_ACTED not in (meta.get("annotations") or {})
    assert "Traceback" not in d.log(), d.log()

    # Given the right to update it, a dashboard started now offers the buttons...
    rules = [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["update", "patch"]}]
    kube.create(f"{RBAC}/namespaces/{ns}/roles", {"metadata": {"name": "up"}, "rules": rules})
    binding = {
        "metadata": {"name": "up"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "up"},
        "subjects": [{"kind": "ServiceAccount", "name": "viewer", "namespace": ns}],
    }
    kube.create(f"{RBAC}/namespaces/{ns}/rolebindings", binding)
    as_viewer = Impersonating(k8s, account)
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": {"namespace": ns, "verb": "update",
                                        "resource": "configmaps", "name": "cfg"}},
    }  # fmt: skip

    def may() -> bool:
        answer = as_viewer.create("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", review)
        return bool(answer["status"].get("allowed"))

    wait_for(may, what="the right given")
    with running_dashboard(viewer, ns, "--rights-ttl", "3600") as d:
        _open_change(page, d.url)
        page.wait_for_selector("[data-testid=pause]:not([aria-disabled])", timeout=LIVE)
        # ... and taken away after the page asked: the API server refuses the press, and says so
        kube.delete(f"{RBAC}/namespaces/{ns}/rolebindings/up")
        wait_for(lambda: not may(), what="the right taken away")
        page.click("[data-testid=pause]:not([aria-disabled])")
        message = page.wait_for_selector("[data-testid=pause-message]", timeout=LIVE)
        text = message.inner_text()
        assert "refused" in text and "403" in text and account in text, text
        assert "message refused" in (message.get_attribute("class") or "")
        button = page.query_selector("[data-testid=pause]")
        assert button is not None and button.get_attribute("aria-disabled") == "true"
        assert button.get_attribute("aria-describedby") == message.get_attribute("id")
        meta = get(kube, ns, "cfg", "configmaps")["metadata"]
        assert ANN_ACTED not in (meta.get("annotations") or {})
        _shot(page, shots, "refused.png")
        check(page, "a refused press")
    assert "Traceback" not in d.log(), d.log()
