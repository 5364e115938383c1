"""`configpin status` / `kubectl configpin status` against the real API server, with the webhook
registered as the chart registers it: a workload is current, then stale after a consumed change
(exit 1), then current again after its rollout (exit 0); a missing required source says so."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from kubernetes import client

from harness.controlplane import (
    ControlPlane,
    service_account_kubeconfig,
    wait_for,
)
from harness.manifests import configmap, container, deployment, env_key_ref, pod_spec
from tests.integration.instances import instance_fixtures
from tests.integration.test_snapshot_mode import copies_in, template_spec
from webhook.core.constants import ANN_MODE, ANN_SOURCES, MODE_SNAPSHOT
from webhook.kube.raw import MERGE_PATCH, Kube, path

INSTANCE = "status"
WINDOW = 20.0  # long enough for status to see the change before the controller rolls it
BIN = Path(sys.executable).parent


cp, ns = instance_fixtures(
    INSTANCE, "status", ["--coalesce-window", str(WINDOW), "--min-rollout-interval", "0"]
)


def _status(
    plane: ControlPlane, *args: str, kubectl: bool = False, kubeconfig: Path | None = None
) -> tuple[int, str, str]:
    env = {
        **os.environ,
        "KUBECONFIG": str(kubeconfig or plane.kubeconfig),
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    argv = (
        ["kubectl", "configpin", "status", *args]
        if kubectl
        else [str(BIN / "kubectl-configpin"), "status", *args]
    )
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, check=False)
    return proc.returncode, proc.stdout, proc.stderr


def _rows(out: str) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in json.loads(out)}


def test_status_follows_a_change_through_its_rollout(
    control_plane: ControlPlane, k8s: client.ApiClient, ns: str
) -> None:
    kube = Kube(k8s)
    app = f"statusweb-{secrets.token_hex(3)}"
    kube.create(path("configmaps", ns), configmap("app-config", {"a": "1", "b": "1"}))
    body = deployment(app, replicas=1)
    body["metadata"]["labels"] = {"app": app}
    created = kube.create(path("deployments", ns), body)
    recorded = created["spec"]["template"]["metadata"]["annotations"][ANN_SOURCES]

    code, out, err = _status(control_plane, "-n", ns, "-o", "json")
    assert code == 0, err
    row = _rows(out)[app]
    assert row["state"] == "current"
    assert row["pinned"] is True
    assert [(s["source"], s["state"]) for s in row["sources"]] == [
        ("configmap/app-config", "current")
    ]
    assert row["sources"][0]["recorded"] == json.loads(recorded)["configmap/app-config"]

    # an unused key: still current
    kube.patch(path("configmaps", ns, "app-config"), {"data": {"b": "2"}}, MERGE_PATCH)
    code, out, _ = _status(control_plane, "-n", ns, "-o", "json")
    assert code == 0
    assert _rows(out)[app]["state"] == "current"

    kube.patch(path("configmaps", ns, "app-config"), {"data": {"a": "2"}}, MERGE_PATCH)
    # as kubectl runs a plugin, where kubectl is installed
    code, out, err = _status(
        control_plane, "-A", "-l", f"app={app}", kubectl=shutil.which("kubectl") is not None
    )
    assert code == 1, out + err
    [header, line] = out.splitlines()
    assert header.split()[:4] == ["NAMESPACE", "KIND", "NAME", "MODE"]
    assert line.split()[:5] == [ns, "Deployment", app, "default", "STALE"]
    assert "configmap/app-config stale" in line

    def rolled() -> bool:
        dep = kube.get(path("deployments", ns, app))
        return dep["spec"]["template"]["metadata"]["annotations"][ANN_SOURCES] != recorded

    wait_for(rolled, timeout=WINDOW + 30, what="the controller's rollout")
    # its template is current; its pods are not yet (no node runs them here): rolling, which a
    # gate must not take for delivered
    code, out, err = _status(control_plane, f"deployment/{app}", "-n", ns, "-o", "wide")
    assert code == 1, out + err
    assert "current: recorded" in out
    [_, line, *_] = out.splitlines()
    assert line.split()[:4] == ["Deployment", app, "default", "rolling"]
    # scaled to zero, nothing is left to deliver: current
    kube.patch(path("deployments", ns, app), {"spec": {"replicas": 0}}, MERGE_PATCH)
    wait_for(
        lambda: _status(control_plane, f"deployment/{app}", "-n", ns)[0] == 0,
        timeout=30,
        what="status to say current once nothing rolls",
    )


def test_status_names_a_missing_source_and_what_is_not_pinned(
    control_plane: ControlPlane, k8s: client.ApiClient, ns: str
) -> None:
    kube = Kube(k8s)
    spec = pod_spec(container(env=[env_key_ref("configmap", "nowhere", "k", "K")]))
    kube.create(path("deployments", ns), deployment("broken", spec))
    kube.create(
        path("deployments", ns),
        deployment("plain", pod_spec(container()), annotations={}),
    )
    code, out, _ = _status(control_plane, "-n", ns, "-o", "json")
    assert code == 1
    rows = _rows(out)
    assert rows["broken"]["state"] == "missing"
    assert "configmap/nowhere" in rows["broken"]["reason"]
    assert rows["plain"]["state"] == "not-pinned"
    assert rows["plain"]["pinned"] is False
    code, _, err = _status(control_plane, "deployment/absent", "-n", ns)
    assert code == 2
    assert "absent" in err


def test_status_of_a_snapshot_mode_workload_follows_its_source(
    control_plane: ControlPlane, k8s: client.ApiClient, ns: str
) -> None:
    """Its template points at a copy, which admission keeps as it is: status compares the
    record with what the source holds now, not with the copy."""
    kube = Kube(k8s)
    kube.create(path("configmaps", ns), configmap("app-config", {"a": "1"}))
    created = kube.create(
        path("deployments", ns), deployment("snap", annotations={ANN_MODE: MODE_SNAPSHOT})
    )
    [copy] = copies_in(template_spec(created)).values()
    code, out, err = _status(control_plane, "deployment/snap", "-n", ns, "-o", "json")
    assert code == 0, out + err
    [row] = json.loads(out)
    assert row["state"] == "current"
    assert row["copies"] == [f"configmap/{copy}"]

    kube.patch(path("configmaps", ns, "app-config"), {"data": {"a": "2"}}, MERGE_PATCH)
    code, out, err = _status(control_plane, "deployment/snap", "-n", ns, "-o", "json")
    assert code == 1, out + err
    [row] = json.loads(out)
    assert row["state"] == "stale"
    assert [(s["source"], s["state"]) for s in row["sources"]] == [
        ("configmap/app-config", "stale")
    ]
    wait_for(
        lambda: (
            copies_in(template_spec(kube.get(path("deployments", ns, "snap")))).get("app-config")
            not in (None, copy)
        ),
        timeout=WINDOW + 30,
        what="the controller's rollout onto a new copy",
    )
    code, out, err = _status(control_plane, "deployment/snap", "-n", ns)
    assert code == 0, out + err


def test_a_user_who_may_not_dry_run_is_not_told_current(
    control_plane: ControlPlane, k8s: client.ApiClient, ns: str, tmp_path: Path
) -> None:
    """A user who may read every workload (as Kubernetes' own `view` role) but not create one, so
    the server-side dry run that judges a workload is refused: status cannot say it is current,
    and a CI gate on it must not pass. It says the right it lacks, and exits 2."""
    kube = Kube(k8s)
    kube.create(path("configmaps", ns), configmap("app-config", {"a": "1"}))
    kube.create(path("deployments", ns), deployment("viewed"))
    code, out, err = _status(control_plane, "-n", ns, "-o", "json")
    assert code == 0, out + err
    assert _rows(out)["viewed"]["state"] == "current"

    kube.create(path("serviceaccounts", ns), {"metadata": {"name": "viewer"}})
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}"
    read = ["get", "list", "watch"]
    kube.create(
        f"{rbac}/roles",
        {
            "metadata": {"name": "viewer"},
            "rules": [  # what Kubernetes' own `view` role grants on workloads and Events
                {
                    "apiGroups": [""],
                    "resources": ["replicationcontrollers", "events"],
                    "verbs": read,
                },
                {
                    "apiGroups": ["apps"],
                    "resources": ["deployments", "statefulsets", "daemonsets", "replicasets"],
                    "verbs": read,
                },
                {"apiGroups": ["batch"], "resources": ["jobs", "cronjobs"], "verbs": read},
                # (Argo Rollouts' CRD, installed by other tests, aggregates to `view` too)
                {"apiGroups": ["argoproj.io"], "resources": ["rollouts"], "verbs": read},
            ],
        },
    )
    kube.create(
        f"{rbac}/rolebindings",
        {
            "metadata": {"name": "viewer"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "viewer"},
            "subjects": [{"kind": "ServiceAccount", "name": "viewer", "namespace": ns}],
        },
    )
    viewer = service_account_kubeconfig(control_plane, k8s, ns, "viewer", tmp_path / "viewer")
    code, out, err = _status(control_plane, "-n", ns, "-o", "json", kubeconfig=viewer)
    assert code == 2 and out, out + err
    row = _rows(out)["viewed"]
    assert row["state"] == "unknown"
    assert f"needs 'create' on deployments.apps in namespace {ns}" in row["reason"]
    assert "forbidden" in row["reason"]  # the API server's own answer
    assert "not known to be current" in err
    code, out, err = _status(control_plane, "deployment/viewed", "-n", ns, kubeconfig=viewer)
    assert code == 2, out + err
    assert "unknown" in out
