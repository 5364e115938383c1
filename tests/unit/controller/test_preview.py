"""Change preview and audit (webhook/core/preview.py, webhook/controller/preview.py,
webhook/server/writes.py): what admission says about a write of a ConfigMap or Secret, from
what the controller's index holds, and the signed record of who made it."""

from __future__ import annotations

import base64
import copy
import json
from functools import partial
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.controller import StoreCache
from tests.unit.conftest import (
    HKEY,
    Store,
    admitted,
    configmap,
    container,
    pod_spec,
    reading,
    vol_cm,
    workload,
)
from webhook.controller.index import WorkloadIndex
from webhook.controller.limits import RolloutLimits
from webhook.controller.preview import Previewer
from webhook.controller.wavecut import WaveCut
from webhook.controller.waves import Gate
from webhook.core import digest
from webhook.core.constants import (
    ANN_APPROVE,
    ANN_APPROVED,
    ANN_CHANGED_BY,
    ANN_IGNORE,
    ANN_ON_CHANGE,
    ANN_PLAN,
    ANN_REJECTED,
    ANN_ROLLOUT,
    ANN_ROLLOUT_WAVES,
    ANN_ROLLOUT_WINDOWS,
    ANN_SHARED,
    ANN_WAVE,
)
from webhook.core.current import entry_from_object, stale_sources
from webhook.core.kept import dumps_mapping
from webhook.core.model import JSONObject, SourceId, SourceKind
from webhook.core.preview import (
    ChangedBy,
    Effect,
    Row,
    changed_by_of,
    excluded,
    shown,
    source_write,
    summary,
)
from webhook.core.record import Change, RolloutRecord, State, identity
from webhook.process.config import Settings
from webhook.server.admission import Review
from webhook.server.writes import SourceWrites

NS = "shop"
CFG = SourceId(SourceKind.CONFIGMAP, "web-config")
NOW = 1_800_000_000.0


FAST = settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def _cm(data: dict[str, str], **kw: Any) -> JSONObject:
    return configmap("web-config", data, namespace=NS, **kw)


# --- the pure part ----------------------------------------------------------------------------


def test_only_keys_whose_value_changed_are_named() -> None:
    old = _cm({"log-level": "info", "port": "80", "gone": "x"})
    new = _cm({"log-level": "debug", "port": "80", "added": "y"})
    write = source_write(HKEY, SourceKind.CONFIGMAP, "UPDATE", old, new)
    assert write.changed == {"log-level", "gone", "added"}
    delete = source_write(HKEY, SourceKind.CONFIGMAP, "DELETE", old, None)
    assert delete.deleting and delete.changed == {"log-level", "port", "gone"}


@pytest.mark.parametrize(
    ("obj", "kind"),
    [
        (configmap("x", {}, labels={"configpin.io/snapshot": "true"}), SourceKind.CONFIGMAP),
        (configmap("x", {}, annotations={ANN_IGNORE: "true"}), SourceKind.CONFIGMAP),
        (
            configmap("x", {}, annotations={"control-plane.alpha.kubernetes.io/leader": "{}"}),
            SourceKind.CONFIGMAP,
        ),
        ({"metadata": {"name": "sh.helm.release.v1.app.v3"}, "type": "helm.sh/release.v1"},
         SourceKind.SECRET),
        ({"metadata": {"name": "t"}, "type": "kubernetes.io/service-account-token"},
         SourceKind.SECRET),
    ],
)  # fmt: skip
def test_writes_configpin_has_nothing_to_say_about_are_excluded(
    obj: JSONObject, kind: SourceKind
) -> None:
    assert excluded(kind, obj) is not None
    assert source_write(HKEY, kind, "UPDATE", obj, obj).excluded is not None


