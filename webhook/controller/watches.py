"""The watches of the workload kinds: one informer per kind this cluster serves, keeping the
controller's index (source -> workloads) and checking each workload that changed."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from typing import Protocol

from webhook.controller.index import WorkloadIndex
from webhook.core.current import WorkloadEntry, WorkloadRef
from webhook.core.kinds import custom_kinds
from webhook.core.model import JSONObject
from webhook.core.owners import operator_owned
from webhook.core.reasons import SkipReason
from webhook.kube.errors import KubeError
from webhook.kube.events import Regarding
from webhook.kube.informer import Informer
from webhook.kube.raw import Kube
from webhook.kube.workloads import Served, discover_kinds, served_custom_kinds
from webhook.process.metrics import Metrics

log = logging.getLogger(__name__)


class Indexed(Protocol):
    """What the watches ask of the controller they feed (webhook.controller.rollout's
    RolloutController): its index, what a workload's entry is, and what to do when one moves."""

    index: WorkloadIndex

    def entry(self, obj: JSONObject) -> WorkloadEntry | SkipReason: ...

    def forget(self, ref: WorkloadRef) -> None: ...

    def report_owned(self, obj: JSONObject) -> None: ...

    def check_all(self, *, kind: str | None = None, namespace: str | None = None) -> int: ...

    def check(
        self, entry: WorkloadEntry, *, seen: float | None = None, pods_moved: bool = False
    ) -> bool: ...

    def rollout_moved(self, entry: WorkloadEntry, before: WorkloadEntry | None) -> None: ...

    def workload_removed(self, entry: WorkloadEntry) -> None: ...


class KindHandler:
    """The informer handler of one workload kind: keeps that kind's index entries."""

    def __init__(self, controller: Indexed, kind: str) -> None:
        self.controller = controller
        self.kind = kind

    def _entry(self, obj: JSONObject) -> WorkloadEntry | None:
        obj.setdefault("kind", self.kind)  # list items carry no kind
        try:
            entry = self.controller.entry(obj)
        except Exception:
            # Never let one odd object stop the watch (it would fail again on every retry).
            meta = obj.get("metadata") or {}
            log.exception(
                "cannot index %s %s/%s", self.kind, meta.get("namespace"), meta.get("name")
            )
            return None
        if isinstance(entry, SkipReason):
            if entry is SkipReason.OWNED and operator_owned(obj):
                self.controller.report_owned(obj)
            return None
        return entry

    def relisted(self, items: Iterable[JSONObject]) -> None:
        entries = [e for e in map(self._entry, items) if e is not None]
        c = self.controller
        for ref in c.index.replace_kind(self.kind, entries):
            c.forget(ref)
        c.check_all(kind=self.kind)

    def event(self, kind: str, obj: JSONObject) -> None:
        c = self.controller
        meta = obj.get("metadata") or {}
        ref = WorkloadRef(self.kind, str(meta.get("namespace", "")), str(meta.get("name", "")))
        entry = None if kind == "DELETED" else self._entry(obj)
        if entry is None:
            gone = c.index.remove(ref)
            if gone is not None:
                if kind == "DELETED":
                    c.forget(ref)
                c.workload_removed(gone)
            return
        old = c.index.put(entry)
        if old != entry:
            try:
                c.check(entry, pods_moved=old is None or old.pods != entry.pods)
                c.rollout_moved(entry, old)
            except Exception:  # the watch must go on
                log.exception("checking %s failed", entry.ref)
        else:
            if entry.rolling:
                c.check(entry)  # its status moved: how is the rollout going?
            elif old is not None and old.held and not entry.held:
                c.check(entry)  # its configpin.io/held taken away (a re-apply): said again
            if old is not None and old.replicas != entry.replicas:
                c.rollout_moved(entry, old)  # its pods moved: its ConfigRollouts show them


class WorkloadWatches:
    def __init__(
        self, kube: Kube, metrics: Metrics, controller: Indexed, *, watch_timeout: int
    ) -> None:
        self.kube = kube
        self.metrics = metrics
        self.controller = controller
        self.watch_timeout = watch_timeout
        self.kinds: dict[str, Served] = {}  # as this cluster serves them
        self.informers: dict[str, Informer] = {}
        self._stopped = threading.Event()

    def regarding(self, ref: WorkloadRef) -> Regarding:
        """`ref` as an Event's subject (its apiVersion as this cluster serves its kind)."""
        kind = self.kinds.get(ref.kind)
        api_version = kind.api_version if kind is not None else ""
        return Regarding(api_version, ref.kind, ref.namespace, ref.name)

    def discover(self) -> None:
        """Where each kind is served (once; raises KubeError if discovery fails)."""
        if not self.kinds:
            self.kinds.update((k.kind, k) for k in discover_kinds(self.kube))

    def start(self) -> None:
        if not self.informers:
            for kind in self.kinds.values():
                self._watch(kind)

    def _watch(self, kind: Served) -> None:
        informer = Informer(
            self.kube,
            kind.resource,
            KindHandler(self.controller, kind.kind),
            self.metrics,
            prefix=kind.prefix,
            watch_timeout=self.watch_timeout,
        )
        self.kinds[kind.kind] = kind
        self.informers[kind.kind] = informer
        informer.start()

    def watch_new_kinds(self) -> list[str]:
        """Watch the configured custom kinds whose CRD was installed since the start (each
        resync asks discovery again); returns the kinds added."""
        if not custom_kinds():
            return []
        try:
            served = served_custom_kinds(self.kube)
        except KubeError as e:
            log.warning("cannot ask which custom kinds are served (%s); next resync", e)
            return []
        added = []
        for kind in served:
            if kind.kind not in self.informers and not self._stopped.is_set():
                log.info("%s is served now: watching it", kind.kind)
                self._watch(kind)
                added.append(kind.kind)
        return added

    def stop(self) -> None:
        self._stopped.set()
        for informer in self.informers.values():
            informer.stop()
