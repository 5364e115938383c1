"""configpin_workloads_stale and configpin_workload_stale_seconds_max, live: a workload held
stale by the minimum interval between rollouts is counted, its age grows, and it stops
counting once it is current again."""

from __future__ import annotations

import time

from kubernetes import client

from harness.configpin import (
    Configpin,
)
from harness.controlplane import wait_for
from harness.manifests import configmap, deployment
from tests.integration.instances import instance_fixtures
from webhook.core.constants import ANN_SOURCES
from webhook.kube.raw import MERGE_PATCH, Kube, path

INSTANCE = "stale"


cp, ns = instance_fixtures(
    INSTANCE, "stale", ["--coalesce-window", "0.5", "--min-rollout-interval", "300"]
)


def _record(kube: Kube, ns: str) -> str:
    dep = kube.get(path("deployments", ns, "web"))
    return str(dep["spec"]["template"]["metadata"]["annotations"][ANN_SOURCES])


def _set(kube: Kube, ns: str, value: str) -> None:
    kube.patch(path("configmaps", ns, "app-config"), {"data": {"a": value}}, MERGE_PATCH)


def test_a_workload_held_back_by_the_minimum_interval_is_counted_stale(
    k8s: client.ApiClient, ns: str, cp: Configpin
) -> None:
    kube = Kube(k8s)
    kube.create(path("configmaps", ns), configmap("app-config", {"a": "1"}))
    kube.create(path("deployments", ns), deployment("web"))
    first = _record(kube, ns)
    _set(kube, ns, "2")  # rolls at once: it never rolled before
    rolled = wait_for(lambda: _record(kube, ns) != first and _record(kube, ns), what="a rollout")
    wait_for(lambda: cp.metric("configpin_workloads_stale") == 0, what="nothing stale")
    assert cp.metric("configpin_workload_stale_seconds_max") == 0

    _set(kube, ns, "3")  # within the 300 s interval: deferred, so it stays stale
    wait_for(lambda: cp.metric("configpin_workloads_stale") == 1, what="one stale workload")
    young = cp.metric("configpin_workload_stale_seconds_max")
    time.sleep(3)
    older = cp.metric("configpin_workload_stale_seconds_max")
    assert older >= young + 2.5, (young, older)
    assert _record(kube, ns) == rolled, "not rolled within the minimum interval"

    _set(kube, ns, "2")  # back to what it recorded: current again, nothing to roll
    wait_for(lambda: cp.metric("configpin_workloads_stale") == 0, what="nothing stale again")
    assert cp.metric("configpin_workload_stale_seconds_max") == 0
    assert _record(kube, ns) == rolled