def test_the_summary_is_a_few_short_lines_of_names_never_values() -> None:
    rows = [Row(NS, "Deployment", f"app-{i}", Effect.ROLL, ("log-level",), wave=w)
            for i, w in enumerate([1, 2, 2, 2, 3, 3, 3, 3, 3, 3])]  # fmt: skip
    rows += [
        Row(NS, "Deployment", "cache", Effect.REFRESH, ("log-level",)),
        Row(NS, "Deployment", "batch", Effect.NOTHING),
        Row(NS, "Deployment", "old", Effect.HOLD, ("log-level",), note="rejected"),
    ]
    lines = summary(SourceKind.CONFIGMAP, NS, "web-config", {"log-level"}, rows)
    assert lines[0] == (
        "configpin: ConfigMap shop/web-config keys [log-level] -> 13 workloads: 10 roll in 3 "
        "waves (1, 3, 6), 1 refresh in place, 1 hold (content rejected before), 1 consume other "
        "keys"
    )
    assert lines[1] == "configpin: wave 1: Deployment app-0"
    assert "kubectl configpin plan" in lines[-1]
    assert len(lines) <= 3 and all(len(line) <= 256 for line in lines)


def test_a_change_no_consumer_reads_is_one_line() -> None:
    rows = [Row(NS, "Deployment", n, Effect.NOTHING) for n in ("a", "b")]
    assert summary(SourceKind.CONFIGMAP, NS, "web-config", ["color"], rows) == [
        f"configpin: ConfigMap {NS}/web-config keys [color] -> 2 workloads: 2 consume other keys"
    ]


def test_tenant_chosen_names_are_shown_printable_and_bounded() -> None:
    assert shown("a\x1b[31mred") == "a?[31mred"
    assert shown("k" * 500) == "k" * 60 + "..." and shown("n" * 63) == "n" * 63  # a namespace
    many = [f"key-{i}" for i in range(30)]
    [line, *_] = summary(SourceKind.CONFIGMAP, NS, "x" * 300, many, [])
    assert len(line) < 256 and "+26" in line


def test_a_deletion_says_who_consumes_it_and_what_breaks() -> None:
    rows = [
        Row(NS, "Deployment", "web", Effect.BREAKS),
        Row(NS, "Deployment", "api", Effect.BREAKS),
        Row(NS, "Deployment", "tools", Effect.ABSENT),
    ]
    lines = summary(SourceKind.CONFIGMAP, NS, "web-config", set(), rows, deleted=True)
    assert lines[0] == "configpin: deleting ConfigMap shop/web-config: 3 workloads consume it"
    assert "2 require it, their next pod start fails: Deployment api, Deployment web" in lines[1]
    assert "1 read it as optional" in lines[2]


def test_the_record_of_who_changed_it_is_believed_only_for_that_source_and_content() -> None:
    record = ChangedBy("alice", NOW, "c" * 20)
    text = record.encode(HKEY, NS, CFG)
    obj = _cm({}, annotations={ANN_CHANGED_BY: text})
    assert changed_by_of(HKEY, NS, CFG, obj, "c" * 64) == record
    assert changed_by_of(HKEY, NS, CFG, obj, "d" * 64) is None  # changed since, not by her
    assert changed_by_of(HKEY, "other", CFG, obj, "c" * 64) is None  # copied elsewhere
    forged = json.loads(text) | {"user": "mallory"}
    obj["metadata"]["annotations"][ANN_CHANGED_BY] = json.dumps(forged)
    assert changed_by_of(HKEY, NS, CFG, obj, "c" * 64) is None
    assert record.said() == "alice at 2027-01-15T08:00:00Z"


# --- admission's answer -------------------------------------------------------------------


def _review(
    old: JSONObject, new: JSONObject | None, *, user: str = "alice", dry_run: bool = False
) -> Review:
    request = {
        "dryRun": dry_run,
        "uid": "u-1",
        "kind": {"group": "", "version": "v1", "kind": "ConfigMap"},
        "operation": "UPDATE" if new is not None else "DELETE",
        "namespace": NS,
        "userInfo": {"username": user, "groups": ["team"]},
        "object": new,
        "oldObject": old,
    }
    return Review(api_version="admission.k8s.io/v1", uid="u-1", request=request)


def _patch(out: Any) -> list[dict[str, Any]]:
    text = out["response"].get("patch")
    return json.loads(base64.b64decode(text)) if text else []


def _written(obj: JSONObject, out: Any) -> JSONObject:
    import jsonpatch

    result: JSONObject = jsonpatch.apply_patch(copy.deepcopy(obj), _patch(out))
    return result


