"""Trust: configpin gives nobody a power they do not already have (issue 12).

Reviews are sent the way any pod that reaches configpin's Service could send them: a raw
HTTPS POST to /mutate, claiming whatever it likes. Everything else goes through the real API
server with the webhook registered as the chart registers it.
"""

from __future__ import annotations

import base64
import datetime
import json
import secrets
import ssl
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from kubernetes import client

from harness.configpin import (
    CONFIGPIN_NAMESPACE,
    Configpin,
    ensure_namespace,
    start_configpin,
)
from harness.controlplane import (
    ENABLED_LABEL,
    ControlPlane,
    KeyPair,
    default_service_account_ready,
    new_ca,
    wait_for,
)
from harness.manifests import (
    container,
    deployment,
    env_from,
    env_key_ref,
    pod_spec,
    secret,
)
from webhook.core.model import SourceId, SourceKind
from webhook.inputs.sources import Miss
from webhook.kube.cache import SourceCache
from webhook.kube.raw import Kube, path
from webhook.process.metrics import Metrics

SOURCES = "configpin.io/sources"
HKEY = b"trust-test-digest-key-0123456789abcdef"
# The session's configpin serves this module's namespaces.
pytestmark = pytest.mark.usefixtures("configpin")


def post_review(cp: Configpin, request: dict[str, Any]) -> dict[str, Any]:
    """What a pod that reaches the Service can do: POST any AdmissionReview to /mutate."""
    body = json.dumps(
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
    ).encode()
    req = urllib.request.Request(
        cp.url + "/mutate", data=body, headers={"Content-Type": "application/json"}
    )
    ctx = ssl.create_default_context(cafile=str(cp.ca_file))
    with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:
        assert resp.status == 200
        out: dict[str, Any] = json.loads(resp.read())
    return out


def review_of(obj: dict[str, Any], namespace: str, **extra: Any) -> dict[str, Any]:
    return {
        "uid": str(uuid.uuid4()),
        "kind": {"group": "apps", "version": "v1", "kind": "Deployment"},
        "resource": {"group": "apps", "version": "v1", "resource": "deployments"},
        "name": obj["metadata"]["name"],
        "namespace": namespace,
        "operation": "CREATE",
        "userInfo": {"username": "system:serviceaccount:attacker:default"},
        "object": obj,
        "dryRun": False,
        **extra,
    }


def snapshot_deployment(name: str = "probe") -> dict[str, Any]:
    """A Deployment in snapshot mode that reads Secret db-password and a missing Secret."""
    return deployment(
        name,
        pod_spec(
            container(
                env_from=[env_from("secret", "db-password")],
                env=[env_key_ref("secret", "no-such-secret", "k", "K")],
            )
        ),
        annotations={"configpin.io/mode": "snapshot"},
    )


def secrets_in(kube: Kube, namespace: str) -> list[str]:
    return sorted(s["metadata"]["name"] for s in kube.get(path("secrets", namespace))["items"])


def new_namespace(kube: Kube, k8s: client.ApiClient, labels: dict[str, str]) -> str:
    name = f"trust-{secrets.token_hex(4)}"
    kube.create(
        path("namespaces"),
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}},
    )
    wait_for(lambda: default_service_account_ready(k8s, name), what="the default ServiceAccount")
    return name


# --- 1. scope, enforced by the server whatever the request claims


def test_reviews_for_namespaces_out_of_scope_get_nothing(
    kube: Kube, configpin: Configpin, namespace: str, plain_namespace: str
) -> None:
    for ns in (namespace, plain_namespace):
        kube.create(path("secrets", ns), secret("db-password", {"password": "hunter2"}))
    before = secrets_in(kube, plain_namespace)
    counted = configpin.metric("configpin_admissions_out_of_scope_total")

    # In scope (control): a patch, a warning naming the missing Secret, a copy made.
    inside = post_review(configpin, review_of(snapshot_deployment(), namespace))["response"]
    assert inside["allowed"] and "patch" in inside
    assert any("secret/no-such-secret" in w for w in inside["warnings"])

    # A namespace that never opted in; and a request that names an opted-in namespace but
    # carries an object of another one (the API server never sends either).
    contradicting = snapshot_deployment()
    contradicting["metadata"]["namespace"] = plain_namespace
    for request in (
        review_of(snapshot_deployment(), plain_namespace),
        review_of(contradicting, namespace),
        review_of(snapshot_deployment(), ""),
    ):
        out = post_review(configpin, request)
        assert out["response"] == {"uid": request["uid"], "allowed": True}
    assert secrets_in(kube, plain_namespace) == before, "no copy made out of scope"
    assert configpin.metric("configpin_admissions_out_of_scope_total") == counted + 3


