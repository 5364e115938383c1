"""Fixtures of a test module that runs against one configpin of its own."""

from __future__ import annotations

import secrets
import signal
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from harness.configpin import (
    Configpin,
    ensure_namespace,
    instance_namespace,
    leading_configpin,
    lease_name,
    running_configpin,
    start_configpin,
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


class Replicas:
    """Two configpin replicas of one instance, as the chart runs them; the webhook calls the
    first. `kill_leader` kills the one that leads (SIGKILL: its Lease must expire) and starts
    another in its place, registered as the webhook where the killed one was."""

    def __init__(self, plane: ControlPlane, tmp: Path, args: Sequence[str], prefix: str) -> None:
        self.plane = plane
        self.tmp = tmp
        self.args = list(args)
        self.instance = f"{prefix}{secrets.token_hex(3)}"
        self.webhook = f"configpin-{self.instance}"
        self.lease = lease_name(self.instance)
        self.running: list[tuple[Configpin, bool]] = []
        self._n = 0

    def start(self, *, webhook: bool) -> Configpin:
        self._n += 1
        cp = start_configpin(
            self.plane,
            self.tmp / f"replica-{self._n}",
            args=self.args,
            instance=self.instance,
            webhook_name=self.webhook if webhook else None,
        )
        self.running.append((cp, webhook))
        return cp

    def all(self) -> list[Configpin]:
        return [cp for cp, _ in self.running if cp.alive()]

    def leader(self) -> Configpin:
        found = wait_for(lambda: leader(self.all()), what="one replica leading")
        assert found is not None
        return found

    def kill_leader(self) -> None:
        lead = self.leader()
        webhook = next(w for cp, w in self.running if cp is lead)
        lead.stop(signal.SIGKILL)
        self.start(webhook=webhook)
        wait_for(lambda: leader(self.all()) is not None, timeout=60, what="a new leader")

    def stop(self) -> None:
        for cp, _ in self.running:
            cp.stop()


def replicas_pair(prefix: str, args: Sequence[str]) -> Any:
    """A module-scoped fixture: a `Replicas` of a new instance (named from `prefix`), started,
    one leading; its logs printed on the way out. Use as `replicas = replicas_pair(...)`."""

    @pytest.fixture(scope="module")
    def replicas(
        control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
    ) -> Iterator[Replicas]:
        with control_plane.api_client() as api:
            ensure_namespace(api)
        pair = Replicas(control_plane, tmp_path_factory.mktemp(f"configpin-{prefix}"), args, prefix)
        try:
            pair.start(webhook=True)
            pair.start(webhook=False)
            pair.leader()
            yield pair
        finally:
            for cp, _ in pair.running:
                print(f"--- {cp.url}\n{cp.log()[-6000:]}")
            pair.stop()

    return replicas


def replicas_fixtures(prefix: str, args: Sequence[str]) -> tuple[Any, Any]:
    """The two fixtures of a module that runs against two replicas of its own: `replicas` (see
    `replicas_pair`) and `ns`, a fresh namespace opted in for that instance alone (per test).
    Use as `replicas, ns = replicas_fixtures(...)` at module level."""

    @pytest.fixture
    def ns(k8s: client.ApiClient, replicas: Replicas) -> Iterator[str]:
        with instance_namespace(k8s, replicas.instance, prefix) as name:
            yield name

    return replicas_pair(prefix, args), ns
