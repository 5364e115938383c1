"""The wave gate (webhook/controller/waves.py): which stale workloads may roll to a change now,
worked out from the index and the source cache alone."""

from __future__ import annotations

from typing import Any

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
from webhook.controller.waves import Gate
from webhook.core import digest
from webhook.core.audit import APPROVED, ChangedBy
from webhook.core.constants import (
    ANN_APPROVED,
    ANN_ON_CHANGE,
    ANN_ROLLOUT,
    ANN_ROLLOUT_WAVES,
    ANN_SHARED,
    ANN_WAVE,
)
from webhook.core.current import WorkloadRef, entry_from_object
from webhook.core.model import SourceId, SourceKind
from webhook.core.record import Action, Change, RolloutRecord, State, identity
from webhook.core.waves import Wait, WaitReason
from webhook.process.config import Settings

CFG = SourceId(SourceKind.CONFIGMAP, "cfg")
UNAVAILABLE = {"conditions": [{"type": "Available", "status": "False"}]}


def _setup(
    names: dict[str, list[str]],
    *,
    waves: str = "1,10%,100%",
    cap: int = 0,
    scope: set[str] | None = None,
    shared: bool = False,
    broken: set[str] = frozenset(),  # type: ignore[assignment]
) -> tuple[Gate, WorkloadIndex, dict[str, Store], dict[WorkloadRef, Any]]:
    """Workloads consuming `cfg` in each namespace, stamped (those named in `broken` not
    available); then `cfg` changes everywhere to the same content (`shared`: marked so)."""
    notes = {ANN_SHARED: "true"} if shared else None
    stores = {
        ns: Store([configmap("cfg", {"a": "1"}, namespace=ns, annotations=notes)]) for ns in names
    }
    index = WorkloadIndex()
    objs: dict[WorkloadRef, Any] = {}
    for ns, workloads in names.items():
        for name in workloads:
            obj = workload("Deployment", reading("cfg", "a"), name=name, namespace=ns)
            obj = admitted(obj, stores[ns])
            if name in broken:
                obj["status"] = UNAVAILABLE
            entry = entry_from_object(obj, "checksum", hkey=HKEY)
            index.put(entry)
            objs[entry.ref] = obj
    for ns, store in stores.items():
        store.put(configmap("cfg", {"a": "2"}, namespace=ns, annotations=notes))
    settings = Settings(rollout_waves=waves, max_rolling=cap)
    in_scope = (lambda ns: True) if scope is None else scope.__contains__
    return Gate(index, StoreCache(stores), HKEY, settings, in_scope=in_scope), index, stores, objs


def _record(
    index: WorkloadIndex,
    obj: Any,
    ref: WorkloadRef,
    change: Change,
    state: State,
    *,
    healthy: bool = True,
    action: Action | None = None,
) -> None:
    record = RolloutRecord(
        state, to={}, before={}, since=0.0, changes=(change,), healthy=healthy, action=action
    )
    obj["metadata"].setdefault("annotations", {})[ANN_ROLLOUT] = record.encode(
        HKEY, identity(ref.kind, ref.namespace, ref.name)
    )
    index.put(entry_from_object(obj, "checksum", hkey=HKEY))


def _why(wait: Wait | None) -> str:
    return wait.why if wait is not None else ""


def _may(gate: Gate, ref: WorkloadRef, change: Change) -> bool:
    """Whether `ref` may roll now (the place reserved for it given back: it is not rolled)."""
    waiting = gate.wait(ref, [change])
    gate.release(ref)
    return waiting is None


def test_the_first_wave_goes_alone_and_the_next_when_it_completed() -> None:
    gate, index, _, objs = _setup({"team-a": [f"w{i}" for i in range(12)]})
    [change] = gate.changes("team-a", [CFG])
    plan_ = gate.cut.plan(change)
    assert [len(w) for w in plan_] == [1, 2, 9]
    first, second, third = plan_
    assert gate.wait(first[0], [change]) is None
    waiting = gate.wait(second[0], [change])
    assert waiting is not None and waiting.reason is WaitReason.WAVE
    assert "wave 1 is complete (0 of 1" in waiting.why
    _record(index, objs[first[0]], first[0], change, State.ROLLING)
    assert gate.wait(second[0], [change]) is not None
    _record(index, objs[first[0]], first[0], change, State.COMPLETE)
    assert gate.wait(second[0], [change]) is None
    assert "wave 2 is complete (0 of 2" in _why(gate.wait(third[0], [change]))


