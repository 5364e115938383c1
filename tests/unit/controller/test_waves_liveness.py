"""No combination of changes leaves every rollout waiting (shared/SPEC.md, safe delivery under
what people and tools do): a property of the wave gate's decisions (webhook/controller/waves.py)
over whatever changes come, in whatever order, to workloads that share sources, with or without
waves, a cap, approvals and shared sources, and whatever each rollout comes to.

The world is the index and the source cache the gate reads, written as configpin writes them:
a workload admitted (`Gate.admit` says it may) is re-stamped for what its sources hold now and
carries a rollout record `rolling` for those changes; a rollout in flight ends complete, or
failed (held: the content recorded as rejected there). Between the changes, workloads are
asked and rollouts end in an order Hypothesis draws. At the end every rollout in flight ends,
and every stale workload is asked again until nothing moves: then no workload may wait for a
wave or for a place (nothing is in flight). Only a failure (the waves after it stop) or an
approval nobody gave may hold a change back."""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field
from typing import Any, Final

import jsonpatch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.controller import StoreCache
from tests.unit.conftest import (
    HKEY,
    Store,
    admitted,
    configmap,
    container,
    env_cm,
    pod_spec,
    workload,
)
from webhook.controller.decision import Decision
from webhook.controller.follow import Follower
from webhook.controller.index import WorkloadIndex
from webhook.controller.reconcile import Prelude
from webhook.controller.restamp import Restamper
from webhook.controller.waves import Gate
from webhook.core import digest
from webhook.core.audit import APPROVED, ChangedBy
from webhook.core.constants import (
    ANN_APPROVED,
    ANN_SHARED,
    ANN_WAVE,
)
from webhook.core.current import WorkloadEntry, WorkloadRef, entry_from_object, stale_sources
from webhook.core.kinds import builtin
from webhook.core.model import JSONObject, SourceId, SourceKind
from webhook.core.record import State, rollout_record
from webhook.core.waves import Wait, WaitReason
from webhook.process.config import Settings

NAMESPACES = ("team-a", "team-b")
SOURCES = ("s0", "s1", "s2")
UNAVAILABLE = {"conditions": [{"type": "Available", "status": "False"}]}
DEPLOYMENT = builtin("Deployment")
assert DEPLOYMENT is not None
WAVES = ("off", "1,10%,100%", "1,100%", "2,50%,100%", "1,approve,100%")
FINE = frozenset({WaitReason.STOPPED, WaitReason.APPROVAL})  # a failure, or a person
A = "team-a"


@dataclass(frozen=True)
class Spec:
    """A workload: where it runs, what it consumes, its configpin.io/wave, and whether it
    was healthy before any change."""

    namespace: str
    consumes: tuple[str, ...]
    wave: int
    healthy: bool


