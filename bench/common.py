"""What several benchmarks share.

- Trees and child processes: the environment of a child Python that runs the code measured
  (`child_env`: PYTHONPATH picks the tree, e.g. build/compiled), which build of the core it
  imports, another revision's `webhook/` extracted with `git archive`, the control plane's
  binaries.
- Processes, read from /proc: a free port, a process and its children, RSS, CPU seconds.
- The admission payloads of `admission.py` and `hotpath.py`: ten sources, a Deployment with
  ten references, a 20 KiB Pod with four, each as the AdmissionReview the API server sends.
- `configpin serve` (or configpin's app on granian) in a child process, and a small
  keep-alive HTTPS client for it (`connections.py`, `heavy.py`, `fuzz.py`).
- The API server's own request latency, read from its `/metrics` (`refresh.py`, `scale.py`).

Only the standard library and orjson are imported here at start: the servers that
`admission.py` starts import this module too.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from webhook.kube.raw import Kube

REPO = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"

# ---- trees and child processes ----


def child_env(*trees: Path, **extra: str) -> dict[str, str]:
    """This process's environment for a child Python that runs the code measured, with
    `extra` set. Its PYTHONPATH: `trees` if given, else this process's own PYTHONPATH (a
    compiled tree, say: hack/compiled-tree.py), made absolute; then the checkout, where
    `bench` and `harness` are found. Start the child in a folder that holds no `webhook/`
    (a temporary folder, or the tree itself): the folder it starts in comes first on its
    `sys.path`."""
    if trees:
        first = [str(t) for t in trees]
    else:
        given = os.environ.get("PYTHONPATH", "").split(os.pathsep)
        first = [os.path.abspath(p) for p in given if p]
    return {**os.environ, "PYTHONPATH": os.pathsep.join([*first, str(REPO)]), **extra}


def core_build(env: dict[str, str], cwd: Path) -> str:
    """Which build of webhook/core a child Python started with `env` in `cwd` imports."""
    code = "import webhook.core.plan as p; print(p.__file__)"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=cwd, capture_output=True, text=True, check=True
    )
    return "pure Python" if out.stdout.strip().endswith(".py") else "compiled"


def baseline_tree(rev: str, into: Path) -> Path:
    """`rev`'s webhook package, extracted with `git archive` into `into` (run from there
    with this checkout's interpreter and installed dependencies)."""
    into.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", rev, "webhook"],
        capture_output=True,
        check=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def control_plane_assets(version: str) -> Path:
    """The folder of etcd, kube-apiserver and kube-controller-manager: KUBEBUILDER_ASSETS if
    set, else `version` as hack/provision-control-plane.sh provisions and caches it."""
    if os.environ.get("KUBEBUILDER_ASSETS"):
        return Path(os.environ["KUBEBUILDER_ASSETS"])
    out = subprocess.run(
        ["bash", str(REPO / "hack" / "provision-control-plane.sh"), version],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(out.stdout.strip().splitlines()[-1])


# ---- processes ----


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        port: int = s.getsockname()[1]
        return port


def process_tree(pid: int) -> Iterator[int]:
    """`pid` and its descendants that still run (granian serves from a worker process)."""
    yield pid
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        with contextlib.suppress(OSError):
            for child in task.read_text().split():
                yield from process_tree(int(child))


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def tree_rss_kib(pid: int) -> int:
    """RSS of a process and all its descendants (granian serves from a worker process)."""
    total = 0
    for p in process_tree(pid):
        with contextlib.suppress(OSError, RuntimeError):
            total += rss_kib(p)
    return total


def cpu_seconds(markers: tuple[str, ...]) -> Counter[str]:
    """CPU time so far of this process and of the processes whose command line mentions one
    of `markers` (the control plane's and configpin's, found by their temporary paths)."""
    tick = os.sysconf("SC_CLK_TCK")
    out: Counter[str] = Counter()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        text = b" ".join(argv).decode(errors="replace")
        if int(pid) == os.getpid():
            name = "bench (controller)"
        elif any(m in text for m in markers):
            name = "configpin webhook" if "webhook" in text else Path(argv[0].decode()).name
            if "--mode off" in text:
                name += " (mode off)"
        else:
            continue
        out[name] += (int(stat[11]) + int(stat[12])) / tick
    return out


def pct(values: list[float], q: float) -> float:
    """The `q` quantile of `values`, the nearest rank (0.0 for none)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else 0.0


# ---- the admission payloads (admission.py, hotpath.py) ----

NAMESPACE = "bench"
N_CONFIGMAPS = 5
N_SECRETS = 5
DIGEST_KEY = "bench-digest-key-0123456789abcdef\n"


def source_manifests() -> list[dict[str, Any]]:
    """Ten sources of realistic size: five ConfigMaps and five Secrets, a few keys each."""
    objs: list[dict[str, Any]] = []
    for i in range(N_CONFIGMAPS):
        objs.append(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": f"config-{i}", "namespace": NAMESPACE},
                "data": {
                    "app.properties": "\n".join(f"key.{j}=value-{i}-{j}" for j in range(40)),
                    "log.level": "info",
                    "feature-flags": "a=true,b=false,c=true",
                    "endpoint": f"https://service-{i}.{NAMESPACE}.svc:8443",
                },
            }
        )
    for i in range(N_SECRETS):
        objs.append(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": f"secret-{i}", "namespace": NAMESPACE},
                "type": "Opaque",
                "stringData": {
                    "username": f"user-{i}",
                    "password": f"p4ssw0rd-{i}-" + "x" * 24,
                    "token": "t" * 64,
                },
            }
        )
    return objs


def _env_ref(kind: str, name: str, key: str, var: str) -> dict[str, Any]:
    field = "configMapKeyRef" if kind == "cm" else "secretKeyRef"
    return {"name": var, "valueFrom": {field: {"name": name, "key": key}}}


def deployment() -> dict[str, Any]:
    """A Deployment with 10 references to 10 sources, in every place a reference can be."""
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": "shop-frontend",
            "namespace": NAMESPACE,
            "labels": {"app": "shop-frontend", "team": "web"},
            "annotations": {"deployment.kubernetes.io/revision": "3"},
        },
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": {"app": "shop-frontend"}},
            "strategy": {"type": "RollingUpdate"},
            "template": {
                "metadata": {"labels": {"app": "shop-frontend", "team": "web"}},
                "spec": {
                    "serviceAccountName": "shop-frontend",
                    "initContainers": [
                        {
                            "name": "migrate",
                            "image": "registry.example/shop/migrate:1.4.2",
                            "envFrom": [{"secretRef": {"name": "secret-0"}}],
                        }
                    ],
                    "containers": [
                        {
                            "name": "app",
                            "image": "registry.example/shop/frontend:1.4.2",
                            "ports": [{"containerPort": 8080, "name": "http"}],
                            "env": [
                                {"name": "PORT", "value": "8080"},
                                _env_ref("cm", "config-0", "log.level", "LOG_LEVEL"),
                                _env_ref("cm", "config-1", "endpoint", "BACKEND"),
                                _env_ref("secret", "secret-1", "password", "DB_PASSWORD"),
                            ],
                            "envFrom": [{"configMapRef": {"name": "config-2"}}],
                            "resources": {
                                "requests": {"cpu": "100m", "memory": "128Mi"},
                                "limits": {"memory": "256Mi"},
                            },
                            "volumeMounts": [
                                {"name": "config", "mountPath": "/etc/app"},
                                {"name": "tls", "mountPath": "/etc/tls"},
                                {"name": "bundle", "mountPath": "/etc/bundle"},
                            ],
                        }
                    ],
                    "volumes": [
                        {
                            "name": "config",
                            "configMap": {
                                "name": "config-3",
                                "items": [{"key": "app.properties", "path": "app.properties"}],
                            },
                        },
                        {"name": "tls", "secret": {"secretName": "secret-2"}},
                        {
                            "name": "bundle",
                            "projected": {
                                "sources": [
                                    {"configMap": {"name": "config-4"}},
                                    {"secret": {"name": "secret-3"}},
                                    {
                                        "secret": {
                                            "name": "secret-4",
                                            "items": [{"key": "token", "path": "token"}],
                                        }
                                    },
                                ]
                            },
                        },
                    ],
                },
            },
        },
    }


def big_pod(target: int = 20_000) -> dict[str, Any]:
    """A bare Pod of about `target` bytes of JSON: many env values, labels, a large
    last-applied-configuration annotation, three containers; four references."""
    containers: list[dict[str, Any]] = []
    for c in range(3):
        env: list[dict[str, Any]] = [
            {"name": f"SETTING_{c}_{j}", "value": f"value-{c}-{j}-" + "v" * 20} for j in range(50)
        ]
        containers.append(
            {
                "name": f"c{c}",
                "image": f"registry.example/team/component-{c}:2.3.{c}",
                "args": ["--config=/etc/app/app.properties", "--verbose"],
                "env": env,
                "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}},
            }
        )
    containers[0]["env"].append(_env_ref("cm", "config-0", "log.level", "LOG_LEVEL"))
    containers[1]["envFrom"] = [{"secretRef": {"name": "secret-1"}}]
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "batch-runner",
            "namespace": NAMESPACE,
            "labels": {f"label-{i}": f"value-{i}" for i in range(20)},
            "annotations": {},
        },
        "spec": {
            "containers": containers,
            "volumes": [
                {"name": "config", "configMap": {"name": "config-3"}},
                {"name": "creds", "secret": {"secretName": "secret-2"}},
            ],
        },
    }
    filler = len(orjson.dumps(pod))
    pod["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"] = "x" * max(
        0, target - filler - 200
    )
    return pod


def admission_review(obj: dict[str, Any], uid: str) -> bytes:
    api = str(obj["apiVersion"])
    group, _, version = api.rpartition("/")
    kind = str(obj["kind"])
    return orjson.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": uid,
                "kind": {"group": group, "version": version, "kind": kind},
                "resource": {"group": group, "version": version, "resource": kind.lower() + "s"},
                "requestKind": {"group": group, "version": version, "kind": kind},
                "requestResource": {
                    "group": group,
                    "version": version,
                    "resource": kind.lower() + "s",
                },
                "name": obj["metadata"]["name"],
                "namespace": NAMESPACE,
                "operation": "CREATE",
                "userInfo": {
                    "username": "system:serviceaccount:kube-system:deployment-controller",
                    "uid": "5f0c1a8e-1b9d-4a53-9a2e-9d3f1c0f6b7a",
                    "groups": ["system:serviceaccounts", "system:authenticated"],
                },
                "object": obj,
                "oldObject": None,
                "dryRun": False,
                "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
            },
        }
    )


def deployment_review(
    obj: dict[str, Any],
    uid: str,
    *,
    namespace: str,
    name: str | None = None,
    old: dict[str, Any] | None = None,
) -> bytes:
    """The AdmissionReview of Deployment `obj` by user `bench`, of a CREATE or, with `old`, an
    UPDATE (the short form heavy and snapshot post; admission_review is the API server's)."""
    request = {
        "uid": uid,
        "kind": {"group": "apps", "version": "v1", "kind": "Deployment"},
        "resource": {"group": "apps", "version": "v1", "resource": "deployments"},
        **({} if name is None else {"name": name}),
        "namespace": namespace,
        "operation": "UPDATE" if old else "CREATE",
        "userInfo": {"username": "bench"},
        "object": obj,
        "oldObject": old,
        "dryRun": False,
    }
    return orjson.dumps(
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
    )


def write_server_files(folder: Path) -> bytes:
    """What a server of `admission.py` reads, written into `folder`: development
    certificates (certs/), the ten sources (sources/sources.yaml) and a digest key
    (digest.key). Returns the CA certificate (PEM)."""
    import yaml

    from webhook.tls import certgen, certs

    bundle = certgen.generate("configpin", "configpin")
    certs.write_bundle(bundle, folder / "certs")
    (folder / "sources").mkdir(exist_ok=True)
    (folder / "sources" / "sources.yaml").write_text(yaml.safe_dump_all(source_manifests()))
    (folder / "digest.key").write_text(DIGEST_KEY)
    return bundle.ca_cert_pem


def granian_cmd(
    port: int, certs: Path, factory: str, folder: Path, extra: Sequence[str] = ()
) -> list[str]:
    """granian serving `bench.admission`'s app `factory` (`allow_all_app`, or
    `configpin_app_from_env`: BENCH_MANIFESTS and BENCH_KEY_FILE in its environment) with its
    own TLS and uvloop. Run it in `folder` (its working directory, first on its sys.path),
    with `child_env()`: the app is then imported from PYTHONPATH."""
    return [
        sys.executable,
        "-m",
        "granian",
        "--interface",
        "asgi",
        "--factory",
        "--host",
        HOST,
        "--port",
        str(port),
        "--ssl-certificate",
        str(certs / "tls.crt"),
        "--ssl-keyfile",
        str(certs / "tls.key"),
        "--loop",
        "uvloop",
        "--no-ws",
        *extra,
        "--working-dir",
        str(folder),
        f"bench.admission:{factory}",
    ]


# ---- configpin serve in a child process, and a client for it (connections, heavy, fuzz) ----


class Server:
    """`configpin serve` with no cluster (the embedded default sources, development
    certificates in `tmp`), started through `bench._serve` on the stack `args.http` and
    `args.loop` pick (default: its own); or, with `args.server == "granian"`, configpin's
    app on granian (the files of `write_server_files(tmp)` first)."""

    def __init__(self, tmp: Path, args: argparse.Namespace, extra: list[str]) -> None:
        self.port = free_port()
        self.log = tmp / f"server-{self.port}.log"
        env = child_env(PYTHONUNBUFFERED="1")
        env = {k: v for k, v in env.items() if not k.startswith("CONFIGPIN_")}
        env.pop("KUBECONFIG", None)
        if getattr(args, "server", "configpin") == "granian":
            # HTTP/1 (what the API server speaks to a webhook) and configpin's header timeout
            more = ["--http", "1", "--http1-header-read-timeout", "5000", "--log-level", "info"]
            cmd = granian_cmd(self.port, tmp / "certs", "configpin_app_from_env", tmp, more)
            env.update(BENCH_MANIFESTS=str(tmp / "sources"), BENCH_KEY_FILE=str(tmp / "digest.key"))
        else:
            cmd = [sys.executable, "-m", "bench._serve"]
            if args.http:
                cmd += ["--http", args.http]
            if args.loop:
                cmd += ["--loop", args.loop]
            cmd += ["--", "serve", "--host", HOST, "--port", str(self.port)]
            cmd += ["--certs-dir", str(tmp / "certs"), "--log-level", "info", *extra]
        with self.log.open("wb") as fh:
            self.proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=tmp)
        self.ctx = ssl.create_default_context()
        self.ctx.check_hostname = False
        self.ctx.verify_mode = ssl.CERT_NONE
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"server exited early:\n{self.log.read_text()}")
            with contextlib.suppress(OSError):
                if self.get("/readyz").startswith(b"HTTP/1.1 200"):
                    return
            time.sleep(0.1)
        raise SystemExit(f"server not ready in time:\n{self.log.read_text()}")

    def get(self, path: str, extra: bytes = b"", timeout: float = 5.0) -> bytes:
        request = f"GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n".encode()
        with (
            socket.create_connection((HOST, self.port), timeout=timeout) as sock,
            self.ctx.wrap_socket(sock) as tls,
        ):
            tls.sendall(request + extra + b"\r\n")
            out = b""
            with contextlib.suppress(OSError):
                while chunk := tls.recv(65536):
                    out += chunk
            return out

    def rss(self) -> int:
        return tree_rss_kib(self.proc.pid)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


