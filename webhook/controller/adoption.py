"""How long snapshot copies live, part one: adoption by the revisions that use them.

A copy gets an ownerReference to every ReplicaSet, ControllerRevision (StatefulSet and
DaemonSet revisions keep the template in `data.spec.template`), Job and bare Pod whose pod
spec references it, so the Kubernetes garbage collector removes the copy exactly when the
last revision using it is removed (`revisionHistoryLimit`, a deleted Job or Pod). A CronJob
is no revision but makes new Jobs from its template at any time: it owns the copies its
`jobTemplate` points at, and only while it does (the controller re-pointing it to a new copy
drops its reference from the old one), so a copy lives as long as a CronJob or a Job points
at it, whatever `ttlSecondsAfterFinished` or the history limits remove. Which kind owns how
is the table's (webhook.core.kinds, `copies`). One watch per owner kind; the objects are not
kept, only which copies each one references.

The adopter runs on the controller's runner (webhook.controller.runner): one worker, a key
per copy. Only the leader adopts (`is_leader`); every replica keeps the index and writes.
Part two, the sweep of copies nothing uses, is webhook.controller.sweep.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Final

from cachetools import FIFOCache

from webhook.controller.queue import Pending, RolloutQueue
from webhook.controller.runner import Runner
from webhook.core import digest
from webhook.core.constants import ANN_SOURCES
from webhook.core.kept import parse_mapping
from webhook.core.kinds import BUILTIN_KINDS, CopyOwner, custom_kinds, workload_kind
from webhook.core.model import JSONObject, SnapshotRequest, SourceId, SourceKind, SourceRecord
from webhook.core.names import snapshot_name
from webhook.core.owners import is_controlled
from webhook.core.reasons import EventReason
from webhook.core.refs import find_sites, get_path
from webhook.kube.copies import (
    Copy,
    CopyKey,
    SnapshotWriter,
    add_owners,
    remove_owners,
)
from webhook.kube.errors import KubeError, NotFound
from webhook.kube.events import EventRecorder, Regarding
from webhook.kube.informer import Informer
from webhook.kube.raw import path
from webhook.kube.workloads import Served, served_custom_kinds, served_prefix

log = logging.getLogger(__name__)

_REPORTED_MAX: Final = 10_000

NamespaceFilter = Callable[[str], bool]


# A copy's name ends in `-<10 hex>` (webhook.core.names.snapshot_name): only such names are
# remembered per owner; whether one really is a copy is the index's answer.
_COPY_NAME: Final = re.compile(r"-[0-9a-f]{10}$")


def _always(_namespace: str) -> bool:
    return True


def owner_kinds() -> list[Served]:
    """The kinds that own every copy they reference for as long as they exist (their
    template never changes: revisions, Jobs, bare Pods), where they are always served."""
    return [Served(k, k.prefix()) for k in BUILTIN_KINDS if k.copies is CopyOwner.FOR_LIFE]


@dataclass(frozen=True, slots=True)
class Owner:
    """A revision (or bare Pod) that references copies: what adoption and repair need."""

    kind: Served
    namespace: str
    name: str
    uid: str
    copies: frozenset[CopyKey]  # referenced names that look like copies
    sources: frozenset[SourceId]  # the sources its template records (configpin.io/sources)

    @property
    def reference(self) -> JSONObject:
        return {
            "apiVersion": self.kind.api_version,
            "kind": self.kind.kind,
            "name": self.name,
            "uid": self.uid,
            "controller": False,
            "blockOwnerDeletion": False,
        }


def pod_specs(kind: str, obj: JSONObject) -> Iterator[JSONObject]:
    """The pod spec an object of `kind` carries (a ControllerRevision: its template's)."""
    entry = workload_kind(kind)
    spec = get_path(obj, entry.spec_path) if entry is not None else None
    if isinstance(spec, dict):
        yield spec


def referenced_names(specs: Iterable[JSONObject]) -> set[tuple[SourceKind, str]]:
    return {(site.source.kind, site.source.name) for spec in specs for site in find_sites(spec)}


def owner_of(kind: Served, obj: JSONObject) -> Owner | None:
    """The Owner an object would be, or None if it references no copy-like name (or cannot
    own anything any more: it is being deleted; a Pod is its controller's business)."""
    meta = obj.get("metadata") or {}
    if meta.get("deletionTimestamp") or not meta.get("uid"):
        return None
    if not kind.entry.template and is_controlled(obj):  # a Pod of a workload
        return None
    namespace = str(meta.get("namespace", ""))
    names = referenced_names(pod_specs(kind.kind, obj))
    copies = frozenset((k, namespace, n) for k, n in names if _COPY_NAME.search(n))
    if not copies:
        return None
    template_meta = get_path(obj, kind.entry.meta_path)
    recorded = parse_mapping(((template_meta or {}).get("annotations") or {}).get(ANN_SOURCES))
    sources = set()
    for text in recorded or {}:
        try:
            sources.add(SourceId.parse(text))
        except ValueError:
            continue
    return Owner(
        kind, namespace, str(meta.get("name", "")), str(meta["uid"]), copies, frozenset(sources)
    )


class OwnerWatch:
    """InformerHandler of one owner kind: feeds the adopter, keeps nothing itself."""

    def __init__(self, adopter: SnapshotAdopter, kind: Served) -> None:
        self.adopter = adopter
        self.kind = kind

    def relisted(self, items: Iterable[JSONObject]) -> None:
        owners = (owner_of(self.kind, obj) for obj in items)
        self.adopter.replace_owners(self.kind, [o for o in owners if o is not None])

    def event(self, kind: str, obj: JSONObject) -> None:
        uid = str((obj.get("metadata") or {}).get("uid", ""))
        owner = None if kind == "DELETED" else owner_of(self.kind, obj)
        self.adopter.put_owner(uid, owner)


class CronJobWatch(OwnerWatch):
    """Also remembers, per live CronJob, which copies its template points at now (none
    included), so that a copy it stopped pointing at can be let go."""

    def relisted(self, items: Iterable[JSONObject]) -> None:
        items = list(items)
        fresh = {}
        for obj in items:
            meta = obj.get("metadata") or {}
            if meta.get("uid") and not meta.get("deletionTimestamp"):
                owner = owner_of(self.kind, obj)
                fresh[str(meta["uid"])] = owner.copies if owner is not None else frozenset()
        with self.adopter._lock:
            self.adopter._cronjob_copies = fresh
        super().relisted(items)

    def event(self, kind: str, obj: JSONObject) -> None:
        meta = obj.get("metadata") or {}
        uid = str(meta.get("uid", ""))
        with self.adopter._lock:
            if kind == "DELETED" or meta.get("deletionTimestamp"):
                self.adopter._cronjob_copies.pop(uid, None)
            else:
                owner = owner_of(self.kind, obj)
                copies = owner.copies if owner is not None else frozenset()
                before = self.adopter._cronjob_copies.get(uid, frozenset())
                self.adopter._cronjob_copies[uid] = copies
                self.adopter._enqueue(before - copies)
        super().event(kind, obj)


class SnapshotAdopter:
    """Gives every copy an ownerReference to each revision that uses it; re-creates a copy
    that a live revision references but that is gone, when its source still has that content
    (a race with the garbage collector, a manual delete)."""

    def __init__(
        self,
        writer: SnapshotWriter,
        *,
        is_leader: Callable[[], bool] = lambda: True,
        namespace_filter: NamespaceFilter = _always,
        resync: float = 300.0,
        events: EventRecorder | None = None,
    ) -> None:
        # the writer's cluster, cache, index of copies, digest key and metrics
        kube, cache, index = writer.kube, writer.cache, writer.index
        self.kube = kube
        self.events = events
        # uids of look-alikes said in an Event, the oldest forgotten first
        self._reported: FIFOCache[str, None] = FIFOCache(maxsize=_REPORTED_MAX)
        self._reported_lock = threading.Lock()  # watch threads and the worker both report
        self.cache = cache
        self.index = index
        self.writer = writer
        self.hkey = writer.hkey
        self.metrics = metrics = writer.metrics
        self.is_leader = is_leader
        self.namespace_filter = namespace_filter
        self.resync = resync
        self._lock = threading.Lock()
        self._owners: dict[str, Owner] = {}
        self._by_copy: dict[CopyKey, set[str]] = {}
        self._next_discovery = 0.0
        self.runner: Runner[CopyKey, None] = Runner(
            "snapshot-adopter",
            self._reconcile,
            RolloutQueue(window=0.0, min_interval=0.0),
            workers=1,
            is_leading=lambda: self.is_leader() and self.synced(),
            on_leading=self.look_at_everything,
            resync=self.look_at_everything,
            resync_period=resync,
            housekeeping=self._discover,
            backoff=lambda _failures: 5.0,
            retry_limit=None,
            on_retry=self._retrying,
        )
        self._lost: set[CopyKey] = set()
        self.informers = [
            Informer(kube, k.resource, OwnerWatch(self, k), metrics, prefix=k.prefix)
            for k in owner_kinds()
        ]
        self._cronjobs_found = False  # where CronJobs are served is asked once, then watched
        self._cronjob_copies: dict[str, frozenset[CopyKey]] = {}  # live CronJob uid -> copies
        index.listeners.append(self._copy_changed)
        index.lookalike_listeners.append(self._lookalike)

    # --- look-alikes: said once each, by the leader, where configpin acts
    def _lookalike(self, key: CopyKey, uid: str) -> None:
        if self.is_leader():
            self.report_lookalikes([(key, uid)])

    def report_lookalikes(self, found: Iterable[tuple[CopyKey, str]]) -> None:
        """A LookalikeIgnored Event on each look-alike not said yet (by this replica)."""
        if self.events is None:
            return
        for (kind, namespace, name), uid in found:
            if not uid or not self.namespace_filter(namespace):
                continue
            with self._reported_lock:
                if uid in self._reported:
                    continue
                self._reported[uid] = None
            self.events.say(
                Regarding("v1", kind.api_kind, namespace, name, uid),
                EventReason.LOOKALIKE_IGNORED,
                "carries the label configpin.io/snapshot=true but is not a copy configpin made "
                "(no valid signature, not immutable, or a name that does not match its "
                "content): configpin never adopts, reuses or deletes it, and a workload that "
                "needs a copy of this name is admitted unchanged",
            )

    # --- lifecycle
    def start(self) -> None:
        for informer in self.informers:
            informer.start()
        self.runner.start()

    def stop(self) -> None:
        self.runner.stop()
        for informer in self.informers:
            informer.stop()

    def synced(self) -> bool:
        return self._cronjobs_found and all(i.synced.is_set() for i in self.informers)

    def _watch_cronjobs(self) -> None:
        """Add the watches of the kinds that own copies only while their template points at
        them (CronJobs, the served custom kinds) once discovery says where they are served."""
        try:
            kinds = []
            for kind in BUILTIN_KINDS:
                if kind.copies is CopyOwner.WHILE_POINTING:
                    prefix = served_prefix(self.kube, kind)
                    if prefix is not None:
                        kinds.append(Served(kind, prefix))
            kinds += served_custom_kinds(self.kube)
        except KubeError as e:
            log.warning("cannot tell where CronJobs are served (%s); asking again", e)
            return
        self._cronjobs_found = True
        self._watch_owners(kinds)

    def watch_new_kinds(self) -> None:
        """Watch the configured custom kinds whose CRD was installed since the start."""
        if not self._cronjobs_found or not custom_kinds():
            return
        try:
            kinds = served_custom_kinds(self.kube)
        except KubeError as e:
            log.warning("cannot ask which custom kinds are served (%s); next resync", e)
            return
        self._watch_owners(kinds)

    def _watch_owners(self, kinds: Iterable[Served]) -> None:
        watched = {i.api_path for i in self.informers}
        for kind in kinds:
            if path(kind.resource, prefix=kind.prefix) in watched:
                continue
            informer = Informer(
                self.kube,
                kind.resource,
                CronJobWatch(self, kind),
                self.metrics,
                prefix=kind.prefix,
            )
            self.informers.append(informer)
            if not self.runner.stopped():
                informer.start()

    # --- the owner index (from the informers' threads)
    def _link(self, owner: Owner) -> None:
        self._owners[owner.uid] = owner
        for key in owner.copies:
            self._by_copy.setdefault(key, set()).add(owner.uid)

    def _unlink(self, uid: str) -> Owner | None:
        owner = self._owners.pop(uid, None)
        if owner is not None:
            for key in owner.copies:
                users = self._by_copy.get(key)
                if users is not None:
                    users.discard(uid)
                    if not users:
                        del self._by_copy[key]
        return owner

    def put_owner(self, uid: str, owner: Owner | None) -> None:
        with self._lock:
            before = self._unlink(uid)
            if owner is not None:
                self._link(owner)
                if before is None or before.copies != owner.copies:
                    self._enqueue(owner.copies)

    def replace_owners(self, kind: Served, owners: list[Owner]) -> None:
        with self._lock:
            for uid in [u for u, o in self._owners.items() if o.kind == kind]:
                self._unlink(uid)
            for owner in owners:
                self._link(owner)
                self._enqueue(owner.copies)

    def _copy_changed(self, key: CopyKey, _copy: Copy | None) -> None:
        with self._lock:
            if key in self._by_copy:
                self._enqueue((key,))

    def _enqueue(self, keys: Iterable[CopyKey]) -> None:
        for key in keys:
            self.runner.queue.add(key, ())

    def users(self, key: CopyKey) -> list[Owner]:
        with self._lock:
            return [self._owners[u] for u in self._by_copy.get(key, ())]

    # --- the runner's hooks
    def _discover(self) -> None:
        """Until discovery has said where CronJobs (and the custom kinds) are served: ask
        every few seconds, whether leading or not."""
        if not self._cronjobs_found and time.monotonic() >= self._next_discovery:
            self._next_discovery = time.monotonic() + 5.0
            self._watch_cronjobs()

    def look_at_everything(self) -> None:
        """Newly leading, or periodically: every copy, and every name a revision uses."""
        self.watch_new_kinds()
        with self._lock:
            keys = [*self._by_copy, *(c.key for c in self.index.copies())]
        self._enqueue(keys)
        self.report_lookalikes(self.index.lookalikes())

    def _reconcile(self, key: CopyKey, _pending: Pending[None]) -> str:
        return self.reconcile(key)

    def _retrying(self, key: CopyKey, _attempt: int, why: str, delay: float) -> None:
        log.warning(
            "adopting %s/%s in %s failed (%s); retrying in %.0fs",
            key[0],
            key[2],
            key[1],
            why,
            delay,
        )

    def reconcile(self, key: CopyKey) -> str:
        """Make one copy owned by every live object that uses it. Returns what was done."""
        kind, namespace, name = key
        if not self.namespace_filter(namespace):
            return "not selected"
        owners = self.users(key)
        copy = self.index.get(key)
        if copy is None:
            return self._repair(key, owners) if owners else "absent"
        self._disown(key, copy)
        missing = [o for o in owners if o.uid not in copy.owners]
        if not missing:
            return "current"
        try:
            add_owners(self.kube, key, [o.reference for o in missing])
        except NotFound:
            return self._repair(key, owners)
        self.metrics.snapshots_adopted.inc(len(missing))
        log.info(
            "%s/%s in %s now owned by %s",
            kind,
            name,
            namespace,
            ", ".join(f"{o.kind.kind}/{o.name}" for o in missing),
        )
        return "adopted"

    def _disown(self, key: CopyKey, copy: Copy) -> None:
        """Drop the ownerReferences of CronJobs whose template no longer points at the copy:
        it then lives as long as its Jobs (owned by nothing: until the sweep's grace period
        ends). A CronJob this replica does not know (deleted: the garbage collector's
        business; not synced yet) is left alone."""
        if not copy.cronjobs:
            return
        with self._lock:
            known = {u: self._cronjob_copies.get(u) for u in copy.cronjobs}
        gone = [u for u, copies in known.items() if copies is not None and key not in copies]
        if not gone:
            return
        try:
            remove_owners(self.kube, key, gone)
        except NotFound:
            return
        kind, namespace, name = key
        log.info("%s/%s in %s: no CronJob points at it any more", kind, name, namespace)

    def _alive(self, owner: Owner) -> bool:
        try:
            obj = self.kube.get(
                path(owner.kind.resource, owner.namespace, owner.name, prefix=owner.kind.prefix)
            )
        except NotFound:
            return False
        meta = obj.get("metadata") or {}
        return meta.get("uid") == owner.uid and not meta.get("deletionTimestamp")

    def _repair(self, key: CopyKey, owners: list[Owner]) -> str:
        """A revision references a copy that does not exist: make it again if a revision that
        uses it is still alive and one of its recorded sources still has exactly that content
        (the name says which content)."""
        kind, namespace, name = key
        if self.cache.get(namespace, SourceId(kind, name)) is not None:
            return "not a copy"  # exists and is not labelled as a snapshot: someone's own object
        # The usual case: the garbage collector removed the copy after its last owner, and the
        # owner's deletion has not reached us yet.
        alive = [o for o in owners if self._alive(o)]
        if not alive:
            return "owners gone"
        for sid in sorted({s for o in alive for s in o.sources if s.kind is kind}):
            record: SourceRecord | None = self.cache.get(namespace, sid)
            if record is None or record.ignored or record.snapshot_of is not None:
                continue
            content = digest.source_digest(digest.namespace_key(self.hkey, namespace), record)
            if snapshot_name(sid.name, content) != name:
                continue
            self.writer.ensure(namespace, [SnapshotRequest(sid, name, content)])
            log.warning("re-created %s/%s in %s, which a revision uses", kind, name, namespace)
            return "repaired"
        if key not in self._lost:
            self._lost.add(key)
            log.warning(
                "%s/%s in %s is gone but %s uses it, and its source has other content now",
                kind,
                name,
                namespace,
                ", ".join(f"{o.kind.kind}/{o.name}" for o in alive),
            )
        return "lost"
