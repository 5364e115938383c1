"""The waves of a change (`--rollout-waves`): which workloads it reaches, in which order, and
in which wave each one rolls.

A change is one source's new content in one namespace (webhook.core.record.Change), or in
every namespace whose source of that name is marked `configpin.io/shared`. Its members are the
workloads it reaches: those that rolled for it (their rollout record names it, whatever came
of it), those still stale for it that roll (not those that take it in place: on-change
refresh), and those whose rollout for an earlier change of the same source brought them to
what they read of this one (`rollout_for`: a write of keys they do not read moved the source
on, not them). Such a rollout stands for the new change as it stood for the old, rolling,
complete, failed or rolled back by a person: the write restarts, skips and re-opens nothing.
They are ordered the same way on every replica, from what the workloads say (their records,
their `configpin.io/wave`), those that rolled already first, the others in one order that every
change shares (webhook.core.waves.wave_place: no two changes wait for each other), and cut
into waves over those that can vouch for the change (healthy with pods before it); the others
join the last wave, never one before an approval that a canary waits for.
So a new leader carries on where the last one was: a wave may start when every member of the
waves before it that vouches has completed its rollout, never after one failed or was rolled
back by a person. A member scaled to zero, deleted or broken before the change proves nothing
either way.

`WaveCut` is that cut, the one the gate admits by (webhook.controller.waves) and the preview
names (webhook.controller.preview: what a write will roll, in which wave, before it is stored).

The order of a change's members is worked out once (from the index and the source cache, in
memory) and kept until the next resync or leadership, so that rolling a thousand workloads
does not work it out a thousand times; who vouches is read live. The members in a namespace
are kept per version of the index there, for the preview of the next write.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Final, TypeVar

from cachetools import LRUCache

from webhook.controller.index import WorkloadIndex
from webhook.core import digest
from webhook.core.current import (
    RolloutBrief,
    WorkloadEntry,
    WorkloadRef,
    consumed_digest,
    stale_sources,
)
from webhook.core.kinds import workload_kind
from webhook.core.model import SourceId, SourceRecord
from webhook.core.progress import Standing
from webhook.core.record import Change, State
from webhook.core.reloader import left_to_reloader
from webhook.core.waves import (
    Member,
    approval_from,
    cut_waves,
    rolled_first,
    wave_order,
)
from webhook.inputs.sources import Miss
from webhook.kube.cache import SourceCache
from webhook.process.config import Settings

_ORDERS_MAX: Final = 4096  # changes kept by each cache of a WaveCut, the most recently asked
_MEMBERS_MAX: Final = 256  # (namespace, change) member lists kept, the most recently asked

_T = TypeVar("_T")


def member_of(entry: WorkloadEntry) -> Member:
    """What orders a workload among a change's members."""
    ref = entry.ref
    return Member(entry.wave, ref.namespace, ref.kind, ref.name)


def rolled_for(brief: RolloutBrief | None, change: Change) -> bool:
    """Its rollout record names the change: it is one of its members, whatever came of it."""
    return brief is not None and change in brief.changes


def carried(brief: RolloutBrief, change: Change, consumed: str | None) -> bool:
    """`brief` rolled for an earlier change of `change`'s source (in the same namespace, or
    shared as `change` is) to `consumed`, what the workload reads of `change`'s content: the
    source moved on since only in keys it does not read, and that rollout stands for
    `change` too (whatever came of it: rolling, complete, failed, left)."""
    sid = change.source
    return (
        consumed is not None
        and brief.rolled_to(str(sid)) == consumed
        and any(c.source == sid and c.namespace == change.namespace for c in brief.changes)
    )


def vouches(rolled: RolloutBrief | None, standing: Standing) -> bool:
    """Whether a member can prove or disprove a change: it was healthy with pods before it
    (as `rolled`, its rollout that stands for the change, says once it rolled), and is not
    scaled to zero since."""
    if rolled is not None:
        return rolled.healthy and rolled.state is not State.LEFT
    return standing is Standing.HEALTHY


