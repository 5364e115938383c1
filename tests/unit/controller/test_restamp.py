"""The re-stamp decision (webhook/controller/restamp.py), case by case: a workload as just read,
the sources as the controller holds them, and what the decision writes and why. No thread, no
client: its dependencies are fakes given explicitly."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import jsonpatch
import pytest

from harness.builders import RecordingWriter
from tests.unit.conftest import (
    HKEY,
    Store,
    apply,
    configmap,
    container,
    env_cm,
    merge_patch,
    plan,
    pod_spec,
    reading,
    recorded_sources,
    vol_cm,
    workload,
)
from webhook.controller.decision import Decision
from webhook.controller.editors import Rolled
from webhook.controller.follow import Follower
from webhook.controller.limits import RolloutLimits
from webhook.controller.needs import Inputs, Need
from webhook.controller.reconcile import Prelude
from webhook.controller.restamp import IndexRestamp, Restamper, touches_template
from webhook.core.budget import decode_starts, encode_starts
from webhook.core.constants import (
    ANN_EXTRA_SOURCES,
    ANN_HELD,
    ANN_MODE,
    ANN_OBSERVED,
    ANN_ON_CHANGE,
    ANN_REFRESHED,
    ANN_REJECTED,
    ANN_ROLLED_AT,
    ANN_ROLLOUT,
    ANN_ROLLOUT_STARTS,
    ANN_SOURCES,
)
from webhook.core.current import Lookup, WorkloadEntry, WorkloadRef, entry_from_object
from webhook.core.kept import dumps_mapping, observed_ops
from webhook.core.kinds import WorkloadKind, builtin
from webhook.core.model import JSONObject, SourceId, SourceKind, SourceUnavailable
from webhook.core.reasons import Fallback, SkipReason
from webhook.core.record import Change, identity, rollout_record
from webhook.core.times import format_time
from webhook.core.waves import Wait, WaitReason
from webhook.inputs.sources import MISS
from webhook.kube.errors import Forbidden
from webhook.process.config import Settings

NOW = 1_800_000_000.0  # the decision's wall clock
DEPLOYMENT = builtin("Deployment")
assert DEPLOYMENT is not None


@dataclass
class FakePods:
    """The workload's running pods: those listed (`live`, each listing noted), how many a
    refresh reaches, or a refusal."""

    reached: int = 2
    forbidden: bool = False
    live: list[JSONObject] = field(default_factory=list)
    listed: list[WorkloadRef] = field(default_factory=list)
    refreshed: list[tuple[WorkloadRef, dict[str, str]]] = field(default_factory=list)
    caught_up: list[WorkloadRef] = field(default_factory=list)

    def running(self, ref: WorkloadRef, obj: JSONObject) -> list[JSONObject]:
        self.listed.append(ref)
        return self.live

    def refresh(self, ref: WorkloadRef, obj: JSONObject, target: Mapping[str, str]) -> int:
        if self.forbidden:
            raise Forbidden("PATCH pods", 403, "pods is forbidden")
        self.refreshed.append((ref, dict(target)))
        return self.reached

    def catch_up(self, ref: WorkloadRef, obj: JSONObject, read: Lookup) -> None:
        self.caught_up.append(ref)


@dataclass
class Case:
    store: Store
    settings: Settings = field(default_factory=Settings)
    pods: FakePods = field(default_factory=FakePods)
    leading: bool = True
    copies: RecordingWriter | None = None
    follower: Follower | None = None
    gate: Any = None
    now: float = NOW
    asked_who: list[tuple[Rolled, ...]] = field(default_factory=list)  # who made these?

    def restamper(self) -> Restamper:
        return Restamper(
            HKEY,
            self.settings,
            copies=self.copies is not None,
            is_leader=lambda: self.leading,
            follower=self.follower,
            gate=self.gate,
            wall=lambda: self.now,
        )

    def prelude(self, ref: WorkloadRef, kind: WorkloadKind | None = None) -> Prelude:
        """What one reconcile of `ref` decides with; the sources all in memory (the store)."""
        found = kind or builtin(ref.kind)
        assert found is not None
        lookup = self.store.lookup
        return Prelude(
            self.restamper(), self.pods, self.copies, ref, found, lookup, lookup, editors=self.by
        )

    def by(self, _namespace: str, rolled: tuple[Rolled, ...]) -> str:
        self.asked_who.append(rolled)
        return "alice at 2027-01-15T08:00:00Z"

    def decide(
        self, obj: JSONObject, *, kind: WorkloadKind | None = None, prepared: bool = True
    ) -> Decision:
        """The decision on `obj`, and (`prepared`) what the reconciler does before writing
        it done: the copies made, the pods refreshed."""
        work = self.prelude(_ref(obj), kind)
        decision = work.decide(obj)
        return work.prepare(obj, decision) if prepared else decision

    def from_index(self, obj: JSONObject) -> IndexRestamp | None:
        """A plain re-stamp of `obj` planned from its index entry alone."""
        return self.prelude(_ref(obj)).from_index(entry(obj))


def _ref(obj: JSONObject) -> WorkloadRef:
    meta = obj["metadata"]
    return WorkloadRef(obj["kind"], meta["namespace"], meta["name"])


def _store(a: str = "1") -> Store:
    return Store([configmap("cfg", {"a": a, "b": "x"})])


def _admitted(spec: JSONObject, store: Store, **kw: Any) -> JSONObject:
    """A Deployment as admission stored it (stamped for the store's content)."""
    obj = workload("Deployment", spec, **kw)
    mode = (kw.get("annotations") or {}).get(ANN_MODE, "checksum")
    p = plan(obj, store, mode=mode)
    if mode == "snapshot":
        store.create_snapshots(p)
    stored = apply(obj, p)
    stored["metadata"]["creationTimestamp"] = format_time(NOW - 60)
    return stored


ENV = reading("cfg", "a")
VOLUME = pod_spec(container(), volumes=[vol_cm("cfg")])


# --- left alone ---------------------------------------------------------------------------


def test_a_current_workload_is_left_alone() -> None:
    case = Case(_store())
    decision = case.decide(_admitted(ENV, case.store))
    assert decision == Decision.leave(SkipReason.CURRENT)
    assert case.pods.refreshed == [] and case.pods.caught_up == []


def test_a_change_to_a_key_it_does_not_consume_is_current() -> None:
    case = Case(_store())
    obj = _admitted(ENV, case.store)
    case.store.put(configmap("cfg", {"a": "1", "b": "changed"}))
    assert case.decide(obj).skip is SkipReason.CURRENT


def test_a_current_refreshed_workload_brings_new_pods_to_its_refresh() -> None:
    case = Case(_store())
    obj = _admitted(VOLUME, case.store, annotations={ANN_ON_CHANGE: "refresh"})
    obj["metadata"]["annotations"][ANN_REFRESHED] = dumps_mapping(
        {"configmap/cfg": "0" * 64}
    )  # an earlier refresh (whatever it handed)
    decision = case.decide(obj)
    assert decision.skip is SkipReason.CURRENT
    assert [r.name for r in case.pods.caught_up] == ["app"]


@pytest.mark.parametrize(
    ("obj", "reason"),
    [
        (workload("Deployment", ENV, annotations={ANN_MODE: "off"}), SkipReason.MODE_OFF),
        (workload("ReplicaSet", ENV, owner="Deployment"), SkipReason.OWNED),
        (workload("Deployment", pod_spec(container())), SkipReason.NO_SOURCES),
    ],
    ids=["mode-off", "owned", "no-sources"],
)
def test_what_the_controller_does_not_manage_is_left_with_its_reason(
    obj: JSONObject, reason: SkipReason
) -> None:
    case = Case(_store())
    assert case.decide(obj) == Decision.leave(reason)
    assert reason.label == "not-managed" or reason is SkipReason.MODE_OFF


# --- rolled -------------------------------------------------------------------------------


def test_a_consumed_change_re_stamps_the_template_and_records_when() -> None:
    case = Case(_store())
    obj = _admitted(ENV, case.store)
    case.store.put(configmap("cfg", {"a": "2", "b": "x"}))
    decision = case.decide(obj)
    assert decision.skip is None and decision.refreshed is None and decision.instead is None
    assert touches_template("Deployment", decision.ops)
    written = jsonpatch.apply_patch(copy.deepcopy(obj), decision.ops)
    assert written["metadata"]["annotations"][ANN_ROLLED_AT] == format_time(NOW)
    recorded = written["spec"]["template"]["metadata"]["annotations"][ANN_SOURCES]
    assert dumps_mapping(decision.intended) == recorded  # what it plans is what it writes
    assert decision.intended != entry(obj).recorded


def test_not_leading_any_more_writes_nothing() -> None:
    case = Case(_store(), leading=False)
    obj = _admitted(ENV, case.store)
    case.store.put(configmap("cfg", {"a": "2", "b": "x"}))
    assert case.decide(obj) == Decision.leave(SkipReason.NOT_LEADER)


def test_snapshot_mode_makes_the_copies_before_re_pointing() -> None:
    case = Case(_store())
    case.copies = RecordingWriter()
    obj = _admitted(ENV, case.store, annotations={ANN_MODE: "snapshot"})
    case.store.put(configmap("cfg", {"a": "2", "b": "x"}))
    decision = case.decide(obj)
    assert decision.skip is None and touches_template("Deployment", decision.ops)
    assert len(case.copies.made) == 1 and case.copies.made[0].startswith("cfg-")
    assert any(op["value"] == case.copies.made[0] for op in decision.ops if "value" in op)


def test_snapshot_mode_without_a_writer_is_not_rolled() -> None:
    store = _store()
    obj = _admitted(ENV, store, annotations={ANN_MODE: "snapshot"})
    store.put(configmap("cfg", {"a": "2", "b": "x"}))
    assert Case(store).decide(obj) == Decision.leave(SkipReason.NO_SNAPSHOTS)


def test_the_decision_writes_nothing_itself() -> None:
    """It says which copies must exist and which pods to refresh; the reconciler does it."""
    case = Case(_store())
    case.copies = RecordingWriter()
    obj = _admitted(ENV, case.store, annotations={ANN_MODE: "snapshot"})
    case.store.put(configmap("cfg", {"a": "2", "b": "x"}))
    decision = case.decide(obj, prepared=False)
    assert [c.snapshot_name for c in decision.copies] and not case.copies.made
    refreshing = _admitted(VOLUME, case.store, annotations={ANN_ON_CHANGE: "refresh"})
    case.store.put(configmap("cfg", {"a": "3", "b": "x"}))
    decision = case.decide(refreshing, prepared=False)
    assert decision.refresh == decision.intended and not case.pods.refreshed


def test_no_copy_is_made_when_leadership_is_lost_before_the_write() -> None:
    case = Case(_store(), leading=False)
    case.copies = RecordingWriter()
    obj = _admitted(ENV, case.store, annotations={ANN_MODE: "snapshot"})
    case.store.put(configmap("cfg", {"a": "2", "b": "x"}))
    assert case.decide(obj) == Decision.leave(SkipReason.NOT_LEADER)
    assert not case.copies.made


# --- the record alone ---------------------------------------------------------------------


def test_an_old_unstamped_workload_gets_a_baseline_not_a_rollout() -> None:
    store = _store()
    obj = workload("Deployment", ENV)  # admitted while configpin was down, long ago
    obj["metadata"]["creationTimestamp"] = format_time(NOW - 3600)
    decision = Case(store).decide(obj)
    assert decision.note and "baseline" in decision.note
    assert not touches_template("Deployment", decision.ops)
    assert decision.ops == observed_ops(obj, dumps_mapping(decision.intended))


def test_a_young_unstamped_workload_is_stamped() -> None:
    store = _store()
    obj = workload("Deployment", ENV)
    obj["metadata"]["creationTimestamp"] = format_time(NOW - 60)  # inside the catch-up window
    decision = Case(store).decide(obj)
    assert not decision.note and touches_template("Deployment", decision.ops)


def test_a_required_source_that_appeared_completes_the_record_in_checksum_mode() -> None:
    store = Store([])
    obj = _admitted(ENV, store)  # admitted with a warning: cfg did not exist
    store.put(configmap("cfg", {"a": "1"}))
    decision = Case(store).decide(obj)
    assert decision.note and "appeared" in decision.note
    assert set(decision.intended) == {"configmap/cfg"}


def test_a_required_source_that_appeared_rolls_in_snapshot_mode() -> None:
    store = Store([])
    obj = _admitted(ENV, store, annotations={ANN_MODE: "snapshot"})
    store.put(configmap("cfg", {"a": "1"}))
    case = Case(store)
    case.copies = RecordingWriter()
    decision = case.decide(obj)
    assert not decision.note and touches_template("Deployment", decision.ops)


def test_a_change_of_a_source_named_in_extra_sources_rolls_the_workload() -> None:
    """Its pod spec does not reference it: the app reads it itself (as Reloader's `reload`)."""
    store = Store([configmap("cfg", {"a": "1"}), configmap("settings", {"x": "1"})])
    obj = _admitted(ENV, store, annotations={ANN_EXTRA_SOURCES: "configmap/settings"})
    obj["metadata"]["resourceVersion"] = "41"
    case = Case(store)
    assert case.decide(obj).skip is SkipReason.CURRENT
    store.put(configmap("settings", {"x": "2"}))
    decision = case.decide(obj)
    assert not decision.note and touches_template("Deployment", decision.ops)
    assert "configmap/settings" in decision.intended
    restamp = case.from_index(obj)  # (the plain path says the same)
    assert restamp is not None and restamp.observed == dict(decision.intended)


def test_a_source_newly_named_in_extra_sources_is_recorded_without_a_rollout() -> None:
    """`kubectl annotate deploy app configpin.io/extra-sources=configmap/settings`: admission
    leaves the template (and its record) as it was; its pods read what the source holds already,
    so configpin records it and restarts nothing. Its next change rolls."""
    store = Store([configmap("cfg", {"a": "1"}), configmap("settings", {"x": "1"})])
    obj = _admitted(ENV, store)
    obj["metadata"]["resourceVersion"] = "41"
    annotated = copy.deepcopy(obj)
    annotated["metadata"]["annotations"] = {ANN_EXTRA_SOURCES: "configmap/settings"}
    stored = apply(annotated, plan(annotated, store, operation="UPDATE", old=obj))
    assert stored["spec"] == obj["spec"]  # (the template as it was)
    case = Case(store)
    assert case.from_index(stored) is None  # (never recorded: decided on the object)
    decision = case.decide(stored)
    assert decision.note and "extra-sources" in decision.note
    assert not touches_template("Deployment", decision.ops)
    assert set(decision.intended) == {"configmap/cfg", "configmap/settings"}
    recorded = _written(stored, decision)
    assert case.decide(recorded).skip is SkipReason.CURRENT
    store.put(configmap("settings", {"x": "2"}))
    assert touches_template("Deployment", case.decide(recorded).ops)


# --- refreshed, or rolled instead ---------------------------------------------------------


def test_a_change_through_whole_volume_mounts_refreshes_the_pods() -> None:
    case = Case(_store())
    obj = _admitted(VOLUME, case.store, annotations={ANN_ON_CHANGE: "refresh"})
    case.store.put(configmap("cfg", {"a": "2", "b": "x"}))
    decision = case.decide(obj)
    assert decision.refreshed == 2 and decision.instead is None
    assert not touches_template("Deployment", decision.ops)  # no rollout
    [(ref, target)] = case.pods.refreshed
    assert ref.name == "app" and target == decision.intended
    written = jsonpatch.apply_patch(copy.deepcopy(obj), decision.ops)
    assert written["spec"] == obj["spec"]
    assert written["metadata"]["annotations"][ANN_REFRESHED] == dumps_mapping(target)


@pytest.mark.parametrize(
    ("spec", "kind", "settings", "pods", "fallback"),
    [
        (ENV, DEPLOYMENT, {}, FakePods(), Fallback.ENV),
        (VOLUME, replace(DEPLOYMENT, refreshable=False), {}, FakePods(), Fallback.KIND),
        (VOLUME, DEPLOYMENT, {"refresh_pods": False}, FakePods(), Fallback.DISABLED),
        (VOLUME, DEPLOYMENT, {}, FakePods(forbidden=True), Fallback.FORBIDDEN),
    ],
    ids=["env", "custom-kind", "disabled", "forbidden"],
)
def test_a_refresh_that_cannot_reach_the_process_rolls_and_says_why(
    spec: JSONObject,
    kind: WorkloadKind,
    settings: dict[str, Any],
    pods: FakePods,
    fallback: Fallback,
) -> None:
    case = Case(_store(), Settings(**settings), pods)
    obj = _admitted(spec, case.store, annotations={ANN_ON_CHANGE: "refresh"})
    case.store.put(configmap("cfg", {"a": "2", "b": "x"}))
    decision = case.decide(obj, kind=kind)
    assert decision.refreshed is None and decision.instead is not None
    assert decision.instead.reason is fallback
    assert fallback.in_the_way is (fallback in (Fallback.DISABLED, Fallback.FORBIDDEN))
    assert touches_template("Deployment", decision.ops)  # rolled
    assert case.pods.refreshed == []


# --- planned from the index alone ---------------------------------------------------------


def entry(obj: JSONObject) -> Any:
    found = entry_from_object(obj, "checksum")
    assert not isinstance(found, SkipReason)
    return found


def test_a_plain_re_stamp_is_planned_from_the_index_as_a_guarded_merge_patch() -> None:
    case = Case(_store())
    obj = _admitted(ENV, case.store)
    obj["metadata"]["resourceVersion"] = "41"
    case.store.put(configmap("cfg", {"a": "2", "b": "x"}))
    restamp = case.from_index(obj)
    assert restamp is not None
    written = merge_patch(obj, restamp.merge_patch)
    assert written["metadata"]["resourceVersion"] == "41"  # the precondition
    assert written["metadata"]["annotations"][ANN_ROLLED_AT] == format_time(NOW)
    # the same record the full decision writes
    decision = case.decide(obj)
    assert restamp.observed == dict(decision.intended)
    recorded = written["spec"]["template"]["metadata"]["annotations"][ANN_SOURCES]
    assert recorded == dumps_mapping(restamp.observed)


def test_what_needs_the_object_is_not_planned_from_the_index() -> None:
    store = Store([])
    appeared = _admitted(ENV, store)
    appeared["metadata"]["resourceVersion"] = "41"
    store.put(configmap("cfg", {"a": "1"}))  # a required source that appeared
    case = Case(store)
    assert case.from_index(appeared) is None
    current = _admitted(ENV, store)
    current["metadata"]["resourceVersion"] = "42"
    assert case.from_index(current) is None
    observed = _admitted(ENV, store)
    observed["metadata"]["annotations"] = {ANN_OBSERVED: "{}"}  # a kept rollback, say
    assert entry(observed).restamp_rv is None
    assert case.from_index(observed) is None


# --- what counts as a rollout -------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "path", "rolls"),
    [
        ("Deployment", "/spec/template/metadata/annotations/configpin.io~1sources", True),
        ("Deployment", "/spec/template/spec/volumes/0/configMap/name", True),
        ("Deployment", "/metadata/annotations/configpin.io~1observed", False),
        ("Deployment", "/spec/templateX", False),
        ("CronJob", "/spec/jobTemplate/spec/template/metadata/annotations", True),
        ("CronJob", "/spec/template/metadata", False),
    ],
)
def test_only_template_changes_are_rollouts(kind: str, path: str, rolls: bool) -> None:
    assert touches_template(kind, [{"op": "add", "path": path, "value": "x"}]) is rolls


