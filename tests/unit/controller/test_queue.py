"""The rollout queue: coalescing window, minimum interval, one worker per workload."""

from __future__ import annotations

import threading

from harness.controlplane import wait_for
from webhook.controller.queue import RolloutQueue


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _queue(window: float = 2.0, interval: float = 30.0) -> tuple[RolloutQueue[str, str], Clock]:
    clock = Clock()
    return RolloutQueue(window=window, min_interval=interval, clock=clock), clock


def test_changes_within_the_window_give_one_item_with_every_source() -> None:
    q, clock = _queue()
    assert q.add("web", ["cm/a"]) is False
    clock.now += 0.5
    assert q.add("web", ["cm/b"]) is True
    clock.now += 0.5
    assert q.add("web", ["cm/a"]) is True
    assert q.get(timeout=0) is None  # not due: the window runs from the first change
    clock.now += 1.0
    item = q.get(timeout=0)
    assert item is not None
    key, pending = item
    assert key == "web"
    assert pending.sources == {"cm/a", "cm/b"}
    assert pending.changes == 3
    assert pending.first_seen == 1000.0
    assert q.get(timeout=0) is None


def test_workloads_are_independent() -> None:
    q, clock = _queue()
    q.add("a", ["s"])
    clock.now += 1
    q.add("b", ["s"])
    clock.now += 1
    first = q.get(timeout=0)
    assert first is not None and first[0] == "a"
    assert q.get(timeout=0) is None
    clock.now += 1
    second = q.get(timeout=0)
    assert second is not None and second[0] == "b"


def test_minimum_interval_between_rollouts_and_the_latest_content_wins() -> None:
    q, clock = _queue(window=2, interval=30)
    q.add("web", ["s"])
    clock.now += 2
    item = q.get(timeout=0)
    assert item is not None
    q.done("web", rolled=True)
    rolled_at = clock.now

    # A source that keeps changing: every change folds into one item due at the interval's end.
    for _ in range(20):
        clock.now += 1
        q.add("web", ["s"])
        assert q.get(timeout=0) is None
    clock.now = rolled_at + 30 - 0.01
    assert q.get(timeout=0) is None
    clock.now = rolled_at + 30
    item = q.get(timeout=0)
    assert item is not None
    assert item[1].changes == 20


def test_a_skipped_check_does_not_start_the_interval() -> None:
    q, _clock = _queue(window=0, interval=30)
    q.add("web", ["s"])
    assert q.get(timeout=0) is not None
    q.done("web", rolled=False)
    q.add("web", ["s"])
    assert q.get(timeout=0) is not None


def test_a_workload_goes_to_one_worker_at_a_time() -> None:
    q, _clock = _queue(window=0, interval=0)
    q.add("web", ["s"])
    assert q.get(timeout=0) is not None
    q.add("web", ["t"])  # arrives while a worker is busy with it
    assert q.get(timeout=0) is None
    q.done("web", rolled=True)
    item = q.get(timeout=0)
    assert item is not None and item[1].sources == {"t"}


def test_explicit_delay_for_retries() -> None:
    q, clock = _queue(window=2, interval=0)
    q.add("web", ["s"], delay=10)
    clock.now += 9
    assert q.get(timeout=0) is None
    clock.now += 1
    assert q.get(timeout=0) is not None


def test_clear_and_forget() -> None:
    q, _clock = _queue(window=0, interval=30)
    q.add("a", ["s"])
    q.add("b", ["s"])
    q.forget("a")
    item = q.get(timeout=0)
    assert item is not None and item[0] == "b"
    q.done("b", rolled=True)
    q.add("c", ["s"])
    q.clear()
    assert len(q) == 0
    assert q.get(timeout=0) is None


def test_close_wakes_waiting_workers() -> None:
    q: RolloutQueue[str, str] = RolloutQueue(window=60, min_interval=0)
    results: list[object] = []
    t = threading.Thread(target=lambda: results.append(q.get()))
    t.start()
    q.close()
    t.join(5)
    assert results == [None]


def test_many_workers_drain_many_items() -> None:
    """Items due at different times reach idle workers (no worker sleeps past a due item)."""
    q: RolloutQueue[int, str] = RolloutQueue(window=0.01, min_interval=0)
    done: list[int] = []
    lock = threading.Lock()

    def work() -> None:
        while (item := q.get()) is not None:
            with lock:
                done.append(item[0])
            q.done(item[0], rolled=True)

    workers = [threading.Thread(target=work) for _ in range(4)]
    for w in workers:
        w.start()
    for i in range(500):
        q.add(i, ["s"])
    try:
        wait_for(lambda: len(done) == 500, timeout=10, what="500 items handed out")
    finally:
        q.close()
        for w in workers:
            w.join(5)
    assert sorted(done) == list(range(500))


