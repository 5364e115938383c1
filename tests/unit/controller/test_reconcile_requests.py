"""What one reconcile asks of the API server (webhook/controller/reconcile.py), counted: the
workload is read again after a conflict (409), and nothing else is. What the decision needs
(the workload's pods, a source memory does not hold, who made the change) is read once per
reconcile, before the decision, however often a conflict makes it decide again.

The controller is wired as `configpin serve` wires it (RolloutController), over a fake API
server that answers from memory and records every request: the decision's logic is not
what is tested here (tests/unit/test_restamp.py is), the requests around it are."""

from __future__ import annotations

import copy
import json
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import jsonpatch

from harness.builders import (
    HKEY,
    Store,
    admitted,
    configmap,
    container,
    env_cm,
    env_secret,
    pod_spec,
    workload,
)
from webhook.controller.leader import AlwaysLeader
from webhook.controller.outcome import Rolled, Settled, Skipped
from webhook.controller.rollout import RolloutController
from webhook.core.constants import ANN_ROLLOUT, ANN_ROLLOUT_WINDOWS
from webhook.core.current import WorkloadEntry, WorkloadRef
from webhook.core.kinds import builtin
from webhook.core.model import JSONObject, SourceId, SourceKind
from webhook.core.times import format_time
from webhook.kube.cache import SourceCache
from webhook.kube.errors import Conflict, KubeError, NotFound
from webhook.kube.namespaces import NamespaceSet
from webhook.kube.raw import MERGE_PATCH, path
from webhook.kube.workloads import Served
from webhook.process.config import Settings
from webhook.process.metrics import Metrics

NS = "team-a"
WEB = path("deployments", NS, "web", prefix="/apis/apps/v1")
CFG = SourceId(SourceKind.CONFIGMAP, "cfg")
DEPLOYMENT = builtin("Deployment")
assert DEPLOYMENT is not None


class FakeServer:
    """The API server, from memory: objects by path, lists by collection path; each request
    recorded as (verb, path). `busy(path)`: the next PATCH of `path` meets someone else's
    write first (the Deployment controller's status), so that it fails with 409.
    `failing`: paths whose GET answers 503 (an API server under load)."""

    def __init__(self) -> None:
        self.objects: dict[str, JSONObject] = {}
        self.lists: dict[str, list[JSONObject]] = {}
        self.failing: set[str] = set()
        self.requests: list[tuple[str, str]] = []
        self._busy: set[str] = set()
        self._version = 100

    def put(self, api_path: str, obj: JSONObject) -> None:
        self._version += 1
        obj["metadata"]["resourceVersion"] = str(self._version)
        self.objects[api_path] = obj

    def busy(self, api_path: str) -> None:
        self._busy.add(api_path)

    def count(self, verb: str, api_path: str) -> int:
        return Counter(self.requests)[(verb, api_path)]

    def get(self, api_path: str, *, timeout: float | None = None, **_query: Any) -> JSONObject:
        self.requests.append(("GET", api_path))
        if api_path in self.failing:
            raise KubeError(f"GET {api_path}", 503, "Service Unavailable")
        if api_path not in self.objects:
            raise NotFound(f"GET {api_path}", 404, "Not Found")
        return copy.deepcopy(self.objects[api_path])

    def list_pages(self, api_path: str, **_query: Any) -> Iterator[JSONObject]:
        self.requests.append(("LIST", api_path))
        yield {"items": copy.deepcopy(self.lists.get(api_path, []))}

    def patch(
        self, api_path: str, body: Any, *, content_type: str = "", **_query: Any
    ) -> JSONObject:
        self.requests.append(("PATCH", api_path))
        if api_path in self._busy:  # someone else writes first
            self._busy.discard(api_path)
            stored = self.objects[api_path]
            stored.setdefault("status", {})["observedGeneration"] = stored["metadata"].get(
                "generation", 1
            )
            self.put(api_path, stored)
        stored = self.objects[api_path]
        if content_type == MERGE_PATCH:
            guard = (body.get("metadata") or {}).get("resourceVersion")
            written = _merge(copy.deepcopy(stored), body)
        else:
            guard = next(op["value"] for op in body if op["path"] == "/metadata/resourceVersion")
            written = jsonpatch.apply_patch(copy.deepcopy(stored), body)
        if guard is not None and guard != stored["metadata"]["resourceVersion"]:
            raise Conflict(f"PATCH {api_path}", 409, "Conflict")
        self.put(api_path, written)
        return copy.deepcopy(written)