def test_skip_reasons_are_a_small_set_of_metric_labels() -> None:
    labels = {reason.label for reason in SkipReason}
    assert len(labels) < len(SkipReason)  # the unmanaged share one
    assert SkipReason.OWNED.label == SkipReason.TOO_MANY_SOURCES.label == "not-managed"
    assert SkipReason.MODE_OFF.label == "mode-off"
    assert SkipReason.NOT_STORED.label == "not-stored"
    assert all(label.replace("-", "").isalpha() for label in labels)


# --- safe delivery: the rollout it starts, follows, and acts on ------------------------------


class FakeGate:
    """The waves and the cap: `waiting` says why a workload may not roll (None: it may)."""

    def __init__(self, waiting: str | None = None, place: tuple[int, int] | None = None) -> None:
        self.waiting = waiting
        self.at = place  # the wave a member rolls in, of how many (None: no waves)
        self.asked: list[tuple[WorkloadRef, tuple[Change, ...]]] = []

    limits = None

    def place(self, _ref: WorkloadRef, _changes: Any) -> tuple[int, int] | None:
        return self.at

    def admit(
        self, ref: WorkloadRef, stale: Any, _entry: Any = None
    ) -> tuple[tuple[Change, ...], Wait | None]:
        changes = tuple(Change.of(ref.namespace, sid, "c", shared=False) for sid in sorted(stale))
        self.asked.append((ref, changes))
        return changes, None if self.waiting is None else Wait(WaitReason.WAVE, self.waiting)


