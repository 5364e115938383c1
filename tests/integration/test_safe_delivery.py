"""Safe delivery against the real API server and controller-manager, no kubelet: configpin
follows the rollouts it starts, undoes (snapshot mode) or holds (checksum mode) one that fails,
never rolls a workload to rejected content again, and rolls a change to many workloads in
waves that a leader change neither restarts nor loses.

Two configpin replicas of instance `deliver` run as the chart runs them (one Lease, the
webhook registered from the chart's own entry, every controller write through admission).
Nothing runs pods here: a Deployment's pods stay Pending, so its rollout fails by its own
progress deadline, unless the test marks its pods Ready through `pods/status`, as a kubelet
would (`Kubelet`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from harness.configpin import Configpin, instance_namespace
from harness.controlplane import ControlPlane, wait_for
from harness.kubelet import Kubelet
from harness.manifests import configmap, container, deployment, env_key_ref, pod_spec
from tests.integration.instances import leader, replicas_fixture
from tests.integration.workloads import kubectl_configpin
from webhook.core.constants import (
    ANN_MODE,
    ANN_PROGRESS_DEADLINE,
    ANN_REJECTED,
    ANN_ROLLOUT,
    ANN_SOURCES,
    ANN_WAVE,
)
from webhook.kube.raw import MERGE_PATCH, Kube, path

INSTANCE = "deliver"
RESYNC = 2.0
ARGS = [
    "--coalesce-window", "0.5",
    "--min-rollout-interval", "0",
    "--resync-period", str(RESYNC),
]  # fmt: skip
DEADLINE = 5  # a Deployment's progressDeadlineSeconds here


replicas = replicas_fixture(INSTANCE, "deliver", ARGS)


@pytest.fixture
def ns(k8s: client.ApiClient, replicas: list[Configpin]) -> Iterator[str]:
    with instance_namespace(k8s, INSTANCE, "deliver") as name:
        yield name


# --- helpers ------------------------------------------------------------------------------


def _app(name: str, *, mode: str = "checksum", deadline: int = DEADLINE) -> dict[str, Any]:
    dep = deployment(
        name,
        pod_spec(container(env=[env_key_ref("configmap", "cfg", "a", "A")])),
        replicas=1,
        annotations={ANN_MODE: mode},
    )
    dep["spec"]["progressDeadlineSeconds"] = deadline
    return dep


def _get(kube: Kube, ns: str, name: str, resource: str = "deployments") -> dict[str, Any]:
    return kube.get(path(resource, ns, name))


def _annotation(obj: dict[str, Any], key: str) -> Any:
    text = (obj["metadata"].get("annotations") or {}).get(key)
    return json.loads(text) if text else None


def _sources(obj: dict[str, Any]) -> dict[str, str]:
    text = (obj["spec"]["template"]["metadata"].get("annotations") or {}).get(ANN_SOURCES)
    return json.loads(text) if text else {}


def _ref(obj: dict[str, Any]) -> str:
    return obj["spec"]["template"]["spec"]["containers"][0]["env"][0]["valueFrom"][
        "configMapKeyRef"
    ]["name"]


def _state(obj: dict[str, Any]) -> str | None:
    record = _annotation(obj, ANN_ROLLOUT)
    return record.get("state") if record else None


def _set_cm(kube: Kube, ns: str, value: str) -> None:
    kube.patch(path("configmaps", ns, "cfg"), {"data": {"a": value}}, content_type=MERGE_PATCH)


def _replicasets(kube: Kube, ns: str, app: str) -> int:
    return len(kube.get(path("replicasets", ns), labelSelector=f"app={app}").get("items") or ())


def _reasons(kube: Kube, ns: str, name: str) -> list[str]:
    found = kube.get(
        f"/apis/events.k8s.io/v1/namespaces/{ns}/events", fieldSelector=f"regarding.name={name}"
    )
    return [e.get("reason") for e in found.get("items") or ()]


def _status(plane: ControlPlane, ns: str) -> tuple[int, dict[str, dict[str, Any]]]:
    """`kubectl configpin status -n NS -o json`: the exit code, and each workload's row."""
    proc = kubectl_configpin(["status", "-n", ns, "-o", "json"], plane.kubeconfig)
    return proc.returncode, {r["name"]: r for r in json.loads(proc.stdout)}


