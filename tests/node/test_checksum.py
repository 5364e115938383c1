"""Checksum mode (the default), asserted by what the application pods read: a change to what
they consume rolls the Deployment and every new pod reads the new content; a change to a key
nobody consumes rolls nothing."""

from __future__ import annotations

import time

import pytest
from kubernetes import client

from harness import images
from harness.apps import (
    reader_workload,
    replica_sets,
    wait_all_read,
    wait_deployment,
    workload_pods,
)
from harness.controlplane import wait_for
from harness.release import Release
from tests.timing import NODE_SETTLE
from webhook.core.constants import ANN_CHECKSUM

# Every test here waits first for the webhook to pin workloads in its namespace.
pytestmark = pytest.mark.usefixtures("pinned")

# configpin's coalescing window (the chart's default 2 s), with room to act on the change.
SETTLE = NODE_SETTLE


def _set(api: client.ApiClient, namespace: str, name: str, data: dict[str, str]) -> None:
    client.CoreV1Api(api).patch_namespaced_config_map(name, namespace, {"data": data})


def test_a_consumed_change_rolls_and_new_pods_read_it_an_unconsumed_one_rolls_nothing(
    k8s: client.ApiClient, configpin: Release, namespace: str
) -> None:
    core = client.CoreV1Api(k8s)
    core.create_namespaced_config_map(
        namespace,
        {
            "metadata": {"name": "settings"},
            "data": {"greeting": "hello-one", "mood": "calm", "unused": "a"},
        },
    )
    # greeting as a file (only that key mounted), mood from the environment; `unused` nowhere
    app = reader_workload(
        "Deployment",
        "app",
        images.SHELL.ref,
        configmap="settings",
        files=["greeting"],
        env={"MOOD": "mood"},
        whole_volume=False,
    )
    client.AppsV1Api(k8s).create_namespaced_deployment(namespace, app)
    wait_deployment(k8s, namespace, "app")
    wait_all_read(k8s, namespace, "app", {"file:/config/greeting": "hello-one", "env:MOOD": "calm"})
    [first] = replica_sets(k8s, namespace, "app")
    first_pods = {p.metadata.uid for p in workload_pods(k8s, namespace, "app")}

    # A key nobody consumes: configpin sees the change and rolls nothing.
    leader = wait_for(lambda: configpin.leader(k8s), timeout=60, what="a leader")
    seen_before = configpin.metric(k8s, leader, "configpin_source_changes_total")
    _set(k8s, namespace, "settings", {"unused": "b"})
    wait_for(
        lambda: configpin.metric(k8s, leader, "configpin_source_changes_total") > seen_before,
        timeout=30,
        what="configpin to see the change",
    )
    time.sleep(SETTLE)
    assert [rs.metadata.name for rs in replica_sets(k8s, namespace, "app")] == [first.metadata.name]
    assert {p.metadata.uid for p in workload_pods(k8s, namespace, "app")} == first_pods

    # What the pods consume: one new revision, and every pod of it reads the new content.
    _set(k8s, namespace, "settings", {"greeting": "hello-two", "mood": "bright"})
    wait_for(
        lambda: len(replica_sets(k8s, namespace, "app")) == 2, timeout=60, what="a new ReplicaSet"
    )
    rolled = wait_deployment(k8s, namespace, "app")
    assert (
        rolled.spec.template.metadata.annotations[ANN_CHECKSUM]
        != (first.spec.template.metadata.annotations[ANN_CHECKSUM])
    )
    read = wait_all_read(
        k8s, namespace, "app", {"file:/config/greeting": "hello-two", "env:MOOD": "bright"}
    )
    assert len(read) == 2
    assert not {p.metadata.uid for p in workload_pods(k8s, namespace, "app")} & first_pods
    # and it rolled once
    time.sleep(SETTLE)
    assert len(replica_sets(k8s, namespace, "app")) == 2