def test_a_content_change_is_recorded_with_its_user_and_never_touches_data() -> None:
    writes = SourceWrites(HKEY, None, clock=lambda: NOW)
    old, new = _cm({"log-level": "info"}), _cm({"log-level": "debug"})
    review = _review(old, new)
    out, result = writes.review(
        review, source_write(HKEY, SourceKind.CONFIGMAP, "UPDATE", old, new)
    )
    assert result == "patched" and out["response"]["allowed"]
    stored = _written(new, out)
    assert stored["data"] == new["data"]
    content = digest.source_digest(HKEY, digest.record_from_object(HKEY, CFG.kind, stored))
    said = ChangedBy("alice", NOW, digest.content_id(content), ("log-level",))  # (keys changed)
    assert changed_by_of(HKEY, NS, CFG, stored, content) == said


def test_a_metadata_edit_keeps_the_record_and_a_client_cannot_set_its_own() -> None:
    writes = SourceWrites(HKEY, None, clock=lambda: NOW)
    text = ChangedBy("alice", NOW, "c" * 20).encode(HKEY, NS, CFG)
    old = _cm({"a": "1"}, annotations={ANN_CHANGED_BY: text})
    forged = copy.deepcopy(old)
    forged["metadata"]["annotations"][ANN_CHANGED_BY] = text.replace("alice", "bob")
    forged["metadata"]["labels"] = {"team": "x"}
    write = source_write(HKEY, SourceKind.CONFIGMAP, "UPDATE", old, forged)
    out, _ = writes.review(_review(old, forged, user="bob"), write)
    assert _written(forged, out)["metadata"]["annotations"][ANN_CHANGED_BY] == text
    same = copy.deepcopy(old)
    same["metadata"]["labels"] = {"team": "x"}
    out, result = writes.review(
        _review(old, same), source_write(HKEY, CFG.kind, "UPDATE", old, same)
    )
    assert result == "unchanged" and not _patch(out)


def test_a_reapply_that_drops_the_record_keeps_it() -> None:
    """A GitOps tool re-applies the manifest, which never held configpin's record (and
    server-side apply drops a field its manager no longer sends): the record stays."""
    writes = SourceWrites(HKEY, None, clock=lambda: NOW)
    text = ChangedBy("alice", NOW, "c" * 20).encode(HKEY, NS, CFG)
    old = _cm({"a": "1"}, annotations={ANN_CHANGED_BY: text, "team": "web"})
    applied = _cm({"a": "1"}, annotations={"team": "web"})
    out, result = writes.review(
        _review(old, applied, user="argocd"), source_write(HKEY, CFG.kind, "UPDATE", old, applied)
    )
    assert result == "patched"
    assert _written(applied, out)["metadata"]["annotations"][ANN_CHANGED_BY] == text


# --- the preview, from the index ------------------------------------------------------------


def _world(
    store: Store, apps: dict[str, JSONObject], limits: RolloutLimits | None = None
) -> tuple[Previewer, WorkloadIndex]:
    index = WorkloadIndex()
    for name, spec_and_notes in apps.items():
        spec, notes = spec_and_notes["spec"], spec_and_notes.get("annotations")
        obj = workload("Deployment", spec, name=name, namespace=NS, annotations=notes)
        obj = admitted(obj, store)
        obj.update(spec_and_notes.get("extra", {}))
        index.put(entry_from_object(obj, "checksum", hkey=HKEY))
    cut = WaveCut(index, StoreCache({NS: store}), HKEY, Settings(), in_scope=lambda _ns: True)  # type: ignore[arg-type]
    previewer = Previewer(cut, ready=lambda: True, limits=limits)
    return previewer, index


