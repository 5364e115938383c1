"""A node leaves nothing on this machine: not when it is torn down, and not when the run that
started it was killed outright (the next start cleans up).

Each test starts a node of its own, with a pod reading a ConfigMap volume and a Service, so that
every kind of leftover existed (mounts, pod network namespaces, veths, kube-proxy's and CNI's
rules, containerd shims and containers), and compares this machine before and after
(harness.node.machine_state: links, network namespaces, mounts, iptables rules, the node's
processes and cgroups, the kernel settings the kubelet changes).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from kubernetes import client, config

from harness import images
from harness.apps import reader_container, wait_ready, wait_seen
from harness.controlplane import wait_for
from harness.node import (
    CGROUP_PREFIX,
    LINK_PREFIX,
    _Cgroup,
    clean_stale_nodes,
    live_runs,
    machine_state,
    running_node,
    state_diff,
)


def _busy_node(api: client.ApiClient) -> None:
    """A pod that mounts a ConfigMap, runs (shim, pause, container) and backs a Service."""
    core = client.CoreV1Api(api)
    core.create_namespaced_config_map(
        "default", {"metadata": {"name": "left"}, "data": {"value": "behind"}}
    )
    core.create_namespaced_service(
        "default",
        {
            "metadata": {"name": "left"},
            "spec": {"selector": {"app": "left"}, "ports": [{"port": 80}]},
        },
    )
    container = reader_container(
        images.SHELL.ref,
        files=["/config/value"],
        volume_mounts=[{"name": "config", "mountPath": "/config"}],
    )
    core.create_namespaced_pod(
        "default",
        {
            "metadata": {"name": "left", "labels": {"app": "left"}},
            "spec": {
                "containers": [container],
                "volumes": [{"name": "config", "configMap": {"name": "left"}}],
            },
        },
    )
    wait_ready(api, "default", "left")
    wait_seen(api, "default", "left", {"file:/config/value": "behind"})


def _others(run: str) -> set[str]:
    """The other nodes running on this machine now (another test run's, say)."""
    return set(live_runs()) - {run}


def _comms(cgroup: str) -> list[str]:
    names = []
    for pid in _Cgroup(cgroup).pids():
        with contextlib.suppress(OSError):
            names.append(Path(f"/proc/{pid}/comm").read_text().strip())
    return sorted(names)


def test_teardown_leaves_nothing_behind(tmp_path: Path, node_images: list[Path]) -> None:
    clean_stale_nodes()  # an earlier killed run's: not this test's business
    before = machine_state(tmp_path, exclude_runs=live_runs())
    with running_node(tmp_path, images=node_images, pause_image=images.PAUSE.ref) as node:
        with node.plane.api_client() as api:
            _busy_node(api)
        run = node.link.removeprefix(LINK_PREFIX)
        during = machine_state(tmp_path, exclude_runs=_others(run))
        # While it runs the node shows on this machine: its link, cgroups, processes...
        added = state_diff(before, during)
        assert node.link in added["links"]
        assert any(node.cgroup in c for c in added["cgroups"])
        assert "pause" in _comms(node.cgroup)
        # ... and keeps the rest to itself: rules and mounts are in its own namespaces.
        assert "KUBE-SERVICES" in node.host_run("iptables-save").stdout
        assert "iptables" not in added
        assert "mounts" not in added
    after = machine_state(tmp_path, exclude_runs=_others(run))
    assert state_diff(before, after) == {}


def test_a_killed_run_is_cleaned_at_the_next_start(tmp_path: Path) -> None:
    """The node is started by another process (`python -m harness.node`), which is then killed
    with SIGKILL, as a CI job's pytest may be: no teardown runs. Its containers and shims
    outlive it; clean_stale_nodes (which every node start calls first) removes them."""
    before = machine_state(tmp_path, exclude_runs=live_runs())
    argv = [sys.executable, "-m", "harness.node", "--workdir", str(tmp_path / "killed")]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert line, f"python -m harness.node exited with {proc.wait()}"
            started = json.loads(line)
            configuration = client.Configuration()
            config.load_kube_config(started["kubeconfig"], client_configuration=configuration)
            with client.ApiClient(configuration) as api:
                _busy_node(api)
        finally:
            os.kill(proc.pid, signal.SIGKILL)
    run = started["link"].removeprefix(LINK_PREFIX)
    [name] = {Path(c).name for c in machine_state()["cgroups"] if c.endswith(run)}
    assert name.startswith(CGROUP_PREFIX)
    # The node's own processes die with the process that started them (PDEATHSIG); what is
    # left is what no teardown ran for: containerd's shims and the pod's containers.
    wait_for(lambda: "kubelet" not in _comms(name), timeout=30, what="the kubelet to die")
    assert "pause" in _comms(name)
    assert Path("/sys/class/net", started["link"]).exists()

    assert name in clean_stale_nodes()
    after = machine_state(tmp_path, exclude_runs=live_runs())
    assert state_diff(before, after) == {}
