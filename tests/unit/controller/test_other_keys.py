"""A write of keys a workload does not read (webhook/controller/waves.py's `rollout_for`, the
preview that cuts the same waves, and who a rollout is credited to): it never restarts, skips or
re-attributes what is rolling.

Each case is one namespace's ConfigMap `cfg` and Deployments reading some of its keys, written
as admission stores the writes (with its record of who made them) and rolled as the controller
decides (the re-stamp decision, the gate, the follower, who made it), with no API server: the
source is read from memory.
"""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Mapping
from typing import Any

import jsonpatch

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
from webhook.controller.editors import Editors
from webhook.controller.follow import Follower
from webhook.controller.index import WorkloadIndex
from webhook.controller.preview import Previewer
from webhook.controller.reconcile import Prelude
from webhook.controller.restamp import Restamper
from webhook.controller.waves import Gate
from webhook.core import digest
from webhook.core.audit import APPROVED, ChangedBy
from webhook.core.constants import ANN_APPROVED, ANN_CHANGED_BY, ANN_WAVE
from webhook.core.current import WorkloadRef, entry_from_object
from webhook.core.kinds import builtin
from webhook.core.model import JSONObject, SourceId, SourceKind
from webhook.core.preview import Effect, source_write
from webhook.core.record import State, rollout_record
from webhook.core.waves import WaitReason
from webhook.process.config import Settings
from webhook.server.admission import Review
from webhook.server.writes import SourceWrites

NS = "shop"
CFG = SourceId(SourceKind.CONFIGMAP, "cfg")
NOW = 1_800_000_000.0
DEPLOYMENT = builtin("Deployment")
assert DEPLOYMENT is not None
CANARY = {ANN_WAVE: "-1"}  # first, alone in the first wave


