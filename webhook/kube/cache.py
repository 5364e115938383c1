"""The in-memory index of ConfigMaps and Secrets: digests only, never values.

Per object it keeps one bytes object: the number of its layout (the key names, and, only
where they differ from the common case, the Secret type, the ignore flag and the snapshot's
source; shared by every object that has the same), then its 16-byte key digests. Admission
answers from it without an API call; a miss (an object created a moment ago, before its
watch event arrived) reads through with one GET, whose answer is remembered briefly beside
(not in) the index, so it can never replace what the watch says.
"""

from __future__ import annotations

import logging
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Final, Protocol, TypeAlias

from cachetools import FIFOCache, TTLCache

from webhook.core import digest
from webhook.core.constants import LABEL_SNAPSHOT
from webhook.core.model import JSONObject, SourceId, SourceKind, SourceRecord, SourceUnavailable
from webhook.core.rollouts import KEY_DIGEST_HEX, KEY_DIGESTS_SHOWN, KeyDigest
from webhook.inputs.sources import MISS, Miss
from webhook.kube.errors import KubeError, NotFound
from webhook.kube.informer import Informer
from webhook.kube.raw import Kube, path
from webhook.process.metrics import Metrics

log = logging.getLogger(__name__)

_RECENT_TTL: Final = 10.0
_RECENT_MAX: Final = 10_000
_RECORDS_MAX: Final = 4096  # records handed to admission, kept for their memoized digests


def _field_selector(kind: SourceKind) -> str | None:
    """The types of `kind` no pod consumes (its `unwatched_types`), filtered out by the API
    server itself, so they are neither sent nor parsed: Helm keeps every release revision as
    a Secret of 100 KB to 1 MB, often the largest objects in a cluster. A pod that names one
    anyway is answered by a read-through, like any object the watch has not delivered."""
    return ",".join(f"type!={t}" for t in kind.facts.unwatched_types) or None


ChangeListener = Callable[[str, SourceId], None]
"""Called (namespace, source) from a watch thread when a source's content or presence changed."""


class SnapshotObserver(Protocol):
    """Sees configpin's own copies go by on the cache's watches (no second watch of the same
    resource). Called from the watch threads; must not keep the objects (they hold values)."""

    def relisted(self, kind: SourceKind, copies: Sequence[JSONObject]) -> None:
        """Every object of `kind` labelled as a snapshot, after a (re)list."""
        ...

    def event(self, kind: SourceKind, event: str, obj: JSONObject) -> None:
        """Every watch event of `kind` (copies or not: a label can be removed)."""
        ...


def is_snapshot(obj: JSONObject) -> bool:
    return ((obj.get("metadata") or {}).get("labels") or {}).get(LABEL_SNAPSHOT) == "true"


def _observe(fn: Callable[..., None], *args: object) -> None:
    try:
        fn(*args)
    except Exception:
        log.exception("snapshot observer %s failed", getattr(fn, "__qualname__", fn))


# (secret type, ignored, snapshot of, shared, approved, approved --now, Reloader's mark, paused
# by, aborted by, retried)
_Extra: TypeAlias = (
    tuple[
        str | None,
        bool,
        str | None,
        bool,
        str | None,
        str | None,
        str | None,
        str | None,
        str | None,
        tuple[float, str] | None,
    ]
    | None
)
_Layout: TypeAlias = tuple[tuple[str, ...], _Extra]
_ID: Final = struct.Struct("<I")
_NO_EXTRA: Final = (None, False, None, False, None, None, None, None, None, None)  # (most)


class _Layouts:
    """What entries share: the key names (in order) and the rare extras (a Secret type
    other than Opaque, the ignore flag, a snapshot's source). An entry names its layout by
    number, so that one cached object is a single bytes object: its layout's number, then
    its 16-byte key digests. Equal entries are equal bytes."""

    def __init__(self) -> None:
        self._list: list[_Layout] = []
        self._ids: dict[_Layout, int] = {}
        self._lock = threading.Lock()  # both kinds' watch threads add

    def number(self, keys: tuple[str, ...], extra: _Extra) -> int:
        layout = (keys, extra)
        found = self._ids.get(layout)
        if found is None:
            with self._lock:
                found = self._ids.get(layout)
                if found is None:
                    keys = tuple(sys.intern(k) for k in keys)
                    found = len(self._list)
                    self._list.append((keys, extra))
                    self._ids[(keys, extra)] = found
        return found

    def __getitem__(self, number: int) -> _Layout:
        return self._list[number]

    def __len__(self) -> int:
        return len(self._list)