def test_each_consumer_gets_what_the_change_does_to_it() -> None:
    old = configmap("web-config", {"log-level": "info", "port": "80"}, namespace=NS)
    store = Store([old])
    env = reading("web-config", "log-level")
    port = reading("web-config", "port")
    volume = pod_spec(container(), volumes=[vol_cm("web-config")])
    apps: dict[str, JSONObject] = {f"app-{i}": {"spec": env} for i in range(12)}
    apps["canary"] = {"spec": env, "annotations": {ANN_WAVE: "-1"}}
    apps["broken"] = {
        "spec": env,
        "annotations": {ANN_WAVE: "-1"},
        "extra": {"status": {"conditions": [{"type": "Available", "status": "False"}]}},
    }
    apps["ports"] = {"spec": port}
    apps["mounted"] = {"spec": volume, "annotations": {ANN_ON_CHANGE: "refresh"}}
    new = configmap("web-config", {"log-level": "debug", "port": "80"}, namespace=NS)
    record = digest.record_from_object(HKEY, CFG.kind, new)
    nskey = digest.namespace_key(HKEY, NS)
    apps["held"] = {
        "spec": env,
        "annotations": {
            ANN_REJECTED: dumps_mapping(
                {str(CFG): digest.source_digest(nskey, record, frozenset({"log-level"}))}
            )
        },
    }
    previewer, _ = _world(store, apps)
    rows = previewer.rows(NS, CFG, frozenset({"log-level"}), record)
    assert rows is not None
    by = {r.name: r for r in rows}
    assert by["ports"].action is Effect.NOTHING
    assert by["mounted"].action is Effect.REFRESH
    assert by["held"].action is Effect.HOLD
    rolling = sorted((r for r in rows if r.action is Effect.ROLL), key=lambda r: r.wave)
    assert rolling[0].name == "canary" and rolling[0].wave == 1  # configpin.io/wave first
    assert by["broken"].wave == max(r.wave for r in rolling)  # no canary: the last wave
    assert [sum(1 for r in rolling if r.wave == w) for w in (1, 2, 3)] == [1, 2, 11]
    assert all(r.keys == ("log-level",) for r in rolling)
    deleted = previewer.rows(NS, CFG, frozenset({"log-level", "port"}), None)
    assert deleted is not None and {r.action for r in deleted} == {Effect.BREAKS}


def test_what_a_workload_of_the_namespace_does_since_is_in_the_next_preview() -> None:
    """The consumers' order is kept between writes (a write costs a pass over them, not an
    ordering), until a workload of that namespace changes, comes or goes: then it is new."""
    store = Store([_cm({"a": "1"})])
    reads = reading("web-config", "a")
    previewer, index = _world(store, {"web": {"spec": reads}})
    new = digest.record_from_object(HKEY, CFG.kind, _cm({"a": "2"}))

    def names() -> list[tuple[str, Effect]]:
        rows = previewer.rows(NS, CFG, frozenset({"a"}), new)
        assert rows is not None
        return sorted((r.name, r.action) for r in rows)

    assert names() == [("web", Effect.ROLL)]
    other = workload("Deployment", reads, name="api", namespace=NS)
    index.put(entry_from_object(admitted(other, store), "checksum", hkey=HKEY))
    assert names() == [("api", Effect.ROLL), ("web", Effect.ROLL)]
    refreshed = workload(
        "Deployment",
        pod_spec(container(), volumes=[vol_cm("web-config")]),
        name="api",
        namespace=NS,
        annotations={ANN_ON_CHANGE: "refresh"},
    )
    index.put(entry_from_object(admitted(refreshed, store), "checksum", hkey=HKEY))
    assert names() == [("api", Effect.REFRESH), ("web", Effect.ROLL)]
    [api] = [e for e in index.entries(namespace=NS) if e.ref.name == "api"]
    index.remove(api.ref)
    assert names() == [("web", Effect.ROLL)]
    elsewhere = workload("Deployment", reads, name="x", namespace="other")
    index.put(entry_from_object(admitted(elsewhere, store), "checksum", hkey=HKEY))
    assert names() == [("web", Effect.ROLL)]


def test_no_preview_before_the_index_has_every_workload() -> None:
    store = Store([configmap("web-config", {"a": "1"}, namespace=NS)])
    cache = StoreCache({NS: store})
    cut = WaveCut(WorkloadIndex(), cache, HKEY, Settings(), in_scope=lambda _ns: True)  # type: ignore[arg-type]
    previewer = Previewer(cut, ready=lambda: False)
    assert previewer.rows(NS, CFG, frozenset({"a"}), None) is None


# --- the preview names the gate's waves -----------------------------------------------------

SHARED_NOTE = {ANN_SHARED: "true"}
UNAVAILABLE = {"status": {"conditions": [{"type": "Available", "status": "False"}]}}


