"""No combination of changes leaves every rollout waiting (shared/SPEC.md, safe delivery under
what people and tools do), against the API server: two changes whose waves share a workload,
one of them awaiting an approval that comes late, both roll to their end; two changes of
`configpin.io/shared` sources reaching the same two workloads in two namespaces both roll.
(tests/unit/controller/test_waves_liveness.py holds the property over every combination.)

One configpin of its own per set-up (instance `liveness`, `--rollout-waves 1,approve,100%`;
instance `liveness-waves`, `1,10%,100%`), its webhook registered from the chart's own entry,
every controller write through admission. No kubelet: the fake `Kubelet` reports the pods of
the workloads it is allowed Ready.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from kubernetes import client

from harness.configpin import Configpin, instance_namespace
from harness.controlplane import ControlPlane, wait_for
from harness.kubelet import Kubelet
from harness.manifests import configmap, container, deployment, env_key_ref, pod_spec
from tests.integration.instances import instance_fixtures, leading_fixture
from tests.integration.workloads import (
    approve,
    get,
    record,
    set_cm,
    sources,
    stamped,
    state,
    wait_event,
    wait_healthy,
)
from webhook.core.constants import ANN_MODE, ANN_SHARED, ANN_WAVE
from webhook.core.record import Change
from webhook.core.waves import Member, wave_order
from webhook.kube.raw import Kube, path

INSTANCE = "liveness"
ARGS = [
    "--coalesce-window", "0.5",
    "--min-rollout-interval", "0",
    "--resync-period", "600",  # (what rolls here does not wait for a resync)
    "--rollout-waves", "1,approve,100%",
]  # fmt: skip
WAVES = "liveness-waves"
WAVES_ARGS = [
    "--coalesce-window", "3",  # (four writes of two shared sources: one moment for configpin)
    "--min-rollout-interval", "0",
    "--resync-period", "600",
    "--rollout-waves", "1,10%,100%",
]  # fmt: skip
COMPLETE = "complete"

cp, ns = instance_fixtures(INSTANCE, "liveness", ARGS)
cp_waves = leading_fixture(WAVES, "liveness-waves", WAVES_ARGS)


@pytest.fixture
def two(k8s: client.ApiClient, cp_waves: Configpin) -> Iterator[tuple[str, str]]:
    """Two fresh namespaces opted in for `liveness-waves` (waves with no approval: one
    awaited would hold the later member back, webhook.controller.wavecut.WaveCut.held, and no
    two changes could wait for each other there)."""
    with (
        instance_namespace(k8s, WAVES, "liveness") as one,
        instance_namespace(k8s, WAVES, "liveness") as other,
    ):
        yield one, other


def _app(name: str, consumes: tuple[str, ...], wave: int) -> dict[str, Any]:
    """Deployment `name`, one replica, reading key `a` of each ConfigMap it `consumes`."""
    env = [env_key_ref("configmap", s, "a", f"V{i}") for i, s in enumerate(consumes)]
    annotations = {ANN_MODE: "checksum", ANN_WAVE: str(wave)}
    dep = deployment(name, pod_spec(container(env=env)), replicas=1, annotations=annotations)
    dep["spec"]["progressDeadlineSeconds"] = 600
    return dep


def _changes(dep: Mapping[str, Any]) -> list[Change]:
    """The changes its rollout record says it rolled."""
    return [c for c in map(Change.parse, record(dep).get("changes") or ()) if c is not None]


def _wait_rolled(kube: Kube, namespace: str, name: str, before: Mapping[str, str]) -> None:
    wait_for(
        lambda: (
            sources(get(kube, namespace, name)) != before
            and state(get(kube, namespace, name)) == COMPLETE
        ),
        timeout=60,
        what=f"{name} rolled and complete",
    )


def test_two_changes_sharing_a_canary_one_awaiting_approval_both_roll_to_their_end(
    kube: Kube, ns: str, cp: Configpin, control_plane: ControlPlane
) -> None:
    """`x` reads s1 alone and comes first of its waves; `c` reads s0 and s1, first of s0's
    waves and second of s1's; `a` and `b` read s0 alone. s1 changes: `x` rolls, and `c`, after
    `approve`, waits for s1's approval. s0 changes: `c` cannot roll it (it would carry s1's
    unapproved content), so `a` is s0's canary, rolls and completes (on main `c` stayed s0's
    canary: `a` and `b` waited for it, and it for s1's approval). s0 approved: `b` rolls; s1
    approved: `c` rolls both. Every workload ends on what its sources hold, complete."""
    for name in ("s0", "s1"):
        kube.create(path("configmaps", ns), configmap(name, {"a": "0"}))
    apps = {"x": (("s1",), -1), "c": (("s0", "s1"), 0), "a": (("s0",), 1), "b": (("s0",), 1)}
    for name, (consumes, wave) in apps.items():
        kube.create(path("deployments", ns), _app(name, consumes, wave))
    before = {name: sources(stamped(kube, ns, name)) for name in apps}
    with Kubelet(kube, ns) as kubelet:
        kubelet.allow(*apps)
        wait_healthy(kube, ns, list(apps))
        set_cm(kube, ns, "1", source="s1")
        _wait_rolled(kube, ns, "x", before["x"])
        wait_event(kube, ns, "c", "ConfigRolloutAwaitingApproval", "Normal")
        assert sources(get(kube, ns, "c")) == before["c"]
        set_cm(kube, ns, "1", source="s0")
        _wait_rolled(kube, ns, "a", before["a"])
        wait_event(kube, ns, "b", "ConfigRolloutAwaitingApproval", "Normal")
        assert sources(get(kube, ns, "b")) == before["b"]
        assert sources(get(kube, ns, "c")) == before["c"]
        approve(control_plane.kubeconfig, ns, "s0")
        _wait_rolled(kube, ns, "b", before["b"])
        assert sources(get(kube, ns, "c")) == before["c"]  # s1 awaits its approval still
        approve(control_plane.kubeconfig, ns, "s1")
        _wait_rolled(kube, ns, "c", before["c"])
    changes = sorted(c.source.name for c in _changes(get(kube, ns, "c")))
    assert changes == ["s0", "s1"], changes


def test_two_shared_changes_reaching_two_workloads_in_two_namespaces_both_roll(
    kube: Kube, two: tuple[str, str]
) -> None:
    """ConfigMaps s0 and s2 are `configpin.io/shared` in two namespaces. `w1` (in `ns`) and
    `v1` (in `other`) read both and are healthy; `w0` (`ns`, s0 alone) and `v0` (`other`, s2
    alone) never become Ready, and come before the healthy one of their namespace in the order
    of its workloads. Both sources change in both namespaces within the coalescing window: one
    of `w1` and `v1` is the canary of both changes, rolls them both and completes; then the
    rest roll. (On main each change took one workload of each namespace in turn over its own
    members, so that whichever namespace came first, s0's canary was `v1` and s2's `w1`, each
    in the other's second wave: both waited for ever, ConfigRolloutWaiting, and nothing
    rolled.)"""
    ns, other = two
    shared = {ANN_SHARED: "true"}
    apps = {
        (ns, "w0"): ("s0",),
        (ns, "w1"): ("s0", "s2"),
        (other, "v0"): ("s2",),
        (other, "v1"): ("s0", "s2"),
    }
    for where in (ns, other):
        for name in ("s0", "s2"):
            kube.create(path("configmaps", where), configmap(name, {"a": "0"}, annotations=shared))
        # (the premise: in each namespace the broken reader comes first)
        mine = [Member(0, where, "Deployment", n) for (w, n) in apps if w == where]
        assert [m.name for m in wave_order(mine)] == sorted(m.name for m in mine)
    for (where, name), consumes in apps.items():
        kube.create(path("deployments", where), _app(name, consumes, 0))
    before = {app: sources(stamped(kube, *app)) for app in apps}
    healthy = [(ns, "w1"), (other, "v1")]
    with Kubelet(kube, ns, other) as kubelet:
        kubelet.allow("w1", "v1")  # (w0 and v0: never Ready)
        for where, name in healthy:
            wait_healthy(kube, where, [name])
        for name in ("s0", "s2"):
            for where in (ns, other):
                set_cm(kube, where, "1", source=name)
        assert [app for app in apps if sources(get(kube, *app)) != before[app]] == []
        wait_for(
            lambda: any(
                sources(get(kube, *app)) != before[app] and state(get(kube, *app)) == COMPLETE
                for app in healthy
            ),
            timeout=60,
            what="the canary of both changes, w1 or v1, rolled and complete",
        )
        for app in healthy:
            _wait_rolled(kube, *app, before[app])
        wait_for(
            lambda: all(sources(get(kube, *app)) != before[app] for app in apps),
            timeout=60,
            what="w0 and v0 re-stamped in the last wave",
        )
    for app in healthy:
        changes = sorted(c.source.name for c in _changes(get(kube, *app)))
        assert changes == ["s0", "s2"], (app, changes)
