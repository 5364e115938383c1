"""What a newcomer does first, for the tests that do it too: the README's two commands as the
README writes them, a configpin server they start with no cluster, and a review sent to it.

The commands are read from the README itself (its first ``sh`` block), so a test that runs them
changes when the README does. The server is started with its settings in the environment only
(a free port, a folder of its own for the development certificates and key, no shutdown
delay): the command line stays the README's.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
import uuid
import venv
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonpatch

from harness.controlplane import free_port

SH_BLOCK = re.compile(r"^```sh\n(.*?)^```", re.M | re.S)
# Where a cluster could come from, and settings a shell may carry: none reach the server
# unless the test puts them there.
CLUSTER_ENV = ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT")


def readme_commands(readme: Path) -> list[str]:
    """The commands of the README's first ``sh`` block, comments cut, in order."""
    match = SH_BLOCK.search(readme.read_text())
    assert match, f"{readme.name} has no sh block"
    lines = (line.split("#", 1)[0].strip() for line in match[1].splitlines())
    return [line for line in lines if line]


def clean_env(home: Path, **extra: str) -> dict[str, str]:
    """The environment of a fresh shell on this machine: no cluster configured, a HOME
    without ~/.kube, no CONFIGPIN_ setting; then `extra`."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in CLUSTER_ENV and not k.startswith(("CONFIGPIN_", "PYTEST_"))
    }
    env["HOME"] = str(home)
    return {**env, **extra}


@dataclass
class Served:
    """A server started by a command, on 127.0.0.1:`port`, in its own process group."""

    proc: subprocess.Popen[bytes]
    port: int
    log: Path
    certs: Path

    def url(self, route: str) -> str:
        return f"https://127.0.0.1:{self.port}{route}"

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def _tls() -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # its development certificate, made as it started
    return ctx


def get(served: Served, route: str, timeout: float = 5.0) -> tuple[int, bytes]:
    with urllib.request.urlopen(served.url(route), context=_tls(), timeout=timeout) as resp:
        return resp.status, resp.read()


def post_review(served: Served, review: Mapping[str, Any]) -> dict[str, Any]:
    """The AdmissionReview's answer, as the API server would get it."""
    request = urllib.request.Request(
        served.url("/mutate"),
        data=json.dumps(review).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, context=_tls(), timeout=10) as resp:
        answer: dict[str, Any] = json.loads(resp.read())
    return answer


@contextlib.contextmanager
def serving(
    argv: Sequence[str] | str,
    *,
    cwd: Path,
    workdir: Path,
    env: Mapping[str, str] | None = None,
    timeout: float = 120.0,
) -> Iterator[Served]:
    """Run `argv` (a shell command line when a str) with a fresh shell's environment plus
    `env`, and the server's port and certificate folder set through CONFIGPIN_PORT and
    CONFIGPIN_CERTS_DIR; yield once /readyz answers 200; stop its process group after."""
    port = free_port()
    certs = workdir / "certs"
    home = workdir / "home"
    home.mkdir(parents=True, exist_ok=True)
    log = workdir / f"serve-{port}.log"
    child_env = clean_env(
        home,
        CONFIGPIN_PORT=str(port),
        CONFIGPIN_CERTS_DIR=str(certs),
        CONFIGPIN_SHUTDOWN_DELAY="0",
        PYTHONUNBUFFERED="1",
        **(env or {}),
    )
    shell = isinstance(argv, str)
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv,
            shell=shell,
            executable="/bin/bash" if shell else None,
            cwd=cwd,
            env=child_env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    served = Served(proc, port, log, certs)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise AssertionError(
                    f"{argv!r} exited ({proc.returncode}) before serving:\n{served.output()}"
                )
            with contextlib.suppress(OSError):
                if get(served, "/readyz", timeout=2)[0] == 200:
                    break
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{argv!r} did not serve in {timeout:.0f}s:\n{served.output()}"
                )
            time.sleep(0.2)
        yield served
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def listening_addresses(port: int) -> set[str]:
    """The local addresses of every socket listening on TCP `port` on this machine (IPv4 and
    IPv6, from /proc/net): {"127.0.0.1"} for a server on loopback only."""
    found: set[str] = set()
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        with contextlib.suppress(FileNotFoundError), open(table) as fh:
            next(fh)
            for line in fh:
                fields = line.split()
                local, state = fields[1], fields[3]
                address, _, port_hex = local.partition(":")
                if state != "0A" or int(port_hex, 16) != port:  # 0A: LISTEN
                    continue
                raw = bytes.fromhex(address)
                # /proc prints each 32-bit word in host (little-endian) order
                words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
                found.add(socket.inet_ntop(family, words))
    return found