def _delivering(store: Store, gate: FakeGate | None = None) -> Case:
    def is_copy(_ns: str, sid: Any, name: str) -> bool:  # "copies configpin made"
        return name.startswith(sid.name + "-")

    case = Case(store, gate=gate or FakeGate())
    case.follower = Follower(HKEY, is_copy=is_copy, changed_keys=lambda _ns, _sid: {"a"})
    return case


def _written(obj: JSONObject, decision: Decision) -> JSONObject:
    out: JSONObject = jsonpatch.apply_patch(copy.deepcopy(obj), decision.ops)
    return out


def _record_of(obj: JSONObject) -> Any:
    found = rollout_record(HKEY, obj)
    assert found is not None
    return found


def _status(obj: JSONObject, *, ready: bool, deadline: bool = False) -> JSONObject:
    """As the Deployment controller reports the new revision: Ready, or stuck past its deadline."""
    obj = copy.deepcopy(obj)
    obj["metadata"]["generation"] = 2
    want = obj["spec"]["replicas"]
    status: JSONObject = {
        "observedGeneration": 2,
        "replicas": want if ready else want + 1,
        "updatedReplicas": want if ready else 1,
        "readyReplicas": want if ready else want - 1,
    }
    if deadline:
        status["conditions"] = [
            {
                "type": "Progressing",
                "status": "False",
                "reason": "ProgressDeadlineExceeded",
                "message": 'ReplicaSet "app-2" has timed out progressing.',
            }
        ]
    obj["status"] = status
    return obj