def test_a_member_is_placed_in_the_wave_the_gate_lets_it_roll_in() -> None:
    """The wave a rollout starts in, of how many (its record keeps it): 12 workloads under
    `1,10%,100%` are 1, 2 and 9; with waves off, or for a workload that is no member, none."""
    gate, _, _, objs = _setup({"team-a": [f"w{i}" for i in range(12)]})
    [change] = gate.changes("team-a", [CFG])
    places = [gate.place(ref, [change]) for ref in objs]
    assert sorted(p for p in places if p is not None) == [(1, 3)] + [(2, 3)] * 2 + [(3, 3)] * 9
    assert gate.place(WorkloadRef("Deployment", "team-a", "nobody"), [change]) is None
    off, _, _, objs = _setup({"team-a": ["w0", "w1"]}, waves="off")
    [change] = off.changes("team-a", [CFG])
    assert all(off.place(ref, [change]) is None for ref in objs)


def test_a_failure_stops_every_later_wave() -> None:
    gate, index, _, objs = _setup({"team-a": [f"w{i}" for i in range(5)]})
    [change] = gate.changes("team-a", [CFG])
    first, *later = gate.cut.plan(change)
    _record(index, objs[first[0]], first[0], change, State.FAILED, action=Action.HOLD)
    for wave in later:
        waiting = gate.wait(wave[0], [change])
        assert waiting is not None and waiting.reason is WaitReason.STOPPED


def test_a_persons_rollback_of_the_canary_stops_every_later_wave() -> None:
    gate, index, _, objs = _setup({"team-a": [f"w{i}" for i in range(5)]})
    [change] = gate.changes("team-a", [CFG])
    first, *later = gate.cut.plan(change)
    _record(index, objs[first[0]], first[0], change, State.FAILED, action=Action.PERSON)
    assert all(_why(gate.wait(wave[0], [change])).endswith("not rolled") for wave in later)


def test_a_canary_scaled_to_zero_or_deleted_proves_nothing_the_next_one_vouches() -> None:
    gate, index, _, objs = _setup({"team-a": [f"w{i}" for i in range(12)]})
    [change] = gate.changes("team-a", [CFG])
    canary = gate.cut.plan(change)[0][0]
    _record(index, objs[canary], canary, change, State.LEFT)  # scaled to zero while rolling
    first, second, _ = gate.cut.plan(change)
    assert canary not in first and gate.wait(first[0], [change]) is None
    assert gate.wait(second[0], [change]) is not None  # the new canary has proved nothing yet
    index.remove(first[0])  # ... and it is deleted
    new_first, new_second, _ = gate.cut.plan(change)
    assert first[0] not in new_first and gate.wait(new_second[0], [change]) is not None
    _record(index, objs[new_first[0]], new_first[0], change, State.COMPLETE)
    assert gate.wait(new_second[0], [change]) is None


def test_a_workload_broken_before_the_change_is_no_canary_and_stops_nothing() -> None:
    names = [f"w{i}" for i in range(6)]
    gate, index, _, objs = _setup({"team-a": names}, broken={"w0", "w1", "w2"})
    [change] = gate.changes("team-a", [CFG])
    first, second, last = gate.cut.plan(change)
    broken = {WorkloadRef("Deployment", "team-a", n) for n in ("w0", "w1", "w2")}
    assert not broken & {*first, *second} and broken <= set(last)
    # healthy ones go first; a broken one's failure (it was broken before) stops nothing
    for ref in broken:
        _record(index, objs[ref], ref, change, State.FAILED, healthy=False, action=Action.HOLD)
    _record(index, objs[first[0]], first[0], change, State.COMPLETE)
    assert gate.wait(second[0], [change]) is None


def test_a_change_is_its_namespaces_own_unless_its_source_is_shared() -> None:
    names = {ns: ["a", "b", "c"] for ns in ("dev", "stage", "prod")}
    gate, index, _, objs = _setup(names)
    changes = {gate.changes(ns, [CFG]) for ns in ("dev", "stage", "prod")}
    assert len(changes) == 3  # the same content, three tenants: three changes
    [dev] = gate.changes("dev", [CFG])
    assert {r.namespace for wave in gate.cut.plan(dev) for r in wave} == {"dev"}
    first = gate.cut.plan(dev)[0][0]
    _record(index, objs[first], first, dev, State.FAILED, action=Action.HOLD)
    [prod] = gate.changes("prod", [CFG])
    assert gate.wait(gate.cut.plan(prod)[0][0], [prod]) is None  # dev's failure stops nothing here

    gate, *_ = _setup(names, shared=True)
    changes = {gate.changes(ns, [CFG]) for ns in ("dev", "stage", "prod")}
    assert len(changes) == 1
    [[change]] = changes
    order = [ref for wave in gate.cut.plan(change) for ref in wave]
    assert {r.namespace for r in order[:3]} == {"dev", "stage", "prod"}