def test_the_interval_counts_from_the_workloads_own_record_of_its_last_rollout() -> None:
    # A new leader has never rolled `web` itself; the workload says it rolled 10 s ago.
    q, clock = _queue(window=2.0, interval=30.0)
    q.add("web", ["cm/a"], last_rollout=clock.now - 10.0)
    clock.now += 2.0
    assert q.get(timeout=0) is None  # due 20 s from now, not after the window
    clock.now += 18.0
    item = q.get(timeout=0)
    assert item is not None and item[0] == "web"


def test_an_older_record_does_not_shorten_what_this_queue_remembers() -> None:
    q, clock = _queue(window=0.0, interval=30.0)
    q.add("web", ["cm/a"])
    item = q.get(timeout=0)
    assert item is not None
    q.done("web", rolled=True)
    q.add("web", ["cm/a"], last_rollout=clock.now - 100.0)
    clock.now += 29.0
    assert q.get(timeout=0) is None
    clock.now += 1.0
    assert q.get(timeout=0) is not None


def test_a_follow_queue_looks_at_once_when_a_status_event_comes_before_the_poll() -> None:
    """The follow queue (advance=True): a rollout polled every 5 s whose status moves (the
    Deployment controller said the deadline passed) is looked at now, not at the poll."""
    clock = Clock()
    q: RolloutQueue[str, str] = RolloutQueue(
        window=0.0, min_interval=0.0, clock=clock, advance=True
    )
    q.add("web", [], delay=5.0)  # the poll
    clock.now += 1
    assert q.get(timeout=0) is None
    assert q.add("web", []) is True  # the status event: folded, and due now
    item = q.get(timeout=0)
    assert item is not None and item[0] == "web"
    q.done("web", rolled=False)
    assert q.get(timeout=0) is None  # once: the superseded poll is dropped
    clock.now += 10
    assert q.get(timeout=0) is None


def test_a_change_does_not_cut_a_retrys_backoff_short_in_the_rollout_queue() -> None:
    q, clock = _queue(window=2, interval=0)
    q.add("web", ["s"], delay=60.0)  # a retry after a failure
    clock.now += 1
    assert q.add("web", ["s"]) is True
    clock.now += 10
    assert q.get(timeout=0) is None
    clock.now += 50
    item = q.get(timeout=0)
    assert item is not None and item[0] == "web"


def test_a_leading_change_goes_at_once_and_what_follows_in_the_window_makes_one_more_pass() -> None:
    q, clock = _queue(window=2, interval=0)
    q.add("live", ["cm/a"], leading=True)
    item = q.get(timeout=0)
    assert item is not None and item[1].sources == {"cm/a"}  # no wait: the leading edge
    clock.now += 0.1
    q.add("live", ["cm/a"], leading=True)  # while the first pass is at work
    clock.now += 0.1
    q.add("live", ["cm/b"], leading=True)
    q.done("live", rolled=False)
    assert q.get(timeout=0) is None  # the window since the hand-out has not ended
    clock.now += 1.8
    item = q.get(timeout=0)
    assert item is not None and item[1].sources == {"cm/a", "cm/b"} and item[1].changes == 2
    q.done("live", rolled=False)
    clock.now += 2.0  # quiet for a window: the next change is a leading edge again
    q.add("live", ["cm/a"], leading=True)
    assert q.get(timeout=0) is not None


def test_a_change_that_rolls_still_waits_the_window() -> None:
    q, _ = _queue(window=2, interval=0)
    q.add("web", ["cm/a"])
    assert q.get(timeout=0) is None


def test_a_look_with_no_change_does_not_hold_back_the_next_leading_edge() -> None:
    q, clock = _queue(window=2, interval=0)
    q.add("live", ["cm/a"], leading=True)
    assert q.get(timeout=0) is not None
    q.done("live", rolled=False)
    clock.now += 1.0
    q.add("live", [])  # its pods moved: looked at after the window
    clock.now += 2.0
    assert q.get(timeout=0) is not None
    q.done("live", rolled=False)
    clock.now += 0.5  # a window after the last change's pass, not after that look
    q.add("live", ["cm/a"], leading=True)
    assert q.get(timeout=0) is not None