def _stamped(kube: Kube, ns: str, name: str) -> dict[str, Any]:
    wait_for(lambda: _sources(_get(kube, ns, name)), what=f"{name} stamped")
    return _get(kube, ns, name)


def _quiet(kube: Kube, ns: str, name: str, seconds: float) -> None:
    """Nothing more happens to `name` for `seconds` (several resync periods)."""
    before = _get(kube, ns, name)
    time.sleep(seconds)
    after = _get(kube, ns, name)
    assert after["spec"]["template"] == before["spec"]["template"]
    assert after["metadata"].get("generation") == before["metadata"].get("generation")


# --- a rollout that fails -------------------------------------------------------------------


def test_a_failed_snapshot_rollout_is_undone_and_its_content_never_rolled_to_again(
    kube: Kube, ns: str, replicas: list[Configpin], control_plane: ControlPlane
) -> None:
    kube.create(path("configmaps", ns), configmap("cfg", {"a": "1"}))
    kube.create(path("deployments", ns), _app("web", mode="snapshot"))
    first = _ref(_stamped(kube, ns, "web"))
    assert first.startswith("cfg-")
    _set_cm(kube, ns, "2")
    wait_for(lambda: _state(_get(kube, ns, "web")) == "rolling", what="the rollout started")
    second = _ref(_get(kube, ns, "web"))
    assert second != first
    # nothing runs the new pods: the Deployment's own progress deadline passes, configpin undoes
    wait_for(
        lambda: _state(_get(kube, ns, "web")) == "failed", timeout=DEADLINE + 60, what="undone"
    )
    web = _get(kube, ns, "web")
    record = _annotation(web, ANN_ROLLOUT)
    assert record["action"] == "undo" and "progress deadline" in record["signal"]
    assert _ref(web) == first  # the previous copy: the old pods' config
    assert set(_annotation(web, ANN_REJECTED)) == {"configmap/cfg"}
    wait_for(lambda: "ConfigRolledBack" in _reasons(kube, ns, "web"), what="the Event")
    assert sum(cp.metric("configpin_rollout_failures_total", action="undo") for cp in replicas) >= 1
    code, rows = _status(control_plane, ns)
    assert code == 1 and rows["web"]["state"] == "failed"  # a failure to look at: exit 1
    assert "progress deadline" in rows["web"]["reason"] and "(undone)" in rows["web"]["reason"]
    # the rejected content is never rolled to again, whatever resyncs come
    _quiet(kube, ns, "web", 3 * RESYNC)
    assert _replicasets(kube, ns, "web") == 2
    # the next change rolls as usual
    _set_cm(kube, ns, "3")
    wait_for(
        lambda: _ref(_get(kube, ns, "web")) not in (first, second), what="the next change rolled"
    )
    assert _state(_get(kube, ns, "web")) == "rolling"


def test_a_failed_checksum_rollout_is_held(kube: Kube, ns: str, replicas: list[Configpin]) -> None:
    kube.create(path("configmaps", ns), configmap("cfg", {"a": "1"}))
    kube.create(path("deployments", ns), _app("web"))
    before = _sources(_stamped(kube, ns, "web"))
    _set_cm(kube, ns, "2")
    wait_for(lambda: _state(_get(kube, ns, "web")) == "rolling", what="the rollout started")
    rolled = _sources(_get(kube, ns, "web"))
    assert rolled != before
    wait_for(lambda: _state(_get(kube, ns, "web")) == "failed", timeout=DEADLINE + 60, what="held")
    web = _get(kube, ns, "web")
    assert _annotation(web, ANN_ROLLOUT)["action"] == "hold"
    assert _sources(web) == rolled  # changed in place: nothing to take back
    assert _annotation(web, ANN_REJECTED) == {"configmap/cfg": rolled["configmap/cfg"]}
    wait_for(lambda: "ConfigRolloutFailed" in _reasons(kube, ns, "web"), what="the Event")
    _quiet(kube, ns, "web", 3 * RESYNC)
    _set_cm(kube, ns, "3")
    wait_for(
        lambda: _sources(_get(kube, ns, "web")) not in (before, rolled), what="the next change"
    )