def _record(layouts: _Layouts, entry: bytes, kind: SourceKind, name: str) -> SourceRecord:
    keys, extra = layouts[_ID.unpack_from(entry)[0]]
    size, at = digest.KEY_DIGEST_SIZE, _ID.size
    kd = {k: entry[at + i * size : at + (i + 1) * size] for i, k in enumerate(keys)}
    (
        secret_type,
        ignored,
        snapshot_of,
        shared,
        approved,
        approved_now,
        reloader,
        paused_by,
        aborted_by,
        retried,
    ) = extra or _NO_EXTRA
    if secret_type is None:
        secret_type = kind.facts.default_type
    return SourceRecord(
        kind,
        name,
        kd,
        secret_type=secret_type,
        ignored=ignored,
        snapshot_of=snapshot_of,
        shared=shared,
        approved=approved,
        approved_now=approved_now,
        reloader=reloader,
        paused_by=paused_by,
        aborted_by=aborted_by,
        retried=retried,
    )


# A change's keys, the first _DIGESTS_KEPT of them by name, and their digests: per key a flag
# byte (1: an old digest, 2: a new one), then the old and the new digest's first _SHORT bytes.
_Changed: TypeAlias = tuple[frozenset[str], tuple[str, ...], bytes]
_DIGESTS_KEPT: Final = KEY_DIGESTS_SHOWN
_SHORT: Final = KEY_DIGEST_HEX // 2
_PAIR: Final = 1 + 2 * _SHORT


def _pack_pair(old: bytes | None, new: bytes | None) -> bytes:
    flag = (1 if old is not None else 0) | (2 if new is not None else 0)
    zero = bytes(_SHORT)
    return bytes((flag,)) + (old or zero)[:_SHORT] + (new or zero)[:_SHORT]


def _unpack_pair(packed: bytes, i: int) -> tuple[str | None, str | None]:
    at = i * _PAIR
    flag = packed[at]
    old = packed[at + 1 : at + 1 + _SHORT].hex() if flag & 1 else None
    new = packed[at + 1 + _SHORT : at + _PAIR].hex() if flag & 2 else None
    return old, new


class _KindIndex:
    """Handler of one informer: namespace -> name -> entry."""

    def __init__(self, cache: SourceCache, kind: SourceKind) -> None:
        self.cache = cache
        self.kind = kind
        self.by_ns: dict[str, dict[str, bytes]] = {}

    def _entry(self, obj: JSONObject) -> bytes | None:
        try:
            rec = digest.record_from_object(self.cache.hkey, self.kind, obj)
        except digest.BadSource:
            return None
        return self.cache.pack(rec)

    def relisted(self, items: Iterable[JSONObject]) -> None:
        fresh: dict[str, dict[str, bytes]] = {}
        observers = self.cache.snapshot_observers
        copies: list[JSONObject] = []
        seen: list[JSONObject] = []
        watchers = self.cache.version_observers
        for obj in items:
            meta = obj.get("metadata") or {}
            entry = self._entry(obj)
            if entry is not None:
                ns = sys.intern(str(meta.get("namespace", "")))
                fresh.setdefault(ns, {})[str(meta.get("name", ""))] = entry
            if observers and is_snapshot(obj):
                copies.append(obj)
            if watchers:
                seen.append(obj)
        old, self.by_ns = self.by_ns, fresh
        for obj in seen:  # (after the entries they describe are in place)
            for watcher in watchers:
                _observe(watcher, self.kind, "ADDED", obj)
        self.cache.update_gauge(self.kind)
        for observer in observers:
            _observe(observer.relisted, self.kind, copies)
        # Whatever changed while we were not watching is a change like any other.
        if self.cache.listeners and self.cache.informers[self.kind].relists > 0:
            for ns in old.keys() | fresh.keys():
                o, f = old.get(ns, {}), fresh.get(ns, {})
                for name in o.keys() | f.keys():
                    if f.get(name) is None or f[name] != o.get(name):
                        self.cache.notify(ns, SourceId(self.kind, name))

    def event(self, kind: str, obj: JSONObject) -> None:
        meta = obj.get("metadata") or {}
        ns = sys.intern(str(meta.get("namespace", "")))
        name = str(meta.get("name", ""))
        names = self.by_ns.setdefault(ns, {})
        before = names.get(name)
        if kind == "DELETED":
            names.pop(name, None)
            after = None
        else:
            after = self._entry(obj)
            if after is None:
                names.pop(name, None)
            else:
                names[name] = after
        self.cache.forget_recent(self.kind, ns, name)
        for observer in self.cache.snapshot_observers:
            _observe(observer.event, self.kind, kind, obj)
        for watcher in self.cache.version_observers:  # (after the entry it describes)
            _observe(watcher, self.kind, kind, obj)
        if after != before:
            self.cache.update_gauge(self.kind)
            if before is not None and after is not None:
                self.cache.note_changed_keys(self.kind, ns, name, before, after)
            self.cache.notify(ns, SourceId(self.kind, name))


