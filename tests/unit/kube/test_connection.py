"""configpin's own cluster connection (`webhook.kube.client`): the same pool and credentials as
the official client's loaders for the same kubeconfig or service-account folder, real TLS
(server verification, client certificates, tls-server-name) against a local HTTPS server,
token rotation, and the cases handed to the official loader."""

from __future__ import annotations

import base64
import contextlib
import logging
import os
import ssl
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import urllib3
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from harness.local_http import JSONHandler
from webhook.kube import client
from webhook.kube.client import ConfigError, Connection, TokenFile, connect
from webhook.kube.errors import KubeError
from webhook.kube.raw import Kube
from webhook.tls import certgen, certs

PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")


@pytest.fixture(autouse=True)
def _no_proxy_no_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    for name in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT", "KUBECONFIG"):
        monkeypatch.delenv(name, raising=False)


# ---- certificates: a server CA and a client CA ---------------------------------------------


def client_cert(ca: certs.CertBundle, name: str) -> tuple[bytes, bytes]:
    """A client certificate (clientAuth) for `name`, signed by `ca`: (cert PEM, key PEM)."""
    ca_cert = x509.load_pem_x509_certificate(ca.ca_cert_pem)
    ca_key = serialization.load_pem_private_key(ca.ca_key_pem, password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return (
        cert.public_bytes(serialization.Encoding.PEM),
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )


@pytest.fixture(scope="module")
def server_bundle() -> certs.CertBundle:
    # Names hook.ns.svc (and localhost), not 127.0.0.1: tls-server-name is needed by address.
    return certgen.generate("hook", "ns", extra_ips=())


@pytest.fixture(scope="module")
def client_ca() -> certs.CertBundle:
    return certgen.generate("clients", "ns")


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# ---- a local HTTPS "API server" that says who called -----------------------------------------


class _Handler(JSONHandler):
    def do_GET(self) -> None:
        assert isinstance(self.connection, ssl.SSLSocket)
        peer = self.connection.getpeercert() or {}
        subject = dict(x[0] for x in peer.get("subject", ()))
        self.answer_json(
            {
                "path": self.path,
                "authorization": self.headers.get("Authorization"),
                "client": subject.get("commonName"),
            }
        )


@pytest.fixture(scope="module")
def https_server(
    tmp_path_factory: pytest.TempPathFactory,
    server_bundle: certs.CertBundle,
    client_ca: certs.CertBundle,
) -> Iterator[str]:
    """https://127.0.0.1:PORT serving `server_bundle`; a client certificate signed by
    `client_ca` is asked for (optional, as kube-apiserver: tokens work without one)."""
    d = tmp_path_factory.mktemp("server")
    certs.write_bundle(server_bundle, d)
    (d / "clients.crt").write_bytes(client_ca.ca_cert_pem)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(d / "tls.crt", d / "tls.key")
    ctx.load_verify_locations(d / "clients.crt")
    ctx.verify_mode = ssl.CERT_OPTIONAL
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


# ---- kubeconfigs ----------------------------------------------------------------------------


def write_kubeconfig(
    path: Path,
    cluster: dict[str, Any],
    user: dict[str, Any] | None = None,
    *,
    extra: dict[str, Any] | None = None,
) -> Path:
    doc: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": cluster}],
        "contexts": [
            {
                "name": "ctx",
                "context": {"cluster": "c", **({"user": "u"} if user is not None else {})},
            }
        ],
        "users": [{"name": "u", "user": user}] if user is not None else [],
        "current-context": "ctx",
        **(extra or {}),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc))
    return path


def official(kubeconfig: Path) -> k8s.ApiClient:
    cfg = k8s.Configuration()
    k8s_config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
    return k8s.ApiClient(cfg)


def _content(value: object) -> object:
    """A file name as its content: inline data lands in files whose names differ."""
    if isinstance(value, str) and os.path.isfile(value):
        return Path(value).read_bytes()
    return value


def pool_settings(pool: urllib3.PoolManager) -> dict[str, object]:
    kw = dict(pool.connection_pool_kw)
    kw.pop("maxsize", None)
    return {k: _content(v) for k, v in kw.items()}


def auth(headers: dict[str, str]) -> str | None:
    value = headers.get("authorization")
    if value is None:
        return None
    scheme, _, rest = value.partition(" ")
    return f"{scheme.lower()} {rest}"  # the in-cluster loader writes "bearer"


def official_headers(api: k8s.ApiClient) -> dict[str, str]:
    return dict(Connection.of_api_client(api).headers())


