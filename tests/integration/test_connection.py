"""configpin's own cluster connection against the real API server: as in a pod (the
service-account folder, a bound token that rotates), with a client certificate, and
`configpin serve` running in-cluster style end to end."""

from __future__ import annotations

import base64
import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from harness.configpin import (
    CONFIGPIN_NAMESPACE,
    ensure_namespace,
    running_configpin,
)
from harness.controlplane import (
    ControlPlane,
    KeyPair,
    issue_client_cert,
    kubeconfig_text,
    wait_for,
)
from webhook.kube import client as kube_client
from webhook.kube.client import connect
from webhook.kube.errors import Forbidden, KubeError
from webhook.kube.raw import Kube, path


@pytest.fixture
def admin(k8s: client.ApiClient) -> Kube:
    return Kube(k8s)


def _bound_token(admin: Kube, namespace: str, sa: str, secret: str) -> str:
    """A service-account token bound to Secret `secret`: invalid once the Secret is gone,
    as a projected token is once its pod is."""
    uid = admin.get(path("secrets", namespace, secret))["metadata"]["uid"]
    answer = admin.create(
        path("serviceaccounts", namespace, sa) + "/token",
        {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "expirationSeconds": 3600,
                "boundObjectRef": {
                    "kind": "Secret",
                    "apiVersion": "v1",
                    "name": secret,
                    "uid": uid,
                },
            },
        },
    )
    return str(answer["status"]["token"])


@pytest.fixture
def reader(admin: Kube, plain_namespace: str) -> str:
    """ServiceAccount `reader` of `plain_namespace`, allowed to read its ConfigMaps, and a
    ConfigMap `hello` to read; Secrets `a` and `b` to bind tokens to."""
    ns = plain_namespace
    admin.create(path("serviceaccounts", ns), {"metadata": {"name": "reader"}})
    admin.create(
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
        {
            "metadata": {"name": "read"},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}],
        },
    )
    admin.create(
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
        {
            "metadata": {"name": "read"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "read"},
            "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": ns}],
        },
    )
    admin.create(path("configmaps", ns), {"metadata": {"name": "hello"}, "data": {"k": "v"}})
    for name in ("a", "b"):
        admin.create(path("secrets", ns), {"metadata": {"name": name}})
    return ns


def _service_account_folder(folder: Path, plane: ControlPlane, token: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "ca.crt").write_bytes(plane.ca_pem)
    _replace(folder / "token", token)
    return folder


def _replace(target: Path, text: str) -> None:
    """As the kubelet does: write beside, then rename over."""
    tmp = target.with_name(f".{target.name}.{secrets.token_hex(4)}")
    tmp.write_text(text)
    os.replace(tmp, target)


@pytest.fixture
def in_a_pod(control_plane: ControlPlane, monkeypatch: pytest.MonkeyPatch) -> None:
    host, _, port = control_plane.host.removeprefix("https://").rpartition(":")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", host)
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", port)
    monkeypatch.delenv("KUBECONFIG", raising=False)


def _status(kube: Kube, namespace: str) -> int:
    try:
        kube.get(path("configmaps", namespace, "hello"))
    except KubeError as e:
        return e.status or 0
    return 200


