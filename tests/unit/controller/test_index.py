"""The controller's view of a workload: what it indexes, and when it is stale.

The test that matters most: the index and the planner agree. A workload admitted by
`plan_object` is current; a change to what it consumes makes it stale; the controller's
plan for it (UPDATE, refresh=the stale sources) makes it current again, and admitting that
result once more gives an empty patch (the webhook sees the controller's patch too).
"""

from __future__ import annotations

import json

import pytest

from tests.unit.conftest import (
    HKEY,
    Store,
    admitted,
    apply,
    configmap,
    container,
    env_cm,
    envfrom_secret,
    plan,
    pod_spec,
    record,
    recorded_sources,
    secret,
    spec_of,
    vol_cm,
    workload,
)
from webhook.controller.index import WorkloadIndex
from webhook.core import digest
from webhook.core.constants import ANN_IGNORE, ANN_MODE, ANN_OBSERVED, ANN_SOURCES, LABEL_SNAPSHOT
from webhook.core.current import WorkloadEntry, WorkloadRef, entry_from_object, stale_sources
from webhook.core.kinds import rolled_kinds
from webhook.core.model import JSONObject, SourceId, SourceKind
from webhook.core.reasons import SkipReason

CM = SourceId(SourceKind.CONFIGMAP, "app-config")
SEC = SourceId(SourceKind.SECRET, "app-secret")


def _spec() -> JSONObject:
    """Consumes only key `a` of the ConfigMap (valueFrom) and the whole Secret (envFrom)."""
    return pod_spec(
        container(env=[env_cm("app-config", "a")], env_from=[envfrom_secret("app-secret")])
    )


def _store() -> Store:
    return Store([configmap("app-config", {"a": "1", "b": "1"}), secret("app-secret", {"t": "x"})])


def _stale(obj: JSONObject, store: Store, mode: str = "checksum") -> set[SourceId]:
    return stale_sources(entry_from_object(obj, mode), store.lookup, HKEY)


def _controller_update(obj: JSONObject, store: Store, mode: str = "checksum") -> JSONObject:
    """What the controller writes: the shared planner, as an UPDATE of the object itself."""
    p = plan(obj, store, mode=mode, refresh=_stale(obj, store, mode))
    if mode == "snapshot":
        store.create_snapshots(p)
    return apply(obj, p)


def _admitted(kind: str, store: Store, mode: str = "checksum") -> JSONObject:
    obj = workload(kind, _spec())
    p = plan(obj, store, mode=mode)
    if mode == "snapshot":
        store.create_snapshots(p)
    return apply(obj, p)


@pytest.mark.parametrize("kind", [k.kind for k in rolled_kinds()])
def test_admitted_workload_is_current_and_a_consumed_change_makes_it_stale(kind: str) -> None:
    store = _store()
    obj = _admitted(kind, store)
    assert _stale(obj, store) == set()

    store.put(configmap("app-config", {"a": "2", "b": "1"}))
    assert _stale(obj, store) == {CM}

    rolled = _controller_update(obj, store)
    assert recorded_sources(rolled) != recorded_sources(obj)
    assert _stale(rolled, store) == set()
    # The webhook sees the controller's patch as an UPDATE: it must have nothing to add.
    again = plan(rolled, store, operation="UPDATE", old=obj)
    assert again.patch == []


def test_digests_recorded_before_they_were_bound_to_the_namespace_are_current() -> None:
    """An upgrade rolls nothing: a workload stamped by a version whose digests were not
    keyed by namespace is current while its content is what it recorded; a change rolls it."""
    store = _store()
    obj = _admitted("Deployment", store)
    legacy = {
        "configmap/app-config": digest.source_digest(HKEY, record(store.objects[CM]), ["a"]),
        "secret/app-secret": digest.source_digest(HKEY, record(store.objects[SEC])),
    }
    obj["spec"]["template"]["metadata"]["annotations"][ANN_SOURCES] = json.dumps(legacy)
    assert _stale(obj, store) == set()
    store.put(configmap("app-config", {"a": "2", "b": "1"}))
    assert _stale(obj, store) == {CM}


def test_unused_key_label_and_annotation_changes_are_not_stale() -> None:
    store = _store()
    obj = _admitted("Deployment", store)
    store.put(configmap("app-config", {"a": "1", "b": "changed"}))
    assert _stale(obj, store) == set()
    store.put(
        configmap(
            "app-config",
            {"a": "1", "b": "changed"},
            labels={"team": "x"},
            annotations={"note": "y"},
        )
    )
    assert _stale(obj, store) == set()


def test_items_projection_limits_the_keys_that_count() -> None:
    store = _store()
    obj = workload("Deployment", pod_spec(volumes=[vol_cm("app-config", items=["a"])]))
    obj = admitted(obj, store)
    store.put(configmap("app-config", {"a": "1", "b": "2"}))
    assert _stale(obj, store) == set()
    store.put(configmap("app-config", {"a": "9", "b": "2"}))
    assert _stale(obj, store) == {CM}