def _shared_world(
    apps: dict[str, dict[str, JSONObject]], *, waves: str = "1,10%,100%"
) -> tuple[Previewer, WorkloadIndex, dict[str, Store]]:
    """Deployments reading key `a` of `web-config` in each namespace of `apps` (name -> its
    annotations and extra fields), stamped while the source held a=1 everywhere."""
    stores = {
        ns: Store([configmap("web-config", {"a": "1"}, namespace=ns, annotations=SHARED_NOTE)])
        for ns in apps
    }
    index = WorkloadIndex()
    reads = reading("web-config", "a")
    for ns, named in apps.items():
        for name, extra in named.items():
            notes = extra.get("annotations")
            obj = workload("Deployment", reads, name=name, namespace=ns, annotations=notes)
            obj = admitted(obj, stores[ns])
            obj.update(extra.get("extra", {}))
            index.put(entry_from_object(obj, "checksum", hkey=HKEY))
    settings = Settings(rollout_waves=waves)
    cut = WaveCut(index, StoreCache(stores), HKEY, settings, in_scope=lambda _ns: True)
    return Previewer(cut, ready=lambda: True), index, stores


def _gate_waves(
    index: WorkloadIndex, stores: dict[str, Store], namespace: str, waves: str
) -> dict[tuple[str, str], int]:
    """The wave (from 1) of each workload the gate rolls for the change its source in
    `namespace` is at now."""
    settings = Settings(rollout_waves=waves)
    gate = Gate(index, StoreCache(stores), HKEY, settings, in_scope=lambda _ns: True)
    [change] = gate.changes(namespace, [CFG])
    plan_ = gate.cut.plan(change)
    return {(r.namespace, r.name): i for i, wave in enumerate(plan_, 1) for r in wave}


def _previewed(
    previewer: Previewer, namespace: str, new: JSONObject
) -> tuple[dict[tuple[str, str], int], list[str]]:
    record = digest.record_from_object(HKEY, CFG.kind, new)
    rows = previewer.rows(namespace, CFG, frozenset({"a"}), record)
    assert rows is not None
    waves = {(r.namespace, r.name): r.wave for r in rows if r.wave}
    return waves, summary(CFG.kind, namespace, CFG.name, {"a"}, rows)


def test_a_shared_source_previews_the_first_wave_the_gate_rolls_in_another_namespace() -> None:
    """`web-config` is shared by two namespaces; `b` holds a=2 already (its workloads wait for
    their own approval), and `b`'s `first` goes first (configpin.io/wave -1). A write of a=2
    in `a` joins that change: the preview names b's `first` as wave 1, as the gate rolls it,
    and every workload in the wave the gate gives it."""
    first = {"annotations": {ANN_WAVE: "-1", ANN_ROLLOUT_WAVES: "approve"}}
    apps = {
        "a": {f"a-{i}": {} for i in range(4)},
        "b": {"first": first, "b-1": {}},
    }
    previewer, index, stores = _shared_world(apps)
    new = {"a": "2"}
    stores["b"].put(configmap("web-config", new, namespace="b", annotations=SHARED_NOTE))
    written = configmap("web-config", new, namespace="a", annotations=SHARED_NOTE)
    waves, said = _previewed(previewer, "a", written)
    assert said[1] == "configpin: wave 1: Deployment b/first", said

    stores["a"].put(written)  # as the gate sees it once the write is stored
    assert _gate_waves(index, stores, "a", "1,10%,100%") == waves
    assert waves[("b", "first")] == 1 and len(waves) == 6


_APP = st.fixed_dictionaries(
    {
        # reads `a` (what the write changes), `b` (not), `b` stamped for older content (stale
        # already), all of it mounted and refreshed in place, `a` with the new content
        # rejected before (and held on it: checksum mode's hold), `a` rolled to the new
        # content for an earlier change of the source (which held other content of `b`)
        "how": st.sampled_from(
            ["a", "a", "a", "b", "stale-b", "refresh", "held", "held-at", "earlier"]
        ),
        "wave": st.sampled_from([None, None, "-1", "1"]),
        "broken": st.sampled_from([False, False, False, True]),
        "approve": st.sampled_from([False, False, False, True]),
        # (readers of `a`) its rollout record names the change already (or the earlier one),
        # and how it stands
        "rolled": st.sampled_from(
            [None, None, None, State.COMPLETE, State.ROLLING, State.LEFT, State.FAILED]
        ),
    }
)


