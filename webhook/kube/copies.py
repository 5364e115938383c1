"""Snapshot copies in the cluster: an index of their metadata, the writer admission and the
controller use to make them exist, and the few writes the lifetime controller makes on them.

The copies are found on the source cache's own watches (one watch per resource type): the
index keeps their metadata (uid, resourceVersion, owners, the sweep's mark), never values.

The writer answers from memory when the copy exists (no API call); otherwise it reads the
source, checks that its content still has the digest the plan named (the source may have
changed since planning: a copy whose name lies about its content is never made) and creates
the copy. A copy the sweep has marked for deletion is un-marked by a write before it is
reused: the write changes its resourceVersion, so the sweep's delete, which carries the
resourceVersion it saw as a precondition, fails.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, TypeAlias

from webhook.core import digest
from webhook.core.constants import ANN_UNUSED, SERVICE_ACCOUNT_TOKEN_TYPE
from webhook.core.kinds import CopyOwner, group_of, workload_kind
from webhook.core.model import (
    JSONObject,
    SnapshotRequest,
    SourceId,
    SourceKind,
    SourceRecord,
    SourceUnavailable,
)
from webhook.core.snapshot import snapshot_object
from webhook.kube.cache import SourceCache, is_snapshot
from webhook.kube.errors import AlreadyExists, Conflict, KubeError, NotFound
from webhook.kube.raw import MERGE_PATCH, Kube, path
from webhook.process.metrics import Metrics

log = logging.getLogger(__name__)

STRATEGIC_MERGE_PATCH: Final = "application/strategic-merge-patch+json"
_RECENT_TTL: Final = 10.0

CopyKey: TypeAlias = tuple[SourceKind, str, str]
"""(kind, namespace, name) of a copy."""


class SnapshotError(Exception):
    """A copy could not be made or verified; the object must not point at it."""


def _epoch(timestamp: Any) -> float:
    if not isinstance(timestamp, str):
        return 0.0
    try:
        return datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return 0.0


def now_rfc3339(wall: float) -> str:
    return datetime.fromtimestamp(wall, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True, slots=True)
class Copy:
    """What the index knows of one copy: metadata only."""

    kind: SourceKind
    namespace: str
    name: str
    source: str
    uid: str
    resource_version: str
    created: float  # creationTimestamp, seconds since the epoch (0: unknown)
    owners: frozenset[str]  # uids of its ownerReferences
    unused_since: str | None  # the sweep's mark
    # those uids that own it only while their template points at it (CronJobs, custom kinds)
    cronjobs: frozenset[str] = frozenset()

    @property
    def key(self) -> CopyKey:
        return (self.kind, self.namespace, self.name)

    @classmethod
    def from_object(cls, kind: SourceKind, obj: JSONObject, source: str | None = None) -> Copy:
        meta = obj.get("metadata") or {}
        refs = [
            r for r in meta.get("ownerReferences") or () if isinstance(r, dict) and r.get("uid")
        ]
        owners = frozenset(str(r["uid"]) for r in refs)
        return cls(
            kind=kind,
            namespace=str(meta.get("namespace", "")),
            name=str(meta.get("name", "")),
            source=source or digest.copy_source_name(obj) or "",
            uid=str(meta.get("uid", "")),
            resource_version=str(meta.get("resourceVersion", "")),
            created=_epoch(meta.get("creationTimestamp")),
            owners=owners,
            unused_since=(meta.get("annotations") or {}).get(ANN_UNUSED),
            cronjobs=frozenset(str(r["uid"]) for r in refs if _owns_while_pointing(r)),
        )


def _owns_while_pointing(ref: JSONObject) -> bool:
    """An owner that holds a copy only while its template points at it: a CronJob, or a
    custom workload kind (its revisions, if it keeps any, own the copies they use)."""
    kind = workload_kind(str(ref.get("kind", "")))
    return (
        kind is not None
        and kind.copies is CopyOwner.WHILE_POINTING
        and group_of(str(ref.get("apiVersion", ""))) == kind.group
    )


CopyListener: TypeAlias = Callable[[CopyKey, Copy | None], None]
"""Called from a watch thread when a copy appeared, changed (its metadata) or went (None)."""

LookalikeListener: TypeAlias = Callable[[CopyKey, str], None]
"""Called from a watch thread with the key and uid of a look-alike seen for the first time."""


class SnapshotIndex:
    """configpin's copies, from the source cache's watches (a SnapshotObserver).

    Only proven copies (webhook.core.digest.proven_source: immutable, named after their
    content, signed with the digest key) are indexed, so only they are ever adopted, swept
    or reused. Objects that carry the label without the proof are look-alikes: logged once
    and counted (`configpin_snapshot_lookalikes`), and otherwise left alone."""

    def __init__(self, metrics: Metrics, hkey: bytes) -> None:
        self.metrics = metrics
        self.hkey = hkey
        self.listeners: list[CopyListener] = []
        self.lookalike_listeners: list[LookalikeListener] = []
        self._lock = threading.Lock()
        self._copies: dict[CopyKey, Copy] = {}
        self._per_namespace: dict[str, int] = {}
        self._lookalikes: dict[CopyKey, str] = {}  # key -> uid

    def attach(self, cache: SourceCache) -> None:
        """Observe the cache's watches; before `cache.start()`."""
        cache.snapshot_observers.append(self)

    def _proven(self, kind: SourceKind, obj: JSONObject) -> Copy | None:
        """The Copy of a labelled object that proves it is configpin's, else None (and the
        object is remembered as a look-alike)."""
        meta = obj.get("metadata") or {}
        key: CopyKey = (kind, str(meta.get("namespace", "")), str(meta.get("name", "")))
        try:
            source = digest.proven_source(
                self.hkey, kind, obj, digest.key_digests(self.hkey, kind, obj)
            )
        except digest.BadSource:
            source = None
        if source is not None:
            self._forget_lookalike(key)
            return Copy.from_object(kind, obj, source)
        uid = str(meta.get("uid", ""))
        with self._lock:
            known = self._lookalikes.get(key)
            self._lookalikes[key] = uid
            self._count_lookalikes(kind)
        if known != uid:
            log.warning(
                "%s/%s in %s carries the snapshot label but is not a copy configpin made "
                "(no valid signature, not immutable, or a name that does not match its "
                "content): never adopted, reused or deleted",
                kind.value,
                key[2],
                key[1],
            )
            for listener in self.lookalike_listeners:
                try:
                    listener(key, uid)
                except Exception:
                    log.exception("look-alike listener failed for %s", key)
        return None

    def _forget_lookalike(self, key: CopyKey) -> None:
        if key in self._lookalikes:
            with self._lock:
                if self._lookalikes.pop(key, None) is not None:
                    self._count_lookalikes(key[0])

    def _count_lookalikes(self, kind: SourceKind) -> None:
        """With the lock held."""
        self.metrics.snapshot_lookalikes.labels(kind.value).set(
            sum(1 for k in self._lookalikes if k[0] is kind)
        )

    # --- SnapshotObserver
    def relisted(self, kind: SourceKind, copies: Sequence[JSONObject]) -> None:
        proven = [self._proven(kind, obj) for obj in copies]
        fresh = {c.key: c for c in proven if c is not None}
        listed = {
            (kind, str(m.get("namespace", "")), str(m.get("name", "")))
            for m in (obj.get("metadata") or {} for obj in copies)
        }
        for key in [k for k in self._lookalikes if k[0] is kind and k not in listed]:
            self._forget_lookalike(key)
        with self._lock:
            old = {k: v for k, v in self._copies.items() if k[0] is kind}
            for key in old.keys() - fresh.keys():
                del self._copies[key]
                self._count(key[1], -1)
            for key in fresh.keys() - old.keys():
                self._count(key[1], +1)
            self._copies.update(fresh)
        for key in old.keys() | fresh.keys():
            if fresh.get(key) != old.get(key):
                self._notify(key, fresh.get(key))

    def event(self, kind: SourceKind, event: str, obj: JSONObject) -> None:
        meta = obj.get("metadata") or {}
        key: CopyKey = (kind, str(meta.get("namespace", "")), str(meta.get("name", "")))
        labelled = event != "DELETED" and is_snapshot(obj)
        copy = self._proven(kind, obj) if labelled else None
        if not labelled:
            self._forget_lookalike(key)
        with self._lock:
            before = self._copies.get(key)
            if before is None and copy is None:
                return
            if copy is None:
                del self._copies[key]
                self._count(key[1], -1)
            else:
                self._copies[key] = copy
                if before is None:
                    self._count(key[1], +1)
        self._notify(key, copy)

    def _count(self, namespace: str, delta: int) -> None:
        n = self._per_namespace.get(namespace, 0) + delta
        gauge = self.metrics.snapshots_current
        if n > 0:
            self._per_namespace[namespace] = n
            gauge.labels(namespace).set(n)
        elif self._per_namespace.pop(namespace, None) is not None:
            gauge.remove(namespace)  # namespaces come and go: drop the series

    def _notify(self, key: CopyKey, copy: Copy | None) -> None:
        for listener in self.listeners:
            try:
                listener(key, copy)
            except Exception:
                log.exception("copy listener failed for %s", key)

    # --- queries
    def get(self, key: CopyKey) -> Copy | None:
        return self._copies.get(key)

    def copies(self) -> list[Copy]:
        with self._lock:
            return list(self._copies.values())

    def lookalikes(self) -> list[tuple[CopyKey, str]]:
        """The look-alikes known now: key and uid."""
        with self._lock:
            return list(self._lookalikes.items())

    def __len__(self) -> int:
        return len(self._copies)