def _files(tmp_path: Path, server_bundle: certs.CertBundle, client_ca: certs.CertBundle) -> None:
    (tmp_path / "pki").mkdir(exist_ok=True)
    (tmp_path / "pki" / "ca.crt").write_bytes(server_bundle.ca_cert_pem)
    cert, key = client_cert(client_ca, "file-user")
    (tmp_path / "pki" / "me.crt").write_bytes(cert)
    (tmp_path / "pki" / "me.key").write_bytes(key)
    (tmp_path / "pki" / "token").write_text("file-token")


KUBECONFIGS: dict[str, tuple[dict[str, Any], dict[str, Any] | None]] = {
    "token and inline CA": ({"certificate-authority-data": "CA"}, {"token": "t0k3n"}),
    "token and a CA file, relative": (
        {"certificate-authority": "pki/ca.crt"},
        {"token": "t0k3n"},
    ),
    "tokenFile, relative": ({"certificate-authority": "pki/ca.crt"}, {"tokenFile": "pki/token"}),
    "token over tokenFile": (
        {"certificate-authority-data": "CA"},
        {"token": "inline", "tokenFile": "pki/token"},
    ),
    "inline client certificate": (
        {"certificate-authority-data": "CA"},
        {"client-certificate-data": "CERT", "client-key-data": "KEY"},
    ),
    "client certificate files": (
        {"certificate-authority": "pki/ca.crt"},
        {"client-certificate": "pki/me.crt", "client-key": "pki/me.key"},
    ),
    "insecure, no CA": ({"insecure-skip-tls-verify": True}, {"token": "t"}),
    "insecure false": ({"insecure-skip-tls-verify": False, "certificate-authority-data": "CA"}, {}),
    "tls-server-name": (
        {"certificate-authority-data": "CA", "tls-server-name": "hook.ns.svc"},
        {"token": "t"},
    ),
    "basic auth": ({"certificate-authority-data": "CA"}, {"username": "u", "password": "p:w"}),
    "no user": ({"certificate-authority-data": "CA"}, None),
    "plain http": ({}, {"token": "t", "client-certificate": "pki/me.crt"}),
}


def _fill(value: Any, server_bundle: certs.CertBundle, pair: tuple[bytes, bytes]) -> Any:
    return {"CA": b64(server_bundle.ca_cert_pem), "CERT": b64(pair[0]), "KEY": b64(pair[1])}.get(
        value, value
    )


@pytest.mark.parametrize("case", list(KUBECONFIGS))
def test_kubeconfig_gives_the_official_clients_pool_and_credentials(
    case: str,
    tmp_path: Path,
    server_bundle: certs.CertBundle,
    client_ca: certs.CertBundle,
) -> None:
    _files(tmp_path, server_bundle, client_ca)
    pair = client_cert(client_ca, "inline-user")
    cluster, user = KUBECONFIGS[case]
    server = "http://127.0.0.1:1" if case == "plain http" else "https://127.0.0.1:1"
    cluster = {"server": server, **{k: _fill(v, server_bundle, pair) for k, v in cluster.items()}}
    if user is not None:
        user = {k: _fill(v, server_bundle, pair) for k, v in user.items()}
    path = write_kubeconfig(tmp_path / "kube" / "config", cluster, user)
    if "relative" in case or "File" in case or "files" in case:  # relative to its folder
        path = write_kubeconfig(tmp_path / "config", cluster, user)

    theirs = official(path)
    with contextlib.closing(theirs), connect(path) as ours:
        assert ours is not None
        assert type(ours.pool) is urllib3.PoolManager
        assert pool_settings(ours.pool) == pool_settings(theirs.rest_client.pool_manager)
        their_maxsize = theirs.configuration.connection_pool_maxsize
        assert ours.pool.connection_pool_kw["maxsize"] >= their_maxsize
        assert auth(dict(ours.headers())) == auth(official_headers(theirs))
        assert ours.host == theirs.configuration.host


@pytest.mark.parametrize("host", ["10.96.0.1", "fd00::1"])
def test_in_cluster_gives_the_official_clients_pool_and_credentials(
    host: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, server_bundle: certs.CertBundle
) -> None:
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("sa-token")
    (sa / "ca.crt").write_bytes(server_bundle.ca_cert_pem)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", host)
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    monkeypatch.setenv(client.SERVICE_ACCOUNT_DIR_ENV, str(sa))

    cfg = k8s.Configuration()
    k8s_config.incluster_config.InClusterConfigLoader(
        token_filename=str(sa / "token"), cert_filename=str(sa / "ca.crt")
    ).load_and_set(cfg)
    with k8s.ApiClient(cfg) as theirs, connect() as ours:
        assert ours is not None
        assert pool_settings(ours.pool) == pool_settings(theirs.rest_client.pool_manager)
        assert auth(dict(ours.headers())) == auth(official_headers(theirs)) == "bearer sa-token"
        assert (
            ours.host
            == cfg.host
            == ("https://[fd00::1]:443" if ":" in host else "https://10.96.0.1:443")
        )