# ---- a review of a Deployment that consumes the embedded default sources --------------------

EMBEDDED_CONSUMER_SOURCES = ("configmap/app-config", "secret/app-secret")


def embedded_consumer(namespace: str = "default") -> dict[str, Any]:
    """A Deployment reading the embedded default's ConfigMap (one key, as env) and Secret (as a
    volume): webhook/embedded/sources.yaml."""
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "app", "namespace": namespace},
        "spec": {
            "selector": {"matchLabels": {"app": "app"}},
            "template": {
                "metadata": {"labels": {"app": "app"}},
                "spec": {
                    "containers": [
                        {
                            "name": "app",
                            "image": "app:1",
                            "env": [
                                {
                                    "name": "APP_PROPERTIES",
                                    "valueFrom": {
                                        "configMapKeyRef": {
                                            "name": "app-config",
                                            "key": "app.properties",
                                        }
                                    },
                                }
                            ],
                            "volumeMounts": [{"name": "token", "mountPath": "/etc/token"}],
                        }
                    ],
                    "volumes": [{"name": "token", "secret": {"secretName": "app-secret"}}],
                },
            },
        },
    }


def create_review(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The AdmissionReview (admission.k8s.io/v1) the API server sends for a create of `obj`."""
    group, _, version = str(obj["apiVersion"]).rpartition("/")
    meta = obj["metadata"]
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": group, "version": version, "kind": obj["kind"]},
            "resource": {"group": group, "version": version, "resource": "deployments"},
            "requestKind": {"group": group, "version": version, "kind": obj["kind"]},
            "requestResource": {"group": group, "version": version, "resource": "deployments"},
            "name": meta["name"],
            "namespace": meta.get("namespace"),
            "operation": "CREATE",
            "userInfo": {"username": "newcomer", "groups": ["system:authenticated"]},
            "object": obj,
            "oldObject": None,
            "dryRun": False,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }


def patched(answer: Mapping[str, Any], obj: Mapping[str, Any]) -> dict[str, Any]:
    """`obj` with the answer's JSONPatch applied (asserting it was allowed, with a patch)."""
    response = answer["response"]
    assert response["allowed"] is True, response
    assert response.get("patchType") == "JSONPatch", response
    ops = json.loads(base64.b64decode(response["patch"]))
    result: dict[str, Any] = jsonpatch.apply_patch(obj, ops)
    return result


REPO = Path(__file__).resolve().parents[1]


def build_wheel(out: Path, *, compile: str | None = None) -> Path:
    """configpin's wheel (as `pip install .` builds it: its core compiled where mypyc and a C
    compiler are found; `compile` sets CONFIGPIN_COMPILE, "0" for the pure-Python wheel a
    release publishes), from a copy of what the build reads, so that no build output lands in
    the checkout (out/src: the sdist is built from it too, hack/dist.py)."""
    src = out / "src"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(REPO / name, src / name)
    shutil.copytree(REPO / "webhook", src / "webhook", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(
        [
            sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
            "--wheel-dir", str(out / "wheels"), str(src),
        ],
        check=True, env={
            **{k: v for k, v in os.environ.items() if k != "CONFIGPIN_COMPILE"},
            **({"CONFIGPIN_COMPILE": compile} if compile is not None else {}),
        },
    )  # fmt: skip
    (wheel,) = (out / "wheels").glob("configpin-*.whl")
    return wheel


def lock_constraints(out: Path) -> Path:
    """The lock's exact versions (requirements.lock) as a constraints file, as `make` writes
    it: pip then resolves what a wheel and its extras need, at those versions."""
    lines = []
    for line in (REPO / "requirements.lock").read_text().splitlines():
        if line[:1].isalnum() and "==" in line:
            lines.append(line.split(" \\")[0].strip())
    path = out / "constraints.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


def fresh_venv(where: Path, *requirements: str, constraints: Path | None = None) -> Path:
    """A new venv at `where` with `requirements` installed by pip (resolved, at the lock's
    versions where `constraints` is given); its bin folder."""
    venv.EnvBuilder(with_pip=True).create(where)
    pip = [str(where / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", "-q"]
    extra = ["-c", str(constraints)] if constraints is not None else []
    subprocess.run([*pip, "install", *extra, *requirements], check=True)
    return where / "bin"
