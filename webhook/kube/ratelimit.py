"""A client-side rate limit for the controller's requests, as client-go's token bucket has.

A change consumed by thousands of workloads fans out into thousands of reads and writes;
without a bound they arrive at once, compete with every other client of the API server and
fill its priority-and-fairness queues. `RateLimiter` hands out `qps` tokens per second and
banks at most `burst` of them (client-go's `flowcontrol.NewTokenBucketRateLimiter`): a short
fan-out goes at once, a long one at the configured rate, never faster.

Only what the controller fans out goes through it (`LimitedKube`): admission's reads are on
the path of every pod creation and must never wait behind a rollout, and list/watch are a
handful of long requests.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from webhook.core.model import JSONObject, PatchOp
    from webhook.kube.raw import Kube


class RateLimiter:
    """Token bucket: `qps` tokens per second, at most `burst` banked; qps <= 0 is unlimited.

    Thread-safe. Each caller reserves its token under the lock, then sleeps outside it until
    the token is due, so waiters leave in the order they came and none holds the lock asleep.
    """

    def __init__(
        self,
        qps: float,
        burst: int,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        observe: Callable[[float], None] | None = None,
    ) -> None:
        if qps > 0 and burst < 1:
            raise ValueError("burst must be at least 1 when qps is limited")
        self.qps = qps
        self.burst = max(1, burst)
        self._clock = clock
        self._sleep = sleep
        self._observe = observe
        self._lock = threading.Lock()
        self._tokens = float(self.burst)
        self._last = clock()

    @property
    def unlimited(self) -> bool:
        return self.qps <= 0

    def reserve(self) -> float:
        """Take a token now (the balance may go negative): seconds until it is due."""
        if self.unlimited:
            return 0.0
        with self._lock:
            now = self._clock()
            self._tokens = min(float(self.burst), self._tokens + (now - self._last) * self.qps)
            self._last = now
            self._tokens -= 1.0
            return 0.0 if self._tokens >= 0 else -self._tokens / self.qps

    def wait(self) -> float:
        """Block until a token is free; the seconds waited."""
        delay = self.reserve()
        if delay > 0:
            self._sleep(delay)
        if self._observe is not None:
            self._observe(delay)
        return delay


class LimitedKube:
    """The request methods of a `Kube`, each after a token of `limiter`."""

    def __init__(self, kube: Kube, limiter: RateLimiter) -> None:
        self.kube = kube
        self.limiter = limiter

    def get(self, api_path: str, *, timeout: float | None = None, **query: Any) -> JSONObject:
        self.limiter.wait()
        return self.kube.get(api_path, timeout=timeout, **query)

    def create(self, api_path: str, body: JSONObject, **query: Any) -> JSONObject:
        self.limiter.wait()
        return self.kube.create(api_path, body, **query)

    def replace(self, api_path: str, body: JSONObject) -> JSONObject:
        self.limiter.wait()
        return self.kube.replace(api_path, body)

    def patch(
        self,
        api_path: str,
        body: list[PatchOp] | JSONObject,
        *,
        content_type: str = "application/json-patch+json",
        **query: Any,
    ) -> JSONObject:
        self.limiter.wait()
        return self.kube.patch(api_path, body, content_type=content_type, **query)

    def delete(self, api_path: str, body: JSONObject | None = None) -> JSONObject:
        self.limiter.wait()
        return self.kube.delete(api_path, body)
