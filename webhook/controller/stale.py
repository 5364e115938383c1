"""How long workloads stay stale: `configpin_workloads_stale` and
`configpin_workload_stale_seconds_max`, as the leader sees them.

A workload counts from the first time it was seen stale until it is current. It is measured
from memory (the index and the source cache) every few seconds, and marked at once when a
check finds it stale or current.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Final

from webhook.core.current import WorkloadRef
from webhook.process.metrics import Metrics

STALE_EVERY: Final = 5.0  # seconds between two counts of the stale workloads


class Staleness:
    def __init__(self, metrics: Metrics, clock: Callable[[], float]) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._since: dict[WorkloadRef, float] = {}  # since when (clock) each has been stale
        self._next_count = 0.0
        metrics.workloads_stale.set_function(self.count)
        metrics.stale_seconds_max.set_function(self.seconds_max)

    def count(self) -> int:
        with self._lock:
            return len(self._since)

    def seconds_max(self) -> float:
        with self._lock:
            oldest = min(self._since.values(), default=None)
        return 0.0 if oldest is None else max(0.0, self.clock() - oldest)

    def seen_stale(self, ref: WorkloadRef, when: float) -> None:
        with self._lock:
            self._since.setdefault(ref, when)

    def current(self, ref: WorkloadRef) -> None:
        with self._lock:
            self._since.pop(ref, None)

    def measured(self, stale: Iterable[WorkloadRef]) -> None:
        """Exactly these are stale now (each keeps the time it was first seen stale)."""
        now = self.clock()
        with self._lock:
            self._since = {ref: self._since.get(ref, now) for ref in stale}

    def due(self) -> bool:
        """Whether a count is due (every STALE_EVERY seconds; the runner asks often)."""
        now = self.clock()
        if now < self._next_count:
            return False
        self._next_count = now + STALE_EVERY
        return True

    def clear(self) -> None:
        with self._lock:
            self._since.clear()
