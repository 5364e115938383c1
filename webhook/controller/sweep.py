"""How long snapshot copies live, part two: a safe sweep of the copies nothing uses.

Copies that nothing owns (an admission that never persisted, owners' references lost) and
that are older than the grace period are marked (an annotation with the time); a later pass,
at least one grace period after the mark, lists everything in the namespace that can
reference a copy (workload templates, revisions, pods) and deletes the copy only if nothing
does, with preconditions on its uid and resourceVersion. A re-use in between (adoption, or
the writer un-marking the copy before an admission points at it) changes the
resourceVersion, so the delete fails and the copy stays.

Only the leader sweeps (`is_leader`). Part one, adoption, is webhook.controller.adoption.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from webhook.controller.adoption import (
    NamespaceFilter,
    SnapshotAdopter,
    pod_specs,
    referenced_names,
)
from webhook.core.kinds import BUILTIN_KINDS, custom_kinds
from webhook.core.model import JSONObject, SourceKind
from webhook.core.reasons import EventReason
from webhook.kube.copies import (
    Copy,
    SnapshotIndex,
    SnapshotWriter,
    delete_unchanged,
    mark,
    unmark,
)
from webhook.kube.errors import KubeError, NotFound
from webhook.kube.events import EventRecorder, Regarding
from webhook.kube.raw import Kube, path
from webhook.process.metrics import Metrics

log = logging.getLogger(__name__)


class Namespaces(Protocol):
    """The namespaces the controller acts in (webhook.kube.namespaces.NamespaceSet)."""

    def __contains__(self, namespace: object) -> bool: ...

    def synced(self) -> bool: ...


def _always(_namespace: str) -> bool:
    return True


# What can reference a copy in a namespace: every kind with a pod template (workloads,
# revisions, pods), at each version it may be served at.
def _referrers() -> list[tuple[str, str, tuple[str, ...]]]:
    kinds = (*BUILTIN_KINDS, *custom_kinds())
    return [(k.resource, k.kind, tuple(k.prefix(v) for v in k.versions)) for k in kinds]


@dataclass
class SweepResult:
    marked: list[str] = field(default_factory=list)
    unmarked: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)  # referenced, or re-used before the delete


class SnapshotSweeper:
    def __init__(
        self,
        kube: Kube,
        index: SnapshotIndex,
        metrics: Metrics,
        *,
        grace: float,
        is_leader: Callable[[], bool] = lambda: True,
        namespace_filter: NamespaceFilter = _always,
        interval: float | None = None,
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        events: EventRecorder | None = None,
    ) -> None:
        self.kube = kube
        self.events = events
        self.index = index
        self.metrics = metrics
        self.grace = grace
        self.is_leader = is_leader
        self.namespace_filter = namespace_filter
        self.interval = interval if interval is not None else min(max(grace / 4, 0.5), 30.0)
        self.wall = wall
        self.monotonic = monotonic
        self._marked_seen: dict[str, float] = {}  # uid -> when this process first saw the mark
        self._referenced_until: dict[str, float] = {}  # uid -> no need to look again before
        self._prefix: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="snapshot-sweep", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            if not self.is_leader():
                self._marked_seen.clear()  # a later leadership starts its own clock
                continue
            try:
                result = self.run_once()
            except Exception:
                log.exception("snapshot sweep failed")
                continue
            if result.deleted:
                log.info("swept %d unused snapshot copies", len(result.deleted))

    def run_once(self) -> SweepResult:
        result = SweepResult()
        now, mono = self.wall(), self.monotonic()
        copies = [c for c in self.index.copies() if self.namespace_filter(c.namespace)]
        live = {c.uid for c in copies}
        for table in (self._marked_seen, self._referenced_until):
            for uid in [u for u in table if u not in live]:
                del table[uid]
        candidates: dict[str, list[Copy]] = {}
        for c in copies:
            if c.unused_since is None:
                self._marked_seen.pop(c.uid, None)
            if c.owners:
                if c.unused_since is not None:  # adopted since it was marked: tidy up
                    self._unmark(c, result)
                continue
            if now - c.created < self.grace or self._referenced_until.get(c.uid, 0.0) > mono:
                continue
            candidates.setdefault(c.namespace, []).append(c)
        for namespace, group in sorted(candidates.items()):
            try:
                used = self.referenced(namespace)
            except KubeError as e:
                log.warning("sweep: cannot list what %s references (%s); next time", namespace, e)
                continue
            for c in group:
                self._sweep_one(c, used, result)
        return result

    def _sweep_one(self, c: Copy, used: set[tuple[SourceKind, str]], result: SweepResult) -> None:
        what = f"{c.kind.value}/{c.name}"
        mono = self.monotonic()
        if (c.kind, c.name) in used:
            # A template that no revision has taken up yet (a paused Deployment, a CronJob
            # between runs, a ReplicationController): keep it, and look again a grace later.
            self._referenced_until[c.uid] = mono + self.grace
            result.kept.append(what)
            if c.unused_since is not None:
                self._unmark(c, result)
            return
        if c.unused_since is None:
            try:
                mark(self.kube, c, self.wall())
            except KubeError as e:  # changed meanwhile (409) or gone: look again next pass
                log.debug("sweep: not marking %s in %s: %s", what, c.namespace, e)
                return
            self._marked_seen[c.uid] = mono
            result.marked.append(what)
            return
        first_seen = self._marked_seen.setdefault(c.uid, mono)
        if mono - first_seen < self.grace:
            return  # writers get a full grace period to see the mark and un-mark on re-use
        if delete_unchanged(self.kube, c):
            self.metrics.snapshots_swept.inc()
            result.deleted.append(what)
            log.info("swept unused %s in %s (marked %s)", what, c.namespace, c.unused_since)
            self._removed(c)
        else:
            result.kept.append(what)  # re-used (or gone) since we looked

    def _removed(self, c: Copy) -> None:
        """CopyRemoved, on the source: the copy is gone, so `kubectl describe` of it finds
        nothing; the source is what people look at (`kubectl events --for configmap/NAME`)."""
        if self.events is None or not c.source:
            return
        kind = c.kind.api_kind
        try:  # its uid, which `kubectl describe` selects Events by (the cache keeps none)
            source = self.kube.get(path(c.kind.resource, c.namespace, c.source))
            uid = str((source.get("metadata") or {}).get("uid") or "")
        except KubeError:
            uid = ""  # gone too (or unreadable): the Event names it all the same
        self.events.say(
            Regarding("v1", kind, c.namespace, c.source, uid),
            EventReason.COPY_REMOVED,
            f"deleted {kind} {c.name}, a snapshot copy of this {kind} that no revision, "
            f"workload or pod used for a grace period (unused since {c.unused_since})",
            related=Regarding("v1", kind, c.namespace, c.name, c.uid),
        )

    def _unmark(self, c: Copy, result: SweepResult) -> None:
        try:
            unmark(self.kube, c.key)
        except KubeError as e:
            log.debug("sweep: un-marking %s/%s: %s", c.kind, c.name, e)
            return
        self._marked_seen.pop(c.uid, None)
        result.unmarked.append(f"{c.kind.value}/{c.name}")

    def referenced(self, namespace: str) -> set[tuple[SourceKind, str]]:
        """Every ConfigMap/Secret name that anything in the namespace references, read fresh
        from the API server (never from a cache that may lag a re-use)."""
        names: set[tuple[SourceKind, str]] = set()
        for resource, kind, prefixes in _referrers():
            names |= referenced_names(
                spec
                for obj in self._list(resource, namespace, prefixes)
                for spec in pod_specs(kind, obj)
            )
        return names

    def _list(self, resource: str, namespace: str, prefixes: tuple[str, ...]) -> list[JSONObject]:
        known = self._prefix.get(resource)
        for prefix in (known,) if known else prefixes:
            try:
                items = [
                    item
                    for page in self.kube.list_pages(path(resource, namespace, prefix=prefix))
                    for item in page.get("items") or ()
                ]
            except NotFound:
                continue
            self._prefix[resource] = prefix
            return items
        if any(k.resource == resource and k.prefix() in prefixes for k in custom_kinds()):
            return []  # a custom kind whose CRD is not installed: nothing references a copy
        raise NotFound(f"list {resource}", 404, "no API version of it is served")


class SnapshotLifetime:
    """The adopter and the sweep, started and stopped together by `configpin serve`.

    They act in the namespaces the controller acts in (`namespaces`, started by its owner),
    and only while `is_leader()`."""

    def __init__(
        self,
        writer: SnapshotWriter,
        *,
        grace: float,
        namespaces: Namespaces,
        is_leader: Callable[[], bool] = lambda: True,
        events: EventRecorder | None = None,
    ) -> None:
        self.namespaces = namespaces
        self.adopter = SnapshotAdopter(
            writer,
            is_leader=lambda: is_leader() and namespaces.synced(),
            namespace_filter=namespaces.__contains__,
            events=events,
        )
        self.sweeper = SnapshotSweeper(
            writer.kube,
            writer.index,
            writer.metrics,
            grace=grace,
            is_leader=lambda: is_leader() and self.ready(),
            namespace_filter=namespaces.__contains__,
            events=events,
        )

    def ready(self) -> bool:
        return self.namespaces.synced() and self.adopter.synced() and self.adopter.cache.synced()

    def start(self) -> None:
        self.adopter.start()
        self.sweeper.start()

    def stop(self) -> None:
        self.sweeper.stop()
        self.adopter.stop()