@FAST
@given(
    apps=st.lists(st.lists(_APP, max_size=5), min_size=1, max_size=3),
    shared=st.booleans(),
    at=st.lists(st.booleans(), min_size=3, max_size=3),
    scope=st.lists(st.booleans(), min_size=3, max_size=3),
    waves=st.sampled_from(["1,10%,100%", "1,approve,100%", "2,50%", "approve,1", "off"]),
)
def test_the_preview_names_every_member_in_the_wave_the_gate_rolls_it(
    apps: list[list[dict[str, Any]]],
    shared: bool,
    at: list[bool],
    scope: list[bool],
    waves: str,
) -> None:
    """Whatever the workloads (their waves, health, keys, refresh, rejected content, records of
    the change), the namespaces in scope and which of them hold the content already: the
    preview of a write in namespace `n0` gives every member of the change the wave the gate
    gives it once the write is stored, and says await exactly where the gate waits for an
    approval."""
    names = [f"n{i}" for i in range(len(apps))]
    notes = SHARED_NOTE if shared else None
    old, new = {"a": "1", "b": "1"}, {"a": "2", "b": "1"}
    stores = {
        ns: Store([configmap("web-config", old, namespace=ns, annotations=notes)]) for ns in names
    }
    written = configmap("web-config", new, namespace="n0", annotations=notes)
    content = digest.source_digest(HKEY, digest.record_from_object(HKEY, CFG.kind, written))
    change = Change.of("n0", CFG, content, shared=shared)
    earlier = {"a": "2", "b": "0"}
    earlier_content = digest.source_digest(
        HKEY, digest.record_from_object(HKEY, CFG.kind, configmap("web-config", earlier))
    )
    index = WorkloadIndex()
    for ns, named in zip(names, apps, strict=True):
        nskey = digest.namespace_key(HKEY, ns)
        held = digest.source_digest(
            nskey, digest.record_from_object(HKEY, CFG.kind, written), {"a"}
        )
        for i, app in enumerate(named):
            how = app["how"]
            notes_of: dict[str, str] = {}
            if app["wave"] is not None:
                notes_of[ANN_WAVE] = app["wave"]
            if app["approve"]:
                notes_of[ANN_ROLLOUT_WAVES] = "1,approve"
            if how == "refresh":
                spec = pod_spec(container(), volumes=[vol_cm("web-config")])
                notes_of[ANN_ON_CHANGE] = "refresh"
            else:
                spec = reading("web-config", "b" if "b" in how else "a")
            if how.startswith("held"):
                notes_of[ANN_REJECTED] = dumps_mapping({str(CFG): held})
            stamp = stores[ns]
            if how == "stale-b":
                stamp = Store([configmap("web-config", {"a": "1", "b": "0"}, namespace=ns)])
            if how == "held-at":
                stamp = Store([configmap("web-config", new, namespace=ns)])
            if how == "earlier":
                stamp = Store([configmap("web-config", earlier, namespace=ns)])
            obj = workload("Deployment", spec, name=f"w{i}", namespace=ns, annotations=notes_of)
            obj = admitted(obj, stamp)
            if app["broken"]:
                obj.update(UNAVAILABLE)
            rolled = None
            if app["rolled"] is not None and how == "a":
                rolled = RolloutRecord(app["rolled"], {}, {}, 0.0, (change,), healthy=True)
            if how == "earlier":  # it rolled `a` to the new content for that change
                made = Change.of(ns, CFG, earlier_content, shared=shared)
                state = app["rolled"] or State.COMPLETE
                to, before = {str(CFG): held}, {str(CFG): "0" * 64}
                rolled = RolloutRecord(state, to, before, 0.0, (made,), healthy=True)
            if rolled is not None:
                ident = identity("Deployment", ns, f"w{i}")
                obj["metadata"].setdefault("annotations", {})[ANN_ROLLOUT] = rolled.encode(
                    HKEY, ident
                )
            index.put(entry_from_object(obj, "checksum", hkey=HKEY))
    for ns, holds in zip(names[1:], at, strict=False):
        if holds:
            stores[ns].put(configmap("web-config", new, namespace=ns, annotations=notes))
    in_scope = {"n0"} | {ns for ns, yes in zip(names[1:], scope, strict=False) if yes}
    settings = Settings(rollout_waves=waves)
    cache = StoreCache(stores)
    cut = WaveCut(index, cache, HKEY, settings, in_scope=in_scope.__contains__)
    rows = Previewer(cut, ready=lambda: True).rows(
        "n0", CFG, frozenset({"a"}), digest.record_from_object(HKEY, CFG.kind, written)
    )
    assert rows is not None
    previewed = {(r.namespace, r.name): (r.wave, r.action) for r in rows if r.wave}
    held = {f"w{i}" for i, app in enumerate(apps[0]) if app["how"].startswith("held")}
    assert {r.name for r in rows if r.action is Effect.HOLD} == held

    stores["n0"].put(written)
    gate = Gate(index, StoreCache(stores), HKEY, settings, in_scope=in_scope.__contains__)
    assert gate.changes("n0", [CFG]) == (change,)
    gated = {}
    for i, wave in enumerate(gate.cut.plan(change)):
        for ref in wave:
            entry = index.get(ref)
            assert entry is not None
            here = ref.namespace == "n0"  # (a member elsewhere has a row however it stands)
            if here and CFG not in stale_sources(entry, partial(gate.cut.peek, "n0"), HKEY):
                continue  # it rolled for the change already: it holds its wave, rolling nothing
            own = entry.delivery is not None and entry.delivery.approve
            awaits = gate.cut.after_approve(i) or own
            gated[(ref.namespace, ref.name)] = (i + 1, Effect.AWAIT if awaits else Effect.ROLL)
    assert previewed == gated


