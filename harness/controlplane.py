"""A real Kubernetes control plane for integration tests, started the envtest way.

etcd, kube-apiserver and kube-controller-manager run as local processes on 127.0.0.1 with
free ports. There is no scheduler and no kubelet: pods are created and stay Pending, which is
all an admission webhook and a rollout controller need to be tested against.

With a `NodeNetwork` the same control plane is started for a real node (harness/node.py):
inside the node's namespaces, listening where pods reach it, with an endpoint for the
`kubernetes` Service, a client certificate to call kubelets with, and the controllers a node needs.

The binaries come from ``$KUBEBUILDER_ASSETS``; when that is unset,
``hack/provision-control-plane.sh`` provides (and caches) them.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import datetime
import ipaddress
import json
import os
import re
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypeVar

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from kubernetes import client

REPO_ROOT = Path(__file__).resolve().parents[1]
PROVISION_SCRIPT = REPO_ROOT / "hack" / "provision-control-plane.sh"
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager")

ENABLED_LABEL = "configpin.io/enabled"
WEBHOOK_NAME = "mutate.configpin.io"

CONTROLLERS = (
    "deployment",
    "replicaset",
    "statefulset",
    "daemonset",
    "garbagecollector",
    "job",
    "cronjob",
    "namespace",
    "serviceaccount-token",
    "serviceaccount",
    # publishes kube-root-ca.crt, which the projected service-account volume of every pod reads
    # from 1.21 on (BoundServiceAccountTokenVolume)
    "root-ca-cert-publisher",
)

# What a real node adds (harness/node.py): the node lifecycle (removes the not-ready taint once
# the kubelet reports Ready), Service endpoints for kube-proxy, pod garbage collection, and
# PodDisruptionBudgets (the chart ships one).
NODE_CONTROLLERS = (
    "nodelifecycle",
    "endpoint",
    "endpointslice",
    "endpointslicemirroring",
    "podgc",
    "disruption",
)
# The 1.36.2 build is OpenShift's carry (shared/k8s/README.md): its ServiceAccount admission adds
# the `openshift-service-ca.crt` ConfigMap to every pod's service-account volume, and a pod whose
# volume cannot be filled never starts. This controller of the same carry publishes it in every
# namespace (as the root CA publisher does kube-root-ca.crt); enabled where the binary has it.
OPENSHIFT_SERVICE_CA_PUBLISHER = "service-ca-certificate-publisher-controller"

START_TIMEOUT = 60.0
STOP_TIMEOUT = 10.0
LOG_TAIL_LINES = 40

T = TypeVar("T")


class ControlPlaneError(RuntimeError):
    """The control plane could not be provisioned or started."""


def wait_for(
    predicate: Callable[[], T], timeout: float = 30, interval: float = 0.1, what: str = "condition"
) -> T:
    """Poll ``predicate`` until it returns something truthy, and return that.

    Raises AssertionError naming ``what`` when ``timeout`` seconds pass first. Exceptions raised
    by the predicate propagate: catch the expected ones (a 404, say) inside it.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


# --- binaries -------------------------------------------------------------------------------


def binary_version(path: Path) -> tuple[int, int]:
    """(major, minor) of a Kubernetes binary, from its ``--version`` ("Kubernetes v1.36.2")."""
    out = subprocess.run(
        [str(path), "--version"], capture_output=True, text=True, check=False, timeout=30
    ).stdout
    match = re.search(r"v(\d+)\.(\d+)", out)
    if match is None:
        raise ControlPlaneError(f"{path} --version printed no version: {out[:200]!r}")
    return int(match[1]), int(match[2])


def _known_controllers(controller_manager: Path) -> set[str]:
    """The controller names a kube-controller-manager binary lists in its --help."""
    out = subprocess.run(
        [str(controller_manager), "--help"], capture_output=True, text=True, check=False, timeout=30
    ).stdout
    match = re.search(r"All controllers: ([^\n]*)", out)
    return set(match[1].replace(" ", "").split(",")) if match else set()


