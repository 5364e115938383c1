"""configpin's change controller run in the calling process, against a real API server, for
tests and benches that drive it directly (its moments that are hard to reach from outside)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from typing import Any

from harness.builders import HKEY, WORKLOAD_NAMESPACE, Store
from harness.controlplane import wait_for
from webhook.controller.leader import AlwaysLeader
from webhook.controller.rollout import RolloutController, Tuning
from webhook.core.model import SourceId
from webhook.kube.cache import SourceCache
from webhook.kube.raw import Kube
from webhook.process.config import Settings
from webhook.process.metrics import Metrics


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
    by flag name, as `configpin serve` takes them (`rollout_waves="off"`); `watch_timeout`
    also shortens the source cache's watches."""
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


class PatchClock(Kube):
    """Notes, by API path, when each PATCH of a path containing `marker` was acknowledged
    (`time.perf_counter()`): when a re-stamp or a pod refresh was written, seen from the writer."""

    def __init__(self, api: Any, marker: str) -> None:
        super().__init__(api)
        self.marker = marker
        self.patched: dict[str, float] = {}
        self._lock = threading.Lock()

    def patch(self, api_path: str, patch: Any, content_type: str = "", **query: Any) -> Any:
        out = super().patch(api_path, patch, content_type or "application/json-patch+json", **query)
        if self.marker in api_path:
            with self._lock:
                self.patched[api_path] = time.perf_counter()
        return out


class StoreCache:
    """The source cache's reads (`peek`), answered from a Store, or from one Store per
    namespace. `frozen`: from records made once, as the cache holds them (for benches, which
    must not time the hashing); otherwise from the Store as it is now."""

    def __init__(self, stores: Store | Mapping[str, Store], *, frozen: bool = False) -> None:
        self.stores = {WORKLOAD_NAMESPACE: stores} if isinstance(stores, Store) else stores
        self.frozen: dict[tuple[str, SourceId], Any] | None = None
        if frozen:
            self.frozen = {
                (ns, sid): store.lookup(sid)
                for ns, store in self.stores.items()
                for sid in store.objects
            }
        self.listeners: list[Any] = []
        self.version_observers: list[Any] = []

    def peek(self, namespace: str, sid: SourceId) -> Any:
        if self.frozen is not None:
            return self.frozen.get((namespace, sid))
        return self.stores[namespace].lookup(sid)

    def changed_keys(self, namespace: str, sid: SourceId) -> Any:
        return None


class ApprovingCache(StoreCache):
    """A StoreCache whose sources carry the approvals `approve` (and `approve --now`) record on
    them: the content each names (None: none recorded)."""

    def __init__(self, store: Store) -> None:
        super().__init__(store)
        self.approved: str | None = None
        self.approved_now: str | None = None

    def peek(self, namespace: str, sid: SourceId) -> Any:
        found = super().peek(namespace, sid)
        if found is None:
            return None
        return replace(found, approved=self.approved, approved_now=self.approved_now)


class FixedNamespaces(set[str]):
    """The namespaces configpin acts in, fixed, and their rollout windows (none unless set)."""

    def __init__(self, names: Any, windows: dict[str, str] | None = None) -> None:
        super().__init__(names)
        self.windows = dict(windows or {})

    def windows_of(self, namespace: str) -> str | None:
        return self.windows.get(namespace)


def offline_controller(
    cache: StoreCache,
    metrics: Metrics | None = None,
    *,
    clock: Callable[[], float] = time.monotonic,
    wall: Callable[[], float] = time.time,
    settings: Settings | None = None,
    namespaces: FixedNamespaces | None = None,
) -> RolloutController:
    """A controller with no API client that acts at once (its watches as if synced, always
    the leader): for what it works out from its index and source cache alone, never a write.
    `wall`: its time of day (rollout windows, budgets); `namespaces`: where it acts, and their
    rollout windows (default: WORKLOAD_NAMESPACE, none)."""
    where = FixedNamespaces({WORKLOAD_NAMESPACE}) if namespaces is None else namespaces
    controller = RolloutController(
        None,  # type: ignore[arg-type]  # no API call is made
        HKEY,
        cache,  # type: ignore[arg-type]
        metrics or Metrics(),
        settings or Settings(),
        clock=clock,
        wall=wall,
        namespaces=where,  # type: ignore[arg-type]
    )
    controller._synced.set()  # as after its watches synced
    controller.elector = AlwaysLeader(lambda: None)
    controller.elector.start()
    return controller
