"""Restarts as a failure signal, on a real node whose kubelet really restarts containers (SPEC,
Safe delivery): "an updated pod restarted 3 or more times since the rollout began" fails it,
and "restarts count from the rollout's start".

- A change whose content makes the application exit at start: the kubelet restarts it, with
  its crash-loop back-off (at once, then after 10 and 20 s: the third restart about 30 s after
  the first start), and configpin fails the rollout by that signal, long before the Deployment's
  progress deadline (600 s here); in snapshot mode it undoes, and the pods read the old content
  again.
- Pods that restarted before a change: the pods of the old revision while a change rolls, and
  then, once that change is rolled back to the content they run (a revert), the same pods as
  updated pods of the new rollout. Their restarts are not the rollout's: the first change fails
  by its own signal (the deadline), and the revert completes.

The application is harness/apps.py's reader behind a prelude (`PRELUDE`): it exits at start
when the greeting is `crash`, and during its first N starts in a pod, N read from a ConfigMap
configpin ignores (`configpin.io/ignore`: not pinned, no rollout when it changes), so the test
makes pods restart before a change without the change being what does it. About 2.5 minutes
per Kubernetes version (55 s and 90 s on 1.20.2 and 1.36.2 alike, on a 2-core VM), most of it
the kubelet's back-off, twice.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client

from harness import images
from harness.apps import (
    READER_SCRIPT,
    is_ready,
    last_seen,
    reader_workload,
    replica_sets,
    wait_all_read,
    wait_deployment,
    workload_pods,
)
from harness.controlplane import wait_for
from harness.node import Node
from harness.release import Release
from tests.node.rollouts import (
    all_ready_reading,
    deployment_annotations,
    events,
    rollout_record,
    set_greeting,
    template_config,
)
from webhook.core.constants import ANN_IGNORE, ANN_MODE, ANN_REJECTED, MODE_SNAPSHOT

pytestmark = pytest.mark.usefixtures("pinned")

RESTARTS = 3  # the SPEC's figure: an updated pod restarted this often fails its rollout
LONG_DEADLINE = 600  # progressDeadlineSeconds where the restarts, not the deadline, must fail it
DEADLINE = 30  # ... and where the deadline is the signal
BACKOFF = 10 + 20  # the kubelet's crash-loop back-off before the third restart, seconds
GREETING = "file:/config/greeting"

# Before the reader: count this pod's starts (an emptyDir outlives its container), say what
# was read (the reader's own `seen` line), and exit during the first $warmup starts, or when
# the greeting is `crash`.
PRELUDE = r"""
n=0; { read -r n < /scratch/starts; } 2>/dev/null || :
n=$((n + 1)); echo "$n" > /scratch/starts
warmup=0; { read -r warmup < /flaky/warmup; } 2>/dev/null || :
greeting=; { IFS= read -r greeting < /config/greeting; } 2>/dev/null || :
read -r up _ < /proc/uptime
if [ "$n" -le "$warmup" ] || [ "$greeting" = crash ]; then
  echo "seen $up file:/config/greeting=$greeting"
  echo "start $n: exit 1 (warm-up $warmup, greeting $greeting)"
  exit 1
fi
"""


def _app(name: str, *, deadline: int, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """Two replicas of the reader behind PRELUDE, reading the greeting from a file. A rolling
    update may take one of the two down (maxUnavailable 1), so that a rollout (and its undo)
    starts pods of its own revision; a pod is Ready 5 s after its start at the earliest, so a
    rollout is seen in progress."""
    app = reader_workload(
        "Deployment",
        name,
        images.SHELL.ref,
        configmap="settings",
        files=["greeting"],
        annotations=annotations,
    )
    spec = app["spec"]
    spec["progressDeadlineSeconds"] = deadline
    spec["strategy"] = {"rollingUpdate": {"maxSurge": 1, "maxUnavailable": 1}}
    pod = spec["template"]["spec"]
    [container] = pod["containers"]
    container["command"] = ["sh", "-c", PRELUDE + READER_SCRIPT]
    container["readinessProbe"]["initialDelaySeconds"] = 5
    container["volumeMounts"] += [
        {"name": "scratch", "mountPath": "/scratch"},
        {"name": "flaky", "mountPath": "/flaky"},
    ]
    pod["volumes"] += [
        {"name": "scratch", "emptyDir": {}},
        {"name": "flaky", "configMap": {"name": "flaky", "optional": True}},
    ]
    return app


def _restarts(pod: Any) -> int:
    return sum(c.restart_count for c in pod.status.container_statuses or ())


def _crashed_reading(api: client.ApiClient, namespace: str, pod: Any, greeting: str) -> bool:
    """`pod`'s container read `greeting`, exited, and was restarted by the kubelet."""
    seen = last_seen(api, namespace, pod.metadata.name)
    return _restarts(pod) >= 1 and seen is not None and seen.values.get(GREETING) == greeting


