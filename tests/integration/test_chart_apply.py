"""The chart's rendered objects are accepted by a real API server (so a schema error cannot pass),
rendered for the version that server reports, as Helm does against a live cluster."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from harness.chart import cluster_capabilities, render
from harness.controlplane import server_minor
from webhook.kube.raw import Kube

CLUSTER_SCOPED = {
    "ClusterRole",
    "ClusterRoleBinding",
    "MutatingWebhookConfiguration",
    "Namespace",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
}
PLURALS = {
    "ValidatingAdmissionPolicy": "validatingadmissionpolicies",
    "NetworkPolicy": "networkpolicies",
}
# The values where clusters differ (OpenShift's assigned IDs, hostNetwork, another opt-in label and
# scope, labels on everything, a security-context override), each of which changes what the API
# server must accept: a selector, a port, a pod's security context.
CLUSTERS_DIFFER: dict[str, Any] = {
    "runAsIds": "assigned",
    "hostNetwork": {"enabled": True, "port": 10443},
    "networkPolicy": {"enabled": True},
    "webhook": {
        "optInLabel": {"key": "example.com/pin", "value": "yes"},
        "namespaceSelector": {
            "matchExpressions": [{"key": "example.com/tier", "operator": "In", "values": ["apps"]}]
        },
    },
    "commonLabels": {"example.com/team": "platform"},
    "commonAnnotations": {"example.com/owner": "platform team"},
    "securityContext": {"runAsUser": 1000680000},
}


def _api_path(obj: dict[str, Any], namespace: str) -> str:
    group_version = obj["apiVersion"]
    base = f"/api/{group_version}" if "/" not in group_version else f"/apis/{group_version}"
    plural = PLURALS.get(obj["kind"], obj["kind"].lower() + "s")
    if obj["kind"] in CLUSTER_SCOPED:
        return f"{base}/{plural}"
    return f"{base}/namespaces/{obj['metadata'].get('namespace') or namespace}/{plural}"


@pytest.mark.parametrize(
    "values",
    [
        {},
        {"replicaCount": 3, "mode": "snapshot", "webhook": {"failurePolicy": "Fail"}},
        CLUSTERS_DIFFER,
    ],
    ids=["defaults", "non-default", "where-clusters-differ"],
)
def test_rendered_chart_is_accepted_by_the_api_server(
    k8s: client.ApiClient, plain_namespace: str, values: dict[str, Any]
) -> None:
    kube = Kube(k8s)
    kube_version, api_versions = cluster_capabilities(k8s)
    release = f"cp-{plain_namespace[-8:]}"
    objects = render(values, kube_version, api_versions, release=release, namespace=plain_namespace)
    kinds = {o["kind"] for o in objects}
    assert {"Deployment", "Service", "MutatingWebhookConfiguration", "ClusterRole"} <= kinds
    pdbs = [o for o in objects if o["kind"] == "PodDisruptionBudget"]
    # 1.20 serves no policy/v1; 1.25+ serves no policy/v1beta1
    expected_pdb = "policy/v1" if server_minor(k8s) >= 21 else "policy/v1beta1"
    assert pdbs and all(p["apiVersion"] == expected_pdb for p in pdbs)
    # admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy is served from 1.30
    assert ("ValidatingAdmissionPolicy" in kinds) is (server_minor(k8s) >= 30)
    # Server-side dry run: full validation and defaulting, nothing persisted.
    # and the `helm test` hook, which `helm test` creates beside them
    hooks = render(
        values, kube_version, api_versions, release=release, namespace=plain_namespace, tests=True
    )
    assert [o["kind"] for o in hooks] == ["Pod"]
    for obj in [*objects, *hooks]:
        answer = kube.create(_api_path(obj, plain_namespace), obj, dryRun="All")
        assert answer["kind"] == obj["kind"]
        if values is CLUSTERS_DIFFER:
            assert answer["metadata"]["labels"]["example.com/team"] == "platform"
