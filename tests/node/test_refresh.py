"""Refresh (`configpin.io/on-change: refresh`), asserted by what the running containers read: a
change that reaches the workload only through a mounted volume is read inside the same running
container within seconds (the kubelet alone takes up to a minute or more), no restart, no new
revision; a change that reaches it through the environment still rolls."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from kubernetes import client

from harness import images
from harness.apps import (
    boottime,
    parse_seen,
    pod_log,
    reader_workload,
    replica_sets,
    wait_all_read,
    wait_deployment,
    wait_seen,
    workload_pods,
)
from harness.controlplane import wait_for
from harness.release import Release
from tests.timing import NODE_SETTLE
from webhook.core.constants import ANN_MODE, ANN_ON_CHANGE, ANN_REFRESHED, ON_CHANGE_REFRESH

# Every test here waits first for the webhook to pin workloads in its namespace.
pytestmark = pytest.mark.usefixtures("pinned")

WITHIN = 5.0  # seconds from the change to the new content read inside the running container
SETTLE = NODE_SETTLE
# A pod syncs its volumes several times in its first seconds (probes, status), which delivers a
# change made then at once: the change waits until the pods are past that, as long-running
# pods are, so that only the kubelet's periodic sync (a minute or more) or configpin brings it.
PODS_SETTLE = 10.0


def _settings(api: client.ApiClient, namespace: str, data: dict[str, str]) -> None:
    client.CoreV1Api(api).create_namespaced_config_map(
        namespace, {"metadata": {"name": "settings"}, "data": data}
    )


def test_a_mounted_change_is_read_in_the_running_container_within_seconds(
    k8s: client.ApiClient, configpin: Release, namespace: str, report: Callable[[str], None]
) -> None:
    _settings(k8s, namespace, {"greeting": "hello-one"})
    apps = client.AppsV1Api(k8s)
    for name, mode in (("app", {ANN_ON_CHANGE: ON_CHANGE_REFRESH}), ("control", {ANN_MODE: "off"})):
        # `control`: the same mount, left alone by configpin: the kubelet by itself
        manifest = reader_workload(
            "Deployment",
            name,
            images.SHELL.ref,
            configmap="settings",
            files=["greeting"],
            replicas=2 if name == "app" else 1,
            annotations=mode,
        )
        apps.create_namespaced_deployment(namespace, manifest)
    for name in ("app", "control"):
        wait_deployment(k8s, namespace, name)
        wait_all_read(k8s, namespace, name, {"file:/config/greeting": "hello-one"})
    before = {p.metadata.name: p.metadata.uid for p in workload_pods(k8s, namespace, "app")}
    [revision] = [rs.metadata.name for rs in replica_sets(k8s, namespace, "app")]
    time.sleep(PODS_SETTLE)

    changed_at = boottime()
    client.CoreV1Api(k8s).patch_namespaced_config_map(
        "settings", namespace, {"data": {"greeting": "hello-two"}}
    )
    latencies = {}
    for pod in before:
        seen = wait_seen(k8s, namespace, pod, {"file:/config/greeting": "hello-two"}, timeout=30)
        latencies[pod] = seen.at - changed_at
    figures = ", ".join(f"{s:.2f}s" for s in sorted(latencies.values()))
    # the kubelet by itself, by then (not waited for: it takes up to a minute and more)
    [control] = workload_pods(k8s, namespace, "control")
    last = parse_seen(pod_log(k8s, namespace, control.metadata.name))[-1]
    alone = (
        f"read it after {last.at - changed_at:.1f}s"
        if last.file("/config/greeting") == "hello-two"
        else f"still read the old content {boottime() - changed_at:.1f}s after the change"
    )
    report(
        f"refresh: new content read inside {len(latencies)} running containers after {figures}; "
        f"a pod configpin leaves alone {alone}"
    )
    assert max(latencies.values()) <= WITHIN, latencies

    # the same pods, never restarted, and no new revision
    time.sleep(SETTLE)
    after = workload_pods(k8s, namespace, "app")
    assert {p.metadata.name: p.metadata.uid for p in after} == before
    assert all(s.restart_count == 0 for p in after for s in p.status.container_statuses)
    assert [rs.metadata.name for rs in replica_sets(k8s, namespace, "app")] == [revision]
    # each pod says what it has been refreshed to
    assert all(ANN_REFRESHED in (p.metadata.annotations or {}) for p in after)


def test_a_change_that_reaches_the_environment_still_rolls(
    k8s: client.ApiClient, configpin: Release, namespace: str
) -> None:
    _settings(k8s, namespace, {"greeting": "hello-one", "mood": "calm"})
    app = reader_workload(
        "Deployment",
        "app",
        images.SHELL.ref,
        configmap="settings",
        files=["greeting"],
        env={"MOOD": "mood"},
        annotations={ANN_ON_CHANGE: ON_CHANGE_REFRESH},
    )
    client.AppsV1Api(k8s).create_namespaced_deployment(namespace, app)
    wait_deployment(k8s, namespace, "app")
    wait_all_read(k8s, namespace, "app", {"env:MOOD": "calm"})
    first = {p.metadata.uid for p in workload_pods(k8s, namespace, "app")}

    client.CoreV1Api(k8s).patch_namespaced_config_map(
        "settings", namespace, {"data": {"mood": "bright"}}
    )
    wait_for(lambda: len(replica_sets(k8s, namespace, "app")) == 2, timeout=60, what="a roll")
    wait_deployment(k8s, namespace, "app")
    read = wait_all_read(k8s, namespace, "app", {"env:MOOD": "bright"})
    assert len(read) == 2
    assert not {p.metadata.uid for p in workload_pods(k8s, namespace, "app")} & first
