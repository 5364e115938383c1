"""The controller run in the test process against the real API server and controller-manager.

No webhook serves these namespaces: what the workloads carry is what the controller wrote.
Only what the live path (configpin as a process, behind its registered webhook: see
test_controller_rollout.py and test_agreement.py) cannot show is tested here: the moments
that are hard to reach from outside, a write between the controller's read and its patch
(409), a watch that expires (410) while a change is made, and what a workload admitted while
no webhook answered looks like to the controller (stamped once, inside the catch-up window).
"""

from __future__ import annotations

import contextlib
import json
import secrets
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from harness.configpin import INSTANCE_LABEL
from harness.controller import running_controller as harness_controller
from harness.controlplane import (
    ENABLED_LABEL,
    ControlPlane,
    default_service_account_ready,
    wait_for,
)
from harness.manifests import configmap, deployment
from webhook.controller.decision import Decision
from webhook.controller.outcome import Rolled
from webhook.controller.rollout import RolloutController, Tuning
from webhook.core.constants import ANN_OBSERVED, ANN_ROLLED_AT, ANN_ROLLOUT, ANN_SOURCES
from webhook.core.current import WorkloadEntry, WorkloadRef
from webhook.core.model import JSONObject, SourceId, SourceKind
from webhook.kube.raw import JSON_PATCH, Kube, path
from webhook.kube.workloads import update_workload
from webhook.process.metrics import Metrics

DEPLOYMENTS = "/apis/apps/v1"


def _sources(obj: JSONObject) -> dict[str, str]:
    text = ((obj["spec"]["template"].get("metadata") or {}).get("annotations") or {}).get(
        ANN_SOURCES
    )
    return json.loads(text) if text else {}


class Cluster:
    """One namespace of our own, and helpers over the raw client."""

    def __init__(self, kube: Kube, namespace: str) -> None:
        self.kube = kube
        self.ns = namespace

    def cm(self, name: str, data: dict[str, str]) -> None:
        self.kube.create(path("configmaps", self.ns), configmap(name, data))

    def set_cm(self, name: str, data: dict[str, str]) -> None:
        self.kube.patch(
            path("configmaps", self.ns, name),
            {"data": data},
            content_type="application/merge-patch+json",
        )

    def deployment(self, name: str) -> JSONObject:
        return self.kube.get(path("deployments", self.ns, name))

    def replicasets(self, name: str) -> int:
        page = self.kube.get(path("replicasets", self.ns), labelSelector=f"app={name}")
        return len(page.get("items") or ())


@contextlib.contextmanager
def _namespace(api: client.ApiClient, labels: dict[str, str]) -> Iterator[str]:
    core = client.CoreV1Api(api)
    name = f"ctl-{secrets.token_hex(4)}"
    core.create_namespace({"metadata": {"name": name, "labels": labels}})
    try:
        wait_for(lambda: default_service_account_ready(api, name), what="default SA")
        yield name
    finally:
        with contextlib.suppress(client.ApiException):
            core.delete_namespace(name)


class GatedWatchKube(Kube):
    """A Kube whose next ConfigMap watch, once armed, waits for the test and then ends with
    the 410 Expired the API server sends when a watch's resourceVersion is too old."""

    def __init__(self, api: client.ApiClient) -> None:
        super().__init__(api)
        self.armed = threading.Event()
        self.blocked = threading.Event()
        self.release = threading.Event()

    @contextlib.contextmanager
    def watch(
        self, api_path: str, resource_version: str, **kwargs: Any
    ) -> Iterator[Iterator[JSONObject]]:
        if api_path.endswith("/configmaps") and self.armed.is_set():
            self.armed.clear()
            self.blocked.set()
            self.release.wait(30)
            expired: JSONObject = {
                "type": "ERROR",
                "object": {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "status": "Failure",
                    "reason": "Expired",
                    "code": 410,
                    "message": f"too old resource version: {resource_version}",
                },
            }
            yield iter([expired])
            return
        with super().watch(api_path, resource_version, **kwargs) as events:
            yield events


def running_controller(
    kube: Kube,
    selector: str,
    *,
    window: float = 0.2,
    interval: float = 0.0,
    catch_up_window: float = 600.0,
) -> contextlib.AbstractContextManager[RolloutController]:
    return harness_controller(
        kube,
        secrets.token_bytes(32),
        tuning=Tuning(workers=2, watch_timeout=2),
        watch_timeout=2,  # the gated watch test needs watches to end often
        timeout=30,
        coalesce_window=window,
        min_rollout_interval=interval,
        namespace_selector=selector,
        namespace="configpin-system",
        catch_up_window=catch_up_window,
    )


