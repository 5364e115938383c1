"""Faults during a fan-out: the leading configpin pod is deleted while it re-stamps 50
Deployments that share a ConfigMap; the other replica takes over from what is recorded on the
workloads, and every Deployment rolls exactly once, to pods that read the new content."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client

from harness import images
from harness.apps import parse_seen, pod_log
from harness.controlplane import wait_for
from harness.release import Release
from tests.timing import NODE_SETTLE
from webhook.core.constants import ANN_CHECKSUM

COUNT = 50
SETTLE = 2 * NODE_SETTLE  # (a fan-out cut in the middle, then picked up by a new leader)
# The fan-out is made slow enough to be cut in the middle (the default, 200 requests a second,
# re-stamps 50 Deployments in well under a second): 10 requests a second, no burst. A value an
# operator may set; it stays for the rest of the session (only test_upgrade.py follows, which
# rolls nothing).
SLOW = {"qps": 10, "burst": 1}

# Says once what it read, then sleeps: 50 of them cost nothing while they wait.
SAY_AND_SLEEP = 'echo "seen 0 env:MOOD=$MOOD"; exec sleep 3600'


@pytest.fixture
def slow_fan_out(k8s: client.ApiClient, configpin: Release) -> Release:
    values = configpin.values
    configpin.upgrade({**values, "controller": {**values.get("controller", {}), **SLOW}})
    configpin.wait_ready(k8s)
    return configpin


def _deployment(name: str) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "terminationGracePeriodSeconds": 1,
                    "containers": [
                        {
                            "name": "app",
                            "image": images.SHELL.ref,
                            "imagePullPolicy": "Never",
                            "command": ["sh", "-c", SAY_AND_SLEEP],
                            "env": [
                                {
                                    "name": "MOOD",
                                    "valueFrom": {
                                        "configMapKeyRef": {"name": "shared", "key": "mood"}
                                    },
                                }
                            ],
                            "resources": {"requests": {"cpu": "1m", "memory": "4Mi"}},
                        }
                    ],
                },
            },
        },
    }


def _checksums(api: client.ApiClient, namespace: str) -> dict[str, str]:
    items = client.AppsV1Api(api).list_namespaced_deployment(namespace).items
    return {d.metadata.name: d.spec.template.metadata.annotations[ANN_CHECKSUM] for d in items}


def _all_rolled_out(api: client.ApiClient, namespace: str) -> bool:
    items = client.AppsV1Api(api).list_namespaced_deployment(namespace).items
    return len(items) == COUNT and all(
        (d.status.observed_generation or 0) >= d.metadata.generation
        and d.status.updated_replicas == 1
        and d.status.ready_replicas == 1
        and (d.status.replicas or 0) == 1
        for d in items
    )


def _revisions(api: client.ApiClient, namespace: str) -> Counter[str]:
    """How many ReplicaSets each Deployment has."""
    owners = Counter[str]()
    for rs in client.AppsV1Api(api).list_namespaced_replica_set(namespace).items:
        for owner in rs.metadata.owner_references or ():
            if owner.kind == "Deployment":
                owners[owner.name] += 1
    return owners


def test_the_leader_deleted_mid_fan_out_every_deployment_rolls_exactly_once(
    k8s: client.ApiClient,
    slow_fan_out: Release,
    namespace: str,
    report: Callable[[str], None],
) -> None:
    configpin = slow_fan_out
    configpin.wait_answering(k8s, namespace)  # upgraded: Ready pods, Service a moment later
    core, apps = client.CoreV1Api(k8s), client.AppsV1Api(k8s)
    core.create_namespaced_config_map(
        namespace, {"metadata": {"name": "shared"}, "data": {"mood": "calm"}}
    )
    names = [f"app-{i:02d}" for i in range(COUNT)]
    for name in names:
        apps.create_namespaced_deployment(namespace, _deployment(name))
    wait_for(lambda: _all_rolled_out(k8s, namespace), timeout=300, interval=1, what="50 apps up")
    before = _checksums(k8s, namespace)
    assert len(set(before.values())) == 1
    assert set(_revisions(k8s, namespace).values()) == {1}

    core.patch_namespaced_config_map("shared", namespace, {"data": {"mood": "bright"}})

    def started() -> int:
        now = _checksums(k8s, namespace)
        rolled = sum(now[n] != before[n] for n in names)
        return rolled if rolled else 0

    rolled_at_fault = wait_for(started, timeout=60, interval=0.1, what="the fan-out to start")
    leader = configpin.leader(k8s)
    assert leader, "the fan-out started, so a replica leads"
    core.delete_namespaced_pod(leader, configpin.namespace)
    assert 0 < rolled_at_fault < COUNT, f"{rolled_at_fault} re-stamped when the leader went"
    started_at = time.monotonic()

    def all_restamped() -> bool:
        now = _checksums(k8s, namespace)
        return all(now[n] != before[n] for n in names)

    wait_for(all_restamped, timeout=180, interval=0.5, what="every Deployment re-stamped")
    restamped_in = time.monotonic() - started_at
    wait_for(lambda: _all_rolled_out(k8s, namespace), timeout=300, interval=1, what="50 rollouts")
    time.sleep(SETTLE)  # nothing rolls a second time

    revisions = _revisions(k8s, namespace)
    assert {n: revisions[n] for n in names} == dict.fromkeys(names, 2)
    after = _checksums(k8s, namespace)
    assert len(set(after.values())) == 1
    for d in apps.list_namespaced_deployment(namespace).items:
        assert d.metadata.annotations["deployment.kubernetes.io/revision"] == "2"
    # every new pod read the new content
    moods = Counter[str]()
    for pod in core.list_namespaced_pod(namespace).items:
        if pod.metadata.deletion_timestamp is None:
            [seen] = parse_seen(pod_log(k8s, namespace, pod.metadata.name))
            moods[seen.env("MOOD")] += 1
    assert moods == {"bright": COUNT}

    # another replica leads, and the chart's Deployment brought a second one back
    new_leader = wait_for(lambda: configpin.leader(k8s), timeout=60, what="a new leader")
    assert new_leader != leader
    configpin.wait_ready(k8s)
    report(
        f"fan-out: leader deleted after {rolled_at_fault}/{COUNT} Deployments re-stamped; "
        f"the rest in {restamped_in:.1f}s by the new leader; each rolled once"
    )
