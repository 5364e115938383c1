"""Safe delivery on a real node, asserted by what the application pods read: a change whose
content makes the application unready is undone (snapshot mode) and every pod reads the old
content, Ready, and a re-apply of the manifest (which names the source itself) keeps it on that
copy; in checksum mode the failed first wave holds the change, and the workloads of the later
waves keep running on the old content (their environment); a person's rollback of the canary
(`kubectl rollout undo`) is a verdict: its pods read the old copy again and no later wave
starts. The reader's readiness depends on its config (harness/apps.py: content with `invalid`
in it makes it unready), as a real application's would.

The chart's defaults: waves `1,10%,100%`, undo in snapshot mode, hold in checksum mode."""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Sequence
from typing import Any

import pytest
from kubernetes import client

from harness import images
from harness.apps import (
    deployment_rolled_out,
    is_ready,
    last_seen,
    reader_workload,
    replica_sets,
    rollout_undo,
    wait_all_read,
    wait_deployment,
    workload_pods,
)
from harness.controlplane import wait_for
from harness.release import Release
from tests.node.rollouts import (
    all_ready_reading,
    deployment_annotations,
    events,
    rolled_out_reading,
    rollout_record,
    set_greeting,
    template_config,
    until,
)
from tests.timing import NODE_SETTLE
from webhook.core.constants import ANN_MODE, ANN_REJECTED, ANN_ROLLOUT, MODE_SNAPSHOT
from webhook.kube.raw import Kube, path

pytestmark = pytest.mark.usefixtures("pinned")

DEADLINE = 15  # the Deployments' progressDeadlineSeconds
SETTLE = NODE_SETTLE
PATIENT = 15  # minReadySeconds where a rollout must stay in progress: a new pod Ready is
# available only this long after, and until then the old ReplicaSet is not scaled down
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"


def _app(name: str, **kw: Any) -> dict[str, Any]:
    app = reader_workload("Deployment", name, images.SHELL.ref, configmap="settings", **kw)
    app["spec"]["progressDeadlineSeconds"] = DEADLINE
    return app


def test_a_change_that_makes_the_application_unready_is_undone_and_its_pods_read_the_old_content(
    k8s: client.ApiClient, snapshots: Release, namespace: str
) -> None:
    """Undone, the Deployment stays on the first copy: a re-apply of its manifest, which names
    the ConfigMap itself (now the rejected content), is kept there, with a warning."""
    set_greeting(k8s, namespace, "good", create=True)
    app = _app("app", files=["greeting"], annotations={ANN_MODE: MODE_SNAPSHOT})
    manifest = copy.deepcopy(app)
    client.AppsV1Api(k8s).create_namespaced_deployment(namespace, app)
    wait_deployment(k8s, namespace, "app")
    first = template_config(k8s, namespace, "app")
    wait_all_read(k8s, namespace, "app", {"file:/config/greeting": "good"})

    set_greeting(k8s, namespace, "invalid")
    # The new revision's pod reads the new copy, and is not Ready: the rollout cannot progress.
    wait_for(lambda: template_config(k8s, namespace, "app") != first, timeout=60, what="re-stamped")
    wait_for(
        lambda: any(
            (s := last_seen(k8s, namespace, p.metadata.name)) is not None
            and s.file("/config/greeting") == "invalid"
            for p in workload_pods(k8s, namespace, "app")
        ),
        timeout=90,
        what="a pod of the new revision reading the new content",
    )
    # The Deployment controller says the deadline passed; configpin undoes.
    wait_for(
        lambda: template_config(k8s, namespace, "app") == first,
        timeout=DEADLINE + 90,
        what="the template back on the first copy",
    )
    wait_deployment(k8s, namespace, "app")
    wait_all_read(k8s, namespace, "app", {"file:/config/greeting": "good"})
    all_ready_reading(k8s, namespace, "app", "file:/config/greeting", "good")
    annotations = deployment_annotations(k8s, namespace, "app")
    assert '"state":"failed"' in annotations[ANN_ROLLOUT].replace(" ", "")
    assert ANN_REJECTED in annotations
    assert events(k8s, namespace, "ConfigRolledBack")
    # The source is the user's: configpin leaves it as they wrote it, and does not roll to it.
    source = client.CoreV1Api(k8s).read_namespaced_config_map("settings", namespace)
    assert source.data == {"greeting": "invalid"}

    # Nor does a re-apply of the manifest as first written (`kubectl apply`, Argo CD), whose
    # volume names the source itself, the rejected content now: it stays on its last good copy,
    # and the write is answered with a warning that says so.
    revisions = [rs.metadata.name for rs in replica_sets(k8s, namespace, "app")]
    volumes = manifest["spec"]["template"]["spec"]["volumes"]
    assert volumes == [{"name": "config", "configMap": {"name": "settings"}}]
    patch = {"spec": {"template": {"spec": {"volumes": volumes}}}}
    resp = Kube(k8s).open(
        "PATCH",
        path("deployments", namespace, "app"),
        body=patch,
        content_type=STRATEGIC_MERGE_PATCH,
    )
    try:
        applied = json.loads(resp.read())
        warnings = " ".join(resp.headers.getlist("Warning"))
    finally:
        resp.release_conn()
    [applied_volume] = applied["spec"]["template"]["spec"]["volumes"]
    assert applied_volume["configMap"]["name"] == first, "re-pointed at the rejected content"
    assert "rejected" in warnings, warnings
    time.sleep(SETTLE)
    assert template_config(k8s, namespace, "app") == first
    assert [rs.metadata.name for rs in replica_sets(k8s, namespace, "app")] == revisions
    assert deployment_rolled_out(k8s, namespace, "app") is not None
    all_ready_reading(k8s, namespace, "app", "file:/config/greeting", "good")

    # The fix is a new change: it rolls as usual.
    set_greeting(k8s, namespace, "fixed")
    wait_for(
        lambda: template_config(k8s, namespace, "app") not in (first,),
        timeout=60,
        what="the fix re-stamped",
    )
    wait_deployment(k8s, namespace, "app")
    wait_all_read(k8s, namespace, "app", {"file:/config/greeting": "fixed"}, timeout=90)
    all_ready_reading(k8s, namespace, "app", "file:/config/greeting", "fixed")


