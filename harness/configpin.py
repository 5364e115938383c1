"""configpin itself, run as `python -m webhook serve` against the test control plane.

Each instance gets its own serving certificate, port and (optionally) its own webhook
configuration. Instances that must not see each other's namespaces (a test that stops and
starts its own configpin while the session's instance runs) use an `instance` label: the
instance's webhook and controller act only in namespaces carrying its value.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from harness.controlplane import (
    ENABLED_LABEL,
    ControlPlane,
    default_service_account_ready,
    free_port,
    register_webhook,
    unregister_webhook,
    wait_for,
)
from webhook.kube.client import SERVICE_ACCOUNT_DIR_ENV
from webhook.tls.certgen import generate
from webhook.tls.certs import write_bundle

CONFIGPIN_NAMESPACE = "configpin-system"
INSTANCE_LABEL = "test.configpin.io/instance"
# Not resolved: in the compiled tree (hack/compiled-tree.py) harness/ is a link, and configpin
# must run from that tree, whose `webhook` is the compiled wheel.
REPO = Path(__file__).absolute().parents[1]


@dataclass
class Configpin:
    proc: subprocess.Popen[bytes]
    port: int
    ca_pem: bytes
    ca_file: Path
    log_path: Path
    webhook_name: str | None = None
    verify: bool = True
    client_cert: tuple[Path, Path] | None = None  # presented when it runs with --client-ca
    _ctx: ssl.SSLContext | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def _context(self) -> ssl.SSLContext:
        if self._ctx is None:
            self._ctx = ssl.create_default_context(cafile=str(self.ca_file))
            if not self.verify:
                # configpin serves a certificate of its own making (--self-signed-certs)
                self._ctx.check_hostname = False
                self._ctx.verify_mode = ssl.CERT_NONE
            if self.client_cert is not None:
                self._ctx.load_cert_chain(*self.client_cert)
        return self._ctx

    def get(self, route: str, timeout: float = 5.0) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(
                self.url + route, context=self._context(), timeout=timeout
            ) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            body = e.read().decode()
            e.close()
            return e.code, body

    def metric(self, name: str, **labels: str) -> float:
        """The sum of a metric's samples whose labels include `labels` (0 if none)."""
        _, text = self.get("/metrics")
        return sum(
            sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == name and labels.items() <= sample.labels.items()
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


def ensure_namespace(api: client.ApiClient, name: str = CONFIGPIN_NAMESPACE) -> None:
    core = client.CoreV1Api(api)
    try:
        core.create_namespace(client.V1Namespace.model_validate({"metadata": {"name": name}}))
    except client.ApiException as e:
        if e.status != 409:
            raise


def lease_name(instance: str | None) -> str:
    """The leader election Lease (in CONFIGPIN_NAMESPACE) of a configpin of `instance`."""
    return f"configpin-leader-{instance or 'session'}"


PORT_ATTEMPTS = 3


def _wait_ready(cp: Configpin, timeout: float, *, last: bool) -> bool:
    """True once `cp` says ready; False if it exited because its port was taken meanwhile
    (unless `last`); raises if it exits otherwise or is not ready within `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        if cp.proc.poll() is not None:
            log = cp.log()
            if not last and "address already in use" in log:
                return False
            raise RuntimeError(f"configpin exited with {cp.proc.returncode}:\n{log[-4000:]}")
        with contextlib.suppress(OSError):
            if cp.get("/readyz", timeout=2)[0] == 200:
                return True
        if time.monotonic() > deadline:
            cp.stop()
            raise RuntimeError(f"configpin not ready after {timeout}s:\n{cp.log()[-4000:]}")
        time.sleep(0.1)


def start_configpin(
    plane: ControlPlane,
    workdir: Path,
    *,
    args: Sequence[str] = (),
    instance: str | None = None,
    webhook_name: str | None = None,
    failure_policy: str = "Ignore",
    ready_timeout: float = 60.0,
    env: dict[str, str] | None = None,
    verify: bool = True,
    client_cert: tuple[Path, Path] | None = None,
    chart_values: Mapping[str, Any] | None = None,
    service_account_dir: Path | None = None,
    repo: Path = REPO,
) -> Configpin:
    """Start one configpin process; wait until /readyz says ready; register its webhook.

    With `service_account_dir` (a `token` and `ca.crt`) it connects as in a pod, from
    KUBERNETES_SERVICE_HOST/PORT and that folder, instead of the control plane's kubeconfig.
    `repo`: the source tree it runs from (a benchmark's baseline revision)."""
    workdir.mkdir(parents=True, exist_ok=True)
    certs = workdir / "certs"
    write_bundle(generate("configpin", CONFIGPIN_NAMESPACE), certs)
    selector = f"{ENABLED_LABEL}=true," + (
        f"{INSTANCE_LABEL}={instance}" if instance else f"!{INSTANCE_LABEL}"
    )
    child_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    child_env.pop("KUBECONFIG", None)
    if service_account_dir is not None:
        api_host, _, api_port = plane.host.removeprefix("https://").rpartition(":")
        child_env |= {
            "KUBERNETES_SERVICE_HOST": api_host,
            "KUBERNETES_SERVICE_PORT": api_port,
            SERVICE_ACCOUNT_DIR_ENV: str(service_account_dir),
        }
    # A port that was free a moment ago may be taken before configpin binds it (by another
    # suite's process on this machine: make test runs the integration suites side by side):
    # then it is started again on another.
    for attempt in range(1, PORT_ATTEMPTS + 1):
        port = free_port()
        cmd = [
            sys.executable, "-m", "webhook", "serve",
            "--host", "127.0.0.1", "--port", str(port),
            "--tls-cert", str(certs / "tls.crt"), "--tls-key", str(certs / "tls.key"),
            "--certs-dir", str(certs),
            *(["--kubeconfig", str(plane.kubeconfig)] if service_account_dir is None else []),
            "--namespace", CONFIGPIN_NAMESPACE,
            "--namespace-selector", selector,
            "--shutdown-delay", "0", "--drain-timeout", "5",
            # instances in one test run must not wait on each other's leader lease
            "--lease-name", lease_name(instance),
            *args,
        ]  # fmt: skip
        log_path = workdir / f"configpin-{port}.log"
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, cwd=repo, env=child_env
            )
        cp = Configpin(
            proc,
            port,
            (certs / "ca.crt").read_bytes(),
            certs / "ca.crt",
            log_path,
            verify=verify,
            client_cert=client_cert,
        )
        if _wait_ready(cp, ready_timeout, last=attempt == PORT_ATTEMPTS):
            break
    if webhook_name:
        with plane.api_client() as api:
            match: list[dict[str, object]] = [
                {"key": INSTANCE_LABEL, "operator": "DoesNotExist"}
                if instance is None
                else {"key": INSTANCE_LABEL, "operator": "In", "values": [instance]}
            ]
            register_webhook(
                api,
                webhook_name,
                cp.url,
                cp.ca_pem,
                failure_policy=failure_policy,
                namespace_expressions=match,
                chart_values=chart_values,
            )
        cp.webhook_name = webhook_name
        time.sleep(1.0)  # the API server picks webhook configurations up through an informer
    return cp


@contextlib.contextmanager
def running_configpin(plane: ControlPlane, workdir: Path, **kwargs: object) -> Iterator[Configpin]:
    cp = start_configpin(plane, workdir, **kwargs)  # type: ignore[arg-type]
    try:
        yield cp
    finally:
        cp.stop()
        if cp.webhook_name:
            with plane.api_client() as api:
                unregister_webhook(api, cp.webhook_name)


@contextlib.contextmanager
def leading_configpin(
    plane: ControlPlane,
    workdir: Path,
    *,
    instance: str,
    webhook_name: str | None = None,
    args: Sequence[str] = (),
    chart_values: Mapping[str, Any] | None = None,
) -> Iterator[Configpin]:
    """A configpin of `instance` (its own Lease, `lease_name(instance)`), yielded once it
    leads; stopped and its webhook unregistered on the way out. `chart_values`: the chart
    values its webhook is rendered with (as `helm install` would)."""
    with plane.api_client() as api:
        ensure_namespace(api)
    with running_configpin(
        plane,
        workdir,
        args=args,
        instance=instance,
        webhook_name=webhook_name,
        chart_values=chart_values,
    ) as cp:
        wait_for(lambda: cp.metric("configpin_leader") == 1, what=f"configpin {instance} leading")
        yield cp


@contextlib.contextmanager
def instance_namespace(
    api: client.ApiClient,
    instance: str,
    prefix: str,
    annotations: Mapping[str, str] | None = None,
) -> Iterator[str]:
    """A fresh namespace opted in for the configpin of `instance` only (its instance label),
    with `annotations` from its creation (its rollout windows: in force before any workload
    of it exists), ready for pods; deleted on the way out."""
    core = client.CoreV1Api(api)
    name = f"{prefix}-{secrets.token_hex(4)}"
    labels = {ENABLED_LABEL: "true", INSTANCE_LABEL: instance}
    meta = {"name": name, "labels": labels, "annotations": dict(annotations or {})}
    core.create_namespace({"metadata": meta})
    try:
        wait_for(lambda: default_service_account_ready(api, name), what=f"{name}'s default SA")
        yield name
    finally:
        core.delete_namespace(name)
