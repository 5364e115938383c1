"""Publishing each change as an object: the ConfigRollout of every consumed ConfigMap and Secret
(SPEC, "Changes as objects"; what it says: webhook.core.rollouts).

The leader publishes, from memory (the index, the source cache, the wave cut) and the gate's
last answer for each stale workload (`decided`, which the rollout controller hands in after
every look): the one decision, read here as the Events and `configpin status` read it. A
source is published again when it changes (content or any other part: its resourceVersion is
what `kubectl configpin wait` matches), when one of its consumers is looked at or moves, and
when its ConfigRollout is written by anyone else (written back); writes are coalesced per
source (a leading edge, then one pass per window) and skipped when nothing changed.

Each ConfigRollout lives in its source's namespace and is owned by the source, so the garbage
collector takes it with the source; it lists the members of its own namespace only (a shared
change's other namespaces are theirs to read). Nothing is ever decided from one.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any, Final

from webhook.controller.index import WorkloadIndex
from webhook.controller.outcome import Outcome, Poll, RetryAfter, Skipped
from webhook.controller.queue import Pending, RolloutQueue
from webhook.controller.runner import Runner
from webhook.controller.wavecut import WaveCut
from webhook.core import digest
from webhook.core.audit import ChangedBy
from webhook.core.constants import ANN_CHANGED_BY
from webhook.core.current import WorkloadEntry, WorkloadRef, stale_sources
from webhook.core.model import JSONObject, SourceId, SourceKind
from webhook.core.progress import signal_pods
from webhook.core.reasons import SkipReason
from webhook.core.record import Change, State, annotations_of
from webhook.core.rollouts import (
    API_VERSION,
    FAILURE_REASONS,
    GROUP,
    KIND,
    PLURAL,
    VERSION,
    WAIT_REASONS,
    ChangeView,
    MemberState,
    MemberView,
    key_digests_of,
    rollout_name,
    rollout_path,
    rollout_status,
)
from webhook.core.times import format_time
from webhook.core.waves import Wait
from webhook.kube.cache import SourceCache
from webhook.kube.errors import Conflict, KubeError, NotFound
from webhook.kube.informer import Informer
from webhook.kube.ratelimit import LimitedKube
from webhook.kube.raw import Kube, path
from webhook.process.metrics import Metrics

log = logging.getLogger(__name__)

PREFIX: Final = f"/apis/{GROUP}/{VERSION}"
WINDOW: Final = 0.5  # seconds a source's writes are coalesced over (after a leading one)
# A source whose status takes long to work out is published again no sooner than this many
# times that after (it costs the leader at most 1/_SHARE of a core), at most _SPACED_MAX apart.
_SHARE: Final = 20.0
_SPACED_MAX: Final = 5.0
_CHECK_AGAIN: Final = 60.0  # seconds between looks for the CRD while it is not installed
_SIGNAL_MAX: Final = 256  # characters of a failed member's signal shown
Key = tuple[str, SourceId]  # (namespace, source)
_CARRIED: Final = object()  # (a version taken from the ConfigRollout: who changed it, as it said)
_STATES: Final = {
    State.COMPLETE: MemberState.COMPLETE,
    State.LEFT: MemberState.LEFT,
    State.ROLLING: MemberState.ROLLING,
    State.FAILED: MemberState.FAILED,
}


def _sid_of(obj: JSONObject) -> SourceId | None:
    spec = obj.get("spec") or {}
    source = spec.get("source") if isinstance(spec, dict) else None
    if not isinstance(source, dict):
        return None
    for kind in SourceKind:
        if source.get("kind") == kind.facts.api_kind and isinstance(source.get("name"), str):
            return SourceId(kind, source["name"])
    return None


class _Observed:
    """InformerHandler of the ConfigRollouts: what stands, to compare with what is due, and
    a write by anyone but this process is a source to publish again."""

    def __init__(self, publisher: Publisher) -> None:
        self.publisher = publisher
        self.objects: dict[tuple[str, str], JSONObject] = {}
        self.lock = threading.Lock()

    def relisted(self, items: Iterable[JSONObject]) -> None:
        fresh = {}
        for obj in items:
            meta = obj.get("metadata") or {}
            fresh[(str(meta.get("namespace", "")), str(meta.get("name", "")))] = obj
        with self.lock:
            self.objects = fresh
        for (ns, _name), obj in fresh.items():
            self.publisher.seen(ns, obj)

    def event(self, kind: str, obj: JSONObject) -> None:
        meta = obj.get("metadata") or {}
        key = (str(meta.get("namespace", "")), str(meta.get("name", "")))
        with self.lock:
            if kind == "DELETED":
                self.objects.pop(key, None)
            else:
                self.objects[key] = obj
        self.publisher.seen(key[0], obj, deleted=kind == "DELETED")

    def get(self, namespace: str, name: str) -> JSONObject | None:
        with self.lock:
            return self.objects.get((namespace, name))

    def wrote(self, obj: JSONObject) -> None:
        """What this process's write stored: what the next write starts from, so that it
        need not wait for its own event (a write from a version the watch has not passed on
        yet would be refused, 409, and worked out again)."""
        meta = obj.get("metadata") or {}
        with self.lock:
            self.objects[(str(meta.get("namespace", "")), str(meta.get("name", "")))] = obj


class Publisher:
    def __init__(
        self,
        kube: Kube | LimitedKube,
        watch_kube: Kube,
        hkey: bytes,
        index: WorkloadIndex,
        cut: WaveCut,
        cache: SourceCache,
        metrics: Metrics,
        *,
        in_scope: Callable[[str], bool],
        acting: Callable[[], bool],
        resync_period: float,
        wall: Callable[[], float] = time.time,
        watch_timeout: int = 300,
    ) -> None:
        """`kube`: the controller's rate-limited client (the writes); `watch_kube`: the
        watches'."""
        self.kube = kube
        self.hkey = hkey
        self.index = index
        self.cut = cut
        self.cache = cache
        self.in_scope = in_scope
        self.acting = acting
        self.wall = wall
        self._lock = threading.Lock()
        # The gate's last answer for each stale workload it held, with the changes its sources
        # were at then (a newer change is not said to wait for what held the one before).
        self._decided: dict[WorkloadRef, tuple[Wait, frozenset[Change]]] = {}
        # What each consumed source was last seen as: (uid, resourceVersion, changed-by text).
        self._versions: dict[tuple[SourceKind, str, str], tuple[str, str, Any]] = {}
        self._written: dict[tuple[str, str], str] = {}  # the resourceVersion of our last write
        self._due: dict[Key, float] = {}  # (monotonic) not published again before then
        self.installed: bool | None = None  # the CRD (None: not looked yet)
        self._looked = 0.0
        self.observed = _Observed(self)
        self.informer = Informer(
            watch_kube, PLURAL, self.observed, metrics, prefix=PREFIX, watch_timeout=watch_timeout
        )
        self.runner: Runner[Key, None] = Runner(
            "publish",
            self._publish,
            RolloutQueue(window=WINDOW, min_interval=0.0),
            workers=2,
            is_leading=self.acting,
            on_leading=self.publish_all,
            resync=self.publish_all,
            resync_period=resync_period,
            retry_limit=None,
        )
        cache.version_observers.append(self.source_seen)

    # --- lifecycle
    def start(self) -> None:
        if self._installed():
            self.informer.start()
        self.runner.start()

    def stop(self, timeout: float = 5.0) -> None:
        self.runner.stop(timeout)
        self.informer.stop()
        if self.source_seen in self.cache.version_observers:
            self.cache.version_observers.remove(self.source_seen)

    def _installed(self) -> bool:
        """The CRD is installed (looked at again every minute while it is not: the chart
        may be upgraded to one that has it)."""
        now = time.monotonic()
        if self.installed or (self.installed is False and now - self._looked < _CHECK_AGAIN):
            return bool(self.installed)
        self._looked = now
        try:
            self.kube.get(PREFIX)
            found = True
        except NotFound:
            found = False
        except KubeError as e:
            log.warning("ConfigRollouts: cannot ask whether the CRD is installed: %s", e)
            return False
        if found and self.installed is False:
            self.informer.start()
        if not found and self.installed is None:
            log.warning(
                "ConfigRollouts are not published: the CRD %s.%s is not installed (the chart "
                "installs it)",
                PLURAL,
                GROUP,
            )
        self.installed = found
        return found

    # --- what to publish again (watch threads, workers: memory only)
    def mark(self, namespace: str, sid: SourceId) -> None:
        """Publish the source's ConfigRollout again: at once (then coalesced over WINDOW),
        or, where working its status out took long (a change of a thousand members), no
        sooner than `_SHARE` times that after the last (`_publish`)."""
        key = (namespace, sid)
        with self._lock:
            due = self._due.get(key, 0.0) - time.monotonic()
            if due <= 0:
                self._due.pop(key, None)
        if due > 0:
            self.runner.queue.add(key, (), delay=due)
        else:
            self.runner.queue.add(key, (), leading=True)

    def mark_entry(self, entry: WorkloadEntry | None) -> None:
        if entry is not None:
            for use in entry.consumes:
                self.mark(entry.ref.namespace, use.source)

    def moved(self, entry: WorkloadEntry, before: WorkloadEntry | None) -> None:
        """A workload as its watch saw it, over `before`: a new consumer, or one whose
        references changed, moves every source it consumes (their counts); one whose rollout
        moved, the sources of its rollout's changes; one whose updated or ready pods moved,
        the sources of the changes it is a member not done of (its rollout's, rolling or
        failed; those it is stale for), whose ConfigRollouts show its pods. Nothing else of
        it moves a ConfigRollout."""
        ns = entry.ref.namespace
        if before is None or before.consumes != entry.consumes:
            self.mark_entry(entry)
            self.mark_entry(before)
        elif before.rollout != entry.rollout or before.standing != entry.standing:
            for brief in (before.rollout, entry.rollout):
                for c in brief.changes if brief is not None else ():
                    self.mark(ns, c.source)
        elif before.replicas != entry.replicas:
            brief = entry.rollout
            if brief is not None and brief.state in (State.ROLLING, State.FAILED):
                for c in brief.changes:
                    self.mark(ns, c.source)
            for sid in stale_sources(entry, lambda s: self.cut.peek(ns, s), self.hkey):
                self.mark(ns, sid)

    def decided(self, ref: WorkloadRef, wait: Wait | None, stale: Iterable[SourceId]) -> None:
        """The gate's answer for `ref` when it was last looked at (None: it was not held),
        for its `stale` sources. Kept as the answer for the changes its sources are at now
        (every source it is stale for, as memory holds them): once a source moves on, the
        newer change's ConfigRollout says the workload is not decided yet (pending) until the
        gate answers for that change, not that it waits for the approval, the wave or the
        window that held the change before."""
        stale = frozenset(stale)
        changes: frozenset[Change] = frozenset()
        if wait is not None:
            ns = ref.namespace
            entry = self.index.get(ref)
            sids = set(stale)
            if entry is not None:
                sids |= stale_sources(entry, lambda s: self.cut.peek(ns, s), self.hkey)
            found = (self.cut.change(ns, sid) for sid in sids)
            changes = frozenset(c for c in found if c is not None)
        with self._lock:
            if wait is None:
                self._decided.pop(ref, None)
            else:
                self._decided[ref] = (wait, changes)
        for sid in stale:
            self.mark(ref.namespace, sid)

    def forget(self, entry: WorkloadEntry) -> None:
        """A workload the index no longer holds."""
        with self._lock:
            self._decided.pop(entry.ref, None)
        self.mark_entry(entry)

    def source_seen(self, kind: SourceKind, event: str, obj: JSONObject) -> None:
        """SourceCache version observer: a source as its watch saw it."""
        meta = obj.get("metadata") or {}
        ns, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        sid = SourceId(kind, name)
        key = (kind, ns, name)
        consumed = bool(self.index.consumers(ns, sid))
        with self._lock:
            if event == "DELETED" or not consumed:
                self._versions.pop(key, None)
            else:
                self._versions[key] = (
                    str(meta.get("uid", "")),
                    str(meta.get("resourceVersion", "")),
                    annotations_of(obj).get(ANN_CHANGED_BY),
                )
        if consumed and event != "DELETED":
            self.mark(ns, sid)

    def seen(self, namespace: str, obj: JSONObject, *, deleted: bool = False) -> None:
        """A ConfigRollout as its watch saw it: one this process did not write last is
        published again (written back, or made again when deleted)."""
        meta = obj.get("metadata") or {}
        key = (namespace, str(meta.get("name", "")))
        with self._lock:
            ours = not deleted and self._written.get(key) == meta.get("resourceVersion")
        sid = _sid_of(obj)
        if not ours and sid is not None and self.in_scope(namespace):
            self.mark(namespace, sid)

    def publish_all(self) -> None:
        """Every consumed source where configpin acts (a new leadership, a resync)."""
        if not self._installed():
            return
        sources = {
            (e.ref.namespace, use.source)
            for e in self.index.entries()
            if self.in_scope(e.ref.namespace)
            for use in e.consumes
        }
        for ns, sid in sources:
            self.runner.queue.add((ns, sid), ())

    # --- the work
    def _version(self, ns: str, sid: SourceId) -> tuple[str, str, Any] | None:
        """The source's uid, resourceVersion and changed-by record: as its watch saw them;
        else (a process that started before the index knew the source was consumed) as its
        ConfigRollout says them, where that one was written for the content the source holds
        and its owner is that source; else as read. Kept from then on."""
        key = (sid.kind, ns, sid.name)
        with self._lock:
            found = self._versions.get(key)
        if found is not None:
            return found
        record = self.cut.peek(ns, sid)
        if record is None:
            return None
        content = digest.content_id(digest.source_digest(self.hkey, record))
        found = _described(self.observed.get(ns, rollout_name(sid.kind, sid.name)), content)
        if found is None:
            try:
                obj = self.kube.get(path(sid.kind.resource, ns, sid.name))
            except NotFound:
                return None
            read = digest.record_from_object(self.hkey, sid.kind, obj)
            if digest.source_digest(self.hkey, read) != digest.source_digest(self.hkey, record):
                raise _Behind
            meta = obj.get("metadata") or {}
            found = (
                str(meta.get("uid", "")),
                str(meta.get("resourceVersion", "")),
                annotations_of(obj).get(ANN_CHANGED_BY),
            )
        with self._lock:
            self._versions.setdefault(key, found)  # (a watch event since says it better)
            return self._versions[key]

    def _publish(self, key: Key, _pending: Pending[None]) -> Outcome:
        ns, sid = key
        if not self._installed():
            return Skipped(SkipReason.UNCHANGED)
        if not self.in_scope(ns):
            return Skipped(SkipReason.NAMESPACE)  # (another's to publish, or no one's)
        name = rollout_name(sid.kind, sid.name)
        standing = self.observed.get(ns, name)
        consumers = self.index.consumers(ns, sid)
        try:
            version = self._version(ns, sid) if consumers else None
        except _Behind:
            return Poll(WINDOW)  # (the cache has not seen what the API server holds yet)
        record = self.cut.peek(ns, sid)
        if version is None or record is None:
            if standing is not None and not consumers:
                self._delete(ns, name, standing)
            return Skipped(SkipReason.UNCHANGED)
        uid, resource_version, changed_by = version
        change = self.cut.change_to(ns, sid, record)
        began = time.monotonic()
        status = self._status(ns, sid, change, consumers, uid, resource_version, changed_by)
        took = time.monotonic() - began
        if took * _SHARE > WINDOW:
            with self._lock:
                self._due[key] = began + min(took * _SHARE, _SPACED_MAX)
        try:
            self._write(ns, name, sid, uid, standing, status)
        except Conflict:
            return Poll(WINDOW)
        except NotFound:
            return Poll(WINDOW)  # (deleted meanwhile: made again)
        except KubeError as e:
            return RetryAfter(f"writing ConfigRollout {ns}/{name}: {e}")
        return Skipped(SkipReason.UNCHANGED)

    def _member(self, ref: WorkloadRef, change: Change, wave: int) -> MemberView:
        entry = self.index.get(ref)
        one = partial(MemberView, ref.namespace, ref.kind, ref.name, wave)
        counts = entry.replicas if entry is not None else None
        state = self.cut.state(ref, change)
        if state is not None:
            shown = _STATES[state]
            if shown is MemberState.FAILED:
                rolled = self.cut.rollout_for(entry, change) if entry is not None else None
                action = rolled.action if rolled is not None else None
                signal = rolled.signal[:_SIGNAL_MAX] if rolled is not None else ""
                reason = FAILURE_REASONS[action]
                return one(shown, reason, signal, replicas=counts, pods=signal_pods(signal))
            return one(shown, replicas=counts)
        with self._lock:
            found = self._decided.get(ref)
        if found is not None and change in found[1]:
            wait = found[0]
            until = format_time(wait.until) if wait.until is not None else None
            return one(MemberState.WAITING, WAIT_REASONS[wait.reason], wait.why, until, counts)
        return one(MemberState.PENDING, replicas=counts)

    def _status(
        self,
        ns: str,
        sid: SourceId,
        change: Change,
        consumers: list[WorkloadEntry],
        uid: str,
        resource_version: str,
        changed_by: Any,
    ) -> dict[str, Any]:
        plan = self.cut.current(change).plan
        here = {e.ref for e in consumers}
        waves = [
            [self._member(ref, change, i) for ref in wave if ref in here]
            for i, wave in enumerate(plan, 1)
        ]
        standing = self.observed.get(ns, rollout_name(sid.kind, sid.name)) or {}
        if changed_by is _CARRIED:
            view = _carried_view(standing, change.content)
        else:
            said = ChangedBy.decode(self.hkey, ns, sid, changed_by, change.content)
            keys = said.keys if said is not None and said.keys is not None else None
            if keys is None:
                known = self.cache.changed_keys(ns, sid)
                keys = tuple(sorted(known)) if known is not None else None
            digests = self.cache.changed_digests(ns, sid)
            if digests is None:  # (not seen by this process: as it said of this content)
                digests = _carried_view(standing, change.content).digests
            view = ChangeView(
                change.content,
                keys,
                said.user if said is not None else None,
                format_time(said.at) if said is not None else None,
                digests,
            )
        generation = int((standing.get("metadata") or {}).get("generation") or 1)
        return rollout_status(
            source=str(sid),
            uid=uid,
            resource_version=resource_version,
            generation=generation,
            change=view,
            waves=waves,
            consumers=len(here),
            now=format_time(self.wall()),
            previous=standing.get("status") or {},
            paused=self.cut.paused(ns, change),
            aborted=self.cut.aborted(ns, change),
        )

    def _write(
        self,
        ns: str,
        name: str,
        sid: SourceId,
        uid: str,
        standing: JSONObject | None,
        status: dict[str, Any],
    ) -> None:
        spec = {"source": {"kind": sid.kind.facts.api_kind, "name": sid.name}}
        owner = {
            "apiVersion": "v1",
            "kind": sid.kind.facts.api_kind,
            "name": sid.name,
            "uid": uid,
        }
        if standing is not None:
            owners = (standing.get("metadata") or {}).get("ownerReferences") or []
            if not any(isinstance(o, dict) and o.get("uid") == uid for o in owners):
                # a source made again under the same name: its ConfigRollout is a new one
                self._delete(ns, name, standing)
                standing = None
        if standing is None:
            body = {
                "apiVersion": API_VERSION,
                "kind": KIND,
                "metadata": {
                    "name": name,
                    "namespace": ns,
                    "labels": {"app.kubernetes.io/managed-by": "configpin"},
                    "ownerReferences": [owner],
                },
                "spec": spec,
            }
            standing = self.kube.create(rollout_path(ns), body)
            self.observed.wrote(standing)
        elif standing.get("spec") != spec:
            # written by someone else: written back (its generation moves on)
            standing = self.kube.replace(rollout_path(ns, name), {**standing, "spec": spec})
            self.observed.wrote(standing)
        meta = standing.get("metadata") or {}
        status["observedGeneration"] = int(meta.get("generation") or 1)
        for c in status.get("conditions") or []:
            c["observedGeneration"] = status["observedGeneration"]
        if _same(standing.get("status"), status):
            return
        written = self.kube.replace(
            rollout_path(ns, name) + "/status", {**standing, "status": status}
        )
        self.observed.wrote(written)
        with self._lock:
            self._written[(ns, name)] = str((written.get("metadata") or {}).get("resourceVersion"))

    def _delete(self, ns: str, name: str, standing: JSONObject) -> None:
        meta = standing.get("metadata") or {}
        with contextlib.suppress(NotFound, Conflict):
            self.kube.delete(rollout_path(ns, name), {"preconditions": {"uid": meta.get("uid")}})
        with self._lock:
            self._written.pop((ns, name), None)