@pytest.mark.usefixtures("in_a_pod")
def test_in_a_pod_a_rotated_token_is_picked_up(
    control_plane: ControlPlane,
    admin: Kube,
    reader: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    folder = _service_account_folder(
        tmp_path / "sa", control_plane, _bound_token(admin, reader, "reader", "a")
    )
    monkeypatch.setenv(kube_client.SERVICE_ACCOUNT_DIR_ENV, str(folder))
    stale = connect()  # reads the token once, for an hour
    monkeypatch.setattr(kube_client, "TOKEN_REFRESH_SECONDS", 1.0)
    fresh = connect()  # reads it again after a second, as configpin does after a minute
    assert stale is not None and fresh is not None
    with stale, fresh:
        assert fresh.host == control_plane.host
        for conn in (stale, fresh):
            hello = Kube(conn).get(path("configmaps", reader, "hello"))
            assert hello["data"] == {"k": "v"}
        # The reader may read ConfigMaps and nothing else: the API server knows who it is.
        with pytest.raises(Forbidden, match=f"system:serviceaccount:{reader}:reader"):
            Kube(fresh).get(path("secrets", reader, "a"))

        # The kubelet writes a new token; the old one's bound object goes away.
        _replace(folder / "token", _bound_token(admin, reader, "reader", "b"))
        admin.delete(path("secrets", reader, "a"))
        wait_for(lambda: _status(Kube(stale), reader) == 401, timeout=30, what="old token refused")
        wait_for(lambda: _status(Kube(fresh), reader) == 200, timeout=10, what="new token used")


def test_client_certificate_kubeconfig(
    control_plane: ControlPlane, admin: Kube, reader: str, tmp_path: Path
) -> None:
    """A kubeconfig with a client certificate and key (inline data, then files): the API
    server authenticates the user from the certificate."""
    ca = KeyPair(control_plane.ca_pem, (control_plane.ca_file.parent / "ca.key").read_bytes())
    user = f"cert-user-{secrets.token_hex(3)}"
    pair = issue_client_cert(ca, user)
    (tmp_path / "me.crt").write_bytes(pair.cert_pem)
    (tmp_path / "me.key").write_bytes(pair.key_pem)
    admin.create(
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{reader}/rolebindings",
        {
            "metadata": {"name": "cert-user"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "read"},
            "subjects": [{"kind": "User", "name": user, "apiGroup": "rbac.authorization.k8s.io"}],
        },
    )
    users = {
        "inline": {
            "client-certificate-data": base64.b64encode(pair.cert_pem).decode(),
            "client-key-data": base64.b64encode(pair.key_pem).decode(),
        },
        "files": {"client-certificate": "me.crt", "client-key": "me.key"},
    }
    for form, entry in users.items():
        kubeconfig = tmp_path / f"{form}.kubeconfig"
        kubeconfig.write_text(kubeconfig_text(control_plane.host, control_plane.ca_pem, entry))
        conn = connect(kubeconfig)
        assert conn is not None
        with conn:
            assert Kube(conn).get(path("configmaps", reader, "hello"))["data"] == {"k": "v"}, form
            with pytest.raises(Forbidden, match=f'"{user}"'):
                Kube(conn).get(path("secrets", reader, "a"))


@contextlib.contextmanager
def _cluster_admin(admin: Kube, namespace: str, sa: str) -> Iterator[None]:
    name = f"connection-test-{namespace}"
    admin.create(
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        {
            "metadata": {"name": name},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "cluster-admin",
            },
            "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": namespace}],
        },
    )
    try:
        yield
    finally:
        admin.delete(f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{name}")


def test_serve_connects_as_in_a_pod(
    control_plane: ControlPlane, k8s: client.ApiClient, admin: Kube, reader: str, tmp_path: Path
) -> None:
    """`configpin serve` without a kubeconfig, from KUBERNETES_SERVICE_HOST/PORT and a
    service-account folder: it lists and watches, leads and becomes ready. (RBAC is the
    least-privilege test's subject: here the account may do anything.)"""
    ensure_namespace(k8s)
    token = _bound_token(admin, reader, "reader", "b")
    folder = _service_account_folder(tmp_path / "sa", control_plane, token)
    instance = f"conn{secrets.token_hex(3)}"
    with (
        _cluster_admin(admin, reader, "reader"),
        running_configpin(
            control_plane, tmp_path / "cp", instance=instance, service_account_dir=folder
        ) as cp,
    ):
        wait_for(lambda: cp.metric("configpin_leader") == 1, what="configpin leading")
        wait_for(lambda: cp.metric("configpin_controller_up") == 1, what="controller up")
        assert f"reading sources from the cluster at {control_plane.host}" in cp.log()
        assert "official Kubernetes client" not in cp.log()
        lease = admin.get(
            f"/apis/coordination.k8s.io/v1/namespaces/{CONFIGPIN_NAMESPACE}/leases/"
            f"configpin-leader-{instance}"
        )
        assert lease["spec"]["holderIdentity"]
