"""Leader election over a Lease, the way client-go's `leaderelection` package does it.

- A candidate reads the Lease. If nobody holds it, the holder released it, or the record
  has not changed for a whole lease duration *as measured on this replica's clock* (clocks
  of different machines are never compared), it writes itself in as holder, conditional on
  the resourceVersion it read: of two candidates, one wins and the other gets a conflict.
- The leader renews every `retry_period` (a third of the lease duration by default). If it
  cannot renew within `renew_deadline` (two thirds) of its last successful renewal it stops
  acting: before anyone else may take over (a full lease duration after the last renewal
  they saw), so two leaders never act at once as long as clocks run at the same rate.
- On a clean shutdown the leader releases the Lease (empty holder), and a standby takes
  over at its next attempt instead of waiting for the lease to expire.
"""

from __future__ import annotations

import datetime
import logging
import os
import random
import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Protocol

from webhook.kube.lease import LeaseLock, LeaseRecord, duration_seconds
from webhook.kube.raw import Kube
from webhook.process.config import Settings
from webhook.process.metrics import Metrics

log = logging.getLogger(__name__)


class Lock(Protocol):
    """`timeout`: seconds the request may take in all (connect, send, answer)."""

    def describe(self) -> str: ...

    def get(self, *, timeout: float) -> LeaseRecord | None: ...

    def create(self, record: LeaseRecord, *, timeout: float) -> LeaseRecord | None: ...

    def update(self, record: LeaseRecord, *, timeout: float) -> LeaseRecord | None: ...


class DeadlinePassed(Exception):
    """No time is left for a request before the renew deadline."""


def new_identity() -> str:
    """This replica's name in the Lease: the host (the pod's name in a cluster), the process
    and a random suffix, so that a restarted process never mistakes the lease for its own."""
    return f"{socket.gethostname()}_{os.getpid()}_{secrets.token_hex(4)}"


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class Elector(Protocol):
    identity: str

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def is_leader(self) -> bool: ...


class AlwaysLeader:
    """No election (a single replica, `--no-leader-elect`): leading from start to stop."""

    def __init__(
        self, on_started: Callable[[], None], on_stopped: Callable[[], None] = lambda: None
    ) -> None:
        self.identity = "(no election)"
        self._on_started = on_started
        self._on_stopped = on_stopped
        self._leading = False

    def start(self) -> None:
        self._leading = True
        self._on_started()

    def stop(self) -> None:
        if self._leading:
            self._leading = False
            self._on_stopped()

    def is_leader(self) -> bool:
        return self._leading


