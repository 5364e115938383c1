"""Snapshot copies in a cluster, against an in-memory API server: the writer (no API call when
the copy exists; never a copy whose name lies about its content), the index, adoption by
revisions, and the sweep (mark, then delete on uid and resourceVersion preconditions, so a
re-use in between wins).

The in-memory server keeps the API semantics these depend on: uids, a resourceVersion bumped
by every real change (and not by a no-op), AlreadyExists, merge and strategic-merge patches
(ownerReferences merged by uid), resourceVersion preconditions on patches and deletes. Every
write is delivered at once, as a watch event, to the source cache.
"""

from __future__ import annotations

import base64
import copy
import itertools
import uuid
from collections.abc import Callable, Iterator
from typing import Any, cast

import pytest

from tests.unit.conftest import HKEY, configmap, merge_patch, secret, workload
from webhook.controller.adoption import SnapshotAdopter, owner_kinds, owner_of
from webhook.controller.sweep import SnapshotSweeper, SweepResult
from webhook.core import digest
from webhook.core.constants import ANN_UNUSED
from webhook.core.model import JSONObject, SnapshotRequest, SourceId, SourceKind
from webhook.core.names import snapshot_name
from webhook.kube.cache import SourceCache
from webhook.kube.copies import (
    STRATEGIC_MERGE_PATCH,
    Copy,
    SnapshotError,
    SnapshotIndex,
    SnapshotWriter,
    delete_unchanged,
)
from webhook.kube.errors import AlreadyExists, Conflict, KubeError, NotFound
from webhook.kube.raw import MERGE_PATCH, Kube
from webhook.process.metrics import Metrics

NS = "team-a"
_REPLICASETS = next(k for k in owner_kinds() if k.kind == "ReplicaSet")
_KIND_OF = {"configmaps": SourceKind.CONFIGMAP, "secrets": SourceKind.SECRET}
_API_KIND = {
    "configmaps": "ConfigMap",
    "secrets": "Secret",
    "pods": "Pod",
    "replicasets": "ReplicaSet",
    "controllerrevisions": "ControllerRevision",
    "deployments": "Deployment",
    "jobs": "Job",
}


