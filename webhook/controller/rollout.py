"""Rolling on change: re-stamp the pod templates of workloads whose consumed sources changed.

    ConfigMap/Secret watch (SourceCache) --change--> reverse index --stale?--> queue
    workload watches (one per kind) ---------------> reverse index              |
    Namespace watch (label selector) --------------> selected namespaces        v
                                  workers: GET, plan_object (as admission), guarded PATCH

What is "current" is decided from the state recorded on each workload, never from events
remembered: a workload is stale when a source it consumes now digests differently from the
digest it recorded (`configpin.io/observed`, else the template's `configpin.io/sources`).
So the controller checks every workload when it becomes leader and after every relist,
and checks a source's consumers when the source changes: a restart rolls nothing that is
current, and a change made while no controller ran rolls once.

Only the leader acts. Informers run on every replica so a standby is ready the moment it
takes over. Nothing here is on the admission path: if the controller cannot start or fails,
the webhook keeps serving and `configpin_controller_up` says so.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Final, Protocol

from prometheus_client import Gauge

from webhook.controller.index import (
    NotIndexed,
    WorkloadEntry,
    WorkloadIndex,
    WorkloadRef,
    appeared,
    entry_from_object,
    format_time,
    parse_time,
    stale_sources,
)
from webhook.controller.leader import (
    AlwaysLeader,
    Elector,
    LeaderElector,
    new_identity,
)
from webhook.controller.queue import RolloutQueue
from webhook.core.constants import (
    ANN_ON_CHANGE,
    ANN_OWNED,
    ANN_REFRESHED,
    ANN_SOURCES,
    MODE_SNAPSHOT,
    ON_CHANGE_REFRESH,
    OWNED_PIN,
)
from webhook.core.kinds import custom_kinds, template_paths
from webhook.core.model import JSONObject, PatchOp, SnapshotRequest, SourceId, SourceRecord
from webhook.core.names import pointer
from webhook.core.owners import controller_of, operator_owned
from webhook.core.plan import (
    MAX_SOURCES,
    RollInstead,
    dumps_mapping,
    observed_ops,
    parse_mapping,
    plan_object,
    refreshed_ops,
    restamp_from_consumption,
    roll_instead,
    rolled_at_ops,
)
from webhook.core.refs import Consumption, consumption, find_sites, get_path, unrefreshable
from webhook.kube.cache import SourceCache
from webhook.kube.errors import Conflict, Forbidden, KubeError, NotFound
from webhook.kube.events import EventRecorder, Regarding, copy_created_note
from webhook.kube.informer import Informer
from webhook.kube.lease import LeaseLock
from webhook.kube.namespaces import NamespaceSet
from webhook.kube.pods import annotate_pod, workload_pods
from webhook.kube.ratelimit import LimitedKube, RateLimiter
from webhook.kube.raw import MERGE_PATCH, Kube
from webhook.kube.workloads import (
    Decision,
    Served,
    discover_kinds,
    served_custom_kinds,
    update_workload,
)
from webhook.metrics import Metrics
from webhook.sources import Miss

log = logging.getLogger(__name__)

_RETRY_LIMIT: Final = 6  # failed applies of one workload retried with backoff, then left
STALE_EVERY: Final = 5.0  # seconds between two counts of the stale workloads
_POD_WRITERS: Final = 8  # pod patches in flight at once, every refresh together (and rate limited)
_NEVER_ACT_IN: Final = ("kube-system",)


class SnapshotEnsurer(Protocol):
    """What snapshot mode needs before a template may point at a copy (see webhook.kube)."""

    def ensure(
        self,
        namespace: str,
        requests: Sequence[SnapshotRequest],
        *,
        dry_run: bool,
        on_created: Callable[[JSONObject], None] | None = None,
    ) -> list[str]: ...


@dataclass(frozen=True)
class ControllerOptions:
    default_mode: str = "checksum"
    coalesce_window: float = 2.0
    min_rollout_interval: float = 30.0
    namespace_selector: str = "configpin.io/enabled=true"
    own_namespace: str = "configpin"
    leader_elect: bool = True
    lease_name: str = "configpin-leader"
    lease_duration: float = 15.0
    workers: int = 8
    watch_timeout: int = 300
    sync_timeout: float = 120.0
    # A workload that never recorded anything is stamped (and so rolled) only when it is
    # younger than this: it was admitted while configpin was down (failurePolicy Ignore).
    # Older ones, found when a namespace is opted in or at first install, get only the
    # `configpin.io/observed` baseline: no restart storm; their next change rolls them.
    catch_up_window: float = 600.0
    max_sources: int = MAX_SOURCES
    allow_snapshots: bool = True
    # Every workload is checked against the cluster's content this often while leading (0:
    # never), besides on every change and relist: a check that found nothing to do because
    # an event was missed, or a rollout given up after its retries, is looked at again.
    resync_period: float = 300.0
    # Client-side rate limit of every request a rollout worker sends (client-go's QPS and
    # burst): a change consumed by thousands of workloads does not arrive all at once.
    qps: float = 200.0
    burst: int = 400
    # on-change: refresh is honoured (the pod patch is allowed); False: such workloads roll.
    refresh_pods: bool = True


def _created(obj: JSONObject | None) -> float | None:
    return parse_time(((obj or {}).get("metadata") or {}).get("creationTimestamp"))


def _age(obj: JSONObject) -> float:
    """Seconds since the object was created (0 when that cannot be told)."""
    created = _created(obj)
    return 0.0 if created is None else max(0.0, time.time() - created)


def _template(obj: JSONObject | None) -> object:
    kind = str((obj or {}).get("kind", ""))
    paths = template_paths(kind)
    return None if obj is None or paths is None else get_path(obj, paths[0][:-1])


def _skip_reason(reason: str) -> str:
    """A short, bounded label value for the skipped metric."""
    if reason.startswith(("owned by", "configpin's own")):
        return "not-managed"
    if reason.startswith("mode off"):
        return "mode-off"
    if reason.startswith(("kind ", "no pod spec", "consumes no", "too many")):
        return "not-managed"
    return reason


_REPORTED_MAX: Final = 10_000


def _regarding(ref: WorkloadRef, kinds: Mapping[str, Served]) -> Regarding:
    kind = kinds.get(ref.kind)
    api_version = kind.api_version if kind is not None else ""
    return Regarding(api_version, ref.kind, ref.namespace, ref.name)


def _touches_template(kind: str, ops: Iterable[PatchOp]) -> bool:
    paths = template_paths(kind)
    assert paths is not None
    prefix = pointer(paths[0][:-1]) + "/"
    return any(str(op.get("path", "")).startswith(prefix) for op in ops)


def _pod_spec(kind: str, obj: JSONObject) -> JSONObject:
    paths = template_paths(kind)
    assert paths is not None
    spec = get_path(obj, paths[1])
    return spec if isinstance(spec, dict) else {}


def _asks_refresh(obj: JSONObject) -> bool:
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    return isinstance(annotations, dict) and annotations.get(ANN_ON_CHANGE) == ON_CHANGE_REFRESH


class NotLeading(Exception):
    """Leadership was lost in the middle of a workload's pods."""


