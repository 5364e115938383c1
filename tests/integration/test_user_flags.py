"""kubectl's flags on the commands that act as the user, against the real API server:
`--as` (and `--as-group`) make the API server answer with that user's rights, so what they may
not do is refused, and what a group they are given may do is allowed; a user who may not
impersonate is refused; `--request-timeout` is told to the API server (both versions take it,
on lists and on the dry runs), and a request the server does not answer in time is given up
after it. `configpin version` reads the API server's version, and says what it may not read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from kubernetes import client

from harness.controlplane import ControlPlane, server_minor, service_account_kubeconfig
from harness.manifests import configmap, deployment
from tests.integration.holdproxy import hold_proxy
from webhook.kube.raw import Kube, path

BIN = Path(sys.executable).parent
RBAC = "/apis/rbac.authorization.k8s.io/v1"
READ = ["get", "list", "watch"]


def _run(*args: str, kubeconfig: Path, timeout: float = 60) -> tuple[int, str, str, float]:
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    start = time.monotonic()
    proc = subprocess.run(
        [str(BIN / "kubectl-configpin"), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        check=False,
    )
    return proc.returncode, proc.stdout, proc.stderr, time.monotonic() - start


def _readers(kube: Kube, ns: str, group: str) -> None:
    """Group `group` may read the workloads in `ns` (the kinds status lists), nothing more."""
    kube.create(
        f"{RBAC}/namespaces/{ns}/roles",
        {
            "metadata": {"name": "readers"},
            "rules": [
                {"apiGroups": [""], "resources": ["replicationcontrollers", "pods"], "verbs": READ},
                {
                    "apiGroups": ["apps"],
                    "resources": ["deployments", "statefulsets", "daemonsets", "replicasets"],
                    "verbs": READ,
                },
                {"apiGroups": ["batch"], "resources": ["jobs", "cronjobs"], "verbs": READ},
                {"apiGroups": ["argoproj.io"], "resources": ["rollouts"], "verbs": READ},
            ],
        },
    )
    kube.create(
        f"{RBAC}/namespaces/{ns}/rolebindings",
        {
            "metadata": {"name": "readers"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "readers"},
            "subjects": [{"kind": "Group", "name": group, "apiGroup": "rbac.authorization.k8s.io"}],
        },
    )


def test_as_acts_with_that_users_rights_and_no_more(
    control_plane: ControlPlane, k8s: client.ApiClient, plain_namespace: str, tmp_path: Path
) -> None:
    ns = plain_namespace
    kube = Kube(k8s)
    admin = control_plane.kubeconfig  # system:masters: may impersonate anyone
    group = f"readers-{ns}"
    _readers(kube, ns, group)
    kube.create(path("serviceaccounts", ns), {"metadata": {"name": "nobody"}})
    kube.create(path("configmaps", ns), configmap("web", {"a": "1"}))

    # as the admin: allowed
    code, _, err, _ = _run("status", "-n", ns, kubeconfig=admin)
    assert code == 0, err
    # as a service account with no rights: refused by the API server, naming it
    account = f"system:serviceaccount:{ns}:nobody"
    code, out, err, _ = _run("status", "-n", ns, "--as", account, kubeconfig=admin)
    assert code == 2, out + err
    assert f'User "{account}" cannot list resource "deployments"' in err
    # approve, as it: refused (a patch, then the read of a replace), the ConfigMap as it was
    argv = ["approve", "configmap/web", "-n", ns, "--as", account]
    code, out, err, _ = _run(*argv, kubeconfig=admin)
    assert code == 2, out + err
    assert f'User "{account}" cannot get resource "configmaps"' in err
    annotations = kube.get(path("configmaps", ns, "web"))["metadata"].get("annotations") or {}
    assert annotations == {}

    # a user alone may not read; as a member of the group the Role is bound to, they may
    code, out, err, _ = _run("status", "-n", ns, "--as", "jane", kubeconfig=admin)
    assert code == 2 and 'User "jane" cannot list' in err, out + err
    argv = ["status", "-n", ns, "--as", "jane", "--as-group", "other", "--as-group", group]
    code, out, err, _ = _run(*argv, kubeconfig=admin)
    assert code == 0, out + err
    assert "No workloads found" in err

    # a user who may not impersonate is refused by the API server, whatever they ask to be
    kube.create(path("serviceaccounts", ns), {"metadata": {"name": "plain"}})
    plain = service_account_kubeconfig(control_plane, k8s, ns, "plain", tmp_path / "plain")
    code, out, err, _ = _run("status", "-n", ns, "--as", "admin", kubeconfig=plain)
    assert code == 2, out + err
    # (1.36, constrained impersonation: 'cannot impersonate-on:user-info:list resource ...';
    # before: 'cannot impersonate resource "users"')
    assert f'User "system:serviceaccount:{ns}:plain" cannot impersonate' in err


def test_request_timeout_is_told_to_the_server_and_bounds_each_request(
    control_plane: ControlPlane, k8s: client.ApiClient, plain_namespace: str, tmp_path: Path
) -> None:
    ns = plain_namespace
    kube = Kube(k8s)
    kube.create(path("deployments", ns), deployment("web", annotations={}))
    admin = control_plane.kubeconfig
    # the API server takes `timeout` on the lists and on the dry run that judges a workload
    plain_run = _run("status", "-n", ns, "-o", "json", kubeconfig=admin)
    timed = _run("status", "-n", ns, "-o", "json", "--request-timeout", "30s", kubeconfig=admin)
    assert timed[0] == plain_run[0], timed[2]
    assert json.loads(timed[1]) == json.loads(plain_run[1])
    assert [row["name"] for row in json.loads(timed[1])] == ["web"]

    with hold_proxy(control_plane, tmp_path / "proxy") as proxy:
        proxy.stall(lambda method, target: "/deployments" in target)
        code, out, err, took = _run(
            "status", "-n", ns, "--request-timeout", "2s", kubeconfig=proxy.kubeconfig
        )
        proxy.let_go()
    assert code == 2, out + err
    assert "ReadTimeoutError" in err
    assert took < 20, took  # not the 30 s a request status allows itself
    [held] = proxy.stalled
    assert "timeout=2s" in held  # told to the server, as client-go tells it


def test_version_reads_the_servers_version_and_says_what_it_may_not(
    control_plane: ControlPlane, k8s: client.ApiClient
) -> None:
    admin = control_plane.kubeconfig
    code, out, err, _ = _run("version", "-o", "json", kubeconfig=admin)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["kubernetesVersion"]["minor"].rstrip("+") == str(server_minor(k8s))
    assert doc["serverVersion"] == []  # no chart installed here: none, not unknown
    # as a user who may list no Deployments: said, and still exit 0
    code, out, err, _ = _run("version", "--as", "jane", kubeconfig=admin)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[1].startswith("Server Version: unknown (cannot list its Deployments: ")
    assert "forbidden" in lines[1]
    assert lines[2].startswith(f"Kubernetes Version: v1.{server_minor(k8s)}.")