class Kube:
    """The API server, as the editor read asks it: the source as stored."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def get(self, _path: str, **_params: Any) -> JSONObject:
        return copy.deepcopy(self.store.objects[CFG])


class NoPods:
    """No pod is listed or refreshed here."""

    def running(self, _ref: WorkloadRef, _obj: JSONObject) -> list[JSONObject]:
        return []

    def refresh(self, *_: Any) -> int:
        return 0

    def catch_up(self, *_: Any) -> None:
        return None


class World:
    """ConfigMap `cfg` of namespace `shop` and Deployments reading some of its keys, under
    `--rollout-waves waves`."""

    def __init__(
        self,
        readers: Mapping[str, tuple[str, ...]],
        *,
        waves: str,
        notes: Mapping[str, Mapping[str, str]] | None = None,
    ) -> None:
        self.store = Store([configmap("cfg", {"a": "1", "b": "1"}, namespace=NS)])
        self.index = WorkloadIndex()
        self.objs: dict[str, JSONObject] = {}
        self.clock = NOW
        for name, keys in readers.items():
            env = [env_cm("cfg", k, var=k.upper()) for k in keys]
            annotations = dict((notes or {}).get(name, {}))
            obj = workload(
                "Deployment", pod_spec(container(env=env)), name=name, namespace=NS,
                annotations=annotations,
            )  # fmt: skip
            obj["status"] = {"conditions": [{"type": "Available", "status": "True"}]}
            self.put(admitted(obj, self.store))
        settings = Settings(rollout_waves=waves)
        self.gate = Gate(
            self.index, StoreCache({NS: self.store}), HKEY, settings, in_scope=lambda _ns: True
        )
        self.previewer = Previewer(self.gate.cut, ready=lambda: True)
        self.follower = Follower(
            HKEY, is_copy=lambda _ns, _sid, _name: False, changed_keys=lambda _ns, _sid: None
        )
        self.restamper = Restamper(
            HKEY,
            settings,
            copies=False,
            is_leader=lambda: True,
            follower=self.follower,
            gate=self.gate,
            wall=lambda: self.clock,
        )
        self.editors = Editors(Kube(self.store), HKEY).of  # type: ignore[arg-type]

    def put(self, obj: JSONObject) -> None:
        self.objs[obj["metadata"]["name"]] = obj
        found = entry_from_object(obj, "checksum", hkey=HKEY)
        assert not isinstance(found, str), found
        self.index.put(found)

    def ref(self, name: str) -> WorkloadRef:
        return WorkloadRef("Deployment", NS, name)

    def _review(self, old: JSONObject, new: JSONObject, user: str) -> Review:
        request = {
            "uid": "u-1",
            "kind": {"group": "", "version": "v1", "kind": "ConfigMap"},
            "operation": "UPDATE",
            "namespace": NS,
            "userInfo": {"username": user},
            "object": new,
            "oldObject": old,
        }
        return Review(api_version="admission.k8s.io/v1", uid="u-1", request=request)

    def write(self, user: str, data: Mapping[str, str]) -> list[Any]:
        """`user` writes `cfg`'s data, as admission stores it (kubectl's merge patch: the
        annotations it had go with it); the preview's rows of that write."""
        self.clock += 60
        old = self.store.objects[CFG]
        new = copy.deepcopy(old)
        new["data"] = dict(data)
        write = source_write(HKEY, CFG.kind, "UPDATE", old, new)
        rows = self.previewer.rows(NS, CFG, write.changed, write.record)
        writes = SourceWrites(HKEY, None, clock=lambda: self.clock)
        out, _ = writes.review(self._review(old, new, user), write)
        text = out["response"].get("patch")
        if text:
            new = jsonpatch.apply_patch(new, json.loads(base64.b64decode(text)))
        self.store.put(new)
        assert rows is not None
        return rows

    def approve(self, user: str = "rm") -> None:
        """`kubectl configpin approve configmap/cfg`: the record admission signs, for the
        content `cfg` holds now."""
        obj = self.store.objects[CFG]
        content = digest.source_digest(HKEY, digest.record_from_object(HKEY, CFG.kind, obj))
        text = ChangedBy(user, self.clock, content[:20]).encode(HKEY, NS, CFG, domain=APPROVED)
        obj["metadata"].setdefault("annotations", {})[ANN_APPROVED] = text
        self.store.put(obj)

    def decide(self, name: str) -> Decision:
        """The controller's decision on `name` as it stands; what it writes is stored."""
        obj = copy.deepcopy(self.objs[name])
        ref = self.ref(name)
        lookup = self.store.lookup
        assert DEPLOYMENT is not None
        work = Prelude(
            self.restamper, NoPods(), None, ref, DEPLOYMENT, lookup, lookup, editors=self.editors
        )
        decision = work.decide(obj)
        self.restamper.done(ref)
        if decision.ops:
            self.put(jsonpatch.apply_patch(obj, decision.ops))
        return decision

    def rolls(self, name: str) -> Decision:
        decision = self.decide(name)
        assert decision.rollout is not None, (name, decision)
        return decision

    def waits(self, name: str) -> WaitReason:
        """Why `name`, stale, does not roll (its decision on it)."""
        decision = self.decide(name)
        assert decision.waiting is not None, (name, decision.rollout, decision.skip)
        return decision.waiting.reason

    def ends(self, name: str, state: State) -> None:
        """`name`'s rollout ends as the follower ends it: complete, or failed (held, its
        content rejected there: checksum mode's default)."""
        obj = copy.deepcopy(self.objs[name])
        record = rollout_record(HKEY, obj)
        assert record is not None and record.state is State.ROLLING
        assert DEPLOYMENT is not None
        if state is State.COMPLETE:
            ops, _ = self.follower.complete(obj, record)
        else:
            ops, _ = self.follower.failed(
                self.ref(name), obj, DEPLOYMENT, record, "checksum", "ProgressDeadlineExceeded"
            )
        self.put(jsonpatch.apply_patch(obj, ops))

    def by(self, name: str) -> str:
        record = rollout_record(HKEY, self.objs[name])
        assert record is not None
        return record.by

    def previewed(self, rows: list[Any]) -> dict[str, tuple[Effect, int]]:
        return {r.name: (r.action, r.wave) for r in rows}


