"""Kubernetes Events (events.k8s.io/v1) about what configpin did and why, on the workload.

Events are for people (`kubectl describe`, `kubectl events`), best effort and bounded, the way
client-go's recorder does it:

- Repeats of the same event (same object, reason, action, type and note) within
  ``SERIES_WINDOW`` are folded into the first one's ``series`` (count, last observed time),
  written back at most once per ``SERIES_FLUSH`` per event, instead of one object each.
- A token bucket per regarding object (burst ``BURST``, one token per ``REFILL`` seconds) drops
  what a hot loop would otherwise write into etcd; drops are counted.
- One bounded queue and one sender thread: recording never blocks the caller or waits on the
  API server, and a full queue drops (counted) instead of growing.
- An Event about an object being created (admission of a CREATE: the object has no uid yet)
  waits until the object exists and then carries its uid, which `kubectl describe` selects
  Events by. The sender reads the object by name a few times, backing off, for up to
  ``CREATE_WAIT`` seconds (later webhooks and validation may still be running when configpin
  answers); an object created before the admission (a create that will fail as AlreadyExists)
  or never created (another webhook or validation denied it) gets no Event.

A note never carries Secret content: callers name sources and keys, never values.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import queue
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from cachetools import FIFOCache, LRUCache

from webhook.core import digest
from webhook.core.reasons import EVENTS, WARNING, EventReason
from webhook.kube.errors import KubeError, NotFound
from webhook.kube.raw import MERGE_PATCH, Kube

log = logging.getLogger(__name__)

SERIES_WINDOW: Final = 6 * 60.0  # client-go: isomorphic events within 6 minutes are a series
SERIES_FLUSH: Final = 30.0  # at most one series update per event per this many seconds
BURST: Final = 25  # client-go's spam filter: 25 events per object at once...
REFILL: Final = 300.0 / 25  # ...then one more every 12 s (25 per 5 minutes)
QUEUE_SIZE: Final = 1000
CACHE_SIZE: Final = 4096
NOTE_MAX: Final = 1024  # the API server refuses longer notes
FIELD_MAX: Final = 128  # reportingController, reportingInstance (and the table's reasons)
# An object being created: looked for after 0.25 s, then twice as late each time, for up to
# CREATE_WAIT s (above the API server's 30 s ceiling on a webhook's timeout, with room for
# several webhooks after configpin's).
CREATE_FIRST_LOOK: Final = 0.25
CREATE_WAIT: Final = 64.0
CREATE_WAITING_MAX: Final = 256
# creationTimestamp has whole seconds, and the API server's clock is not configpin's: an
# object created up to this long before the admission's own time still counts as created by it
CLOCK_SLACK: Final = 2.0


def _micro_time(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _epoch(stamp: Any) -> float:
    if not isinstance(stamp, str):
        return 0.0
    try:
        return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass(frozen=True)
class Regarding:
    """The object an event is about."""

    api_version: str
    kind: str
    namespace: str
    name: str
    uid: str = ""

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> Regarding:
        meta = obj.get("metadata") or {}
        return cls(
            str(obj.get("apiVersion") or ""),
            str(obj.get("kind") or ""),
            str(meta.get("namespace") or ""),
            str(meta.get("name") or ""),
            str(meta.get("uid") or ""),
        )

    def with_uid(self, uid: str) -> Regarding:
        return Regarding(self.api_version, self.kind, self.namespace, self.name, uid)

    def ref(self) -> dict[str, str]:
        ref = {
            "apiVersion": self.api_version,
            "kind": self.kind,
            "namespace": self.namespace,
            "name": self.name,
        }
        if self.uid:
            ref["uid"] = self.uid
        return ref


def copy_created_note(copy: Mapping[str, Any]) -> str:
    """The note of CopyCreated: which copy, of which source (names only)."""
    reg = Regarding.of(copy)
    source = digest.copy_source_name(copy) or "?"
    return (
        f"created {reg.kind} {reg.name}, an immutable snapshot copy of {reg.kind.lower()}/"
        f"{source}, which the pod template now points at"
    )


@dataclass
class _Series:
    name: str  # the Event object's name
    namespace: str
    last: float  # when it was last observed
    flushed_at: float  # when the API server last heard of it
    count: int = 1
    flushed_count: int = 1


@dataclass
class _Bucket:
    tokens: float
    at: float


@dataclass
class _Item:
    key: tuple[Any, ...]
    regarding: Regarding
    type: str
    reason: str
    action: str
    note: str
    at: float
    related: Regarding | None = None
    creating: str | None = None  # API path of the object being created (no uid yet)
    look_at: float = 0.0  # when to look for it next
    wait: float = 0.0  # how long after `at` it is looked for next


def _key(item: _Item) -> tuple[Any, ...]:
    reg = item.regarding
    return (
        reg.namespace,
        reg.kind,
        reg.name,
        reg.uid,
        item.type,
        item.reason,
        item.action,
        item.note,
    )


@dataclass
class EventRecorder:
    """Records events through `kube`; start() the sender, stop() to flush and end it."""

    kube: Kube
    controller: str  # reportingController, e.g. configpin.io/controller
    instance: str  # reportingInstance, e.g. the pod name
    on_drop: Callable[[str], None] = lambda why: None
    clock: Callable[[], float] = time.time
    _queue: queue.Queue[_Item | None] = field(init=False)
    # (the sender's thread alone uses these two)
    _series: FIFOCache[tuple[Any, ...], _Series] = field(init=False)
    _buckets: LRUCache[tuple[str, str, str], _Bucket] = field(init=False)
    _thread: threading.Thread | None = field(init=False, default=None)
    _creating: list[_Item] = field(init=False)

    def __post_init__(self) -> None:
        self._queue = queue.Queue(QUEUE_SIZE)
        # The series by event, the one repeated last kept longest: a repeat puts it back
        # (FIFO, so that reading them, as a flush does, moves none)
        self._series = FIFOCache(maxsize=CACHE_SIZE)
        self._buckets = LRUCache(maxsize=CACHE_SIZE)  # by regarding object, the last used kept
        self._creating = []
        self.controller = _clip(self.controller, FIELD_MAX)
        self.instance = _clip(self.instance or "configpin", FIELD_MAX)

    # -- the caller's side: never blocks

    def say(
        self,
        regarding: Regarding | Mapping[str, Any],
        reason: EventReason,
        note: str,
        *,
        warning: bool = False,
        related: Regarding | Mapping[str, Any] | None = None,
        creating: str | None = None,
    ) -> None:
        """Queue an Event about `regarding` (an object dict or a Regarding), of the type and
        action the one table gives its reason (webhook.core.reasons.EVENTS); `warning`: its
        Warning, for a reason that has one besides its usual type. `related`: a second object
        it concerns. `creating`: the API path of `regarding`, an object being created now (it
        has no uid yet): the Event is written once it exists, with its uid, and never if it
        does not come to exist."""
        kind = EVENTS[reason]
        type_ = WARNING if warning else kind.types[0]
        if type_ not in kind.types:
            raise ValueError(f"{reason} is never a {type_} Event")
        reg = regarding if isinstance(regarding, Regarding) else Regarding.of(regarding)
        if not reg.name or not reg.namespace or not reg.kind:
            return
        if related is not None and not isinstance(related, Regarding):
            related = Regarding.of(related)
        item = _Item(
            (),
            reg,
            type_,
            reason.value,
            kind.action,
            _clip(note, NOTE_MAX),
            self.clock(),
            related=related,
            creating=creating if not reg.uid else None,
            wait=CREATE_FIRST_LOOK,
        )
        item.key = _key(item)
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self.on_drop("queue full")

    # -- the sender

    def start(self) -> EventRecorder:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="events", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Send what is queued (within `timeout`), then end the sender."""
        if self._thread is None:
            return
        with contextlib.suppress(queue.Full):
            self._queue.put(None, timeout=timeout)
        self._thread.join(timeout)
        self._thread = None

    def _run(self) -> None:
        while True:
            timeout = SERIES_FLUSH
            if self._creating:
                first = min(i.look_at for i in self._creating)
                timeout = max(0.0, min(timeout, first - self.clock()))
            idle = False
            try:
                item = self._queue.get(timeout=timeout)
            except queue.Empty:
                idle, item = True, None  # time to look for objects being created, or flush
            if item is None and not idle:
                self._flush_series(self.clock(), force=True)
                return
            if item is not None:
                self._guarded(self._take, item)
            for waiting in self._due(self.clock()):
                self._guarded(self._look, waiting)
            if idle:
                self._flush_series(self.clock(), force=False)

    def _guarded(self, step: Callable[[_Item], None], item: _Item) -> None:
        try:
            step(item)
        except Exception:  # an event must never take the sender down
            log.exception(
                "could not record event %s on %s/%s",
                item.reason,
                item.regarding.kind,
                item.regarding.name,
            )

    def _take(self, item: _Item) -> None:
        if item.creating is None:
            self._record(item)
            return
        if len(self._creating) >= CREATE_WAITING_MAX:
            self.on_drop("queue full")
            return
        item.look_at = item.at + item.wait
        self._creating.append(item)

    def _due(self, now: float) -> list[_Item]:
        due = [i for i in self._creating if i.look_at <= now]
        if due:
            self._creating = [i for i in self._creating if i.look_at > now]
        return due

    def _look(self, item: _Item) -> None:
        """Look for an object being created: found, the Event is written with its uid."""
        assert item.creating is not None
        try:
            obj = self.kube.get(item.creating, timeout=5.0)
        except NotFound:
            obj = None
        except KubeError as e:
            log.info("looking for %s/%s: %s", item.regarding.kind, item.regarding.name, e)
            obj = None
        if obj is None:
            item.wait *= 2
            item.look_at = item.at + item.wait
            if item.wait <= CREATE_WAIT:
                self._creating.append(item)
            else:  # denied after configpin answered, or never sent on: nothing to say it of
                self.on_drop("never created")
            return
        meta = obj.get("metadata") or {}
        created = _epoch(meta.get("creationTimestamp"))
        if not meta.get("uid") or created < item.at - CLOCK_SLACK:
            # an older object of that name: this create failed (AlreadyExists)
            self.on_drop("never created")
            return
        item.regarding = item.regarding.with_uid(str(meta["uid"]))
        item.creating = None
        item.key = _key(item)
        self._record(item)

    def _allowed(self, reg: Regarding, now: float) -> bool:
        key = (reg.namespace, reg.kind, reg.name)
        bucket = self._buckets.get(key) or _Bucket(float(BURST), now)
        bucket.tokens = min(float(BURST), bucket.tokens + (now - bucket.at) / REFILL)
        bucket.at = now
        self._buckets[key] = bucket
        if bucket.tokens < 1:
            return False
        bucket.tokens -= 1
        return True

    def _record(self, item: _Item) -> None:
        series = self._series.get(item.key)
        if series is not None and item.at - series.last <= SERIES_WINDOW:
            series.count += 1
            series.last = item.at
            self._series[item.key] = series  # (the last repeated: kept longest)
            if item.at - series.flushed_at >= SERIES_FLUSH:
                self._patch_series(series)
            return
        if not self._allowed(item.regarding, item.at):
            self.on_drop("rate limited")
            return
        name = f"{item.regarding.name[:200]}.{int(item.at * 1e9):x}{secrets.token_hex(2)}"
        body = {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": item.regarding.namespace},
            "eventTime": _micro_time(item.at),
            "reportingController": self.controller,
            "reportingInstance": self.instance,
            "action": item.action,
            "reason": item.reason,
            "regarding": item.regarding.ref(),
            "note": item.note,
            "type": item.type,
        }
        if item.related is not None:
            body["related"] = item.related.ref()
        try:
            self.kube.create(
                f"/apis/events.k8s.io/v1/namespaces/{item.regarding.namespace}/events", body
            )
        except KubeError as e:
            log.info(
                "event %s on %s/%s not recorded: %s",
                item.reason,
                item.regarding.kind,
                item.regarding.name,
                e,
            )
            self.on_drop("api error")
            return
        self._series[item.key] = _Series(
            name, item.regarding.namespace, last=item.at, flushed_at=item.at
        )

    def _patch_series(self, series: _Series) -> None:
        patch = {"series": {"count": series.count, "lastObservedTime": _micro_time(series.last)}}
        try:
            self.kube.patch(
                f"/apis/events.k8s.io/v1/namespaces/{series.namespace}/events/{series.name}",
                patch,
                content_type=MERGE_PATCH,
            )
        except NotFound:
            # the event expired (the API server keeps events an hour by default): the next
            # repeat starts a new one
            for key, value in list(self._series.items()):
                if value is series:
                    del self._series[key]
            return
        except KubeError as e:
            log.info("event series %s not updated: %s", series.name, e)
            return
        series.flushed_count = series.count
        series.flushed_at = self.clock()

    def _flush_series(self, now: float, *, force: bool) -> None:
        for series in list(self._series.values()):
            if series.count != series.flushed_count and (
                force or now - series.flushed_at >= SERIES_FLUSH
            ):
                self._patch_series(series)


__all__ = ["EventRecorder", "Regarding", "copy_created_note"]