# --- writes on copies (the lifetime controller's; the writer un-marks through `unmark`)


def add_owners(kube: Kube, key: CopyKey, owners: Sequence[JSONObject]) -> None:
    """Add ownerReferences (a strategic merge patch merges them by uid: nothing is lost to a
    concurrent writer, nothing is duplicated). Raises NotFound when the copy is gone."""
    kind, namespace, name = key
    kube.patch(
        path(kind.resource, namespace, name),
        {"metadata": {"ownerReferences": list(owners)}},
        STRATEGIC_MERGE_PATCH,
    )


def remove_owners(kube: Kube, key: CopyKey, uids: Sequence[str]) -> None:
    """Remove the ownerReferences with these uids (a strategic merge patch deletes them by
    uid: the others, a concurrent writer's included, stay). Raises NotFound when gone."""
    kind, namespace, name = key
    kube.patch(
        path(kind.resource, namespace, name),
        {"metadata": {"ownerReferences": [{"$patch": "delete", "uid": u} for u in uids]}},
        STRATEGIC_MERGE_PATCH,
    )


def mark(kube: Kube, copy: Copy, wall: float) -> None:
    """Mark a copy unused, only if it is still as the sweep saw it (resourceVersion)."""
    kube.patch(
        path(copy.kind.resource, copy.namespace, copy.name),
        {
            "metadata": {
                "resourceVersion": copy.resource_version,
                "annotations": {ANN_UNUSED: now_rfc3339(wall)},
            }
        },
        MERGE_PATCH,
    )


