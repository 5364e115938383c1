"""`kubectl configpin wait` on a real node, judged by what the application containers read: it
returns 0 only once every pod of every consumer runs the new content (and is Ready), never
while an old pod still serves or a later wave has not rolled. configpin as the chart installs
it (its CRD from crds/, waves `1,10%,100%`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from kubernetes import client

from harness import images
from harness.apps import (
    is_ready,
    last_seen,
    reader_workload,
    wait_all_read,
    wait_deployment,
    workload_pods,
)
from harness.node import Node
from harness.release import Release
from tests.node.rollouts import set_greeting

pytestmark = pytest.mark.usefixtures("pinned")

APPS = ("one", "two", "three")


def test_wait_returns_0_only_once_every_container_reads_the_new_content(
    k8s: client.ApiClient, node: Node, configpin: Release, namespace: str
) -> None:
    """Three Deployments of two pods each read `settings`' greeting: two from their
    environment, one from a mounted file. The greeting changes and `kubectl configpin wait` is
    started in the same instant: when it exits 0, every pod of the three is Ready and its
    container's last read is the new greeting."""
    set_greeting(k8s, namespace, "old", create=True)
    apps = client.AppsV1Api(k8s)
    for name in APPS:
        files = ("greeting",) if name == "three" else ()
        env = {} if name == "three" else {"GREETING": "greeting"}
        body = reader_workload(
            "Deployment", name, images.SHELL.ref, configmap="settings", files=files, env=env
        )
        apps.create_namespaced_deployment(namespace, body)
    for name in APPS:
        wait_deployment(k8s, namespace, name)
    plugin = str(Path(sys.executable).parent / "kubectl-configpin")
    env = {**os.environ, "KUBECONFIG": str(node.plane.kubeconfig)}
    argv = [plugin, "wait", "configmap/settings", "-n", namespace, "--timeout", "240s"]

    set_greeting(k8s, namespace, "new")
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300, check=False)

    read: dict[str, str] = {}
    for name in APPS:
        key = "file:/config/greeting" if name == "three" else "env:GREETING"
        for pod in workload_pods(k8s, namespace, name):
            seen = last_seen(k8s, namespace, pod.metadata.name)
            read[pod.metadata.name] = f"{is_ready(pod)} {seen.values.get(key) if seen else None}"
    assert done.returncode == 0, done.stdout + done.stderr
    assert "configmap/settings delivered" in done.stdout, done.stdout
    assert len(read) == 2 * len(APPS) and set(read.values()) == {"True new"}, read
    for name in ("one", "two"):
        wait_all_read(k8s, namespace, name, {"env:GREETING": "new"}, timeout=5)
