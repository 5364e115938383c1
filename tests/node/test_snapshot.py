"""Snapshot mode, asserted by what the application pods read: each revision runs with its own
immutable copy, so `kubectl rollout undo` brings the old config back with the old template, and
a StatefulSet pod of the old revision that is recreated reads the old content, not the new.

Snapshot mode writes ConfigMaps (its copies), which the chart grants only when asked:
`snapshots.enabled: true`, set here by `helm upgrade` as an operator would."""

from __future__ import annotations

import time
from typing import Any

import pytest
from kubernetes import client

from harness import images
from harness.apps import (
    reader_workload,
    replica_sets,
    rollout_undo,
    wait_all_read,
    wait_deployment,
    wait_seen,
    workload_pods,
)
from harness.controlplane import wait_for
from harness.release import Release
from tests.timing import NODE_SETTLE
from webhook.core.constants import ANN_MODE, LABEL_SNAPSHOT, MODE_SNAPSHOT

# Every test here waits first for the webhook to pin workloads in its namespace.
pytestmark = pytest.mark.usefixtures("pinned")

SETTLE = NODE_SETTLE


def _config_map_name(template: Any) -> str:
    [volume] = [v for v in template.spec.volumes if v.name == "config"]
    name: str = volume.config_map.name
    return name


def _set(api: client.ApiClient, namespace: str, data: dict[str, str]) -> None:
    client.CoreV1Api(api).patch_namespaced_config_map("settings", namespace, {"data": data})


def _source(api: client.ApiClient, namespace: str, greeting: str) -> None:
    client.CoreV1Api(api).create_namespaced_config_map(
        namespace, {"metadata": {"name": "settings"}, "data": {"greeting": greeting}}
    )


def test_a_change_rolls_to_a_new_copy_and_rollout_undo_brings_the_old_content_back(
    k8s: client.ApiClient, snapshots: Release, namespace: str
) -> None:
    _source(k8s, namespace, "hello-one")
    app = reader_workload(
        "Deployment",
        "app",
        images.SHELL.ref,
        configmap="settings",
        files=["greeting"],
        annotations={ANN_MODE: MODE_SNAPSHOT},
    )
    client.AppsV1Api(k8s).create_namespaced_deployment(namespace, app)
    first = _config_map_name(wait_deployment(k8s, namespace, "app").spec.template)
    assert first.startswith("settings-")
    copy = client.CoreV1Api(k8s).read_namespaced_config_map(first, namespace)
    assert copy.immutable is True
    assert copy.metadata.labels[LABEL_SNAPSHOT] == "true"
    wait_all_read(k8s, namespace, "app", {"file:/config/greeting": "hello-one"})

    _set(k8s, namespace, {"greeting": "hello-two"})
    wait_for(lambda: len(replica_sets(k8s, namespace, "app")) == 2, timeout=60, what="revision 2")
    second = _config_map_name(wait_deployment(k8s, namespace, "app").spec.template)
    assert second not in (first, "settings")
    wait_all_read(k8s, namespace, "app", {"file:/config/greeting": "hello-two"})

    # kubectl rollout undo: the old template, pointing at the old copy, which still exists
    assert rollout_undo(k8s, namespace, "app") == 1
    wait_for(
        lambda: _config_map_name(wait_deployment(k8s, namespace, "app").spec.template) == first,
        timeout=60,
        what="the Deployment back on the first copy",
    )
    read = wait_all_read(k8s, namespace, "app", {"file:/config/greeting": "hello-one"})
    assert len(read) == 2
    # configpin leaves a rollback where it is: no roll forward to the source's current content
    time.sleep(SETTLE)
    template = wait_deployment(k8s, namespace, "app").spec.template
    assert _config_map_name(template) == first
    for pod in workload_pods(k8s, namespace, "app"):
        seen = wait_seen(k8s, namespace, pod.metadata.name, {"file:/config/greeting": "hello-one"})
        assert seen.file("/config/greeting") == "hello-one"


def test_a_statefulset_pod_of_the_old_revision_comes_back_reading_the_old_content(
    k8s: client.ApiClient, snapshots: Release, namespace: str
) -> None:
    """A staged release: the StatefulSet updates ordinals >= 1 only (partition 1). Its pod 0,
    deleted, is recreated from the old revision, whose copy still holds the old content."""
    _source(k8s, namespace, "stable")
    sts = reader_workload(
        "StatefulSet",
        "db",
        images.SHELL.ref,
        configmap="settings",
        files=["greeting"],
        annotations={ANN_MODE: MODE_SNAPSHOT},
    )
    sts["spec"]["updateStrategy"] = {"type": "RollingUpdate", "rollingUpdate": {"partition": 1}}
    apps, core = client.AppsV1Api(k8s), client.CoreV1Api(k8s)
    apps.create_namespaced_stateful_set(namespace, sts)
    for pod in ("db-0", "db-1"):
        wait_seen(k8s, namespace, pod, {"file:/config/greeting": "stable"}, timeout=90)
    old_revision = apps.read_namespaced_stateful_set("db", namespace).status.current_revision

    _set(k8s, namespace, {"greeting": "canary"})

    def updated() -> Any:
        st = apps.read_namespaced_stateful_set("db", namespace).status
        moved = st.update_revision != old_revision and (st.updated_replicas or 0) == 1
        return st if moved else None

    wait_for(updated, timeout=90, what="db-1 on the new revision")
    wait_seen(k8s, namespace, "db-1", {"file:/config/greeting": "canary"}, timeout=90)
    old_uid = core.read_namespaced_pod("db-0", namespace).metadata.uid
    seen = wait_seen(k8s, namespace, "db-0", {"file:/config/greeting": "stable"})
    assert seen.file("/config/greeting") == "stable"  # untouched by the partition

    core.delete_namespaced_pod("db-0", namespace)

    def recreated() -> Any:
        try:
            pod = core.read_namespaced_pod("db-0", namespace)
        except client.ApiException as e:
            if e.status == 404:
                return None
            raise
        return pod if pod.metadata.uid != old_uid else None

    pod = wait_for(recreated, timeout=90, what="db-0 recreated")
    assert pod.metadata.labels["controller-revision-hash"] == old_revision
    back = wait_seen(k8s, namespace, "db-0", {"file:/config/greeting": "stable"}, timeout=90)
    assert back.file("/config/greeting") == "stable"
    canary = wait_seen(k8s, namespace, "db-1", {"file:/config/greeting": "canary"})
    assert canary.file("/config/greeting") == "canary"