def test_a_failed_first_wave_holds_the_change_and_the_other_workloads_keep_the_old_content(
    k8s: client.ApiClient, configpin: Release, namespace: str
) -> None:
    """Checksum mode, three Deployments reading the greeting from their environment (what a
    running container cannot be changed under: only a rollout brings it)."""
    set_greeting(k8s, namespace, "good", create=True)
    names = ("one", "two", "three")
    apps = client.AppsV1Api(k8s)
    for name in names:
        apps.create_namespaced_deployment(
            namespace, _app(name, env={"GREETING": "greeting"}, replicas=1)
        )
    for name in names:
        wait_deployment(k8s, namespace, name)
        wait_all_read(k8s, namespace, name, {"env:GREETING": "good"})

    set_greeting(k8s, namespace, "invalid")

    def rolled() -> list[str]:
        return [n for n in names if ANN_ROLLOUT in deployment_annotations(k8s, namespace, n)]

    [first] = wait_for(rolled, timeout=60, what="the first wave")
    rest = [n for n in names if n != first]
    wait_for(
        lambda: rollout_record(k8s, namespace, first).get("state") == "failed",
        timeout=DEADLINE + 90,
        what="the first wave failed",
    )
    wait_for(  # (Events are sent after the write, by the recorder's own thread)
        lambda: events(k8s, namespace, "ConfigRolloutFailed"),
        timeout=30,
        what="the ConfigRolloutFailed Event",
    )
    time.sleep(SETTLE)
    assert rolled() == [first]  # held: no later wave
    for name in rest:
        all_ready_reading(k8s, namespace, name, "env:GREETING", "good")

    # The fix is a new change: every workload rolls to it, the held one too.
    set_greeting(k8s, namespace, "fixed")
    for name in names:  # in waves: one, then the rest, each once the one before is complete
        wait_for(
            lambda n=name: rolled_out_reading(k8s, namespace, n, "env:GREETING", "fixed"),
            timeout=180,
            interval=1.0,
            what=f"{name} rolled out, every pod reading the fix",
        )


