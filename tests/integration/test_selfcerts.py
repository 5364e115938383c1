"""Self-managed certificates against a real API server: Secret, caBundle, renewal, HA."""

from __future__ import annotations

import base64
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509
from kubernetes import client

from harness.configpin import (
    CONFIGPIN_NAMESPACE,
    INSTANCE_LABEL,
    ensure_namespace,
    start_configpin,
)
from harness.controlplane import ControlPlane, register_webhook, unregister_webhook
from webhook.kube.raw import Kube, path
from webhook.kube.selfcerts import SelfManagedCerts
from webhook.tls.certgen import generate


@pytest.fixture(autouse=True)
def _configpin_namespace(k8s: client.ApiClient) -> None:
    ensure_namespace(k8s)


def _bundle(kube: Kube, name: str) -> bytes:
    hook = kube.get(path("mutatingwebhookconfigurations", name=name))["webhooks"][0]
    return base64.b64decode(hook["clientConfig"].get("caBundle", ""))


def _secret_cert(kube: Kube, name: str) -> x509.Certificate:
    data = kube.get(path("secrets", CONFIGPIN_NAMESPACE, name))["data"]
    return x509.load_pem_x509_certificate(base64.b64decode(data["tls.crt"]))


def _manager(
    kube: Kube, tmp: Path, secret: str, hook: str | None, **kw: object
) -> SelfManagedCerts:
    return SelfManagedCerts(
        kube,
        namespace=CONFIGPIN_NAMESPACE,
        secret=secret,
        service="configpin",
        webhook_config=hook,
        out_dir=tmp,
        bundle_settle=0.1,
        **kw,  # type: ignore[arg-type]
    )


def test_first_start_creates_the_secret_files_and_bundle(kube: Kube, tmp_path: Path) -> None:
    hook = "selfcerts-first"
    register_webhook(kube.api, hook, "https://127.0.0.1:1", generate("x", "y").ca_cert_pem)
    try:
        m = _manager(kube, tmp_path, "tls-first", hook).reconcile()
        assert _bundle(kube, hook) == m.ca_pem
        assert (tmp_path / "tls.crt").read_bytes() == m.cert_pem
        assert oct((tmp_path / "tls.key").stat().st_mode & 0o777) == "0o600"
        cert = _secret_cert(kube, "tls-first")
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert "configpin.configpin-system.svc" in sans.get_values_for_type(x509.DNSName)
        # A second pass (a restart, or the hourly check) changes nothing.
        rv = kube.get(path("secrets", CONFIGPIN_NAMESPACE, "tls-first"))["metadata"][
            "resourceVersion"
        ]
        _manager(kube, tmp_path, "tls-first", hook).reconcile()
        assert (
            kube.get(path("secrets", CONFIGPIN_NAMESPACE, "tls-first"))["metadata"][
                "resourceVersion"
            ]
            == rv
        )
    finally:
        unregister_webhook(kube.api, hook)


def test_a_certificate_close_to_expiry_is_renewed_with_the_same_ca(
    kube: Kube, tmp_path: Path
) -> None:
    short = _manager(
        kube, tmp_path, "tls-renew", None, validity_days=1, renew_before=timedelta(hours=1)
    )
    first = short.reconcile()
    renewing = _manager(kube, tmp_path, "tls-renew", None)  # renews within 30 days: now
    second = renewing.reconcile()
    assert second.cert_pem != first.cert_pem
    assert second.ca_pem == first.ca_pem  # the bundle the API server trusts stays valid throughout
    assert _secret_cert(kube, "tls-renew").not_valid_after_utc > datetime.now(UTC) + timedelta(
        days=300
    )


def test_concurrent_replicas_converge_on_one_certificate(kube: Kube, tmp_path: Path) -> None:
    results: list[bytes] = []
    barrier = threading.Barrier(4)

    def start(i: int) -> None:
        barrier.wait()
        results.append(_manager(kube, tmp_path / str(i), "tls-race", None).reconcile().cert_pem)

    threads = [threading.Thread(target=start, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 4 and len(set(results)) == 1


def test_configpin_fixes_the_bundle_and_the_api_server_trusts_it(
    control_plane: ControlPlane, k8s: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    hook = "configpin-selfsigned"
    kube = Kube(k8s)
    ensure_namespace(k8s)
    core, apps = client.CoreV1Api(k8s), client.AppsV1Api(k8s)
    core.patch_namespace(namespace, {"metadata": {"labels": {INSTANCE_LABEL: "selfsigned"}}})
    core.create_namespaced_config_map(
        namespace, {"metadata": {"name": "app-config"}, "data": {"a": "1"}}
    )
    # Registered with a CA that signed nothing configpin serves, and failurePolicy Fail: an
    # untrusted certificate would fail the create below instead of letting it pass unmutated.
    register_webhook(
        k8s,
        hook,
        "https://127.0.0.1:1",
        generate("x", "y").ca_cert_pem,
        failure_policy="Fail",
        namespace_selector={"matchLabels": {INSTANCE_LABEL: "selfsigned"}},
    )
    cp = start_configpin(
        control_plane,
        tmp_path,
        instance="selfsigned",
        verify=False,
        args=["--self-signed-certs", "--cert-secret", "tls-e2e", "--webhook-config-name", hook],
    )
    try:
        secret = kube.get(path("secrets", CONFIGPIN_NAMESPACE, "tls-e2e"))
        assert _bundle(kube, hook) == base64.b64decode(secret["data"]["ca.crt"])
        kube.patch(
            path("mutatingwebhookconfigurations", name=hook),
            [
                {
                    "op": "replace",
                    "path": "/webhooks/0/clientConfig/url",
                    "value": cp.url + "/mutate",
                }
            ],
        )
        container = {
            "name": "c",
            "image": "x",
            "envFrom": [{"configMapRef": {"name": "app-config"}}],
        }
        template = {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [container]}}
        body = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "web"},
            "spec": {
                "replicas": 0,
                "selector": {"matchLabels": {"app": "web"}},
                "template": template,
            },
        }
        dep = None
        for _ in range(50):  # the API server picks the new URL up through an informer
            try:
                dep = apps.create_namespaced_deployment(namespace, body)
                break
            except client.ApiException as e:
                assert "127.0.0.1:1" in str(e.body), e.body  # only the old URL may fail
                time.sleep(0.1)
        assert dep is not None
        assert "configpin.io/checksum" in dep.spec.template.metadata.annotations
    finally:
        cp.stop()
        unregister_webhook(k8s, hook)
