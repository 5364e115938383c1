"""The chart installed as clusters that differ need it (issue 46): in the node's network on its
own port (hostNetwork, as EKS with a custom CNI wants), running as an arbitrary UID with group 0
and no fsGroup (as OpenShift's restricted-v2 SCC assigns them: runAsIds assigned, the UID given
here as the SCC would), with an opt-in label of its own. The API server calls it through the
Service, a ConfigMap change rolls a Deployment whose new pods read the new content, a namespace
with only the default label is left alone, and `helm test` passes.

A release of its own ("variant", in its own namespace, one replica: a host port is one per
node), beside the session's release if that one is installed: its label is not the default, so
the two never act in the same namespace."""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import helm_python as helm
import pytest
from kubernetes import client

from harness import images
from harness.apps import reader_workload, replica_sets, wait_all_read, wait_deployment
from harness.controlplane import wait_for
from harness.node import Node
from harness.release import Release, image_values
from tests.node.conftest import create_namespace
from tests.timing import NODE_SETTLE
from webhook.core.constants import ANN_CHECKSUM

NAME = "variant"
NAMESPACE = "configpin-variant"
PORT = 10443
UID = 1000680000  # from an OpenShift namespace's range (openshift.io/sa.scc.uid-range)
LABEL = ("configpin.io/variant", "on")
VALUES = {
    "replicaCount": 1,
    "hostNetwork": {"enabled": True, "port": PORT},
    "runAsIds": "assigned",
    # what restricted-v2 would set on the container; no runAsGroup, no fsGroup: group 0
    "securityContext": {"runAsUser": UID},
    "webhook": {"optInLabel": {"key": LABEL[0], "value": LABEL[1]}},
    "commonLabels": {"example.com/team": "platform"},
}


@pytest.fixture(scope="module")
def variant(node: Node) -> Iterator[Release]:
    archive = images.ensure(images.CONFIGPIN)
    node.import_image(archive)
    release = Release(node, name=NAME, namespace=NAMESPACE)
    release.install(image_values(images.CONFIGPIN.ref, **VALUES))
    try:
        yield release
    finally:
        with contextlib.suppress(helm.HelmError):
            release.uninstall()


def _process_ids(port: int) -> list[dict[str, list[str]]]:
    """Uid, Gid and Groups lines of every process of this machine running `configpin serve
    --port=<port>` (the node's processes are in this machine's PID namespace)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            status = (proc / "status").read_text()
        except OSError:
            continue
        if b"serve" in argv and f"--port={port}".encode() in argv:
            lines = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            found.append({k: lines[k].split() for k in ("Uid", "Gid", "Groups")})
    return found


def test_host_network_and_an_assigned_uid_serve_and_roll(
    k8s: client.ApiClient, variant: Release
) -> None:
    core = client.CoreV1Api(k8s)
    [pod] = variant.wait_ready(k8s, replicas=1)
    # in the node's network, on its own port
    assert pod.spec.host_network is True
    assert pod.spec.dns_policy == "ClusterFirstWithHostNet"
    assert pod.status.pod_ip == pod.status.host_ip
    [port] = pod.spec.containers[0].ports
    assert (port.container_port, port.host_port) == (PORT, PORT)
    assert pod.metadata.labels["example.com/team"] == "platform"
    # as the UID given, with group 0 and no fsGroup (what an SCC's arbitrary UID gets)
    assert pod.spec.security_context.run_as_user is None
    assert pod.spec.security_context.fs_group is None
    ids = wait_for(lambda: _process_ids(PORT), timeout=30, what="configpin's process")
    for seen in ids:
        assert seen["Uid"] == [str(UID)] * 4, seen
        assert seen["Gid"] == ["0"] * 4, seen

    # opted in with the release's own label: pinned through the Service, and a change rolls
    suffix = secrets.token_hex(4)
    shop = create_namespace(k8s, f"variant-shop-{suffix}", {LABEL[0]: LABEL[1]})
    # the label with another value (and not the default label: the session's release, when
    # installed, acts where that is)
    other = create_namespace(k8s, f"variant-other-{suffix}", {LABEL[0]: "off"})
    try:
        variant.wait_answering(k8s, shop, timeout=90)
        for namespace in (shop, other):
            core.create_namespaced_config_map(
                namespace, {"metadata": {"name": "settings"}, "data": {"greeting": "hello-one"}}
            )
            app = reader_workload(
                "Deployment", "app", images.SHELL.ref, configmap="settings", files=["greeting"]
            )
            client.AppsV1Api(k8s).create_namespaced_deployment(namespace, app)
        for namespace in (shop, other):
            wait_deployment(k8s, namespace, "app")
            wait_all_read(k8s, namespace, "app", {"file:/config/greeting": "hello-one"})
        [first] = replica_sets(k8s, shop, "app")
        assert ANN_CHECKSUM in first.spec.template.metadata.annotations

        for namespace in (shop, other):
            core.patch_namespaced_config_map(
                "settings", namespace, {"data": {"greeting": "hello-two"}}
            )
        wait_for(
            lambda: len(replica_sets(k8s, shop, "app")) == 2, timeout=90, what="a new ReplicaSet"
        )
        wait_deployment(k8s, shop, "app")
        read = wait_all_read(k8s, shop, "app", {"file:/config/greeting": "hello-two"})
        assert len(read) == 2

        # a namespace whose label has another value is not this release's: never pinned, never
        # rolled (the webhook's selector and the controller's are the same one)
        time.sleep(NODE_SETTLE)
        [untouched] = replica_sets(k8s, other, "app")
        assert ANN_CHECKSUM not in (untouched.spec.template.metadata.annotations or {})
    finally:
        for namespace in (shop, other):
            core.delete_namespace(namespace)


def test_helm_test_passes_on_the_node(variant: Release) -> None:
    """The chart's test Pod (the configpin image, as the webhook pods run it: UID, group 0)
    reaches /readyz through the Service and verifies the certificate configpin made."""
    done = variant.test(timeout=120)
    logs = str(done.get("logs") or "")
    if logs:  # the Pod is deleted once it succeeds; its log is kept when Helm got it first
        assert "certificate verified" in logs
        assert "GET /readyz: HTTP/1.1 200" in logs
