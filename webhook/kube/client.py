"""Connection to the cluster: in-cluster config, else --kubeconfig / KUBECONFIG, else none.

configpin sends raw JSON over urllib3 (`webhook.kube.raw`) and needs of a client only where the
API server is, a connection pool with the right TLS settings, and the credentials to send. The
official client's package imports every API class and model on its first import (about 7 MB
of memory that configpin never uses), so the common cases are read here, with the official
client's semantics and the same urllib3 pool arguments:

- in a pod: `KUBERNETES_SERVICE_HOST`/`_PORT`, the service account's CA and token, the token
  read again every minute (bound tokens rotate; the official client and client-go do the same);
- a kubeconfig's current context: `server`, `certificate-authority(-data)`,
  `insecure-skip-tls-verify`, `tls-server-name`; the user's `client-certificate(-data)` and
  `client-key(-data)`, `token` or `tokenFile` (read again every minute, as client-go does),
  or `username`/`password`. Relative paths are relative to the kubeconfig's folder.

What needs more is handed to the official loader, imported only then: credential plugins
(`exec`), `auth-provider`, and a proxy (`proxy-url`, or `https_proxy`/`all_proxy` in the
environment, which the official client honours).
"""

from __future__ import annotations

import base64
import logging
import os
import ssl
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Self

import urllib3

if TYPE_CHECKING:
    from kubernetes import client as k8s

log = logging.getLogger(__name__)

SERVICE_ACCOUNT_DIR: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount")
# Tests point the in-cluster loader at a service-account folder of their own.
SERVICE_ACCOUNT_DIR_ENV: Final = "CONFIGPIN_TEST_SERVICE_ACCOUNT_DIR"
TOKEN_REFRESH_SECONDS: Final = 60.0


class ConfigError(Exception):
    """The cluster connection cannot be set up as configured (says what is missing)."""


Headers = Callable[[], Mapping[str, str]]