def test_excluded_namespaces_are_out_of_scope_even_when_labelled(
    k8s: client.ApiClient, kube: Kube, configpin: Configpin
) -> None:
    """configpin's own namespace (and kube-system) never, whatever its labels say."""
    core = client.CoreV1Api(k8s)
    own = CONFIGPIN_NAMESPACE
    kube.create(path("secrets", own), secret(f"db-password-{secrets.token_hex(3)}", {"p": "x"}))
    core.patch_namespace(own, {"metadata": {"labels": {ENABLED_LABEL: "true"}}})
    try:
        request = review_of(snapshot_deployment(), own)
        request["object"]["metadata"]["namespace"] = own
        out = post_review(configpin, request)
        assert out["response"] == {"uid": request["uid"], "allowed": True}
        request = review_of(snapshot_deployment(), "kube-system")
        assert post_review(configpin, request)["response"] == {
            "uid": request["uid"],
            "allowed": True,
        }
    finally:
        core.patch_namespace(own, {"metadata": {"labels": {ENABLED_LABEL: None}}})


# --- 2. digests bound to their namespace


def test_equal_content_in_two_namespaces_gives_unrelated_digests(
    k8s: client.ApiClient, kube: Kube, configpin: Configpin, namespace: str
) -> None:
    other = new_namespace(kube, k8s, {ENABLED_LABEL: "true"})
    try:
        recorded = []
        for ns in (namespace, other):
            kube.create(path("secrets", ns), secret("db-password", {"password": "guess-me"}))
            spec = pod_spec(container(env_from=[env_from("secret", "db-password")]))
            dep = kube.create(path("deployments", ns), deployment("web", spec))
            recorded.append(json.loads(dep["spec"]["template"]["metadata"]["annotations"][SOURCES]))
        assert recorded[0].keys() == recorded[1].keys() == {"secret/db-password"}
        assert recorded[0] != recorded[1], "equal content, equal digest: an oracle"
    finally:
        kube.delete(path("namespaces", name=other))


# --- 6. bounds


def test_an_object_with_too_many_sources_is_admitted_unpinned(
    kube: Kube, configpin: Configpin, namespace: str
) -> None:
    def with_sources(n: int) -> dict[str, Any]:
        env = [
            {
                "name": f"V{i}",
                "valueFrom": {
                    "configMapKeyRef": {"name": f"cfg-{i}", "key": "k", "optional": True}
                },
            }
            for i in range(n)
        ]
        return pod_spec(container(env=env))

    at_limit = kube.create(path("deployments", namespace), deployment("at", with_sources(100)))
    pinned = json.loads(at_limit["spec"]["template"]["metadata"]["annotations"][SOURCES])
    assert len(pinned) == 100
    over = kube.create(path("deployments", namespace), deployment("over", with_sources(101)))
    assert SOURCES not in (over["spec"]["template"]["metadata"].get("annotations") or {})
    # what the client is told
    out = post_review(configpin, review_of(deployment("over", with_sources(101)), namespace))
    assert "patch" not in out["response"]
    assert any(
        "more than configpin pins per object (100)" in w for w in out["response"]["warnings"]
    )


def test_metric_labels_never_come_from_the_request(configpin: Configpin, namespace: str) -> None:
    odd = "Evil" + secrets.token_hex(8)
    request = review_of(deployment("web"), namespace)
    request["kind"] = {"group": "apps", "version": "v1", "kind": odd}
    request["operation"] = "X" + secrets.token_hex(8)
    post_review(configpin, request)
    _, text = configpin.get("/metrics")
    assert odd not in text and request["operation"] not in text
    assert configpin.metric("configpin_admissions_total", kind="other", operation="other") >= 1