def _later_waves(waves: str = "1,approve,100%") -> World:
    readers = {"canary": ("a",), "later-0": ("a",), "later-1": ("a",)}
    return World(readers, waves=waves, notes={"canary": CANARY})


def test_a_write_of_a_key_nobody_reads_rolls_nothing_that_awaits_an_approval() -> None:
    """alice changes `a`, the canary rolls it and completes, the rest await the change's
    approval; bob changes `b`, which nobody reads. The canary's rollout stands for bob's
    change too (what it reads is what it rolled to): no one becomes the canary of bob's
    change, both later workloads still await an approval (of the content they will roll to),
    and bob's preview says so. Approved, they roll alice's content, credited to her."""
    world = _later_waves()
    world.write("alice", {"a": "2", "b": "1"})
    world.rolls("canary")
    world.ends("canary", State.COMPLETE)
    assert world.waits("later-0") is WaitReason.APPROVAL
    assert world.waits("later-1") is WaitReason.APPROVAL

    rows = world.write("bob", {"a": "2", "b": "2"})
    assert world.decide("canary").rollout is None
    assert world.waits("later-0") is WaitReason.APPROVAL  # (main: it rolled, as bob's canary)
    assert world.waits("later-1") is WaitReason.APPROVAL
    assert world.previewed(rows) == {  # (what bob's kubectl was told, as the gate does it)
        "canary": (Effect.NOTHING, 0),
        "later-0": (Effect.AWAIT, 2),
        "later-1": (Effect.AWAIT, 2),
    }

    world.approve()
    for name in ("later-0", "later-1"):
        world.rolls(name)
        assert world.by(name).startswith("alice at "), world.by(name)


def test_content_that_failed_on_the_canary_reaches_no_later_wave_after_a_write_of_another_key() -> (
    None
):
    """alice's change of `a` fails on the canary (held: its content rejected there), which
    stops the later waves; bob changes `b`, which nobody reads. The canary's failure stands
    for bob's change too: neither later workload rolls the content that failed, approved or
    not. A new content of `a` rolls as usual, from the canary."""
    world = _later_waves("1,100%")
    world.write("alice", {"a": "2", "b": "1"})
    world.rolls("canary")
    world.ends("canary", State.FAILED)
    assert world.waits("later-0") is WaitReason.STOPPED

    world.write("bob", {"a": "2", "b": "2"})
    assert world.decide("canary").rollout is None  # (held on the content it rejected)
    assert world.waits("later-0") is WaitReason.STOPPED  # (main: it rolled the rejected content)
    assert world.waits("later-1") is WaitReason.STOPPED

    world.write("carol", {"a": "3", "b": "2"})
    assert world.waits("later-0") is WaitReason.WAVE
    assert world.rolls("canary").rollout.by.startswith("carol at ")  # type: ignore[union-attr]


def test_a_canary_still_rolling_goes_on_and_keeps_its_wave_and_its_place() -> None:
    """bob changes `b` while the canary rolls alice's `a`: its rollout goes on (not re-stamped,
    not superseded: it still holds its place under --max-rolling), and the others wait for it
    to complete, not for a canary of bob's change. A reader of `b` alone, ordered before the
    canary (configpin.io/wave -2), joins bob's change after the canary, not in its place: what
    reads `a` never rolls before the canary proved it."""
    readers = {"canary": ("a",), "later": ("a",), "b-reader": ("b",)}
    notes = {"canary": CANARY, "b-reader": {ANN_WAVE: "-2"}}
    world = World(readers, waves="1,100%", notes=notes)
    world.write("alice", {"a": "2", "b": "1"})
    world.rolls("canary")
    assert world.waits("later") is WaitReason.WAVE

    world.write("bob", {"a": "2", "b": "2"})
    assert world.decide("canary").rollout is None  # followed, not re-stamped
    assert world.waits("b-reader") is WaitReason.WAVE  # (main: it rolled, as bob's canary)
    assert world.waits("later") is WaitReason.WAVE
    assert not world.gate.superseded(world.index.get(world.ref("canary")))  # type: ignore[arg-type]
    assert world.gate.in_flight(NS) == 1
    world.ends("canary", State.COMPLETE)
    assert world.rolls("b-reader").rollout.by.startswith("bob at ")  # type: ignore[union-attr]
    assert world.rolls("later").rollout.by.startswith("alice at ")  # type: ignore[union-attr]