class Connection:
    """Where the API server is, the urllib3 pool that reaches it (its TLS settings), and the
    headers that authenticate each request (read when the request is sent).

    A person's connection (`webhook.kube.user`) also carries what kubectl's flags ask of every
    request: `lines`, header lines sent besides the credentials, a name possibly repeated
    (`--as`, `--as-group`: one Impersonate-Group line per group), and `request_timeout`
    (`--request-timeout`: None when not given, 0 for none, else seconds)."""

    def __init__(
        self,
        host: str,
        pool: urllib3.PoolManager,
        headers: Headers,
        *,
        on_close: Callable[[], None] | None = None,
        lines: tuple[tuple[str, str], ...] = (),
        request_timeout: float | None = None,
    ) -> None:
        self.host = host.rstrip("/")
        self.pool = pool
        self.headers = headers
        self._on_close = on_close
        self.lines = lines
        self.request_timeout = request_timeout

    @classmethod
    def of_api_client(cls, api: k8s.ApiClient) -> Connection:
        """The official client's ApiClient as a Connection: its host, its pool, and the
        credentials its configuration hands out (refreshed by its own hooks)."""
        cfg = api.configuration

        def headers() -> dict[str, str]:
            return {
                setting["key"]: setting["value"]
                for setting in cfg.auth_settings().values()
                if setting.get("in") == "header" and setting.get("value")
            }

        return cls(str(cfg.host), api.rest_client.pool_manager, headers, on_close=api.close)

    def close(self) -> None:
        self.pool.clear()
        if self._on_close is not None:
            self._on_close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def connect(
    kubeconfig: Path | None = None, *, qps_hint: int = 50, from_kubeconfig_env: bool = True
) -> Connection | None:
    """A connection of its own, or None with no cluster configured.

    `from_kubeconfig_env=False` (`configpin serve`): KUBECONFIG is not read, so a server
    started on a laptop acts on a cluster only when it is named (`kubeconfig`) or in a pod.

    There is no client-side rate limiter here; the pool's size bounds how many requests run
    at once (the official client's default, cpu_count * 5, or qps_hint / 5 when larger).
    """
    maxsize = max((os.cpu_count() or 1) * 5, qps_hint // 5)
    if kubeconfig is not None:
        return _from_kubeconfig(Path(kubeconfig).expanduser(), maxsize)
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return _in_cluster(maxsize)
    if from_kubeconfig_env and os.environ.get("KUBECONFIG"):
        first = os.environ["KUBECONFIG"].split(os.pathsep)[0]
        return _from_kubeconfig(Path(first).expanduser(), maxsize)
    return None


# ---- credentials -----------------------------------------------------------------------------


class TokenFile:
    """A bearer token kept in a file that is replaced while configpin runs (a projected
    service-account token, a kubeconfig's tokenFile): read again when `period` seconds have
    passed since the last read. A failed re-read keeps the last token (a rotated token stays
    valid for a while) and is tried again on the next request."""

    def __init__(
        self,
        path: Path,
        *,
        period: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self.period = TOKEN_REFRESH_SECONDS if period is None else period
        self._clock = clock
        self._lock = threading.Lock()
        self._token = self._read()  # the first read must succeed
        self._read_at = clock()

    def _read(self) -> str:
        token = self.path.read_text().strip()
        if not token:
            raise ConfigError(f"token file {self.path} is empty")
        return token

    def headers(self) -> dict[str, str]:
        with self._lock:
            if self._clock() - self._read_at >= self.period:
                try:
                    self._token = self._read()
                except (OSError, ConfigError, UnicodeDecodeError) as e:
                    log.warning("cannot read token file %s again, keeping the last token: %s",
                                self.path, e)  # fmt: skip
                self._read_at = self._clock()
            return {"authorization": f"Bearer {self._token}"}


def _static(headers: Mapping[str, str]) -> Headers:
    frozen = dict(headers)
    return lambda: frozen


# ---- the pool ----------------------------------------------------------------------------------


def _pool(
    *,
    verify: bool,
    ca_file: str | None,
    cert_file: str | None,
    key_file: str | None,
    server_name: str | None,
    maxsize: int,
) -> urllib3.PoolManager:
    """The pool the official client builds from the same settings (its RESTClientObject):
    files are loaded by urllib3 for each new connection, so a rotated CA file is picked up."""
    kwargs: dict[str, Any] = {
        "cert_reqs": ssl.CERT_REQUIRED if verify else ssl.CERT_NONE,
        "ca_certs": ca_file,
        "cert_file": cert_file,
        "key_file": key_file,
        "ca_cert_data": None,
        "maxsize": maxsize,
    }
    if server_name:
        kwargs["server_hostname"] = server_name
    return urllib3.PoolManager(**kwargs)


class _InlineFiles:
    """Inline kubeconfig data (`certificate-authority-data`, `client-key-data`, ...) as files
    for urllib3, which loads them by name at each new connection: anonymous memory files
    where the system has them (a key never touches a disk), else 0600 files in a private
    folder. They live as long as the connection."""

    def __init__(self) -> None:
        self._fds: list[int] = []
        self._dir: tempfile.TemporaryDirectory[str] | None = None

    def add(self, data: bytes) -> str:
        memfd_create = getattr(os, "memfd_create", None)
        if memfd_create is not None and os.path.isdir("/proc/self/fd"):
            fd = memfd_create("configpin-kubeconfig", os.MFD_CLOEXEC)
            self._fds.append(fd)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            return f"/proc/self/fd/{fd}"
        if self._dir is None:
            self._dir = tempfile.TemporaryDirectory(prefix="configpin-kube-")  # created 0700
        path = Path(self._dir.name) / f"{len(os.listdir(self._dir.name))}.pem"
        path.touch(mode=0o600)
        path.write_bytes(data)
        return str(path)

    def close(self) -> None:
        fds, self._fds = self._fds, []
        for fd in fds:
            os.close(fd)
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None


def _connection(
    host: str,
    pool: urllib3.PoolManager,
    headers: Headers,
    files: _InlineFiles | None = None,
) -> Connection:
    conn = Connection(host, pool, headers, on_close=files.close if files else None)
    if files is not None:
        weakref.finalize(conn, files.close)
    return conn


# ---- in a pod -----------------------------------------------------------------------------------


def _join_host_port(host: str, port: str) -> str:
    return f"[{host}]:{port}" if ":" in host or "%" in host else f"{host}:{port}"


def _in_cluster(maxsize: int) -> Connection:
    host = os.environ.get("KUBERNETES_SERVICE_HOST")
    port = os.environ.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        raise ConfigError("in a pod: KUBERNETES_SERVICE_HOST or KUBERNETES_SERVICE_PORT is empty")
    if _proxied("https"):

        def load(cfg: Any) -> None:
            _official_config().load_incluster_config(client_configuration=cfg)

        return _official(load, maxsize)
    folder = Path(os.environ.get(SERVICE_ACCOUNT_DIR_ENV) or SERVICE_ACCOUNT_DIR)
    token_file, ca_file = folder / "token", folder / "ca.crt"
    if not token_file.is_file():
        raise ConfigError(f"in a pod: no service account token at {token_file}")
    if not ca_file.is_file() or not ca_file.read_bytes():
        raise ConfigError(f"in a pod: no service account CA at {ca_file}")
    token = TokenFile(token_file)
    pool = _pool(
        verify=True,
        ca_file=str(ca_file),
        cert_file=None,
        key_file=None,
        server_name=None,
        maxsize=maxsize,
    )
    return _connection(f"https://{_join_host_port(host, port)}", pool, token.headers)


# ---- a kubeconfig -------------------------------------------------------------------------------


def _named(doc: Mapping[str, Any], section: str, name: object, path: Path) -> Mapping[str, Any]:
    """The entry `name` of a kubeconfig list (`clusters`, `users`, `contexts`): the first one,
    as the official client and kubectl merge them."""
    entries = doc.get(section) or []
    if not isinstance(entries, list):
        raise ConfigError(f"kubeconfig {path}: {section} is not a list")
    for entry in entries:
        if isinstance(entry, dict) and entry.get("name") == name:
            value = entry.get(section.removesuffix("s"))
            return value if isinstance(value, dict) else {}
    raise ConfigError(f"kubeconfig {path}: no {section.removesuffix('s')} named {name!r}")


def _file_or_data(
    entry: Mapping[str, Any], key: str, base: Path, files: _InlineFiles
) -> str | None:
    """`<key>-data` (base64, preferred) as a file, else the file `<key>` relative to `base`."""
    data = entry.get(f"{key}-data")
    if data:
        return files.add(base64.standard_b64decode(str(data)))
    name = entry.get(key)
    if not name:
        return None
    path = os.path.normpath(base / str(name))
    if not os.path.isfile(path):
        raise ConfigError(f"{key}: file does not exist: {path}")
    return path


def _from_kubeconfig(path: Path, maxsize: int) -> Connection:
    import yaml  # noqa: PLC0415 (only here: a server in a pod reads no YAML)

    try:
        with path.open() as f:
            doc = yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # noqa: S506
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"kubeconfig {path}: {e}") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"kubeconfig {path}: not a kubeconfig")
    context = _named(doc, "contexts", doc.get("current-context"), path)
    cluster = _named(doc, "clusters", context.get("cluster"), path)
    user: Mapping[str, Any] = {}
    if context.get("user") and doc.get("users"):
        try:
            user = _named(doc, "users", context["user"], path)
        except ConfigError:
            user = {}  # as the official client: a missing user means no credentials
    server = str(cluster.get("server") or "").rstrip("/")
    if not server:
        raise ConfigError(f"kubeconfig {path}: cluster {context.get('cluster')!r} has no server")
    scheme = server.partition("://")[0].lower()
    if "exec" in user or "auth-provider" in user or "proxy-url" in cluster or _proxied(scheme):

        def load(cfg: Any) -> None:
            _official_config().load_kube_config(config_file=str(path), client_configuration=cfg)

        return _official(load, maxsize)

    base = Path(os.path.abspath(path)).parent  # as the official client: symlinks kept
    files = _InlineFiles()
    try:
        ca_file = cert_file = key_file = None
        if server.startswith("https"):
            ca_file = _file_or_data(cluster, "certificate-authority", base, files)
            cert_file = _file_or_data(user, "client-certificate", base, files)
            key_file = _file_or_data(user, "client-key", base, files)
        headers = _kubeconfig_credentials(user, base)
    except (ConfigError, ValueError, OSError) as e:
        files.close()
        raise ConfigError(f"kubeconfig {path}: {e}") from None
    pool = _pool(
        verify=not cluster.get("insecure-skip-tls-verify", False),
        ca_file=ca_file,
        cert_file=cert_file,
        key_file=key_file,
        server_name=cluster.get("tls-server-name"),
        maxsize=maxsize,
    )
    return _connection(server, pool, headers, files)


