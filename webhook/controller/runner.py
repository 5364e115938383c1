"""The runner of a reconciler: a work queue, worker threads, retries with backoff, and looks at
everything when leadership starts and every resync period, all only while leading.

What to do with one key is the reconciler's business (`reconcile(key, pending) -> outcome`);
the runner only reads the outcome: `Poll` puts the key back after its delay (no failure),
`RetryAfter` puts it back after its delay or the backoff for the failures so far, and gives up
past the limit (the next change or resync tries again), `Rolled` starts the key's minimum
interval; anything else is done. An exception is a
failure like `RetryAfter`. The rollout controller and the snapshot adopter both run on it.

Leadership is read from `is_leading()`: the housekeeping thread notices it start (then
`on_leading()`, which looks at everything) and stop (then the queue is dropped: the next leader
starts from the cluster). `poke()` makes it look at once instead of at its next tick.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from webhook.controller.outcome import Poll, RetryAfter, Rolled
from webhook.controller.queue import Pending, RolloutQueue

log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)
S = TypeVar("S", bound=Hashable)

RETRY_LIMIT = 6  # failed attempts at one key retried with backoff, then left


def exponential(failures: int) -> float:
    """client-go's per-item backoff, coarser: 2 s, 4 s, 8 s... at most a minute."""
    return min(2.0**failures, 60.0)


def _nothing() -> None:
    return None


class Runner(Generic[K, S]):
    def __init__(
        self,
        name: str,
        reconcile: Callable[[K, Pending[S]], object],
        queue: RolloutQueue[K, S],
        *,
        workers: int,
        is_leading: Callable[[], bool],
        on_leading: Callable[[], None] = _nothing,
        on_stopped_leading: Callable[[], None] = _nothing,
        resync: Callable[[], None] = _nothing,
        resync_period: float = 0.0,
        housekeeping: Callable[[], None] = _nothing,
        backoff: Callable[[int], float] = exponential,
        retry_limit: int | None = RETRY_LIMIT,
        on_retry: Callable[[K, int, str, float], None] | None = None,
        on_give_up: Callable[[K, int, str], None] | None = None,
        tick: float = 1.0,
    ) -> None:
        self.name = name
        self.reconcile = reconcile
        self.queue = queue
        self.workers = max(1, workers)
        self.is_leading = is_leading
        self.on_leading = on_leading
        self.on_stopped_leading = on_stopped_leading
        self.resync = resync
        self.resync_period = resync_period
        self.housekeeping = housekeeping
        self.backoff = backoff
        self.retry_limit = retry_limit
        self.on_retry = on_retry
        self.on_give_up = on_give_up
        self.tick = tick
        self._failures: dict[K, int] = {}
        self._failures_lock = threading.Lock()
        self._stop = threading.Event()
        self._poked = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for i in range(self.workers):
            self._spawn(self._work, f"{self.name}-{i}")
        self._spawn(self._housekeep, f"{self.name}-housekeeping")

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        t = threading.Thread(target=target, name=name, daemon=True)
        t.start()
        self._threads.append(t)

    def stop(self, timeout: float = 5.0) -> None:
        """Finish what is in flight (within `timeout`), drop the rest."""
        self._stop.set()
        self._poked.set()
        self.queue.close()
        deadline = time.monotonic() + timeout
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(max(0.0, deadline - time.monotonic()))

    def stopped(self) -> bool:
        return self._stop.is_set()

    def poke(self) -> None:
        """Leadership may have changed: look now."""
        self._poked.set()

    # --- leadership, resync
    def _housekeep(self) -> None:
        leading = False
        next_resync = 0.0
        while not self._stop.is_set():
            try:
                self.housekeeping()
                now_leading = self.is_leading()
                if now_leading and not leading:
                    leading, next_resync = True, time.monotonic() + self.resync_period
                    self.on_leading()
                elif leading and not now_leading:
                    leading = False
                    self.on_stopped_leading()
                    self.queue.clear()
                    with self._failures_lock:
                        self._failures.clear()
                elif leading and self.resync_period > 0 and time.monotonic() >= next_resync:
                    next_resync = time.monotonic() + self.resync_period
                    self.resync()
            except Exception:  # the loop must go on
                log.exception("%s: housekeeping failed", self.name)
            wait = self.tick
            if leading and self.resync_period > 0:
                wait = min(wait, max(0.0, next_resync - time.monotonic()))
            self._poked.wait(wait)
            self._poked.clear()

    # --- workers
    def _work(self) -> None:
        while not self._stop.is_set():
            item = self.queue.get(timeout=1.0)
            if item is None:
                continue
            key, pending = item
            rolled = False
            try:
                if not self.is_leading():
                    continue  # what was pending is looked at again when leading
                try:
                    outcome = self.reconcile(key, pending)
                except Exception as e:
                    log.debug("%s: %s failed", self.name, key, exc_info=True)
                    outcome = RetryAfter(str(e) or type(e).__name__)
                if isinstance(outcome, Poll):
                    seen, delay = pending.first_seen, outcome.seconds
                    self.queue.add(key, pending.sources, seen=seen, delay=delay)
                elif isinstance(outcome, RetryAfter):
                    rolled = outcome.rolled
                    self._retry(key, pending, outcome)
                else:
                    rolled = isinstance(outcome, Rolled)
                    with self._failures_lock:
                        self._failures.pop(key, None)
            finally:
                self.queue.done(key, rolled=rolled)

    def _retry(self, key: K, pending: Pending[S], outcome: RetryAfter) -> None:
        with self._failures_lock:
            n = self._failures.get(key, 0) + 1
            given_up = self.retry_limit is not None and n > self.retry_limit
            if given_up:
                self._failures.pop(key, None)
            else:
                self._failures[key] = n
        if given_up:
            if self.on_give_up is not None:
                self.on_give_up(key, n, outcome.why)
            return
        delay = outcome.seconds if outcome.seconds is not None else self.backoff(n)
        if self.on_retry is not None:
            self.on_retry(key, n, outcome.why, delay)
        self.queue.add(key, pending.sources, seen=pending.first_seen, delay=delay)

    def failures(self, key: K) -> int:
        with self._failures_lock:
            return self._failures.get(key, 0)
