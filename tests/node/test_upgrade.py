"""The release's life: `helm upgrade` to another image restarts no user workload; `helm
uninstall` removes the webhook configuration and user workloads keep running. These run last:
the release is gone afterwards."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from harness import images
from harness.apps import (
    is_ready,
    reader_workload,
    replica_sets,
    wait_all_read,
    wait_deployment,
    wait_ready,
    wait_seen,
)
from harness.controlplane import wait_for
from harness.release import Release, image_values, tag_image
from tests.timing import NODE_SETTLE
from webhook.core.constants import ANN_CHECKSUM, ANN_MODE, ANN_ON_CHANGE, MODE_SNAPSHOT

SETTLE = 2 * NODE_SETTLE  # (new replicas list and check every workload first)


@pytest.fixture
def workloads(k8s: client.ApiClient, configpin: Release, namespace: str) -> Iterator[str]:
    """A namespace of running, pinned readers of every sort: rolled on change, refreshed,
    snapshot mode (the release's snapshots granted if a test before did not), a StatefulSet."""
    if not configpin.values.get("snapshots", {}).get("enabled"):
        configpin.upgrade({**configpin.values, "snapshots": {"enabled": True}})
        configpin.wait_ready(k8s)
    configpin.wait_answering(k8s, namespace)
    client.CoreV1Api(k8s).create_namespaced_config_map(
        namespace, {"metadata": {"name": "settings"}, "data": {"greeting": "steady"}}
    )
    apps = client.AppsV1Api(k8s)
    kinds = {
        "rolled": ("Deployment", {}),
        "refreshed": ("Deployment", {ANN_ON_CHANGE: "refresh"}),
        "snapshot": ("Deployment", {ANN_MODE: MODE_SNAPSHOT}),
        "db": ("StatefulSet", {}),
    }
    for name, (kind, own) in kinds.items():
        manifest = reader_workload(
            kind,
            name,
            images.SHELL.ref,
            configmap="settings",
            files=["greeting"],
            replicas=1,
            annotations=own,
        )
        if kind == "Deployment":
            apps.create_namespaced_deployment(namespace, manifest)
        else:
            apps.create_namespaced_stateful_set(namespace, manifest)
    for name in ("rolled", "refreshed", "snapshot"):
        deployment = wait_deployment(k8s, namespace, name)
        assert ANN_CHECKSUM in deployment.spec.template.metadata.annotations
        wait_all_read(k8s, namespace, name, {"file:/config/greeting": "steady"})
    wait_seen(k8s, namespace, "db-0", {"file:/config/greeting": "steady"}, timeout=90)
    wait_ready(k8s, namespace, "db-0")
    yield namespace


def _state(api: client.ApiClient, namespace: str) -> dict[str, Any]:
    """What a restart or a roll would change: pods (uid, restarts, readiness), revisions and
    the pod templates' checksums."""
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    pods = {
        p.metadata.name: (
            p.metadata.uid,
            sum(s.restart_count for s in p.status.container_statuses or ()),
            is_ready(p),
        )
        for p in core.list_namespaced_pod(namespace).items
    }
    templates = {
        d.metadata.name: (
            d.metadata.generation,
            (d.spec.template.metadata.annotations or {}).get(ANN_CHECKSUM),
            [rs.metadata.name for rs in replica_sets(api, namespace, d.metadata.name)],
        )
        for d in apps.list_namespaced_deployment(namespace).items
    }
    sts = apps.read_namespaced_stateful_set("db", namespace)
    templates["db"] = (sts.metadata.generation, sts.status.current_revision, [])
    return {"pods": pods, "templates": templates}


def test_helm_upgrade_to_another_image_restarts_no_user_workload(
    k8s: client.ApiClient, configpin: Release, workloads: str
) -> None:
    before = _state(k8s, workloads)
    assert all(ready for _, _, ready in before["pods"].values()), before
    old_pods = {p.metadata.name for p in configpin.wait_ready(k8s)}

    new_ref = tag_image(configpin.node, images.CONFIGPIN.ref, "upgrade-test")
    configpin.upgrade({**configpin.values, **image_values(new_ref)})
    pods = configpin.wait_ready(k8s, settled=False)  # the old ones shut down meanwhile
    assert not {p.metadata.name for p in pods} & old_pods
    assert {c.image for p in pods for c in p.spec.containers} == {new_ref}
    wait_for(lambda: configpin.leader(k8s), timeout=60, what="a leader after the upgrade")

    time.sleep(SETTLE)  # the new replicas have listed and checked every workload by now
    assert _state(k8s, workloads) == before


def test_helm_uninstall_removes_the_webhook_and_user_workloads_keep_running(
    k8s: client.ApiClient, configpin: Release, workloads: str
) -> None:
    before = _state(k8s, workloads)
    configpin.uninstall()

    hooks = client.AdmissionregistrationV1Api(k8s)
    with pytest.raises(client.ApiException) as gone:
        hooks.read_mutating_webhook_configuration(configpin.name)
    assert gone.value.status == 404
    wait_for(lambda: not configpin.pods(k8s), timeout=60, what="configpin's pods gone")

    time.sleep(SETTLE)
    assert _state(k8s, workloads) == before
    for name in ("rolled", "refreshed", "snapshot"):
        wait_all_read(k8s, workloads, name, {"file:/config/greeting": "steady"})
    # and a new workload is admitted as it is, unpinned
    created = client.AppsV1Api(k8s).create_namespaced_deployment(
        workloads,
        reader_workload(
            "Deployment", "late", images.SHELL.ref, configmap="settings", files=["greeting"]
        ),
    )
    assert ANN_CHECKSUM not in (created.spec.template.metadata.annotations or {})
    wait_deployment(k8s, workloads, "late")
    wait_all_read(k8s, workloads, "late", {"file:/config/greeting": "steady"})