def _rolled(mode: str) -> tuple[Case, JSONObject, JSONObject]:
    """A workload configpin rolled to new content, as stored, and as it was before."""
    store = _store()
    case = _delivering(store)
    case.copies = RecordingWriter()
    before = _admitted(ENV, store, annotations={ANN_MODE: mode})
    store.put(configmap("cfg", {"a": "2", "b": "x"}))
    if mode == "snapshot":
        store.create_snapshots(
            plan(before, store, mode="snapshot", refresh={next(iter(store.objects))})
        )
    decision = case.decide(before)
    assert decision.skip is None and decision.rollout is not None
    return case, before, _written(before, decision)


@pytest.mark.parametrize("mode", ["checksum", "snapshot"])
def test_a_rollout_writes_its_record_with_the_re_stamp(mode: str) -> None:
    _, before, rolled = _rolled(mode)
    record = _record_of(rolled)
    assert record.state == "rolling" and record.since == NOW
    assert dict(record.to) == recorded_sources(rolled) and dict(record.before) == recorded_sources(
        before
    )
    assert [str(c) for c in record.changes] == ["team-a/configmap/cfg@c"]  # as the gate names it
    assert record.template  # what the template is once written: later edits tell
    if mode == "snapshot":
        [(new, was)] = record.refs.items()
        old_name = before["spec"]["template"]["spec"]["containers"][0]["env"][0]["valueFrom"]
        assert was == f"cfg/{old_name['configMapKeyRef']['name']}" and new.startswith(
            "configmap/cfg-"
        )