def test_a_change_that_makes_the_container_restart_fails_by_its_restarts_and_is_undone(
    node: Node,
    k8s: client.ApiClient,
    snapshots: Release,
    namespace: str,
    report: Callable[[str], None],
) -> None:
    """Snapshot mode (undo): the new copy's pods exit at start, the kubelet restarts them, and
    configpin fails the rollout by their restarts, with the deadline ten minutes away. Undone,
    the Deployment is back on the first copy, and its pods, one of them started by the undo,
    read the old content, Ready; the content is rejected there, a Warning Event says why."""
    set_greeting(k8s, namespace, "good", create=True)
    app = _app("app", deadline=LONG_DEADLINE, annotations={ANN_MODE: MODE_SNAPSHOT})
    client.AppsV1Api(k8s).create_namespaced_deployment(namespace, app)
    wait_deployment(k8s, namespace, "app")
    wait_all_read(k8s, namespace, "app", {GREETING: "good"})
    first = template_config(k8s, namespace, "app")
    before = {p.metadata.name for p in workload_pods(k8s, namespace, "app")}

    set_greeting(k8s, namespace, "crash")
    changed = time.monotonic()
    wait_for(lambda: template_config(k8s, namespace, "app") != first, timeout=60, what="re-stamped")
    # The new revision's pods read the new copy and exit; the kubelet restarts them.
    wait_for(
        lambda: any(
            _crashed_reading(k8s, namespace, p, "crash")
            for p in workload_pods(k8s, namespace, "app")
            if p.metadata.name not in before
        ),
        timeout=90,
        what="a pod of the new revision restarted after reading the new content",
    )
    # Three restarts later configpin undoes: the template is back on the first copy.
    wait_for(
        lambda: template_config(k8s, namespace, "app") == first,
        timeout=BACKOFF + 150,
        interval=1.0,
        what=f"the rollout failed by {RESTARTS} restarts and undone (the deadline is far)",
    )
    report(
        f"restarts: 1.{node.minor}: a change whose pods crash-loop failed by {RESTARTS} "
        f"restarts and undone {time.monotonic() - changed:.0f} s after the change"
    )
    record = rollout_record(k8s, namespace, "app")
    assert record["state"] == "failed", record
    assert record["action"] == "undo", record
    signal = record["signal"]
    assert signal.startswith("updated pod app-") and "container app restarted" in signal, signal
    assert int(signal.split(" restarted ")[1].split()[0]) >= RESTARTS, signal
    rejected = json.loads(deployment_annotations(k8s, namespace, "app")[ANN_REJECTED])
    assert rejected == {"configmap/settings": record["to"]["configmap/settings"]}
    [event] = events(k8s, namespace, "ConfigRolledBack")
    assert event.type == "Warning"
    assert f"the config rollout failed: {signal}" in event.message, event.message

    # Every pod reads the old content again, Ready; the undo started one of them.
    wait_deployment(k8s, namespace, "app", timeout=90)
    wait_all_read(k8s, namespace, "app", {GREETING: "good"})
    all_ready_reading(k8s, namespace, "app", GREETING, "good")
    after = {p.metadata.name for p in workload_pods(k8s, namespace, "app")}
    assert after - before, "no pod started on the old copy after the undo"
    source = client.CoreV1Api(k8s).read_namespaced_config_map("settings", namespace)
    assert source.data == {"greeting": "crash"}  # the user's, as they wrote it


