"""Rolling on change: re-stamp the pod templates of workloads whose consumed sources changed.

    ConfigMap/Secret watch (SourceCache) --change--> reverse index --stale?--> queue
    workload watches (one per kind) ---------------> reverse index              |
    Namespace watch (label selector) --------------> selected namespaces        v
                     runner (runner.py): workers read the workload, decide (restamp.py,
                     planned as admission plans), write a guarded PATCH, report (report.py)

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
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from prometheus_client import Gauge

from webhook.controller.acts import Acts
from webhook.controller.editors import Editors
from webhook.controller.follow import Follower
from webhook.controller.index import WorkloadIndex
from webhook.controller.leader import Elector, elector, new_identity
from webhook.controller.limits import HELD, Holds, RolloutLimits
from webhook.controller.outcome import Outcome, Skipped
from webhook.controller.preview import Previewer
from webhook.controller.publish import Publisher
from webhook.controller.queue import Pending, RolloutQueue
from webhook.controller.reconcile import Reconciler, peek_in
from webhook.controller.refresh import Pods
from webhook.controller.report import Reporter
from webhook.controller.restamp import Restamper
from webhook.controller.runner import Runner
from webhook.controller.stale import Staleness
from webhook.controller.watches import WorkloadWatches
from webhook.controller.waves import Gate, Waiting
from webhook.core.current import Lookup, WorkloadEntry, WorkloadRef, stale_sources
from webhook.core.model import JSONObject, SnapshotEnsurer, SourceId
from webhook.core.reasons import SkipReason
from webhook.core.reloader import left_to_reloader
from webhook.core.times import format_time
from webhook.kube.cache import SourceCache
from webhook.kube.events import EventRecorder
from webhook.kube.namespaces import NamespaceSet
from webhook.kube.ratelimit import LimitedKube, RateLimiter
from webhook.kube.raw import Kube
from webhook.process.config import Settings
from webhook.process.metrics import Metrics

log = logging.getLogger(__name__)

__all__ = ["RolloutController", "Tuning"]

PUBLISH_QPS = 20.0  # ConfigRollout writes a second, at most (their own bucket)
PUBLISH_BURST = 40


@dataclass(frozen=True)
class Tuning:
    """What `configpin serve` does not expose as settings; tests shorten them."""

    workers: int = 8
    watch_timeout: int = 300
    sync_timeout: float = 120.0


class RolloutController:
    def __init__(
        self,
        kube: Kube,
        hkey: bytes,
        cache: SourceCache,
        metrics: Metrics,
        settings: Settings,
        *,
        tuning: Tuning = Tuning(),
        snapshots: SnapshotEnsurer | None = None,
        identity: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        namespaces: NamespaceSet | None = None,
        events: EventRecorder | None = None,
        is_copy: Callable[[str, SourceId, str], bool] = lambda _ns, _sid, _name: False,
    ) -> None:
        """`is_copy(namespace, source, name)`: whether `name` is a snapshot copy configpin made
        of `source` (what an undo may point a template back at)."""
        self.kube = kube
        # What the workers fan out (reads and writes of workloads, pod refreshes) goes
        # through one bucket; the watches and the lease do not.
        self.limited = LimitedKube(
            kube,
            RateLimiter(
                settings.controller.qps,
                settings.controller.burst,
                observe=metrics.rate_limit_wait.observe,
            ),
        )
        self.hkey = hkey
        self.cache = cache
        self.metrics = metrics
        self.settings = settings
        self.tuning = tuning
        self.identity = identity or new_identity()
        self.clock = clock
        self.wall = wall
        self.index = WorkloadIndex()
        # The selection admission enforces too (`configpin serve` shares one); started and
        # stopped here only when it is the controller's own.
        self._own_namespaces = namespaces is None
        if namespaces is None:
            namespaces = NamespaceSet.of(kube, metrics, settings)
            namespaces.informer.watch_timeout = tuning.watch_timeout
        self.namespaces = namespaces
        self.watches = WorkloadWatches(kube, metrics, self, watch_timeout=tuning.watch_timeout)
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
        self.staleness = Staleness(metrics, clock)
        self.waiting = Waiting()
        self.holds = Holds(wall)
        for reason in HELD:
            metrics.rollouts_held.labels(reason.value).set_function(
                partial(self.holds.count, reason)
            )
        self.report = Reporter(metrics, events, clock)
        self._decisions(snapshots, is_copy)
        self._runners()

    def _decisions(
        self, snapshots: SnapshotEnsurer | None, is_copy: Callable[[str, SourceId, str], bool]
    ) -> None:
        """What decides and does the work: the waves (gate), the re-stamp decision, the
        reconciler that writes it, and the preview admission asks on every replica."""
        kube, hkey, settings, cache = self.kube, self.hkey, self.settings, self.cache
        metrics = self.metrics
        self.pods = Pods(kube, self.limited, hkey, settings, metrics, is_leader=self.is_leader)
        self.limits = RolloutLimits(
            settings, hkey, namespace_windows=self.namespaces.windows_of, wall=self.wall
        )
        self.gate = Gate(
            self.index,
            cache,
            hkey,
            settings,
            in_scope=self.namespaces.__contains__,
            limits=self.limits,
        )
        follower = Follower(hkey, is_copy=is_copy, changed_keys=cache.changed_keys)
        self.acts = Acts(hkey, self.gate.cut, follower, self.wall)
        self.restamper = Restamper(
            hkey,
            settings,
            copies=snapshots is not None,
            is_leader=self.is_leader,
            follower=follower,
            gate=self.gate,
            wall=self.wall,
            acts=self.acts,
        )
        self.reconciler = Reconciler(
            self.limited,
            cache,
            self.index,
            self.restamper,
            self.report,
            metrics,
            pods=self.pods,
            snapshots=snapshots,
            kinds=self.watches.kinds,
            in_scope=self.namespaces.__contains__,
            is_leader=self.is_leader,
            on_moved=self.rollout_moved,
            editors=Editors(self.limited, hkey).of,
        )
        self.apply = self.reconciler  # one workload brought up to date, now: an Outcome
        # What a write of a source will do (admission's preview, on every replica)
        self.preview = Previewer(self.gate.cut, ready=self.synced, limits=self.limits)
        # Each change as an object (the leader's)
        self.publisher = Publisher(
            # its own bucket: publishing (a first start writes every consumed source's) never
            # delays a rollout, and a rollout never waits behind it
            LimitedKube(kube, RateLimiter(PUBLISH_QPS, PUBLISH_BURST)),
            kube,
            hkey,
            self.index,
            self.gate.cut,
            cache,
            metrics,
            in_scope=self.namespaces.__contains__,
            acting=self.acting,
            resync_period=settings.controller.resync_period,
            wall=self.wall,
            watch_timeout=self.tuning.watch_timeout,
        )

    def _runners(self) -> None:
        """The rollouts' runner (coalescing window, --min-rollout-interval) and the follows'."""
        settings, clock, tuning = self.settings, self.clock, self.tuning
        self.runner: Runner[WorkloadRef, SourceId] = Runner(
            "rollout",
            self._reconcile,
            RolloutQueue(
                window=settings.rollout.coalesce_window,
                min_interval=settings.rollout.min_interval,
                clock=clock,
            ),
            workers=tuning.workers,
            is_leading=self.acting,
            on_leading=self._started_leading,
            on_stopped_leading=self._stopped_leading,
            resync=self._resync,
            resync_period=settings.controller.resync_period,
            housekeeping=self._housekeeping,
            on_retry=self._retrying,
            on_give_up=self._gave_up,
        )

        # Following the rollouts it started: a queue of its own, with no coalescing window and
        # no minimum interval (a look at a rollout is no rollout), apart from the rollouts'; a
        # status event looks at once, not at the poll that was due.
        self.follows: Runner[WorkloadRef, SourceId] = Runner(
            "follow",
            self._follow,
            RolloutQueue(window=0.0, min_interval=0.0, clock=clock, advance=True),
            workers=2,
            is_leading=self.acting,
            retry_limit=None,
        )

    @property
    def queue(self) -> RolloutQueue[WorkloadRef, SourceId]:
        return self.runner.queue

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

    def _wait(self, synced: Callable[[float], bool], timeout: float, what: str) -> None:
        if not synced(timeout):
            raise TimeoutError(f"the watch of {what} did not sync")

    def _start_once(self) -> None:
        self.watches.discover()
        if self.source_changed not in self.cache.listeners:
            self.cache.listeners.append(self.source_changed)
            self.namespaces.listeners.append(self.namespace_selected)
            if self._own_namespaces:
                self.namespaces.start()
        # What admission needs comes first: the workloads are listed once the namespaces and
        # the sources are, so that their lists (tens of thousands of objects, parsed in this
        # process) neither slow the webhook's readiness down nor share the API server with it.
        deadline = time.monotonic() + self.tuning.sync_timeout

        def left() -> float:
            return max(0.0, deadline - time.monotonic())

        self._wait(self.namespaces.informer.synced.wait, left(), "namespaces")
        self._wait(self.cache.wait_synced, left(), "ConfigMaps and Secrets (the cache)")
        self.watches.start()
        deadline = time.monotonic() + self.tuning.sync_timeout
        for informer in self.watches.informers.values():
            self._wait(informer.synced.wait, left(), informer.resource)
        if self._stop.is_set():
            return
        self._synced.set()
        for then in self.after_synced:
            try:
                then()
            except Exception:
                log.exception("starting %s after the controller's sync failed", then)
        self.runner.start()
        self.follows.start()
        self.publisher.start()
        self.elector = elector(
            self.kube, self.settings, self.identity, self.metrics, self.runner.poke
        )
        self.up.set(1)
        log.info(
            "controller started: %d workloads indexed, kinds %s, identity %s",
            len(self.index),
            ", ".join(sorted(self.watches.kinds)),
            self.identity,
        )
        self.elector.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Finish the patches in flight, then release the Lease (a standby takes over at
        once, and no write of ours can land after it has)."""
        self._stop.set()
        deadline = time.monotonic() + timeout
        self.runner.stop(timeout)
        self.follows.stop(timeout)
        self.publisher.stop(timeout)
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        self.pods.close()
        if self.elector is not None:
            self.elector.stop()
        if self._own_namespaces:
            self.namespaces.stop()
        self.watches.stop()
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

    # --- leadership, resync (the runner calls these on its housekeeping thread)
    def _started_leading(self) -> None:
        log.info("leading: checking every workload against its recorded state")
        self.gate.forget()
        self.check_all()

    def _stopped_leading(self) -> None:
        log.info("not leading any more: dropping %d pending rollouts", len(self.queue))
        self.staleness.clear()
        self.holds.clear()

    def _resync(self) -> None:
        self.gate.forget()
        self.watches.watch_new_kinds()
        queued = self.check_all()
        self.metrics.resyncs.inc()
        if queued:
            log.info("periodic resync: %d workloads were not current", queued)

    def _housekeeping(self) -> None:
        if self.staleness.due():
            self.measure_staleness()
        for ref in self.holds.due():  # (their windows open, their budget allows again)
            entry = self.index.get(ref)
            if entry is not None:
                self.check(entry)

    def measure_staleness(self) -> int:
        """Which workloads are stale now, from memory (the index and the source cache). Only
        the leader counts; returns how many are stale."""
        if not self.acting():
            self.staleness.clear()
            return 0
        stale = [
            e.ref
            for e in self.index.entries()
            if e.ref.namespace in self.namespaces
            and stale_sources(e, self._peek(e.ref.namespace), self.hkey)
        ]
        self.holds.keep_only(stale)
        held = self.holds.refs()  # (held by their windows or budget: not overdue)
        self.staleness.measured([ref for ref in stale if ref not in held])
        return len(stale)

    # --- checks (called from watch threads: in memory only, no API calls)
    def _peek(self, namespace: str) -> Lookup:
        return peek_in(self.cache, namespace)

    def check(
        self,
        entry: WorkloadEntry,
        *,
        seen: float | None = None,
        pods_moved: bool = False,
        change: bool = False,
    ) -> bool:
        """Queue the workload if it is stale; True when it was.

        `pods_moved`: its pods may have changed (its status moved, a relist, a resync): a
        current workload that was refreshed is queued all the same, so that a pod created
        since (a scale-up, a replaced pod) is brought to the refreshed record. `change`: a
        source of it changed (what configpin_changes_coalesced_total counts when it joins a
        pending rollout; its own status moving or a resync finding it again is no change)."""
        if not self.acting() or entry.ref.namespace not in self.namespaces:
            return False
        if self.acts.wants(entry):
            # A person's abort or retry asks something of it: looked at now, on the follows'
            # queue (no coalescing window; a look due later, a backoff's, is brought forward)
            self.follows.queue.add(entry.ref, ())
            return True
        stale = stale_sources(entry, self._peek(entry.ref.namespace), self.hkey)
        for sid in stale:  # (its ConfigRollouts: what they say of it may move)
            self.publisher.mark(entry.ref.namespace, sid)
        brief = entry.rollout
        if brief is not None and entry.rolling:
            # A rollout it started: how is it going? Stale only for the content it rolls to
            # (no newer change of those sources) is its template taken back by a person,
            # judged there, not a change to roll.
            self.follows.queue.add(entry.ref, ())
            if stale <= {c.source for c in brief.changes} and not self.gate.superseded(entry):
                stale = set()
        if not stale:
            self.metrics.skipped.labels(SkipReason.CURRENT.label).inc()
            self.staleness.current(entry.ref)
            refreshed = entry.refreshed is not None and self.settings.rollout.refresh_pods
            if pods_moved and refreshed and not entry.rolling:
                self.queue.add(entry.ref, (), seen=seen)
            return False
        self.staleness.seen_stale(entry.ref, self.clock() if seen is None else seen)
        if entry.reloader is not None and self._left_to_reloader(entry, stale):
            return False
        held = None if change or not entry.held else self.holds.of(entry.ref)
        if held is not None and held == self.gate.window_wait(entry, stale):
            # Its windows held it when a worker last decided, and hold it still, as memory
            # says (its index entry, its namespace's list, the clock), and it carries
            # configpin.io/held, which that worker wrote: handing it to a worker again would
            # read it for the same answer, at every resync. A change of its sources is
            # decided again, and so is a workload whose marker a client took away (a GitOps
            # tool's re-apply as Git says: the worker writes it back); its hold ends by the
            # clock (Holds.due), or by its own or its namespace's list, whose edits come
            # here with the new list.
            return True
        last = None
        if entry.rolled_at is not None:  # the workload's own record: on this clock
            last = self.clock() - max(0.0, time.time() - entry.rolled_at)
        # A change every stale source of which is refreshed in place goes at once (a leading
        # edge: what follows within the coalescing window makes one more pass after it); one
        # that rolls waits the window, so that a multi-source apply rolls once.
        refreshes = entry.delivery.refreshes if entry.delivery is not None else None
        leading = (
            refreshes is not None
            and self.settings.rollout.refresh_pods
            and all(str(sid) in refreshes for sid in stale)
        )
        if self.queue.add(entry.ref, stale, seen=seen, last_rollout=last, leading=leading):
            if change:
                self.metrics.coalesced.inc()
        else:
            wait = self.queue.not_before(entry.ref) - self.clock()
            if wait > self.settings.rollout.coalesce_window:
                until = format_time(time.time() + wait)
                self.report.deferred(self.watches.regarding(entry.ref), stale, until)
        return True

    def _left_to_reloader(self, entry: WorkloadEntry, stale: set[SourceId]) -> bool:
        """Reloader rolls it for every source that changed (its annotations say so): a
        re-stamp too would restart it twice. Reloader's template write goes through admission,
        which stamps it: current then. Still stale until it comes (said once per content)."""
        peek = self._peek(entry.ref.namespace)
        left = left_to_reloader(entry.reloader, stale, peek, entry.recorded_for)
        if not left or not stale <= left.keys():
            return False
        self.metrics.skipped.labels(SkipReason.RELOADER.label).inc()
        self.report.left_to_reloader(self.watches.regarding(entry.ref), left, peek)
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
        self.publisher.mark(namespace, sid)
        self.metrics.changes_seen.inc()
        now = self.clock()
        for entry in consumers:
            self.check(entry, seen=now, change=True)
        if any(e.rolling for e in consumers):
            # their rollouts are superseded: the places they held are free at once
            self._look_again(self.waiting.freed())

    def rollout_moved(self, entry: WorkloadEntry, before: WorkloadEntry | None) -> None:
        """A workload's rollout ended (completed, failed): the workloads waiting for one (a
        later wave, the cap on rollouts in flight) are looked at again."""
        self.publisher.moved(entry, before)
        self._look_again(self.waiting.ended(entry, before))

    def workload_removed(self, entry: WorkloadEntry) -> None:
        """A workload was deleted: whatever waited for its rollout looks again."""
        self.publisher.forget(entry)
        self._look_again(self.waiting.ended(None, entry))

    def _look_again(self, refs: list[WorkloadRef]) -> None:
        for ref in refs:
            found = self.index.get(ref)
            if found is not None:
                self.check(found)

    def namespace_selected(self, namespace: str) -> None:
        self.check_all(namespace=namespace)

    def entry(self, obj: JSONObject) -> WorkloadEntry | SkipReason:
        """What the index holds of a workload its watch saw, or why it holds nothing."""
        return self.restamper.entry(obj)

    def forget(self, ref: WorkloadRef) -> None:
        """A workload the index no longer holds: its pending rollout is dropped."""
        self.queue.forget(ref)

    def report_owned(self, obj: JSONObject) -> None:
        """An operator's workload: said once, by the leader, where configpin acts."""
        if self.acting() and str((obj.get("metadata") or {}).get("namespace", "")) in (
            self.namespaces
        ):
            self.report.owned(obj)

    # --- the work (the runner's workers)
    def _reconcile(self, ref: WorkloadRef, pending: Pending[SourceId]) -> Outcome:
        moves = self.waiting.moves
        outcome = self.apply(ref, pending.sources, first_seen=pending.first_seen)
        waits = isinstance(outcome, Skipped) and outcome.reason is SkipReason.WAITING
        wait = outcome.wait if isinstance(outcome, Skipped) else None
        self.publisher.decided(ref, wait, pending.sources)
        if self.holds.looked_at(ref, wait) and wait is not None:
            self.metrics.rollout_holds.labels(wait.reason.value).inc()
        if self.waiting.looked_at(ref, waits=waits, moves_before=moves) and (
            entry := self.index.get(ref)
        ):
            self.check(entry)  # what it waited for ended while it was looked at
        return outcome

    def _follow(self, ref: WorkloadRef, _pending: Pending[SourceId]) -> Outcome:
        return self.reconciler(ref, follow_only=True)

    def _retrying(self, ref: WorkloadRef, attempt: int, why: str, delay: float) -> None:
        self.report.retrying(ref, why, delay)

    def _gave_up(self, ref: WorkloadRef, attempts: int, why: str) -> None:
        self.report.gave_up(self.watches.regarding(ref), attempts, why)