def find_assets() -> Path:
    """The folder holding etcd, kube-apiserver and kube-controller-manager."""
    env = os.environ.get("KUBEBUILDER_ASSETS")
    if env:
        assets = Path(env)
    else:
        # The script takes a lock and builds once; a concurrent caller just waits for it.
        proc = subprocess.run(
            ["bash", str(PROVISION_SCRIPT)], capture_output=True, text=True, check=False
        )
        if proc.returncode != 0:
            raise ControlPlaneError(
                f"{PROVISION_SCRIPT.name} failed with exit code {proc.returncode}:\n"
                + _tail(proc.stderr)
            )
        assets = Path(proc.stdout.strip().splitlines()[-1])
    missing = [b for b in BINARIES if not os.access(assets / b, os.X_OK)]
    if missing:
        raise ControlPlaneError(f"{assets} lacks executable {', '.join(missing)}")
    return assets


# --- certificates ---------------------------------------------------------------------------


@dataclass(frozen=True)
class KeyPair:
    """A PEM certificate (or public key) and its PEM private key."""

    cert_pem: bytes
    key_pem: bytes = field(repr=False)


def _key_pem(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _validity(builder: x509.CertificateBuilder) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return builder.not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(
        now + datetime.timedelta(days=30)
    )


def new_ca(common_name: str = "configpin-test-ca") -> KeyPair:
    """A self-signed CA (ECDSA P-256: fast to generate, accepted by Go and OpenSSL)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        _validity(x509.CertificateBuilder())
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def issue_serving_cert(
    ca: KeyPair,
    common_name: str,
    ips: Sequence[str] = ("127.0.0.1",),
    dns_names: Sequence[str] = ("localhost",),
) -> KeyPair:
    """A TLS server certificate signed by ``ca`` for the given IP and DNS SANs."""
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        raise TypeError(f"unsupported CA key type {type(ca_key).__name__}")
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    sans += [x509.DNSName(d) for d in dns_names]
    cert = (
        _validity(x509.CertificateBuilder())
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def issue_client_cert(ca: KeyPair, user: str, groups: Sequence[str] = ()) -> KeyPair:
    """A client certificate for `user` (CN) in `groups` (O), as kube-apiserver reads them."""
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        raise TypeError(f"unsupported CA key type {type(ca_key).__name__}")
    key = ec.generate_private_key(ec.SECP256R1())
    name = [x509.NameAttribute(NameOID.COMMON_NAME, user)]
    name += [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups]
    cert = (
        _validity(x509.CertificateBuilder())
        .subject_name(x509.Name(name))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def _service_account_keys() -> KeyPair:
    """RSA pair the apiserver signs (and the token controller issues) service-account JWTs with."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return KeyPair(public, _key_pem(key))


def _write_private(path: Path, data: bytes | str) -> Path:
    """Write a file only the owner can read (keys, tokens, kubeconfigs)."""
    raw = data.encode() if isinstance(data, str) else data
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(raw)
    return path


# --- processes ------------------------------------------------------------------------------


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _tail(text: str, lines: int = LOG_TAIL_LINES) -> str:
    return "\n".join(text.splitlines()[-lines:])


def _load_prctl() -> Callable[[int, int], int] | None:
    if sys.platform != "linux":
        return None
    import ctypes

    try:
        prctl: Callable[[int, int], int] = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return prctl


# Resolved here, in the parent: the child between fork and exec should do as little as possible.
_PRCTL = _load_prctl()
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Runs in the child before exec: SIGKILL it if pytest itself dies without cleaning up."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclass(frozen=True)
class Placement:
    """Where a started process runs: `prefix` goes before its argv (an nsenter into a node's
    namespaces), and the child joins the cgroups whose `cgroup.procs` files are listed before it
    execs, so that everything it starts is found there again."""

    prefix: tuple[str, ...] = ()
    cgroup_procs: tuple[Path, ...] = ()

    def preexec(self) -> None:
        """Runs in the child between fork and exec."""
        _die_with_parent()
        pid = str(os.getpid()).encode()
        for procs in self.cgroup_procs:
            fd = os.open(procs, os.O_WRONLY)
            try:
                os.write(fd, pid)
            finally:
                os.close(fd)


HERE = Placement()


def _child_env() -> dict[str, str]:
    # Everything talks to 127.0.0.1: a proxy from the environment would only get in the way
    # (the apiserver honours HTTPS_PROXY when it calls webhooks).
    proxies = {"http_proxy", "https_proxy", "all_proxy", "no_proxy"}
    return {k: v for k, v in os.environ.items() if k.lower() not in proxies}


@dataclass
class _Process:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    log_file: IO[bytes] = field(repr=False)

    @classmethod
    def start(
        cls,
        name: str,
        argv: Sequence[str],
        log_dir: Path,
        cwd: Path,
        placement: Placement = HERE,
    ) -> _Process:
        log_path = log_dir / f"{name}.log"
        log_file = log_path.open("ab")
        try:
            popen = subprocess.Popen(
                [*placement.prefix, *argv],
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                cwd=cwd,
                env=_child_env(),
                # Own process group: a terminal's Ctrl-C does not reach the children (we stop
                # them ourselves, in order), and killpg takes whatever they spawned too.
                process_group=0,
                preexec_fn=placement.preexec,
            )
        except BaseException:
            log_file.close()
            raise
        return cls(name, popen, log_path, log_file)

    def log_tail(self) -> str:
        self.log_file.flush()
        try:
            return _tail(self.log_path.read_text(errors="replace"))
        except OSError as e:
            return f"(cannot read {self.log_path}: {e})"

    def check_running(self) -> None:
        code = self.popen.poll()
        if code is not None:
            raise ControlPlaneError(
                f"{self.name} exited with code {code}; last lines of {self.log_path}:\n"
                + self.log_tail()
            )

    def stop(self) -> None:
        """SIGTERM the process group, SIGKILL it if it lingers, and reap."""
        try:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                # Signal the group only while its leader is unreaped: its id cannot be reused.
                if self.popen.poll() is not None:
                    break
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.popen.pid, sig)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.popen.wait(timeout=STOP_TIMEOUT)
            self.popen.wait()
        finally:
            self.log_file.close()