def test_a_rollout_that_must_wait_writes_nothing_and_makes_no_copy() -> None:
    store = _store()
    case = _delivering(store, FakeGate("wave 2 of 3 starts when wave 1 is complete"))
    case.copies = RecordingWriter()
    obj = _admitted(ENV, store, annotations={ANN_MODE: "snapshot"})
    store.put(configmap("cfg", {"a": "2", "b": "x"}))
    decision = case.decide(obj)
    assert decision.ops == [] and decision.skip is SkipReason.WAITING
    assert decision.waiting is not None and "wave 1" in decision.waiting.why
    assert case.copies.calls == []


@pytest.mark.parametrize("mode", ["checksum", "snapshot"])
def test_a_rollout_is_followed_until_every_updated_pod_is_ready(mode: str) -> None:
    case, _, rolled = _rolled(mode)
    going = case.decide(_status(rolled, ready=False))
    assert going.ops == [] and going.poll is not None and going.progress is not None
    done = case.decide(_status(rolled, ready=True))
    assert done.progress is not None and done.progress.state == "complete"
    assert _record_of(_written(rolled, done)).state == "complete"
    assert not touches_template("Deployment", done.ops)


def test_a_failed_snapshot_rollout_is_undone_and_its_content_never_rolled_to_again() -> None:
    case, before, rolled = _rolled("snapshot")
    failed = case.decide(_status(rolled, ready=False, deadline=True))
    assert failed.ended is not None and failed.ended.record.action == "undo"
    assert failed.ended.keys == {"configmap/cfg": ("a",)}
    undone = _written(rolled, failed)
    assert undone["spec"]["template"] == before["spec"]["template"]  # the previous copies
    record = _record_of(undone)
    assert record.state == "failed" and "progress deadline" in record.signal
    assert json.loads(undone["metadata"]["annotations"][ANN_REJECTED]) == {
        k: v for k, v in record.to.items() if record.before.get(k) != v
    }
    assert json.loads(undone["metadata"]["annotations"][ANN_OBSERVED]) == dict(record.before)
    # the bad content is current in the source still: rejected, so not stale
    assert case.decide(undone).skip is SkipReason.CURRENT
    # its next change rolls as usual
    case.store.put(configmap("cfg", {"a": "3", "b": "x"}))
    again = case.decide(undone)
    assert again.skip is None and touches_template("Deployment", again.ops)


def test_a_failed_checksum_rollout_is_held() -> None:
    case, _, rolled = _rolled("checksum")
    failed = case.decide(_status(rolled, ready=False, deadline=True))
    assert failed.ended is not None and failed.ended.record.action == "hold"
    assert not touches_template("Deployment", failed.ops)  # content changed in place: kept
    held = _written(rolled, failed)
    assert ANN_REJECTED in held["metadata"]["annotations"]
    assert case.decide(held).skip is SkipReason.CURRENT


def test_an_undo_is_not_made_over_someone_elses_template_change() -> None:
    case, _, rolled = _rolled("snapshot")
    rolled["spec"]["template"]["spec"]["containers"][0]["image"] = "app:2"  # a deploy meanwhile
    failed = case.decide(_status(rolled, ready=False, deadline=True))
    assert failed.ended is not None and failed.ended.record.action == "hold"
    assert "changed since" in failed.ended.not_undone
    assert not touches_template("Deployment", failed.ops)


def test_a_forged_rollout_record_is_not_followed() -> None:
    case, _, rolled = _rolled("checksum")
    text = rolled["metadata"]["annotations"][ANN_ROLLOUT]
    rolled["metadata"]["annotations"][ANN_ROLLOUT] = text.replace('"rolling"', '"failed"')
    decision = case.decide(_status(rolled, ready=False, deadline=True))
    assert decision.progress is None and decision.ops == []  # no record: nothing to follow


# --- safe delivery under what people and tools do -------------------------------------------


def _rolled_back(before: JSONObject, rolled: JSONObject) -> JSONObject:
    """`kubectl rollout undo`: the template of the revision before, the record kept (the
    webhook keeps it when the undo puts the old ReplicaSet's annotations back)."""
    undone = copy.deepcopy(rolled)
    undone["spec"]["template"] = copy.deepcopy(before["spec"]["template"])
    return undone


@pytest.mark.parametrize("mode", ["checksum", "snapshot"])
def test_a_persons_rollback_of_a_rollout_in_progress_is_their_verdict(mode: str) -> None:
    case, before, rolled = _rolled(mode)
    undone = _status(_rolled_back(before, rolled), ready=True)  # the old pods: all Ready
    if mode == "snapshot":  # admission records the kept rollback
        undone["metadata"]["annotations"][ANN_OBSERVED] = dumps_mapping(recorded_sources(rolled))
    verdict = case.decide(undone)
    assert verdict.ended is not None and verdict.ended.record.action == "rolled-back-by-person"
    assert not touches_template("Deployment", verdict.ops)  # their template is kept
    judged = _written(undone, verdict)
    record = _record_of(judged)
    assert record.state == "failed" and "rolled back by a person" in record.signal
    assert json.loads(judged["metadata"]["annotations"][ANN_REJECTED]) == {
        "configmap/cfg": recorded_sources(rolled)["configmap/cfg"]
    }
    # and it stays as they left it: not rolled to that content again
    assert case.decide(judged).skip is SkipReason.CURRENT


