"""Rollout windows on a real node (issue 40, shared/SPEC.md "Windows and budgets"), asserted
by what the application containers read: a ConfigMap changed while its namespace's window is
closed is not rolled, and the running pods keep reading the old content, until the window
opens; then they are replaced by pods that read the new one. A person's `kubectl rollout
restart` of another reader meanwhile is theirs and never held: it goes through at once, and
its new pod reads the old content too (the copy its template names), until the window opens
and configpin rolls that reader in its wave.

Snapshot mode (`snapshots.enabled` by `helm upgrade`, as in test_snapshot.py): windows hold
configpin's rollouts, not the content. In checksum mode the kubelet updates a mounted file in
running pods after its sync (about a minute) and a pod that starts meanwhile reads the new
content, as without configpin (docs/windows.md, "What windows never hold"); a snapshot
pod reads its revision's immutable copy, file and environment alike, so the old content is
what every pod reads for as long as the window is closed, one started meanwhile included.

The window opens at the first whole minute at least 75 s ahead (cron's resolution): the test
takes two to three minutes per run."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from typing import Any

from kubernetes import client

from harness import images
from harness.apps import (
    last_seen,
    reader_workload,
    replica_sets,
    wait_all_read,
    wait_deployment,
    workload_pods,
    write_warned,
)
from harness.controlplane import wait_for
from harness.release import Release
from tests.node.rollouts import (
    all_ready_reading,
    events,
    rolled_out_reading,
    set_greeting,
    template_config,
    until,
)
from webhook.core.constants import ANN_MODE, ANN_ROLLOUT_WINDOWS, ANN_WAVE, MODE_SNAPSHOT
from webhook.kube.raw import MERGE_PATCH, Kube, path

AWAITING = "ConfigRolloutAwaitingWindow"
OLD = {"file:/config/greeting": "old", "env:GREETING": "old"}
NEW = {"file:/config/greeting": "new", "env:GREETING": "new"}


def _next_opening(ahead: float) -> tuple[str, float]:
    """An allow window (one hour) that opens at the first whole minute at least `ahead`
    seconds from now (UTC), and when that is (tests/integration/test_windows.py's)."""
    at = math.ceil((time.time() + ahead) / 60) * 60
    moment = time.gmtime(at)
    schedule = f"{moment.tm_min} {moment.tm_hour} * * *"
    return json.dumps([{"kind": "allow", "schedule": schedule, "duration": "1h"}]), float(at)


def _running(api: client.ApiClient, ns: str) -> dict[str, int]:
    """The pods of `app`: {uid: restarts of its container}."""
    return {
        p.metadata.uid: sum(c.restart_count for c in p.status.container_statuses or ())
        for p in workload_pods(api, ns, "app")
    }


def _awaiting(api: client.ApiClient, ns: str, name: str) -> list[Any]:
    """The ConfigRolloutAwaitingWindow Events on Deployment `name`."""
    return [e for e in events(api, ns, AWAITING) if e.involved_object.name == name]


def _reading(api: client.ApiClient, ns: str, name: str, content: dict[str, str]) -> bool:
    """`name` rolled out, every pod of it reading `content` (its file and its environment)."""
    return all(rolled_out_reading(api, ns, name, key, value) for key, value in content.items())


def test_a_change_outside_the_window_waits_and_the_pods_read_the_old_content_until_it_opens(
    k8s: client.ApiClient, snapshots: Release, pinned: str, report: Callable[[str], None]
) -> None:
    """`app` is left alone while the window is closed; `restarted` is restarted by a person
    meanwhile (`kubectl rollout restart`), which is theirs and never held: it goes through at
    once, on its template's copy of the old content. Both roll to the new content once the
    window opens, in their waves."""
    ns = pinned
    set_greeting(k8s, ns, "old", create=True)
    apps = client.AppsV1Api(k8s)
    # `app` goes first in the change's waves (the chart's `1,10%,100%`): the closed window
    # holds that first wave, and says so on it; `restarted`'s later wave waits for it.
    for name, replicas, wave in (("app", 2, "0"), ("restarted", 1, "1")):
        workload = reader_workload(
            "Deployment",
            name,
            images.SHELL.ref,
            configmap="settings",
            files=["greeting"],
            env={"GREETING": "greeting"},
            replicas=replicas,
            annotations={ANN_MODE: MODE_SNAPSHOT, ANN_WAVE: wave},
        )
        apps.create_namespaced_deployment(ns, workload)
    for name in ("app", "restarted"):
        wait_deployment(k8s, ns, name)
        wait_all_read(k8s, ns, name, OLD)
    first = template_config(k8s, ns, "app")
    revisions = [rs.metadata.name for rs in replica_sets(k8s, ns, "app")]
    running = _running(k8s, ns)

    # The namespace allows rollouts from a whole minute at least 75 s ahead; the change comes
    # before. The replicas know the list from their Namespace watches: once the preview of the
    # write (as a dry run) says that both wait, the write itself.
    windows, opens = _next_opening(ahead=75.0)
    client.CoreV1Api(k8s).patch_namespace(
        ns, {"metadata": {"annotations": {ANN_ROLLOUT_WINDOWS: windows}}}
    )
    kube = Kube(k8s)
    at = time.strftime("%H:%M UTC", time.gmtime(opens))

    def preview(*, dry_run: bool) -> list[str]:
        cm = path("configmaps", ns, "settings")
        change = {"data": {"greeting": "new"}}
        return write_warned(kube, "PATCH", cm, change, content_type=MERGE_PATCH, dry_run=dry_run)[1]

    def both_wait(said: list[str]) -> bool:  # (`... 2 wait for their window, opens Fri ...`)
        return any("2 wait for their window, opens " in line and at in line for line in said)

    wait_for(
        lambda: both_wait(preview(dry_run=True)),
        timeout=30,
        interval=0.2,
        what=f"the preview of the change to say that both wait for their window ({at})",
    )
    said = preview(dry_run=False)
    changed = time.time()
    assert both_wait(said), said

    # Until it opens: the same pods of `app`, never restarted, on the same revision and copy,
    # every one reading the old content; and the Event saying that the change waits.
    def unchanged() -> str | None:
        if [rs.metadata.name for rs in replica_sets(k8s, ns, "app")] != revisions:
            return "a new ReplicaSet of app before the window opened"
        if template_config(k8s, ns, "app") != first:
            return "app's template re-pointed before the window opened"
        if (now := _running(k8s, ns)) != running:
            return f"app's pods replaced or restarted before the window opened: {now}"
        for pod in workload_pods(k8s, ns, "app"):
            seen = last_seen(k8s, ns, pod.metadata.name)
            if seen is None or {k: seen.values.get(k) for k in OLD} != OLD:
                return f"{pod.metadata.name} read {seen} before the window opened"
        return None

    [event] = until(
        lambda: _awaiting(k8s, ns, "app"),
        never=unchanged,
        timeout=60,
        interval=1.0,
        what=f"a {AWAITING} Event on app",
    )
    assert time.time() < opens
    assert event.type == "Normal", event
    assert at in event.message, event.message

    # A person's restart meanwhile goes through at once: a new ReplicaSet, whose pod reads
    # the old content too (the copy its template names, which a restart keeps).
    copy = template_config(k8s, ns, "restarted")
    before = {p.metadata.uid for p in workload_pods(k8s, ns, "restarted")}
    restart = {
        "kubectl.kubernetes.io/restartedAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    }
    apps.patch_namespaced_deployment(
        "restarted", ns, {"spec": {"template": {"metadata": {"annotations": restart}}}}
    )
    until(
        lambda: (
            len(replica_sets(k8s, ns, "restarted")) == 2
            and _reading(k8s, ns, "restarted", OLD)
            and not before & {p.metadata.uid for p in workload_pods(k8s, ns, "restarted")}
        ),
        never=unchanged,
        timeout=60,
        interval=1.0,
        what="the person's restart rolled out, its pod reading the old content",
    )
    assert time.time() < opens, "the person's restart was held until the window opened"
    assert template_config(k8s, ns, "restarted") == copy

    until(
        lambda: time.time() >= opens - 1,
        never=unchanged,
        timeout=opens - time.time() + 5,
        interval=1.0,
        what="the window's opening",
    )

    # It opens: one rollout of app, to a new copy, whose pods read the new content; then
    # (its wave) one of `restarted`.
    wait_for(
        lambda: _reading(k8s, ns, "app", NEW),
        timeout=180,
        interval=1.0,
        what="app rolled out once its window opened, every pod reading the new content",
    )
    report(
        f"windows: a change held {opens - changed:.0f}s until its window opened; "
        f"app's pods all read it {time.time() - opens:.0f}s after the opening"
    )
    [_, new] = replica_sets(k8s, ns, "app")
    assert new.metadata.creation_timestamp.timestamp() >= opens, new.metadata.creation_timestamp
    assert template_config(k8s, ns, "app") not in (first, "settings")
    assert not set(_running(k8s, ns)) & set(running)
    all_ready_reading(k8s, ns, "app", "file:/config/greeting", "new")
    all_ready_reading(k8s, ns, "app", "env:GREETING", "new")
    assert len(_awaiting(k8s, ns, "app")) == 1
    wait_for(
        lambda: _reading(k8s, ns, "restarted", NEW),
        timeout=180,
        interval=1.0,
        what="restarted rolled out in its wave, reading the new content",
    )
    assert len(replica_sets(k8s, ns, "restarted")) == 3
    assert template_config(k8s, ns, "restarted") == template_config(k8s, ns, "app")
    all_ready_reading(k8s, ns, "restarted", "env:GREETING", "new")