def _merge(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = _merge(out.get(key), value)
    return out


def _namespace(windows: str | None = None) -> JSONObject:
    annotations = {} if windows is None else {ANN_ROLLOUT_WINDOWS: windows}
    return {"metadata": {"name": NS, "annotations": annotations}, "status": {"phase": "Active"}}


def _controller(server: FakeServer, *, windows: str | None = None) -> RolloutController:
    """The controller as `configpin serve` builds it, leading, its namespace selected (with
    the rollout windows given) and its sources in memory as its watches would have them:
    nothing started."""
    metrics = Metrics()
    cache = SourceCache(server, HKEY, metrics)  # type: ignore[arg-type]
    namespaces = NamespaceSet(server, metrics, label_selector="")  # type: ignore[arg-type]
    namespaces.relisted([_namespace(windows)])
    settings = Settings(leader_elect=False, rollout_waves="off", max_rolling=0)
    ctl = RolloutController(
        server,  # type: ignore[arg-type]
        HKEY,
        cache,
        metrics,
        settings,
        namespaces=namespaces,
    )
    ctl.watches.kinds["Deployment"] = Served(DEPLOYMENT, "/apis/apps/v1")
    ctl.elector = AlwaysLeader(lambda: None)
    ctl.elector.start()
    return ctl


def _source(value: str) -> JSONObject:
    obj = configmap("cfg", {"a": value})
    obj["metadata"]["namespace"] = NS
    return obj


def _web(server: FakeServer, ctl: RolloutController, *, extra: bool = True) -> JSONObject:
    """Deployment `web` (checksum mode, 1 replica, healthy) as admission stored it, stamped
    for `cfg` as it is now, and indexed; `extra`: it also reads an optional Secret `extra`
    that memory does not hold (its read answers 503)."""
    env = [env_cm("cfg", "a")]
    if extra:
        env.append(env_secret("extra", "b", optional=True))
    spec = pod_spec(container(env=env))
    obj = workload("Deployment", spec, name="web")
    obj["metadata"]["uid"] = "5f0c7a6e-0000-4000-8000-00000000a001"
    obj["metadata"]["generation"] = 1
    obj["metadata"]["creationTimestamp"] = format_time(time.time() - 3600)
    obj["spec"]["replicas"] = 1
    obj["status"] = {"observedGeneration": 1, "replicas": 1, "updatedReplicas": 1}
    obj["status"] |= {"readyReplicas": 1, "availableReplicas": 1}
    stamped = admitted(obj, Store([_source("1")]))
    server.put(WEB, stamped)
    server.failing.add(path("secrets", NS, "extra"))
    entry = ctl.restamper.entry(copy.deepcopy(stamped))
    assert isinstance(entry, WorkloadEntry)
    ctl.index.put(entry)
    return copy.deepcopy(stamped)


def _requests(server: FakeServer) -> Counter[tuple[str, str]]:
    return Counter(server.requests)


def _said(asked: Counter[tuple[str, str]]) -> str:
    return ", ".join(f"{verb} {where} x{n}" for (verb, where), n in asked.items())


def test_a_change_rolled_across_a_conflict_reads_the_workload_again_and_nothing_else() -> None:
    """The change is planned from the index (the read of `extra` it needs, who made the change),
    written, met by a 409; the workload is read and decided again, and written. The Secret
    memory does not hold, and the source read for who made the change, are read once."""
    server = FakeServer()
    ctl = _controller(server)
    ctl.cache.indexes[SourceKind.CONFIGMAP].relisted([_source("1")])
    server.put(path("configmaps", NS, "cfg"), _source("1"))
    before = _web(server, ctl)
    ctl.cache.indexes[SourceKind.CONFIGMAP].event("MODIFIED", _source("2"))
    server.failing.add(path("configmaps", NS, "cfg"))  # who made it: not known this time
    server.busy(WEB)
    outcome = ctl.apply(WorkloadRef("Deployment", NS, "web"), {CFG})
    assert isinstance(outcome, Rolled), outcome
    rolled = server.objects[WEB]
    assert rolled["spec"]["template"] != before["spec"]["template"]
    asked = _requests(server)
    assert asked[("PATCH", WEB)] == 2 and asked[("GET", WEB)] == 2, _said(asked)
    assert asked[("GET", path("secrets", NS, "extra"))] == 1, _said(asked)
    assert asked[("GET", path("configmaps", NS, "cfg"))] == 1, _said(asked)


def test_a_plain_re_stamp_from_the_index_met_by_a_conflict_asks_who_made_the_change_once() -> None:
    """A plain re-stamp is planned from the index and written without a read; a 409: the
    workload is read, decided again and written. Who made the change is read once (its
    answer, unknown this time, is not remembered from one reconcile to the next)."""
    server = FakeServer()
    ctl = _controller(server)
    ctl.cache.indexes[SourceKind.CONFIGMAP].relisted([_source("1")])
    server.put(path("configmaps", NS, "cfg"), _source("1"))
    _web(server, ctl, extra=False)
    ctl.cache.indexes[SourceKind.CONFIGMAP].event("MODIFIED", _source("2"))
    server.failing.add(path("configmaps", NS, "cfg"))
    server.busy(WEB)
    assert isinstance(ctl.apply(WorkloadRef("Deployment", NS, "web"), {CFG}), Rolled)
    asked = _requests(server)
    assert asked[("PATCH", WEB)] == 2 and asked[("GET", WEB)] == 1, _said(asked)
    assert asked[("GET", path("configmaps", NS, "cfg"))] == 1, _said(asked)


def test_a_rollout_followed_across_a_conflict_lists_its_pods_once() -> None:
    """A rollout configpin follows fails by its pods (one restarted three times): the failure
    is written, met by a 409, read and decided again, and written. Its ReplicaSets and pods
    are listed once."""
    server = FakeServer()
    ctl = _controller(server)
    ctl.cache.indexes[SourceKind.CONFIGMAP].relisted([_source("1")])
    server.put(path("configmaps", NS, "cfg"), _source("1"))
    _web(server, ctl)
    ctl.cache.indexes[SourceKind.CONFIGMAP].event("MODIFIED", _source("2"))
    ref = WorkloadRef("Deployment", NS, "web")
    assert isinstance(ctl.apply(ref, {CFG}), Rolled)
    rolling = server.objects[WEB]
    assert '"rolling"' in rolling["metadata"]["annotations"][ANN_ROLLOUT]
    # The Deployment controller's answer: a new ReplicaSet, its pod not Ready, restarting.
    rolling["metadata"]["generation"] = 2
    rolling["status"] = {"observedGeneration": 2, "replicas": 2, "updatedReplicas": 1}
    rolling["status"] |= {"readyReplicas": 1, "availableReplicas": 1}
    server.put(WEB, rolling)
    rs = {
        "metadata": {
            "name": "web-2",
            "namespace": NS,
            "uid": "5f0c7a6e-0000-4000-8000-00000000a002",
            "labels": {"app": "web"},
            "ownerReferences": [{"uid": rolling["metadata"]["uid"], "controller": True}],
        }
    }
    pod = {
        "metadata": {
            "name": "web-2-x",
            "namespace": NS,
            "labels": {"app": "web"},
            "annotations": dict(rolling["spec"]["template"]["metadata"]["annotations"]),
            "creationTimestamp": format_time(time.time()),
            "ownerReferences": [{"uid": rs["metadata"]["uid"], "controller": True}],
        },
        "status": {"phase": "Running", "containerStatuses": [{"name": "app", "restartCount": 3}]},
    }
    replicasets = path("replicasets", NS, prefix="/apis/apps/v1")
    pods = path("pods", NS)
    server.lists[replicasets] = [rs]
    server.lists[pods] = [pod]
    server.requests.clear()
    server.busy(WEB)
    outcome = ctl.apply(ref, follow_only=True)
    assert isinstance(outcome, Settled), outcome
    assert '"failed"' in server.objects[WEB]["metadata"]["annotations"][ANN_ROLLOUT]
    asked = _requests(server)
    assert asked[("PATCH", WEB)] == 2 and asked[("GET", WEB)] == 2, _said(asked)
    assert asked[("LIST", replicasets)] == 1, _said(asked)
    assert asked[("LIST", pods)] == 1, _said(asked)


CLOSED = json.dumps([{"kind": "deny", "schedule": "* * * * *", "duration": "1h"}])


def test_a_workload_its_window_holds_is_read_once_not_at_every_resync() -> None:
    """A change its namespace's window holds: the workload is read and decided once, and
    held. The resyncs after find it held still, from memory, and hand it to no worker (each
    would read it again: 10,000 reads a resync at 10,000 held workloads). What may end the
    hold is looked at as before: its namespace's list edited, or another change."""
    server = FakeServer()
    ctl = _controller(server, windows=CLOSED)
    ctl.cache.listeners.append(ctl.source_changed)  # (as it starts: its watches synced)
    ctl.namespaces.listeners.append(ctl.namespace_selected)
    ctl._synced.set()
    ctl.cache.indexes[SourceKind.CONFIGMAP].relisted([_source("1")])
    server.put(path("configmaps", NS, "cfg"), _source("1"))
    _web(server, ctl, extra=False)
    ref = WorkloadRef("Deployment", NS, "web")
    try:
        ctl.cache.indexes[SourceKind.CONFIGMAP].event("MODIFIED", _source("2"))
        pending = ctl.queue.pending(ref)
        assert pending is not None  # the change: decided by a worker
        ctl.queue.forget(ref)
        outcome = ctl._reconcile(ref, pending)
        assert isinstance(outcome, Skipped) and outcome.wait is not None, outcome
        assert ctl.holds.refs() == {ref}
        server.requests.clear()

        for _ in range(3):  # resyncs: held still
            ctl._resync()
            assert ctl.queue.pending(ref) is None
        assert ctl.holds.refs() == {ref}
        asked = _requests(server)  # (discovery of new kinds aside)
        assert asked[("GET", WEB)] == 0 and asked[("PATCH", WEB)] == 0, _said(asked)

        ctl.cache.indexes[SourceKind.CONFIGMAP].event("MODIFIED", _source("3"))
        assert ctl.queue.pending(ref) is not None  # another change: decided again
        ctl.queue.forget(ref)
        ctl.namespaces.event("MODIFIED", _namespace(None))  # the list removed
        assert ctl.queue.pending(ref) is not None
    finally:
        ctl.queue.close()