class NotStored(Exception):
    """The API server stored another record than the controller planned."""

    def __init__(self, rolled: bool) -> None:
        super().__init__("the API server stored another record than planned")
        self.rolled = rolled


@dataclass(frozen=True)
class _Landed:
    """A workload write as the API server answered it."""

    obj: JSONObject | None  # as stored (None: the workload is gone)
    rolled: bool  # its pod template changed
    touched_template: bool  # the write asked for a template change
    intended: Mapping[str, str]  # the record planned


class _KindHandler:
    """The informer handler of one workload kind: keeps that kind's index entries."""

    def __init__(self, controller: RolloutController, kind: str) -> None:
        self.controller = controller
        self.kind = kind

    def _entry(self, obj: JSONObject) -> WorkloadEntry | None:
        obj.setdefault("kind", self.kind)  # list items carry no kind
        try:
            options = self.controller.options
            return entry_from_object(obj, options.default_mode, options.max_sources)
        except NotIndexed as e:
            if str(e) == "owned by a controller" and operator_owned(obj):
                self.controller.report_owned(obj)
            return None
        except Exception:
            # Never let one odd object stop the watch (it would fail again on every retry).
            meta = obj.get("metadata") or {}
            log.exception(
                "cannot index %s %s/%s", self.kind, meta.get("namespace"), meta.get("name")
            )
            return None

    def relisted(self, items: Iterable[JSONObject]) -> None:
        entries = [e for e in map(self._entry, items) if e is not None]
        c = self.controller
        for ref in c.index.replace_kind(self.kind, entries):
            c.queue.forget(ref)
        c.check_all(kind=self.kind)

    def event(self, kind: str, obj: JSONObject) -> None:
        c = self.controller
        meta = obj.get("metadata") or {}
        ref = WorkloadRef(self.kind, str(meta.get("namespace", "")), str(meta.get("name", "")))
        entry = None if kind == "DELETED" else self._entry(obj)
        if entry is None:
            if c.index.remove(ref) is not None and kind == "DELETED":
                c.queue.forget(ref)
            return
        old = c.index.put(entry)
        if old != entry:
            try:
                c.check(entry, pods_moved=old is None or old.pods != entry.pods)
            except Exception:  # the watch must go on
                log.exception("checking %s failed", entry.ref)