def test_a_rollout_is_credited_to_who_made_what_it_reads_not_to_the_last_writer() -> None:
    """Without waves, alice changes `a` and bob `b` before the controller rolls anything (two
    writes within the coalescing window): the reader of `a` is credited to alice, the reader
    of `b` to bob, a reader of both to bob, the last to change one of them; carol's change of
    `a` then is hers. The source's record says which keys each write changed."""
    readers = {"a-reader": ("a",), "b-reader": ("b",), "both": ("a", "b")}
    world = World(readers, waves="off")
    world.write("alice", {"a": "2", "b": "1"})
    world.write("bob", {"a": "2", "b": "2"})
    by = {name: world.rolls(name).rollout.by for name in readers}  # type: ignore[union-attr]
    assert by["a-reader"].startswith("alice at "), by  # (main: bob)
    assert by["b-reader"].startswith("bob at "), by
    assert by["both"].startswith("bob at "), by

    world.write("carol", {"a": "3", "b": "2"})
    assert world.rolls("a-reader").rollout.by.startswith("carol at ")  # type: ignore[union-attr]
    record = digest.record_from_object(HKEY, CFG.kind, world.store.objects[CFG])
    text = world.store.objects[CFG]["metadata"]["annotations"][ANN_CHANGED_BY]
    content = digest.source_digest(HKEY, record)[:20]
    said = ChangedBy.decode(HKEY, NS, CFG, text, content)
    assert said is not None and said.user == "carol" and said.keys == ("a",)
    assert [(e.user, e.keys) for e in said.earlier] == [("bob", ("b",))]


def test_the_record_of_who_changed_it_stays_a_record_configpin_believes() -> None:
    """However many keys and writers: what would not fit is left out (the oldest writers
    first: their keys' rollouts are credited to `unknown`, never to another), the record is
    believed as configpin made it, and one made before it said keys credits every key to its
    writer, as it always did."""
    record = ChangedBy.first("w0", NOW, "c" * 20, frozenset({"k0"}))
    for i in range(1, 400):
        record = record.after(f"writer-{i}", NOW + i, "c" * 20, frozenset({f"key-{i:04d}"}))
    text = record.encode(HKEY, NS, CFG)
    assert len(text) <= 4096
    assert ChangedBy.decode(HKEY, NS, CFG, text, "c" * 20) == record
    assert record.made(frozenset({"key-0399"})) == record.said()
    assert (record.made(frozenset({"key-0398"})) or "").startswith("writer-398 at ")
    assert record.made(frozenset({"k0"})) is None  # (left out: unknown)
    many = frozenset(f"key-{i:05d}-{'x' * 40}" for i in range(200))
    assert ChangedBy.first("bulk", NOW, "c" * 20, many).keys is None  # (credited with all)

    old = ChangedBy("alice", NOW, "c" * 20)  # as records were before they said keys
    assert set(json.loads(old.encode(HKEY, NS, CFG))) == {"at", "content", "sig", "user"}
    assert old.made(frozenset({"x"})) == old.said()
    carried = old.after("bob", NOW + 1, "d" * 20, frozenset({"b"}))
    assert carried.made(frozenset({"a"})) == old.said()  # (every key but bob's)
    assert carried.made(frozenset({"b"})) == carried.said()