def test_a_workload_that_takes_the_change_in_place_holds_no_wave() -> None:
    """A workload refreshed in place (on-change: refresh, a whole-volume mount) rolls nothing
    and never writes a rollout record: were it a member, the wave it held would never be
    complete, and every later one would wait (until a resync)."""
    gate, index, *_ = _setup({"team-a": ["w0", "w1", "w2"]})
    live = workload(
        "Deployment",
        pod_spec(container(), volumes=[vol_cm("cfg")]),
        name="live",
        namespace="team-a",
        annotations={ANN_ON_CHANGE: "refresh", ANN_WAVE: "-1"},  # (first, were it a member)
    )
    stamp = Store([configmap("cfg", {"a": "1"}, namespace="team-a")])
    index.put(entry_from_object(admitted(live, stamp), "checksum", hkey=HKEY))
    [change] = gate.changes("team-a", [CFG])
    waves = gate.cut.plan(change)
    assert WorkloadRef("Deployment", "team-a", "live") not in {r for w in waves for r in w}
    assert [len(w) for w in waves] == [1, 1, 1]
    assert gate.wait(waves[0][0], [change]) is None


def test_workloads_configpin_does_not_act_for_hold_no_wave() -> None:
    names = {"team-a": ["w0", "w1"], "elsewhere": ["x0", "x1", "x2"]}
    gate, *_ = _setup(names, scope={"team-a"}, shared=True)
    [change] = gate.changes("team-a", [CFG])
    assert {r.namespace for r in gate.cut.order(change)} == {"team-a"}


def test_the_wave_annotation_goes_first() -> None:
    gate, index, _, objs = _setup({"team-a": [f"w{i}" for i in range(6)]})
    canary = WorkloadRef("Deployment", "team-a", "w4")
    objs[canary]["metadata"].setdefault("annotations", {})[ANN_WAVE] = "-1"
    index.put(entry_from_object(objs[canary], "checksum", hkey=HKEY))
    [change] = gate.changes("team-a", [CFG])
    assert gate.cut.plan(change, refresh=True)[0] == [canary]


def test_waves_off_roll_every_workload_at_once_under_the_cap() -> None:
    gate, index, _, objs = _setup({"team-a": ["w0", "w1", "w2"]}, waves="off", cap=1)
    [change] = gate.changes("team-a", [CFG])
    refs = list(objs)
    assert all(_may(gate, r, change) for r in refs)
    _record(index, objs[refs[0]], refs[0], change, State.ROLLING)
    waiting = gate.wait(refs[1], [change])
    assert waiting is not None and waiting.reason is WaitReason.CAP
    assert "--max-rolling 1" in waiting.why


def test_the_cap_counts_a_namespaces_own_rollouts_that_hold_a_place() -> None:
    names = {"team-a": ["w0", "w1", "w2"], "team-b": ["x0"]}
    gate, index, stores, objs = _setup(names, waves="off", cap=1)
    [change] = gate.changes("team-a", [CFG])
    w0, w1, w2 = (WorkloadRef("Deployment", "team-a", n) for n in ("w0", "w1", "w2"))
    _record(index, objs[w0], w0, change, State.ROLLING)
    assert gate.wait(w1, [change]) is not None
    x0 = WorkloadRef("Deployment", "team-b", "x0")
    [other] = gate.changes("team-b", [CFG])
    assert _may(gate, x0, other)  # another tenant never waits for team-a's
    # a paused Deployment's rollout holds no place
    objs[w0]["spec"]["paused"] = True
    index.put(entry_from_object(objs[w0], "checksum", hkey=HKEY))
    assert _may(gate, w1, change)
    del objs[w0]["spec"]["paused"]
    index.put(entry_from_object(objs[w0], "checksum", hkey=HKEY))
    assert gate.wait(w1, [change]) is not None
    # a newer change of its source supersedes it: its place is free at once
    stores["team-a"].put(configmap("cfg", {"a": "3"}, namespace="team-a"))
    [newer] = gate.changes("team-a", [CFG])
    assert gate.superseded(index.get(w0))  # type: ignore[arg-type]
    assert _may(gate, w1, newer) and _may(gate, w2, newer)


