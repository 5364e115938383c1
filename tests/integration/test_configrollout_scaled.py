"""A person scales a member of a change to zero in the middle of it, and the ConfigRollout
configpin publishes for the ConfigMap (shared/SPEC.md "Safe delivery under what people and
tools do": a workload of a wave that is scaled to zero proves nothing, it leaves the wave).

Two configpin replicas of instance `cfgsc` run as the chart runs them, waves `1,100%`: the
first wave is one canary, the second every other member. Three readers of `cfg`; the
`Kubelet` marks Ready the pods that run the content from before the change and, once the
test says so, those of the change. `kubectl scale --replicas=0` is the person.

- a member still waiting for its wave, scaled to zero: it waits no longer than its wave, is
  brought to the new content there without a pod to restart and counted as left; the change
  is Ready once the others run it;
- the canary scaled to zero while it rolls: it leaves (counted so, its rollout not taken for
  a verdict), one of the others takes its place as the canary, and the change is Ready once
  the two others run it;

each with `kubectl configpin wait`, started the instant the change was written, exiting 0,
and no workload's template changed twice for the one change (one ReplicaSet more each).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from harness.controlplane import ControlPlane, wait_for
from harness.kubelet import Kubelet, carrying
from tests.integration.instances import replicas_fixtures
from tests.integration.test_configrollout import (
    _about_now,
    _conditions,
    _cr,
    _kubectl,
    _wait_cli,
    _wait_condition,
)
from tests.integration.workloads import (
    get,
    quiet,
    readers_of_cfg,
    replicasets,
    set_cm,
    sources,
    wait_healthy,
)
from webhook.kube.raw import Kube

RESYNC = 2.0
ARGS = [
    "--coalesce-window", "0.5",
    "--min-rollout-interval", "0",
    "--resync-period", str(RESYNC),
    "--lease-duration", "4",
    "--rollout-waves", "1,100%",
]  # fmt: skip
APPS = ("a", "b", "c")

replicas, ns = replicas_fixtures("cfgsc", ARGS)


States = dict[str, tuple[str, str | None]]


def _states(obj: dict[str, Any]) -> States:
    """The members its status lists (those not done yet): name -> (state, reason)."""
    return {m["name"]: (m["state"], m.get("reason")) for m in obj["status"].get("members") or ()}


def _wait_states(
    kube: Kube, ns: str, want: Callable[[States], bool], what: str, timeout: float = 60
) -> dict[str, Any]:
    """The ConfigRollout, once its status about the ConfigMap as it stands lists members
    `want` accepts."""
    found: dict[str, Any] = {}

    def says() -> bool:
        obj = _cr(kube, ns)
        if obj is None or not _about_now(kube, ns, obj):
            return False
        found.clear()
        found.update(obj)
        return want(_states(obj))

    wait_for(says, timeout=timeout, what=f"{what}: {_states(_cr(kube, ns) or {'status': {}})}")
    return found


def _waves(obj: dict[str, Any]) -> list[dict[str, int]]:
    """Its waves, each as the counts it says (members, and how many in each state)."""
    return [{k: v for k, v in w.items() if k != "wave"} for w in obj["status"]["waves"]]


def _scale_to_zero(plane: ControlPlane, ns: str, name: str) -> None:
    """A person's `kubectl scale deployment/NAME --replicas=0`."""
    done = _kubectl(plane, "scale", f"deployment/{name}", "--replicas=0", "-n", ns)
    assert done.returncode == 0, done.stderr


def _started(kube: Kube, ns: str, kubelet: Kubelet) -> dict[str, str]:
    """The three readers of `cfg`, Ready, the ConfigRollout Ready; from now on `kubelet`
    marks Ready only the pods that run the content from before (what they record)."""
    kubelet.allow(*APPS)
    readers_of_cfg(kube, ns, APPS)
    wait_healthy(kube, ns, list(APPS))
    _wait_condition(kube, ns, "Ready", "Delivered", consumers=3)
    before = sources(get(kube, ns, APPS[0]))
    assert all(sources(get(kube, ns, n)) == before for n in APPS)
    kubelet.clear()
    kubelet.allow(carrying(before))
    return before


def _delivered_once(kube: Kube, ns: str, before: dict[str, str]) -> dict[str, Any]:
    """The ConfigRollout Ready about the ConfigMap as it stands; every reader's template on
    the new content, changed once for it (one ReplicaSet more), and left so over several
    resyncs."""
    ready = _wait_condition(kube, ns, "Ready", "Delivered", timeout=90)
    now = {n: sources(get(kube, ns, n)) for n in APPS}
    assert all(s != before for s in now.values()), now
    assert len({tuple(sorted(s.items())) for s in now.values()}) == 1, now
    quiet(kube, ns, now, 3 * RESYNC)
    assert {n: replicasets(kube, ns, n) for n in APPS} == dict.fromkeys(APPS, 2)
    return ready