class FakeKube:
    """Just enough of an API server (see the module docstring)."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], JSONObject] = {}
        self.calls = 0
        self.requests: list[tuple[str, str]] = []
        self.watchers: list[Callable[[str, str, JSONObject], None]] = []
        self.failing: set[str] = set()  # resources whose requests fail
        self.created_at = "2026-01-01T00:00:00Z"
        self._rv = itertools.count(100)

    # --- plumbing
    @staticmethod
    def _parse(api_path: str) -> tuple[str, str, str | None]:
        _, _, rest = api_path.partition("/namespaces/")
        parts = rest.split("/")
        return parts[1], parts[0], parts[2] if len(parts) > 2 else None

    def _call(self, method: str, api_path: str) -> tuple[str, str, str | None]:
        self.calls += 1
        self.requests.append((method, api_path))
        resource, namespace, name = self._parse(api_path)
        if resource in self.failing:
            raise KubeError(f"{method} {api_path}", 500, "InternalError")
        return resource, namespace, name

    def _emit(self, resource: str, event: str, obj: JSONObject) -> None:
        for watcher in self.watchers:
            watcher(resource, event, copy.deepcopy(obj))

    def _store(self, resource: str, obj: JSONObject, event: str) -> JSONObject:
        obj["metadata"]["resourceVersion"] = str(next(self._rv))
        meta = obj["metadata"]
        self.objects[(resource, meta["namespace"], meta["name"])] = obj
        self._emit(resource, event, obj)
        return copy.deepcopy(obj)

    def _existing(self, method: str, key: tuple[str, str, str]) -> JSONObject:
        if key not in self.objects:
            raise NotFound(f"{method} {key}", 404, "NotFound")
        return self.objects[key]

    # --- the Kube surface
    def put(self, resource: str, obj: JSONObject, namespace: str = NS) -> JSONObject:
        """Create without counting (test setup)."""
        calls = self.calls
        created = self.create(f"/api/v1/namespaces/{namespace}/{resource}", obj)
        self.calls = calls
        self.requests.pop()
        return created

    def get(self, api_path: str, **query: Any) -> JSONObject:
        resource, namespace, name = self._call("GET", api_path)
        assert name is not None
        return copy.deepcopy(self._existing("GET", (resource, namespace, name)))

    def create(self, api_path: str, body: JSONObject, **query: Any) -> JSONObject:
        resource, namespace, _ = self._call("POST", api_path)
        obj = copy.deepcopy(body)
        obj.setdefault("kind", _API_KIND.get(resource, "Object"))
        meta = obj.setdefault("metadata", {})
        meta["namespace"] = namespace
        if (resource, namespace, meta["name"]) in self.objects:
            raise AlreadyExists(f"POST {api_path}", 409, "AlreadyExists")
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = self.created_at
        if resource == "secrets" and "stringData" in obj:
            data = obj.setdefault("data", {})
            for k, v in obj.pop("stringData").items():
                data[k] = base64.b64encode(v.encode()).decode()
        return self._store(resource, obj, "ADDED")

    def patch(self, api_path: str, patch: Any, content_type: str = "", **query: Any) -> JSONObject:
        resource, namespace, name = self._call("PATCH", api_path)
        assert name is not None
        current = self._existing("PATCH", (resource, namespace, name))
        wanted_rv = (patch.get("metadata") or {}).get("resourceVersion")
        if wanted_rv is not None and wanted_rv != current["metadata"]["resourceVersion"]:
            raise Conflict(f"PATCH {api_path}", 409, "Conflict")
        if content_type == STRATEGIC_MERGE_PATCH:
            refs = {r["uid"]: r for r in current["metadata"].get("ownerReferences") or ()}
            refs.update({r["uid"]: r for r in patch["metadata"].pop("ownerReferences", [])})
            patch = merge_patch(patch, {"metadata": {"ownerReferences": list(refs.values())}})
        else:
            assert content_type == MERGE_PATCH
        updated = merge_patch(current, patch)
        updated["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        if updated == current:
            return copy.deepcopy(current)  # a no-op changes nothing, not even resourceVersion
        return self._store(resource, updated, "MODIFIED")

    def delete(self, api_path: str, body: JSONObject | None = None) -> JSONObject:
        resource, namespace, name = self._call("DELETE", api_path)
        assert name is not None
        current = self._existing("DELETE", (resource, namespace, name))
        pre = (body or {}).get("preconditions") or {}
        meta = current["metadata"]
        for field, value in (("uid", pre.get("uid")), ("rv", pre.get("resourceVersion"))):
            actual = meta["uid"] if field == "uid" else meta["resourceVersion"]
            if value is not None and value != actual:
                raise Conflict(f"DELETE {api_path}", 409, "Conflict: precondition failed")
        del self.objects[(resource, namespace, name)]
        self._emit(resource, "DELETED", current)
        return {}

    def list_pages(self, api_path: str, **query: Any) -> Iterator[JSONObject]:
        resource, namespace, _ = self._call("LIST", api_path)
        if resource == "cronjobs" and "/batch/v1/" in api_path:
            raise NotFound(f"LIST {api_path}", 404, "NotFound")  # a 1.20 server
        items = [
            copy.deepcopy(o)
            for (r, ns, _), o in sorted(self.objects.items())
            if (r, ns)
            == (
                resource,
                namespace,
            )
        ]
        yield {"items": items, "metadata": {"resourceVersion": "1"}}

    # --- test helpers
    def obj(self, resource: str, name: str, namespace: str = NS) -> JSONObject | None:
        return self.objects.get((resource, namespace, name))


class Cluster:
    """A fake API server, the source cache fed by its writes, the index, the writer."""

    def __init__(self) -> None:
        self.kube = FakeKube()
        self.api = cast(Kube, self.kube)  # what the code under test is given
        self.metrics = Metrics()
        self.cache = SourceCache(self.api, HKEY, self.metrics)
        self.index = SnapshotIndex(self.metrics, HKEY)
        self.index.attach(self.cache)
        self.now = 0.0
        self.writer = SnapshotWriter(
            self.api,
            self.cache,
            self.index,
            HKEY,
            self.metrics,
            clock=lambda: self.now,
        )
        self.deliver = True
        self.kube.watchers.append(self._watch)
        for kind in SourceKind:
            self.cache.indexes[kind].relisted([])

    def _watch(self, resource: str, event: str, obj: JSONObject) -> None:
        if self.deliver and resource in _KIND_OF:
            self.cache.indexes[_KIND_OF[resource]].event(event, obj)

    def request(self, source: JSONObject) -> SnapshotRequest:
        """What a plan asks for when it sees `source` as it is here."""
        kind = SourceKind.CONFIGMAP if source["kind"] == "ConfigMap" else SourceKind.SECRET
        nskey = digest.namespace_key(HKEY, NS)
        content = digest.source_digest(nskey, digest.record_from_object(HKEY, kind, source))
        sid = SourceId(kind, source["metadata"]["name"])
        return SnapshotRequest(sid, snapshot_name(sid.name, content), content)

    def copy_of(self, req: SnapshotRequest) -> Copy:
        found = self.index.get((req.source.kind, NS, req.snapshot_name))
        assert found is not None
        return found

    def sample(self, name: str) -> float:
        value = self.metrics.registry.get_sample_value(name)
        return value or 0.0


@pytest.fixture
def cluster() -> Cluster:
    return Cluster()


def _cm(data: dict[str, str] | None = None) -> JSONObject:
    return configmap("app-config", data or {"a": "1"})


# --- the writer


def test_a_missing_copy_is_created_from_the_source(cluster: Cluster) -> None:
    cluster.kube.put("configmaps", _cm())
    req = cluster.request(_cm())
    assert cluster.writer.ensure(NS, [req]) == []
    assert [m for m, _ in cluster.kube.requests] == ["GET", "POST"]
    made = cluster.kube.obj("configmaps", req.snapshot_name)
    assert made is not None
    assert made["immutable"] is True
    assert made["data"] == {"a": "1"}
    assert made["metadata"]["labels"] == {
        "configpin.io/snapshot": "true",
        "configpin.io/source": "app-config",
    }
    assert "ownerReferences" not in made["metadata"]
    assert (
        cluster.metrics.registry.get_sample_value(
            "configpin_snapshots_created_total", {"kind": "configmap"}
        )
        == 1.0
    )


def test_an_existing_copy_costs_no_api_call(cluster: Cluster) -> None:
    cluster.kube.put("configmaps", _cm())
    req = cluster.request(_cm())
    cluster.writer.ensure(NS, [req])
    before = cluster.kube.calls
    cluster.now += 60  # long after anything was remembered: the answer comes from the cache
    cluster.writer.ensure(NS, [req])
    assert cluster.kube.calls == before


def test_a_copy_made_a_moment_ago_is_not_read_again(cluster: Cluster) -> None:
    cluster.deliver = False  # the watch event has not arrived yet
    cluster.kube.put("configmaps", _cm())
    req = cluster.request(_cm())
    cluster.writer.ensure(NS, [req])
    before = cluster.kube.calls
    cluster.writer.ensure(NS, [req])
    assert cluster.kube.calls == before


def test_a_source_changed_since_planning_is_not_copied(cluster: Cluster) -> None:
    cluster.kube.put("configmaps", _cm({"a": "1"}))
    req = cluster.request(_cm({"a": "1"}))
    cluster.kube.patch(
        f"/api/v1/namespaces/{NS}/configmaps/app-config", {"data": {"a": "2"}}, MERGE_PATCH
    )
    with pytest.raises(SnapshotError, match="changed"):
        cluster.writer.ensure(NS, [req])
    assert cluster.kube.obj("configmaps", req.snapshot_name) is None


def test_a_deleted_source_is_not_copied(cluster: Cluster) -> None:
    req = cluster.request(_cm())
    with pytest.raises(SnapshotError, match="no longer exists"):
        cluster.writer.ensure(NS, [req])


def test_dry_run_makes_no_call(cluster: Cluster) -> None:
    cluster.kube.put("configmaps", _cm())
    assert cluster.writer.ensure(NS, [cluster.request(_cm())], dry_run=True) == []
    assert cluster.kube.calls == 0
    assert len(cluster.kube.objects) == 1


def test_a_service_account_token_is_never_copied(cluster: Cluster) -> None:
    token = secret(
        "default-token-abcde", {"token": "t"}, type_="kubernetes.io/service-account-token"
    )
    cluster.kube.put("secrets", token)
    with pytest.raises(SnapshotError, match="service-account token"):
        cluster.writer.ensure(NS, [cluster.request(token)])
    assert len(cluster.kube.objects) == 1


def test_secret_copies_keep_their_type(cluster: Cluster) -> None:
    tls = secret("tls", {"tls.crt": "c", "tls.key": "k"}, type_="kubernetes.io/tls")
    cluster.kube.put("secrets", tls)
    req = cluster.request(tls)
    cluster.writer.ensure(NS, [req])
    made = cluster.kube.obj("secrets", req.snapshot_name)
    assert made is not None and made["type"] == "kubernetes.io/tls"
    assert made["data"] == (cluster.kube.obj("secrets", "tls") or {})["data"]


def test_a_copy_another_replica_made_is_verified_and_accepted(cluster: Cluster) -> None:
    cluster.kube.put("configmaps", _cm())
    req = cluster.request(_cm())
    cluster.deliver = False  # made elsewhere; our cache has not seen it
    other = copy.deepcopy(cluster.kube.obj("configmaps", "app-config"))
    assert other is not None
    from webhook.core.snapshot import snapshot_object

    signature = digest.copy_signature(HKEY, NS, req.snapshot_name, req.content_digest)
    squatter = snapshot_object(
        SourceKind.CONFIGMAP, other, req.snapshot_name, signature=signature, namespace=NS
    )
    cluster.kube.put("configmaps", squatter)
    cluster.writer.ensure(NS, [req])
    assert [m for m, _ in cluster.kube.requests] == ["GET", "POST", "GET"]


def test_an_object_squatting_the_name_with_other_content_is_an_error(cluster: Cluster) -> None:
    cluster.kube.put("configmaps", _cm())
    req = cluster.request(_cm())
    squatter = configmap(
        req.snapshot_name,
        {"a": "evil"},
        labels={"configpin.io/snapshot": "true", "configpin.io/source": "app-config"},
    )
    cluster.kube.put("configmaps", squatter)
    # The label is not proof: neither signed nor named after its content, it is not ours.
    with pytest.raises(SnapshotError, match="not configpin's copy"):
        cluster.writer.ensure(NS, [req])
    cluster.kube.delete(f"/api/v1/namespaces/{NS}/configmaps/{req.snapshot_name}")
    cluster.kube.put("configmaps", configmap(req.snapshot_name, {"a": "1"}))  # not labelled
    with pytest.raises(SnapshotError, match="not configpin's copy"):
        cluster.writer.ensure(NS, [req])


def test_reusing_a_marked_copy_unmarks_it_so_a_pending_delete_fails(cluster: Cluster) -> None:
    cluster.kube.put("configmaps", _cm())
    req = cluster.request(_cm())
    cluster.writer.ensure(NS, [req])
    path = f"/api/v1/namespaces/{NS}/configmaps/{req.snapshot_name}"
    cluster.kube.patch(path, {"metadata": {"annotations": {ANN_UNUSED: "t"}}}, MERGE_PATCH)
    seen_by_sweep = cluster.copy_of(req)
    assert seen_by_sweep.unused_since == "t"

    cluster.writer.ensure(NS, [req])  # an admission re-uses it
    assert cluster.kube.requests[-1][0] == "PATCH"
    assert cluster.copy_of(req).unused_since is None
    assert not delete_unchanged(cluster.api, seen_by_sweep)
    assert cluster.kube.obj("configmaps", req.snapshot_name) is not None


def test_a_marked_copy_swept_just_before_reuse_is_made_again(cluster: Cluster) -> None:
    cluster.kube.put("configmaps", _cm())
    req = cluster.request(_cm())
    cluster.writer.ensure(NS, [req])
    path = f"/api/v1/namespaces/{NS}/configmaps/{req.snapshot_name}"
    cluster.kube.patch(path, {"metadata": {"annotations": {ANN_UNUSED: "t"}}}, MERGE_PATCH)
    cluster.deliver = False  # the delete's watch event has not arrived
    assert delete_unchanged(cluster.api, cluster.copy_of(req))
    cluster.writer.ensure(NS, [req])
    assert [m for m, _ in cluster.kube.requests[-3:]] == ["PATCH", "GET", "POST"]
    assert cluster.kube.obj("configmaps", req.snapshot_name) is not None


# --- the index


def test_index_counts_copies_per_namespace(cluster: Cluster) -> None:
    def current(ns: str) -> float | None:
        return cluster.metrics.registry.get_sample_value("configpin_snapshots", {"namespace": ns})

    cluster.kube.put("configmaps", _cm())
    req = cluster.request(_cm())
    cluster.writer.ensure(NS, [req])
    assert current(NS) == 1.0
    assert len(cluster.index) == 1
    copy_ = cluster.copy_of(req)
    assert copy_.source == "app-config" and not copy_.owners
    cluster.kube.delete(f"/api/v1/namespaces/{NS}/configmaps/{req.snapshot_name}")
    assert current(NS) is None
    assert len(cluster.index) == 0


def test_index_relist_replaces_what_it_knew(cluster: Cluster) -> None:
    cluster.kube.put("configmaps", _cm())
    req = cluster.request(_cm())
    cluster.writer.ensure(NS, [req])
    cluster.index.relisted(SourceKind.CONFIGMAP, [])
    assert cluster.index.get((SourceKind.CONFIGMAP, NS, req.snapshot_name)) is None


# --- adoption


def _owned(cluster: Cluster, name: str) -> list[JSONObject]:
    obj = cluster.kube.obj("configmaps", name)
    assert obj is not None
    return list(obj["metadata"].get("ownerReferences") or ())


def _replicaset(cluster: Cluster, copy_name: str, name: str = "web-1") -> JSONObject:
    rs = workload(
        "ReplicaSet",
        {"containers": [{"name": "c", "envFrom": [{"configMapRef": {"name": copy_name}}]}]},
        name=name,
        template_annotations={"configpin.io/sources": '{"configmap/app-config":"x"}'},
    )
    return cluster.kube.put("replicasets", rs)


def _adopter(cluster: Cluster, **kwargs: Any) -> SnapshotAdopter:
    return SnapshotAdopter(cluster.writer, **kwargs)


def test_owner_of_reads_each_revision_kind() -> None:
    spec = {"containers": [{"name": "c", "envFrom": [{"configMapRef": {"name": "a-0123456789"}}]}]}
    by_kind = {k.kind: k for k in owner_kinds()}
    rs = workload("ReplicaSet", spec, namespace=NS)
    rs["metadata"]["uid"] = "u1"
    revision = {
        "apiVersion": "apps/v1",
        "kind": "ControllerRevision",
        "metadata": {"name": "db-1", "namespace": NS, "uid": "u2"},
        "data": {"spec": {"template": {"spec": spec, "$patch": "replace"}}},
        "revision": 1,
    }
    pod = workload("Pod", spec, namespace=NS)
    pod["metadata"]["uid"] = "u3"
    owned_pod = workload("Pod", spec, namespace=NS, owner="ReplicaSet")
    owned_pod["metadata"]["uid"] = "u4"
    plain = workload(
        "ReplicaSet",
        {"containers": [{"name": "c", "envFrom": [{"configMapRef": {"name": "app-config"}}]}]},
        namespace=NS,
    )
    plain["metadata"]["uid"] = "u5"

    key = (SourceKind.CONFIGMAP, NS, "a-0123456789")
    found = owner_of(by_kind["ReplicaSet"], rs)
    assert found is not None and found.copies == {key}
    assert found.reference == {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "name": "app",
        "uid": "u1",
        "controller": False,
        "blockOwnerDeletion": False,
    }
    found = owner_of(by_kind["ControllerRevision"], revision)
    assert found is not None and found.copies == {key}
    assert owner_of(by_kind["Pod"], pod) is not None
    assert owner_of(by_kind["Pod"], owned_pod) is None, "a controlled pod: its owner owns"
    assert owner_of(by_kind["ReplicaSet"], plain) is None, "references no copy"
    rs["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert owner_of(by_kind["ReplicaSet"], rs) is None


def test_adoption_adds_one_reference_per_revision(cluster: Cluster) -> None:
    cluster.kube.put("configmaps", _cm())
    req = cluster.request(_cm())
    cluster.writer.ensure(NS, [req])
    adopter = _adopter(cluster)
    by_kind = {k.kind: k for k in owner_kinds()}
    key = (SourceKind.CONFIGMAP, NS, req.snapshot_name)
    for name in ("web-1", "web-2"):
        rs = _replicaset(cluster, req.snapshot_name, name)
        adopter.put_owner(rs["metadata"]["uid"], owner_of(by_kind["ReplicaSet"], rs))
    assert adopter.reconcile(key) == "adopted"
    refs = _owned(cluster, req.snapshot_name)
    assert sorted(r["name"] for r in refs) == ["web-1", "web-2"]
    assert all(r["controller"] is False and r["blockOwnerDeletion"] is False for r in refs)
    assert adopter.reconcile(key) == "current"
    assert cluster.sample("configpin_snapshots_adopted_total") == 2.0


def test_adoption_respects_the_namespace_filter(cluster: Cluster) -> None:
    cluster.kube.put("configmaps", _cm())
    req = cluster.request(_cm())
    cluster.writer.ensure(NS, [req])
    adopter = _adopter(cluster, namespace_filter=lambda ns: False)
    rs = _replicaset(cluster, req.snapshot_name)
    adopter.put_owner(rs["metadata"]["uid"], owner_of(_REPLICASETS, rs))
    assert adopter.reconcile((SourceKind.CONFIGMAP, NS, req.snapshot_name)) == "not selected"
    assert _owned(cluster, req.snapshot_name) == []


def test_a_missing_copy_a_live_revision_uses_is_made_again(cluster: Cluster) -> None:
    cluster.kube.put("configmaps", _cm())
    req = cluster.request(_cm())
    adopter = _adopter(cluster)
    rs = _replicaset(cluster, req.snapshot_name)
    adopter.put_owner(rs["metadata"]["uid"], owner_of(_REPLICASETS, rs))
    key = (SourceKind.CONFIGMAP, NS, req.snapshot_name)
    assert adopter.reconcile(key) == "repaired"
    assert cluster.kube.obj("configmaps", req.snapshot_name) is not None
    assert adopter.reconcile(key) == "adopted"


def test_a_missing_copy_of_content_that_is_gone_is_reported_not_made(cluster: Cluster) -> None:
    cluster.kube.put("configmaps", _cm({"a": "2"}))
    old = cluster.request(_cm({"a": "1"}))
    adopter = _adopter(cluster)
    rs = _replicaset(cluster, old.snapshot_name)
    adopter.put_owner(rs["metadata"]["uid"], owner_of(_REPLICASETS, rs))
    assert adopter.reconcile((SourceKind.CONFIGMAP, NS, old.snapshot_name)) == "lost"
    assert cluster.kube.obj("configmaps", old.snapshot_name) is None


def test_a_missing_copy_whose_revisions_are_gone_is_left_gone(cluster: Cluster) -> None:
    cluster.kube.put("configmaps", _cm())
    req = cluster.request(_cm())
    adopter = _adopter(cluster)
    rs = _replicaset(cluster, req.snapshot_name)
    adopter.put_owner(rs["metadata"]["uid"], owner_of(_REPLICASETS, rs))
    cluster.kube.delete(f"/api/v1/namespaces/{NS}/replicasets/web-1")  # not seen by the adopter
    assert adopter.reconcile((SourceKind.CONFIGMAP, NS, req.snapshot_name)) == "owners gone"
    assert cluster.kube.obj("configmaps", req.snapshot_name) is None


# --- the sweep


class Clocks:
    def __init__(self) -> None:
        self.wall = 1_767_225_600.0  # 2026-01-01T00:00:00Z, when the fake server creates
        self.mono = 0.0

    def advance(self, seconds: float) -> None:
        self.wall += seconds
        self.mono += seconds


def _sweeper(cluster: Cluster, clocks: Clocks, **kwargs: Any) -> SnapshotSweeper:
    return SnapshotSweeper(
        cluster.api,
        kwargs.pop("index", cluster.index),
        cluster.metrics,
        grace=60,
        wall=lambda: clocks.wall,
        monotonic=lambda: clocks.mono,
        **kwargs,
    )


def _unused_copy(cluster: Cluster) -> SnapshotRequest:
    cluster.kube.put("configmaps", _cm())
    req = cluster.request(_cm())
    cluster.writer.ensure(NS, [req])
    return req


def test_an_unused_copy_is_marked_then_deleted_a_grace_period_later(cluster: Cluster) -> None:
    clocks = Clocks()
    req = _unused_copy(cluster)
    sweep = _sweeper(cluster, clocks)
    assert sweep.run_once().marked == [], "younger than the grace period"

    clocks.advance(61)
    assert sweep.run_once().marked == [f"configmap/{req.snapshot_name}"]
    assert cluster.copy_of(req).unused_since == "2026-01-01T00:01:01Z"
    clocks.advance(30)
    assert sweep.run_once().deleted == [], "writers get a grace period to see the mark"
    clocks.advance(31)
    assert sweep.run_once().deleted == [f"configmap/{req.snapshot_name}"]
    assert cluster.kube.obj("configmaps", req.snapshot_name) is None
    assert cluster.kube.obj("configmaps", "app-config") is not None
    assert cluster.sample("configpin_snapshots_swept_total") == 1.0
    delete = next(r for r in reversed(cluster.kube.requests) if r[0] == "DELETE")
    assert delete[1].endswith(req.snapshot_name)


def test_a_copy_reused_between_mark_and_delete_is_kept(cluster: Cluster) -> None:
    clocks = Clocks()
    req = _unused_copy(cluster)
    clocks.advance(61)
    _sweeper(cluster, clocks).run_once()
    assert cluster.copy_of(req).unused_since is not None

    # The sweep acts on what it saw; an admission re-uses the copy after that.
    seen = copy.deepcopy(cluster.kube.obj("configmaps", req.snapshot_name))
    assert seen is not None
    stale = SnapshotIndex(Metrics(), HKEY)
    stale.relisted(SourceKind.CONFIGMAP, [seen])
    late = _sweeper(cluster, clocks, index=stale)
    late.run_once()  # first sight of the mark for this sweeper
    cluster.writer.ensure(NS, [req])
    clocks.advance(61)
    result = late.run_once()
    assert result.deleted == []
    assert result.kept == [f"configmap/{req.snapshot_name}"]
    assert cluster.kube.obj("configmaps", req.snapshot_name) is not None


def test_owned_copies_are_never_swept(cluster: Cluster) -> None:
    clocks = Clocks()
    req = _unused_copy(cluster)
    rs = _replicaset(cluster, req.snapshot_name)
    adopter = _adopter(cluster)
    adopter.put_owner(rs["metadata"]["uid"], owner_of(_REPLICASETS, rs))
    adopter.reconcile((SourceKind.CONFIGMAP, NS, req.snapshot_name))
    clocks.advance(1000)
    sweep = _sweeper(cluster, clocks)
    for _ in range(3):
        assert sweep.run_once() == SweepResult()
        clocks.advance(61)
    assert [m for m, _ in cluster.kube.requests if m in ("LIST", "DELETE")] == []


def test_a_copy_a_template_references_is_kept_and_unmarked(cluster: Cluster) -> None:
    clocks = Clocks()
    req = _unused_copy(cluster)
    clocks.advance(61)
    sweep = _sweeper(cluster, clocks)
    sweep.run_once()
    # A paused Deployment (no ReplicaSet yet) points at it.
    dep = workload(
        "Deployment",
        {"containers": [{"name": "c", "envFrom": [{"configMapRef": {"name": req.snapshot_name}}]}]},
    )
    cluster.kube.put("deployments", dep)
    clocks.advance(61)
    result = sweep.run_once()
    assert result.kept == [f"configmap/{req.snapshot_name}"]
    assert result.unmarked == [f"configmap/{req.snapshot_name}"]
    assert cluster.copy_of(req).unused_since is None
    calls = cluster.kube.calls
    clocks.advance(30)
    assert sweep.run_once().kept == [], "not listed again within a grace period"
    assert cluster.kube.calls == calls


def test_nothing_is_deleted_when_references_cannot_be_listed(cluster: Cluster) -> None:
    clocks = Clocks()
    req = _unused_copy(cluster)
    sweep = _sweeper(cluster, clocks)
    clocks.advance(61)
    sweep.run_once()
    clocks.advance(61)
    cluster.kube.failing.add("pods")
    assert sweep.run_once().deleted == []
    assert cluster.kube.obj("configmaps", req.snapshot_name) is not None


def test_the_sweep_acts_only_in_selected_namespaces(cluster: Cluster) -> None:
    clocks = Clocks()
    req = _unused_copy(cluster)
    sweep = _sweeper(cluster, clocks, namespace_filter=lambda ns: ns != NS)
    clocks.advance(1000)
    assert sweep.run_once().marked == []
    assert cluster.copy_of(req).unused_since is None


def test_cronjobs_are_listed_on_servers_without_batch_v1(cluster: Cluster) -> None:
    sweep = _sweeper(cluster, Clocks())
    assert sweep.referenced(NS) == set()
    lists = [p for m, p in cluster.kube.requests if m == "LIST" and p.endswith("/cronjobs")]
    assert lists == [
        f"/apis/batch/v1/namespaces/{NS}/cronjobs",
        f"/apis/batch/v1beta1/namespaces/{NS}/cronjobs",
    ]
    sweep.referenced(NS)
    lists = [p for m, p in cluster.kube.requests if m == "LIST" and p.endswith("/cronjobs")]
    assert lists[-1] == f"/apis/batch/v1beta1/namespaces/{NS}/cronjobs", "remembered"
    assert len(lists) == 3


def test_read_through_answers_are_evicted_oldest_first_never_all_at_once(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    from webhook.kube import cache as cache_module

    monkeypatch.setattr(cache_module, "_RECENT_MAX", 3)
    cluster.cache = SourceCache(cluster.api, HKEY, cluster.metrics)  # (built with that bound)
    for i in range(5):
        assert cluster.cache.get(NS, SourceId(SourceKind.CONFIGMAP, f"missing-{i}")) is None
    kept = [name for (_kind, _ns, name) in cluster.cache._recent]
    assert kept == ["missing-2", "missing-3", "missing-4"]
    calls = cluster.kube.calls
    assert cluster.cache.get(NS, SourceId(SourceKind.CONFIGMAP, "missing-4")) is None
    assert cluster.kube.calls == calls  # answered from what was kept


def test_read_through_answers_are_kept_for_their_ttl_then_asked_again(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    from webhook.kube import cache as cache_module

    now = [1000.0]
    monkeypatch.setattr(cache_module.time, "monotonic", lambda: now[0])
    cluster.cache = SourceCache(cluster.api, HKEY, cluster.metrics)  # (on that clock)
    sid = SourceId(SourceKind.CONFIGMAP, "missing")
    assert cluster.cache.get(NS, sid) is None
    calls = cluster.kube.calls
    now[0] += cache_module._RECENT_TTL - 0.1
    assert cluster.cache.get(NS, sid) is None
    assert cluster.kube.calls == calls  # kept
    now[0] += 0.1
    assert cluster.cache.get(NS, sid) is None
    assert cluster.kube.calls == calls + 1  # expired: read through again
