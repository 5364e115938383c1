"""Fixtures for tests against a real control plane (see controlplane.py).

Everything under tests/integration is marked ``integration``. When the control plane cannot be
provisioned or started, every test that needs it errors with the reason: nothing is skipped.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from harness.chart import install_crds
from harness.configpin import Configpin, ensure_namespace, running_configpin
from harness.controlplane import (
    ENABLED_LABEL,
    ControlPlane,
    default_service_account_ready,
    running_control_plane,
    wait_for,
)
from webhook.kube.raw import Kube

_HERE = Path(__file__).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(_HERE):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """etcd + kube-apiserver + kube-controller-manager, once per session.

    Logs: ``control_plane.log_dir`` (kept under pytest's basetemp after the run).
    """
    with running_control_plane(tmp_path_factory.mktemp("control-plane")) as plane:
        with plane.api_client() as api:
            install_crds(api)  # (as the chart installs them: configpin publishes ConfigRollouts)
        yield plane


@pytest.fixture(scope="session")
def k8s(control_plane: ControlPlane) -> Iterator[client.ApiClient]:
    """One ApiClient (system:masters) for the session."""
    with control_plane.api_client() as api:
        yield api


@pytest.fixture(scope="session")
def kube(k8s: client.ApiClient) -> Kube:
    """The raw JSON client over the session's ApiClient (what configpin itself uses)."""
    return Kube(k8s)


def _namespace_name(request: pytest.FixtureRequest) -> str:
    stem = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    return f"{stem or 'test'}-{secrets.token_hex(4)}"


def _create_namespace(
    api: client.ApiClient, request: pytest.FixtureRequest, labels: dict[str, str]
) -> Iterator[str]:
    core = client.CoreV1Api(api)
    name = _namespace_name(request)
    core.create_namespace(
        client.V1Namespace.model_validate({"metadata": {"name": name, "labels": labels}})
    )
    try:
        # Pods are rejected until the token controller has filled in the default account.
        wait_for(
            lambda: default_service_account_ready(api, name),
            timeout=30,
            what=f"ServiceAccount {name}/default with its token Secret",
        )
        yield name
    finally:
        # Deletion is asynchronous (the namespace controller finalizes it); nobody waits for it.
        try:
            core.delete_namespace(name)
        except client.ApiException as e:
            if e.status != 404:
                raise


@pytest.fixture
def namespace(k8s: client.ApiClient, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace opted in to configpin (``configpin.io/enabled: "true"``)."""
    yield from _create_namespace(k8s, request, {ENABLED_LABEL: "true"})


@pytest.fixture
def plain_namespace(k8s: client.ApiClient, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace without the opt-in label."""
    yield from _create_namespace(k8s, request, {})


@pytest.fixture(scope="session")
def configpin(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Configpin]:
    """The session's configpin (checksum mode by default), registered as webhook `configpin-test`.

    It serves and controls namespaces opted in that carry no instance label; tests that need
    a configpin of their own use `start_configpin(..., instance=...)` and label their namespace.
    """
    with control_plane.api_client() as api:
        ensure_namespace(api)
    with running_configpin(
        control_plane, tmp_path_factory.mktemp("configpin"), webhook_name="configpin-test"
    ) as cp:
        yield cp