class SourceCache:
    """A SourceReader over the cluster (see webhook.inputs.sources.SourceReader)."""

    def __init__(self, kube: Kube, hkey: bytes, metrics: Metrics) -> None:
        self.kube = kube
        self.hkey = hkey
        self.metrics = metrics
        self.listeners: list[ChangeListener] = []
        self.snapshot_observers: list[SnapshotObserver] = []  # add before start()
        # Called with (kind, event, object) for every object seen, after the cache's entry
        # for it is in place: what its uid and resourceVersion are (the ConfigRollouts say
        # which version of a source they are about). Add before start().
        self.version_observers: list[Callable[[SourceKind, str, JSONObject], None]] = []
        self._layouts = _Layouts()
        # What a read-through found, (kind, namespace, name) -> record (None: not found), for
        # _RECENT_TTL seconds. Bounded, and never emptied at once (a flood of lookups of names
        # that do not exist would otherwise evict every answer and turn each lookup into a
        # GET): the expired answers go first, then the least recently used, one at a time.
        self._recent: TTLCache[tuple[SourceKind, str, str], SourceRecord | None] = TTLCache(
            maxsize=_RECENT_MAX, ttl=_RECENT_TTL, timer=time.monotonic
        )
        self._recent_lock = threading.Lock()  # (both caches: the watch threads and readers)
        # (kind, namespace, name) -> the keys its last change changed, and the old and new
        # digests of the first _DIGESTS_KEPT of them, packed (the oldest change forgotten first)
        self._changed_keys: FIFOCache[tuple[SourceKind, str, str], _Changed] = FIFOCache(
            maxsize=_RECENT_MAX
        )
        # id(entry) -> (entry, its record). A plain dict, emptied whole when full: `peek` is
        # every admission's look-up of each source it names, by reader threads and workers at
        # once, and a dict's get, set and clear need no lock. (A cachetools cache would need
        # one, and with it and its Python-level methods a peek of a cached source took 6,600
        # to 8,000 instructions instead of 3,000.)
        self._records: dict[int, tuple[bytes, SourceRecord]] = {}
        self.indexes = {kind: _KindIndex(self, kind) for kind in SourceKind}
        self.informers = {
            kind: Informer(
                kube,
                kind.resource,
                self.indexes[kind],
                metrics,
                field_selector=_field_selector(kind),
            )
            for kind in SourceKind
        }

    # --- lifecycle
    def start(self) -> None:
        for informer in self.informers.values():
            informer.start()

    def stop(self) -> None:
        for informer in self.informers.values():
            informer.stop()

    def synced(self) -> bool:
        return all(i.synced.is_set() for i in self.informers.values())

    def wait_synced(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        return all(
            i.synced.wait(max(0.0, deadline - time.monotonic())) for i in self.informers.values()
        )

    # --- packing
    def pack(self, rec: SourceRecord) -> bytes:
        names = tuple(sorted(rec.key_digests))
        extra = None
        if (
            rec.secret_type != rec.kind.facts.default_type
            or rec.ignored
            or rec.snapshot_of is not None
            or rec.shared
            or rec.approved is not None
            or rec.reloader is not None
            or rec.paused_by is not None
            or rec.aborted_by is not None
            or rec.retried is not None
        ):
            extra = (
                rec.secret_type,
                rec.ignored,
                rec.snapshot_of,
                rec.shared,
                rec.approved,
                rec.approved_now,
                rec.reloader,
                rec.paused_by,
                rec.aborted_by,
                rec.retried,
            )
        number = self._layouts.number(names, extra)
        return b"".join((_ID.pack(number), *(rec.key_digests[k] for k in names)))

    def update_gauge(self, kind: SourceKind) -> None:
        self.metrics.cached_sources.labels(kind.value).set(
            sum(map(len, self.indexes[kind].by_ns.values()))
        )

    def notify(self, namespace: str, sid: SourceId) -> None:
        for listener in self.listeners:
            try:
                listener(namespace, sid)
            except Exception:
                log.exception("change listener failed for %s in %s", sid, namespace)

    def note_changed_keys(
        self, kind: SourceKind, namespace: str, name: str, before: bytes, after: bytes
    ) -> None:
        """Remember which keys the last change of a source changed (names, never values):
        safe delivery names them when a rollout of that change fails."""
        old = _record(self._layouts, before, kind, name).key_digests
        new = _record(self._layouts, after, kind, name).key_digests
        keys = frozenset(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
        if not keys:
            return  # (its content did not change: a verb said of it, an approval)
        kept = tuple(sorted(keys)[:_DIGESTS_KEPT])
        packed = b"".join(_pack_pair(old.get(k), new.get(k)) for k in kept)
        with self._recent_lock:
            self._changed_keys[(kind, namespace, name)] = (keys, kept, packed)

    def changed_keys(self, namespace: str, sid: SourceId) -> frozenset[str] | None:
        """The keys its last change (seen by this process) changed; None: not seen."""
        with self._recent_lock:
            found = self._changed_keys.get((sid.kind, namespace, sid.name))
        return found[0] if found is not None else None

    def changed_digests(self, namespace: str, sid: SourceId) -> tuple[KeyDigest, ...] | None:
        """The old and new keyed digests (hex, short) of the keys its last change (seen by
        this process) changed, the first _DIGESTS_KEPT by name; None: not seen."""
        with self._recent_lock:
            found = self._changed_keys.get((sid.kind, namespace, sid.name))
        if found is None:
            return None
        _, kept, packed = found
        return tuple((k, *_unpack_pair(packed, i)) for i, k in enumerate(kept))

    def forget_recent(self, kind: SourceKind, namespace: str, name: str) -> None:
        with self._recent_lock:
            self._recent.pop((kind, namespace, name), None)

    def __len__(self) -> int:
        return sum(sum(map(len, idx.by_ns.values())) for idx in self.indexes.values())

    # --- SourceReader
    def peek(self, namespace: str, sid: SourceId) -> SourceRecord | Miss | None:
        idx = self.indexes[sid.kind]
        entry = idx.by_ns.get(namespace, {}).get(sid.name)
        if entry is not None:
            # Hand out one record per entry, so the digests memoized on it are reused by
            # every admission until the entry changes (a change is a new entry object).
            held = self._records.get(id(entry))
            if held is not None and held[0] is entry:
                return held[1]
            record = _record(self._layouts, entry, sid.kind, sid.name)
            if len(self._records) >= _RECORDS_MAX:
                self._records.clear()
            self._records[id(entry)] = (entry, record)
            return record
        with self._recent_lock:
            return self._recent.get((sid.kind, namespace, sid.name), MISS)  # (not expired)

    def get(
        self, namespace: str, sid: SourceId, *, timeout: float | None = None
    ) -> SourceRecord | None:
        found = self.peek(namespace, sid)
        if not isinstance(found, Miss):
            return found
        try:
            obj = self.get_object(namespace, sid, timeout=timeout)
            record = None if obj is None else digest.record_from_object(self.hkey, sid.kind, obj)
        except digest.BadSource as e:
            raise SourceUnavailable(str(e)) from e
        with self._recent_lock:
            self._recent[(sid.kind, namespace, sid.name)] = record
        return record

    def get_object(
        self, namespace: str, sid: SourceId, *, timeout: float | None = None
    ) -> JSONObject | None:
        if timeout is not None and timeout <= 0:
            raise SourceUnavailable(f"reading {sid}: no time left")
        try:
            return self.kube.get(path(sid.kind.resource, namespace, sid.name), timeout=timeout)
        except NotFound:
            return None
        except KubeError as e:
            raise SourceUnavailable(f"reading {sid}: {e.status or ''} {e.reason}".strip()) from e
