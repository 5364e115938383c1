"""The dashboard reads the decision configpin publishes (SPEC "Dashboard", "Changes as
objects": one decision, said once): a change's JSON (`/api/change`) says the waves, what each
member waits for and the verdict that the source's ConfigRollout says, and the wave each rolled
workload's rollout record names; the dashboard is given no `--rollout-waves`.

Two configpin replicas of their own instance, as the chart runs them (one Lease, both webhooks
registered from the chart's entries, the CRD installed from the chart's crds/), waves
`1,approve,100%`, three readers of `cfg`; `kubectl configpin dashboard -n NS` started as a user
starts it, with the admin's kubeconfig. Nothing runs pods: `Kubelet` marks them Ready.
"""

from __future__ import annotations

import http.client
import json
from typing import Any
from urllib.parse import quote

from harness.controlplane import ControlPlane, wait_for
from harness.kubelet import Kubelet
from tests.browser.dashboards import Dashboard, running_dashboard
from tests.integration.instances import replicas_fixtures
from tests.integration.workloads import (
    approve,
    get,
    readers_of_cfg,
    record,
    set_cm,
    wait_healthy,
)
from webhook.core.rollouts import GROUP, PLURAL, REASONS, VERSION, RolloutReason
from webhook.kube.errors import NotFound
from webhook.kube.raw import Kube, path

ARGS = [
    "--coalesce-window", "0.5",
    "--min-rollout-interval", "0",
    "--resync-period", "2",
    "--lease-duration", "4",
    "--rollout-waves", "1,approve,100%",
]  # fmt: skip
PREFIX = f"/apis/{GROUP}/{VERSION}"
APPS = ("a", "b", "c")

replicas, ns = replicas_fixtures("dashro", ARGS)


def _rollout(kube: Kube, ns: str) -> dict[str, Any] | None:
    try:
        return kube.get(path(PLURAL, ns, "configmap-cfg", prefix=PREFIX))
    except NotFound:
        return None


def _true(obj: dict[str, Any] | None) -> tuple[str, str, str] | None:
    """The condition that is True in a status about its own generation, with its reason and
    message (as kstatus reads it)."""
    status = (obj or {}).get("status") or {}
    if obj is None or status.get("observedGeneration") != obj["metadata"]["generation"]:
        return None
    for c in status.get("conditions") or ():
        if c.get("status") == "True":
            return c["type"], c.get("reason", ""), c.get("message", "")
    return None


def _held(
    kube: Kube, ns: str, reason: str, content: str | None = None, members: int = 0
) -> dict[str, Any]:
    """cfg's ConfigRollout once it says `reason` about the content cfg holds (not `content`,
    the one before it, when given), and of `members` of its members too. (The condition says
    AwaitingApproval as soon as one member waits for it; another may still wait for the gate
    to decide it, for a moment: the state to compare with is the settled one.)"""
    found: dict[str, Any] = {}

    def says() -> bool:
        obj = _rollout(kube, ns)
        said = _true(obj)
        if obj is None or said is None or said[1] != reason:
            return False
        if content is not None and obj["status"]["change"]["content"] == content:
            return False
        listed = obj["status"].get("members") or ()
        if sum(1 for m in listed if m.get("reason") == reason) < members:
            return False
        found.update(obj)
        return True

    wait_for(says, timeout=90, what=f"configmap-cfg says {reason}: {_true(_rollout(kube, ns))}")
    return found


def _get(d: Dashboard, route: str) -> Any:
    conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=30)
    try:
        conn.putrequest("GET", route, skip_host=True)
        conn.putheader("Host", f"localhost:{d.port}")
        conn.endheaders()
        resp = conn.getresponse()
        body = resp.read()
        assert resp.status in (200, 404), (route, resp.status, body)
        return json.loads(body) if resp.status == 200 else None
    finally:
        conn.close()