def test_a_statefulset_fails_by_configpins_deadline(
    kube: Kube, ns: str, replicas: list[Configpin]
) -> None:
    kube.create(path("configmaps", ns), configmap("cfg", {"a": "1"}))
    template = {
        "metadata": {"labels": {"app": "db"}},
        "spec": pod_spec(container(env=[env_key_ref("configmap", "cfg", "a", "A")])),
    }
    sts = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {
            "name": "db",
            "annotations": {ANN_MODE: "snapshot", ANN_PROGRESS_DEADLINE: str(DEADLINE)},
        },
        "spec": {
            "serviceName": "db",
            "replicas": 1,
            "selector": {"matchLabels": {"app": "db"}},
            "template": template,
        },
    }
    kube.create(path("statefulsets", ns), sts)
    wait_for(lambda: _sources(_get(kube, ns, "db", "statefulsets")), what="db stamped")
    first = _ref(_get(kube, ns, "db", "statefulsets"))
    _set_cm(kube, ns, "2")
    wait_for(lambda: _state(_get(kube, ns, "db", "statefulsets")) == "rolling", what="rolling")
    wait_for(
        lambda: _state(_get(kube, ns, "db", "statefulsets")) == "failed",
        timeout=DEADLINE + 60,
        what="undone at configpin's deadline",
    )
    db = _get(kube, ns, "db", "statefulsets")
    record = _annotation(db, ANN_ROLLOUT)
    assert record["action"] == "undo" and f"Ready for {DEADLINE} s" in record["signal"]
    assert _ref(db) == first


# --- nothing to follow ----------------------------------------------------------------------


def _versions(k8s: client.ApiClient, ns: str, name: str, since: str) -> list[dict[str, Any]]:
    """Every version of Deployment `name` stored after resourceVersion `since`, in order."""
    response = client.AppsV1Api(k8s).list_namespaced_deployment(
        ns,
        watch=True,
        resource_version=since,
        timeout_seconds=1,
        field_selector=f"metadata.name={name}",
        _preload_content=False,
    )
    events = [json.loads(line) for line in response.data.decode().splitlines() if line]
    return [e["object"] for e in events if e.get("type") in ("ADDED", "MODIFIED")]


@pytest.mark.parametrize("mode", ["checksum", "snapshot"])
def test_a_workload_at_zero_replicas_is_re_stamped_with_its_rollout_ended_in_one_write(
    k8s: client.ApiClient,
    kube: Kube,
    ns: str,
    replicas: list[Configpin],
    control_plane: ControlPlane,
    mode: str,
) -> None:
    """Nothing rolls at zero replicas: the re-stamp writes its record `left` in the same write,
    and configpin writes the workload no more for that change (it used to write `rolling`,
    then read the workload and its pods and write `left`, a second write through admission
    and an Event, for each such workload of a fan-out)."""
    kube.create(path("configmaps", ns), configmap("cfg", {"a": "1"}))
    idle = _app("idle", mode=mode)
    idle["spec"]["replicas"] = 0
    kube.create(path("deployments", ns), idle)
    before = _stamped(kube, ns, "idle")
    _set_cm(kube, ns, "2")
    wait_for(lambda: _sources(_get(kube, ns, "idle")) != _sources(before), what="re-stamped")
    time.sleep(2 * RESYNC)  # a look at it, and a second write, would have come by now
    records = [
        _annotation(v, ANN_ROLLOUT)
        for v in _versions(k8s, ns, "idle", before["metadata"]["resourceVersion"])
        if _sources(v) != _sources(before)
    ]
    assert records, "no version of the re-stamped Deployment was seen"
    assert all(r == records[0] for r in records), [r["state"] for r in records]
    assert records[0]["state"] == "left"
    assert _replicasets(kube, ns, "idle") == 2  # re-stamped all the same: its next revision
    wait_for(lambda: "RolloutStarted" in _reasons(kube, ns, "idle"), what="the Event")
    assert "ConfigRolloutLeft" not in _reasons(kube, ns, "idle")
    notes = kube.get(
        f"/apis/events.k8s.io/v1/namespaces/{ns}/events", fieldSelector="regarding.name=idle"
    )["items"]
    started = [e["note"] for e in notes if e.get("reason") == "RolloutStarted"]
    assert started and "zero replicas" in started[0]
    code, rows = _status(control_plane, ns)
    assert code == 0 and rows["idle"]["rollout"]["state"] == "left"


# --- waves ----------------------------------------------------------------------------------


NAMES = [f"app-{i:02d}" for i in range(20)]


