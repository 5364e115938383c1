"""Smoke tests: the control plane behaves like a cluster without nodes."""

from __future__ import annotations

import socket
from typing import Any

import pytest
from kubernetes import client, config

from harness.controlplane import (
    ENABLED_LABEL,
    ControlPlane,
    new_ca,
    register_webhook,
    unregister_webhook,
    wait_for,
)
from harness.manifests import container, deployment, pod_spec


def _items(object_list: Any) -> list[dict[str, Any]]:
    """The items of a typed list response, as wire-format (camelCase) dicts."""
    items: list[dict[str, Any]] = object_list.to_dict(serialize=True)["items"]
    return items


def test_deployment_rolls_out_and_is_garbage_collected(
    k8s: client.ApiClient, namespace: str
) -> None:
    apps, core = client.AppsV1Api(k8s), client.CoreV1Api(k8s)
    body = deployment("web", pod_spec(container()), replicas=1)  # one container, no sources
    apps.create_namespaced_deployment(namespace, client.V1Deployment.model_validate(body))

    replica_sets = wait_for(
        lambda: _items(apps.list_namespaced_replica_set(namespace)),
        what="the Deployment's ReplicaSet",
    )
    assert [rs["metadata"]["ownerReferences"][0]["name"] for rs in replica_sets] == ["web"]

    # No scheduler and no kubelet: the pod is created and stays Pending.
    pods = wait_for(
        lambda: _items(core.list_namespaced_pod(namespace)), what="the ReplicaSet's pod"
    )
    assert [p["status"]["phase"] for p in pods] == ["Pending"]
    assert pods[0]["metadata"]["ownerReferences"][0]["name"] == replica_sets[0]["metadata"]["name"]

    apps.delete_namespaced_deployment("web", namespace, propagation_policy="Background")
    wait_for(
        lambda: not _items(apps.list_namespaced_replica_set(namespace)),
        what="the garbage collector to delete the ReplicaSet",
    )


def test_namespace_fixtures_label_opt_in(
    k8s: client.ApiClient, namespace: str, plain_namespace: str
) -> None:
    core = client.CoreV1Api(k8s)
    opted_in = core.read_namespace(namespace).to_dict(serialize=True)["metadata"]["labels"]
    plain = core.read_namespace(plain_namespace).to_dict(serialize=True)["metadata"]["labels"]
    assert opted_in[ENABLED_LABEL] == "true"
    assert ENABLED_LABEL not in (plain or {})


def test_kubeconfig_file_reaches_the_apiserver(control_plane: ControlPlane) -> None:
    # new_client_from_config builds its own Configuration: the global default stays untouched.
    kubeconfig = str(control_plane.kubeconfig)
    with config.new_client_from_config(config_file=kubeconfig) as api:  # type: ignore[no-untyped-call]
        version = client.VersionApi(api).get_code()
    assert (version.git_version or "").startswith("v1.")


def test_tls_is_verified_against_the_apiserver_ca(control_plane: ControlPlane) -> None:
    cfg = control_plane.configuration()
    cfg.ssl_ca_cert = None  # the system trust store does not know our CA
    cfg.retries = 0
    with client.ApiClient(cfg) as api, pytest.raises(Exception, match="CERTIFICATE_VERIFY_FAILED"):
        client.VersionApi(api).get_code()


def test_register_and_unregister_webhook(k8s: client.ApiClient) -> None:
    admission = client.AdmissionregistrationV1Api(k8s)
    ca_pem = new_ca().cert_pem
    register_webhook(k8s, "smoke", "https://127.0.0.1:1", ca_pem)
    register_webhook(k8s, "smoke", "https://127.0.0.1:2", ca_pem, failure_policy="Fail")
    try:
        stored = admission.read_mutating_webhook_configuration("smoke").to_dict(serialize=True)
        webhook, sources = stored["webhooks"]
        assert sources["name"] == "sources.configpin.io"
        assert sources["failurePolicy"] == "Ignore"  # whatever the workloads' policy
        assert sources["clientConfig"]["url"] == "https://127.0.0.1:2/sources"  # the chart's path
        assert webhook["clientConfig"]["url"] == "https://127.0.0.1:2/mutate"
        assert webhook["failurePolicy"] == "Fail"
        assert webhook["sideEffects"] == "NoneOnDryRun"
        assert webhook["reinvocationPolicy"] == "IfNeeded"
        assert webhook["namespaceSelector"]["matchLabels"] == {ENABLED_LABEL: "true"}
        assert {r for rule in webhook["rules"] for r in rule["resources"]} == {
            "pods",
            "replicationcontrollers",
            "deployments",
            "statefulsets",
            "daemonsets",
            "replicasets",
            "jobs",
            "cronjobs",
            "rollouts",  # Argo Rollouts: the chart's argoRollouts is on by default
        }
    finally:
        unregister_webhook(k8s, "smoke")
    unregister_webhook(k8s, "smoke")  # absent is fine
    names = [c["metadata"]["name"] for c in _items(admission.list_mutating_webhook_configuration())]
    assert "smoke" not in names


def test_a_configpin_whose_port_is_taken_before_it_binds_starts_on_another(
    control_plane: ControlPlane,
    k8s: client.ApiClient,
    tmp_path: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`make test` runs the integration suites side by side (hack/run-tests.py): a port free
    a moment ago may be taken by another suite's process before configpin binds it. The
    harness starts it again on another port instead of failing the test."""
    import harness.configpin as harness_configpin

    harness_configpin.ensure_namespace(k8s)
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    first = taken.getsockname()[1]
    ports = iter([first])
    free_port = harness_configpin.free_port
    monkeypatch.setattr(harness_configpin, "free_port", lambda: next(ports, None) or free_port())
    try:
        cp = harness_configpin.start_configpin(control_plane, tmp_path, instance="port-taken")
        try:
            assert cp.port != first
            assert cp.alive()
            assert cp.get("/readyz")[0] == 200
            refused = (tmp_path / f"configpin-{first}.log").read_text()
            assert "address already in use" in refused
        finally:
            cp.stop()
    finally:
        taken.close()