@dataclass
class World:
    """The index, the sources, and configpin's decisions (webhook.controller.restamp) on each
    workload as the API server stores it; nothing runs pods: a rollout's status says how it
    goes (`end`)."""

    gate: Gate
    restamper: Restamper
    index: WorkloadIndex
    stores: dict[str, Store]
    objs: dict[WorkloadRef, JSONObject]
    shared: frozenset[str]
    version: int = 0
    rolled: list[WorkloadRef] = field(default_factory=list)
    in_flight: set[WorkloadRef] = field(default_factory=set)

    def entry(self, ref: WorkloadRef) -> WorkloadEntry:
        found = self.index.get(ref)
        assert found is not None
        return found

    def stale(self, ref: WorkloadRef) -> set[SourceId]:
        store = self.stores[ref.namespace]
        return stale_sources(self.entry(ref), store.lookup, HKEY)

    def put(self, ref: WorkloadRef, obj: JSONObject) -> None:
        self.objs[ref] = obj
        entry = entry_from_object(obj, "checksum", hkey=HKEY)
        assert isinstance(entry, WorkloadEntry)
        self.index.put(entry)

    # --- what people do
    def change(self, name: str, namespace: str) -> None:
        """A new content of source `name` (in every namespace, for a shared one: one change)."""
        self.version += 1
        where = NAMESPACES if name in self.shared else (namespace,)
        for ns in where:
            notes = {ANN_SHARED: "true"} if name in self.shared else None
            self.stores[ns].put(
                configmap(name, {"a": str(self.version)}, namespace=ns, annotations=notes)
            )

    def approve(self, name: str, namespace: str) -> None:
        """`configpin approve configmap/NAME`: the content as it is now (everywhere, shared)."""
        sid = SourceId(SourceKind.CONFIGMAP, name)
        for ns in NAMESPACES if name in self.shared else (namespace,):
            obj = self.stores[ns].objects[sid]
            record = digest.record_from_object(HKEY, sid.kind, obj)
            content = digest.source_digest(HKEY, record)[:20]
            text = ChangedBy("rm", 0.0, content).encode(HKEY, ns, sid, domain=APPROVED)
            obj["metadata"].setdefault("annotations", {})[ANN_APPROVED] = text
            self.stores[ns].put(obj)

    # --- what configpin does
    def _decide(self, ref: WorkloadRef, *, follow_only: bool = False) -> Decision:
        """configpin's look at `ref` as stored now, its write stored (and indexed)."""
        store = self.stores[ref.namespace]
        work = Prelude(self.restamper, _NoPods(), None, ref, DEPLOYMENT, store.lookup, store.lookup)
        obj = self.objs[ref]
        try:
            decision = work.decide(copy.deepcopy(obj), follow_only=follow_only)
        finally:
            self.restamper.done(ref)
        if decision.ops:
            written = jsonpatch.apply_patch(copy.deepcopy(obj), decision.ops)
            if written["spec"]["template"] != obj["spec"]["template"]:
                written["metadata"]["generation"] += 1  # (as the API server counts)
            self.put(ref, written)
        return decision

    def ask(self, ref: WorkloadRef) -> Wait | None:
        """Looks at `ref` as the controller does when it is stale: it rolls when the gate
        says it may; what it waits for, else."""
        if not self.stale(ref):
            return None
        decision = self._decide(ref)
        if decision.rollout is not None:
            self.rolled.append(ref)
            if decision.rollout.state is State.ROLLING:
                self.in_flight.add(ref)
        return decision.waiting

    def end(self, ref: WorkloadRef, *, completes: bool) -> None:
        """The rollout in flight on `ref` completes (its updated pods Ready), or fails (its
        progress deadline passes); configpin's look at it says so."""
        self.in_flight.discard(ref)
        obj = self.objs[ref]
        record = rollout_record(HKEY, obj)
        if record is None or record.state is not State.ROLLING:
            return  # (ended otherwise meanwhile)
        if self.stale(ref) & {c.source for c in record.changes}:
            return  # superseded by a newer change: that one rolls when it is looked at
        generation = obj["metadata"]["generation"]
        if completes:
            obj["status"] = _ready(generation)
        else:
            obj["status"] = {**_ready(generation), "updatedReplicas": 1, "readyReplicas": 1}
            obj["status"]["conditions"] = [_DEADLINE]
        self.put(ref, obj)
        decision = self._decide(ref, follow_only=True)  # (the follow queue's look)
        assert decision.ended is not None, decision


class _NoPods:
    """Nothing runs pods here: a rollout is judged by its status."""

    def running(self, _ref: WorkloadRef, _obj: JSONObject) -> list[JSONObject]:
        return []

    def refresh(self, *_: Any) -> int:
        raise AssertionError("no workload here refreshes")

    def catch_up(self, *_: Any) -> None:
        raise AssertionError("no workload here refreshes")


_DEADLINE: Final = {
    "type": "Progressing",
    "status": "False",
    "reason": "ProgressDeadlineExceeded",
    "message": "timed out progressing",
}


def _ready(generation: int) -> JSONObject:
    return {
        "observedGeneration": generation,
        "replicas": 2,
        "updatedReplicas": 2,
        "readyReplicas": 2,
        "availableReplicas": 2,
        "conditions": [{"type": "Available", "status": "True"}],
    }