def test_a_member_scaled_to_zero_while_it_waits_leaves_the_change_which_is_delivered(
    kube: Kube, control_plane: ControlPlane, ns: str
) -> None:
    """The change rolls the canary, whose new pods are not Ready yet, and the two others
    wait for wave 2. A person scales one of them to zero: it waits for its wave still, not
    longer. The canary's new pods get Ready: wave 2 starts, the other rolls, the one at zero
    is brought to the new content (no pod restarted) and counted as left; the change is
    Ready, 3 of 3, and `kubectl configpin wait` exits 0."""
    with Kubelet(kube, ns) as kubelet:
        before = _started(kube, ns, kubelet)
        set_cm(kube, ns, "2")
        cli = _wait_cli(control_plane, ns, "--timeout", "180s")  # (the same instant)
        rolling = _wait_states(
            kube,
            ns,
            lambda s: sorted(v for v, _r in s.values()) == ["rolling", "waiting", "waiting"],
            "the canary rolling, the two others waiting",
        )
        states = _states(rolling)
        assert {r for v, r in states.values() if v == "waiting"} == {"Waiting"}, states
        gone = sorted(n for n, (v, _r) in states.items() if v == "waiting")[0]

        _scale_to_zero(control_plane, ns, gone)
        wait_for(
            lambda: get(kube, ns, gone)["status"].get("replicas", 0) == 0,
            what=f"{gone} scaled to zero",
        )
        quiet(kube, ns, {gone: before}, 2 * RESYNC)  # (its wave has not started)
        still = _wait_condition(kube, ns, "Reconciling", "Rolling")
        assert _states(still)[gone] == ("waiting", "Waiting"), _states(still)
        assert cli.poll() is None, cli.communicate()

        kubelet.allow(*APPS)  # the canary's new pods get Ready, then those of wave 2
        out, err = cli.communicate(timeout=150)
        assert cli.returncode == 0, out + err
        assert "configmap/cfg delivered" in out, out
        ready = _delivered_once(kube, ns, before)
        assert ready["status"]["summary"]["ready"] == "3/3"
        assert ready["status"]["counts"]["members"] == 3
        # one canary, then the two others: the one at zero counted as left
        assert _waves(ready) == [
            {"members": 1, "complete": 1},
            {"members": 2, "complete": 1, "left": 1},
        ]
        assert get(kube, ns, gone)["spec"]["replicas"] == 0  # (as the person left it)


def test_the_canary_scaled_to_zero_while_it_rolls_leaves_and_another_takes_its_place(
    kube: Kube, control_plane: ControlPlane, ns: str
) -> None:
    """The change rolls the canary, whose new pods are not Ready; the two others wait for
    wave 2. A person scales the canary to zero: its rollout proves nothing (no verdict, no
    failure), it is counted as left, and one of the two others becomes the canary and rolls;
    once its new pods are Ready, the last one rolls; the change is Ready, 3 of 3, and
    `kubectl configpin wait` exits 0. Nothing is rolled twice: the canary that left is not
    rolled again when its wave comes."""
    with Kubelet(kube, ns) as kubelet:
        before = _started(kube, ns, kubelet)
        set_cm(kube, ns, "2")
        cli = _wait_cli(control_plane, ns, "--timeout", "180s")
        rolling = _wait_states(
            kube,
            ns,
            lambda s: sorted(v for v, _r in s.values()) == ["rolling", "waiting", "waiting"],
            "the canary rolling, the two others waiting",
        )
        [canary] = [n for n, (v, _r) in _states(rolling).items() if v == "rolling"]
        rolled_to = sources(get(kube, ns, canary))
        assert rolled_to != before

        _scale_to_zero(control_plane, ns, canary)
        moved = _wait_states(
            kube,
            ns,
            lambda s: (
                canary not in s and sorted(v for v, _r in s.values()) == ["rolling", "waiting"]
            ),
            f"{canary} left, another rolling in its place, the last waiting",
        )
        states = _states(moved)
        [last] = [n for n, (v, _r) in states.items() if v == "waiting"]
        assert states[last] == ("waiting", "Waiting"), states
        assert moved["status"]["summary"]["ready"] == "1/3"  # (the one that left: done)
        assert _conditions(moved)["Stalled"][0] == "False"  # (its rollout is no verdict)
        assert cli.poll() is None, cli.communicate()

        kubelet.allow(*APPS)
        out, err = cli.communicate(timeout=150)
        assert cli.returncode == 0, out + err
        assert "configmap/cfg delivered" in out, out
        ready = _delivered_once(kube, ns, before)
        assert sources(get(kube, ns, canary)) == rolled_to  # (as it was rolled, once)
        assert get(kube, ns, canary)["spec"]["replicas"] == 0
        assert ready["status"]["summary"]["ready"] == "3/3"
        # the new canary, then the last one with the canary that left
        assert _waves(ready) == [
            {"members": 1, "complete": 1},
            {"members": 2, "complete": 1, "left": 1},
        ]