def _expected(kube: Kube, ns: str, obj: dict[str, Any]) -> dict[str, Any]:
    """What the dashboard must say of the change `obj` (cfg's ConfigRollout) describes, from
    that object and the workloads' records alone: each member it lists with its wave, state,
    reason, words and message; each other reader as its rollout record says (its state, the
    wave the record names, 0 where it names none); the waves' sizes; the verdict."""
    status = obj["status"]
    listed = {m["name"]: m for m in status.get("members") or ()}
    rows = {}
    for name in APPS:
        m = listed.get(name)
        if m is not None:
            reason = m.get("reason", "")
            words = REASONS[RolloutReason(reason)].words if m["state"] == "waiting" else ""
            rows[name] = (m["wave"], m["state"], reason if words else "", words)
            continue
        said = record(get(kube, ns, name))
        wave = said.get("wave", [0])[0]
        rows[name] = (wave, said["state"], "", "")
    ctype, reason, message = _true(obj) or ("", "", "")
    return {
        "rows": rows,
        "waves": len(status["waves"]),
        "wave_sizes": [w["members"] for w in status["waves"]],
        "verdict": {"condition": ctype, "reason": reason, "message": message},
        "said": "",
    }


def _shown(page: dict[str, Any]) -> dict[str, Any]:
    return {
        "rows": {
            r["name"]: (r["wave"], r["state"], r["waits_for"], r["waits"]) for r in page["rows"]
        },
        "waves": page["waves"],
        "wave_sizes": page["wave_sizes"],
        "verdict": page["verdict"],
        "said": page["rollout"]["said"],
    }


def _matches(d: Dashboard, kube: Kube, ns: str, obj: dict[str, Any]) -> dict[str, Any]:
    """The dashboard's JSON of the change `obj` describes, once it says what `obj` says."""
    route = "/api/change?id=" + quote(f"{ns}/configmap/cfg@{obj['status']['change']['content']}")
    want = _expected(kube, ns, obj)
    found: dict[str, Any] = {}

    def agrees() -> bool:
        page = _get(d, route)
        found.clear()
        found.update(page or {})
        return page is not None and _shown(page) == want

    wait_for(
        agrees, timeout=30, what=f"the dashboard says {want}: {_shown(found) if found else found}"
    )
    return found


def test_the_dashboard_says_what_the_configrollout_says_before_and_after_the_approval(
    kube: Kube, control_plane: ControlPlane, ns: str
) -> None:
    """A change of `cfg`: wave 1 rolls, and the two readers of wave 2 of 2 wait for an
    approval. The dashboard's change says the two waiting in wave 2 for an approval (the core's
    words, the controller's message), the first complete in the wave its record names, waves
    [1, 2], Reconciling AwaitingApproval, an approval asked in its namespace after wave 1.
    Approved: every reader complete in the wave its record names, Ready Delivered, no approval
    asked, the approval shown as the source records it."""
    with Kubelet(kube, ns) as kubelet:
        kubelet.allow(*APPS)
        readers_of_cfg(kube, ns, APPS)
        wait_healthy(kube, ns, list(APPS))
        before = _held(kube, ns, "Delivered")["status"]["change"]["content"]
        with running_dashboard(control_plane.kubeconfig, ns) as d:
            set_cm(kube, ns, "2")
            held = _held(kube, ns, "AwaitingApproval", before, members=2)
            waiting = [m for m in held["status"]["members"] if m["state"] == "waiting"]
            assert len(waiting) == 2 and {m["wave"] for m in waiting} == {2}, waiting
            page = _matches(d, kube, ns, held)
            assert page["approval"]["asked"] is True
            assert page["approval"]["after_wave"] == 1
            assert page["approval"]["namespaces"] == [ns]
            rows = {r["name"]: r for r in page["rows"]}
            for m in waiting:
                assert rows[m["name"]]["detail"] == m.get("message", ""), rows[m["name"]]
            listed = _get(d, "/api/changes")["changes"]
            [summary] = [c for c in listed if c["id"] == page["id"]]
            assert summary["waiting_approval"] == 2, listed
            assert summary["verdict"] == page["verdict"]

            approve(control_plane.kubeconfig, ns)
            done = _held(kube, ns, "Delivered", before)
            assert done["status"]["change"]["content"] == held["status"]["change"]["content"]
            page = _matches(d, kube, ns, done)
            assert {r["state"] for r in page["rows"]} == {"complete"}
            assert page["approval"]["asked"] is False
            assert len(page["approval"]["approved"]) == 1
    assert "Traceback" not in d.log(), d.log()