def unmark(kube: Kube, key: CopyKey) -> None:
    """Remove the mark. Any write changes the resourceVersion, which fails a pending delete.
    Raises NotFound when the copy is gone."""
    kind, namespace, name = key
    kube.patch(
        path(kind.resource, namespace, name),
        {"metadata": {"annotations": {ANN_UNUSED: None}}},
        MERGE_PATCH,
    )


def delete_unchanged(kube: Kube, copy: Copy) -> bool:
    """Delete a copy only if it is exactly as the sweep saw it (uid and resourceVersion): a
    re-use (adoption, an un-mark) since then wins. True when deleted."""
    try:
        kube.delete(
            path(copy.kind.resource, copy.namespace, copy.name),
            {
                "apiVersion": "v1",
                "kind": "DeleteOptions",
                "preconditions": {"uid": copy.uid, "resourceVersion": copy.resource_version},
            },
        )
    except (Conflict, NotFound):
        return False
    return True


# --- the writer


class SnapshotWriter:
    """Makes the copies a plan points at exist (it is the core's SnapshotEnsurer).

    Shared by admission and the change controller: `ensure(namespace, requests)`.
    """

    def __init__(
        self,
        kube: Kube,
        cache: SourceCache,
        index: SnapshotIndex,
        hkey: bytes,
        metrics: Metrics,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube = kube
        self.cache = cache
        self.index = index
        self.hkey = hkey
        self.metrics = metrics
        self.clock = clock
        # Copies made or verified through the API whose watch event has not arrived yet, so
        # that back-to-back admissions of workloads sharing a source do not read again.
        self._recent: dict[CopyKey, tuple[float, str]] = {}
        self._lock = threading.Lock()
        index.listeners.append(self._seen)

    def _seen(self, key: CopyKey, _copy: Copy | None) -> None:
        if self._recent:
            with self._lock:
                self._recent.pop(key, None)

    def ensure(
        self,
        namespace: str,
        requests: Sequence[SnapshotRequest],
        *,
        dry_run: bool = False,
        on_created: Callable[[JSONObject], None] | None = None,
    ) -> list[str]:
        """Make every requested copy exist with its content; raises SnapshotError otherwise.
        `on_created` is called with each copy this call created (as the API server stored
        it; not one that existed, or that another replica made a moment before).

        Dry-run creates nothing (the webhook declares sideEffects NoneOnDryRun)."""
        if dry_run:
            return []
        for request in requests:
            made = self._ensure(namespace, request)
            if made is not None and on_created is not None:
                on_created(made)
        return []

    def settled(self, namespace: str, requests: Sequence[SnapshotRequest]) -> bool:
        """True when every copy is known in memory as requested and unmarked: nothing to
        do and no API call to make, so admission need not leave its event loop."""
        return all(self._settled_one(namespace, req) for req in requests)

    def _settled_one(self, namespace: str, req: SnapshotRequest) -> bool:
        kind = req.source.kind
        found = self.cache.peek(namespace, SourceId(kind, req.snapshot_name))
        if not isinstance(found, SourceRecord) or found.snapshot_of != req.source.name:
            return False
        if digest.source_digest(digest.namespace_key(self.hkey, namespace), found) != (
            req.content_digest
        ):
            return False
        copy = self.index.get((kind, namespace, req.snapshot_name))
        return copy is None or copy.unused_since is None

    def _ensure(self, namespace: str, req: SnapshotRequest) -> JSONObject | None:
        """The copy, when this call created it."""
        if self._settled_one(namespace, req):
            return None  # the common case: no API call
        kind = req.source.kind
        key: CopyKey = (kind, namespace, req.snapshot_name)
        found = self.cache.peek(namespace, SourceId(kind, req.snapshot_name))
        if isinstance(found, SourceRecord):
            self._check(namespace, found, req)  # raises: the settled case was answered above
            try:
                unmark(self.kube, key)
                log.info("%s/%s in %s marked unused is in use again", kind, key[2], namespace)
                return None
            except NotFound:
                pass  # swept a moment ago: make it again
            except KubeError as e:
                raise SnapshotError(f"un-marking {kind.value}/{req.snapshot_name}: {e}") from e
        elif self._recently_made(key, req):
            return None
        return self._create(namespace, req)

    def _recently_made(self, key: CopyKey, req: SnapshotRequest) -> bool:
        with self._lock:
            entry = self._recent.get(key)
            if entry is None:
                return False
            if entry[0] <= self.clock():
                del self._recent[key]
                return False
        if entry[1] != req.content_digest:
            raise SnapshotError(
                f"{req.source.kind.value}/{req.snapshot_name} exists with other content"
            )
        return True

    def _remember(self, key: CopyKey, content_digest: str) -> None:
        with self._lock:
            now = self.clock()
            if len(self._recent) > 1000:
                self._recent = {k: v for k, v in self._recent.items() if v[0] > now}
            self._recent[key] = (now + _RECENT_TTL, content_digest)

    def _check(self, namespace: str, record: SourceRecord, req: SnapshotRequest) -> None:
        what = f"{req.source.kind.value}/{req.snapshot_name}"
        if record.snapshot_of != req.source.name:
            # Not proven (webhook.core.digest.proven_source): whatever it is, it is not ours
            # to reuse, and the workload must not point at it.
            raise SnapshotError(f"{what} exists and is not configpin's copy of {req.source}")
        if digest.source_digest(digest.namespace_key(self.hkey, namespace), record) != (
            req.content_digest
        ):
            raise SnapshotError(f"{what} exists with other content than {req.source}'s")

    def _create(self, namespace: str, req: SnapshotRequest) -> JSONObject | None:
        """Create the copy; the copy when this call made it, None when it existed."""
        sid, kind = req.source, req.source.kind
        key: CopyKey = (kind, namespace, req.snapshot_name)
        api_path = path(kind.resource, namespace)
        for _ in range(3):
            source = self._read_source(namespace, req)
            signature = digest.copy_signature(
                self.hkey, namespace, req.snapshot_name, req.content_digest
            )
            body = snapshot_object(
                kind, source, req.snapshot_name, signature=signature, namespace=namespace
            )
            try:
                made = self.kube.create(api_path, body)
            except AlreadyExists:
                if self._adopt_existing(namespace, req):
                    self._remember(key, req.content_digest)
                    return None
                continue  # it went between our create and our read: once more
            except KubeError as e:
                raise SnapshotError(f"creating {kind.value}/{req.snapshot_name}: {e}") from e
            self.metrics.snapshots_created.labels(kind.value).inc()
            self._remember(key, req.content_digest)
            log.info("created %s/%s in %s (copy of %s)", kind, req.snapshot_name, namespace, sid)
            # its metadata only: callers name it, and a Secret's values stay out of their hands
            return {
                "apiVersion": "v1",
                "kind": body.get("kind"),
                "metadata": made.get("metadata") or {},
            }
        raise SnapshotError(f"{kind.value}/{req.snapshot_name} keeps appearing and going")

    def _read_source(self, namespace: str, req: SnapshotRequest) -> JSONObject:
        sid = req.source
        try:
            obj = self.cache.get_object(namespace, sid)
        except SourceUnavailable as e:
            raise SnapshotError(str(e)) from e
        if obj is None:
            raise SnapshotError(f"{sid} no longer exists")
        if is_snapshot(obj):
            raise SnapshotError(f"{sid} is itself a snapshot")
        try:
            record = digest.record_from_object(self.hkey, sid.kind, obj)
        except digest.BadSource as e:
            raise SnapshotError(f"{sid} has undecodable content ({e})") from e
        if record.secret_type == SERVICE_ACCOUNT_TOKEN_TYPE:
            raise SnapshotError(f"{sid} is a service-account token and is never copied")
        if digest.source_digest(digest.namespace_key(self.hkey, namespace), record) != (
            req.content_digest
        ):
            # The name of the copy is derived from the content the plan saw: copying what the
            # source holds now would make a copy whose name lies about its content.
            raise SnapshotError(f"{sid} changed while the admission was being decided; retry")
        return obj

    def _adopt_existing(self, namespace: str, req: SnapshotRequest) -> bool:
        """The copy already exists (another replica, a concurrent admission): verify it, and
        un-mark it if the sweep marked it. False when it has gone meanwhile."""
        kind = req.source.kind
        key: CopyKey = (kind, namespace, req.snapshot_name)
        api_path = path(kind.resource, namespace, req.snapshot_name)
        try:
            existing = self.kube.get(api_path)
        except NotFound:
            return False
        except KubeError as e:
            raise SnapshotError(f"reading {kind.value}/{req.snapshot_name}: {e}") from e
        meta = existing.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            raise SnapshotError(f"{kind.value}/{req.snapshot_name} is being deleted; retry")
        try:
            record = digest.record_from_object(self.hkey, kind, existing)
        except digest.BadSource as e:
            raise SnapshotError(f"{kind.value}/{req.snapshot_name} is undecodable") from e
        self._check(namespace, record, req)
        if (meta.get("annotations") or {}).get(ANN_UNUSED) is not None:
            try:
                unmark(self.kube, key)
            except NotFound:
                return False
            except KubeError as e:
                raise SnapshotError(f"un-marking {kind.value}/{req.snapshot_name}: {e}") from e
        return True
