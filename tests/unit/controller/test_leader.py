"""Leader election over a Lease record (an in-memory lock with resourceVersions)."""

from __future__ import annotations

import datetime
from collections.abc import Callable
from dataclasses import replace

import pytest

from webhook.controller.leader import LeaderElector, new_identity
from webhook.kube.lease import LeaseRecord, format_time, parse_time


class FakeLock:
    """A Lease in memory: writes are conditional on the resourceVersion, like the API's."""

    def __init__(self) -> None:
        self.record: LeaseRecord | None = None
        self.version = 0
        self.broken = False
        self.timeouts: list[float] = []  # what each request was allowed
        self.during: Callable[[], None] = lambda: None  # runs while a request is in flight

    def describe(self) -> str:
        return "lease test/leader"

    def _check(self, timeout: float) -> None:
        assert timeout > 0
        self.timeouts.append(timeout)
        self.during()
        if self.broken:
            raise ConnectionError("API server unreachable")

    def get(self, *, timeout: float) -> LeaseRecord | None:
        self._check(timeout)
        return self.record

    def create(self, record: LeaseRecord, *, timeout: float) -> LeaseRecord | None:
        self._check(timeout)
        if self.record is not None:
            return None
        return self._write(record)

    def update(self, record: LeaseRecord, *, timeout: float) -> LeaseRecord | None:
        self._check(timeout)
        if self.record is None or record.resource_version != self.record.resource_version:
            return None
        return self._write(record)

    def _write(self, record: LeaseRecord) -> LeaseRecord:
        self.version += 1
        self.record = replace(record, resource_version=str(self.version))
        return self.record


class Clock:
    def __init__(self) -> None:
        self.now = 500.0

    def __call__(self) -> float:
        return self.now

    def wall(self) -> datetime.datetime:
        return datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC) + datetime.timedelta(
            seconds=self.now
        )


class Candidate:
    def __init__(self, lock: FakeLock, clock: Clock, name: str, duration: float = 15) -> None:
        self.events: list[str] = []
        self.elector = LeaderElector(
            lock,
            name,
            lease_duration=duration,
            on_started=lambda: self.events.append("started"),
            on_stopped=lambda: self.events.append("stopped"),
            clock=clock,
            wall_clock=clock.wall,
        )


@pytest.fixture
def clock() -> Clock:
    return Clock()


def test_one_leader_renews_and_a_standby_waits(clock: Clock) -> None:
    lock = FakeLock()
    a, b = Candidate(lock, clock, "a"), Candidate(lock, clock, "b")
    a.elector.step()
    b.elector.step()
    assert a.elector.is_leader() and not b.elector.is_leader()
    assert a.events == ["started"] and b.events == []
    assert lock.record is not None
    acquired = lock.record.acquire_time
    for _ in range(10):  # 50 s of renewals every 5 s: the standby never gets in
        clock.now += 5
        a.elector.step()
        b.elector.step()
        assert a.elector.is_leader() and not b.elector.is_leader()
    assert lock.record.holder == "a"
    assert lock.record.acquire_time == acquired
    assert lock.record.renew_time is not None and acquired is not None
    assert lock.record.renew_time > acquired
    assert lock.record.transitions == 0


def test_standby_takes_over_a_lease_nobody_renews(clock: Clock) -> None:
    lock = FakeLock()
    a, b = Candidate(lock, clock, "a"), Candidate(lock, clock, "b")
    a.elector.step()
    b.elector.step()  # b sees a's record now
    # a dies. b measures the lease by its own clock from when it saw the record change.
    clock.now += 14.9
    b.elector.step()
    assert not b.elector.is_leader()
    clock.now += 0.2
    b.elector.step()
    assert b.elector.is_leader()
    assert lock.record is not None
    assert lock.record.holder == "b" and lock.record.transitions == 1


def test_leader_that_cannot_renew_stops_before_anyone_may_take_over(clock: Clock) -> None:
    lock = FakeLock()
    a = Candidate(lock, clock, "a")
    a.elector.step()
    lock.broken = True
    clock.now += 5
    a.elector.step()
    assert a.elector.is_leader()  # within its renew deadline (10 s of 15)
    clock.now += 5
    assert not a.elector.is_leader()  # deadline passed: it stops acting even before the step
    a.elector.step()
    assert a.events == ["started", "stopped"]


def test_leader_sees_another_holder_and_stops_at_once(clock: Clock) -> None:
    lock = FakeLock()
    a = Candidate(lock, clock, "a")
    a.elector.step()
    assert lock.record is not None
    lock._write(replace(lock.record, holder="intruder"))
    a.elector.step()
    assert not a.elector.is_leader()
    assert a.events == ["started", "stopped"]


