"""`kubectl configpin dashboard` as a user starts it: the plugin on PATH, a kubeconfig, a
namespace; the URL it prints; stopped with Ctrl-C (SIGINT). And a view-only user's kubeconfig."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from harness.controlplane import ControlPlane, service_account_kubeconfig
from webhook.kube.raw import Kube, path


@dataclass
class Dashboard:
    url: str  # "http://localhost:PORT/"
    port: int
    proc: subprocess.Popen[str]
    output: list[str]

    def log(self) -> str:
        return "".join(self.output)


@contextlib.contextmanager
def running_dashboard(
    kubeconfig: Path, namespace: str, *args: str, timeout: float = 60.0
) -> Iterator[Dashboard]:
    """The dashboard of `namespace` with `kubeconfig`'s user, on a free port."""
    plugin = str(Path(sys.executable).parent / "kubectl-configpin")
    argv: Sequence[str] = [plugin, "dashboard", "--port", "0", "-n", namespace, *args]
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    output: list[str] = []
    found = threading.Event()
    url: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            output.append(line)
            if not url and line.startswith("configpin dashboard: http://"):
                url.append(line.split()[2])
                found.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + timeout
    while not found.wait(0.2):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"the dashboard did not start: {''.join(output)}")
    port = int(url[0].rstrip("/").rsplit(":", 1)[1])
    try:
        yield Dashboard(url[0], port, proc, output)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        reader.join(5)
        if proc.stdout is not None:
            proc.stdout.close()


def viewer_kubeconfig(plane: ControlPlane, kube: Kube, ns: str, tmp: Path) -> Path:
    """A kubeconfig of ServiceAccount `viewer` of `ns`: it may read what the dashboard shows
    (get, list, watch; ConfigRollouts as the chart's aggregated view role grants) and update
    nothing. Its user is named `viewer` in it."""
    kube.create(path("serviceaccounts", ns), {"metadata": {"name": "viewer"}})
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    read = ["get", "list", "watch"]
    rules = [
        {"apiGroups": [""], "resources": ["configmaps", "secrets", "events"], "verbs": read},
        {"apiGroups": [""], "resources": ["replicationcontrollers"], "verbs": read},
        {
            "apiGroups": ["apps"],
            "resources": ["deployments", "statefulsets", "daemonsets", "replicasets"],
            "verbs": read,
        },
        {"apiGroups": ["batch"], "resources": ["jobs", "cronjobs"], "verbs": read},
        {"apiGroups": ["configpin.io"], "resources": ["configrollouts"], "verbs": read},
    ]
    kube.create(f"{rbac}/namespaces/{ns}/roles", {"metadata": {"name": "viewer"}, "rules": rules})
    kube.create(
        f"{rbac}/namespaces/{ns}/rolebindings",
        {
            "metadata": {"name": "viewer"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "viewer"},
            "subjects": [{"kind": "ServiceAccount", "name": "viewer", "namespace": ns}],
        },
    )
    out = service_account_kubeconfig(plane, kube.api, ns, "viewer", tmp / "viewer.kubeconfig")
    # its user named as a person would name it (the harness names every user admin): the page
    # says this name where the API server answers no SelfSubjectReview (1.20)
    doc = yaml.safe_load(out.read_text())
    doc["users"][0]["name"] = "viewer"
    for context in doc["contexts"]:
        context["context"]["user"] = "viewer"
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    return out