def _value(metrics: Metrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


@pytest.fixture
def api(control_plane: ControlPlane) -> Iterator[client.ApiClient]:
    with control_plane.api_client() as api:
        yield api


@pytest.fixture
def instance() -> str:
    return f"inproc-{secrets.token_hex(3)}"


@pytest.fixture
def ns(api: client.ApiClient, instance: str) -> Iterator[str]:
    with _namespace(api, {ENABLED_LABEL: "true", INSTANCE_LABEL: instance}) as name:
        yield name


def test_unstamped_workload_is_stamped_once_then_rolled_on_change(
    api: client.ApiClient, ns: str, instance: str
) -> None:
    kube = Kube(api)
    c = Cluster(kube, ns)
    c.cm("app-config", {"a": "1", "b": "1"})
    kube.create(path("deployments", ns), deployment("web"))
    with running_controller(Kube(api), f"{INSTANCE_LABEL}={instance}") as ctl:
        stamped = wait_for(lambda: _sources(c.deployment("web")), what="the stamp")
        assert set(stamped) == {"configmap/app-config"}
        # the rollout is counted once the controller has checked what was stored
        wait_for(
            lambda: _value(ctl.metrics, "configpin_rollouts_total", kind="Deployment") == 1,
            what="the stamp counted as one rollout",
        )
        obj = c.deployment("web")
        assert ANN_OBSERVED not in (obj["metadata"].get("annotations") or {})  # current

        current = _value(ctl.metrics, "configpin_rollouts_skipped_total", reason="current")
        c.set_cm("app-config", {"b": "2"})  # unused key
        # seen and judged current (the change counter alone can be moved by other sources of
        # the namespace, kube-root-ca.crt among them)
        wait_for(
            lambda: (
                _value(ctl.metrics, "configpin_rollouts_skipped_total", reason="current") > current
            ),
            what="the unused-key change judged current",
        )
        assert _sources(c.deployment("web")) == stamped
        c.set_cm("app-config", {"a": "2"})
        wait_for(lambda: _sources(c.deployment("web")) != stamped, what="the re-stamp")
        wait_for(
            lambda: _value(ctl.metrics, "configpin_rollouts_total", kind="Deployment") == 2,
            what="the re-stamp counted",
        )
        assert _value(ctl.metrics, "configpin_rollouts_total", kind="Deployment") == 2
        assert _value(ctl.metrics, "configpin_change_to_patch_seconds_count") == 2


def _settled(kube: Kube, api_path: str) -> bool:
    """The deployment controller has done its own writes to the object (it is another writer
    that can conflict with ours; the tests provoke exactly one conflict of their own)."""
    obj = kube.get(api_path)
    status = obj.get("status") or {}
    return status.get("observedGeneration") == obj["metadata"].get("generation")


def _settled_web(kube: Kube, ns: str) -> tuple[Cluster, str]:
    """ConfigMap app-config (a=1) and Deployment web reading it, the deployment controller's
    own writes done; the Cluster and web's API path."""
    c = Cluster(kube, ns)
    c.cm("app-config", {"a": "1"})
    kube.create(path("deployments", ns), deployment("web"))
    api_path = path("deployments", ns, "web")
    wait_for(lambda: _settled(kube, api_path), what="the deployment controller's writes")
    return c, api_path


def test_conflict_between_read_and_write_is_retried(api: client.ApiClient, ns: str) -> None:
    kube = Kube(api)
    c, api_path = _settled_web(kube, ns)
    writes = 0

    def meanwhile(obj: JSONObject) -> None:
        nonlocal writes
        if writes == 0:  # someone else writes the object between our read and our write
            writes += 1
            kube.patch(
                api_path,
                {"metadata": {"labels": {"touched": "yes"}}},
                content_type="application/merge-patch+json",
            )

    def decide(obj: JSONObject) -> Decision:
        return Decision(
            [{"op": "add", "path": "/metadata/annotations", "value": {"example.com/x": "1"}}]
        )

    conflicts: list[int] = []
    result = update_workload(
        kube, api_path, decide, before_write=meanwhile, on_conflict=lambda: conflicts.append(1)
    )
    # Ours is the first conflict; the controller-manager may still add one of its own.
    assert result.patched and result.conflicts >= 1 and len(conflicts) == result.conflicts
    assert writes == 1
    final = c.deployment("web")
    assert final["metadata"]["labels"]["touched"] == "yes"  # their write survived
    assert final["metadata"]["annotations"]["example.com/x"] == "1"  # and ours landed


def test_controller_apply_retries_a_conflict(api: client.ApiClient, ns: str, instance: str) -> None:
    kube = Kube(api)
    c, _ = _settled_web(kube, ns)
    # A long window: the queued stamp is not done by a worker while we call apply directly.
    with running_controller(Kube(api), f"{INSTANCE_LABEL}={instance}", window=300) as ctl:
        ref = WorkloadRef("Deployment", ns, "web")
        wait_for(lambda: ctl.index.get(ref), what="the Deployment indexed")
        touched: list[str] = []

        def meanwhile(obj: JSONObject) -> None:
            if not touched:
                touched.append(obj["metadata"]["resourceVersion"])
                c.kube.patch(
                    path("deployments", ns, "web"),
                    {"metadata": {"labels": {"touched": "yes"}}},
                    content_type="application/merge-patch+json",
                )

        assert isinstance(ctl.apply(ref, before_write=meanwhile), Rolled)
        assert len(touched) == 1  # ours is the first conflict; another writer may add one
        assert _value(ctl.metrics, "configpin_patch_conflicts_total") >= 1
        final = c.deployment("web")
        assert final["metadata"]["labels"]["touched"] == "yes"
        assert _sources(final) == {"configmap/app-config": _sources(final)["configmap/app-config"]}


def test_expired_watch_is_relisted_and_the_change_made_meanwhile_rolls(
    api: client.ApiClient, ns: str, instance: str
) -> None:
    c = Cluster(Kube(api), ns)
    c.cm("app-config", {"a": "1"})
    c.kube.create(path("deployments", ns), deployment("web"))
    gated = GatedWatchKube(api)
    with running_controller(gated, f"{INSTANCE_LABEL}={instance}") as ctl:
        first = wait_for(lambda: _sources(c.deployment("web")), what="the stamp")
        informer = ctl.cache.informers[SourceKind.CONFIGMAP]
        relists = informer.relists
        gated.armed.set()
        assert gated.blocked.wait(30), "the ConfigMap watch did not restart"
        # No watch is running: this change can only be found by the relist after the 410.
        c.set_cm("app-config", {"a": "2"})
        gated.release.set()
        wait_for(lambda: _sources(c.deployment("web")) != first, what="the change rolled")
        assert informer.relists == relists + 1
        assert (
            _value(
                ctl.metrics,
                "configpin_watch_restarts_total",
                resource="configmaps",
                reason="gone",
            )
            == 1
        )


def _seen_by_controller(ctl: RolloutController) -> list[tuple[str, str]]:
    """Source changes, recorded after the controller's own listener has handled each."""
    seen: list[tuple[str, str]] = []
    ctl.cache.listeners.append(lambda ns, sid: seen.append((ns, str(sid))))
    return seen


def test_namespace_selection_follows_its_label(api: client.ApiClient, instance: str) -> None:
    kube = Kube(api)
    core = client.CoreV1Api(api)
    with _namespace(api, {INSTANCE_LABEL: f"{instance}-not-yet"}) as ns:
        c = Cluster(kube, ns)
        c.cm("app-config", {"a": "1"})
        kube.create(path("deployments", ns), deployment("web"))
        with running_controller(Kube(api), f"{INSTANCE_LABEL}={instance}") as ctl:
            seen = _seen_by_controller(ctl)
            c.set_cm("app-config", {"a": "2"})
            wait_for(lambda: (ns, "configmap/app-config") in seen, what="the change handled")
            assert len(ctl.queue) == 0  # not its namespace: nothing pending
            assert _value(ctl.metrics, "configpin_source_changes_total") == 0
            assert _sources(c.deployment("web")) == {}

            core.patch_namespace(ns, {"metadata": {"labels": {INSTANCE_LABEL: instance}}})
            stamped = wait_for(lambda: _sources(c.deployment("web")), what="stamped once selected")
            # (and its rollout followed to its end: nothing of it left to look at; at zero
            # replicas it proves nothing, so it ends as "left")
            wait_for(lambda: _rollout(c.deployment("web")) == "left", what="its rollout ended")

            core.patch_namespace(ns, {"metadata": {"labels": {INSTANCE_LABEL: "elsewhere"}}})
            wait_for(lambda: ns not in ctl.namespaces, what="the namespace unselected")
            seen.clear()
            c.set_cm("app-config", {"a": "3"})
            wait_for(lambda: (ns, "configmap/app-config") in seen, what="the change handled")
            assert len(ctl.queue) == 0
            assert _sources(c.deployment("web")) == stamped


def _rollout(obj: JSONObject) -> str | None:
    text = (obj["metadata"].get("annotations") or {}).get(ANN_ROLLOUT)
    return json.loads(text)["state"] if text else None


class CountingKube(Kube):
    """A Kube that notes every GET and PATCH it sends, by path."""

    def __init__(self, api: client.ApiClient) -> None:
        super().__init__(api)
        self.sent: list[tuple[str, str, str]] = []

    def get(self, api_path: str, *, timeout: float | None = None, **query: Any) -> JSONObject:
        self.sent.append(("GET", api_path, ""))
        return super().get(api_path, timeout=timeout, **query)

    def patch(
        self, api_path: str, patch: Any, content_type: str = JSON_PATCH, **query: Any
    ) -> JSONObject:
        self.sent.append(("PATCH", api_path, content_type))
        return super().patch(api_path, patch, content_type, **query)

    def to(self, api_path: str) -> list[tuple[str, str]]:
        return [(verb, kind) for verb, p, kind in self.sent if p == api_path]

    def writing(self, api_path: str) -> list[tuple[str, str]]:
        """What it took to write: the requests up to the last PATCH (the reads after it are
        the controller following the rollout the write started)."""
        sent = self.to(api_path)
        last = max((i for i, (verb, _) in enumerate(sent) if verb == "PATCH"), default=-1)
        return sent[: last + 1]


def _change_seen(ctl: RolloutController, c: Cluster, data: dict[str, str]) -> None:
    """Change ConfigMap app-config; wait until the controller's cache has the new content."""
    sid = SourceId(SourceKind.CONFIGMAP, "app-config")
    before = ctl.cache.peek(c.ns, sid)
    c.set_cm("app-config", data)
    wait_for(lambda: ctl.cache.peek(c.ns, sid) != before, what="the change seen")


def test_a_plain_restamp_is_written_from_the_index_and_a_409_reads_the_object(
    api: client.ApiClient, ns: str, instance: str
) -> None:
    """Checksum mode: a consumed change re-stamps the workload with one guarded merge patch
    planned from the index, no read of the object. When the object changed after the index
    saw it (its resourceVersion is not the one the patch carries), the API server answers 409
    and the controller reads it and plans it, as for any other write."""
    kube = Kube(api)
    c, api_path = _settled_web(kube, ns)
    counting = CountingKube(api)
    # A long window: nothing is done by a worker while the test calls apply itself.
    with running_controller(counting, f"{INSTANCE_LABEL}={instance}", window=300) as ctl:
        ref = WorkloadRef("Deployment", ns, "web")
        wait_for(lambda: ctl.index.get(ref), what="the Deployment indexed")
        assert isinstance(ctl.apply(ref), Rolled)  # unstamped: read, planned and stamped
        first = c.deployment("web")

        def indexed_at_current_version() -> bool:
            """The deployment controller is done writing (its status moves for a moment after
            a new template) and the index has the object's version."""
            seen = c.deployment("web")["metadata"]["resourceVersion"]
            time.sleep(1.5)
            entry, obj = ctl.index.get(ref), c.deployment("web")
            return (
                _settled(kube, api_path)
                and obj["metadata"]["resourceVersion"] == seen
                and entry is not None
                and str(entry.restamp_rv) == seen
            )

        wait_for(indexed_at_current_version, what="the index at the object's version")
        counting.sent.clear()
        _change_seen(ctl, c, {"a": "2"})
        assert isinstance(ctl.apply(ref), Rolled)
        assert counting.writing(api_path) == [("PATCH", "application/merge-patch+json")]
        second = c.deployment("web")
        assert _sources(second) != _sources(first)
        assert (second["metadata"].get("annotations") or {}).get(ANN_ROLLED_AT)

        # The index says an older version than the object has (a write it has not seen yet).
        wait_for(indexed_at_current_version, what="the index at the object's version")
        behind = c.deployment("web")
        behind["metadata"]["resourceVersion"] = first["metadata"]["resourceVersion"]
        entry = ctl.restamper.entry(behind)
        assert isinstance(entry, WorkloadEntry)
        ctl.index.put(entry)
        conflicts = _value(ctl.metrics, "configpin_patch_conflicts_total")
        counting.sent.clear()
        _change_seen(ctl, c, {"a": "3"})
        assert isinstance(ctl.apply(ref), Rolled)
        assert counting.writing(api_path) == [
            ("PATCH", "application/merge-patch+json"),  # 409
            ("GET", ""),
            ("PATCH", "application/json-patch+json"),
        ]
        assert _value(ctl.metrics, "configpin_patch_conflicts_total") == conflicts + 1
        third = c.deployment("web")
        assert _sources(third) != _sources(second)
        assert _value(ctl.metrics, "configpin_rollouts_total", kind="Deployment") == 3
