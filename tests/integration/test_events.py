"""The Event recorder against the real API server: events.k8s.io/v1 Events on the workload,
repeats folded into a series, a hot loop held by the per-object rate limit."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from harness.controlplane import (
    wait_for,
)
from harness.manifests import configmap, deployment, pod_spec
from tests.integration.instances import instance_fixtures
from tests.integration.test_snapshot_mode import copies_in, template_spec
from webhook.core.constants import ANN_MODE, ANN_SOURCE, LABEL_SNAPSHOT, MODE_SNAPSHOT
from webhook.core.reasons import EventReason
from webhook.kube import events
from webhook.kube.events import EventRecorder, Regarding
from webhook.kube.raw import MERGE_PATCH, Kube, path


def _events(kube: Kube, ns: str, name: str) -> list[dict[str, Any]]:
    found = kube.get(
        f"/apis/events.k8s.io/v1/namespaces/{ns}/events",
        fieldSelector=f"regarding.name={name}",
    )
    items: list[dict[str, Any]] = found.get("items") or []
    return items


def test_event_lands_on_the_workload(kube: Kube, plain_namespace: str) -> None:
    dep = kube.create(path("deployments", plain_namespace), deployment("web"))
    recorder = EventRecorder(kube, "configpin.io/controller", "configpin-0").start()
    try:
        recorder.say(dep, EventReason.ROLLOUT_STARTED, "configmap/app-config key a changed")
    finally:
        recorder.stop()
    [event] = wait_for(lambda: _events(kube, plain_namespace, "web"), what="the Event")
    assert event["reason"] == "RolloutStarted"
    assert event["action"] == "Rollout"
    assert event["type"] == "Normal"
    assert event["reportingController"] == "configpin.io/controller"
    assert event["reportingInstance"] == "configpin-0"
    assert event["regarding"]["kind"] == "Deployment"
    assert event["regarding"]["uid"] == dep["metadata"]["uid"]
    assert event["note"] == "configmap/app-config key a changed"


def test_repeats_become_a_series_and_a_hot_loop_is_held(
    kube: Kube, plain_namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(events, "SERIES_FLUSH", 0.0)  # write the series back at once
    dropped: list[str] = []
    recorder = EventRecorder(
        kube, "configpin.io/controller", "configpin-0", on_drop=dropped.append
    ).start()
    regarding = Regarding("apps/v1", "Deployment", plain_namespace, "hot")
    try:
        for _ in range(5):
            recorder.say(regarding, EventReason.SOURCE_MISSING, "configmap/nope not found")
        # a different note each time: not a series, so only the rate limit holds it
        for i in range(events.BURST + 20):
            recorder.say(regarding, EventReason.ROLLOUT_DEFERRED, f"until {i}")
    finally:
        recorder.stop()
    found = _events(kube, plain_namespace, "hot")
    missing = [e for e in found if e["reason"] == "SourceMissing"]
    assert len(missing) == 1
    assert missing[0]["series"]["count"] == 5
    deferred = [e for e in found if e["reason"] == "RolloutDeferred"]
    assert len(deferred) == events.BURST - 1  # the bucket's first token went to SourceMissing
    assert dropped.count("rate limited") == 21


# --- configpin's own Events, live: configpin as a process behind the chart's webhook

INSTANCE = "events"


cp, ns = instance_fixtures(
    INSTANCE, "events", ["--coalesce-window", "0.5", "--min-rollout-interval", "120"]
)


def _reasons(kube: Kube, ns: str, name: str) -> dict[str, dict[str, Any]]:
    return {
        e["reason"]: e
        for e in _events(kube, ns, name)
        if e.get("reportingController") == "configpin.io/configpin"
    }


def _reason(kube: Kube, ns: str, name: str, reason: str) -> dict[str, Any]:
    found: dict[str, Any] = wait_for(
        lambda: _reasons(kube, ns, name).get(reason), what=f"Event {reason} on {name}"
    )
    return found


def described(kube: Kube, obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """configpin's Events as `kubectl describe` finds them, on every version: core/v1 Events
    selected by the object's name, namespace, kind and uid (kubectl's searchEvents ->
    GetFieldSelector). An Event without the object's uid is not among them."""
    meta = obj["metadata"]
    selector = ",".join(
        (
            f"involvedObject.name={meta['name']}",
            f"involvedObject.namespace={meta['namespace']}",
            f"involvedObject.kind={obj['kind']}",
            f"involvedObject.uid={meta['uid']}",
        )
    )
    found = kube.get(f"/api/v1/namespaces/{meta['namespace']}/events", fieldSelector=selector)
    return {
        e["reason"]: e
        for e in found.get("items") or ()
        if e.get("reportingComponent") == "configpin.io/configpin"
    }


def described_reason(kube: Kube, obj: dict[str, Any], reason: str) -> dict[str, Any]:
    found: dict[str, Any] = wait_for(
        lambda: described(kube, obj).get(reason),
        what=f"{reason} on {obj['kind']} {obj['metadata']['name']} as kubectl describe finds it",
    )
    return found