def test_helm_release_secrets_are_not_watched(kube: Kube, namespace: str) -> None:
    """The API server filters them out of the Secret watch: never sent, parsed or kept. A pod
    that names one anyway is answered by a read-through."""
    cache = SourceCache(kube, HKEY, Metrics())
    cache.start()
    try:
        assert cache.wait_synced(30)
        release = secret(
            "sh.helm.release.v1.app.v1",
            {"release": base64.b64encode(b"x" * 200_000).decode()},
            type_="helm.sh/release.v1",
        )
        kube.create(path("secrets", namespace), release)
        kube.create(path("secrets", namespace), secret("after", {"k": "v"}))
        after = SourceId(SourceKind.SECRET, "after")
        wait_for(lambda: not isinstance(cache.peek(namespace, after), Miss), what="the watch")
        helm = SourceId(SourceKind.SECRET, "sh.helm.release.v1.app.v1")
        assert isinstance(cache.peek(namespace, helm), Miss), "a Helm release was cached"
        record = cache.get(namespace, helm)
        assert record is not None and record.secret_type == "helm.sh/release.v1"
    finally:
        cache.stop()


# --- optional authentication of the caller (--client-ca)


def _client_cert(ca: KeyPair, common_name: str) -> KeyPair:
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return KeyPair(
        cert.public_bytes(serialization.Encoding.PEM),
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )


def test_with_a_client_ca_only_callers_with_its_certificates_are_answered(
    control_plane: ControlPlane, tmp_path: Path, namespace: str
) -> None:
    ca = new_ca("apiserver-client-ca")
    (tmp_path / "client-ca.crt").write_bytes(ca.cert_pem)
    good = _client_cert(ca, "kube-apiserver")
    (tmp_path / "good.crt").write_bytes(good.cert_pem)
    (tmp_path / "good.key").write_bytes(good.key_pem)
    stranger = _client_cert(new_ca("someone-else"), "a-pod")
    (tmp_path / "stranger.crt").write_bytes(stranger.cert_pem)
    (tmp_path / "stranger.key").write_bytes(stranger.key_pem)

    with control_plane.api_client() as api:
        ensure_namespace(api)
    cp = start_configpin(
        control_plane,
        tmp_path / "cp",
        args=["--client-ca", str(tmp_path / "client-ca.crt"), "--no-controller"],
        client_cert=(tmp_path / "good.crt", tmp_path / "good.key"),
    )
    try:
        request = review_of(deployment("web"), namespace)
        body = json.dumps(
            {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
        ).encode()

        def post(cert: tuple[Path, Path] | None) -> int:
            ctx = ssl.create_default_context(cafile=str(cp.ca_file))
            if cert is not None:
                ctx.load_cert_chain(*cert)
            req = urllib.request.Request(
                cp.url + "/mutate", data=body, headers={"Content-Type": "application/json"}
            )
            with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:
                return int(resp.status)

        assert post((tmp_path / "good.crt", tmp_path / "good.key")) == 200
        for cert in (None, (tmp_path / "stranger.crt", tmp_path / "stranger.key")):
            with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
                post(cert)
    finally:
        cp.stop()


def test_a_namespace_the_watch_has_not_shown_yet_is_confirmed_by_the_api_server(
    kube: Kube, namespace: str, plain_namespace: str
) -> None:
    """A namespace labelled a moment ago may reach admission before its watch event: the
    selector is then evaluated by the API server (one read, kept a few seconds)."""
    from webhook.kube.namespaces import NamespaceSet

    selection = NamespaceSet(
        kube,
        Metrics(),
        label_selector=f"{ENABLED_LABEL}=true",
        excluded=("kube-system", CONFIGPIN_NAMESPACE),
    )  # never started: its watch has shown nothing
    assert namespace not in selection
    assert selection.confirm(namespace, timeout=5.0)
    assert not selection.confirm(plain_namespace, timeout=5.0)
    assert not selection.confirm("no-such-namespace", timeout=5.0)
    assert not selection.confirm("kube-system", timeout=5.0)
    calls = kube.calls
    assert selection.confirm(plain_namespace, timeout=5.0) is False
    assert kube.calls == calls, "the answer is kept"