def _wait_until(
    proc: _Process, ready: Callable[[], bool], what: str, timeout: float = START_TIMEOUT
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        proc.check_running()
        if ready():
            return
        if time.monotonic() >= deadline:
            raise ControlPlaneError(
                f"{proc.name} not ready after {timeout:g}s ({what}); last lines of "
                f"{proc.log_path}:\n{proc.log_tail()}"
            )
        time.sleep(0.1)


def _http_ok(url: str, *, context: ssl.SSLContext | None = None, token: str = "") -> bool:
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=2, context=context) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


# --- the control plane ----------------------------------------------------------------------


@dataclass(frozen=True)
class ControlPlane:
    """A running control plane: where it is, and how to reach it as system:masters."""

    host: str
    token: str = field(repr=False)
    ca_file: Path
    kubeconfig: Path
    log_dir: Path
    version: tuple[int, int] = (1, 20)
    etcd_url: str = ""  # etcd's client URL (plain HTTP on loopback)

    @property
    def minor(self) -> int:
        return self.version[1]

    @property
    def ca_pem(self) -> bytes:
        return self.ca_file.read_bytes()

    def ca(self) -> KeyPair:
        """The cluster CA with its key, to issue client and serving certificates with."""
        return KeyPair(self.ca_pem, (self.ca_file.parent / "ca.key").read_bytes())

    def configuration(self) -> client.Configuration:
        """A fresh client Configuration: TLS verified against the apiserver CA, bearer token."""
        cfg = client.Configuration(host=self.host)
        cfg.ssl_ca_cert = str(self.ca_file)
        cfg.verify_ssl = True
        cfg.api_key = {"BearerToken": self.token}
        cfg.api_key_prefix = {"BearerToken": "Bearer"}
        return cfg

    def compact_etcd(self) -> int:
        """Compact etcd's history up to its current revision, as the API server does every
        few minutes: a watch or a continue token from before then gets 410 Gone. Returns the
        revision compacted to."""
        status = _etcd_post(f"{self.etcd_url}/v3/kv/range", {"key": "AA==", "limit": 1})
        revision = int(status["header"]["revision"])
        _etcd_post(f"{self.etcd_url}/v3/kv/compaction", {"revision": revision, "physical": True})
        return revision

    def api_client(self) -> client.ApiClient:
        """A new ApiClient for this control plane; close it (or use it as a context manager)."""
        return client.ApiClient(self.configuration())


def _etcd_post(url: str, body: Mapping[str, Any]) -> Any:
    """etcd's JSON gateway (v3 API), on the loopback client URL."""
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as resp:
        return json.loads(resp.read())


