"""What the node's safe-delivery tests read of a Deployment's config rollouts: what configpin
wrote on it (its record, the rejected content, the Events), where its template points, and what
its pods read (harness/apps.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from kubernetes import client

from harness.apps import deployment_rolled_out, is_ready, last_seen, workload_pods
from harness.controlplane import wait_for
from webhook.core.constants import ANN_ROLLOUT


def set_greeting(
    api: client.ApiClient, namespace: str, greeting: str, *, create: bool = False
) -> None:
    """ConfigMap `settings` holds `greeting` (created with it, or changed to it)."""
    core = client.CoreV1Api(api)
    if create:
        body = {"metadata": {"name": "settings"}, "data": {"greeting": greeting}}
        core.create_namespaced_config_map(namespace, body)
    else:
        core.patch_namespaced_config_map("settings", namespace, {"data": {"greeting": greeting}})


def deployment_annotations(api: client.ApiClient, namespace: str, name: str) -> dict[str, str]:
    d = client.AppsV1Api(api).read_namespaced_deployment(name, namespace)
    return dict(d.metadata.annotations or {})


def events(api: client.ApiClient, namespace: str, reason: str) -> list[Any]:
    """The namespace's Events of that reason."""
    items = client.CoreV1Api(api).list_namespaced_event(namespace).items
    return [e for e in items if e.reason == reason]


def rollout_record(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    """The rollout record on the Deployment ({} when it has none)."""
    text = deployment_annotations(api, namespace, name).get(ANN_ROLLOUT)
    return json.loads(text) if text else {}


def template_config(api: client.ApiClient, namespace: str, name: str) -> str:
    """The ConfigMap the pod template's `config` volume names (snapshot mode: a copy)."""
    d = client.AppsV1Api(api).read_namespaced_deployment(name, namespace)
    [volume] = [v for v in d.spec.template.spec.volumes if v.name == "config"]
    return str(volume.config_map.name)


def rolled_out_reading(
    api: client.ApiClient, namespace: str, name: str, key: str, value: str
) -> bool:
    """`name` rolled out, and every pod of it read `value` last."""
    if deployment_rolled_out(api, namespace, name) is None:
        return False
    pods = workload_pods(api, namespace, name)
    return bool(pods) and all(
        (s := last_seen(api, namespace, p.metadata.name)) is not None and s.values.get(key) == value
        for p in pods
    )


def until(
    predicate: Callable[[], Any], *, never: Callable[[], str | None], what: str, **kw: Any
) -> Any:
    """Wait for `predicate`, failing at once, saying why, as soon as `never` says something
    that must not happen did."""

    def check() -> Any:
        said = never()
        if said:
            raise AssertionError(f"while waiting for {what}: {said}")
        return predicate()

    return wait_for(check, what=what, **kw)


def all_ready_reading(
    api: client.ApiClient, namespace: str, name: str, key: str, value: str
) -> None:
    """Every pod of `name` is Ready and what it read last is `value`: none reads anything else."""
    for pod in workload_pods(api, namespace, name):
        assert is_ready(pod), pod.metadata.name
        seen = last_seen(api, namespace, pod.metadata.name)
        assert seen is not None and seen.values[key] == value, (pod.metadata.name, seen)
