"""The production path: charts/configpin installed by `helm install` with only the image values
changed, running in pods on the node as in a user's cluster, and nothing else set up beside it."""

from __future__ import annotations

import base64
import time
from collections.abc import Callable

from cryptography import x509
from kubernetes import client

from harness import images
from harness.apps import reader_workload, wait_deployment, wait_seen, workload_pods
from harness.controlplane import wait_for
from harness.release import Release
from webhook.core.constants import ANN_CHECKSUM, ANN_SOURCES


def test_both_replicas_run_the_built_image_and_one_leads(
    k8s: client.ApiClient, configpin: Release
) -> None:
    pods = configpin.wait_ready(k8s)
    assert {c.image for p in pods for c in p.spec.containers} == {images.CONFIGPIN.ref}
    assert all(s.restart_count == 0 for p in pods for s in p.status.container_statuses)
    leader = wait_for(lambda: configpin.leader(k8s), timeout=60, what="a leader")

    # /metrics answers on both replicas, and only the one holding the Lease says it leads
    def leading() -> dict[str, float] | None:
        names = [p.metadata.name for p in pods]
        found = {name: configpin.metric(k8s, name, "configpin_leader") for name in names}
        return found if sorted(found.values()) == [0.0, 1.0] else None

    found = wait_for(leading, timeout=30, what="configpin_leader 1 on one replica, 0 on the other")
    assert found[leader] == 1.0


def test_configpin_made_its_certificate_and_patched_the_ca_bundle(
    k8s: client.ApiClient, configpin: Release
) -> None:
    configpin.wait_ready(k8s)
    core = client.CoreV1Api(k8s)
    secret = core.read_namespaced_secret(f"{configpin.name}-tls", configpin.namespace)
    ca_pem = base64.b64decode(secret.data["ca.crt"])
    serving = x509.load_pem_x509_certificate(base64.b64decode(secret.data["tls.crt"]))
    names = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert f"{configpin.name}.{configpin.namespace}.svc" in names.get_values_for_type(x509.DNSName)

    hooks = client.AdmissionregistrationV1Api(k8s)
    webhooks = hooks.read_mutating_webhook_configuration(configpin.name).webhooks
    # workloads, and source writes (the preview); each calls the chart's Service, not a URL,
    # and its caBundle (left out of the chart) is configpin's CA
    assert [h.name for h in webhooks] == ["mutate.configpin.io", "sources.configpin.io"]
    for hook in webhooks:
        assert hook.client_config.url is None
        assert hook.client_config.service.name == configpin.name
        assert hook.client_config.service.namespace == configpin.namespace
        assert base64.b64decode(hook.client_config.ca_bundle) == ca_pem


def test_the_api_server_calls_the_webhook_through_the_service(
    k8s: client.ApiClient, configpin: Release, namespace: str, report: Callable[[str], None]
) -> None:
    pods = [p.metadata.name for p in configpin.wait_ready(k8s)]
    core, apps = client.CoreV1Api(k8s), client.AppsV1Api(k8s)
    core.create_namespaced_config_map(
        namespace, {"metadata": {"name": "settings"}, "data": {"greeting": "admitted"}}
    )
    app = reader_workload(
        "Deployment", "app", images.SHELL.ref, configmap="settings", files=["greeting"], replicas=1
    )

    # `helm install --wait` returns once the pods are Ready; the Service reaches them once
    # kube-proxy has their endpoints, a moment later (until then failurePolicy Ignore admits
    # workloads unpinned, for the controller to stamp).
    configpin.wait_answering(k8s, namespace)
    after = time.monotonic() - configpin.returned_at
    report(f"webhook: answering through the Service {after:.1f}s after helm install returned")

    def admissions() -> float:
        return sum(configpin.metric(k8s, p, "configpin_admissions_total") for p in pods)

    before = admissions()
    created = apps.create_namespaced_deployment(namespace, app)
    annotations = created.spec.template.metadata.annotations or {}
    assert {ANN_CHECKSUM, ANN_SOURCES} <= annotations.keys(), annotations
    assert "configmap/settings" in annotations[ANN_SOURCES]
    assert admissions() > before
    # and the application runs, pinned, reading its config
    wait_deployment(k8s, namespace, "app")
    [pod] = workload_pods(k8s, namespace, "app")
    assert pod.metadata.annotations[ANN_SOURCES] == annotations[ANN_SOURCES]
    wait_seen(k8s, namespace, pod.metadata.name, {"file:/config/greeting": "admitted"})
