"""configpin's change controller run in the calling process, against a real API server, for
tests and benches that drive it directly (its moments that are hard to reach from outside)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from harness.controlplane import wait_for
from webhook.config import Settings
from webhook.controller.rollout import RolloutController, Tuning
from webhook.kube.cache import SourceCache
from webhook.kube.raw import Kube
from webhook.metrics import Metrics


@contextlib.contextmanager
def running_controller(
    kube: Kube,
    hkey: bytes,
    *,
    tuning: Tuning = Tuning(),  # noqa: B008 (frozen)
    watch_timeout: int | None = None,
    timeout: float = 60.0,
    **settings: Any,
) -> Iterator[RolloutController]:
    """A controller (no leader election) over its own source cache, once it acts; `settings`
    as `configpin serve` takes them (Settings fields); `watch_timeout` also shortens the
    source cache's watches."""
    metrics = Metrics()
    cache = SourceCache(kube, hkey, metrics)
    if watch_timeout is not None:
        for informer in cache.informers.values():
            informer.watch_timeout = watch_timeout
    cache.start()
    ctl = RolloutController(
        kube, hkey, cache, metrics, Settings(leader_elect=False, **settings), tuning=tuning
    )
    ctl.start()
    try:
        wait_for(ctl.acting, timeout=timeout, what="the controller to sync and act")
        yield ctl
    finally:
        ctl.stop()
        cache.stop()
