"""The rollout queue: per-workload coalescing and a minimum interval between rollouts.

- The first change to a workload's sources makes it pending, due `window` seconds later;
  further changes before then join it (coalesced): one rollout with the latest content.
- A change added as `leading` (a refresh in place: cheap, and what a person waits to see) is
  handed out at once when the workload was not handed out within the last `window` seconds;
  what follows within the window is coalesced and handed out when the window since that
  hand-out ends (a leading edge, then one trailing pass).
- A workload is never handed out sooner than `min_interval` after its last rollout. A
  change that arrives in that time waits for the interval to end, then rolls once, with
  whatever the content is then: a source that changes all the time rolls its workloads
  once per interval, never in an endless series.
- A workload is handed to one worker at a time; a change that arrives while it is being
  worked on makes it pending again, for after.

Keys are opaque and hashable; time comes from `clock`, so tests drive it by hand.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from math import inf
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
S = TypeVar("S", bound=Hashable)


@dataclass
class Pending(Generic[S]):
    due: float
    first_seen: float  # when the earliest change folded into this one was seen
    sources: set[S] = field(default_factory=set)
    changes: int = 1


class RolloutQueue(Generic[K, S]):
    def __init__(
        self,
        *,
        window: float,
        min_interval: float,
        clock: Callable[[], float] = time.monotonic,
        advance: bool = False,
    ) -> None:
        self.window = window
        # An add due sooner than its key's pending entry moves the entry forward (the follow
        # queue: a rollout's status moved, look now rather than at the next poll). Off, a
        # pending entry keeps its time (a change never cuts a retry's backoff short).
        self.advance = advance
        self.min_interval = min_interval
        self.clock = clock
        self._pending: dict[K, Pending[S]] = {}
        self._heap: list[tuple[float, int, K]] = []
        self._seq = itertools.count()
        self._active: set[K] = set()
        self._last_rollout: dict[K, float] = {}
        self._handed: dict[K, float] = {}  # when each key was last handed out (leading edge)
        self._cond = threading.Condition()
        self._closed = False

    def __len__(self) -> int:
        with self._cond:
            return len(self._pending)

    def pending(self, key: K) -> Pending[S] | None:
        with self._cond:
            return self._pending.get(key)

    def add(
        self,
        key: K,
        sources: Iterable[S],
        *,
        seen: float | None = None,
        delay: float | None = None,
        last_rollout: float | None = None,
        leading: bool = False,
    ) -> bool:
        """Record a change seen at `seen` (default now), to be handed out after `delay`
        (default the coalescing window; `leading`: at once, unless the key was handed out
        within the window, then when the window since ends); True when it was folded into a
        pending one.

        `last_rollout`: when the workload last rolled by its own record (on this clock), for
        a workload this queue has not rolled itself (another replica led then)."""
        now = self.clock()
        seen = now if seen is None else seen
        with self._cond:
            if self._closed:
                return False
            if last_rollout is not None and last_rollout > self._last_rollout.get(key, -inf):
                self._last_rollout[key] = last_rollout
            if delay is not None:
                due = max(now + delay, self._not_before(key))
            elif leading:
                handed = self._handed.get(key)
                edge = now if handed is None else max(now, handed + self.window)
                due = max(edge, self._not_before(key))
            else:
                due = max(now + self.window, self._not_before(key))
            current = self._pending.get(key)
            if current is not None:
                current.sources.update(sources)
                current.changes += 1
                current.first_seen = min(current.first_seen, seen)
                if self.advance and due < current.due != inf:  # inf: a worker has it
                    current.due = due
                    self._push(key, due)
                return True
            self._pending[key] = Pending(due, seen, set(sources))
            self._push(key, due)
            return False

    def not_before(self, key: K) -> float:
        """The earliest time (on this clock) `key` may be handed out: its last rollout plus
        the minimum interval (0 when it never rolled)."""
        with self._cond:
            return self._not_before(key)

    def _not_before(self, key: K) -> float:
        last = self._last_rollout.get(key)
        return last + self.min_interval if last is not None else 0.0

    def _push(self, key: K, due: float) -> None:
        heapq.heappush(self._heap, (due, next(self._seq), key))
        if self._heap[0][2] == key:
            self._cond.notify()

    def get(self, timeout: float | None = None) -> tuple[K, Pending[S]] | None:
        """The next workload whose time has come (blocking); None on timeout or when closed.

        The caller must call `done(key, ...)` when it is finished with it."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while not self._closed:
                wait = self._next_wait()
                if wait is not None and wait <= 0:
                    item = self._take()
                    if item is not None:
                        if self._heap:
                            self._cond.notify()  # another worker takes over the waiting
                        return item
                    continue
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return None
                    wait = left if wait is None else min(wait, left)
                self._cond.wait(wait)
            return None

    def _next_wait(self) -> float | None:
        """Seconds until the first heap entry is due (None when none), dropping stale ones."""
        while self._heap:
            due, _, key = self._heap[0]
            p = self._pending.get(key)
            if p is None or p.due != due:
                heapq.heappop(self._heap)  # superseded entry
                continue
            return due - self.clock()
        return None

    def _take(self) -> tuple[K, Pending[S]] | None:
        _, _, key = heapq.heappop(self._heap)
        p = self._pending[key]
        if key in self._active:
            # Another worker has it: hand it out after that worker is done.
            p.due = float("inf")
            return None
        not_before = self._not_before(key)
        if not_before > self.clock():
            p.due = not_before
            self._push(key, not_before)
            return None
        del self._pending[key]
        self._active.add(key)
        now = self.clock()
        if p.sources:  # (a look with no change, as after pods moved, is no pass of one)
            self._handed[key] = now
        if len(self._handed) > 4 * (len(self._pending) + 1024):
            self._handed = {k: t for k, t in self._handed.items() if t > now - self.window}
        return key, p

    def done(self, key: K, *, rolled: bool) -> None:
        """The worker is finished with `key`; `rolled`: it started a rollout just now."""
        with self._cond:
            self._active.discard(key)
            now = self.clock()
            if rolled:
                self._last_rollout[key] = now
                if len(self._last_rollout) > 4 * (len(self._pending) + 1024):
                    self._prune(now)
            p = self._pending.get(key)
            if p is not None and p.due == float("inf"):
                p.due = max(now, self._not_before(key))
                self._push(key, p.due)

    def _prune(self, now: float) -> None:
        horizon = now - self.min_interval
        self._last_rollout = {k: t for k, t in self._last_rollout.items() if t > horizon}

    def forget(self, key: K) -> None:
        """Drop a pending change (the workload is gone)."""
        with self._cond:
            self._pending.pop(key, None)
            self._last_rollout.pop(key, None)
            self._handed.pop(key, None)

    def clear(self) -> None:
        """Drop everything pending (leadership lost: the next leader starts from the cluster)."""
        with self._cond:
            self._pending.clear()
            self._heap.clear()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
