"""Fixtures of a test module that runs against one configpin of its own."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from kubernetes import client

from harness.configpin import (
    Configpin,
    ensure_namespace,
    instance_namespace,
    leading_configpin,
    running_configpin,
)
from harness.controlplane import ControlPlane, wait_for


def leader(pair: Sequence[Configpin]) -> Configpin | None:
    """The one replica of `pair` that leads (None: none, or not one alone)."""
    leading = [cp for cp in pair if cp.alive() and cp.metric("configpin_leader") == 1]
    return leading[0] if len(leading) == 1 else None


def replicas_fixture(instance: str, prefix: str, args: Sequence[str]) -> Any:
    """A module-scoped fixture: two configpin replicas of `instance`, as the chart runs them
    (one Lease; the webhook, registered from the chart's own entry as `configpin-<prefix>`,
    calls the first), once one leads. Use as `replicas = replicas_fixture(...)`."""

    @pytest.fixture(scope="module")
    def replicas(
        control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
    ) -> Iterator[list[Configpin]]:
        work = tmp_path_factory.mktemp(f"configpin-{prefix}")
        with control_plane.api_client() as api:
            ensure_namespace(api)
        with (
            running_configpin(
                control_plane,
                work / "a",
                args=args,
                instance=instance,
                webhook_name=f"configpin-{prefix}",
            ) as a,
            running_configpin(control_plane, work / "b", args=args, instance=instance) as b,
        ):
            wait_for(lambda: leader([a, b]) is not None, what="one replica leading")
            yield [a, b]

    return replicas


def leading_fixture(instance: str, prefix: str, args: Sequence[str]) -> Any:
    """A module-scoped fixture: a configpin of its own for the module, leading with `args`,
    serving only namespaces labelled for `instance`, its webhook named `configpin-<prefix>`.
    Use as `cp = leading_fixture(...)` at module level."""

    @pytest.fixture(scope="module")
    def cp(
        control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
    ) -> Iterator[Configpin]:
        with leading_configpin(
            control_plane,
            tmp_path_factory.mktemp(f"configpin-{prefix}"),
            instance=instance,
            webhook_name=f"configpin-{prefix}",
            args=args,
        ) as proc:
            yield proc

    return cp


def instance_fixtures(instance: str, prefix: str, args: Sequence[str]) -> tuple[Any, Any]:
    """The two fixtures of a module that runs against one configpin of its own: `cp` (see
    `leading_fixture`) and `ns`, a fresh namespace opted in for it alone (per test).
    Use as `cp, ns = instance_fixtures(...)` at module level."""

    @pytest.fixture
    def ns(k8s: client.ApiClient, cp: Configpin) -> Iterator[str]:
        with instance_namespace(k8s, instance, prefix) as name:
            yield name

    return leading_fixture(instance, prefix, args), ns