def _world(
    specs: list[Spec],
    *,
    waves: str,
    cap: int = 0,
    shared: frozenset[str] = frozenset(),
    names: list[str] | None = None,
) -> World:
    """`specs` as stamped, healthy or not (named `names`, else w0, w1, ...)."""
    stores = {ns: Store([]) for ns in NAMESPACES}
    for ns, store in stores.items():
        for name in SOURCES:
            notes = {ANN_SHARED: "true"} if name in shared else None
            store.put(configmap(name, {"a": "0"}, namespace=ns, annotations=notes))
    index = WorkloadIndex()
    settings_ = Settings(rollout_waves=waves, max_rolling=cap)
    gate = Gate(index, StoreCache(stores), HKEY, settings_, in_scope=lambda _ns: True)
    follower = Follower(HKEY, is_copy=lambda *_: False, changed_keys=lambda *_: None)
    restamper = Restamper(
        HKEY, settings_, copies=False, is_leader=lambda: True, follower=follower, gate=gate
    )
    world = World(gate, restamper, index, stores, {}, shared)
    for i, spec in enumerate(specs):
        name = names[i] if names else f"w{i}"
        env = [env_cm(name, "a", var=f"V{j}") for j, name in enumerate(spec.consumes)]
        notes = {ANN_WAVE: str(spec.wave)} if spec.wave else None
        obj = workload(
            "Deployment",
            pod_spec(container(env=env)),
            name=name,
            namespace=spec.namespace,
            annotations=notes,
        )
        obj = admitted(obj, stores[spec.namespace])
        obj["metadata"]["generation"] = 1
        obj["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
        obj["status"] = _ready(1) if spec.healthy else UNAVAILABLE
        world.put(WorkloadRef("Deployment", spec.namespace, name), obj)
    return world


specs = st.lists(
    st.builds(
        Spec,
        namespace=st.sampled_from(NAMESPACES),
        consumes=st.lists(st.sampled_from(SOURCES), min_size=1, max_size=3, unique=True).map(tuple),
        wave=st.integers(0, 2),
        healthy=st.booleans(),
    ),
    min_size=1,
    max_size=6,
)
events = st.lists(
    st.one_of(
        st.tuples(st.just("change"), st.sampled_from(SOURCES), st.sampled_from(NAMESPACES)),
        st.tuples(st.just("approve"), st.sampled_from(SOURCES), st.sampled_from(NAMESPACES)),
        st.tuples(st.just("look"), st.just(""), st.just("")),
    ),
    min_size=1,
    max_size=12,
)


def _look(world: World, data: st.DataObject) -> None:
    """Some stale workloads are looked at, some rollouts in flight end: in a drawn order."""
    refs = sorted(world.objs)
    for ref in data.draw(st.permutations(refs)):
        if data.draw(st.booleans()):
            world.ask(ref)
    for ref in sorted(world.in_flight):
        if data.draw(st.booleans()):
            world.end(ref, completes=data.draw(st.booleans()))


def _settle(world: World, data: st.DataObject) -> dict[WorkloadRef, Wait]:
    """Every rollout in flight ends (as drawn), every stale workload is asked again, until
    nothing moves; what each still stale workload then waits for."""
    for _ in range(100):
        rolled = len(world.rolled)
        for ref in sorted(world.in_flight):
            world.end(ref, completes=data.draw(st.booleans()))
        waits = {}
        for ref in sorted(world.objs):
            waiting = world.ask(ref)
            if waiting is not None:
                waits[ref] = waiting
        if len(world.rolled) == rolled and not world.in_flight:
            return waits
    raise AssertionError("the rollouts never settle")


@settings(
    max_examples=int(os.environ.get("LIVENESS_EXAMPLES", "100")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    specs=specs,
    waves=st.sampled_from(WAVES),
    cap=st.integers(0, 2),
    shared=st.frozensets(st.sampled_from(SOURCES)),
    events=events,
    data=st.data(),
)
def test_no_combination_of_changes_leaves_every_rollout_waiting(
    specs: list[Spec],
    waves: str,
    cap: int,
    shared: frozenset[str],
    events: list[tuple[str, str, str]],
    data: st.DataObject,
) -> None:
    world = _world(specs, waves=waves, cap=cap, shared=shared)
    for what, name, ns in events:
        if what == "change":
            world.change(name, ns)
        elif what == "approve":
            world.approve(name, ns)
        else:
            _look(world, data)
    waits = _settle(world, data)
    held = {ref: w for ref, w in waits.items() if w.reason not in FINE}
    assert not held, "\n".join(f"{ref}: {w.reason.value}: {w.why}" for ref, w in held.items())


@settings(
    max_examples=int(os.environ.get("LIVENESS_EXAMPLES", "100")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    specs=st.lists(
        st.builds(
            Spec,
            namespace=st.sampled_from(NAMESPACES),
            consumes=st.lists(st.sampled_from(SOURCES), min_size=1, max_size=3, unique=True).map(
                tuple
            ),
            wave=st.integers(0, 1),
            healthy=st.booleans(),
        ),
        min_size=2,
        max_size=8,
    ),
    waves=st.sampled_from(WAVES),
    changes=st.lists(st.sampled_from(SOURCES), min_size=2, max_size=4),
    data=st.data(),
)
def test_shared_changes_that_reach_the_same_workloads_never_wait_for_each_other(
    specs: list[Spec], waves: str, changes: list[str], data: st.DataObject
) -> None:
    """(The property above, narrowed to what it rarely draws: every source shared across both
    namespaces, more workloads, several changes before anyone is looked at: each change's
    waves across the namespaces meet the others' in many workloads.)"""
    world = _world(specs, waves=waves, shared=frozenset(SOURCES))
    for name in changes:
        world.change(name, A)
    _look(world, data)
    waits = _settle(world, data)
    held = {ref: w for ref, w in waits.items() if w.reason not in FINE}
    assert not held, "\n".join(f"{ref}: {w.reason.value}: {w.why}" for ref, w in held.items())


def test_the_model_rolls_a_change_in_waves_to_completion() -> None:
    """(The world above does what configpin does: a change to five workloads rolls in waves,
    each only once the wave before it completed, and ends with none stale.)"""
    world = _world([Spec("team-a", ("s0",), 0, True) for _ in range(5)], waves="1,10%,100%")
    world.change("s0", "team-a")
    rounds = []
    while True:
        moved = [ref for ref in sorted(world.objs) if world.stale(ref) and world.ask(ref) is None]
        if not moved:
            break
        rounds.append(len(moved))
        for ref in sorted(world.in_flight):
            world.end(ref, completes=True)
    assert rounds == [1, 1, 3]
    assert not any(world.stale(ref) for ref in world.objs)


# --- the combinations found (each waited for ever, or until a resync, before) ---------------


def _ref(name: str) -> WorkloadRef:
    return WorkloadRef("Deployment", A, name)


def _shared_canary(waves: str, cap: int = 0) -> World:
    """`x` (s1 alone, first of its waves), `c` (s0 and s1: first of s0's waves, second of
    s1's), `a` and `b` (s0 alone, after `c`)."""
    specs = [
        Spec(A, ("s1",), -1, True),
        Spec(A, ("s0", "s1"), 0, True),
        Spec(A, ("s0",), 1, True),
        Spec(A, ("s0",), 1, True),
    ]
    return _world(specs, waves=waves, cap=cap, names=["x", "c", "a", "b"])


def _reasons(world: World) -> dict[str, str]:
    """What each stale workload waits for, asked once ("": it rolled)."""
    out = {}
    for ref in sorted(world.objs):
        if world.stale(ref):
            waiting = world.ask(ref)
            out[ref.name] = waiting.reason.value if waiting is not None else ""
    return out


def _completing(world: World) -> dict[str, str]:
    """Every rollout in flight completes, and what is stale is asked again, until nothing
    moves: what each stale workload then waits for."""
    while True:
        for ref in sorted(world.in_flight):
            world.end(ref, completes=True)
        reasons = _reasons(world)
        if "" not in reasons.values() and not world.in_flight:
            return reasons


def test_a_change_whose_canary_shares_a_stopped_change_goes_on_without_it() -> None:
    """s1's canary failed: `c`, in a later wave of s1, rolls nothing more for it, nor for s0
    (it would carry s1's content): s0's waves go on without it, to their end."""
    world = _shared_canary("1,100%")
    world.change("s1", A)
    assert _reasons(world) == {"x": "", "c": "wave"}
    world.end(_ref("x"), completes=False)
    world.change("s0", A)
    assert _reasons(world) == {"c": "wave", "a": "", "b": "wave"}
    assert _completing(world) == {"c": "stopped"}


def test_a_change_whose_canary_awaits_another_changes_approval_goes_on_without_it() -> None:
    """The same with s1's later waves awaiting an approval: s0's canary is another; each
    change goes on as it is approved."""
    world = _shared_canary("1,approve,100%")
    world.change("s1", A)
    assert _reasons(world) == {"x": "", "c": "wave"}
    world.end(_ref("x"), completes=True)
    world.change("s0", A)
    assert _reasons(world) == {"c": "wave", "a": "", "b": "wave"}
    assert _completing(world) == {"c": "approval", "b": "approval"}
    world.approve("s0", A)
    assert _completing(world) == {"c": "approval"}
    world.approve("s1", A)
    assert _completing(world) == {}


def _canary_then(waves: str) -> World:
    """`c` (s0 and s1), the first of s0's waves; `a` and `b` (s0 alone) after it."""
    specs = [Spec(A, ("s0", "s1"), 0, True), Spec(A, ("s0",), 1, True), Spec(A, ("s0",), 2, True)]
    return _world(specs, waves=waves, names=["c", "a", "b"])


def test_a_rollout_overtaken_by_a_change_of_another_source_carries_its_change_on() -> None:
    """The canary rolls s0; s1 changes while it rolls: its next rollout carries s0 on (its pods
    run both): s0's next wave waits for it, then goes on once it completes."""
    world = _canary_then("1,100%")
    world.change("s0", A)
    assert _reasons(world) == {"c": "", "a": "wave", "b": "wave"}
    world.change("s1", A)
    assert _reasons(world) == {"c": "", "a": "wave", "b": "wave"}
    record = rollout_record(HKEY, world.objs[_ref("c")])
    assert record is not None
    assert sorted(c.source.name for c in record.changes) == ["s0", "s1"]
    world.end(_ref("c"), completes=True)
    assert _reasons(world) == {"a": "", "b": ""}


def test_a_canary_that_completed_then_rolled_another_source_keeps_its_wave_complete() -> None:
    world = _canary_then("1,1,100%")
    world.change("s0", A)
    assert _reasons(world) == {"c": "", "a": "wave", "b": "wave"}
    world.end(_ref("c"), completes=True)
    assert _reasons(world) == {"a": "", "b": "wave"}
    world.change("s1", A)  # the canary rolls again, for s1 alone
    assert _reasons(world) == {"c": "", "b": "wave"}
    world.end(_ref("a"), completes=True)
    assert _reasons(world) == {"b": ""}


def test_a_failure_stays_a_verdict_once_the_canary_rolls_another_source() -> None:
    """The canary's rollout of s0 failed (held: its content rejected there); it rolls s1 since:
    s0's waves stay stopped, whatever its record names now."""
    world = _canary_then("1,100%")
    world.change("s0", A)
    assert _reasons(world) == {"c": "", "a": "wave", "b": "wave"}
    world.end(_ref("c"), completes=False)
    assert _reasons(world) == {"a": "stopped", "b": "stopped"}
    world.change("s1", A)
    assert _reasons(world) == {"c": "", "a": "stopped", "b": "stopped"}
    world.end(_ref("c"), completes=False)
    assert _reasons(world) == {"a": "stopped", "b": "stopped"}


def test_a_rollout_in_flight_is_followed_while_its_workload_waits_for_another_change() -> None:
    """Under a cap of one: `c` rolls s0 and holds the place; s1 changes, its canary `x` waits
    for the place and `c` for s1's canary. `c`'s rollout in flight is followed all the same:
    it ends, and frees the place."""
    world = _shared_canary("1,100%", cap=1)
    world.change("s0", A)
    assert _reasons(world) == {"c": "", "a": "wave", "b": "wave"}
    world.change("s1", A)
    assert _reasons(world) == {"x": "cap", "c": "wave", "a": "wave", "b": "wave"}
    world.end(_ref("c"), completes=True)  # (fails here if it is not followed)
    assert _reasons(world)["a"] == ""  # the place it freed


def test_two_shared_changes_that_order_two_members_apart_both_roll() -> None:
    """s0 and s2 are shared across team-a and team-b; `w1` (team-a) and `w2` (team-b) read
    both, `w0` (team-a, not healthy) s0 alone. Both changes roll to their end. (When each
    change took one workload of each namespace in turn over its own members, s0 interleaved
    team-a's (w0, w1) with team-b's (w2), s2 its (w1, w2) otherwise: each change's canary was
    in the other's second wave, and each waited for the other for ever.)"""
    specs = [
        Spec(A, ("s0",), 0, False),
        Spec(A, ("s0", "s2"), 0, True),
        Spec("team-b", ("s0", "s2"), 0, True),
    ]
    world = _world(specs, waves="1,10%,100%", shared=frozenset({"s0", "s2"}))
    world.change("s0", A)
    world.change("s2", A)
    assert _completing(world) == {}