def test_a_persons_rollback_of_the_canary_is_a_verdict_and_no_later_wave_starts(
    k8s: client.ApiClient, snapshots: Release, namespace: str
) -> None:
    """Snapshot mode, three Deployments reading the greeting from a file. The new content keeps
    the reader Ready, but a person rolls the canary back (`kubectl rollout undo`) while its
    rollout is in progress (`minReadySeconds`: the old pods are not scaled down yet). That is a
    verdict: the record ends failed, rolled back by a person, a Warning Event says so, its pods
    read the old copy, and the other two are never rolled; the next change rolls to all."""
    set_greeting(k8s, namespace, "good", create=True)
    names = ("one", "two", "three")
    apps = client.AppsV1Api(k8s)
    for name in names:
        app = reader_workload(
            "Deployment",
            name,
            images.SHELL.ref,
            configmap="settings",
            files=["greeting"],
            annotations={ANN_MODE: MODE_SNAPSHOT},
        )
        # long enough that the Deployment controller judges nothing: the person does
        app["spec"]["progressDeadlineSeconds"] = 600
        app["spec"]["minReadySeconds"] = PATIENT
        apps.create_namespaced_deployment(namespace, app)
    for name in names:  # available, so each can vouch for a change (a canary)
        wait_deployment(k8s, namespace, name, timeout=PATIENT + 120)
        wait_all_read(k8s, namespace, name, {"file:/config/greeting": "good"})
    first = {name: template_config(k8s, namespace, name) for name in names}
    revisions = {
        name: [rs.metadata.name for rs in replica_sets(k8s, namespace, name)] for name in names
    }
    before = {
        name: {p.metadata.name for p in workload_pods(k8s, namespace, name)} for name in names
    }

    set_greeting(k8s, namespace, "suspicious")

    def rolled() -> list[str]:
        return [n for n in names if ANN_ROLLOUT in deployment_annotations(k8s, namespace, n)]

    def later_wave(rest: Sequence[str]) -> str | None:
        started = [n for n in rest if n in rolled()]
        return f"a later wave started ({', '.join(started)})" if started else None

    [canary] = wait_for(rolled, timeout=60, what="the first wave")
    rest = [n for n in names if n != canary]
    assert template_config(k8s, namespace, canary) != first[canary]
    # Its new pod reads the new copy, Ready; the rollout waits for it to be available.
    old_pods = before[canary]
    until(
        lambda: any(
            p.metadata.name not in old_pods
            and is_ready(p)
            and (s := last_seen(k8s, namespace, p.metadata.name)) is not None
            and s.file("/config/greeting") == "suspicious"
            for p in workload_pods(k8s, namespace, canary)
        ),
        never=lambda: later_wave(rest),
        timeout=90,
        interval=0.3,
        what=f"a new pod of {canary} Ready reading the new content",
    )
    rolling = rollout_record(k8s, namespace, canary)
    assert rolling.get("state") == "rolling", rolling
    assert deployment_rolled_out(k8s, namespace, canary) is None
    assert old_pods <= {p.metadata.name for p in workload_pods(k8s, namespace, canary)}

    # A person rolls it back.
    rollout_undo(k8s, namespace, canary)

    def counted_complete() -> str | None:
        if rollout_record(k8s, namespace, canary).get("state") == "complete":
            return f"{canary}'s rollout was counted complete"
        return later_wave(rest)

    until(
        lambda: rollout_record(k8s, namespace, canary).get("state") == "failed",
        never=counted_complete,
        timeout=60,
        interval=0.3,
        what=f"{canary}'s change failed by the person's rollback",
    )
    record = rollout_record(k8s, namespace, canary)
    assert record["action"] == "rolled-back-by-person", record
    rejected = json.loads(deployment_annotations(k8s, namespace, canary)[ANN_REJECTED])
    assert rejected == {"configmap/settings": rolling["to"]["configmap/settings"]}
    wait_for(
        lambda: events(k8s, namespace, "ConfigRolledBackByPerson"),
        timeout=30,
        what="a ConfigRolledBackByPerson Event",
    )
    assert all(e.type == "Warning" for e in events(k8s, namespace, "ConfigRolledBackByPerson"))
    # Where the person put it: the old copy, which every pod of it reads, Ready.
    assert template_config(k8s, namespace, canary) == first[canary]
    wait_deployment(k8s, namespace, canary)
    all_ready_reading(k8s, namespace, canary, "file:/config/greeting", "good")
    # There it stays, and no later wave starts, however long one waits (here twice as long as
    # elsewhere: the next change waits for the canary's minimum rollout interval, 30 s from its
    # re-stamp with the chart's defaults, so this costs nothing).
    settle = time.monotonic() + 2 * SETTLE
    while time.monotonic() < settle:
        assert rolled() == [canary], "a later wave started"
        assert template_config(k8s, namespace, canary) == first[canary]
        time.sleep(0.5)
    for name in rest:
        assert template_config(k8s, namespace, name) == first[name]
        assert [rs.metadata.name for rs in replica_sets(k8s, namespace, name)] == revisions[name]
        all_ready_reading(k8s, namespace, name, "file:/config/greeting", "good")
    all_ready_reading(k8s, namespace, canary, "file:/config/greeting", "good")
    source = client.CoreV1Api(k8s).read_namespaced_config_map("settings", namespace)
    assert source.data == {"greeting": "suspicious"}

    # The next change rolls to all three (in waves). No need to be patient any more: without
    # minReadySeconds each rollout completes once its pods are Ready.
    for name in names:
        apps.patch_namespaced_deployment(name, namespace, {"spec": {"minReadySeconds": 0}})
    set_greeting(k8s, namespace, "fixed")
    for name in names:
        wait_for(
            lambda n=name: rolled_out_reading(k8s, namespace, n, "file:/config/greeting", "fixed"),
            timeout=180,
            interval=1.0,
            what=f"{name} rolled out, every pod reading the fix",
        )
    for name in names:
        all_ready_reading(k8s, namespace, name, "file:/config/greeting", "fixed")
