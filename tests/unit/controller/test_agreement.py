"""Admission and the controller agree: an UPDATE changes a pod template only when the request
changes it, and what a template change records is settled by fresh reads, not by a cache."""

from __future__ import annotations

import asyncio
import base64
import copy
import json
from typing import Any

import jsonpatch
import pytest

from tests.unit.conftest import (
    ALL,
    HKEY,
    MUTABLE_TEMPLATE_KINDS,
    Store,
    admitted,
    apply,
    configmap,
    plan,
    reading,
    record,
    recorded_sources,
    review,
    spec_of,
    template_annotations,
    template_meta_of,
    workload,
)
from webhook.core.constants import ANN_CHECKSUM, ANN_OBSERVED, ANN_ROLLED_AT, ANN_SOURCES
from webhook.core.kept import changes_only_the_record, dumps_mapping
from webhook.core.model import JSONObject, SourceId, SourceKind, SourceRecord
from webhook.inputs.sources import Miss
from webhook.process.metrics import Metrics
from webhook.server.admission import parse_review
from webhook.server.handler import Admitter

CM = SourceKind.CONFIGMAP


def _deploy(kind: str = "Deployment") -> JSONObject:
    return workload(kind, reading("cfg", "a"))


def _store(value: str = "1") -> Store:
    return Store([configmap("cfg", {"a": value})])


@pytest.mark.parametrize("kind", MUTABLE_TEMPLATE_KINDS)
def test_a_metadata_edit_of_an_unstamped_workload_stamps_nothing(kind: str) -> None:
    # A workload that carries no record (created before its namespace was opted in): a label
    # edit or a replicas change must not stamp its template, which would roll it.
    old = _deploy(kind)
    new = copy.deepcopy(old)
    new["metadata"]["labels"]["team"] = "x"
    if kind in ("Deployment", "StatefulSet", "ReplicaSet", "ReplicationController"):
        new["spec"]["replicas"] = 3
    p = plan(new, _store(), operation="UPDATE", old=old)
    assert p.patch == [] and p.kept


def test_the_controllers_baseline_write_passes_admission_unchanged() -> None:
    old = _deploy()
    new = copy.deepcopy(old)
    baseline = dumps_mapping({"configmap/cfg": "x"})
    new["metadata"]["annotations"] = {ANN_OBSERVED: baseline}
    p = plan(new, _store(), operation="UPDATE", old=old)
    assert p.patch == []
    assert ANN_SOURCES not in template_annotations(apply(new, p))


def test_a_stamped_template_keeps_its_record_when_the_request_leaves_it_alone() -> None:
    # The content changed since the template was stamped; that is the controller's to roll
    # (paced, coalesced), not a side effect of someone scaling the workload.
    store = _store("1")
    obj = _deploy()
    stamped = admitted(obj, store)
    store.put(configmap("cfg", {"a": "2"}))
    scaled = copy.deepcopy(stamped)
    scaled["spec"]["replicas"] = 5
    p = plan(scaled, store, operation="UPDATE", old=stamped)
    assert p.patch == []
    assert recorded_sources(apply(scaled, p)) == recorded_sources(stamped)


def test_a_whole_object_replace_that_drops_the_record_gets_it_back_unchanged() -> None:
    store = _store("1")
    obj = _deploy()
    stamped = admitted(obj, store)
    stamped["metadata"]["annotations"] = {
        ANN_OBSERVED: dumps_mapping({"configmap/cfg": "older"}),
        ANN_ROLLED_AT: "2026-01-01T00:00:00Z",
    }
    store.put(configmap("cfg", {"a": "2"}))
    replaced = copy.deepcopy(obj)  # the original manifest, PUT as it is
    p = plan(replaced, store, operation="UPDATE", old=stamped)
    out = apply(replaced, p)
    assert template_annotations(out) == template_annotations(stamped)
    assert out["metadata"]["annotations"] == stamped["metadata"]["annotations"]