def test_workload_without_annotations_is_stamped_once() -> None:
    store = _store()
    obj = workload("Deployment", _spec())  # admitted while configpin was down
    assert _stale(obj, store) == {CM, SEC}
    stamped = _controller_update(obj, store)
    assert _stale(stamped, store) == set()
    assert _controller_update(stamped, store) == stamped


def test_missing_sources_optional_and_required() -> None:
    store = Store([])
    spec = pod_spec(container(env=[env_cm("opt", "k", optional=True), env_cm("req", "k", var="R")]))
    obj = workload("Deployment", spec)
    obj = admitted(obj, store)
    assert recorded_sources(obj) == {"configmap/opt": "absent"}
    # A required source that is missing is not a reason to roll (pods could not start).
    assert _stale(obj, store) == set()
    # Creating the optional one is a change; creating the required one too (now recordable).
    store.put(configmap("opt", {"k": "1"}))
    store.put(configmap("req", {"k": "1"}))
    assert _stale(obj, store) == {
        SourceId(SourceKind.CONFIGMAP, "opt"),
        SourceId(SourceKind.CONFIGMAP, "req"),
    }
    rolled = _controller_update(obj, store)
    assert _stale(rolled, store) == set()
    # Deleting a required source rolls nothing.
    store.delete(SourceId(SourceKind.CONFIGMAP, "req"))
    assert _stale(rolled, store) == set()


def test_ignored_source_never_makes_a_workload_stale() -> None:
    store = _store()
    obj = _admitted("Deployment", store)
    store.put(configmap("app-config", {"a": "2"}, annotations={ANN_IGNORE: "true"}))
    assert _stale(obj, store) == set()


def test_snapshot_mode_rollback_is_current_until_the_source_changes() -> None:
    store = _store()
    v1 = _admitted("Deployment", store, mode="snapshot")
    assert _stale(v1, store, "snapshot") == set()

    store.put(configmap("app-config", {"a": "2", "b": "1"}))
    assert _stale(v1, store, "snapshot") == {CM}
    v2 = _controller_update(v1, store, "snapshot")
    assert _stale(v2, store, "snapshot") == set()
    assert spec_of(v2) != spec_of(v1)  # points at the copy of the new content

    # `kubectl rollout undo`: the template goes back to v1's copy, by a PATCH that passes
    # through admission, which keeps the older copy and records on the workload that it had
    # seen the newer content. Not stale: the controller leaves the rollback alone.
    undone = json.loads(json.dumps(v2))
    undone["spec"]["template"] = v1["spec"]["template"]
    undone = admitted(undone, store, mode="snapshot", operation="UPDATE", old=v2)
    assert undone["spec"]["template"] == admitted(v1, store, mode="snapshot")["spec"]["template"]
    assert ANN_OBSERVED in undone["metadata"]["annotations"]
    assert _stale(undone, store, "snapshot") == set()

    store.put(configmap("app-config", {"a": "3", "b": "1"}))
    assert _stale(undone, store, "snapshot") == {CM}
    v3 = _controller_update(undone, store, "snapshot")
    assert _stale(v3, store, "snapshot") == set()
    assert ANN_OBSERVED not in v3["metadata"].get("annotations", {})  # current: no record needed
    assert plan(v3, store, mode="snapshot", operation="UPDATE", old=undone).patch == []


def test_observed_wins_over_the_template_sources() -> None:
    store = _store()
    obj = _admitted("Deployment", store)
    # The usual case carries no record of its own: the template's sources are the record.
    assert ANN_OBSERVED not in obj["metadata"].get("annotations", {})
    assert entry_from_object(obj, "checksum").recorded == recorded_sources(obj)
    observed = {"configmap/app-config": "f" * 64}
    obj["metadata"].setdefault("annotations", {})[ANN_OBSERVED] = json.dumps(observed)
    assert entry_from_object(obj, "checksum").recorded == observed


@pytest.mark.parametrize(
    ("obj", "reason"),
    [
        (workload("Job", pod_spec(volumes=[vol_cm("c")])), SkipReason.FIXED_TEMPLATE),
        (workload("Pod", pod_spec(volumes=[vol_cm("c")])), SkipReason.FIXED_TEMPLATE),
        (
            workload("ReplicaSet", pod_spec(volumes=[vol_cm("c")]), owner="Deployment"),
            SkipReason.OWNED,
        ),
        (
            workload("Deployment", pod_spec(volumes=[vol_cm("c")]), annotations={ANN_MODE: "off"}),
            SkipReason.MODE_OFF,
        ),
        (workload("Deployment", pod_spec()), SkipReason.NO_SOURCES),
        ({**workload("Deployment", pod_spec()), "kind": "Widget"}, SkipReason.NOT_HANDLED),
    ],
)
def test_workloads_the_controller_leaves_alone(obj: JSONObject, reason: SkipReason) -> None:
    assert entry_from_object(obj, "checksum") is reason