def _described(standing: JSONObject | None, content: str) -> tuple[str, str, Any] | None:
    """The source version a ConfigRollout's status is about, when it describes `content` and
    names as its source the object that owns it; the changed-by record is not carried (who
    and when are said again from the source's own record at its next event)."""
    if standing is None:
        return None
    status = standing.get("status") or {}
    source = status.get("source") if isinstance(status, dict) else None
    change = status.get("change") if isinstance(status, dict) else None
    owners = (standing.get("metadata") or {}).get("ownerReferences") or []
    if not isinstance(source, dict) or not isinstance(change, dict):
        return None
    uid, version = source.get("uid"), source.get("resourceVersion")
    if not isinstance(uid, str) or not isinstance(version, str) or change.get("content") != content:
        return None
    if not any(isinstance(o, dict) and o.get("uid") == uid for o in owners):
        return None
    return uid, version, _CARRIED


def _carried_view(standing: JSONObject, content: str) -> ChangeView:
    """The change as the ConfigRollout said it (`_described`: about this very content; else
    nothing of it)."""
    change = (standing.get("status") or {}).get("change") or {}
    if not isinstance(change, dict) or change.get("content") != content:
        return ChangeView(content)
    keys = change.get("keys")
    by, at = change.get("changedBy"), change.get("changedAt")
    return ChangeView(
        content,
        tuple(str(k) for k in keys) if isinstance(keys, list) else None,
        by if isinstance(by, str) else None,
        at if isinstance(at, str) else None,
        key_digests_of(change),
    )


class _Behind(Exception):
    """The source cache has not seen the content the API server holds yet."""


def _same(before: Any, after: dict[str, Any]) -> bool:
    """Nothing but the time of writing differs (conditions keep their transition times)."""
    if not isinstance(before, dict):
        return False
    return before == after
