"""Which stale workloads may roll now: the waves of each change, and the cap on rollouts in
flight (`--rollout-waves`, `--max-rolling`).

A change is one source's new content (webhook.core.delivery.change_of). Its members are the
workloads it reaches: those that rolled for it (their rollout record names it, whatever came
of it) and those still stale for it. They are ordered and cut into waves the same way on every
replica, from what the workloads say (their records, their `configpin.io/wave`), so a new
leader carries on where the last one was: a wave may start when every member of the waves
before it completed its rollout, never after a member failed.

The membership of a change is worked out once (from the index and the source cache, in
memory) and kept until the next resync or leadership, so that rolling a thousand workloads
does not work it out a thousand times.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Final

from webhook.config import Settings
from webhook.controller.index import WorkloadEntry, WorkloadIndex, WorkloadRef, stale_sources
from webhook.core import digest
from webhook.core.delivery import COMPLETE, FAILED, ROLLING, Member, change_of, wave_plan
from webhook.core.model import SourceId, SourceKind, SourceRecord
from webhook.kube.cache import SourceCache
from webhook.sources import Miss

_PLANS_MAX: Final = 4096


class Gate:
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
        self.in_scope = in_scope
        self.cache = cache
        self.hkey = hkey
        self.steps = settings.waves()
        self.cap = settings.max_rolling
        self._lock = threading.Lock()
        self._plans: dict[str, list[list[WorkloadRef]]] = {}

    def forget(self) -> None:
        """Work every change's membership out again (a resync, a new leadership)."""
        with self._lock:
            self._plans.clear()

    # --- what a change is
    def _peek(self, namespace: str, sid: SourceId) -> SourceRecord | None:
        found = self.cache.peek(namespace, sid)
        return None if isinstance(found, Miss) else found

    def change(self, namespace: str, sid: SourceId) -> str | None:
        """The change a stale source of `namespace` is at (None: it does not exist)."""
        record = self._peek(namespace, sid)
        if record is None:
            return None
        return change_of(sid, digest.source_digest(self.hkey, record))

    def changes(self, namespace: str, stale: Iterable[SourceId]) -> tuple[str, ...]:
        found = (self.change(namespace, sid) for sid in sorted(stale))
        return tuple(c for c in found if c is not None)

    # --- its members and waves
    def _member(self, entry: WorkloadEntry, change: str, sid: SourceId) -> bool:
        record = entry.rollout
        if record is not None and change in record.changes:
            return True
        ns = entry.ref.namespace
        if self.change(ns, sid) != change:
            return False
        lookup = lambda s: self._peek(ns, s)  # noqa: E731
        return sid in stale_sources(entry, lookup, self.hkey)

    def plan(self, change: str, refresh: bool = False) -> list[list[WorkloadRef]]:
        with self._lock:
            found = self._plans.get(change)
        if found is not None and not refresh:
            return found
        text, _, _content = change.partition("@")
        kind, _, name = text.partition("/")
        sid = SourceId(SourceKind(kind), name)
        members = []
        for ns in self.index.namespaces_of(sid):
            if not self.in_scope(ns):
                continue
            for entry in self.index.consumers(ns, sid):
                if self._member(entry, change, sid):
                    ref = entry.ref
                    members.append(Member(entry.wave, ns, ref.kind, ref.name))
        plan = [
            [WorkloadRef(m.kind, m.namespace, m.name) for m in wave]
            for wave in wave_plan(members, self.steps)
        ]
        with self._lock:
            if len(self._plans) >= _PLANS_MAX:
                self._plans.clear()
            self._plans[change] = plan
        return plan

    def members(self, change: str) -> list[WorkloadRef]:
        return [ref for wave in self.plan(change) for ref in wave]

    # --- the gate
    def _state(self, ref: WorkloadRef, change: str) -> str | None:
        entry = self.index.get(ref)
        if entry is None:
            return COMPLETE  # gone: nothing to wait for
        record = entry.rollout
        if record is None or change not in record.changes:
            return None
        return record.state

    def wait(self, ref: WorkloadRef, changes: Iterable[str]) -> str | None:
        """Why `ref` may not roll to these changes now (None: it may)."""
        if self.cap and self.index.rolling() >= self.cap:
            return (
                f"{self.index.rolling()} config rollouts are in flight, the most configpin "
                f"starts at once (--max-rolling {self.cap})"
            )
        if self.steps is None:
            return None
        for change in changes:
            plan = self.plan(change)
            at = next((i for i, wave in enumerate(plan) if ref in wave), None)
            if at is None:
                plan = self.plan(change, refresh=True)  # stale since the plan was made
                at = next((i for i, wave in enumerate(plan) if ref in wave), len(plan))
            for i, wave in enumerate(plan):
                states = [self._state(r, change) for r in wave]
                if FAILED in states:
                    failed = wave[states.index(FAILED)]
                    return (
                        f"the rollout of {failed} to {change} failed (wave {i + 1} of "
                        f"{len(plan)}): the waves after it are not rolled"
                    )
                if i >= at:
                    break
                done = states.count(COMPLETE)
                if done < len(wave):
                    return (
                        f"{change} rolls in waves: wave {at + 1} of {len(plan)} starts when "
                        f"wave {i + 1} is complete ({done} of {len(wave)} rollouts)"
                    )
        return None


class Waiting:
    """The stale workloads whose rollout waits (a later wave, the cap on rollouts in flight),
    to look at again when a rollout ends, however its end reached the index."""

    def __init__(self) -> None:
        self._refs: set[WorkloadRef] = set()
        self._lock = threading.Lock()
        self.moves = 0  # rollouts that ended, so far

    def ended(self, entry: WorkloadEntry, before: WorkloadEntry | None) -> list[WorkloadRef]:
        """The workloads to look at again now that `entry` was put in the index over
        `before`: every one waiting if its rollout ended with this, none otherwise."""
        record, was = entry.rollout, before.rollout if before is not None else None
        if record is None or record.state == ROLLING or (was is not None and was == record):
            return []
        with self._lock:
            self.moves += 1
            return list(self._refs - {entry.ref})

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
