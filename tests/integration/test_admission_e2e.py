"""Admission end to end: the real API server calls configpin over TLS (checksum mode)."""

from __future__ import annotations

import json
import warnings
from typing import Any

import pytest
from kubernetes import client

from harness.configpin import Configpin
from harness.controlplane import ControlPlane, server_minor, wait_for
from harness.manifests import (
    configmap,
    container,
    deployment,
    env_from,
    env_key_ref,
    pod_spec,
    secret,
)

CHECKSUM = "configpin.io/checksum"
SOURCES = "configpin.io/sources"


def _pod_spec(cm: str = "app-config", sec: str = "app-secret") -> dict[str, Any]:
    """All of ConfigMap `cm` (envFrom) and key `token` of Secret `sec` (valueFrom)."""
    return pod_spec(
        container(
            env_from=[env_from("configmap", cm)],
            env=[env_key_ref("secret", sec, "token", "TOKEN")],
        )
    )


def _web(spec: dict[str, Any]) -> dict[str, Any]:
    """Deployment `web` with one replica (its Pod is admitted too)."""
    return deployment("web", spec, replicas=1)


def _sources(meta: Any) -> dict[str, str]:
    annotations = (
        meta.annotations if hasattr(meta, "annotations") else meta.get("annotations")
    ) or {}
    return json.loads(annotations[SOURCES])


@pytest.fixture
def api(k8s: client.ApiClient, configpin: Configpin) -> client.ApiClient:
    return k8s


def test_deployment_replicaset_and_pods_carry_the_annotations(
    api: client.ApiClient, namespace: str
) -> None:
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    core.create_namespaced_config_map(namespace, configmap("app-config", {"a": "1"}))
    core.create_namespaced_secret(namespace, secret("app-secret", {"token": "t0"}))
    apps.create_namespaced_deployment(namespace, _web(_pod_spec()))

    dep = apps.read_namespaced_deployment("web", namespace)
    tmpl = dep.spec.template.metadata
    assert set(_sources(tmpl)) == {"configmap/app-config", "secret/app-secret"}
    assert len(tmpl.annotations[CHECKSUM]) == 64
    wait_for(lambda: core.list_namespaced_pod(namespace).items, what="a pod of the deployment")
    rs = apps.list_namespaced_replica_set(namespace).items[0]
    pod = core.list_namespaced_pod(namespace).items[0]
    for meta in (rs.spec.template.metadata, pod.metadata):
        assert meta.annotations[CHECKSUM] == tmpl.annotations[CHECKSUM]
        assert meta.annotations[SOURCES] == tmpl.annotations[SOURCES]


def test_namespace_without_the_label_is_untouched(
    api: client.ApiClient, plain_namespace: str
) -> None:
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    core.create_namespaced_config_map(plain_namespace, configmap("app-config", {"a": "1"}))
    apps.create_namespaced_deployment(plain_namespace, _web(_pod_spec()))
    dep = apps.read_namespaced_deployment("web", plain_namespace)
    assert CHECKSUM not in (dep.spec.template.metadata.annotations or {})


def test_bare_pod_is_mutated(api: client.ApiClient, namespace: str) -> None:
    core = client.CoreV1Api(api)
    core.create_namespaced_config_map(namespace, configmap("app-config", {"a": "1"}))
    core.create_namespaced_secret(namespace, secret("app-secret", {"token": "t0"}))
    pod = core.create_namespaced_pod(
        namespace,
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bare"}, "spec": _pod_spec()},
    )
    # The ServiceAccount admission plugin (before webhooks) adds the token Secret volume on 1.20.
    assert {"configmap/app-config", "secret/app-secret"} <= set(_sources(pod.metadata))


