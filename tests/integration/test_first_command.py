"""The README's first command on a laptop whose KUBECONFIG points at a real cluster (as a
newcomer's shell often does, at production): it serves the embedded default on loopback and
changes nothing in that cluster.

The cluster holds what a running configpin would act on at once: a namespace opted in, a
Deployment in it whose record names content its ConfigMap no longer holds. Before and after the
command has served (and a while longer), every object configpin could write is read and compared
by resourceVersion: its digest key Secret and Lease (in the namespace it would use by default),
the namespace's Deployments, ReplicaSets, ConfigMaps, Secrets, Leases and Events, and the
cluster's webhook configurations. The namespace carries an instance label no test configpin
selects, so only the command under test could act on it.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from harness.configpin import ENABLED_LABEL, INSTANCE_LABEL, REPO
from harness.controlplane import ControlPlane, default_service_account_ready, wait_for
from harness.firstrun import (
    create_review,
    embedded_consumer,
    listening_addresses,
    post_review,
    readme_commands,
    serving,
)
from harness.manifests import configmap, container, deployment, env_key_ref, pod_spec
from webhook.core.constants import ANN_SOURCES
from webhook.kube.errors import NotFound
from webhook.kube.raw import Kube, path

pytestmark = pytest.mark.skipif(
    os.environ.get("CONFIGPIN_EXPECT_COMPILED") == "1",
    reason="make run runs the checkout's install: the pure-Python runs test it",
)

# What `configpin serve` with default settings would use: its own namespace and objects there
DEFAULT_NAMESPACE = "configpin"
STALE = "0" * 64  # a recorded digest no content has


@pytest.fixture
def configpin_namespace(k8s: client.ApiClient) -> Iterator[None]:
    """configpin's default namespace, there (as on a cluster where it was once installed), so
    that a server acting on the cluster could write its digest key and Lease."""
    core = client.CoreV1Api(k8s)
    try:
        core.create_namespace(
            client.V1Namespace(metadata=client.V1ObjectMeta(name=DEFAULT_NAMESPACE))
        )
    except client.ApiException as e:
        if e.status != 409:
            raise
    yield


@pytest.fixture
def opted_in(k8s: client.ApiClient, configpin_namespace: None) -> Iterator[str]:
    name = f"first-command-{secrets.token_hex(3)}"
    labels = {ENABLED_LABEL: "true", INSTANCE_LABEL: "nobody-runs-this-instance"}
    core = client.CoreV1Api(k8s)
    core.create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels=labels))
    )
    try:
        wait_for(lambda: default_service_account_ready(k8s, name), timeout=30, what="namespace")
        yield name
    finally:
        core.delete_namespace(name)


def _version(resource: str, obj: dict[str, Any]) -> str:
    """What a write by configpin would change: a Deployment's generation and annotations (its
    controller writes its status meanwhile), a ReplicaSet's being there (a re-stamp makes a new
    one; the Deployment controller writes the old one's status), an Event's being there when
    configpin reported it; else the resourceVersion."""
    meta = obj["metadata"]
    if resource == "deployments":
        template = obj["spec"]["template"]["metadata"]
        state = [meta.get("generation"), meta.get("annotations"), template.get("annotations")]
        return json.dumps(state, sort_keys=True)
    if resource == "replicasets":
        return "exists"
    if resource == "events":
        source = f"{obj.get('reportingComponent')} {(obj.get('source') or {}).get('component')}"
        return "configpin's" if "configpin" in source else "not configpin's"
    return str(meta["resourceVersion"])


def _versions(kube: Kube, ns: str) -> dict[str, str]:
    """kind/namespace/name -> the version (`_version`) of every object configpin might write."""
    lists = [
        ("/api/v1", "secrets", DEFAULT_NAMESPACE),
        ("/api/v1", "configmaps", DEFAULT_NAMESPACE),
        ("/apis/coordination.k8s.io/v1", "leases", DEFAULT_NAMESPACE),
        ("/apis/apps/v1", "deployments", ns),
        ("/apis/apps/v1", "replicasets", ns),
        ("/api/v1", "configmaps", ns),
        ("/api/v1", "secrets", ns),
        ("/api/v1", "events", ns),
        ("/apis/coordination.k8s.io/v1", "leases", ns),
        ("/apis/admissionregistration.k8s.io/v1", "mutatingwebhookconfigurations", None),
        ("/apis/admissionregistration.k8s.io/v1", "validatingwebhookconfigurations", None),
    ]
    found: dict[str, str] = {}
    for prefix, resource, namespace in lists:
        try:
            items = kube.get(path(resource, namespace, prefix=prefix)).get("items") or ()
        except NotFound:
            items = ()
        for item in items:
            meta = item["metadata"]
            found[f"{resource}/{meta.get('namespace', '')}/{meta['name']}"] = _version(
                resource, item
            )
    try:
        kube.get(path("namespaces", None, DEFAULT_NAMESPACE, prefix="/api/v1"))
        found["namespaces//" + DEFAULT_NAMESPACE] = "exists"
    except NotFound:
        pass
    return found


def _controller_synced(kube: Kube, ns: str, name: str) -> bool:
    obj = kube.get(path("deployments", ns, name, prefix="/apis/apps/v1"))
    annotations = obj["metadata"].get("annotations") or {}
    observed = (obj.get("status") or {}).get("observedGeneration")
    synced = observed == obj["metadata"].get("generation")
    return synced and "deployment.kubernetes.io/revision" in annotations


def test_make_run_with_kubeconfig_set_changes_nothing_in_that_cluster(
    control_plane: ControlPlane, k8s: client.ApiClient, opted_in: str, tmp_path: Path
) -> None:
    kube = Kube(k8s)
    ns = opted_in
    kube.create(path("configmaps", ns), configmap("cfg", {"k": "now"}))
    body = deployment("app", pod_spec(container(env=[env_key_ref("configmap", "cfg", "k", "K")])))
    body["spec"]["template"]["metadata"].setdefault("annotations", {})[ANN_SOURCES] = (
        f'{{"configmap/cfg": "{STALE}"}}'
    )
    kube.create(path("deployments", ns), body)
    # the Deployment controller writes its revision annotation on its first sync: wait for it,
    # so the look before holds every write that is not configpin's (a whole run on 1.36.2 once
    # looked in between)
    wait_for(
        lambda: _controller_synced(kube, ns, "app"), timeout=30, what="the Deployment's revision"
    )
    before = _versions(kube, ns)
    assert f"deployments/{ns}/app" in before

    run = readme_commands(REPO / "README.md")[0]
    env = {"KUBECONFIG": str(control_plane.kubeconfig)}
    with serving(run, cwd=REPO, workdir=tmp_path, env=env) as served:
        assert listening_addresses(served.port) == {"127.0.0.1"}
        obj = embedded_consumer(ns)
        answer = post_review(served, create_review(obj))
        assert answer["response"]["allowed"] is True
        # a running controller would have re-stamped the Deployment (and written its Lease,
        # its digest key, Events) long before this
        time.sleep(5)
        log = served.output()
    assert "KUBECONFIG is set and not used" in log
    assert control_plane.host not in log
    after = _versions(kube, ns)
    changed = {k: (before.get(k), v) for k, v in after.items() if before.get(k) != v}
    gone = sorted(set(before) - set(after))
    assert not changed and not gone, {"changed or made": changed, "gone": gone}
    template = kube.get(path("deployments", ns, "app", prefix="/apis/apps/v1"))["spec"]["template"]
    assert STALE in template["metadata"]["annotations"][ANN_SOURCES]