def _admitted_later(case: Case, before: JSONObject, path: str) -> tuple[JSONObject, dict[str, str]]:
    """The controller decides to roll `before` (generation 1) to `a: 2`; the source moves on
    to `a: 3` before its write (`path`: a decision on the object read, or a re-stamp planned
    from the index), whose admission stamps what it resolves then. The workload as stored
    (generation 2: the API server counted the template's change), and what was decided."""
    before["metadata"]["generation"] = 1
    before["metadata"]["resourceVersion"] = "41"
    case.store.put(configmap("cfg", {"a": "2", "b": "x"}))
    if path == "read":
        decision = case.decide(before)
        assert decision.rollout is not None
        sent, decided = _written(before, decision), dict(decision.intended)
    else:
        restamp = case.from_index(before)
        assert restamp is not None
        sent, decided = merge_patch(before, restamp.merge_patch), restamp.observed
    case.store.put(configmap("cfg", {"a": "3", "b": "x"}))
    stored = apply(sent, plan(sent, case.store, operation="UPDATE", old=before))
    stored = _status(stored, ready=False)  # (generation 2)
    assert recorded_sources(stored) != decided  # admission pinned newer content
    return stored, decided


@pytest.mark.parametrize("path", ["read", "index"])
def test_a_re_stamp_admitted_with_newer_content_than_decided_is_followed_as_its_rollout(
    path: str,
) -> None:
    """Not a person's rollback: configpin's own rollout, of the content admission pinned.
    Its record is amended to it (and to who made it) while it goes on, and it completes."""
    case = _delivering(_store())
    stored, _ = _admitted_later(case, _admitted(ENV, case.store), path)
    pinned = recorded_sources(stored)["configmap/cfg"]
    indexed = entry_from_object(stored, "checksum", hkey=HKEY)
    brief = indexed.rollout if not isinstance(indexed, SkipReason) else None
    # (the waves count what it rolls before its record is amended)
    assert brief is not None and brief.rolled_to("configmap/cfg") == pinned
    going = case.decide(stored)
    assert going.ended is None, going.ended.record.signal if going.ended else ""
    assert going.progress is not None and going.progress.state == "rolling"
    assert not touches_template("Deployment", going.ops)  # the template as admitted
    amended = _written(stored, going)
    record = _record_of(amended)
    assert record.state == "rolling" and dict(record.to) == recorded_sources(stored)
    assert record.before != record.to and record.generation == 2
    assert [str(c) for c in record.changes] == ["team-a/configmap/cfg@c"]  # the change it rolls
    assert [r.to for r in case.asked_who[-1]] == [pinned]  # who made it
    assert case.decide(amended).ops == []  # followed on, nothing more to write
    done = case.decide(_status(amended, ready=True))
    assert done.ended is not None and done.ended.record.state == "complete"
    assert dict(_record_of(_written(amended, done)).to) == recorded_sources(stored)


@pytest.mark.parametrize("amended", [False, True])
def test_a_persons_rollback_after_a_re_stamp_admitted_with_newer_content_is_their_verdict(
    amended: bool,
) -> None:
    """`kubectl rollout undo` of such a rollout (before or after configpin amended its
    record) counts one more generation of the spec: it is the person's verdict, as ever."""
    case = _delivering(_store())
    before = _admitted(ENV, case.store)
    stored, _ = _admitted_later(case, copy.deepcopy(before), "read")
    if amended:
        stored = _written(stored, case.decide(stored))
    undone = _status(_rolled_back(before, stored), ready=True)
    undone["metadata"]["generation"] = undone["status"]["observedGeneration"] = 3
    verdict = case.decide(undone)
    assert verdict.ended is not None and verdict.ended.record.action == "rolled-back-by-person"
    assert not touches_template("Deployment", verdict.ops)


def test_a_rollout_that_completes_is_no_rollback() -> None:
    case, _, rolled = _rolled("snapshot")
    done = case.decide(_status(rolled, ready=True))
    assert done.ended is not None and done.ended.record.state == "complete"


def test_a_workload_scaled_to_zero_while_rolling_leaves() -> None:
    case, _, rolled = _rolled("checksum")
    zero = _status(rolled, ready=True)
    zero["spec"]["replicas"] = 0
    left = case.decide(zero)
    assert left.ended is not None and _record_of(_written(zero, left)).state == "left"


@pytest.mark.parametrize("mode", ["checksum", "snapshot"])
def test_a_workload_at_zero_replicas_is_re_stamped_as_left_in_the_same_write(mode: str) -> None:
    """Nothing rolls at zero replicas: the record is written ended, so no look at it (a read,
    its pods listed) and no second write follow; a scale-up later starts on the new content
    with nothing to follow, as after a rollout that left."""
    store = _store()
    case = _delivering(store)
    case.copies = RecordingWriter()
    before = _admitted(ENV, store, annotations={ANN_MODE: mode})
    before["spec"]["replicas"] = 0
    store.put(configmap("cfg", {"a": "2", "b": "x"}))
    decision = case.decide(before)
    assert decision.rollout is not None and decision.rollout.state == "left"
    rolled = _written(before, decision)
    assert touches_template("Deployment", decision.ops)  # re-stamped all the same
    record = _record_of(rolled)
    assert record.state == "left" and dict(record.to) == recorded_sources(rolled)
    assert case.decide(rolled).skip is SkipReason.CURRENT  # nothing left to follow
    # planned from the index alone, the same
    if mode == "checksum":
        before["metadata"]["resourceVersion"] = "41"
        restamp = case.from_index(before)
        assert restamp is not None and restamp.left
        written = merge_patch(before, restamp.merge_patch)
        assert _record_of(written).state == "left"