def kubeconfig_text(host: str, ca_pem: bytes, user: Mapping[str, Any]) -> str:
    """A kubeconfig for the API server at `host` (CA `ca_pem`) as the kubeconfig `user`
    entry (`{"token": ...}`, `{"client-certificate-data": ..., ...}`)."""
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "configpin-test",
                "cluster": {
                    "server": host,
                    "certificate-authority-data": base64.b64encode(ca_pem).decode(),
                },
            }
        ],
        "users": [{"name": "admin", "user": dict(user)}],
        "contexts": [
            {"name": "configpin-test", "context": {"cluster": "configpin-test", "user": "admin"}}
        ],
        "current-context": "configpin-test",
    }
    return yaml.safe_dump(doc, sort_keys=False)


def service_account_kubeconfig(
    plane: ControlPlane, api: client.ApiClient, namespace: str, account: str, out: Path
) -> Path:
    """A kubeconfig holding a token of ServiceAccount `account` of `namespace` (a
    TokenRequest, as a pod's), for commands run with that account's rights and no more."""
    request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest"}
    request["spec"] = {"expirationSeconds": 3600}  # type: ignore[assignment]
    answer = client.CoreV1Api(api).create_namespaced_service_account_token(
        account, namespace, request
    )
    return _write_private(
        out, kubeconfig_text(plane.host, plane.ca_pem, {"token": answer.status.token})
    )


def default_service_account_ready(api: client.ApiClient, namespace: str = "default") -> bool:
    """The serviceaccount controller made ``default`` (and, before 1.24, its token Secret).

    On 1.20 the ServiceAccount admission plugin rejects pods until the token Secret exists,
    so "SA exists" alone is not enough there. From 1.24 no token Secret is made: pods get a
    projected token instead, and the account existing is all admission asks.
    """
    core = client.CoreV1Api(api)
    try:
        sa = core.read_namespaced_service_account("default", namespace)
    except client.ApiException as e:
        if e.status == 404:
            return False
        raise
    if server_minor(api) >= 24:
        return True
    # the token Secret named, and filled in by the token controller (the admission plugin
    # refuses pods until it can find a token)
    for ref in sa.secrets or ():
        try:
            token = core.read_namespaced_secret(ref.name, namespace)
        except client.ApiException as e:
            if e.status == 404:
                continue
            raise
        if (token.data or {}).get("token"):
            return True
    return False


_MINORS: dict[str, int] = {}


def server_minor(api: client.ApiClient) -> int:
    """The API server's minor version (20, 36...), asked once per host."""
    host = api.configuration.host
    if host not in _MINORS:
        info = client.VersionApi(api).get_code()
        _MINORS[host] = int(re.sub(r"\D.*", "", info.minor or "0") or 0)
    return _MINORS[host]


_SHM = Path("/dev/shm")
_ETCD_DIR_PREFIX = "configpin-etcd-"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _etcd_data_dir(workdir: Path) -> tempfile.TemporaryDirectory[str]:
    """etcd's data directory, on tmpfs when there is one.

    etcd 3.4 has no --unsafe-no-fsync; on tmpfs fsync is nearly free. A session killed outright
    leaves its directory behind (over 100 MB: preallocated WAL), so the directories of dead
    sessions, named after their pid, are removed first.
    """
    if not _SHM.is_dir():
        return tempfile.TemporaryDirectory(prefix=_ETCD_DIR_PREFIX, dir=workdir)
    for stale in _SHM.glob(f"{_ETCD_DIR_PREFIX}*-*"):
        pid = stale.name.removeprefix(_ETCD_DIR_PREFIX).split("-", 1)[0]
        if pid.isdigit() and not _pid_alive(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)
    return tempfile.TemporaryDirectory(prefix=f"{_ETCD_DIR_PREFIX}{os.getpid()}-", dir=_SHM)


@dataclass(frozen=True)
class NodeNetwork:
    """How a control plane for a real node (harness/node.py) is reached and placed.

    `address`: where the tests and the node's components reach etcd and the API server (the
    node's end of its link to this machine). `advertise_address`: the node's address on its pod
    bridge, the `kubernetes` Service's endpoint, which pods reach. `service_cidr`: ClusterIPs.
    `placement`: every process runs inside the node's namespaces and cgroup.
    """

    address: str
    advertise_address: str
    service_cidr: str
    placement: Placement


