"""Which namespaces the controller acts in: one watch of Namespaces, by label selector.

A namespace that starts to match (the label was added) is reported, so the controller can
look at its workloads; one that stops matching, or begins terminating, is simply no longer
selected. With a label selector the API server sends ADDED and DELETED as objects start and
stop matching, so the set follows label changes without any filtering here.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable
from typing import Final

from cachetools import TTLCache

from webhook.core.constants import ANN_ROLLOUT_WINDOWS
from webhook.core.model import JSONObject
from webhook.kube.errors import KubeError
from webhook.kube.informer import Informer
from webhook.kube.raw import Kube, path
from webhook.process.config import Settings
from webhook.process.metrics import Metrics

log = logging.getLogger(__name__)

_CONFIRMED_TTL: Final = 5.0
_CONFIRMED_MAX: Final = 1024

NamespaceListener = Callable[[str], None]
"""Called (namespace) from the watch thread when a namespace became selected, or its
`configpin.io/rollout-windows` changed."""


def _active(obj: JSONObject) -> bool:
    meta = obj.get("metadata") or {}
    phase = (obj.get("status") or {}).get("phase")
    return not meta.get("deletionTimestamp") and phase != "Terminating"


class NamespaceSet:
    """The selected namespaces (informer handler). `excluded` are never selected."""

    def __init__(
        self,
        kube: Kube,
        metrics: Metrics,
        *,
        label_selector: str,
        excluded: Collection[str] = (),
    ) -> None:
        self.excluded = frozenset(excluded)
        self.kube = kube
        self.label_selector = label_selector
        # the API server's answers to `confirm`, each kept _CONFIRMED_TTL seconds (under the lock)
        self._confirmed: TTLCache[str, bool] = TTLCache(
            maxsize=_CONFIRMED_MAX, ttl=_CONFIRMED_TTL, timer=time.monotonic
        )
        self.listeners: list[NamespaceListener] = []
        self._names: frozenset[str] = frozenset()
        # configpin.io/rollout-windows of the selected namespaces that set it, as written
        self._windows: dict[str, str] = {}
        self._lock = threading.Lock()
        self.informer = Informer(
            kube, "namespaces", self, metrics, label_selector=label_selector or None
        )

    @classmethod
    def of(cls, kube: Kube, metrics: Metrics, settings: Settings) -> NamespaceSet:
        """The namespaces configpin acts in, as its settings select them."""
        return cls(
            kube,
            metrics,
            label_selector=settings.cluster.namespace_selector,
            excluded=settings.cluster.excluded_namespaces,
        )

    def __contains__(self, namespace: object) -> bool:
        return namespace in self._names

    def names(self) -> frozenset[str]:
        return self._names

    def windows_of(self, namespace: str) -> str | None:
        """The text of the namespace's `configpin.io/rollout-windows` (None: not set)."""
        return self._windows.get(namespace)

    def _windows_moved(self, name: str, obj: JSONObject | None) -> bool:
        """Keep the namespace's window list (`obj` None: gone); whether it changed. (Under
        the lock.)"""
        annotations = ((obj or {}).get("metadata") or {}).get("annotations")
        text = annotations.get(ANN_ROLLOUT_WINDOWS) if isinstance(annotations, dict) else None
        if text is not None and not isinstance(text, str):
            text = str(text)
        before = self._windows.get(name)
        if text is None:
            self._windows.pop(name, None)
        else:
            self._windows[name] = text
        return before != text

    def confirm(self, namespace: str, timeout: float) -> bool:
        """Whether `namespace` is selected, asked of the API server (the selector evaluated
        there). For a namespace the watch has not shown as selected: one labelled a moment
        ago, whose workloads the API server already sends. Answers are kept a few seconds, at
        most a thousand, the expired ones evicted first, then the least recently asked, so a
        stream of reviews naming namespaces that are not selected costs at most one read per
        name and period. Blocks."""
        if not namespace or namespace in self.excluded:
            return False
        if namespace in self._names:
            return True
        with self._lock:
            known = self._confirmed.get(namespace)
        if known is not None:
            return known
        try:
            listed = self.kube.get(
                path("namespaces"),
                timeout=timeout,
                fieldSelector=f"metadata.name={namespace}",
                labelSelector=self.label_selector or None,
            )
            selected = any(_active(obj) for obj in listed.get("items") or ())
        except KubeError as e:
            log.debug("cannot confirm namespace %s: %s", namespace, e)
            return False  # not kept: the next review asks again
        with self._lock:
            self._confirmed[namespace] = selected
        return selected

    def _keep(self, obj: JSONObject) -> str | None:
        name = str((obj.get("metadata") or {}).get("name") or "")
        return name if name and name not in self.excluded and _active(obj) else None

    # --- InformerHandler
    def relisted(self, items: Iterable[JSONObject]) -> None:
        kept = {n: obj for obj in items if (n := self._keep(obj)) is not None}
        fresh = frozenset(kept)
        with self._lock:
            added = fresh - self._names
            self._names = fresh
            moved = {n for n in set(self._windows) | fresh if self._windows_moved(n, kept.get(n))}
        for name in sorted(added | (moved & fresh)):
            self._notify(name)

    def event(self, kind: str, obj: JSONObject) -> None:
        name = str((obj.get("metadata") or {}).get("name") or "")
        kept = None if kind == "DELETED" else self._keep(obj)
        with self._lock:
            was = name in self._names
            if kept is not None:
                self._names = self._names | {kept}
            elif was:
                self._names = self._names - {name}
            moved = self._windows_moved(name, obj if kept is not None else None)
        if kept is not None and (not was or moved):
            # (newly selected; or its window list changed: what waits for it is looked at)
            self._notify(kept)

    def _notify(self, namespace: str) -> None:
        for listener in self.listeners:
            try:
                listener(namespace)
            except Exception:  # a listener's failure must not stop the watch
                log.exception("namespace listener failed for %s", namespace)

    # --- lifecycle
    def start(self) -> None:
        self.informer.start()

    def stop(self) -> None:
        self.informer.stop()

    def synced(self) -> bool:
        return self.informer.synced.is_set()