class LeaderElector:
    def __init__(
        self,
        lock: Lock,
        identity: str,
        *,
        lease_duration: float,
        on_started: Callable[[], None],
        on_stopped: Callable[[], None],
        on_change: Callable[[bool], None] = lambda leading: None,
        renew_deadline: float | None = None,
        retry_period: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], datetime.datetime] = _utcnow,
    ) -> None:
        self.lock = lock
        self.identity = identity
        self.lease_duration = duration_seconds(lease_duration)
        self.renew_deadline = (
            renew_deadline if renew_deadline is not None else self.lease_duration * 2 / 3
        )
        self.retry_period = retry_period if retry_period is not None else self.lease_duration / 3
        if not 0 < self.retry_period < self.renew_deadline < self.lease_duration:
            raise ValueError("need 0 < retry_period < renew_deadline < lease_duration")
        self._on_started = on_started
        self._on_stopped = on_stopped
        self._on_change = on_change
        self._clock = clock
        self._wall = wall_clock
        self._observed: LeaseRecord | None = None
        self._observed_at = 0.0
        self._renewed_at: float | None = None
        self._leading = False
        self._state_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- the state the controller reads
    def is_leader(self) -> bool:
        """Leading, and renewed recently enough to be sure nobody else is."""
        renewed = self._renewed_at
        return (
            self._leading and renewed is not None and self._clock() < renewed + self.renew_deadline
        )

    @property
    def observed_holder(self) -> str:
        return self._observed.holder if self._observed is not None else ""

    # --- one attempt (client-go `tryAcquireOrRenew`)
    def _time_left(self, deadline: float) -> float:
        left = deadline - self._clock()
        if left <= 0:
            raise DeadlinePassed(f"{self.lock.describe()}: the renew deadline has passed")
        return left

    def try_acquire_or_renew(self) -> bool:
        """One attempt. The renewal counts from the moment the attempt *started* (before its
        first request was sent): the API server may have stored the write at any moment after
        that, and the other replicas count the lease duration from when they saw it. And every
        request ends before the renew deadline (a leader's: two thirds of the lease duration
        after its last renewal): a request still hanging after that could otherwise come back
        successful when another replica may already lead."""
        started = self._clock()
        leading_since = self._renewed_at if self._leading else None
        deadline = (leading_since if leading_since is not None else started) + self.renew_deadline
        now = self._wall()
        current = self.lock.get(timeout=self._time_left(deadline))
        if current is None:
            created = self.lock.create(
                LeaseRecord(self.identity, self.lease_duration, now, now, 0),
                timeout=self._time_left(deadline),
            )
            if created is None:
                return False
            self._observe(created)
            self._renewed_at = started
            return True
        if not current.same_claim(self._observed):
            self._observe(current)
        held_by_other = current.holder not in ("", self.identity)
        if held_by_other and self._clock() < self._observed_at + current.duration_seconds:
            return False
        if current.holder == self.identity:
            wanted = replace(current, renew_time=now, duration_seconds=self.lease_duration)
        else:
            wanted = LeaseRecord(
                self.identity,
                self.lease_duration,
                now,
                now,
                current.transitions + 1,
                current.resource_version,
            )
        written = self.lock.update(wanted, timeout=self._time_left(deadline))
        if written is None:
            return False
        self._observe(written)
        self._renewed_at = started
        return True

    def _observe(self, record: LeaseRecord) -> None:
        self._observed = record
        self._observed_at = self._clock()

    # --- the loop
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="leader-election", daemon=True)
        self._thread.start()

    def step(self) -> None:
        """One attempt and what follows from it (the loop's body; tests call it directly)."""
        try:
            ok = self.try_acquire_or_renew()
        except Exception as e:
            log.warning("%s: could not acquire or renew (%s)", self.lock.describe(), e)
            ok = False
        if ok:
            self._set_leading(True)
        elif self._leading:
            lost = self.observed_holder not in ("", self.identity)
            if lost or not self.is_leader():
                log.warning(
                    "%s: leadership lost (%s)",
                    self.lock.describe(),
                    f"now held by {self.observed_holder}" if lost else "renewal deadline passed",
                )
                self._set_leading(False)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.step()
            # A standby spreads its attempts a little, as client-go's JitterUntil does.
            wait = self.retry_period * (1.0 if self._leading else 1 + random.random() * 0.2)  # noqa: S311
            self._stop.wait(wait)

    def _set_leading(self, leading: bool) -> None:
        with self._state_lock:
            if leading == self._leading:
                return
            self._leading = leading
        if leading:
            log.info("%s: acquired as %s", self.lock.describe(), self.identity)
        try:  # the election must go on whatever the callbacks do
            self._on_change(leading)
            (self._on_started if leading else self._on_stopped)()
        except Exception:
            log.exception("%s: leadership callback failed", self.lock.describe())

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the loop and, if leading, release the Lease so a standby takes over at once."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        was_leading = self._leading
        self._set_leading(False)
        if was_leading:
            self.release()

    def release(self) -> bool:
        record = self._observed
        if record is None or record.holder != self.identity:
            return False
        now = self._wall()
        try:
            written = self.lock.update(
                LeaseRecord("", 1, now, now, record.transitions, record.resource_version),
                timeout=self.retry_period,
            )
        except Exception as e:
            log.warning("%s: could not release (%s)", self.lock.describe(), e)
            return False
        if written is not None:
            self._observe(written)
            log.info("%s: released", self.lock.describe())
        return written is not None


def elector(
    kube: Kube, settings: Settings, identity: str, metrics: Metrics, poke: Callable[[], None]
) -> Elector:
    """The replica's elector as its settings ask: the Lease (`--leader-elect`, the chart's
    default), or leading from start to stop. `poke` wakes the workers on each edge;
    `configpin_leader` follows."""
    if not settings.controller.leader_elect:
        metrics.is_leader.set(1)
        return AlwaysLeader(poke, poke)
    return LeaderElector(
        LeaseLock(kube, settings.cluster.namespace, settings.controller.lease_name),
        identity,
        lease_duration=settings.controller.lease_duration,
        on_started=poke,
        on_stopped=poke,
        on_change=lambda leading: metrics.is_leader.set(1 if leading else 0),
    )