def test_a_rollout_is_assessed_without_listing_pods_where_its_status_says_enough() -> None:
    case, _, rolled = _rolled("checksum")
    done = case.decide(_status(rolled, ready=True))
    assert done.ended is not None and done.ended.record.state == "complete"
    zero = _status(rolled, ready=False)
    zero["spec"]["replicas"] = 0
    left = case.decide(zero)
    assert left.ended is not None and left.ended.record.state == "left"
    assert case.pods.listed == []
    going = case.decide(_status(rolled, ready=False))
    assert going.poll is not None and case.pods.listed  # still rolling: its pods are looked at


def test_an_undo_after_a_quick_fix_lands_on_content_that_completed() -> None:
    """v2 rolling (not judged yet), v3 pushed: v3 fails and is undone to v1's copy, not v2's."""
    case, v1, at_v2 = _rolled("snapshot")
    v1_ref = v1["spec"]["template"]["spec"]["containers"][0]["env"][0]["valueFrom"]
    case.store.put(configmap("cfg", {"a": "3", "b": "x"}))
    rolling_v2 = _status(at_v2, ready=False)
    decision = case.decide(rolling_v2)  # superseded: v3 rolls at once
    assert decision.rollout is not None and touches_template("Deployment", decision.ops)
    at_v3 = _written(rolling_v2, decision)
    assert dict(decision.rollout.before) == recorded_sources(v1)
    failed = case.decide(_status(at_v3, ready=False, deadline=True))
    assert failed.ended is not None and failed.ended.record.action == "undo"
    undone = _written(at_v3, failed)
    ref = undone["spec"]["template"]["spec"]["containers"][0]["env"][0]["valueFrom"]
    assert ref == v1_ref
    assert recorded_sources(undone) == recorded_sources(v1)


# --- what a decision needs read: asked for, read once per reconcile, never read by it -------


def _decide_alone(case: Case, obj: JSONObject, inputs: Inputs, held: Any = None) -> Any:
    """The decision itself, given `inputs` (and the sources held in memory: the store)."""
    return case.restamper().decide(
        _ref(obj), obj, held=held or case.store.lookup, inputs=inputs, kind=DEPLOYMENT
    )


def test_a_rollout_followed_asks_for_its_pods_and_is_assessed_by_those_given() -> None:
    case, _, rolled = _rolled("checksum")
    going = _status(rolled, ready=False)
    inputs = Inputs()
    assert _decide_alone(case, going, inputs) == Need(pods=True)
    work = case.prelude(_ref(going))
    decision = work.decide(going)
    assert decision.poll is not None and case.pods.listed == [_ref(going)]
    # the same workload read again after a 409 (its status moved): its pods are not listed
    # again; another workload under its name (another uid) or selector has other pods
    again = _status(rolled, ready=False)
    again["metadata"]["resourceVersion"] = "43"
    assert work.decide(again).poll is not None and len(case.pods.listed) == 1
    again["metadata"]["uid"] = "another"
    assert work.decide(again).poll is not None and len(case.pods.listed) == 2


def test_a_source_memory_does_not_hold_is_asked_for_and_planned_as_it_was_read() -> None:
    store = Store([configmap("cfg", {"a": "1"}), configmap("extra", {"b": "1"})])
    spec = pod_spec(container(env=[env_cm("cfg", "a"), env_cm("extra", "b")]))
    case = Case(store)
    obj = _admitted(spec, store)
    store.put(configmap("cfg", {"a": "2"}))
    extra = SourceId(SourceKind.CONFIGMAP, "extra")

    def held(sid: SourceId) -> Any:  # memory holds cfg, not extra
        return MISS if sid == extra else store.lookup(sid)

    assert _decide_alone(case, obj, Inputs(), held) == Need(sources=frozenset({extra}))
    unreadable = Inputs(sources={extra: SourceUnavailable("503 Service Unavailable")})
    planned = _decide_alone(case, obj, unreadable, held)
    assert isinstance(planned, Decision) and touches_template("Deployment", planned.ops)
    assert planned.intended["configmap/extra"] == recorded_sources(obj)["configmap/extra"]
    read = Inputs(sources={extra: store.lookup(extra)})
    assert _decide_alone(case, obj, read, held) == case.decide(obj)  # as if held


def test_who_made_a_change_is_asked_for_before_its_rollout_is_written() -> None:
    case = _delivering(_store())
    obj = _admitted(ENV, case.store)
    case.store.put(configmap("cfg", {"a": "2", "b": "x"}))
    need = _decide_alone(case, obj, Inputs())
    assert isinstance(need, Need)
    assert [str(r.change) for r in need.editors] == ["team-a/configmap/cfg@c"]
    decision = case.decide(obj)
    assert decision.rollout is not None and decision.rollout.by.startswith("alice at ")
    assert case.asked_who == [need.editors]
    # a workload that is current, or waits, never asks
    case.asked_who.clear()
    assert case.decide(_written(obj, decision)).skip is SkipReason.CURRENT
    waiting = _delivering(case.store, FakeGate("wave 2 of 3 starts when wave 1 is complete"))
    assert waiting.decide(_admitted(ENV, Store([configmap("cfg", {"a": "1"})]))).waiting
    assert case.asked_who == [] and waiting.asked_who == []


def test_a_reconcile_reads_each_need_once_however_often_it_decides() -> None:
    """A conflict makes the reconciler decide again on the workload read again: what was read
    for the first decision (who made the change, a source memory does not hold) is not read
    again, from the index's plan to the decision on the object."""
    store = _store()
    case = _delivering(store)
    obj = _admitted(ENV, store)
    obj["metadata"]["resourceVersion"] = "41"
    store.put(configmap("cfg", {"a": "2", "b": "x"}))
    work = case.prelude(_ref(obj))
    assert work.from_index(entry(obj)) is not None  # written: a 409
    first = work.decide(copy.deepcopy(obj))
    again = work.decide(copy.deepcopy(obj))
    assert first.rollout is not None and again.rollout is not None
    assert len(case.asked_who) == 1