@dataclass(frozen=True, slots=True)
class Elsewhere:
    """A member of a change, as the preview of a write in another namespace shows it."""

    member: Member
    vouches: bool
    approve: bool  # its own wave list holds approve
    state: State | None  # how its rollout for the change stands (None: not rolled yet)

    @property
    def namespace(self) -> str:
        return self.member.namespace

    @property
    def kind(self) -> str:
        return self.member.kind

    @property
    def name(self) -> str:
        return self.member.name


@dataclass(frozen=True)
class _Cut:
    """A change's waves as worked out at one generation of the index."""

    generation: int
    plan: list[list[WorkloadRef]]
    at: dict[WorkloadRef, int]  # the wave of each member
    vouching: list[list[WorkloadRef]]  # the members of each wave that vouch


class WaveCut:
    """The one cut of a change into waves: its members (`member`), their order and the waves
    it is cut into (`waves`), and which waves wait for the change's approval. The gate admits
    by it; the preview names from it what a write will roll, in the wave the gate rolls it."""

    def __init__(
        self,
        index: WorkloadIndex,
        cache: SourceCache,
        hkey: bytes,
        settings: Settings,
        *,
        in_scope: Callable[[str], bool],
    ) -> None:
        """`in_scope(namespace)`: configpin acts there (a workload elsewhere is no member of
        any change: it is never rolled, so it must not hold a wave)."""
        self.index = index
        self.cache = cache
        self.hkey = hkey
        self.in_scope = in_scope
        self.steps = settings.rollout.waves
        self.approval = approval_from(self.steps)  # the first wave (from 0) that waits for it
        self.refresh_pods = settings.rollout.refresh_pods
        self._lock = threading.Lock()  # (the caches below: the gate's workers, the preview)
        self._orders: LRUCache[Change, list[WorkloadRef]] = LRUCache(maxsize=_ORDERS_MAX)
        self._cuts: LRUCache[Change, _Cut] = LRUCache(maxsize=_ORDERS_MAX)
        # (namespace, change) -> (the index's version there, whether its source is at the
        # change, the members there)
        self._members: LRUCache[tuple[str, Change], tuple[int, bool, list[WorkloadEntry]]] = (
            LRUCache(maxsize=_MEMBERS_MAX)
        )
        # change -> (index generation, failed)
        self._failures: LRUCache[Change, tuple[int, bool]] = LRUCache(maxsize=_ORDERS_MAX)
        self._local = threading.local()  # (working out a hold: no hold within it)
        # change -> (index generation, the wave of each member, as `held` works it out)
        self._held_cuts: LRUCache[Change, tuple[int, dict[WorkloadRef, int]]] = LRUCache(
            maxsize=_ORDERS_MAX
        )

    def forget(self) -> None:
        """Work every change's membership out again (a resync, a new leadership)."""
        with self._lock:
            self._orders.clear()
            self._cuts.clear()
            self._members.clear()
            self._failures.clear()
            self._held_cuts.clear()

    # --- what a change is
    def peek(self, namespace: str, sid: SourceId) -> SourceRecord | None:
        found = self.cache.peek(namespace, sid)
        return None if isinstance(found, Miss) else found

    def change(self, namespace: str, sid: SourceId) -> Change | None:
        """The change a source of `namespace` is at (None: it does not exist)."""
        record = self.peek(namespace, sid)
        return None if record is None else self.change_to(namespace, sid, record)

    def change_to(self, namespace: str, sid: SourceId, record: SourceRecord) -> Change:
        """The change a source of `namespace` is at when it holds `record` (as written)."""
        content = digest.source_digest(self.hkey, record)
        return Change.of(namespace, sid, content, shared=record.shared)

    # --- its members
    def in_place(self, entry: WorkloadEntry, sid: SourceId) -> bool:
        """`entry` takes a change of `sid` in place (on-change: refresh, through whole-volume
        mounts only): its pods are refreshed, nothing rolls, it is no member of the waves."""
        delivery = entry.delivery
        if not self.refresh_pods or delivery is None or not delivery.refreshes:
            return False
        kind = workload_kind(entry.ref.kind)
        return str(sid) in delivery.refreshes and kind is not None and kind.refreshable

    def rollout_for(self, entry: WorkloadEntry, change: Change) -> RolloutBrief | None:
        """The rollout of `entry` that stands for `change`: its record names it, or names an
        earlier change of the same source and rolled it to what it reads of `change`'s
        content (`carried`); None: it has not rolled for it."""
        brief = entry.rollout
        if brief is None or change in brief.changes:
            return brief
        if brief.rolled_to(str(change.source)) is None:
            return None  # (it rolled no content of that source)
        ns, sid = entry.ref.namespace, change.source
        if self.change(ns, sid) != change:
            return None
        consumed = consumed_digest(entry, sid, lambda s: self.peek(ns, s), self.hkey)
        return brief if carried(brief, change, consumed) else None

    def member(self, entry: WorkloadEntry, change: Change, at: bool) -> bool:
        """Whether `entry` is a member of `change`; `at`: its namespace's source is at it."""
        if rolled_for(entry.rollout, change):
            return True
        if not at or self.in_place(entry, change.source):
            return False
        if self.rejected(entry, change):
            return True
        ns = entry.ref.namespace

        def peek(sid: SourceId) -> SourceRecord | None:
            return self.peek(ns, sid)

        if change.source in stale_sources(entry, peek, self.hkey):
            # (one that Reloader rolls for it is Reloader's: it holds no wave of configpin's)
            return not left_to_reloader(entry.reloader, (change.source,), peek, entry.recorded_for)
        return self.rollout_for(entry, change) is not None

    def rejected(self, entry: WorkloadEntry, change: Change) -> bool:
        """A rollout of `change` failed on `entry`, whose record has moved on since (a rollout
        of another source): its content is recorded as rejected there. The verdict stands, so
        that the waves it stopped stay stopped. (Content rejected on a workload with no record
        of a rollout since is not a member's failure: it holds that workload alone.)"""
        sid = change.source
        if entry.rollout is None or self.rollout_for(entry, change) is not None:
            return False
        found = entry.rejected.get(str(sid))
        if found is None:
            return False
        ns = entry.ref.namespace
        record = self.peek(ns, sid)
        if record is None or self.change_to(ns, sid, record) != change:
            return False
        keys = next((c.keys for c in entry.consumes if c.source == sid), None)
        return found == digest.source_digest(digest.namespace_key(self.hkey, ns), record, keys)

    def state(self, ref: WorkloadRef, change: Change) -> State | None:
        """How `ref`'s rollout of `change` stands (None: it has not rolled it)."""
        entry = self.index.get(ref)
        if entry is None or entry.rollout is None:
            return None  # (no record: it has not rolled the change)
        rolled = self.rollout_for(entry, change)
        if rolled is not None:
            return rolled.state
        if self.rejected(entry, change):
            return State.FAILED
        ns, sid = ref.namespace, change.source
        if self.change(ns, sid) == change and sid not in stale_sources(
            entry, lambda s: self.peek(ns, s), self.hkey
        ):
            # Its template holds the change's content and its record is about a later
            # rollout (of another source; one still in flight or unproven carries the change
            # on, webhook.controller.restamp): the change's own rollout there completed.
            return State.COMPLETE
        return None

    def approved(self, namespace: str, change: Change) -> bool:
        """The change's content was approved (`configpin approve`, recorded and signed by
        admission on the source) in the workload's namespace."""
        record = self.peek(namespace, change.source)
        return record is not None and record.approved == change.content

    def approved_now(self, namespace: str, change: Change) -> bool:
        """The change's content was approved with `approve --now`: it rolls now, whatever its
        windows and budget say."""
        record = self.peek(namespace, change.source)
        return record is not None and record.approved_now == change.content

    def paused(self, namespace: str, change: Change) -> str | None:
        """Who paused the change's content, and when (`configpin pause`, recorded and signed
        by admission on the source, for this very content); None: it is not paused."""
        record = self.peek(namespace, change.source)
        if record is None or record.paused_by is None:
            return None
        return record.paused_by if self.change(namespace, change.source) == change else None

    def aborted(self, namespace: str, change: Change) -> str | None:
        """Who aborted the change's content, and when (`configpin abort`, as `paused`)."""
        record = self.peek(namespace, change.source)
        if record is None or record.aborted_by is None:
            return None
        return record.aborted_by if self.change(namespace, change.source) == change else None

    def retried(self, namespace: str, change: Change) -> tuple[float, str] | None:
        """When and by whom `configpin retry` of the change's content was said, as `paused`."""
        record = self.peek(namespace, change.source)
        if record is None or record.retried is None:
            return None
        return record.retried if self.change(namespace, change.source) == change else None

    def held(self, entry: WorkloadEntry, change: Change) -> bool:
        """`entry` is stale for another change too, one that may not roll there now for a
        reason only a person ends (a failure stopped it; it awaits an approval): it rolls
        neither (it would carry that content), so it proves nothing for `change` either and
        leaves its waves for the last one; the next member takes its place. (Without this, a
        change whose canary shares such a change waits for ever: every rollout waiting.)
        Worked out over the other change's own waves as they stand without such holds. (The
        preview, which cuts a write's waves before it is stored, does not hold members back.)"""
        if len(entry.uses) < 4 or getattr(self._local, "holding", False):
            return False  # (one source: no other change to be held by)
        ns = entry.ref.namespace
        self._local.holding = True
        try:
            for sid in stale_sources(entry, lambda s: self.peek(ns, s), self.hkey):
                other = self.change(ns, sid)
                if other is None or other == change or self.rollout_for(entry, other):
                    continue
                if self.steps is not None and self._failed(other):
                    return True
                if not self.approved(ns, other) and self._after_approve(entry, other):
                    return True
            return False
        finally:
            self._local.holding = False

    def _failed(self, change: Change) -> bool:
        """A member that vouched for `change` failed it (the waves after it are stopped)."""
        generation = self.index.generation
        with self._lock:
            found = self._failures.get(change)
        if found is not None and found[0] == generation:
            return found[1]
        failed = any(
            self.state(r, change) is State.FAILED and self.vouches(r, change)
            for r in self.order(change)
        )
        with self._lock:
            self._failures[change] = (generation, failed)
        return failed

    def _after_approve(self, entry: WorkloadEntry, change: Change) -> bool:
        """`entry` rolls `change` only once it is approved (its own wave list, or a wave after
        `approve`)."""
        if entry.delivery is not None and entry.delivery.approve:
            return True
        if self.steps is None or self.approval is None:
            return False
        generation = self.index.generation
        with self._lock:
            found = self._held_cuts.get(change)
        if found is None or found[0] != generation:  # (once per change and index generation)
            plan = self.plan(change)
            found = (generation, {ref: i for i, wave in enumerate(plan) for ref in wave})
            with self._lock:
                self._held_cuts[change] = found
        return self.after_approve(found[1].get(entry.ref, self.approval))

    def namespaces(self, change: Change) -> list[str]:
        """The namespaces a change can reach, where configpin acts."""
        sid = change.source
        found = self.index.namespaces_of(sid) if change.shared else [change.namespace]
        return [ns for ns in found if self.in_scope(ns)]

    def members_in(self, namespace: str, change: Change) -> list[WorkloadEntry]:
        """The members of `change` in `namespace` (worked out again once a workload there
        moved, or its source did)."""
        sid = change.source
        at = self.change(namespace, sid) == change
        version = self.index.version(namespace)
        key = (namespace, change)
        with self._lock:
            found = self._members.get(key)
            if found is not None and found[0] == version and found[1] == at:
                return found[2]
        members = [e for e in self.index.consumers(namespace, sid) if self.member(e, change, at)]
        with self._lock:
            self._members[key] = (version, at, members)
        return members

    def elsewhere(self, change: Change, namespace: str) -> list[Elsewhere]:
        """The members of a shared change outside `namespace` (none for a namespace's own)."""
        if not change.shared:
            return []
        out = []
        for ns in self.namespaces(change):
            if ns == namespace:
                continue
            for entry in self.members_in(ns, change):
                rolled, delivery = self.rollout_for(entry, change), entry.delivery
                out.append(
                    Elsewhere(
                        member_of(entry),
                        vouches(rolled, entry.standing),
                        delivery is not None and delivery.approve,
                        rolled.state if rolled is not None else None,
                    )
                )
        return out

    def order(self, change: Change, refresh: bool = False) -> list[WorkloadRef]:
        """The members of a change, in the order they roll: those that rolled for it already
        first (`rolled_first`), so that a member that joins late never takes a wave from one
        that rolled."""
        with self._lock:
            found = self._orders.get(change)
        if found is not None and not refresh:
            return found
        entries = {
            member_of(e): e for ns in self.namespaces(change) for e in self.members_in(ns, change)
        }
        rolled = {m for m, e in entries.items() if self.rollout_for(e, change) is not None}
        ordered = [
            WorkloadRef(m.kind, m.namespace, m.name)
            for m in rolled_first(wave_order(entries), rolled.__contains__)
        ]
        with self._lock:
            self._orders[change] = ordered
        return ordered

    # --- its waves
    def waves(self, ordered: Sequence[_T], vouch: Callable[[_T], bool]) -> list[list[_T]]:
        """Members in the order they roll, cut into the waves of `--rollout-waves`."""
        return cut_waves(ordered, vouch, self.steps)

    def after_approve(self, wave: int) -> bool:
        """Wave `wave` (from 0) waits for the change's approval."""
        return self.approval is not None and wave >= self.approval

    def vouches(self, ref: WorkloadRef, change: Change) -> bool:
        """(`vouches`), and a member that may not roll it now for another change's sake
        (`held`) proves nothing; one that failed it proves it failed, whatever it rolled
        since (`rejected`)."""
        entry = self.index.get(ref)
        if entry is None:
            return False  # deleted: it proves nothing
        rolled = self.rollout_for(entry, change)
        if rolled is None:
            if self.rejected(entry, change):
                return True
            if self.held(entry, change):
                return False
        return vouches(rolled, entry.standing)

    def plan(self, change: Change, refresh: bool = False) -> list[list[WorkloadRef]]:
        return self.waves(self.order(change, refresh), lambda r: self.vouches(r, change))

    def current(self, change: Change, refresh: bool = False) -> _Cut:
        """The waves of a change, worked out again only when the index moved since (a
        thousand members asking one after another cost one pass over them, not a thousand)."""
        generation = self.index.generation
        with self._lock:
            found = self._cuts.get(change)
        if found is not None and found.generation == generation and not refresh:
            return found
        plan = self.plan(change, refresh)
        cut = _Cut(
            generation,
            plan,
            {ref: i for i, wave in enumerate(plan) for ref in wave},
            [[r for r in wave if self.vouches(r, change)] for wave in plan],
        )
        with self._lock:
            self._cuts[change] = cut
        return cut


def carried_on(
    entry: WorkloadEntry, stale: Collection[SourceId], changes: tuple[Change, ...]
) -> tuple[Change, ...]:
    """The changes of the workload's last rollout that a new rollout of other sources carries
    on, unproven there and its pods running their content too: one still in flight, one that
    left (scaled to zero), one that failed with nothing recorded as rejected (on-failure:
    none). What comes of the new rollout comes of them as well: a later wave of theirs waits
    for it, or stays stopped. (Without them, their waves would wait for a rollout that no
    record names any more; or count it complete, as they count a member whose record moved
    on from a change it completed, webhook.controller.wavecut.) A failure that recorded its
    content as rejected is remembered by that record; a change whose source changes again is
    superseded."""
    brief = entry.rollout
    if brief is None or brief.state is State.COMPLETE:
        return ()
    consumed = {c.source for c in entry.consumes}
    rejected = entry.rejected
    return tuple(
        c
        for c in brief.changes
        if c not in changes
        and c.source in consumed
        and c.source not in stale
        and (brief.state is not State.FAILED or str(c.source) not in rejected)
    )