def test_server_default_mode_off_indexes_nothing() -> None:
    obj = workload("Deployment", pod_spec(volumes=[vol_cm("c")]))
    assert entry_from_object(obj, "off") is SkipReason.MODE_OFF
    obj["metadata"]["annotations"] = {ANN_MODE: "checksum"}
    assert entry_from_object(obj, "off").ref.name == "app"


def test_snapshot_objects_are_not_indexed() -> None:
    obj = workload("Deployment", pod_spec(volumes=[vol_cm("c")]))
    obj["metadata"]["labels"][LABEL_SNAPSHOT] = "true"
    assert entry_from_object(obj, "checksum") is SkipReason.OWN_COPY


def test_reverse_index() -> None:
    store = _store()
    index = WorkloadIndex()
    a = _admitted("Deployment", store)
    b = workload("StatefulSet", pod_spec(volumes=[vol_cm("app-config")]), name="db")
    index.put(entry_from_object(a, "checksum"))
    index.put(entry_from_object(b, "checksum"))
    assert {e.ref.name for e in index.consumers("team-a", CM)} == {"app", "db"}
    assert {e.ref.name for e in index.consumers("team-a", SEC)} == {"app"}
    assert index.consumers("team-b", CM) == []

    # The template stops naming the Secret: the index follows.
    c = workload("Deployment", pod_spec(volumes=[vol_cm("app-config")]))
    index.put(entry_from_object(c, "checksum"))
    assert index.consumers("team-a", SEC) == []

    gone = index.replace_kind("StatefulSet", [])
    assert gone == {WorkloadRef("StatefulSet", "team-a", "db")}
    assert {e.ref.name for e in index.consumers("team-a", CM)} == {"app"}
    assert index.remove(WorkloadRef("Deployment", "team-a", "app")) is not None
    assert len(index) == 0
    assert index.consumers("team-a", CM) == []


def test_snapshot_template_is_indexed_under_its_source() -> None:
    store = _store()
    obj = _admitted("Deployment", store, mode="snapshot")
    names = {
        ref["name"]
        for c in spec_of(obj)["containers"]
        for e in c.get("env", ())
        for ref in [e["valueFrom"]["configMapKeyRef"]]
    }
    assert names != {"app-config"}  # the template points at a copy
    index = WorkloadIndex()
    index.put(entry_from_object(obj, "snapshot"))
    assert [e.ref.name for e in index.consumers("team-a", CM)] == ["app"]


def test_the_index_keeps_the_newest_version_of_an_unchanged_entry() -> None:
    # A status update changes nothing the controller decides with (no re-check), but the
    # resourceVersion a re-stamp from the index is guarded by must be the newest one.
    store = _store()
    obj = _admitted("Deployment", store)
    obj["metadata"]["resourceVersion"] = "100"
    index = WorkloadIndex()
    first = entry_from_object(obj, "checksum")
    assert index.put(first) is None
    obj["metadata"]["resourceVersion"] = "105"
    obj["status"] = {"replicas": 3}
    later = entry_from_object(obj, "checksum")
    assert later == first  # the same for the controller: the watch does not re-check it
    assert index.put(later) == first
    found = index.get(later.ref)
    assert found is not None and found.restamp_rv == 105
    obj["metadata"]["resourceVersion"] = "0007"  # opaque text kept as it is
    assert entry_from_object(obj, "checksum").restamp_rv == "0007"


@pytest.mark.parametrize(
    ("mode", "annotations", "plain"),
    [
        ("checksum", {}, True),
        ("snapshot", {}, False),  # its references point at copies: the object is needed
        ("checksum", {"configpin.io/on-change": "refresh"}, False),
        ("checksum", {ANN_OBSERVED: '{"configmap/app-config":"x"}'}, False),
        ("checksum", {ANN_MODE: "snapshot"}, False),
    ],
)
def test_which_workloads_can_be_restamped_from_the_index(
    mode: str, annotations: dict[str, str], plain: bool
) -> None:
    obj = _admitted("Deployment", _store(), mode=mode)
    obj["metadata"].setdefault("annotations", {}).update(annotations)
    obj["metadata"]["resourceVersion"] = "42"
    assert (entry_from_object(obj, mode).restamp_rv is not None) is plain