def test_a_place_is_reserved_until_the_rollout_is_written() -> None:
    """Workers ask at once: the place one was given counts for the next before its write
    reaches the index."""
    gate, index, _, objs = _setup({"team-a": ["w0", "w1"]}, waves="off", cap=1)
    [change] = gate.changes("team-a", [CFG])
    w0, w1 = objs
    assert gate.wait(w0, [change]) is None
    assert _why(gate.wait(w1, [change])).startswith("1 config rollouts are in flight")
    assert gate.wait(w0, [change]) is None  # its own place, asked again (a 409 decides again)
    _record(index, objs[w0], w0, change, State.ROLLING)  # written, indexed
    gate.release(w0)
    assert gate.wait(w1, [change]) is not None  # the index holds it now
    _record(index, objs[w0], w0, change, State.COMPLETE)
    assert gate.wait(w1, [change]) is None


def _approve(store: Store, namespace: str, who: str = "rm") -> None:
    """`configpin approve configmap/cfg`: the signed record admission writes, on the source
    as it is now."""
    obj = store.objects[CFG]
    content = digest.content_id(
        digest.source_digest(HKEY, digest.record_from_object(HKEY, CFG.kind, obj))
    )
    text = ChangedBy(who, 0.0, content).encode(HKEY, namespace, CFG, domain=APPROVED)
    obj["metadata"].setdefault("annotations", {})[ANN_APPROVED] = text
    store.put(obj)


def test_the_waves_after_approve_wait_for_the_changes_approval() -> None:
    gate, index, stores, objs = _setup(
        {"team-a": [f"w{i}" for i in range(5)]}, waves="1,approve,100%"
    )
    [change] = gate.changes("team-a", [CFG])
    first, second = gate.cut.plan(change)
    assert len(first) == 1 and len(second) == 4
    assert _may(gate, first[0], change)  # the canary needs no approval
    _record(index, objs[first[0]], first[0], change, State.COMPLETE)
    waiting = gate.wait(second[0], [change])
    assert waiting is not None and waiting.reason is WaitReason.APPROVAL
    assert "kubectl configpin approve configmap/cfg -n team-a" in waiting.why
    _approve(stores["team-a"], "team-a")
    assert all(_may(gate, ref, change) for ref in second)
    # a newer change: the approval names other content, so it needs its own
    stores["team-a"].put(configmap("cfg", {"a": "3"}, namespace="team-a"))
    [newer] = gate.changes("team-a", [CFG])
    assert newer != change
    _record(index, objs[first[0]], first[0], newer, State.COMPLETE)
    waiting = gate.wait(second[0], [newer])
    assert waiting is not None and waiting.reason is WaitReason.APPROVAL


def test_a_workload_that_asks_for_approval_waits_for_it_in_any_wave() -> None:
    gate, index, stores, objs = _setup({"team-a": ["w0"]}, waves="off")
    [ref] = objs
    objs[ref]["metadata"].setdefault("annotations", {})[ANN_ROLLOUT_WAVES] = "approve"
    index.put(entry_from_object(objs[ref], "checksum", hkey=HKEY))
    [change] = gate.changes("team-a", [CFG])
    waiting = gate.wait(ref, [change])
    assert waiting is not None and waiting.reason is WaitReason.APPROVAL
    _approve(stores["team-a"], "team-a")
    assert _may(gate, ref, change)


def test_an_approval_copied_from_another_namespace_approves_nothing() -> None:
    """Namespace b's approval of the same content, copied by a tenant onto a's source."""
    gate, index, stores, objs = _setup({"a": ["w0", "w1"], "b": ["x0"]}, waves="1,approve,100%")
    [change] = gate.changes("a", [CFG])
    first, second = gate.cut.plan(change)
    _record(index, objs[first[0]], first[0], change, State.COMPLETE)
    _approve(stores["b"], "b")
    copied = stores["b"].objects[CFG]["metadata"]["annotations"][ANN_APPROVED]
    stores["a"].objects[CFG]["metadata"].setdefault("annotations", {})[ANN_APPROVED] = copied
    waiting = gate.wait(second[0], [change])
    assert waiting is not None and waiting.reason is WaitReason.APPROVAL
    _approve(stores["a"], "a")
    assert _may(gate, second[0], change)


def test_an_approval_does_not_start_waves_a_persons_rollback_stopped() -> None:
    """The canary's rollout was rolled back by a person while the rest awaited approval:
    approving the change afterwards starts nothing; the waves stay stopped."""
    gate, index, stores, objs = _setup(
        {"team-a": [f"w{i}" for i in range(3)]}, waves="1,approve,100%"
    )
    [change] = gate.changes("team-a", [CFG])
    first, second = gate.cut.plan(change)
    _record(index, objs[first[0]], first[0], change, State.FAILED, action=Action.PERSON)
    _approve(stores["team-a"], "team-a")
    waiting = gate.wait(second[0], [change])
    assert waiting is not None and waiting.reason is WaitReason.STOPPED
