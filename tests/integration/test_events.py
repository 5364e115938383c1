"""The Event recorder against the real API server: events.k8s.io/v1 Events on the workload,
repeats folded into a series, a hot loop held by the per-object rate limit."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from tests.integration.controlplane import wait_for
from tests.integration.manifests import deployment
from webhook.kube import events
from webhook.kube.events import EventRecorder, Regarding
from webhook.kube.raw import Kube, path


@pytest.fixture
def kube(k8s: client.ApiClient) -> Kube:
    return Kube(k8s)


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
        recorder.normal(dep, "RolloutStarted", "Rollout", "configmap/app-config key a changed")
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
            recorder.warning(regarding, "SourceMissing", "Admit", "configmap/nope not found")
        # a different note each time: not a series, so only the rate limit holds it
        for i in range(events.BURST + 20):
            recorder.normal(regarding, "RolloutDeferred", "Rollout", f"until {i}")
    finally:
        recorder.stop()
    found = _events(kube, plain_namespace, "hot")
    missing = [e for e in found if e["reason"] == "SourceMissing"]
    assert len(missing) == 1
    assert missing[0]["series"]["count"] == 5
    deferred = [e for e in found if e["reason"] == "RolloutDeferred"]
    assert len(deferred) == events.BURST - 1  # the bucket's first token went to SourceMissing
    assert dropped.count("rate limited") == 21