def test_a_record_that_is_not_a_digest_is_kept_as_written() -> None:
    """The compact entry packs 64-hex digests and keeps anything else (a tenant's edit, a
    source no longer consumed, "absent", upper case, all zeros) exactly as written."""
    store = _store()
    obj = _admitted("Deployment", store)
    observed = {
        "configmap/app-config": "0" * 64,  # all zeros: not told apart from "none" if packed
        "secret/app-secret": "AB" * 32,  # upper case is not what configpin writes
        "configmap/gone": "ab" * 32,  # no longer consumed
        "not a source": "x",
    }
    obj["metadata"].setdefault("annotations", {})[ANN_OBSERVED] = json.dumps(observed)
    entry = entry_from_object(obj, "checksum")
    assert entry.recorded == observed
    assert entry.recorded_for("configmap/app-config") == "0" * 64
    assert entry.recorded_for("configmap/other") is None
    assert entry.index_texts() == {
        "configmap/app-config",
        "secret/app-secret",
        "configmap/gone",
    }
    assert _stale(obj, store) == {CM, SEC}  # neither recorded value is the current digest
    observed["configmap/app-config"] = recorded_sources(_admitted("Deployment", store))[str(CM)]
    obj["metadata"]["annotations"][ANN_OBSERVED] = json.dumps(observed)
    assert _stale(obj, store) == {SEC}
    assert entry_from_object(obj, "checksum").recorded == observed


def test_compact_entries_compare_and_give_back_what_they_were_built_from() -> None:
    store = _store()
    obj = _admitted("Deployment", store)
    a, b = entry_from_object(obj, "checksum"), entry_from_object(obj, "checksum")
    assert a == b and a is not b
    assert a.uses[1] is b.uses[1]  # (keys, required) shared between entries
    assert [(c.source, c.keys, c.required) for c in a.consumes] == [
        (CM, frozenset({"a"}), True),
        (SEC, None, True),
    ]
    assert a.recorded == recorded_sources(obj)
    assert len(a.digests) == 2 * 32 and a.extra is None  # both digests packed
    store.put(configmap("app-config", {"a": "2", "b": "1"}))
    changed = _controller_update(obj, store)
    assert entry_from_object(changed, "checksum") != a


def test_reverse_index_with_one_and_many_consumers_of_a_source() -> None:
    index = WorkloadIndex()
    objs = [
        workload("Deployment", pod_spec(volumes=[vol_cm("app-config")]), name=f"w{i}")
        for i in range(3)
    ]
    entries = [entry_from_object(o, "checksum") for o in objs]
    index.put(entries[0])
    assert [e.ref.name for e in index.consumers("team-a", CM)] == ["w0"]
    index.put(entries[1])
    index.put(entries[2])
    assert {e.ref.name for e in index.consumers("team-a", CM)} == {"w0", "w1", "w2"}
    index.remove(entries[0].ref)
    index.remove(entries[2].ref)
    assert [e.ref.name for e in index.consumers("team-a", CM)] == ["w1"]
    index.put(entries[1])  # the same again: nothing changes
    assert [e.ref.name for e in index.consumers("team-a", CM)] == ["w1"]
    index.remove(entries[1].ref)
    assert index.consumers("team-a", CM) == []
    assert index._by_source == {}  # nothing left behind


def test_the_namespaces_where_a_source_name_is_consumed() -> None:
    """What the waves of a change span: one namespace held as itself, several as a set, and
    a namespace let go only when nothing there consumes the source any more."""
    index = WorkloadIndex()

    def web(name: str, namespace: str) -> WorkloadEntry:
        obj = workload(
            "Deployment", pod_spec(volumes=[vol_cm("app-config")]), name=name, namespace=namespace
        )
        entry = entry_from_object(obj, "checksum")
        assert isinstance(entry, WorkloadEntry)
        return entry

    a1, a2, b1 = web("w1", "team-a"), web("w2", "team-a"), web("w1", "team-b")
    index.put(a1)
    assert index.namespaces_of(CM) == ["team-a"]
    assert index._namespaces == {str(CM): "team-a"}  # no set for the common case
    index.put(a2)
    index.put(b1)
    assert index.namespaces_of(CM) == ["team-a", "team-b"]
    index.remove(a1.ref)
    assert index.namespaces_of(CM) == ["team-a", "team-b"]  # w2 still consumes it there
    index.remove(a2.ref)
    assert index.namespaces_of(CM) == ["team-b"]
    assert index._namespaces == {str(CM): "team-b"}
    index.remove(b1.ref)
    assert index.namespaces_of(CM) == []
    assert index._namespaces == {}  # nothing left behind


def test_an_entry_at_another_version_compares_equal() -> None:
    """A status update moves only the resourceVersion: the index keeps the entry's links."""
    obj = _admitted("Deployment", _store())
    obj["metadata"]["resourceVersion"] = "7"
    entry = entry_from_object(obj, "checksum")
    obj["metadata"]["resourceVersion"] = "3"
    older = entry_from_object(obj, "checksum")
    assert older == entry and older is not entry
    assert (entry.restamp_rv, older.restamp_rv) == (7, 3)
