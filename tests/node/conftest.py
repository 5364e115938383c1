"""Fixtures for tests on a real node (harness/node.py): pods run, and tests assert what they read.

Everything under tests/node is marked ``node``. The node (a control plane from
``$KUBEBUILDER_ASSETS``, containerd, kubelet, kube-proxy, kube-scheduler) is started once per
session; its images (harness/images.py) are built if needed. When it cannot be provisioned or
started, every test that needs it errors with the reason: nothing is skipped.

SIGTERM (a CI job's timeout) is turned into KeyboardInterrupt, so that the node is torn down as
on Ctrl-C; a run killed outright is cleaned up by the next one (harness/node.py).
"""

from __future__ import annotations

import re
import secrets
import signal
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import pytest
from kubernetes import client

from harness import images
from harness.controlplane import ENABLED_LABEL, default_service_account_ready, wait_for
from harness.node import Node, running_node

_HERE = Path(__file__).parent
_STARTUPS: list[str] = []


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config: pytest.Config) -> None:
    signal.signal(signal.SIGTERM, _interrupt)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(_HERE):
            item.add_marker(pytest.mark.node)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for line in _STARTUPS:
        terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def node_images() -> list[Path]:
    """The archives every node imports: the sandbox (pause) and the applications' shell."""
    return [images.ensure(images.PAUSE), images.ensure(images.SHELL)]


@pytest.fixture(scope="session")
def node(tmp_path_factory: pytest.TempPathFactory, node_images: list[Path]) -> Iterator[Node]:
    """The session's node and its control plane. Logs: ``node.log_dir`` and
    ``node.plane.log_dir`` (kept under pytest's basetemp)."""
    with running_node(
        tmp_path_factory.mktemp("node"), images=node_images, pause_image=images.PAUSE.ref
    ) as started:
        _STARTUPS.append(
            f"node: Kubernetes 1.{started.minor} Ready in {started.startup_seconds:.1f}s "
            f"(control plane, containerd, kubelet, kube-proxy, scheduler)"
        )
        yield started


@pytest.fixture(scope="session")
def k8s(node: Node) -> Iterator[client.ApiClient]:
    """One ApiClient (system:masters) for the session."""
    with node.plane.api_client() as api:
        yield api


def _namespace_name(request: pytest.FixtureRequest) -> str:
    stem = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    return f"{stem or 'test'}-{secrets.token_hex(4)}"


def create_namespace(api: client.ApiClient, name: str, labels: dict[str, str]) -> str:
    core = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": name, "labels": labels}})
    wait_for(
        lambda: default_service_account_ready(api, name),
        timeout=30,
        what=f"ServiceAccount {name}/default",
    )
    return name


@pytest.fixture
def namespace(k8s: client.ApiClient, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace, opted in to configpin (which acts there only where it runs)."""
    name = create_namespace(k8s, _namespace_name(request), {ENABLED_LABEL: "true"})
    try:
        yield name
    finally:
        # The pods go with it; nobody waits (the node is torn down with the session anyway).
        client.CoreV1Api(k8s).delete_namespace(name)
