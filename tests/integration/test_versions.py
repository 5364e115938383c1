"""What differs between the control planes the suite runs on (1.20.2 and 1.36.2), asserted as
each version does it, not as 1.20 did."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import pytest

from harness.chart import cluster_capabilities, one, render
from harness.configpin import CONFIGPIN_NAMESPACE, Configpin, ensure_namespace
from harness.controlplane import ENABLED_LABEL, chart_webhook, server_minor, wait_for
from harness.manifests import configmap, deployment
from webhook.core.constants import ANN_SOURCES
from webhook.core.kinds import builtin
from webhook.kube.errors import Forbidden
from webhook.kube.raw import JSON_PATCH, Kube, path
from webhook.kube.workloads import served_prefix

CRONJOB = builtin("CronJob")
assert CRONJOB is not None


def test_served_versions_of_cronjobs_and_pdbs(kube: Kube) -> None:
    minor = server_minor(kube.api)
    assert served_prefix(kube, CRONJOB) == (
        "/apis/batch/v1" if minor >= 21 else "/apis/batch/v1beta1"
    )
    _, api_versions = cluster_capabilities(kube.api)
    assert ("policy/v1/PodDisruptionBudget" in api_versions) is (minor >= 21)
    assert ("policy/v1beta1/PodDisruptionBudget" in api_versions) is (minor < 25)


def test_match_conditions_registered_where_served(kube: Kube) -> None:
    hook = chart_webhook(kube.api)
    assert ("matchConditions" in hook) is (server_minor(kube.api) >= 28)


@pytest.fixture(params=["kube-system", CONFIGPIN_NAMESPACE])
def excluded(request: pytest.FixtureRequest, kube: Kube) -> Iterator[str]:
    """An always-excluded namespace, labelled as if someone had opted it in."""
    name: str = request.param
    ensure_namespace(kube.api, name)
    label = "/metadata/labels/" + ENABLED_LABEL.replace("/", "~1")
    ns = kube.get(path("namespaces", None, name))
    ops: list[dict[str, Any]] = []
    if not ns["metadata"].get("labels"):
        ops.append({"op": "add", "path": "/metadata/labels", "value": {}})
    ops.append({"op": "add", "path": label, "value": "true"})
    kube.patch(path("namespaces", None, name), ops, content_type=JSON_PATCH)
    try:
        yield name
    finally:
        kube.patch(
            path("namespaces", None, name),
            [{"op": "remove", "path": label}],
            content_type=JSON_PATCH,
        )


def test_excluded_namespaces_never_reach_the_webhook(
    kube: Kube, configpin: Configpin, excluded: str
) -> None:
    """The chart excludes kube-system and configpin's own namespace by their
    kubernetes.io/metadata.name label, which the API server sets from 1.21 on. On 1.20 the
    label does not exist: the opt-in label alone decides, and the API server does call."""
    suffix = secrets.token_hex(3)
    kube.create(path("configmaps", excluded), configmap(f"app-config-{suffix}", {"a": "1"}))
    body = deployment(f"excluded-{suffix}")
    body["spec"]["template"]["spec"]["containers"][0]["env"][0]["valueFrom"]["configMapKeyRef"][
        "name"
    ] = f"app-config-{suffix}"
    calls = configpin.metric("configpin_admissions_total", kind="Deployment")
    try:
        created = kube.create(path("deployments", excluded), body)
        annotations = created["spec"]["template"]["metadata"].get("annotations") or {}
        after = configpin.metric("configpin_admissions_total", kind="Deployment")
        if server_minor(kube.api) >= 21:
            assert after == calls, "the API server called the webhook for an excluded namespace"
            assert ANN_SOURCES not in annotations
        else:
            assert after > calls, "1.20 has no namespace-name label to exclude by"
    finally:
        kube.delete(path("deployments", excluded, f"excluded-{suffix}"))
        kube.delete(path("configmaps", excluded, f"app-config-{suffix}"))


def test_chart_pod_is_admitted_where_restricted_is_enforced(
    kube: Kube, plain_namespace: str
) -> None:
    if server_minor(kube.api) < 23:
        pytest.skip("Pod Security admission is served from 1.23 (beta); this is 1.20")
    ns = plain_namespace
    kube.patch(
        path("namespaces", None, ns),
        {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}},
        content_type="application/merge-patch+json",
    )
    kube_version, api_versions = cluster_capabilities(kube.api)
    objects = render({}, kube_version, api_versions, namespace=ns)
    template = one(objects, "Deployment")["spec"]["template"]
    account = template["spec"]["serviceAccountName"]
    kube.create(path("serviceaccounts", ns), {"metadata": {"name": account}})
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "configpin-restricted", "labels": template["metadata"]["labels"]},
        "spec": template["spec"],
    }
    # Pod Security reads the namespace label through an informer: wait until it refuses a
    # pod that breaks the profile, which also shows this test can fail.
    loose = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "loose"},
        "spec": {"containers": [{"name": "c", "image": "registry.invalid/x:1"}]},
    }

    def refuses_loose() -> bool:
        try:
            kube.create(path("pods", ns), loose, dryRun="All")
        except Forbidden:
            return True
        return False

    wait_for(refuses_loose, what="Pod Security to enforce restricted in the namespace")
    created = kube.create(path("pods", ns), pod, dryRun="All")
    assert created["metadata"]["name"] == "configpin-restricted"