# --- rollout windows ----------------------------------------------------------------------

SUNDAY_EVENING = 1_795_982_400.0  # Sun 2026-11-29 20:00 UTC
BERLIN_WEEKDAYS = (
    '[{"kind": "allow", "schedule": "0 9 * * 1-5", "duration": "8h", "timeZone": "Europe/Berlin"}]'
)


def _limits(when: float, namespaces: dict[str, str]) -> RolloutLimits:
    return RolloutLimits(Settings(), HKEY, namespace_windows=namespaces.get, wall=lambda: when)


def test_who_waits_for_their_window_is_said_in_its_wave_with_when_it_opens() -> None:
    """A write on Sunday evening in a namespace that rolls on weekdays from 09:00 in Berlin:
    each member that would roll is a row of its wave that awaits its window, the opening in
    its note; the summary says how many wait and when they open (the issue's line)."""
    store = Store([_cm({"a": "1"})])
    reads = reading("web-config", "a")
    apps: dict[str, JSONObject] = {f"app-{i}": {"spec": reads} for i in range(4)}
    apps["other"] = {"spec": reading("web-config", "b")}
    new = digest.record_from_object(HKEY, CFG.kind, _cm({"a": "2"}))
    closed = _limits(SUNDAY_EVENING, {NS: BERLIN_WEEKDAYS})
    previewer, _ = _world(store, apps, closed)
    rows = previewer.rows(NS, CFG, frozenset({"a"}), new)
    assert rows is not None
    waiting = sorted((r.wave, r.note) for r in rows if r.action is Effect.WINDOW)
    note = "they open Mon 2026-11-30 09:00 Europe/Berlin"
    assert waiting == [(1, note), (2, note), (3, note), (3, note)]  # (in their waves)
    assert [r.action for r in rows if r.name == "other"] == [Effect.NOTHING]
    [line, *_] = summary(CFG.kind, NS, CFG.name, {"a"}, rows)
    assert line == (
        "configpin: ConfigMap shop/web-config keys [a] -> 5 workloads: 4 roll in 3 waves "
        "(1, 1, 2), 4 wait for their window, opens Mon 2026-11-30 09:00 Europe/Berlin, "
        "1 consume other keys"
    )
    # the same write on Monday at 10:00 Berlin time: they roll
    open_ = _limits(SUNDAY_EVENING + 14 * 3600, {NS: BERLIN_WEEKDAYS})
    rows = _world(store, apps, open_)[0].rows(NS, CFG, frozenset({"a"}), new)
    assert rows is not None and Effect.WINDOW not in {r.action for r in rows}