def test_who_made_a_change_is_asked_once_per_reconcile_even_if_the_source_moves_on() -> None:
    """The source moves on (say a key the workload does not read) between the decision that
    asked who made the change and the next one of the same reconcile (a conflict's): the
    first answer stands, nobody is asked about the newer content (whose record names who made
    that other change, not the one rolled to)."""

    class MovingGate(FakeGate):
        def admit(
            self, ref: WorkloadRef, stale: Any, _entry: Any = None
        ) -> tuple[tuple[Change, ...], Wait | None]:
            content = f"c{min(len(self.asked), 1)}"  # the source moves on once, after a look
            changes = tuple(Change.of(ref.namespace, sid, content, shared=False) for sid in stale)
            self.asked.append((ref, changes))
            return changes, None

    store = _store()
    case = _delivering(store, MovingGate())
    obj = _admitted(ENV, store)
    store.put(configmap("cfg", {"a": "2", "b": "x"}))
    work = case.prelude(_ref(obj))
    first = work.decide(copy.deepcopy(obj))
    again = work.decide(copy.deepcopy(obj))
    assert first.rollout is not None and again.rollout is not None
    assert [[str(r.change) for r in asked] for asked in case.asked_who] == [
        ["team-a/configmap/cfg@c0"]
    ]
    assert [str(c) for c in again.rollout.changes] == ["team-a/configmap/cfg@c1"]
    assert again.rollout.by == first.rollout.by != ""


# --- the rollout budget: each rollout configpin starts is counted in its own write ---------


class LimitedGate(FakeGate):
    """The gate with rollout limits: a budget of 3 an hour, no window."""

    def __init__(self) -> None:
        super().__init__()
        self.limits = RolloutLimits(  # type: ignore[assignment]
            Settings(rollout_budget="3/1h"),
            HKEY,
            namespace_windows=lambda _ns: None,
            wall=lambda: NOW,
        )


def _starts_of(obj: JSONObject) -> tuple[float, ...]:
    text = obj["metadata"]["annotations"][ANN_ROLLOUT_STARTS]
    meta = obj["metadata"]
    return decode_starts(HKEY, identity(obj["kind"], meta["namespace"], meta["name"]), text)


@pytest.mark.parametrize("before", [(), (NOW - 7200, NOW - 600, NOW - 300)])
def test_a_re_stamp_records_its_start_in_the_same_write(before: tuple[float, ...]) -> None:
    """The decision's ops and the index's merge patch each carry configpin.io/rollout-starts
    with the start of this rollout (the ones before within the period, at most COUNT)."""
    store = _store()
    case = _delivering(store, LimitedGate())
    obj = _admitted(ENV, store)
    obj["metadata"]["resourceVersion"] = "41"
    if before:
        meta = obj["metadata"]
        meta.setdefault("annotations", {})[ANN_ROLLOUT_STARTS] = encode_starts(
            HKEY, identity("Deployment", meta["namespace"], meta["name"]), before
        )
    store.put(configmap("cfg", {"a": "2", "b": "x"}))
    expected = (*before[1:], NOW) if before else (NOW,)  # (the first: two hours ago)
    decision = case.decide(obj)
    assert decision.rollout is not None
    assert _starts_of(_written(obj, decision)) == expected
    indexed = case.restamper().entry(obj)  # (as the index holds it: its starts read)
    assert isinstance(indexed, WorkloadEntry)
    restamp = case.prelude(_ref(obj)).from_index(indexed)
    assert restamp is not None
    assert _starts_of(merge_patch(obj, restamp.merge_patch)) == expected
    # a gate with no limits (safe delivery off in a test) writes none
    plain = _delivering(_store(), FakeGate())
    unlimited = _admitted(ENV, plain.store)
    plain.store.put(configmap("cfg", {"a": "2", "b": "x"}))
    written = _written(unlimited, plain.decide(unlimited))
    assert ANN_ROLLOUT_STARTS not in written["metadata"].get("annotations", {})


@pytest.mark.parametrize("place", [None, (2, 3)])
def test_the_object_and_the_index_start_a_rollout_with_one_record(
    place: tuple[int, int] | None,
) -> None:
    """A re-stamp decided on the object as read and one planned from the index alone write
    the same record of the rollout (its wave among it, wave 2 of 3 here, as the gate placed
    it) and take the same marker off: a workload held before it rolls is no longer held."""
    store = _store()
    case = _delivering(store, FakeGate(place=place))
    obj = _admitted(ENV, store)
    obj["metadata"]["resourceVersion"] = "41"
    obj["metadata"].setdefault("annotations", {})[ANN_HELD] = "AwaitingApproval: waits"
    store.put(configmap("cfg", {"a": "2", "b": "x"}))
    decision = case.decide(obj)
    assert decision.rollout is not None
    from_object = _written(obj, decision)
    indexed = case.restamper().entry(obj)
    assert isinstance(indexed, WorkloadEntry)
    restamp = case.prelude(_ref(obj)).from_index(indexed)
    assert restamp is not None
    from_index = merge_patch(obj, restamp.merge_patch)
    for written in (from_object, from_index):
        assert ANN_HELD not in written["metadata"]["annotations"]
        record = _record_of(written)
        assert record.wave == place and record.state == "rolling" and record.since == NOW
        assert [str(c) for c in record.changes] == ["team-a/configmap/cfg@c"]
        assert dict(record.to) == recorded_sources(from_object)
    # (from the index nothing is known of the template as written: its fingerprint is not)
    assert _record_of(from_object).template and not _record_of(from_index).template