def test_restarts_from_before_a_rollout_do_not_fail_it(
    node: Node,
    k8s: client.ApiClient,
    configpin: Release,
    namespace: str,
    report: Callable[[str], None],
) -> None:
    """Checksum mode (hold). Both pods restart three times before any change, then run. A
    change that makes the application unready fails by the Deployment's deadline, not by the
    old pods' restarts; the revert to the content they run then completes, with those same
    pods among its updated ones."""
    core = client.CoreV1Api(k8s)
    set_greeting(k8s, namespace, "good", create=True)
    flaky = {"name": "flaky", "annotations": {ANN_IGNORE: "true"}}
    core.create_namespaced_config_map(namespace, {"metadata": flaky, "data": {"warmup": "3"}})
    apps = client.AppsV1Api(k8s)
    apps.create_namespaced_deployment(namespace, _app("app", deadline=LONG_DEADLINE))

    def warmed() -> dict[str, int] | None:
        pods = workload_pods(k8s, namespace, "app")
        ready = len(pods) == 2 and all(is_ready(p) and _restarts(p) >= RESTARTS for p in pods)
        return {p.metadata.name: _restarts(p) for p in pods} if ready else None

    created = time.monotonic()
    old = wait_for(
        warmed, timeout=BACKOFF + 120, interval=1.0, what=f"both pods up after {RESTARTS} restarts"
    )
    assert old is not None
    report(
        f"restarts: 1.{node.minor}: two pods up after {RESTARTS} restarts each "
        f"{time.monotonic() - created:.0f} s after their Deployment was created"
    )
    wait_deployment(k8s, namespace, "app")
    wait_all_read(k8s, namespace, "app", {GREETING: "good"})
    [first_revision] = [rs.metadata.name for rs in replica_sets(k8s, namespace, "app")]
    # From now on pods start at once (a change configpin does not roll for: it ignores flaky),
    # and a rollout that makes no progress for DEADLINE s fails.
    core.patch_namespaced_config_map("flaky", namespace, {"data": {"warmup": "0"}})
    apps.patch_namespaced_deployment(
        "app", namespace, {"spec": {"progressDeadlineSeconds": DEADLINE}}
    )

    # A change that makes the application unready: the old pods' restarts are not its own.
    set_greeting(k8s, namespace, "invalid")
    wait_for(
        lambda: rollout_record(k8s, namespace, "app").get("state") == "failed",
        timeout=DEADLINE + 120,
        interval=1.0,
        what="the change failed",
    )
    failed = rollout_record(k8s, namespace, "app")
    assert failed["action"] == "hold", failed
    assert failed["signal"].startswith(f"its progress deadline ({DEADLINE} s) passed"), failed
    [event] = events(k8s, namespace, "ConfigRolloutFailed")
    assert "progress deadline" in event.message and "restarted" not in event.message
    # held: one pod of the first revision left, Ready, reading the old content
    [kept] = [p for p in workload_pods(k8s, namespace, "app") if p.metadata.name in old]
    assert is_ready(kept) and _restarts(kept) >= RESTARTS
    seen = last_seen(k8s, namespace, kept.metadata.name)
    assert seen is not None and seen.values[GREETING] == "good", seen

    # Back to the content the first revision runs (a revert): a new rollout, whose new
    # ReplicaSet is the first one again, so the pod kept is an updated pod of it, with its
    # restarts from before it began.
    set_greeting(k8s, namespace, "good")

    def reverted() -> dict[str, Any] | None:
        record = rollout_record(k8s, namespace, "app")
        return record if record.get("to") == failed["before"] else None

    started = wait_for(reverted, timeout=90, interval=0.5, what="the revert's rollout started")
    assert started is not None and started["since"] > failed["since"], (started, failed)
    wait_for(
        lambda: replica_sets(k8s, namespace, "app")[-1].metadata.name == first_revision,
        timeout=30,
        what=f"{first_revision} the newest revision again (not a ReplicaSet of its own)",
    )
    wait_for(
        lambda: rollout_record(k8s, namespace, "app").get("state") not in ("rolling", None),
        timeout=120,
        interval=0.5,
        what="the revert's rollout ended",
    )
    done = rollout_record(k8s, namespace, "app")
    assert done["state"] == "complete", f"the revert's rollout {done['state']}: {done['signal']}"
    assert len(events(k8s, namespace, "ConfigRolloutFailed")) == 1
    wait_deployment(k8s, namespace, "app")
    pods = workload_pods(k8s, namespace, "app")
    assert kept.metadata.name in {p.metadata.name for p in pods}
    assert all(_restarts(p) >= RESTARTS for p in pods if p.metadata.name == kept.metadata.name)
    all_ready_reading(k8s, namespace, "app", GREETING, "good")