async def open_connection(server: Server) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection(HOST, server.port, ssl=server.ctx, server_hostname="x")


def post_mutate(body: bytes) -> bytes:
    """A POST of `body` to /mutate, as one HTTP/1.1 request."""
    return (
        b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )


async def exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, raw: bytes) -> bytes:
    """Send one request, read its answer's body; RuntimeError(its head) if it is not a 200."""
    writer.write(raw)
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    body = await reader.readexactly(length)
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(head[:40])
    return body


class Pool:
    """Keep-alive connections handed out one request at a time."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.free: list[Any] = []

    async def request(self, raw: bytes) -> bytes:
        conn = self.free.pop() if self.free else await open_connection(self.server)
        try:
            out = await exchange(*conn, raw)
        except BaseException:
            conn[1].close()
            raise
        self.free.append(conn)
        return out


# ---- the API server's request latency (refresh, scale) ----

Buckets = dict[tuple[str, str], Counter[float]]  # (verb, resource) -> le -> cumulative count
_SKIP_VERBS = frozenset({"WATCH", "CONNECT"})


def server_histogram(kube: Kube) -> tuple[Buckets, Counter[tuple[str, str]]]:
    """apiserver_request_duration_seconds, by (verb, resource): buckets and sums."""
    from prometheus_client.parser import text_string_to_metric_families

    resp = kube.open("GET", "/metrics")
    try:
        text = resp.read().decode()
    finally:
        resp.release_conn()
    buckets: Buckets = {}
    sums: Counter[tuple[str, str]] = Counter()
    for family in text_string_to_metric_families(text):
        if family.name != "apiserver_request_duration_seconds":
            continue
        for s in family.samples:
            key = (s.labels.get("verb", ""), s.labels.get("resource", ""))
            if s.name.endswith("_bucket"):
                buckets.setdefault(key, Counter())[float(s.labels["le"])] += s.value
            elif s.name.endswith("_sum"):
                sums[key] += s.value
    return buckets, sums


def quantile(cumulative: Counter[float], q: float) -> float:
    """histogram_quantile over cumulative bucket counts (linear within a bucket)."""
    edges = sorted(cumulative)
    total = cumulative[edges[-1]] if edges else 0
    if not total:
        return 0.0
    rank, prev_edge, prev_count = q * total, 0.0, 0.0
    for edge in edges:
        count = cumulative[edge]
        if count >= rank:
            if edge == float("inf"):
                return prev_edge
            span = count - prev_count
            return prev_edge + (edge - prev_edge) * ((rank - prev_count) / span if span else 1)
        prev_edge, prev_count = edge, count
    return prev_edge


def served(
    before: tuple[Buckets, Counter[tuple[str, str]]],
    after: tuple[Buckets, Counter[tuple[str, str]]],
    only: tuple[str, str] | None = None,
) -> dict[str, float]:
    """Requests served between two reads: count, mean, p50, p99 (seconds)."""
    merged: Counter[float] = Counter()
    total_sum = 0.0
    for key, buckets in after[0].items():
        if (only is not None and key != only) or (only is None and key[0] in _SKIP_VERBS):
            continue
        merged.update(buckets)
        merged.subtract(before[0].get(key, Counter()))
        total_sum += after[1][key] - before[1][key]
    count = merged[float("inf")]
    return {
        "count": count,
        "mean": total_sum / count if count else 0.0,
        "p50": quantile(merged, 0.5),
        "p99": quantile(merged, 0.99),
    }