# The waves of a change of the twenty, as this test orders them (each its configpin.io/wave,
# its place in NAMES) and as the default wave list `1,10%,100%` cuts them: one workload, then a
# tenth of the other 19 rounded up, then the rest.
WAVES = [NAMES[:1], NAMES[1:3], NAMES[3:]]


def _twenty(kube: Kube, ns: str, deadline: int = DEADLINE) -> dict[str, dict[str, str]]:
    kube.create(path("configmaps", ns), configmap("cfg", {"a": "1"}))
    for place, name in enumerate(NAMES):
        body = _app(name, deadline=deadline)
        body["metadata"]["annotations"][ANN_WAVE] = str(place)
        kube.create(path("deployments", ns), body)
    return {name: _sources(_stamped(kube, ns, name)) for name in NAMES}


def _since(kube: Kube, ns: str, name: str) -> float | None:
    record = _annotation(_get(kube, ns, name), ANN_ROLLOUT)
    return record["since"] if record else None


def test_a_change_whose_first_wave_fails_reaches_no_other(
    kube: Kube, ns: str, replicas: list[Configpin], control_plane: ControlPlane
) -> None:
    before = _twenty(kube, ns, deadline=20)
    first, *later = WAVES
    with Kubelet(kube, ns) as kubelet:  # healthy before the change: each one can vouch
        kubelet.allow(*NAMES)
        wait_for(
            lambda: all(_get(kube, ns, n)["status"].get("readyReplicas") == 1 for n in NAMES),
            timeout=90,
            what="the twenty Ready",
        )
        kubelet.clear()  # the change's pods never become Ready
        _set_cm(kube, ns, "2")
        wait_for(
            lambda: _state(_get(kube, ns, first[0])) == "failed",
            timeout=20 + 60,
            what="wave 1 failed",
        )
        time.sleep(3 * RESYNC)
    for name in [n for wave in later for n in wave]:
        dep = _get(kube, ns, name)
        assert _sources(dep) == before[name], f"{name} was re-stamped after wave 1 failed"
        assert _replicasets(kube, ns, name) == 1
    waiting = [n for wave in later for n in wave if "ConfigRolloutWaiting" in _reasons(kube, ns, n)]
    assert waiting, "the waiting workloads were told why"
    _, rows = _status(control_plane, ns)
    assert rows[waiting[0]]["state"] == "waiting" and "failed" in rows[waiting[0]]["reason"]


def test_healthy_waves_follow_in_order_across_a_leader_change(
    kube: Kube, ns: str, replicas: list[Configpin]
) -> None:
    before = _twenty(kube, ns, deadline=600)  # healthy: nothing fails by its deadline here
    wave1, wave2, wave3 = WAVES
    with Kubelet(kube, ns) as kubelet:
        kubelet.allow(*NAMES)
        wait_for(
            lambda: all(_get(kube, ns, n)["status"].get("readyReplicas") == 1 for n in NAMES),
            timeout=90,
            what="the twenty Ready",
        )
        kubelet.allowed.clear()
        kubelet.allow(*wave1)  # wave 2's new pods stay Pending for now
        _set_cm(kube, ns, "2")
        wait_for(
            lambda: all(_state(_get(kube, ns, n)) == "rolling" for n in wave2),
            timeout=90,
            what="wave 2 started",
        )
        assert all(_state(_get(kube, ns, n)) == "complete" for n in wave1)
        assert not any(_state(_get(kube, ns, n)) for n in wave3)
        # the leader goes away in the middle of wave 2
        leading = leader(replicas)
        assert leading is not None
        leading.stop()
        standby = next(cp for cp in replicas if cp is not leading)
        wait_for(
            lambda: standby.metric("configpin_leader") == 1, timeout=60, what="the standby leading"
        )
        kubelet.allow(*NAMES)
        wait_for(
            lambda: all(_state(_get(kube, ns, n)) == "complete" for n in NAMES),
            timeout=180,
            what="every wave complete",
        )
    since = {n: _since(kube, ns, n) for n in NAMES}
    assert max(since[n] for n in wave1) <= min(since[n] for n in wave2)  # type: ignore[type-var]
    assert max(since[n] for n in wave2) <= min(since[n] for n in wave3)  # type: ignore[type-var]
    for name in NAMES:
        assert _sources(_get(kube, ns, name)) != before[name]
        assert _replicasets(kube, ns, name) == 2, f"{name} rolled more than once"