def test_in_cluster_reads_a_rotated_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, server_bundle: certs.CertBundle
) -> None:
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("first\n")  # the newline is not sent
    (sa / "ca.crt").write_bytes(server_bundle.ca_cert_pem)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    monkeypatch.setenv(client.SERVICE_ACCOUNT_DIR_ENV, str(sa))
    monkeypatch.setattr(client, "TOKEN_REFRESH_SECONDS", 0.0)
    with connect() as conn:
        assert conn is not None
        assert conn.headers() == {"authorization": "Bearer first"}
        # the kubelet swaps a symlink to a new file: replace it the same way
        (sa / "token.new").write_text("second")
        os.replace(sa / "token.new", sa / "token")
        assert conn.headers() == {"authorization": "Bearer second"}


def test_token_file_is_read_again_once_a_period_has_passed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    token = tmp_path / "token"
    token.write_text("one")
    now = [100.0]
    source = TokenFile(token, period=60.0, clock=lambda: now[0])
    token.write_text("two")
    now[0] += 59.0
    assert source.headers() == {"authorization": "Bearer one"}
    now[0] += 1.0
    assert source.headers() == {"authorization": "Bearer two"}
    # gone or empty for a moment: the last token is kept, and read again a period later
    token.unlink()
    now[0] += 60.0
    with caplog.at_level(logging.WARNING):
        assert source.headers() == {"authorization": "Bearer two"}
    assert "keeping the last token" in caplog.text
    token.write_text("")
    now[0] += 60.0
    assert source.headers() == {"authorization": "Bearer two"}
    token.write_text("three")
    now[0] += 30.0
    assert source.headers() == {"authorization": "Bearer two"}
    now[0] += 30.0
    assert source.headers() == {"authorization": "Bearer three"}


def test_kubeconfig_token_file_is_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "token").write_text("one")
    path = write_kubeconfig(
        tmp_path / "config", {"server": "https://127.0.0.1:1"}, {"tokenFile": "token"}
    )
    monkeypatch.setattr(client, "TOKEN_REFRESH_SECONDS", 0.0)
    with connect(path) as conn:
        assert conn is not None
        (tmp_path / "token").write_text("two")
        assert conn.headers() == {"authorization": "Bearer two"}


# ---- real TLS -------------------------------------------------------------------------------


def _get(conn: Connection) -> dict[str, Any]:
    return Kube(conn, timeout=5.0).get("/version")


def test_token_and_server_verification(
    tmp_path: Path, https_server: str, server_bundle: certs.CertBundle
) -> None:
    cluster = {
        "server": https_server,
        "certificate-authority-data": b64(server_bundle.ca_cert_pem),
        "tls-server-name": "hook.ns.svc",
    }
    with connect(write_kubeconfig(tmp_path / "k", cluster, {"token": "abc"})) as conn:
        assert conn is not None
        answer = _get(conn)
    assert answer == {"path": "/version", "authorization": "Bearer abc", "client": None}


def test_client_certificate_is_presented(
    tmp_path: Path,
    https_server: str,
    server_bundle: certs.CertBundle,
    client_ca: certs.CertBundle,
) -> None:
    cert, key = client_cert(client_ca, "alice")
    cluster = {
        "server": https_server,
        "certificate-authority-data": b64(server_bundle.ca_cert_pem),
        "tls-server-name": "hook.ns.svc",
    }
    user = {"client-certificate-data": b64(cert), "client-key-data": b64(key)}
    with connect(write_kubeconfig(tmp_path / "k", cluster, user)) as conn:
        assert conn is not None
        assert _get(conn)["client"] == "alice"
        assert _get(conn)["authorization"] is None
        # the key lives in anonymous memory, not in a file on disk
        key_file = conn.pool.connection_pool_kw["key_file"]
        assert key_file.startswith("/proc/self/fd/")


@pytest.mark.parametrize(
    "cluster",
    [
        pytest.param({"tls-server-name": "hook.ns.svc"}, id="no CA: system roots"),
        pytest.param({"ca": "other", "tls-server-name": "hook.ns.svc"}, id="another CA"),
        pytest.param({"ca": "right"}, id="name is an address the certificate does not hold"),
        pytest.param({"ca": "right", "tls-server-name": "other.ns.svc"}, id="other name"),
    ],
)
def test_server_verification_fails(
    tmp_path: Path,
    https_server: str,
    server_bundle: certs.CertBundle,
    cluster: dict[str, str],
) -> None:
    ca = cluster.pop("ca", None)
    if ca:
        pem = server_bundle.ca_cert_pem if ca == "right" else certgen.generate("x", "y").ca_cert_pem
        cluster["certificate-authority-data"] = b64(pem)
    path = write_kubeconfig(tmp_path / "k", {"server": https_server, **cluster}, {"token": "t"})
    with connect(path) as conn, pytest.raises(KubeError) as e:
        assert conn is not None
        _get(conn)
    assert e.value.status is None  # no answer: the handshake failed