def test_a_workloads_events_from_missing_source_to_deferred_rollout(
    k8s: client.ApiClient, ns: str
) -> None:
    kube = Kube(k8s)
    created = kube.create(path("deployments", ns), deployment("web"))
    missing = _reason(kube, ns, "web", "SourceMissing")
    assert missing["type"] == "Warning"
    assert "configmap/app-config" in missing["note"]
    assert missing["regarding"]["kind"] == "Deployment"

    # the required source appears: the record is completed without a rollout
    kube.create(path("configmaps", ns), configmap("app-config", {"a": "1"}))
    recorded = _reason(kube, ns, "web", "Recorded")
    assert recorded["type"] == "Normal"
    assert recorded["regarding"]["uid"] == created["metadata"]["uid"]

    kube.patch(path("configmaps", ns, "app-config"), {"data": {"a": "2"}}, MERGE_PATCH)
    started = _reason(kube, ns, "web", "RolloutStarted")
    assert "configmap/app-config changed" in started["note"]

    kube.patch(path("configmaps", ns, "app-config"), {"data": {"a": "3"}}, MERGE_PATCH)
    deferred = _reason(kube, ns, "web", "RolloutDeferred")
    assert "minimum interval" in deferred["note"]
    assert "until" in deferred["note"]


def test_events_say_why_a_workload_is_not_pinned(k8s: client.ApiClient, ns: str) -> None:
    kube = Kube(k8s)
    kube.create(path("configmaps", ns), configmap("app-config", {"a": "1"}))
    # an operator's object as the owner (it exists: the garbage collector leaves it be)
    owner = kube.create(path("configmaps", ns), configmap("operator-state", {"x": "1"}))
    owned = deployment("operated")
    owned["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "name": "operator-state",
            "uid": owner["metadata"]["uid"],
            "controller": True,
        }
    ]
    kube.create(path("deployments", ns), owned)
    kube.create(path("deployments", ns), deployment("legacy", annotations={ANN_MODE: "off"}))
    note = _reason(kube, ns, "operated", "SkippedOwned")["note"]
    assert "owned by ConfigMap operator-state" in note
    assert "mode is off" in _reason(kube, ns, "legacy", "OptedOut")["note"]


def test_an_admission_event_about_a_create_is_found_by_kubectl_describe(
    k8s: client.ApiClient, ns: str
) -> None:
    """On CREATE the object has no uid yet when configpin answers: the Event waits for the
    object and carries its uid, so `kubectl describe deployment web` lists it."""
    kube = Kube(k8s)
    created = kube.create(path("deployments", ns), deployment("web"))
    created.setdefault("kind", "Deployment")
    missing = described_reason(kube, created, "SourceMissing")
    assert missing["type"] == "Warning"
    assert "configmap/app-config" in missing["message"]
    assert missing["involvedObject"]["uid"] == created["metadata"]["uid"]
    # a bare Pod too (its own kind and resource)
    pod = kube.create(
        path("pods", ns),
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "lone", "annotations": {ANN_MODE: "off"}},
            "spec": pod_spec(),
        },
    )
    pod.setdefault("kind", "Pod")
    assert "mode is off" in described_reason(kube, pod, "OptedOut")["message"]


def test_snapshot_copies_made_by_admission_and_by_the_controller_are_evented(
    k8s: client.ApiClient, ns: str
) -> None:
    kube = Kube(k8s)
    kube.create(path("configmaps", ns), configmap("app-config", {"a": "1"}))
    created = kube.create(
        path("deployments", ns), deployment("snap", annotations={ANN_MODE: MODE_SNAPSHOT})
    )
    created.setdefault("kind", "Deployment")
    first = copies_in(template_spec(created))["app-config"]
    made = described_reason(kube, created, "CopyCreated")
    assert made["type"] == "Normal"
    assert first in made["message"] and "configmap/app-config" in made["message"]
    assert made["related"]["name"] == first
    assert made["related"]["kind"] == "ConfigMap"

    # the controller re-points it at a copy of the new content: said on the workload too
    kube.patch(path("configmaps", ns, "app-config"), {"data": {"a": "2"}}, MERGE_PATCH)

    def repointed() -> str | None:
        now = copies_in(template_spec(kube.get(path("deployments", ns, "snap"))))["app-config"]
        return now if now != first else None

    second = wait_for(repointed, what="the Deployment re-pointed at a new copy")
    wait_for(
        lambda: any(
            e["reason"] == "CopyCreated" and e.get("related", {}).get("name") == second
            for e in _events(kube, ns, "snap")
        ),
        what="CopyCreated for the controller's copy",
    )
    assert described_reason(kube, created, "RolloutStarted")


def test_a_lookalike_copy_is_said_to_be_ignored_on_itself(k8s: client.ApiClient, ns: str) -> None:
    kube = Kube(k8s)
    lookalike = kube.create(
        path("configmaps", ns),
        configmap(
            "app-config-0123456789",
            {"a": "forged"},
            labels={LABEL_SNAPSHOT: "true"},
            annotations={ANN_SOURCE: "app-config"},
        ),
    )
    lookalike.setdefault("kind", "ConfigMap")
    ignored = described_reason(kube, lookalike, "LookalikeIgnored")
    assert ignored["type"] == "Warning"
    assert "never adopts, reuses or deletes it" in ignored["message"]
    assert kube.get(path("configmaps", ns, "app-config-0123456789"))["data"] == {"a": "forged"}
