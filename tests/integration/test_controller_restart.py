"""Reconcile against recorded state: a restart rolls nothing current, and a change made
while configpin was down rolls once when it is back."""

from __future__ import annotations

import contextlib
import json
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kubernetes import client

from tests.integration.configpin_proc import (
    INSTANCE_LABEL,
    Configpin,
    ensure_namespace,
    start_configpin,
)
from tests.integration.controlplane import (
    ENABLED_LABEL,
    ControlPlane,
    default_service_account_ready,
    unregister_webhook,
    wait_for,
)
from webhook.core.constants import ANN_SOURCES
from webhook.kube.raw import Kube, path

WINDOW = 0.5
SETTLE = WINDOW + 2.0


def _deployment(name: str) -> dict[str, Any]:
    env = [{"name": "A", "valueFrom": {"configMapKeyRef": {"name": "app-config", "key": "a"}}}]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "containers": [{"name": "app", "image": "registry.invalid/a", "env": env}]
                },
            },
        },
    }


def _sources(obj: dict[str, Any]) -> dict[str, str]:
    meta = obj["spec"]["template"].get("metadata") or {}
    return json.loads((meta.get("annotations") or {}).get(ANN_SOURCES, "{}"))


@contextlib.contextmanager
def _instance_namespace(api: client.ApiClient, instance: str) -> Iterator[str]:
    core = client.CoreV1Api(api)
    name = f"{instance}-{secrets.token_hex(4)}"
    labels = {ENABLED_LABEL: "true", INSTANCE_LABEL: instance}
    core.create_namespace({"metadata": {"name": name, "labels": labels}})
    try:
        wait_for(lambda: default_service_account_ready(api, name), what="default SA")
        yield name
    finally:
        core.delete_namespace(name)


def test_change_while_stopped_rolls_once_and_a_restart_rolls_nothing(
    control_plane: ControlPlane, k8s: client.ApiClient, tmp_path: Path
) -> None:
    instance = f"restart{secrets.token_hex(2)}"
    webhook = f"configpin-{instance}"
    args = [
        "--coalesce-window", str(WINDOW),
        "--min-rollout-interval", "0",
        "--lease-name", f"configpin-leader-{instance}",
    ]  # fmt: skip
    ensure_namespace(k8s)
    kube = Kube(k8s)
    running: list[Configpin] = []

    def start(n: int) -> Configpin:
        cp = start_configpin(
            control_plane, tmp_path / str(n), args=args, instance=instance, webhook_name=webhook
        )
        running.append(cp)
        wait_for(lambda: cp.metric("configpin_leader") == 1, what=f"configpin #{n} leading")
        return cp

    def replicasets() -> int:
        page = kube.get(path("replicasets", ns), labelSelector="app=web")
        return len(page.get("items") or ())

    with _instance_namespace(k8s, instance) as ns:
        try:
            first = start(1)
            kube.create(
                path("configmaps", ns),
                {"metadata": {"name": "app-config"}, "data": {"a": "1"}},
            )
            stamped = _sources(kube.create(path("deployments", ns), _deployment("web")))
            assert stamped
            wait_for(lambda: replicasets() == 1, what="the first ReplicaSet")
            first.stop()

            # Changed while no configpin runs: nobody sees the event.
            kube.patch(
                path("configmaps", ns, "app-config"),
                {"data": {"a": "2"}},
                content_type="application/merge-patch+json",
            )
            time.sleep(SETTLE)
            assert replicasets() == 1

            second = start(2)
            wait_for(lambda: replicasets() == 2, what="the change made while down rolled")
            assert _sources(kube.get(path("deployments", ns, "web"))) != stamped
            time.sleep(SETTLE)
            assert replicasets() == 2
            assert second.metric("configpin_rollouts_total", kind="Deployment") == 1
            second.stop()

            # Started again with nothing changed: it looks at the workload and leaves it.
            third = start(3)
            wait_for(
                lambda: third.metric("configpin_rollouts_skipped_total", reason="current") >= 1,
                what="the workload checked against its recorded state",
            )
            time.sleep(SETTLE)
            assert replicasets() == 2
            assert third.metric("configpin_rollouts_total") == 0
        finally:
            for cp in running:
                cp.stop()
            unregister_webhook(k8s, webhook)