def test_owned_pod_is_not_remutated(
    api: client.ApiClient, namespace: str, configpin: Configpin
) -> None:
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    core.create_namespaced_config_map(namespace, configmap("app-config", {"a": "1"}))
    core.create_namespaced_secret(namespace, secret("app-secret", {"token": "t0"}))
    before = configpin.metric("configpin_admissions_total", kind="Pod", result="skipped")
    apps.create_namespaced_deployment(namespace, _web(_pod_spec()))
    wait_for(lambda: core.list_namespaced_pod(namespace).items, what="a pod of the deployment")
    # Change the source: a pod created now must still say what its template says.
    core.patch_namespaced_config_map("app-config", namespace, {"data": {"a": "2"}})
    # (compared with its own ReplicaSet's template: the controller may meanwhile have rolled
    # the Deployment for the change, and a pod of either ReplicaSet may be listed first)
    pod = core.list_namespaced_pod(namespace).items[0]
    [owner] = [r for r in pod.metadata.owner_references if r.kind == "ReplicaSet"]
    tmpl = apps.read_namespaced_replica_set(owner.name, namespace).spec.template.metadata
    assert pod.metadata.annotations[SOURCES] == tmpl.annotations[SOURCES]
    skipped = configpin.metric("configpin_admissions_total", kind="Pod", result="skipped")
    if server_minor(api) >= 28:
        # the chart's matchConditions: the API server does not even ask about an owned pod
        assert skipped == before
    else:
        assert skipped > before, "configpin was asked and left the owned pod alone"


def test_server_side_dry_run_gives_the_same_result_and_writes_nothing(
    api: client.ApiClient, namespace: str
) -> None:
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    core.create_namespaced_config_map(namespace, configmap("app-config", {"a": "1"}))
    core.create_namespaced_secret(namespace, secret("app-secret", {"token": "t0"}))
    dry = apps.create_namespaced_deployment(namespace, _web(_pod_spec()), dry_run="All")
    assert apps.list_namespaced_deployment(namespace).items == []
    real = apps.create_namespaced_deployment(namespace, _web(_pod_spec()))
    assert dry.spec.template.metadata.annotations == real.spec.template.metadata.annotations


def test_missing_required_source_warns_the_client(api: client.ApiClient, namespace: str) -> None:
    apps = client.AppsV1Api(api)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        _, _, headers = apps.create_namespaced_deployment_with_http_info(
            namespace, _web(_pod_spec(cm="nope", sec="nope2"))
        )
    text = (
        " ".join(headers.get_all("Warning") or []) if hasattr(headers, "get_all") else str(headers)
    )
    text += " ".join(str(w.message) for w in seen)
    assert "configmap/nope not found" in text
    assert "secret/nope2 not found" in text


def test_configmap_created_in_the_same_apply_is_read_through(
    api: client.ApiClient, namespace: str
) -> None:
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    # Back to back, as `kubectl apply -f dir/` does: the watch may not have delivered it yet.
    core.create_namespaced_config_map(namespace, configmap("app-config", {"a": "1"}))
    core.create_namespaced_secret(namespace, secret("app-secret", {"token": "t0"}))
    dep = apps.create_namespaced_deployment(namespace, _web(_pod_spec()))
    assert set(_sources(dep.spec.template.metadata)) == {
        "configmap/app-config",
        "secret/app-secret",
    }


def test_creates_succeed_with_configpin_stopped(
    control_plane: ControlPlane, k8s: client.ApiClient, namespace: str, tmp_path: Any
) -> None:
    from harness.configpin import INSTANCE_LABEL, start_configpin

    core, apps = client.CoreV1Api(k8s), client.AppsV1Api(k8s)
    core.patch_namespace(namespace, {"metadata": {"labels": {INSTANCE_LABEL: "stopped"}}})
    cp = start_configpin(
        control_plane, tmp_path, instance="stopped", webhook_name="configpin-stopped"
    )
    try:
        cp.stop()
        dep = apps.create_namespaced_deployment(namespace, _web(_pod_spec()))
        assert dep.metadata.name == "web"
        assert CHECKSUM not in (dep.spec.template.metadata.annotations or {})
    finally:
        from harness.controlplane import unregister_webhook

        unregister_webhook(k8s, "configpin-stopped")