_LOOPBACK = NodeNetwork("127.0.0.1", "", "10.0.0.0/24", HERE)


def _service_ip(cidr: str) -> str:
    """The ClusterIP of the `kubernetes` Service: the first address of the range."""
    return str(next(ipaddress.ip_network(cidr).hosts()))


@contextlib.contextmanager
def running_control_plane(
    workdir: Path, assets: Path | None = None, *, network: NodeNetwork | None = None
) -> Iterator[ControlPlane]:
    """Start etcd, kube-apiserver and kube-controller-manager under ``workdir``; stop on exit.

    Logs stay in ``workdir/logs``. The processes are stopped in reverse order whatever happens,
    KeyboardInterrupt included; if pytest is killed outright they die with it (PDEATHSIG).

    Without `network` everything listens on 127.0.0.1 and no node can join. With it (see
    `NodeNetwork`) the processes run where `network.placement` puts them, the API server listens
    on every address there and advertises `network.advertise_address` (the lease endpoint
    reconciler keeps the `kubernetes` Service's endpoint), calls kubelets at their InternalIP
    with a client certificate of the CA and checks theirs, and the controller manager also runs
    `NODE_CONTROLLERS`.
    """
    assets = assets or find_assets()
    net = network or _LOOPBACK
    workdir.mkdir(parents=True, exist_ok=True)
    log_dir = workdir / "logs"
    log_dir.mkdir(exist_ok=True)
    pki = workdir / "pki"
    pki.mkdir(exist_ok=True)

    ca = new_ca()
    if network is None:
        serving = issue_serving_cert(ca, "kube-apiserver", ("127.0.0.1",), ("localhost",))
    else:
        ips = ("127.0.0.1", net.address, net.advertise_address, _service_ip(net.service_cidr))
        names = ("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc")
        serving = issue_serving_cert(ca, "kube-apiserver", ips, names)
        kubelet_client = issue_client_cert(ca, "kube-apiserver-kubelet-client", ["system:masters"])
        (pki / "kubelet-client.crt").write_bytes(kubelet_client.cert_pem)
        _write_private(pki / "kubelet-client.key", kubelet_client.key_pem)
    sa_keys = _service_account_keys()
    token = secrets.token_urlsafe(32)
    ca_file = pki / "ca.crt"
    ca_file.write_bytes(ca.cert_pem)
    _write_private(pki / "ca.key", ca.key_pem)  # signs client certificates (--client-ca-file)
    (pki / "apiserver.crt").write_bytes(serving.cert_pem)
    _write_private(pki / "apiserver.key", serving.key_pem)
    (pki / "sa.pub").write_bytes(sa_keys.cert_pem)
    _write_private(pki / "sa.key", sa_keys.key_pem)
    _write_private(pki / "tokens.csv", f'{token},admin,admin-uid,"system:masters"\n')

    etcd_client_port, etcd_peer_port, apiserver_port = free_port(), free_port(), free_port()
    host = f"https://{net.address}:{apiserver_port}"
    kubeconfig = _write_private(
        workdir / "kubeconfig", kubeconfig_text(host, ca.cert_pem, {"token": token})
    )
    version = binary_version(assets / "kube-apiserver")
    etcd_url = f"http://{net.address}:{etcd_client_port}"
    plane = ControlPlane(host, token, ca_file, kubeconfig, log_dir, version, etcd_url)

    with contextlib.ExitStack() as stack:
        etcd_data = Path(stack.enter_context(_etcd_data_dir(workdir)))

        def launch(name: str, argv: Sequence[str]) -> _Process:
            proc = _Process.start(name, argv, log_dir, workdir, net.placement)
            stack.callback(proc.stop)
            return proc

        peer_url = f"http://127.0.0.1:{etcd_peer_port}"  # one member: never leaves its host
        etcd = launch(
            "etcd",
            [
                str(assets / "etcd"),
                "--name=default",
                "--logger=zap",
                # A single member elects itself after one election timeout (default 1 s).
                "--heartbeat-interval=10",
                "--election-timeout=50",
                f"--data-dir={etcd_data}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=default={peer_url}",
            ],
        )
        _wait_until(etcd, lambda: _http_ok(f"{etcd_url}/health"), f"GET {etcd_url}/health")

        apiserver = launch(
            "kube-apiserver",
            [
                str(assets / "kube-apiserver"),
                f"--etcd-servers={etcd_url}",
                f"--secure-port={apiserver_port}",
                *(
                    [
                        "--bind-address=127.0.0.1",
                        # The `kubernetes` Service would need endpoints: a loopback address is
                        # refused.
                        "--endpoint-reconciler-type=none",
                    ]
                    if network is None
                    else [
                        # every address of the node's own network namespace: its link to this
                        # machine (the tests) and its pod bridge (pods, through the Service)
                        "--bind-address=0.0.0.0",
                        f"--advertise-address={net.advertise_address}",
                        "--endpoint-reconciler-type=lease",
                        f"--kubelet-client-certificate={pki / 'kubelet-client.crt'}",
                        f"--kubelet-client-key={pki / 'kubelet-client.key'}",
                        f"--kubelet-certificate-authority={ca_file}",
                        "--kubelet-preferred-address-types=InternalIP",
                    ]
                ),
                f"--cert-dir={pki}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--client-ca-file={ca_file}",
                f"--token-auth-file={pki / 'tokens.csv'}",
                "--authorization-mode=Node,RBAC",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-cluster-ip-range={net.service_cidr}",
                "--allow-privileged=true",
            ],
        )
        tls = ssl.create_default_context(cafile=str(ca_file))
        _wait_until(
            apiserver,
            lambda: _http_ok(f"{host}/readyz", context=tls, token=token),
            f"GET {host}/readyz",
        )

        controllers = list(CONTROLLERS)
        if network is not None:
            controllers += NODE_CONTROLLERS
            kcm = assets / "kube-controller-manager"
            if OPENSHIFT_SERVICE_CA_PUBLISHER in _known_controllers(kcm):
                controllers.append(OPENSHIFT_SERVICE_CA_PUBLISHER)
        controller_manager = launch(
            "kube-controller-manager",
            [
                str(assets / "kube-controller-manager"),
                f"--kubeconfig={kubeconfig}",
                f"--controllers={','.join(controllers)}",
                # a node's not-ready taint comes off a second after it reports Ready, not five
                *(["--node-monitor-period=1s"] if network is not None else []),
                f"--service-account-private-key-file={pki / 'sa.key'}",
                f"--root-ca-file={ca_file}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                "--secure-port=0",
                # the insecure port (and its flag) went away in 1.24
                *(["--port=0"] if version < (1, 24) else []),
            ],
        )
        with plane.api_client() as api:
            _wait_until(
                controller_manager,
                lambda: default_service_account_ready(api),
                "ServiceAccount default/default with its token Secret",
            )

        yield plane
        # A component that died during the tests explains their failures better than they do.
        for proc in (etcd, apiserver, controller_manager):
            proc.check_running()


