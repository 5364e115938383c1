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
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType

import pytest
from kubernetes import client

from harness import images
from harness.controlplane import ENABLED_LABEL, default_service_account_ready, wait_for
from harness.node import Node, running_node
from harness.release import Release, installed

_HERE = Path(__file__).parent
_REPORT: list[str] = []  # figures measured on the way, printed in pytest's closing summary
# Modules run in this order (the rest after them, alphabetically): the teardown tests start
# nodes of their own before the session's node exists; the release's upgrade and uninstall
# come after every test that needs configpin installed.
ORDER = (
    "test_teardown.py",
    "test_node.py",
    "test_production.py",
    "test_checksum.py",
    "test_snapshot.py",
    "test_delivery.py",
    "test_refresh.py",
    "test_faults.py",
)
LAST = ("test_upgrade.py",)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config: pytest.Config) -> None:
    signal.signal(signal.SIGTERM, _interrupt)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(_HERE):
            item.add_marker(pytest.mark.node)

    def rank(item: pytest.Item) -> int:
        name = item.path.name
        if name in ORDER:
            return ORDER.index(name)
        return len(ORDER) + 1 + LAST.index(name) if name in LAST else len(ORDER)

    # only this suite's items are reordered, in the places they hold; sorted() is stable, so
    # the order within a module stays
    slots = [i for i, item in enumerate(items) if item.path.is_relative_to(_HERE)]
    for slot, item in zip(slots, sorted((items[i] for i in slots), key=rank), strict=True):
        items[slot] = item


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for line in _REPORT:
        terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def report() -> Callable[[str], None]:
    """Say a measured figure in the closing summary (what `make test` shows)."""
    return _REPORT.append


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
        _REPORT.append(
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


@pytest.fixture(scope="session")
def configpin(node: Node) -> Iterator[Release]:
    """configpin installed on the node by `helm install` of charts/configpin, only the image
    values changed (harness/release.py), both replicas Ready. Uninstalled at the end, unless a
    test did it already (test_upgrade.py)."""
    archive = images.ensure(images.CONFIGPIN)
    with installed(node, archive, images.CONFIGPIN.ref) as release:
        yield release


@pytest.fixture
def pinned(k8s: client.ApiClient, configpin: Release, namespace: str) -> str:
    """`namespace`, once configpin's webhook pins workloads there (after an install or an
    upgrade its pods are Ready a moment before the Service reaches them)."""
    configpin.wait_answering(k8s, namespace)
    return namespace


@pytest.fixture(scope="session")
def snapshots(k8s: client.ApiClient, configpin: Release) -> Release:
    """The release with snapshots.enabled: true (snapshot mode writes ConfigMaps, which the
    chart grants only when asked); it stays so for the rest of the session."""
    if not configpin.values.get("snapshots", {}).get("enabled"):
        configpin.upgrade({**configpin.values, "snapshots": {"enabled": True}})
        configpin.wait_ready(k8s)
    return configpin
