"""Which stale workloads may roll now (the gate): the waves of each change, as WaveCut cuts
them (webhook.controller.wavecut), and the cap on rollouts in flight (`--max-rolling`).

The cap counts, per namespace (a tenant's rollouts never wait for another's), the rollouts
configpin follows there, less those that hold no place: paused, or superseded by a newer change
of their source (which rolls at once). A place is reserved for a rollout being started until
its write is in the index, so that workers asking at once each see the places the others took.
`Waiting` remembers who waits for a rollout to end (a later wave, a place), to look at them
again when one does.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Final

from webhook.controller.index import WorkloadIndex
from webhook.controller.limits import RolloutLimits
from webhook.controller.wavecut import WaveCut
from webhook.core.current import WorkloadEntry, WorkloadRef
from webhook.core.model import SourceId
from webhook.core.record import Change, State
from webhook.core.waves import Wait, WaitReason
from webhook.kube.cache import SourceCache
from webhook.process.config import Settings

_RESERVED_FOR: Final = 60.0  # seconds a place stays reserved for a rollout being started


class Gate:
    def __init__(
        self,
        index: WorkloadIndex,
        cache: SourceCache,
        hkey: bytes,
        settings: Settings,
        *,
        in_scope: Callable[[str], bool],
        limits: RolloutLimits | None = None,
    ) -> None:
        """`in_scope(namespace)`: configpin acts there (see WaveCut); `limits`: its rollout
        windows and budget (None: none)."""
        self.index = index
        self.limits = limits
        self.cut = WaveCut(index, cache, hkey, settings, in_scope=in_scope)
        self.steps = self.cut.steps
        self.cap = settings.rollout.max_rolling
        self._lock = threading.Lock()
        # Places taken by rollouts being started, until their write is in the index (several
        # workers ask at once: each must see the places the others took).
        self._reserved: dict[WorkloadRef, float] = {}
        self._place = threading.Lock()

    def forget(self) -> None:
        """Work every change's membership out again (a resync, a new leadership)."""
        self.cut.forget()

    def changes(self, namespace: str, stale: Iterable[SourceId]) -> tuple[Change, ...]:
        """The changes the stale sources of a workload of `namespace` are at."""
        found = (self.cut.change(namespace, sid) for sid in sorted(stale))
        return tuple(c for c in found if c is not None)

    def superseded(self, entry: WorkloadEntry) -> bool:
        """Its rollout rolled to content a source has moved on from since, in what the
        workload reads of it: a newer change rolls it, and the old rollout holds nothing up.
        (One that moved on only in keys it does not read goes on: it stands for the newer
        change too.)"""
        brief = entry.rollout
        if brief is None:
            return False
        ns = entry.ref.namespace
        for c in brief.changes:
            now = self.cut.change(ns, c.source)
            if now != c and (now is None or self.cut.rollout_for(entry, now) is None):
                return True
        return False

    def _state(self, ref: WorkloadRef, change: Change) -> State | None:
        return self.cut.state(ref, change)

    def in_flight(self, namespace: str, but: WorkloadRef | None = None) -> int:
        """The config rollouts in flight in a namespace that hold a place (--max-rolling):
        those the index says configpin follows there, and those being started."""
        holding = {
            entry.ref
            for entry in self.index.rolling(namespace)
            if entry.ref != but and not entry.paused and not self.superseded(entry)
        }
        now = time.monotonic()
        with self._lock:
            for ref, since in list(self._reserved.items()):
                if now - since > _RESERVED_FOR:
                    del self._reserved[ref]  # (its reconcile never said it was done)
                elif ref.namespace == namespace and ref != but:
                    holding.add(ref)
        return len(holding)

    def release(self, ref: WorkloadRef) -> None:
        """The rollout `ref` was admitted for is written (and indexed), or not made."""
        with self._lock:
            self._reserved.pop(ref, None)

    # --- the gate
    def admit(
        self, ref: WorkloadRef, stale: Iterable[SourceId], entry: WorkloadEntry | None = None
    ) -> tuple[tuple[Change, ...], Wait | None]:
        """The changes a stale workload would roll to, and why it may not now (None: it may).
        `entry`: the workload as read (its windows, budget and starts; default the index's)."""
        changes = self.changes(ref.namespace, stale)
        return changes, self.wait(ref, changes, entry)

    def wait(
        self, ref: WorkloadRef, changes: Sequence[Change], entry: WorkloadEntry | None = None
    ) -> Wait | None:
        """Why `ref` may not roll to `changes` now: its rollout windows (said first: a
        later wave's member in a closed window waits for it, whatever the waves before), an
        earlier wave, an approval, its rollout budget, the cap; None: it may, and (under a
        cap) a place is reserved for it until `release`."""
        limits, ns = self.limits, ref.namespace
        if limits is not None and entry is None:
            entry = self.index.get(ref)
        now = lambda c: self.cut.approved_now(ns, c)  # noqa: E731
        waiting = self._paused(ref, changes)  # (a person's word, said before any clock's)
        if waiting is None and entry is not None:
            waiting = self._windows(entry, changes)
        if waiting is None:
            waiting = self._waves(ref, changes)
        if waiting is None and limits is not None and entry is not None:
            waiting = limits.budget_hold(
                entry, changes, approved=lambda c: self.approved(ns, c), approved_now=now
            )
        if waiting is not None or not self.cap:
            return waiting
        with self._place:  # (one at a time: what is counted is what is reserved)
            busy = self.in_flight(ref.namespace, but=ref)
            if busy >= self.cap:
                return Wait(
                    WaitReason.CAP,
                    f"{busy} config rollouts are in flight in namespace {ref.namespace}, the "
                    f"most configpin starts at once in one namespace (--max-rolling {self.cap})",
                )
            with self._lock:
                self._reserved[ref] = time.monotonic()
        return None

    def place(self, ref: WorkloadRef, changes: Sequence[Change]) -> tuple[int, int] | None:
        """(under --rollout-waves) The wave, from 1, of how many, that `ref` rolls in for the
        first of `changes` (what its rollout record keeps); None: no waves, or it is no member
        of that change's waves."""
        if self.steps is None or not changes:
            return None
        cut = self.cut.current(changes[0])
        at = cut.at.get(ref)
        return None if at is None else (at + 1, len(cut.plan))

    def window_wait(self, entry: WorkloadEntry, stale: Iterable[SourceId]) -> Wait | None:
        """Why its rollout windows hold `entry`'s rollout to `stale` now (None: they do not):
        the gate's first question, asked of memory alone."""
        return self._windows(entry, self.changes(entry.ref.namespace, stale))

    def _windows(self, entry: WorkloadEntry, changes: Sequence[Change]) -> Wait | None:
        if self.limits is None:
            return None
        ns = entry.ref.namespace
        return self.limits.window_hold(
            entry, changes, approved_now=lambda c: self.cut.approved_now(ns, c)
        )

    def approved(self, namespace: str, change: Change) -> bool:
        return self.cut.approved(namespace, change)

    def _paused(self, ref: WorkloadRef, changes: Iterable[Change]) -> Wait | None:
        """A change paused or aborted by a person (`configpin pause`, `abort` of the content
        it is at): no rollout of it starts, whatever its wave; one started is followed to the
        end (an abort's undo is the restamper's)."""
        for change in changes:
            sid = change.source
            who = self.cut.aborted(ref.namespace, change)
            if who is not None:
                return Wait(
                    WaitReason.ABORTED,
                    f"{change} is aborted by {who}: kubectl configpin retry "
                    f"{sid.kind.value}/{sid.name} -n {ref.namespace} rolls it again",
                )
            who = self.cut.paused(ref.namespace, change)
            if who is not None:
                return Wait(
                    WaitReason.PAUSED,
                    f"{change} is paused by {who}: kubectl configpin resume "
                    f"{sid.kind.value}/{sid.name} -n {ref.namespace}",
                )
        return None

    def _unapproved(
        self, ref: WorkloadRef, change: Change, wave: str, at: tuple[int, int] | None
    ) -> Wait:
        sid = change.source
        return Wait(
            WaitReason.APPROVAL,
            f"{change} waits for an approval ({wave}): kubectl configpin approve "
            f"{sid.kind.value}/{sid.name} -n {ref.namespace}",
            wave=at[0] if at else None,
            waves=at[1] if at else None,
        )

    def _waves(self, ref: WorkloadRef, changes: Iterable[Change]) -> Wait | None:
        entry = self.index.get(ref)
        own = entry is not None and entry.delivery is not None and entry.delivery.approve
        for change in changes:
            after_approve, at = "", None
            if self.steps is not None:
                waiting, after_approve, at = self._in_waves(ref, change)
                if waiting is not None:
                    return waiting
            if (after_approve or own) and not self.approved(ref.namespace, change):
                where = after_approve or "its configpin.io/rollout-waves"
                return self._unapproved(ref, change, where, at if after_approve else None)
        return None

    def _in_waves(
        self, ref: WorkloadRef, change: Change
    ) -> tuple[Wait | None, str, tuple[int, int]]:
        """Why `ref` waits for the earlier waves of `change` (None: it does not), and, when
        its wave comes after an `approve` step, which wave that is ("": it does not); and its
        wave (from 1) of how many."""
        cut = self.cut.current(change)
        at = cut.at.get(ref)
        if at is None:
            cut = self.cut.current(change, refresh=True)  # stale since the order was made
            at = cut.at.get(ref, len(cut.plan))
        waves = len(cut.plan)
        for i, vouching in enumerate(cut.vouching):
            states = [self._state(r, change) for r in vouching]
            if State.FAILED in states:
                failed = vouching[states.index(State.FAILED)]
                return (
                    Wait(
                        WaitReason.STOPPED,
                        f"the rollout of {failed} to {change} failed (wave {i + 1} of "
                        f"{waves}): the waves after it are not rolled",
                        wave=min(at, waves - 1) + 1,
                        waves=waves,
                    ),
                    "",
                    (min(at, waves - 1) + 1, waves),
                )
            if i >= at:
                break
            done = states.count(State.COMPLETE)
            if done < len(vouching):
                return (
                    Wait(
                        WaitReason.WAVE,
                        f"{change} rolls in waves: wave {at + 1} of {waves} starts when "
                        f"wave {i + 1} is complete ({done} of {len(vouching)} rollouts)",
                        wave=at + 1,
                        waves=waves,
                    ),
                    "",
                    (at + 1, waves),
                )
        place = (min(at, max(0, waves - 1)) + 1, max(waves, 1))
        if self.cut.after_approve(at):
            return None, f"wave {at + 1} of {waves} comes after approve", place
        return None, "", place