# --- webhook registration -------------------------------------------------------------------


def default_webhook_rules() -> list[dict[str, Any]]:
    """The rules of the chart's webhook, as rendered for a current cluster."""
    return copy.deepcopy(_chart_webhooks("v1.36.2", ())[0]["rules"])


_CHART_WEBHOOKS: dict[str, dict[str, Any]] = {}


def _chart_webhooks(
    kube_version: str, api_versions: Sequence[str], values: Mapping[str, Any] | None = None
) -> list[dict[str, Any]]:
    from harness.chart import one, render

    key = f"{kube_version} {len(api_versions)} {json.dumps(values or {}, sort_keys=True)}"
    if key not in _CHART_WEBHOOKS:
        objects = render(values or {}, kube_version, api_versions)
        _CHART_WEBHOOKS[key] = one(objects, "MutatingWebhookConfiguration")["webhooks"]
    return copy.deepcopy(_CHART_WEBHOOKS[key])


_CAPABILITIES: dict[str, tuple[str, list[str]]] = {}


def chart_webhooks(
    api_client: client.ApiClient, values: Mapping[str, Any] | None = None
) -> list[dict[str, Any]]:
    """The webhook entries of the chart's MutatingWebhookConfiguration (workloads first, then
    source writes), rendered for the capabilities of the cluster behind ``api_client`` (and
    chart ``values``), as ``helm install`` would render them."""
    from harness.chart import cluster_capabilities

    host = api_client.configuration.host
    if host not in _CAPABILITIES:
        _CAPABILITIES[host] = cluster_capabilities(api_client)
    return _chart_webhooks(*_CAPABILITIES[host], values)


