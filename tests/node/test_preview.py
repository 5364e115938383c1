"""Change preview and audit on a real node, configpin installed by `helm install` of its chart
(both webhook entries, two replicas, the chart's defaults: waves `1,10%,100%`): a user with only
the rights of their namespace edits a ConfigMap and is told, before and as they write it, what
it will do; the rollout that follows names that user in its Event and on its record, and the
application containers read the new content."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kubernetes import client, config

from harness import images
from harness.apps import reader_workload, wait_all_read, wait_deployment, write_warned
from harness.controlplane import service_account_kubeconfig, wait_for
from harness.node import Node
from harness.release import Release
from tests.node.rollouts import rollout_record
from webhook.core.constants import ANN_CHANGED_BY
from webhook.kube.raw import MERGE_PATCH, Kube, path

pytestmark = pytest.mark.usefixtures("pinned")

RBAC = "/apis/rbac.authorization.k8s.io/v1"


def _namespace_user(node: Node, k8s: client.ApiClient, ns: str, out: Path) -> Kube:
    """ServiceAccount `dev` of `ns`, allowed what a team's developer is on its ConfigMaps in
    its own namespace (read, update, patch) and nothing else: a client with its token."""
    admin = Kube(k8s)
    admin.create(path("serviceaccounts", ns), {"metadata": {"name": "dev"}})
    rule = {
        "apiGroups": [""],
        "resources": ["configmaps"],
        "verbs": ["get", "list", "update", "patch"],
    }
    admin.create(f"{RBAC}/namespaces/{ns}/roles", {"metadata": {"name": "dev"}, "rules": [rule]})
    binding = {
        "metadata": {"name": "dev"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "dev"},
        "subjects": [{"kind": "ServiceAccount", "name": "dev", "namespace": ns}],
    }
    admin.create(f"{RBAC}/namespaces/{ns}/rolebindings", binding)
    kubeconfig = service_account_kubeconfig(node.plane, k8s, ns, "dev", out)
    return Kube(config.new_client_from_config(config_file=str(kubeconfig)))


def test_a_namespace_user_sees_what_an_edit_will_do_and_the_rollout_names_them(
    node: Node, k8s: client.ApiClient, configpin: Release, namespace: str, tmp_path: Path
) -> None:
    ns = namespace
    core, apps = client.CoreV1Api(k8s), client.AppsV1Api(k8s)
    core.create_namespaced_config_map(
        ns, {"metadata": {"name": "settings"}, "data": {"greeting": "hello", "color": "red"}}
    )
    names = ["front", "back"]
    for name in names:
        app = reader_workload(
            "Deployment",
            name,
            images.SHELL.ref,
            configmap="settings",
            files=["greeting"],
            env={"GREETING": "greeting"},
            whole_volume=False,
            replicas=1,
        )
        apps.create_namespaced_deployment(ns, app)
    for name in names:
        wait_deployment(k8s, ns, name)
        wait_all_read(k8s, ns, name, {"file:/config/greeting": "hello", "env:GREETING": "hello"})
    dev = _namespace_user(node, k8s, ns, tmp_path / "dev.kubeconfig")
    user = f"system:serviceaccount:{ns}:dev"
    cm = path("configmaps", ns, "settings")
    change = {"data": {"greeting": "bonjour"}}

    # --dry-run=server: what it will do, and nothing done
    _, said = write_warned(dev, "PATCH", cm, change, content_type=MERGE_PATCH, dry_run=True)
    assert said and said[0] == (
        f"configpin: ConfigMap {ns}/settings keys [greeting] -> 2 workloads: 2 roll in 2 waves "
        "(1, 1)"
    ), said
    assert not [line for line in said if "bonjour" in line]
    assert core.read_namespaced_config_map("settings", ns).data["greeting"] == "hello"

    # the write itself: the same lines; the user recorded on the ConfigMap
    _, written = write_warned(dev, "PATCH", cm, change, content_type=MERGE_PATCH)
    assert written == said
    stored = core.read_namespaced_config_map("settings", ns)
    assert json.loads(stored.metadata.annotations[ANN_CHANGED_BY])["user"] == user

    # both roll, wave after wave; their containers read the new content
    for name in names:
        wait_for(
            lambda n=name: rollout_record(k8s, ns, n).get("state") == "complete",  # type: ignore[misc]
            timeout=180,
            what=f"{name}'s config rollout complete",
        )
        wait_deployment(k8s, ns, name)
        wait_all_read(
            k8s, ns, name, {"file:/config/greeting": "bonjour", "env:GREETING": "bonjour"}
        )
        assert rollout_record(k8s, ns, name)["by"].startswith(f"{user} at ")
    events = Kube(k8s).get(f"/apis/events.k8s.io/v1/namespaces/{ns}/events")
    started = [e for e in events.get("items") or () if e.get("reason") == "RolloutStarted"]
    assert {e["regarding"]["name"] for e in started} == set(names)
    assert all(f"changed by {user} at " in e["note"] for e in started), started

    # a key nobody reads: said so, nothing rolls
    _, said = write_warned(dev, "PATCH", cm, {"data": {"color": "blue"}}, content_type=MERGE_PATCH)
    assert said == [f"configpin: ConfigMap {ns}/settings keys [color] -> 2 workloads: 2 consume "
                    "other keys"], said  # fmt: skip
