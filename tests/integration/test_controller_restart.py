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

from harness.configpin import INSTANCE_LABEL, Configpin, leading_configpin
from harness.controlplane import (
    ENABLED_LABEL,
    ControlPlane,
    default_service_account_ready,
    wait_for,
)
from harness.manifests import configmap, deployment
from tests.timing import SETTLE, WINDOW
from webhook.core.constants import ANN_SOURCES
from webhook.kube.raw import Kube, path


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
    args = ["--coalesce-window", str(WINDOW), "--min-rollout-interval", "0"]
    kube = Kube(k8s)

    def replicasets() -> int:
        page = kube.get(path("replicasets", ns), labelSelector="app=web")
        return len(page.get("items") or ())

    # Every instance is stopped and the webhook unregistered only at the end; until then the
    # webhook configuration stays as the last start left it, stopped instance or not.
    with _instance_namespace(k8s, instance) as ns, contextlib.ExitStack() as running:

        def start(n: int) -> Configpin:
            return running.enter_context(
                leading_configpin(
                    control_plane,
                    tmp_path / str(n),
                    instance=instance,
                    webhook_name=webhook,
                    args=args,
                )
            )

        first = start(1)
        kube.create(path("configmaps", ns), configmap("app-config", {"a": "1"}))
        stamped = _sources(kube.create(path("deployments", ns), deployment("web", replicas=1)))
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
