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
PLURALS = {"ValidatingAdmissionPolicy": "validatingadmissionpolicies"}


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
    ],
    ids=["defaults", "non-default"],
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
    for obj in objects:
        answer = kube.create(_api_path(obj, plain_namespace), obj, dryRun="All")
        assert answer["kind"] == obj["kind"]