def test_insecure_skip_tls_verify_connects_without_a_ca(tmp_path: Path, https_server: str) -> None:
    path = write_kubeconfig(
        tmp_path / "k", {"server": https_server, "insecure-skip-tls-verify": True}, {"token": "t"}
    )
    with connect(path) as conn, pytest.warns(urllib3.exceptions.InsecureRequestWarning):
        assert conn is not None
        assert _get(conn)["authorization"] == "Bearer t"


# ---- handed to the official loader ----------------------------------------------------------


def test_exec_plugin_goes_through_the_official_loader(tmp_path: Path) -> None:
    plugin = tmp_path / "plugin.py"
    plugin.write_text(
        "import json\n"
        "print(json.dumps({'apiVersion': 'client.authentication.k8s.io/v1beta1',"
        " 'kind': 'ExecCredential', 'status': {'token': 'from-exec'}}))\n"
    )
    user = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1beta1",
            "command": sys.executable,
            "args": [str(plugin)],
        }
    }
    path = write_kubeconfig(tmp_path / "k", {"server": "https://127.0.0.1:1"}, user)
    with connect(path) as conn:
        assert conn is not None
        assert conn.headers() == {"authorization": "Bearer from-exec"}


@pytest.mark.parametrize("where", ["environment", "kubeconfig"])
def test_a_proxy_goes_through_the_official_loader(
    where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster: dict[str, Any] = {"server": "https://127.0.0.1:1"}
    if where == "environment":
        monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:3128")
    else:
        cluster["proxy-url"] = "http://127.0.0.1:3128"
    with connect(write_kubeconfig(tmp_path / "k", cluster, {"token": "t"})) as conn:
        assert conn is not None
        assert isinstance(conn.pool, urllib3.ProxyManager)
        assert conn.headers() == {"authorization": "Bearer t"}


# ---- what cannot be loaded says why -----------------------------------------------------------


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ("[]", "not a kubeconfig"),
        ("{}", "no context named None"),
        (
            "{current-context: x, contexts: [{name: x, context: {cluster: c}}]}",
            "no cluster named 'c'",
        ),
        (
            "{current-context: x, contexts: [{name: x, context: {cluster: c}}],"
            " clusters: [{name: c, cluster: {}}]}",
            "has no server",
        ),
        (
            "{current-context: x, contexts: [{name: x, context: {cluster: c}}],"
            " clusters: [{name: c, cluster: {server: 'https://h', certificate-authority: nope}}]}",
            "file does not exist",
        ),
        ("{: [", "kubeconfig"),
    ],
)
def test_a_broken_kubeconfig_says_what_is_wrong(tmp_path: Path, doc: str, message: str) -> None:
    path = tmp_path / "config"
    path.write_text(doc)
    with pytest.raises(ConfigError, match=message):
        connect(path)


def test_in_cluster_without_a_token_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    monkeypatch.setenv(client.SERVICE_ACCOUNT_DIR_ENV, str(tmp_path))
    with pytest.raises(ConfigError, match="no service account token"):
        connect()
    (tmp_path / "token").write_text("t")
    with pytest.raises(ConfigError, match="no service account CA"):
        connect()


def test_no_cluster_configured(monkeypatch: pytest.MonkeyPatch) -> None:
    assert connect() is None


def test_kubeconfig_from_the_environment_uses_its_first_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = write_kubeconfig(tmp_path / "a", {"server": "https://first:1"}, {"token": "a"})
    second = write_kubeconfig(tmp_path / "b", {"server": "https://second:1"}, {"token": "b"})
    monkeypatch.setenv("KUBECONFIG", f"{first}{os.pathsep}{second}")
    with connect() as conn:
        assert conn is not None
        assert conn.host == "https://first:1"


def test_serve_does_not_read_kubeconfig_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`configpin serve` acts on a cluster only when named or in a pod: a KUBECONFIG the shell
    carries (a laptop pointed at production) is not a cluster to act on."""
    named = write_kubeconfig(tmp_path / "a", {"server": "https://named:1"}, {"token": "a"})
    monkeypatch.setenv("KUBECONFIG", str(named))
    assert connect(from_kubeconfig_env=False) is None
    with connect(named, from_kubeconfig_env=False) as conn:
        assert conn is not None
        assert conn.host == "https://named:1"


def test_serve_says_why_it_cannot_connect(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from webhook.commands.cli import main

    path = tmp_path / "config"
    path.write_text("current-context: nope\n")
    assert main(["serve", "--kubeconfig", str(path), "--certs-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "cannot connect to the cluster" in err
    assert "no context named 'nope'" in err
