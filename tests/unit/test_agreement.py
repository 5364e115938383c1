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
    apply,
    configmap,
    container,
    env_cm,
    plan,
    pod_spec,
    record,
    recorded_sources,
    review,
    spec_of,
    template_annotations,
    workload,
)
from webhook.core.constants import ANN_CHECKSUM, ANN_OBSERVED, ANN_ROLLED_AT, ANN_SOURCES
from webhook.core.model import JSONObject, SourceId, SourceKind, SourceRecord
from webhook.core.plan import dumps_mapping
from webhook.metrics import Metrics
from webhook.server.admission import parse_review
from webhook.server.handler import Admitter
from webhook.sources import Miss

CM = SourceKind.CONFIGMAP


def _deploy(kind: str = "Deployment") -> JSONObject:
    return workload(kind, pod_spec(container(env=[env_cm("cfg", "a")])))


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
    stamped = apply(obj, plan(obj, store))
    store.put(configmap("cfg", {"a": "2"}))
    scaled = copy.deepcopy(stamped)
    scaled["spec"]["replicas"] = 5
    p = plan(scaled, store, operation="UPDATE", old=stamped)
    assert p.patch == []
    assert recorded_sources(apply(scaled, p)) == recorded_sources(stamped)


def test_a_whole_object_replace_that_drops_the_record_gets_it_back_unchanged() -> None:
    store = _store("1")
    obj = _deploy()
    stamped = apply(obj, plan(obj, store))
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
    stamped = apply(obj, plan(obj, store))
    # the user changes the image: the template is planned (here: nothing to add)
    deploy = copy.deepcopy(stamped)
    spec_of(deploy)["containers"][0]["image"] = "registry.example/app:2"
    p = plan(deploy, store, operation="UPDATE", old=stamped)
    assert not p.kept and p.patch == []
    # a request that sets a record of its own (the controller re-stamping) is planned too
    store.put(configmap("cfg", {"a": "2"}))
    restamp = apply(stamped, plan(stamped, store, refresh=ALL))
    p = plan(restamp, store, operation="UPDATE", old=stamped)
    assert not p.kept and p.patch == []


class LaggingReader:
    """The cache says cfg has a=1 (its watch lags); the API server already has a=2."""

    def __init__(self) -> None:
        self.memory = record(configmap("cfg", {"a": "1"}))
        self.server = configmap("cfg", {"a": "2"})
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
    stamped = apply(obj, plan(obj, old_store))
    restamp = apply(stamped, plan(stamped, new_store, refresh=ALL))
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
    stamped = apply(obj, plan(obj, _store("1")))
    deploy = copy.deepcopy(stamped)
    spec_of(deploy)["containers"][0]["image"] = "registry.example/app:2"
    out = _patched(deploy, _admit(reader, deploy, stamped))
    want = plan(obj, Store([reader.server])).sources
    assert recorded_sources(out) == want
    assert template_annotations(out)[ANN_CHECKSUM] != template_annotations(stamped)[ANN_CHECKSUM]


def test_an_update_that_leaves_the_template_alone_reads_nothing_fresh() -> None:
    reader = LaggingReader()
    obj = _deploy()
    stamped = apply(obj, plan(obj, _store("1")))
    scaled = copy.deepcopy(stamped)
    scaled["spec"]["replicas"] = 2
    response = _admit(reader, scaled, stamped)
    assert "patch" not in response
    assert reader.fresh_reads == 0