def _kubeconfig_credentials(user: Mapping[str, Any], base: Path) -> Headers:
    """The official client's order: a token (inline, else tokenFile), else basic auth."""
    if user.get("token"):
        return _static({"authorization": f"Bearer {user['token']}"})
    if user.get("tokenFile"):
        return TokenFile(Path(os.path.normpath(base / str(user["tokenFile"])))).headers
    if "username" in user and "password" in user:
        return _static(
            urllib3.util.make_headers(basic_auth=f"{user['username']}:{user['password']}")
        )
    return _static({})


# ---- what the official loader does -------------------------------------------------------------


def _proxied(scheme: str) -> bool:
    """Whether the official client would look at a proxy for this scheme (it honours
    `<scheme>_proxy` and `all_proxy` from the environment, and decides about no_proxy)."""
    from urllib.request import getproxies  # noqa: PLC0415

    proxies = getproxies()
    return bool(proxies.get(scheme) or proxies.get("all"))


def _official_config() -> Any:
    from kubernetes import config  # noqa: PLC0415 (the official loader, only when needed)

    return config


def _official(load: Callable[[Any], None], maxsize: int) -> Connection:
    from kubernetes import client  # noqa: PLC0415 (the official client, only when needed)

    cfg = client.Configuration()
    load(cfg)
    cfg.connection_pool_maxsize = max(cfg.connection_pool_maxsize or 4, maxsize)
    log.info("connecting through the official Kubernetes client's loader")
    return Connection.of_api_client(client.ApiClient(cfg))