def test_a_workloads_own_window_holds_it_alone_and_the_first_opening_is_said() -> None:
    store = Store([_cm({"a": "1"})])
    reads = reading("web-config", "a")
    late = '[{"kind": "deny", "schedule": "0 18 * * *", "duration": "3h"}]'  # 18:00-21:00
    later = '[{"kind": "deny", "schedule": "0 18 * * *", "duration": "4h"}]'
    apps: dict[str, JSONObject] = {
        "web": {"spec": reads},
        "batch": {"spec": reads, "annotations": {ANN_ROLLOUT_WINDOWS: late}},
        "report": {"spec": reads, "annotations": {ANN_ROLLOUT_WINDOWS: later}},
    }
    previewer, _ = _world(store, apps, _limits(SUNDAY_EVENING, {}))
    new = digest.record_from_object(HKEY, CFG.kind, _cm({"a": "2"}))
    rows = previewer.rows(NS, CFG, frozenset({"a"}), new)
    assert rows is not None
    said = {r.name: (r.action, r.note) for r in rows}
    assert said == {
        "web": (Effect.ROLL, ""),
        "batch": (Effect.WINDOW, "they open Sun 2026-11-29 21:00 UTC"),
        "report": (Effect.WINDOW, "they open Sun 2026-11-29 22:00 UTC"),
    }
    [line, *_] = summary(CFG.kind, NS, CFG.name, {"a"}, rows)
    assert line.endswith("2 wait for their window, the first opens Sun 2026-11-29 21:00 UTC")


# --- approval -----------------------------------------------------------------------------


def test_an_approval_is_recorded_signed_for_the_content_and_never_stored_as_asked() -> None:
    """`configpin approve` sets configpin.io/approve: request; admission answers with the
    signed record of who approved the content the source holds, and drops the request. A
    client's own `approved` record is not configpin's: the source's record then says nothing
    (verified by `record_from_object`)."""
    writes = SourceWrites(HKEY, None, clock=lambda: NOW)
    old = _cm({"a": "1"})
    asked = _cm({"a": "1"}, annotations={ANN_APPROVE: "request"})
    out, result = writes.review(
        _review(old, asked, user="rm"), source_write(HKEY, CFG.kind, "UPDATE", old, asked)
    )
    assert result == "patched"
    stored = _written(asked, out)
    notes = stored["metadata"]["annotations"]
    assert ANN_APPROVE not in notes and ANN_APPROVED in notes
    record = digest.record_from_object(HKEY, CFG.kind, stored)
    content = digest.content_id(digest.source_digest(HKEY, record))
    assert record.approved == content
    assert json.loads(notes[ANN_APPROVED])["user"] == "rm"
    # the approval of other content, or one a client wrote, approves nothing
    moved = _cm({"a": "2"}, annotations={ANN_APPROVED: notes[ANN_APPROVED]})
    assert digest.record_from_object(HKEY, CFG.kind, moved).approved is None
    forged = _cm({"a": "1"}, annotations={ANN_APPROVED: notes[ANN_APPROVED].replace("rm", "x")})
    assert digest.record_from_object(HKEY, CFG.kind, forged).approved is None


def test_a_plan_is_answered_in_a_dry_run_only() -> None:
    """configpin.io/plan: request is answered, in the dry run's result, with the whole plan;
    on a real write the request is removed (never stored)."""
    store = Store([_cm({"a": "1"})])
    previewer, _ = _world(store, {"web": {"spec": reading("web-config", "a")}})
    writes = SourceWrites(HKEY, previewer, clock=lambda: NOW)
    old = _cm({"a": "1"})
    new = _cm({"a": "2"}, annotations={ANN_PLAN: "request"})
    write = source_write(HKEY, CFG.kind, "UPDATE", old, new)
    out, _ = writes.review(_review(old, new, dry_run=True), write)
    plan_ = json.loads(_written(new, out)["metadata"]["annotations"][ANN_PLAN])
    assert plan_["keys"] == ["a"]
    assert [(r["name"], r["action"], r["wave"]) for r in plan_["rows"]] == [("web", "roll", 1)]
    out, _ = writes.review(_review(old, new), write)
    assert ANN_PLAN not in _written(new, out)["metadata"]["annotations"]