class Waiting:
    """The stale workloads whose rollout waits (a later wave, the cap on rollouts in flight),
    to look at again when a rollout ends or stops holding a place, however that reached the
    index."""

    def __init__(self) -> None:
        self._refs: set[WorkloadRef] = set()
        self._lock = threading.Lock()
        self.moves = 0  # rollouts that ended, so far

    def ended(self, entry: WorkloadEntry | None, before: WorkloadEntry | None) -> list[WorkloadRef]:
        """The workloads to look at again now that `entry` was put in the index over `before`
        (None: removed): every one waiting if a rollout ended or freed its place with this
        (it completed, failed, left; was paused; was deleted), none otherwise."""
        was = before.rollout if before is not None else None
        if entry is None:
            moved = was is not None
        else:
            now = entry.rollout
            moved = (now is not None and not entry.rolling and now != was) or (
                before is not None and entry.paused != before.paused
            )
        if not moved:
            return []
        with self._lock:
            self.moves += 1
            mine = entry.ref if entry is not None else None
            return [r for r in self._refs if r != mine]

    def freed(self) -> list[WorkloadRef]:
        """Every workload waiting, to look at again: places were freed otherwise (rollouts
        superseded by a newer change)."""
        with self._lock:
            self.moves += 1
            return list(self._refs)

    def looked_at(self, ref: WorkloadRef, *, waits: bool, moves_before: int) -> bool:
        """`ref` was looked at (from when `moves` was `moves_before`), and waits or not; True
        when it waits and a rollout ended meanwhile (look again: what it waited for may be
        over)."""
        with self._lock:
            if waits:
                self._refs.add(ref)
            else:
                self._refs.discard(ref)
            return waits and self.moves != moves_before