class RolloutController:
    def __init__(
        self,
        kube: Kube,
        hkey: bytes,
        cache: SourceCache,
        metrics: Metrics,
        options: ControllerOptions,
        *,
        snapshots: SnapshotEnsurer | None = None,
        identity: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        namespaces: NamespaceSet | None = None,
        events: EventRecorder | None = None,
    ) -> None:
        self.kube = kube
        # What the workers fan out (reads and writes of workloads) goes through one bucket;
        # the watches and the lease do not.
        self.limited = LimitedKube(
            kube,
            RateLimiter(options.qps, options.burst, observe=metrics.rate_limit_wait.observe),
        )
        self.events = events
        self._reported: OrderedDict[str, None] = OrderedDict()
        self.hkey = hkey
        self.cache = cache
        self.metrics = metrics
        self.options = options
        self.snapshots = snapshots
        self.identity = identity or new_identity()
        self.clock = clock
        self.index = WorkloadIndex()
        self.queue: RolloutQueue[WorkloadRef, SourceId] = RolloutQueue(
            window=options.coalesce_window,
            min_interval=options.min_rollout_interval,
            clock=clock,
        )
        # The selection admission enforces too (`configpin serve` shares one); started and
        # stopped here only when it is the controller's own.
        self._own_namespaces = namespaces is None
        if namespaces is None:
            namespaces = NamespaceSet(
                kube,
                metrics,
                label_selector=options.namespace_selector,
                excluded=(options.own_namespace, *_NEVER_ACT_IN),
            )
            namespaces.informer.watch_timeout = options.watch_timeout
        self.namespaces = namespaces
        self.kinds: dict[str, Served] = {}
        self.informers: dict[str, Informer] = {}
        self.elector: Elector | None = None
        self.up = Gauge(
            "configpin_controller_up",
            "1 once the change controller has started (its watches synced), 0 while it "
            "cannot start or after it stopped; the webhook serves either way.",
            registry=metrics.registry,
        )
        self._synced = threading.Event()
        # Started once the index has synced (after readiness): the snapshot adoption watches.
        self.after_synced: list[Callable[[], None]] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._failures: dict[WorkloadRef, int] = {}
        # since when (self.clock) each workload has been seen stale, while leading
        self._stale_lock = threading.Lock()
        self._stale_since: dict[WorkloadRef, float] = {}
        metrics.workloads_stale.set_function(lambda: len(self._stale_since))
        metrics.stale_seconds_max.set_function(self._stale_seconds_max)
        self._pod_writers = ThreadPoolExecutor(_POD_WRITERS, thread_name_prefix="refresh")

    # --- lifecycle
    def start(self) -> None:
        """Start in the background: never blocks, never raises into the caller."""
        t = threading.Thread(target=self._start, name="controller-start", daemon=True)
        t.start()
        self._threads.append(t)

    def _start(self) -> None:
        backoff = 1.0
        while not self._stop.is_set():
            try:
                self._start_once()
                return
            except Exception as e:
                log.error("controller could not start (%s); retrying in %.0fs", e, backoff)
                self.up.set(0)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 60.0)

    def _start_once(self) -> None:
        if not self.kinds:
            self.kinds = {k.kind: k for k in discover_kinds(self.kube)}
        if self.source_changed not in self.cache.listeners:
            self.cache.listeners.append(self.source_changed)
            self.namespaces.listeners.append(self.namespace_selected)
            if self._own_namespaces:
                self.namespaces.start()
        # What admission needs comes first: the workloads are listed once the namespaces and
        # the sources are, so that their lists (tens of thousands of objects, parsed in this
        # process) neither slow the webhook's readiness down nor share the API server with it.
        deadline = time.monotonic() + self.options.sync_timeout
        if not self.namespaces.informer.synced.wait(max(0.0, deadline - time.monotonic())):
            raise TimeoutError("the watch of namespaces did not sync")
        if not self.cache.wait_synced(max(0.0, deadline - time.monotonic())):
            raise TimeoutError("the ConfigMap/Secret cache did not sync")
        if not self.informers:
            for kind in self.kinds.values():
                self._watch_kind(kind)
        deadline = time.monotonic() + self.options.sync_timeout
        for informer in self.informers.values():
            if not informer.synced.wait(max(0.0, deadline - time.monotonic())):
                raise TimeoutError(f"the watch of {informer.resource} did not sync")
        if self._stop.is_set():
            return
        self._synced.set()
        for then in self.after_synced:
            try:
                then()
            except Exception:
                log.exception("starting %s after the controller's sync failed", then)
        for i in range(max(1, self.options.workers)):
            t = threading.Thread(target=self._work, name=f"rollout-{i}", daemon=True)
            t.start()
            self._threads.append(t)
        if self.options.leader_elect:
            lock = LeaseLock(self.kube, self.options.own_namespace, self.options.lease_name)
            self.elector = LeaderElector(
                lock,
                self.identity,
                lease_duration=self.options.lease_duration,
                on_started=self._started_leading,
                on_stopped=self._stopped_leading,
                on_change=lambda leading: self.metrics.is_leader.set(1 if leading else 0),
            )
        else:
            self.elector = AlwaysLeader(self._started_leading, self._stopped_leading)
            self.metrics.is_leader.set(1)
        if self.options.resync_period > 0:
            t = threading.Thread(target=self._resync, name="controller-resync", daemon=True)
            t.start()
            self._threads.append(t)
        t = threading.Thread(target=self._count_stale, name="controller-stale", daemon=True)
        t.start()
        self._threads.append(t)
        self.up.set(1)
        log.info(
            "controller started: %d workloads indexed, kinds %s, identity %s",
            len(self.index),
            ", ".join(sorted(self.kinds)),
            self.identity,
        )
        self.elector.start()

    def _watch_kind(self, kind: Served) -> None:
        informer = Informer(
            self.kube,
            kind.resource,
            _KindHandler(self, kind.kind),
            self.metrics,
            prefix=kind.prefix,
            watch_timeout=self.options.watch_timeout,
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
            if kind.kind not in self.informers and not self._stop.is_set():
                log.info("%s is served now: watching it", kind.kind)
                self._watch_kind(kind)
                added.append(kind.kind)
        return added

    def _resync(self) -> None:
        while not self._stop.wait(self.options.resync_period):
            self.watch_new_kinds()
            try:
                queued = self.check_all()
            except Exception:  # the loop must go on
                log.exception("periodic resync failed")
                continue
            self.metrics.resyncs.inc()
            if queued:
                log.info("periodic resync: %d workloads were not current", queued)

    # --- how long workloads stay stale (configpin_workloads_stale, ..._stale_seconds_max)
    def _count_stale(self) -> None:
        while not self._stop.wait(STALE_EVERY):
            try:
                self.measure_staleness()
            except Exception:  # the loop must go on
                log.exception("counting stale workloads failed")

    def measure_staleness(self) -> int:
        """Which workloads are stale now, from memory (the index and the source cache): a
        workload stays counted from the first time it was seen stale until it is current.
        Only the leader counts; returns how many are stale."""
        if not self.acting():
            with self._stale_lock:
                self._stale_since.clear()
            return 0
        now = self.clock()
        stale = {
            e.ref
            for e in self.index.entries()
            if e.ref.namespace in self.namespaces
            and stale_sources(e, self._peek(e.ref.namespace), self.hkey)
        }
        with self._stale_lock:
            self._stale_since = {ref: self._stale_since.get(ref, now) for ref in stale}
        return len(stale)

    def _seen_stale(self, ref: WorkloadRef, when: float) -> None:
        with self._stale_lock:
            self._stale_since.setdefault(ref, when)

    def _stale_seconds_max(self) -> float:
        with self._stale_lock:
            oldest = min(self._stale_since.values(), default=None)
        return 0.0 if oldest is None else max(0.0, self.clock() - oldest)

    def stop(self, timeout: float = 5.0) -> None:
        """Finish the patches in flight, then release the Lease (a standby takes over at
        once, and no write of ours can land after it has)."""
        self._stop.set()
        self.queue.close()
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        self._pod_writers.shutdown(wait=False, cancel_futures=True)
        if self.elector is not None:
            self.elector.stop()
        if self._own_namespaces:
            self.namespaces.stop()
        for informer in self.informers.values():
            informer.stop()
        if self.source_changed in self.cache.listeners:
            self.cache.listeners.remove(self.source_changed)
        self.up.set(0)
        self.metrics.is_leader.set(0)

    def synced(self) -> bool:
        return self._synced.is_set()

    def is_leader(self) -> bool:
        return self.elector is not None and self.elector.is_leader()

    def acting(self) -> bool:
        return self._synced.is_set() and not self._stop.is_set() and self.is_leader()

    # --- leadership
    def _started_leading(self) -> None:
        log.info("leading: checking every workload against its recorded state")
        self.check_all()

    def _stopped_leading(self) -> None:
        log.info("not leading any more: dropping %d pending rollouts", len(self.queue))
        self.queue.clear()
        with self._stale_lock:
            self._stale_since.clear()

    # --- checks (called from watch threads: in memory only, no API calls)
    def _peek(self, namespace: str) -> Callable[[SourceId], SourceRecord | None]:
        cache = self.cache

        def lookup(sid: SourceId) -> SourceRecord | None:
            found = cache.peek(namespace, sid)
            return None if isinstance(found, Miss) else found

        return lookup

    def check(
        self, entry: WorkloadEntry, *, seen: float | None = None, pods_moved: bool = False
    ) -> bool:
        """Queue the workload if it is stale; True when it was.

        `pods_moved`: its pods may have changed (its status moved, a relist, a resync): a
        current workload that was refreshed is queued all the same, so that a pod created
        since (a scale-up, a replaced pod) is brought to the refreshed record."""
        if not self.acting() or entry.ref.namespace not in self.namespaces:
            return False
        stale = stale_sources(entry, self._peek(entry.ref.namespace), self.hkey)
        if not stale:
            self.metrics.skipped.labels("current").inc()
            with self._stale_lock:
                self._stale_since.pop(entry.ref, None)
            if pods_moved and entry.refreshed is not None and self.options.refresh_pods:
                self.queue.add(entry.ref, (), seen=seen)
            return False
        self._seen_stale(entry.ref, self.clock() if seen is None else seen)
        last = None
        if entry.rolled_at is not None:  # the workload's own record: on this clock
            last = self.clock() - max(0.0, time.time() - entry.rolled_at)
        if self.queue.add(entry.ref, stale, seen=seen, last_rollout=last):
            self.metrics.coalesced.inc()
        elif self.events is not None:
            wait = self.queue.not_before(entry.ref) - self.clock()
            if wait > self.options.coalesce_window:
                until = format_time(time.time() + wait)
                names = ", ".join(sorted(map(str, stale)))
                self.events.normal(
                    _regarding(entry.ref, self.kinds),
                    "RolloutDeferred",
                    "Rollout",
                    f"{names} changed; the minimum interval between rollouts defers this one "
                    f"until {until}",
                )
        return True

    def check_all(self, *, kind: str | None = None, namespace: str | None = None) -> int:
        if not self.acting():
            return 0
        now = self.clock()
        queued = 0
        for entry in self.index.entries(kind=kind, namespace=namespace):
            try:
                queued += self.check(entry, seen=now, pods_moved=True)
            except Exception:  # one workload must not keep the others from being checked
                log.exception("checking %s failed", entry.ref)
        if queued:
            log.info("%d workloads are not current: rolling them", queued)
        return queued

    def source_changed(self, namespace: str, sid: SourceId) -> None:
        """SourceCache listener: a source's content or presence changed."""
        consumers = self.index.consumers(namespace, sid)
        if not consumers or namespace not in self.namespaces:
            return
        self.metrics.changes_seen.inc()
        now = self.clock()
        for entry in consumers:
            self.check(entry, seen=now)

    def report_owned(self, obj: JSONObject) -> None:
        """An operator's workload (a Deployment a controller owns) is left to its owner: said
        once per object, by the leader, in an Event on it (the API server does not even send
        it to the webhook where the chart's matchConditions apply)."""
        meta = obj.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        if self.events is None or not uid or not self.acting():
            return
        if str(meta.get("namespace", "")) not in self.namespaces or uid in self._reported:
            return
        self._reported[uid] = None
        while len(self._reported) > _REPORTED_MAX:
            self._reported.popitem(last=False)
        owner = controller_of(obj) or {}
        self.metrics.owned_skipped.inc()
        self.events.normal(
            obj,
            "SkippedOwned",
            "Skip",
            f"not pinned: owned by {owner.get('kind', '?')} {owner.get('name', '?')}, another "
            f"controller, whose template decides (pin it anyway: {ANN_OWNED}: {OWNED_PIN} on "
            "it, or --pin-owned-by for its owner's kind)",
        )

    def namespace_selected(self, namespace: str) -> None:
        self.check_all(namespace=namespace)

    # --- workers
    def _work(self) -> None:
        while not self._stop.is_set():
            item = self.queue.get(timeout=1.0)
            if item is None:
                continue
            ref, pending = item
            rolled = False
            try:
                rolled = self.apply(ref, pending.sources, first_seen=pending.first_seen)
                self._failures.pop(ref, None)
            except NotStored as e:
                rolled = e.rolled
                self._retry_later(ref, pending.sources, pending.first_seen, e)
            except Exception as e:
                self._retry_later(ref, pending.sources, pending.first_seen, e)
            finally:
                self.queue.done(ref, rolled=rolled)

    def _retry_later(
        self, ref: WorkloadRef, sources: set[SourceId], first_seen: float, error: Exception
    ) -> None:
        n = self._failures.get(ref, 0) + 1
        self.metrics.skipped.labels("error").inc()
        if n > _RETRY_LIMIT:
            self._failures.pop(ref, None)
            log.error("%s: giving up after %d failures (%s)", ref, n, error)
            if self.events is not None:
                self.events.warning(
                    _regarding(ref, self.kinds),
                    "RolloutFailed",
                    "Rollout",
                    f"gave up after {n} attempts: {error}; the next change or resync tries again",
                )
            return
        self._failures[ref] = n
        delay = min(2.0**n, 60.0)
        log.warning("%s: rollout failed (%s); retrying in %.0fs", ref, error, delay)
        self.queue.add(ref, sources, seen=first_seen, delay=delay)

    def apply(
        self,
        ref: WorkloadRef,
        changed: Iterable[SourceId] = (),
        *,
        first_seen: float | None = None,
        before_write: Callable[[JSONObject], None] | None = None,
    ) -> bool:
        """Bring one workload up to date (read fresh, plan as admission does, guarded patch),
        then check what the API server stored: when it is not what was planned (admission on
        a replica that decided otherwise, a concurrent writer), look again shortly.
        True when its pod template changed, i.e. a rollout started.

        A plain re-stamp (checksum mode, every reference naming a live source) is planned
        from the index instead of a read, and written guarded by the resourceVersion the index
        saw: one request instead of two against the rate limit. Anything else, and a 409
        (the object changed since), takes the read."""
        if not self.is_leader():
            return False
        if ref.namespace not in self.namespaces:
            self.metrics.skipped.labels("namespace").inc()
            return False
        kind = self.kinds[ref.kind]
        entry = self.index.get(ref)
        if entry is not None and before_write is None:
            landed = self._restamp_from_index(entry, kind)
            if landed is not None:
                return self._landed(ref, landed, changed, first_seen)
        lookup = self._peek(ref.namespace)
        cache, namespace = self.cache, ref.namespace
        read_obj: JSONObject | None = None
        intended: dict[str, str] = {}
        created: list[JSONObject] = []  # copies made for it (snapshot mode), said once done
        refreshed: int | None = None  # pods told to sync, when refreshed instead of rolled
        instead: RollInstead | None = None  # why an on-change: refresh workload rolls

        def read(sid: SourceId) -> SourceRecord | None:
            return cache.get(namespace, sid)

        def record_only(obj: JSONObject, observed: dict[str, str], why: str) -> Decision:
            """The record alone, on the workload's metadata: its template stays as it is."""
            nonlocal intended
            intended = observed
            ops = observed_ops(obj, dumps_mapping(observed)) if observed else []
            if ops:
                log.info(
                    "%s: recorded %s without a rollout (%s)", ref, dumps_mapping(observed), why
                )
            return Decision(ops) if ops else Decision.leave("unchanged")

        def decide(obj: JSONObject) -> Decision:
            nonlocal read_obj, intended, refreshed, instead
            read_obj, intended, refreshed, instead = obj, {}, None, None
            obj.setdefault("kind", ref.kind)
            try:
                entry = entry_from_object(obj, self.options.default_mode, self.options.max_sources)
            except NotIndexed as e:
                return Decision.leave(_skip_reason(str(e)))
            stale = stale_sources(entry, lookup, self.hkey)
            if not stale:
                if entry.refreshed is not None and self.options.refresh_pods:
                    self._catch_up_pods(ref, obj, read)
                return Decision.leave("current")
            plan = plan_object(
                obj,
                hkey=self.hkey,
                lookup=read,
                default_mode=self.options.default_mode,
                operation="UPDATE",
                old=obj,
                refresh=stale,
                namespace=namespace,
                max_sources=self.options.max_sources,
                allow_snapshots=self.options.allow_snapshots,
            )
            if plan.skipped is not None:
                return Decision.leave(_skip_reason(plan.skipped))
            if not entry.stamped and _age(obj) > self.options.catch_up_window:
                return record_only(obj, plan.observed, "found unstamped: a baseline")
            if plan.mode != MODE_SNAPSHOT and stale <= appeared(entry, stale):
                # No pod of it could start before the source existed: they start with what it
                # holds now. The record is completed; a rollout would restart them for nothing.
                # (Snapshot mode rolls instead: its revisions must point at copies.)
                completed = {**entry.recorded}
                completed.update((str(sid), plan.observed[str(sid)]) for sid in stale)
                return record_only(obj, completed, "a required source appeared")
            if not plan.patch:
                return Decision.leave("unchanged")
            if _asks_refresh(obj):
                instead = roll_instead(obj, plan, stale)
                if instead is None and not kind.entry.refreshable:
                    instead = RollInstead(
                        "kind", f"configpin does not find the pods of a {ref.kind} to refresh"
                    )
                if instead is None and not self.options.refresh_pods:
                    instead = RollInstead(
                        "disabled",
                        "pod refresh is turned off on this configpin (--refresh-pods=false)",
                        warning=True,
                    )
                if instead is None:
                    try:
                        refreshed = self._refresh_pods(ref, obj, plan.observed)
                    except Forbidden as e:
                        instead = RollInstead(
                            "forbidden",
                            f"configpin may not patch its pods ({e}); grant it or turn "
                            "on-change: refresh off",
                            warning=True,
                        )
                    else:
                        intended = plan.observed
                        return Decision(refreshed_ops(obj, dumps_mapping(plan.observed)))
            if plan.snapshots:
                if self.snapshots is None:
                    log.error("%s: snapshot mode needs the snapshot writer; not rolled", ref)
                    return Decision.leave("no-snapshots")
                for warning in self.snapshots.ensure(
                    namespace, plan.snapshots, dry_run=False, on_created=created.append
                ):
                    log.warning("%s: %s", ref, warning)
            if not self.is_leader():
                return Decision.leave("not-leader")
            for warning in plan.warnings:
                log.warning("%s: %s", ref, warning)
            intended = plan.observed
            ops = list(plan.patch)
            if _touches_template(ref.kind, ops):
                ops += rolled_at_ops(obj, format_time(time.time()))
            return Decision(ops)

        try:
            result = update_workload(
                self.limited,
                kind.path(ref.namespace, ref.name),
                decide,
                on_conflict=self.metrics.conflicts.inc,
                before_write=before_write,
            )
        finally:
            if created and self.events is not None and read_obj is not None:
                for copy in created:
                    self.events.normal(
                        read_obj, "CopyCreated", "Snapshot", copy_created_note(copy), related=copy
                    )
        if not result.patched:
            self.metrics.skipped.labels(result.skip or "unchanged").inc()
            return False
        assert result.obj is not None
        result.obj.setdefault("kind", ref.kind)
        return self._landed(
            ref,
            _Landed(
                result.obj,
                _template(result.obj) != _template(read_obj),
                _touches_template(ref.kind, result.ops),
                intended,
            ),
            changed,
            first_seen,
            refreshed=refreshed,
            instead=instead,
        )

    def _restamp_from_index(self, entry: WorkloadEntry, kind: Served) -> _Landed | None:
        """A plain re-stamp planned from the index and written without reading the object
        first (see `apply`); None when it needs the object (or the object changed since the
        index saw it: a 409), and `apply` reads it."""
        ref, rv = entry.ref, entry.restamp_rv
        if rv is None or not entry.stamped:
            return None
        stale = stale_sources(entry, self._peek(ref.namespace), self.hkey)
        if not stale or appeared(entry, stale):
            return None
        cache, namespace = self.cache, ref.namespace
        restamp = restamp_from_consumption(
            ref.kind,
            [Consumption(c.source, c.keys, c.required, frozenset(), ()) for c in entry.consumes],
            hkey=self.hkey,
            lookup=lambda sid: cache.get(namespace, sid),
            namespace=namespace,
            recorded=entry.recorded,
            resource_version=str(rv),
            rolled_at=format_time(time.time()),
        )
        if restamp is None or not self.is_leader():
            return None
        for warning in restamp.warnings:
            log.warning("%s: %s", ref, warning)
        try:
            written = self.limited.patch(
                kind.path(ref.namespace, ref.name), restamp.merge_patch, content_type=MERGE_PATCH
            )
        except Conflict:
            self.metrics.conflicts.inc()
            return None  # changed since the index saw it: read it and plan again
        except NotFound:
            return _Landed(None, False, False, restamp.observed)
        written.setdefault("kind", ref.kind)
        paths = template_paths(ref.kind)
        assert paths is not None
        stored = get_path(written, paths[0])
        annotations = (stored.get("annotations") if isinstance(stored, dict) else None) or {}
        rolled = parse_mapping(annotations.get(ANN_SOURCES)) != entry.recorded
        return _Landed(written, rolled, True, restamp.observed)

    def _landed(
        self,
        ref: WorkloadRef,
        landed: _Landed,
        changed: Iterable[SourceId],
        first_seen: float | None,
        *,
        refreshed: int | None = None,
        instead: RollInstead | None = None,
    ) -> bool:
        """After a write: index what was stored, count and say it, and check it is what was
        planned (NotStored otherwise). True when the pod template changed (a rollout)."""
        obj, rolled = landed.obj, landed.rolled
        if obj is None:
            self.metrics.skipped.labels("gone").inc()
            return False
        entry = self._entry_or_none(obj)
        if entry is not None:
            self.index.put(entry)  # the watch will say the same; until then, do not re-check
        if refreshed is not None:
            self._refreshed(ref, obj, changed, refreshed, first_seen)
        elif rolled and instead is not None:
            self._rolled_instead(ref, obj, changed, instead)
        if rolled:
            self.metrics.rollouts.labels(ref.kind).inc()
            if first_seen is not None:
                self.metrics.rollout_latency.observe(max(0.0, self.clock() - first_seen))
            names = ", ".join(sorted(map(str, changed))) or "recorded state"
            log.info("re-stamped %s: %s changed", ref, names)
            if self.events is not None:
                self.events.normal(
                    obj,
                    "RolloutStarted",
                    "Rollout",
                    f"{names} changed: pod template re-stamped, a rolling update starts",
                )
        elif refreshed is None and not landed.touched_template:
            self.metrics.skipped.labels("record-only").inc()
            if self.events is not None:
                self.events.normal(
                    obj,
                    "Recorded",
                    "Record",
                    "recorded the digests of its sources on the workload without a rollout "
                    "(a baseline, a required source that appeared, or a kept rollback)",
                )
        if entry is None or dict(entry.recorded) != landed.intended:
            # Stored is not what was planned: something in the write path (admission on a
            # replica that decided otherwise, another writer) changed it. Never counted as
            # done: looked at again, with backoff, from what the cluster then holds.
            self.metrics.skipped.labels("not-stored").inc()
            raise NotStored(rolled)
        return rolled

    # --- refresh (on-change: refresh)
    def _refresh_pods(self, ref: WorkloadRef, obj: JSONObject, target: Mapping[str, str]) -> int:
        """Tell each live pod of the workload that lags `target` (the per-source digests of
        what its volumes now hold) to sync: one annotation, `configpin.io/refreshed`, which
        also says what it was handed. Pods are patched before the workload records the
        refresh, so a restart or a new leader finds them done, never the record ahead of
        them. A pod that consumes a changed source otherwise than the template (an older
        revision during a rollout) is left to that rollout. Each patch waits for the
        controller's shared rate limit, as its workload writes do. Returns the pods patched."""
        text = dumps_mapping(target)
        wanted = consumption(find_sites(_pod_spec(ref.kind, obj)))
        lagging: list[JSONObject] = []
        for pod in workload_pods(self.kube, ref.kind, obj):
            annotations = (pod.get("metadata") or {}).get("annotations") or {}
            if annotations.get(ANN_REFRESHED) == text:
                continue
            base = (
                parse_mapping(annotations.get(ANN_REFRESHED))
                or parse_mapping(annotations.get(ANN_SOURCES))
                or {}
            )
            changed: set[SourceId] = set()
            for key, value in target.items():
                if base.get(key) != value:
                    try:
                        changed.add(SourceId.parse(key))
                    except ValueError:
                        continue
            if not changed:
                continue
            spec = pod.get("spec") or {}
            has = consumption(find_sites(spec))
            if unrefreshable(spec, changed) or any(
                sid not in has or sid not in wanted or has[sid].keys != wanted[sid].keys
                for sid in changed
            ):
                continue
            lagging.append(pod)

        def annotate(pod: JSONObject) -> int:
            if not self.is_leader():
                raise NotLeading(f"{ref}: leadership lost while refreshing its pods")
            if not annotate_pod(self.limited, pod, ANN_REFRESHED, text):
                return 0
            self.metrics.pods_refreshed.inc()
            return 1

        if not lagging:
            return 0
        # The first alone: a 403 (the permission withheld) is known before any other is sent.
        # The rest on the controller's few pod writers (shared by every workload being
        # refreshed, so that at most _POD_WRITERS are in flight whatever the fan-out): one
        # workload's pods go faster than one round trip after another, and many workloads
        # do not pile up in the API server's queues.
        patched = annotate(lagging[0])
        if len(lagging) > 1:
            patched += sum(self._pod_writers.map(annotate, lagging[1:]))
        return patched

    def _catch_up_pods(
        self, ref: WorkloadRef, obj: JSONObject, read: Callable[[SourceId], SourceRecord | None]
    ) -> None:
        """A current workload that was refreshed: pods created since (a scale-up, a replaced
        pod) start with the content it was refreshed to, not its template's older record;
        their annotation is brought to it. What is written is planned here from the sources,
        never taken from the workload's own (tenant-writable) record."""
        plan = plan_object(
            obj,
            hkey=self.hkey,
            lookup=read,
            default_mode=self.options.default_mode,
            operation="UPDATE",
            old=obj,
            refresh=(),
            namespace=ref.namespace,
            max_sources=self.options.max_sources,
            allow_snapshots=self.options.allow_snapshots,
        )
        if plan.skipped is not None or plan.on_change != ON_CHANGE_REFRESH:
            return
        try:
            n = self._refresh_pods(ref, obj, plan.observed)
        except Forbidden as e:
            log.warning("%s: its new pods cannot be marked refreshed: %s", ref, e)
            return
        if n:
            log.info("%s: %d pods created since its last refresh marked refreshed", ref, n)

    def _refreshed(
        self,
        ref: WorkloadRef,
        obj: JSONObject,
        changed: Iterable[SourceId],
        pods: int,
        first_seen: float | None,
    ) -> None:
        self.metrics.refreshes.labels(ref.kind).inc()
        if first_seen is not None:
            self.metrics.refresh_latency.observe(max(0.0, self.clock() - first_seen))
        names = ", ".join(sorted(map(str, changed))) or "recorded state"
        log.info("refreshed %s: %s changed; %d running pods told to sync now", ref, names, pods)
        if self.events is not None:
            self.events.normal(
                obj,
                "Refreshed",
                "Refresh",
                f"{names} changed: {pods} running pods told to sync their mounted volumes "
                "now; no rollout (the pod template is unchanged)",
            )

    def _rolled_instead(
        self, ref: WorkloadRef, obj: JSONObject, changed: Iterable[SourceId], why: RollInstead
    ) -> None:
        self.metrics.refresh_fallbacks.labels(why.reason).inc()
        names = ", ".join(sorted(map(str, changed))) or "recorded state"
        log.info("%s: on-change is refresh, but rolled: %s", ref, why.why)
        note = f"{names} changed; on-change is refresh, but {why.why}: rolled instead"
        if self.events is None:
            return
        if why.warning:  # a setting or a permission stood in the way
            self.events.warning(obj, "RolledInsteadOfRefresh", "Rollout", note)
        else:
            self.events.normal(obj, "RolledInsteadOfRefresh", "Rollout", note)

    def _entry_or_none(self, obj: JSONObject) -> WorkloadEntry | None:
        try:
            return entry_from_object(obj, self.options.default_mode, self.options.max_sources)
        except NotIndexed:
            return None
