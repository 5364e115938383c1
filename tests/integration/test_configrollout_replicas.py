"""A member's pods on its ConfigRollout: while a Deployment rolls a change, the member its
ConfigRollout lists says its updated and ready replicas against the desired ones, as the
Deployment's own status moves them (the controller's watch of it, published again), against
the real API server and controller-manager.

Two configpin replicas of instance `cfgreps` run as the chart runs them (one Lease, both
webhooks registered from the chart's own entries, the CRD installed from the chart's crds/),
one wave. Nothing runs pods: `Kubelet` marks the pods of app `a` Ready, each new one two
seconds after it appeared, so that the rolling update takes two steps (3 replicas, maxSurge 0,
maxUnavailable 2: two old pods go and two new ones come and get Ready, then the last).
"""

from __future__ import annotations

import time
from typing import Any

from harness.kubelet import Kubelet
from harness.manifests import configmap
from tests.integration.instances import replicas_fixtures
from tests.integration.workloads import reader, set_cm, stamped, wait_healthy
from webhook.core.rollouts import GROUP, PLURAL, VERSION
from webhook.kube.errors import NotFound
from webhook.kube.raw import Kube, path

ARGS = [
    "--coalesce-window", "0.5",
    "--min-rollout-interval", "0",
    "--resync-period", "2",
    "--lease-duration", "4",
    "--rollout-waves", "100%",
]  # fmt: skip
PREFIX = f"/apis/{GROUP}/{VERSION}"
NAME = "configmap-cfg"

replicas, ns = replicas_fixtures("cfgreps", ARGS)


def _cr(kube: Kube, ns: str) -> dict[str, Any] | None:
    try:
        return kube.get(path(PLURAL, ns, NAME, prefix=PREFIX))
    except NotFound:
        return None


def _about_now(kube: Kube, ns: str, obj: dict[str, Any] | None) -> bool:
    if obj is None:
        return False
    cm = kube.get(path("configmaps", ns, "cfg"))
    source = (obj.get("status") or {}).get("source") or {}
    return source.get("resourceVersion") == cm["metadata"]["resourceVersion"]


def _true(obj: dict[str, Any]) -> tuple[str, str] | None:
    for c in (obj.get("status") or {}).get("conditions") or ():
        if c.get("status") == "True":
            return c["type"], c.get("reason", "")
    return None


def test_a_rolling_members_updated_and_ready_replicas_move(kube: Kube, ns: str) -> None:
    """`a` (3 replicas) reads `cfg`; `cfg` changes. Each look at its ConfigRollout about the
    change while `a` rolls lists `a` rolling with `replicas` {updated, ready, desired: 3}:
    updated 2 of 3 with 1 ready (two old pods gone, their new ones not Ready yet), then 3 of 3
    with 2 ready (those two Ready, the last old one gone); the change ends Ready (Delivered),
    no member listed."""
    with Kubelet(kube, ns) as kubelet:
        kubelet.allow("a")
        kube.create(path("configmaps", ns), configmap("cfg", {"a": "1"}))
        app = reader("a", replicas=3)
        two_at_a_time = {"maxSurge": 0, "maxUnavailable": 2}
        app["spec"]["strategy"] = {"type": "RollingUpdate", "rollingUpdate": two_at_a_time}
        kube.create(path("deployments", ns), app)
        stamped(kube, ns, "a")
        wait_healthy(kube, ns, ["a"])
        end = time.monotonic() + 60
        while time.monotonic() < end:
            before = _cr(kube, ns)
            if _about_now(kube, ns, before) and _true(before or {}) == ("Ready", "Delivered"):
                break
            time.sleep(0.2)
        else:
            raise AssertionError(f"never Delivered before the change: {before}")
        kubelet.clear()
        kubelet.allow("a", after=2.0)
        set_cm(kube, ns, "2")
        seen: list[tuple[str, int, int, int]] = []
        end = time.monotonic() + 120
        last: dict[str, Any] | None = None
        while time.monotonic() < end:
            last = _cr(kube, ns)
            if last is not None and _about_now(kube, ns, last):
                for m in last["status"].get("members") or ():
                    counts = m.get("replicas") or {}
                    said = (m["state"], counts.get("updated"), counts.get("ready"))
                    seen.append((*said, counts.get("desired")))
                if _true(last) == ("Ready", "Delivered"):
                    break
            time.sleep(0.2)
        else:
            raise AssertionError(f"never Delivered: {last}")
    assert last is not None and last["status"]["members"] == []
    rolling = [s for s in seen if s[0] == "rolling"]
    assert rolling, seen
    assert all(desired == 3 for *_, desired in seen), seen
    assert all(0 <= ready <= 3 and 0 <= updated <= 3 for _, updated, ready, _ in seen), seen
    moves = [(u, r) for _, u, r, _ in rolling]
    assert {(2, 1), (3, 2)} <= set(moves), rolling
    assert moves == sorted(moves), rolling  # (never back)