def test_a_template_change_is_planned_and_a_record_of_its_own_is_checked() -> None:
    store = _store("1")
    obj = _deploy()
    stamped = admitted(obj, store)
    # the user changes the image: the template is planned (here: nothing to add)
    deploy = copy.deepcopy(stamped)
    spec_of(deploy)["containers"][0]["image"] = "registry.example/app:2"
    p = plan(deploy, store, operation="UPDATE", old=stamped)
    assert not p.kept and p.patch == []
    # a request that sets a record of its own (the controller re-stamping) is planned too
    store.put(configmap("cfg", {"a": "2"}))
    restamp = admitted(stamped, store, refresh=ALL)
    p = plan(restamp, store, operation="UPDATE", old=stamped)
    assert not p.kept and p.patch == []


class LaggingReader:
    """The cache says cfg has a=1 (its watch lags); the API server already has a=2. (Other
    values: a cache that has seen what the API server holds, or one that is ahead.)"""

    def __init__(self, cache: str = "1", server: str = "2") -> None:
        self.memory = record(configmap("cfg", {"a": cache}))
        self.server = configmap("cfg", {"a": server})
        self.fresh_reads = 0

    def peek(self, namespace: str, sid: SourceId) -> SourceRecord | Miss | None:
        return self.memory if sid == SourceId(CM, "cfg") else None

    def get(self, namespace: str, sid: SourceId) -> SourceRecord | None:
        found = self.peek(namespace, sid)
        assert not isinstance(found, Miss)
        return found

    def get_object(self, namespace: str, sid: SourceId) -> JSONObject | None:
        self.fresh_reads += 1
        return self.server if sid == SourceId(CM, "cfg") else None


def _admit(reader: LaggingReader, new: JSONObject, old: JSONObject) -> dict[str, Any]:
    admitter = Admitter(hkey=HKEY, sources=reader, metrics=Metrics())
    raw = json.dumps(review(new, operation="UPDATE", old=old)).encode()
    out = asyncio.run(admitter.review(parse_review(raw)))
    response: dict[str, Any] = out["response"]
    assert response["allowed"]
    return response


def _patched(obj: JSONObject, response: dict[str, Any]) -> JSONObject:
    if "patch" not in response:
        return obj
    ops = json.loads(base64.b64decode(response["patch"]))
    result: JSONObject = jsonpatch.apply_patch(obj, ops)
    return result


def test_a_lagging_replica_never_undoes_the_controllers_restamp() -> None:
    # Replica A's controller re-stamped for a=2; replica B, whose watch has not seen a=2 yet,
    # admits that patch. Its cache disagrees with the request; the API server decides.
    reader = LaggingReader()
    old_store, new_store = _store("1"), Store([reader.server])
    obj = _deploy()
    stamped = admitted(obj, old_store)
    restamp = admitted(stamped, new_store, refresh=ALL)
    assert recorded_sources(restamp) != recorded_sources(stamped)
    response = _admit(reader, restamp, stamped)
    assert "patch" not in response, "the re-stamp must pass unchanged"
    assert reader.fresh_reads == 1


def test_a_deploy_records_what_the_api_server_holds_not_a_lagging_cache() -> None:
    # One `kubectl apply` changed the ConfigMap and then the Deployment's image: the
    # Deployment must be stamped for a=2 even though this replica's cache still says a=1, or
    # the controller would roll it a second time a moment later.
    reader = LaggingReader()
    obj = _deploy()
    stamped = admitted(obj, _store("1"))
    deploy = copy.deepcopy(stamped)
    spec_of(deploy)["containers"][0]["image"] = "registry.example/app:2"
    out = _patched(deploy, _admit(reader, deploy, stamped))
    want = plan(obj, Store([reader.server])).sources
    assert recorded_sources(out) == want
    assert template_annotations(out)[ANN_CHECKSUM] != template_annotations(stamped)[ANN_CHECKSUM]


