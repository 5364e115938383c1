"""Two configpin replicas: one leader acts, the standby follows and takes over.

Both serve the webhook (each replica's /readyz is independent of leadership); the webhook
configuration points at the first. When the first is stopped the API server's calls fail
and failurePolicy Ignore lets writes through, which the controller's patches do not need.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kubernetes import client

from harness.configpin import (
    CONFIGPIN_NAMESPACE,
    INSTANCE_LABEL,
    Configpin,
    ensure_namespace,
    lease_name,
    start_configpin,
)
from harness.controlplane import (
    ENABLED_LABEL,
    ControlPlane,
    default_service_account_ready,
    unregister_webhook,
    wait_for,
)
from harness.manifests import configmap, deployment
from webhook.core.constants import ANN_SOURCES
from webhook.kube.raw import Kube, path

LEASE_DURATION = 4.0
WINDOW = 0.3


def _sources(obj: dict[str, Any]) -> dict[str, str]:
    meta = obj["spec"]["template"].get("metadata") or {}
    return json.loads((meta.get("annotations") or {}).get(ANN_SOURCES, "{}"))


class Pair:
    def __init__(self, plane: ControlPlane, api: client.ApiClient, tmp: Path) -> None:
        self.plane = plane
        self.kube = Kube(api)
        self.instance = f"ha{secrets.token_hex(3)}"
        self.webhook = f"configpin-{self.instance}"
        self.lease = lease_name(self.instance)  # start_configpin passes it
        self.tmp = tmp
        self.replicas: list[Configpin] = []

    def start(self, n: int, *, webhook: bool) -> Configpin:
        args = [
            "--coalesce-window", str(WINDOW),
            "--min-rollout-interval", "0",
            "--lease-duration", str(LEASE_DURATION),
        ]  # fmt: skip
        cp = start_configpin(
            self.plane,
            self.tmp / f"replica-{n}",
            args=args,
            instance=self.instance,
            webhook_name=self.webhook if webhook else None,
        )
        self.replicas.append(cp)
        return cp

    def leaders(self) -> list[Configpin]:
        return [cp for cp in self.replicas if cp.alive() and cp.metric("configpin_leader") == 1]

    def holder(self) -> str:
        lease = self.kube.get(path("leases", CONFIGPIN_NAMESPACE, self.lease))
        return str(lease["spec"].get("holderIdentity") or "")

    def stop(self) -> None:
        for cp in self.replicas:
            cp.stop()
        with contextlib.suppress(Exception):
            unregister_webhook(self.kube.api, self.webhook)


@contextlib.contextmanager
def _pair(plane: ControlPlane, api: client.ApiClient, tmp: Path) -> Iterator[tuple[Pair, str]]:
    ensure_namespace(api)
    pair = Pair(plane, api, tmp)
    core = client.CoreV1Api(api)
    ns = f"{pair.instance}-{secrets.token_hex(3)}"
    labels = {ENABLED_LABEL: "true", INSTANCE_LABEL: pair.instance}
    core.create_namespace({"metadata": {"name": ns, "labels": labels}})
    try:
        wait_for(lambda: default_service_account_ready(api, ns), what="default SA")
        pair.start(1, webhook=True)
        pair.start(2, webhook=False)
        yield pair, ns
    finally:
        pair.stop()
        core.delete_namespace(ns)


def _identity(cp: Configpin) -> str:
    for line in cp.log().splitlines():
        if ": acquired as " in line:
            return line.rsplit(": acquired as ", 1)[1].strip()
    raise AssertionError("no acquisition in the log")


def _set(kube: Kube, ns: str, value: str) -> None:
    kube.patch(
        path("configmaps", ns, "app-config"),
        {"data": {"a": value}},
        content_type="application/merge-patch+json",
    )


def _prepare(pair: Pair, ns: str) -> tuple[Configpin, Configpin, dict[str, str]]:
    """One leader, one standby; a Deployment stamped and rolled once by the leader (what it
    was rolled to is returned with them)."""
    kube = pair.kube
    (leader,) = wait_for(lambda: pair.leaders(), what="a leader")
    time.sleep(LEASE_DURATION / 3 * 1.5)  # a standby's attempt or two: still one leader
    assert pair.leaders() == [leader]
    standby = next(cp for cp in pair.replicas if cp is not leader)
    assert pair.holder() == _identity(leader)
    assert standby.get("/readyz")[0] == 200  # the standby serves the webhook as well

    kube.create(path("configmaps", ns), configmap("app-config", {"a": "1"}))
    kube.create(path("deployments", ns), deployment("web"))
    before = _sources(kube.get(path("deployments", ns, "web")))
    assert before
    _set(kube, ns, "2")
    wait_for(
        lambda: _sources(kube.get(path("deployments", ns, "web"))) != before,
        what="the leader rolling the change",
    )
    wait_for(lambda: standby.metric("configpin_source_changes_total") >= 1, what="standby saw it")
    assert leader.metric("configpin_rollouts_total") == 1
    assert standby.metric("configpin_rollouts_total") == 0
    return leader, standby, _sources(kube.get(path("deployments", ns, "web")))


def _rolled_since(
    kube: Kube, ns: str, rolled: object, since: float, timeout: float, event: str
) -> float:
    """Seconds from `since` (when `event` happened) until the standby rolled the change."""
    wait_for(
        lambda: _sources(kube.get(path("deployments", ns, "web"))) != rolled,
        timeout=timeout,
        interval=0.05,
        what=f"the standby rolling the change after {event}",
    )
    took = time.monotonic() - since
    print(f"standby rolled {took:.2f}s after {event}")
    return took


def test_standby_takes_over_at_once_when_the_leader_stops(
    control_plane: ControlPlane, k8s: client.ApiClient, tmp_path: Path
) -> None:
    with _pair(control_plane, k8s, tmp_path) as (pair, ns):
        leader, standby, rolled = _prepare(pair, ns)

        assert leader.stop() == 0  # SIGTERM: releases the Lease on the way out
        stopped = time.monotonic()
        _set(pair.kube, ns, "3")
        took = _rolled_since(pair.kube, ns, rolled, stopped, LEASE_DURATION, "the leader stopped")
        assert took < LEASE_DURATION
        assert standby.metric("configpin_leader") == 1
        assert standby.metric("configpin_rollouts_total") == 1
        assert pair.holder() == _identity(standby)


def test_standby_takes_over_when_the_leader_dies(
    control_plane: ControlPlane, k8s: client.ApiClient, tmp_path: Path
) -> None:
    with _pair(control_plane, k8s, tmp_path) as (pair, ns):
        leader, standby, rolled = _prepare(pair, ns)

        leader.stop(signal.SIGKILL)  # no release: the Lease must expire
        died = time.monotonic()
        _set(pair.kube, ns, "3")
        # The standby counts the lease duration from when it last saw the record change
        # (at most one of its retry periods after the last renewal), then tries again
        # within one more retry period (jittered by up to 20%). The slack is for a loaded
        # machine (a late renewal read, a slow rollout write), not for a missed takeover:
        # that never ends.
        bound = LEASE_DURATION + 2 * 1.2 * LEASE_DURATION / 3 + WINDOW + 3.0
        took = _rolled_since(pair.kube, ns, rolled, died, bound, "the leader died")
        assert took < bound
        assert standby.metric("configpin_leader") == 1
        assert pair.holder() == _identity(standby)
