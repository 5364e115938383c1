"""The controller's client-side rate limit: client-go's token bucket."""

from __future__ import annotations

import threading
import time

import pytest

from webhook.kube.ratelimit import LimitedKube, RateLimiter


class FakeTime:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_burst_goes_at_once_then_the_rate_applies() -> None:
    t = FakeTime()
    limiter = RateLimiter(10.0, 5, clock=t.clock, sleep=t.sleep)
    waits = [limiter.wait() for _ in range(5)]
    assert waits == [0.0] * 5
    # the sixth has to wait for one token at 10 per second
    assert limiter.wait() == pytest.approx(0.1)
    assert limiter.wait() == pytest.approx(0.1)


def test_idle_time_refills_the_bucket_up_to_burst_only() -> None:
    t = FakeTime()
    limiter = RateLimiter(10.0, 3, clock=t.clock, sleep=t.sleep)
    for _ in range(3):
        limiter.wait()
    t.now += 3600  # an hour idle banks 3 tokens, not 36,000
    assert [limiter.wait() for _ in range(3)] == [0.0] * 3
    assert limiter.wait() == pytest.approx(0.1)


def test_n_requests_take_what_the_rate_implies() -> None:
    t = FakeTime()
    limiter = RateLimiter(50.0, 10, clock=t.clock, sleep=t.sleep)
    start = t.now
    for _ in range(110):
        limiter.wait()
    # 10 from the burst, 100 at 50/s: two seconds, not less
    assert t.now - start == pytest.approx(2.0)


def test_concurrent_callers_never_exceed_the_rate() -> None:
    limiter = RateLimiter(200.0, 1)
    done: list[float] = []
    lock = threading.Lock()

    def worker() -> None:
        for _ in range(10):
            limiter.wait()
            with lock:
                done.append(time.monotonic())

    threads = [threading.Thread(target=worker) for _ in range(8)]
    start = time.monotonic()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len(done) == 80
    # 80 tokens at 200/s with a burst of 1: at least 79/200 s, however the threads interleave
    assert max(done) - start >= 79 / 200 - 0.01


def test_unlimited_never_waits_and_observes() -> None:
    seen: list[float] = []
    limiter = RateLimiter(0, 1, observe=seen.append)
    assert all(limiter.wait() == 0.0 for _ in range(1000))
    assert seen == [0.0] * 1000


def test_burst_must_be_positive_when_limited() -> None:
    with pytest.raises(ValueError, match="burst"):
        RateLimiter(5.0, 0)


class RecordingKube:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def get(
        self, api_path: str, *, timeout: float | None = None, **query: object
    ) -> dict[str, object]:
        self.calls.append(("get", api_path))
        return {}

    def patch(
        self, api_path: str, body: object, *, content_type: str = "", **query: object
    ) -> dict[str, object]:
        self.calls.append(("patch", content_type))
        return {}


def test_limited_kube_takes_a_token_per_request_and_forwards() -> None:
    t = FakeTime()
    limiter = RateLimiter(1.0, 1, clock=t.clock, sleep=t.sleep)
    kube = RecordingKube()
    limited = LimitedKube(kube, limiter)  # type: ignore[arg-type]
    limited.get("/api/v1/namespaces/a/pods/p")
    limited.patch("/api/v1/namespaces/a/pods/p", {}, content_type="application/merge-patch+json")
    assert kube.calls == [
        ("get", "/api/v1/namespaces/a/pods/p"),
        ("patch", "application/merge-patch+json"),
    ]
    assert t.slept == [pytest.approx(1.0)]