def chart_webhook(
    api_client: client.ApiClient, values: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The chart's webhook entry for workloads (see `chart_webhooks`)."""
    return chart_webhooks(api_client, values)[0]


def register_webhook(
    api_client: client.ApiClient,
    name: str,
    url: str,
    ca_bundle_pem: bytes,
    *,
    failure_policy: str = "Ignore",
    namespace_selector: Mapping[str, Any] | None = None,
    namespace_expressions: Sequence[Mapping[str, Any]] = (),
    timeout_seconds: int = 5,
    rules: Sequence[Mapping[str, Any]] | None = None,
    match_conditions: bool = True,
    chart_values: Mapping[str, Any] | None = None,
    paths: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Create (or replace) MutatingWebhookConfiguration ``name`` sending reviews to the
    server at ``url`` (``https://host:port``, no path).

    The webhooks are the chart's own (workloads; source writes), rendered for this cluster
    (rules, namespace and object selectors, matchConditions where served, reinvocation, side
    effects), with the Service replaced by ``url`` and each entry's path (``paths``, by entry
    name, replaces the chart's: an older chart's, say). ``namespace_expressions`` are added
    to the chart's namespace selector (tests keep their configpin instances apart that way);
    ``namespace_selector`` replaces it.

    Returns the body sent. The apiserver learns of the configuration through an informer, so
    it takes effect shortly after this returns (well under a second), not at once.
    """
    hooks = chart_webhooks(api_client, chart_values)
    if rules is not None:  # a workloads webhook of the test's own
        hooks = hooks[:1]
        hooks[0]["rules"] = [dict(r) for r in rules]
    if urllib.parse.urlsplit(url).path not in ("", "/"):
        raise ValueError(f"{url}: the server's address, without a path (each entry has its own)")
    for hook in hooks:
        where = (paths or {}).get(hook["name"]) or hook["clientConfig"]["service"]["path"]
        hook["clientConfig"] = {
            "url": url.rstrip("/") + where,
            "caBundle": base64.b64encode(ca_bundle_pem).decode(),
        }
        hook["timeoutSeconds"] = timeout_seconds
        if hook["name"] == WEBHOOK_NAME:  # (the source writes' policy is Ignore, always)
            hook["failurePolicy"] = failure_policy
        if namespace_selector is not None:
            hook["namespaceSelector"] = dict(namespace_selector)
        selector = hook["namespaceSelector"]
        selector["matchExpressions"] = [
            *selector.get("matchExpressions", []),
            *(dict(e) for e in namespace_expressions),
        ]
        if not match_conditions:
            hook.pop("matchConditions", None)
    body: dict[str, Any] = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": hooks,
    }
    api = client.AdmissionregistrationV1Api(api_client)
    # Validating into the model catches a misspelt field here rather than at the apiserver.
    model = client.V1MutatingWebhookConfiguration.model_validate(body)
    try:
        api.create_mutating_webhook_configuration(model)
    except client.ApiException as e:
        if e.status != 409:
            raise
        current = api.read_mutating_webhook_configuration(name).to_dict(serialize=True)
        replacement = copy.deepcopy(body)
        replacement["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        api.replace_mutating_webhook_configuration(
            name, client.V1MutatingWebhookConfiguration.model_validate(replacement)
        )
    return body


def unregister_webhook(api_client: client.ApiClient, name: str) -> None:
    """Delete MutatingWebhookConfiguration ``name``; absent is fine."""
    try:
        client.AdmissionregistrationV1Api(api_client).delete_mutating_webhook_configuration(name)
    except client.ApiException as e:
        if e.status != 404:
            raise


__all__ = [
    "ENABLED_LABEL",
    "WEBHOOK_NAME",
    "ControlPlane",
    "ControlPlaneError",
    "KeyPair",
    "NodeNetwork",
    "Placement",
    "chart_webhook",
    "chart_webhooks",
    "default_service_account_ready",
    "default_webhook_rules",
    "find_assets",
    "free_port",
    "issue_client_cert",
    "issue_serving_cert",
    "new_ca",
    "register_webhook",
    "running_control_plane",
    "unregister_webhook",
    "wait_for",
]