def test_release_lets_the_standby_in_at_once(clock: Clock) -> None:
    lock = FakeLock()
    a, b = Candidate(lock, clock, "a"), Candidate(lock, clock, "b")
    a.elector.step()
    b.elector.step()
    a.elector.stop()
    assert a.events == ["started", "stopped"]
    assert lock.record is not None and lock.record.holder == ""
    clock.now += 1  # far less than the lease duration
    b.elector.step()
    assert b.elector.is_leader()


class StaleReads(FakeLock):
    """The same Lease, read at a moment that has passed: writes still go to `target`."""

    def __init__(self, target: FakeLock, seen: LeaseRecord) -> None:
        super().__init__()
        self.target, self.seen = target, seen

    def get(self, *, timeout: float) -> LeaseRecord | None:
        return self.seen

    def update(self, record: LeaseRecord, *, timeout: float) -> LeaseRecord | None:
        return self.target.update(record, timeout=timeout)


def test_two_candidates_racing_for_a_free_lease_get_one_winner(clock: Clock) -> None:
    lock = FakeLock()
    lock._write(LeaseRecord("", 1, clock.wall(), clock.wall(), 3))
    assert lock.record is not None
    both_read = lock.record
    a = Candidate(lock, clock, "a")
    b = Candidate(StaleReads(lock, both_read), clock, "b")
    a.elector.step()  # a writes first
    b.elector.step()  # b's write carries the version both read: refused
    assert a.elector.is_leader() and not b.elector.is_leader()
    assert lock.record.holder == "a" and lock.record.transitions == 4


def test_durations_must_be_ordered() -> None:
    with pytest.raises(ValueError, match="retry_period"):
        LeaderElector(
            FakeLock(),
            "a",
            lease_duration=10,
            renew_deadline=12,
            on_started=lambda: None,
            on_stopped=lambda: None,
        )


def test_identity_is_unique_per_process_start() -> None:
    assert new_identity() != new_identity()


def test_microtime_round_trip() -> None:
    when = datetime.datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=datetime.UTC)
    text = format_time(when)
    assert text == "2024-05-06T07:08:09.123456Z"
    assert parse_time(text) == when
    assert parse_time("nonsense") is None


def test_a_failing_callback_does_not_stop_the_election(clock: Clock) -> None:
    def boom() -> None:
        raise RuntimeError("callback failed")

    elector = LeaderElector(
        FakeLock(),
        "a",
        lease_duration=15,
        on_started=boom,
        on_stopped=boom,
        clock=clock,
        wall_clock=clock.wall,
    )
    elector.step()
    assert elector.is_leader()
    clock.now += 5
    elector.step()  # renews as usual
    assert elector.is_leader()
    elector.stop()
    assert not elector.is_leader()


def test_the_renewal_counts_from_before_the_request_was_sent(clock: Clock) -> None:
    # A renewal whose answer takes 4 s: the API server may have stored it at any moment of
    # those 4 s, and the other replicas count the lease from when they saw it. The leader
    # must stop acting a renew deadline after the attempt started, not after the answer.
    lock = FakeLock()
    a = Candidate(lock, clock, "a")  # lease 15 s: renew deadline 10 s, retry period 5 s
    a.elector.step()
    assert a.elector.is_leader()
    clock.now += 5
    started = clock.now

    def slow() -> None:
        clock.now += 2

    lock.during = slow  # get and update take 2 s each
    a.elector.step()
    assert clock.now == started + 4
    lock.during = lambda: None
    clock.now = started + 10 - 0.01
    assert a.elector.is_leader()
    clock.now = started + 10
    assert not a.elector.is_leader()


def test_every_request_ends_before_the_renew_deadline(clock: Clock) -> None:
    lock = FakeLock()
    a = Candidate(lock, clock, "a")
    a.elector.step()
    renewed = clock.now
    clock.now += 5
    lock.timeouts.clear()

    def slow() -> None:
        clock.now += 1.5

    lock.during = slow
    a.elector.step()  # a renewal: read, then write
    assert len(lock.timeouts) == 2
    # each request was allowed only what was left of the 10 s after the last renewal
    assert lock.timeouts[0] == pytest.approx(renewed + 10 - (renewed + 5))
    assert lock.timeouts[1] == pytest.approx(renewed + 10 - (renewed + 6.5))

    # the API server hangs: every request takes what it is allowed; no request is sent
    # once nothing is left, and the leader stops acting at the deadline
    renewed = clock.now - 3  # the attempt above started 3 s ago
    lock.timeouts.clear()
    clock.now = renewed + 9

    def hangs() -> None:
        clock.now += lock.timeouts[-1]
        raise TimeoutError("no answer")

    lock.during = hangs
    a.elector.step()
    assert lock.timeouts == [pytest.approx(1.0)]
    assert clock.now == pytest.approx(renewed + 10)
    assert not a.elector.is_leader()
    assert a.events == ["started", "stopped"]
    lock.timeouts.clear()
    a.elector.step()  # a standby again: its own attempt has its own renew deadline
    assert lock.timeouts and all(t <= 10 for t in lock.timeouts)