def test_an_update_that_leaves_the_template_alone_reads_nothing_fresh() -> None:
    reader = LaggingReader()
    obj = _deploy()
    stamped = admitted(obj, _store("1"))
    scaled = copy.deepcopy(stamped)
    scaled["spec"]["replicas"] = 2
    response = _admit(reader, scaled, stamped)
    assert "patch" not in response
    assert reader.fresh_reads == 0


def test_a_restamp_this_replicas_cache_agrees_with_passes_without_fresh_reads() -> None:
    # The controller (on any replica) re-stamped for a=2 and this replica's watch has seen
    # a=2 too: it would record exactly what the request carries, so nothing is replaced and
    # nothing needs the API server's word (the fan-out of one change to many workloads
    # costs no extra reads per workload).
    reader = LaggingReader(cache="2", server="2")
    obj = _deploy()
    stamped = admitted(obj, _store("1"))
    restamp = admitted(stamped, _store("2"), refresh=ALL)
    response = _admit(reader, restamp, stamped)
    assert "patch" not in response
    assert reader.fresh_reads == 0


def test_a_restamp_the_cache_disagrees_with_is_settled_by_fresh_reads_either_way() -> None:
    obj = _deploy()
    stamped = admitted(obj, _store("1"))
    # The writer's watch lags (it re-stamped for a=2; a=3 is there already, and this
    # replica's cache has seen it): the API server's content is recorded, not the writer's.
    reader = LaggingReader(cache="3", server="3")
    restamp = admitted(stamped, _store("2"), refresh=ALL)
    out = _patched(restamp, _admit(reader, restamp, stamped))
    assert reader.fresh_reads == 1
    assert recorded_sources(out) == plan(obj, _store("3")).sources
    # A record written by hand (a tenant's guess, an old one copied back) that this replica
    # does not agree with is never kept as written: fresh reads decide.
    reader = LaggingReader(cache="2", server="2")
    forged = copy.deepcopy(stamped)
    template_meta_of(forged)["annotations"][ANN_SOURCES] = dumps_mapping(
        {"configmap/cfg": "f" * 64}
    )
    out = _patched(forged, _admit(reader, forged, stamped))
    assert reader.fresh_reads == 1
    assert recorded_sources(out) == plan(obj, _store("2")).sources


def test_a_deploy_reads_fresh_even_when_the_cache_agrees() -> None:
    # A deploy carries the old record along (kubectl keeps annotations it does not set): it
    # must record what the API server holds, whatever this replica's cache says.
    reader = LaggingReader(cache="1", server="1")
    obj = _deploy()
    stamped = admitted(obj, _store("1"))
    deploy = copy.deepcopy(stamped)
    spec_of(deploy)["containers"][0]["image"] = "registry.example/app:2"
    assert "patch" not in _admit(reader, deploy, stamped)
    assert reader.fresh_reads == 1


@pytest.mark.parametrize("kind", MUTABLE_TEMPLATE_KINDS)
def test_what_counts_as_changing_only_the_record(kind: str) -> None:
    obj = _deploy(kind)
    stamped = admitted(obj, _store("1"))
    restamp = admitted(stamped, _store("2"), refresh=ALL)
    assert changes_only_the_record(restamp, stamped)
    assert not changes_only_the_record(restamp, None)  # a CREATE
    assert not changes_only_the_record(stamped, stamped)  # the record as it was
    dropped = copy.deepcopy(stamped)  # a client that dropped the record (it is restored)
    del template_meta_of(dropped)["annotations"][ANN_SOURCES]
    del template_meta_of(dropped)["annotations"][ANN_CHECKSUM]
    assert not changes_only_the_record(dropped, stamped)
    deploy = copy.deepcopy(restamp)  # a new record along with a change of the template
    spec_of(deploy)["containers"][0]["image"] = "registry.example/app:2"
    assert not changes_only_the_record(deploy, stamped)
    restart = copy.deepcopy(restamp)  # `kubectl rollout restart` beside a new record
    template_meta_of(restart)["annotations"]["kubectl.kubernetes.io/restartedAt"] = "2026"
    assert not changes_only_the_record(restart, stamped)
