"""One workload brought up to date: read fresh (or planned from the index alone), decided
(webhook.controller.restamp), what the decision needs done first done (its snapshot copies
made, its running pods refreshed), written by a guarded PATCH, then checked against what the
API server stored. What it came to is a typed outcome (webhook.controller.outcome), said in
metrics, logs and Events (webhook.controller.report) on the way."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Protocol

from webhook.controller.decision import Decision
from webhook.controller.editors import Rolled as RolledTo
from webhook.controller.index import WorkloadIndex
from webhook.controller.needs import Held, Inputs, Need, pods_key, reads_of
from webhook.controller.outcome import (
    Outcome,
    Poll,
    Refreshed,
    RetryAfter,
    Rolled,
    Settled,
    Skipped,
)
from webhook.controller.report import Reporter
from webhook.controller.restamp import IndexRestamp, Restamper, touches_template
from webhook.core.constants import ANN_HELD, ANN_SOURCES
from webhook.core.current import Lookup, WorkloadEntry, WorkloadRef
from webhook.core.kept import dumps_mapping, parse_mapping
from webhook.core.kinds import WorkloadKind, template_paths
from webhook.core.model import (
    JSONObject,
    SnapshotEnsurer,
    SourceId,
    SourceRecord,
    SourceUnavailable,
)
from webhook.core.reasons import Fallback, SkipReason
from webhook.core.record import Action, State, annotations_of
from webhook.core.refresh import RollInstead
from webhook.core.refs import get_path
from webhook.core.rollouts import held_text
from webhook.core.waves import Wait
from webhook.inputs.sources import Miss
from webhook.kube.cache import SourceCache
from webhook.kube.errors import Conflict, Forbidden, KubeError, NotFound
from webhook.kube.ratelimit import LimitedKube
from webhook.kube.raw import MERGE_PATCH
from webhook.kube.workloads import Served, update_workload
from webhook.process.metrics import Metrics

log = logging.getLogger(__name__)


class PodRefresher(Protocol):
    """A workload's running pods (webhook.controller.refresh)."""

    def running(self, ref: WorkloadRef, obj: JSONObject) -> list[JSONObject]:
        """Its live pods (a rollout configpin follows is judged by them)."""
        ...

    def refresh(self, ref: WorkloadRef, obj: JSONObject, target: Mapping[str, str]) -> int:
        """Tell its pods that lag `target` to sync; returns how many. Raises Forbidden."""
        ...

    def catch_up(self, ref: WorkloadRef, obj: JSONObject, read: Lookup) -> None:
        """Bring pods created since its last refresh to that refresh."""
        ...


def peek_in(cache: SourceCache, namespace: str) -> Lookup:
    """The sources of a namespace as this replica holds them, from memory only."""

    def lookup(sid: SourceId) -> SourceRecord | None:
        found = cache.peek(namespace, sid)
        return None if isinstance(found, Miss) else found

    return lookup


def held_in(cache: SourceCache, namespace: str) -> Held:
    """The same, MISS where memory has nothing."""
    return lambda sid: cache.peek(namespace, sid)


def read_in(cache: SourceCache, namespace: str) -> Lookup:
    """The same, reading through where memory has nothing."""
    return lambda sid: cache.get(namespace, sid)


@dataclass(frozen=True)
class _Landed:
    """A workload write as the API server answered it."""

    obj: JSONObject | None  # as stored (None: the workload is gone)
    rolled: bool  # its pod template changed
    touched_template: bool  # the write asked for a template change
    intended: dict[str, str]  # the record planned
    by: str = ""  # who made the change it rolls to
    left: bool = False  # at zero replicas: its record was written ended, nothing rolls


def _template(obj: JSONObject | None) -> object:
    paths = template_paths(str((obj or {}).get("kind", "")))
    return None if obj is None or paths is None else get_path(obj, paths[0][:-1])


class Reconciler:
    def __init__(
        self,
        limited: LimitedKube,
        cache: SourceCache,
        index: WorkloadIndex,
        restamper: Restamper,
        report: Reporter,
        metrics: Metrics,
        *,
        pods: PodRefresher,
        snapshots: SnapshotEnsurer | None,
        kinds: Mapping[str, Served],
        in_scope: Callable[[str], bool],
        is_leader: Callable[[], bool],
        on_moved: Callable[[WorkloadEntry, WorkloadEntry | None], None] = lambda _e, _o: None,
        editors: Callable[[str, tuple[RolledTo, ...]], str] | None = None,
    ) -> None:
        """`on_moved(entry, before)`: a workload as written, indexed (its rollout may have
        started or ended: who waits for it looks again); `editors(namespace, changes)`: who
        made the changes a rollout rolls to (webhook.controller.editors; None: unknown)."""
        self.on_moved = on_moved
        self.editors = editors
        self.pods = pods
        self.snapshots = snapshots
        self.limited = limited
        self.cache = cache
        self.index = index
        self.restamper = restamper
        self.report = report
        self.metrics = metrics
        self.kinds = kinds  # as discovered (filled when the controller starts)
        self.in_scope = in_scope
        self.is_leader = is_leader

    def _skipped(self, reason: SkipReason) -> Skipped:
        self.metrics.skipped.labels(reason.label).inc()
        return Skipped(reason)

    def __call__(
        self,
        ref: WorkloadRef,
        changed: Iterable[SourceId] = (),
        *,
        first_seen: float | None = None,
        before_write: Callable[[JSONObject], None] | None = None,
        follow_only: bool = False,
    ) -> Outcome:
        """Bring one workload up to date (read fresh, decide as restamp.py does, guarded
        patch), then check what the API server stored: when it is not what was planned
        (admission on a replica that decided otherwise, a concurrent writer), look again
        shortly.

        A plain re-stamp (checksum mode, every reference naming a live source) is planned
        from the index instead of a read, and written guarded by the resourceVersion the index
        saw: one request instead of two against the rate limit. Anything else, and a 409
        (the object changed since), takes the read.

        `follow_only`: only look at the rollout configpin started there (a workload that is
        stale is the rollout queue's)."""
        if not self.is_leader():
            return Skipped(SkipReason.NOT_LEADER)
        if not self.in_scope(ref.namespace):
            return self._skipped(SkipReason.NAMESPACE)
        try:
            return self._reconcile(ref, changed, first_seen, before_write, follow_only)
        finally:
            self.restamper.done(ref)  # (the place the gate reserved for its rollout, if any)

    def _reconcile(
        self,
        ref: WorkloadRef,
        changed: Iterable[SourceId],
        first_seen: float | None,
        before_write: Callable[[JSONObject], None] | None,
        follow_only: bool,
    ) -> Outcome:
        kind = self.kinds[ref.kind]
        work = Prelude(
            self.restamper,
            self.pods,
            self.snapshots,
            ref,
            kind.entry,
            held_in(self.cache, ref.namespace),
            read_in(self.cache, ref.namespace),
            editors=self.editors,
        )
        entry = self.index.get(ref)
        if entry is not None and before_write is None and not follow_only:
            landed = self._restamp_from_index(entry, kind, work)
            if landed is not None:
                return self._landed(ref, landed, changed, first_seen, None)
        result = update_workload(
            self.limited,
            kind.path(ref.namespace, ref.name),
            lambda obj: work.decide(obj, follow_only=follow_only),
            on_conflict=self.metrics.conflicts.inc,
            prepare=work.prepare,
            before_write=before_write,
        )
        if work.created and result.read is not None:
            self.report.copies_created(result.read, work.created)
        decision, written = result.decision, result.written
        if result.gone or decision is None:
            return self._skipped(SkipReason.GONE)
        if written is None:
            if decision.poll is not None:  # the rollout it follows goes on
                return Poll(decision.poll)
            if result.read is not None and not follow_only:
                self._held(ref, kind, result.read, decision.waiting)
            if decision.waiting is not None and result.read is not None:
                self.report.waiting(ref, result.read, decision.waiting)
            skipped = self._skipped(decision.skip or SkipReason.UNCHANGED)
            return replace(skipped, wait=decision.waiting) if decision.waiting else skipped
        written.setdefault("kind", ref.kind)
        if decision.progress is not None and decision.ended is None:
            # its record amended to the content its re-stamp was admitted with: followed on
            amended = self.restamper.entry(written)
            if isinstance(amended, WorkloadEntry):
                self.on_moved(amended, self.index.put(amended))
            return Poll(decision.poll if decision.poll is not None else 0.0)
        if decision.progress is not None:  # the rollout it followed ended
            return self._ended(ref, written, decision)
        landed = _Landed(
            written,
            _template(written) != _template(result.read),
            touches_template(ref.kind, decision.ops),
            dict(decision.intended),
        )
        return self._landed(ref, landed, changed, first_seen, decision)

    def _held(self, ref: WorkloadRef, kind: Served, read: JSONObject, wait: Wait | None) -> None:
        """`configpin.io/held` on the workload says the hold the gate answered, when it is one
        a person or a clock ends (webhook.core.rollouts.held_text), and is taken off when it
        is not (a re-stamp takes it off in its own write): one merge patch of that annotation
        where it differs, nothing otherwise. What Argo CD's and Flux's health checks read; no
        decision of configpin's reads it. The index learns at once that the workload carries
        it (where nothing else of it moved since it was indexed), so that the next resync
        takes the hold as known (RolloutController.check) without waiting for the watch."""
        have = annotations_of(read).get(ANN_HELD)
        want = held_text(wait)
        if have == want:
            return
        patch = {"metadata": {"annotations": {ANN_HELD: want}}}
        try:
            written = self.limited.patch(
                kind.path(ref.namespace, ref.name), patch, content_type=MERGE_PATCH
            )
        except (NotFound, Conflict):
            return  # (gone, or moved on: looked at again)
        except KubeError as e:
            log.warning("%s: could not say it is held (%s): %s", ref, ANN_HELD, e)
            return
        written.setdefault("kind", ref.kind)
        entry = self.restamper.entry(written)
        if isinstance(entry, WorkloadEntry) and self.index.get(ref) == entry:
            self.index.put(entry)  # (anything else moved: the watch's event says it)

    def _ended(self, ref: WorkloadRef, written: JSONObject, decision: Decision) -> Outcome:
        """A followed rollout came to an end (complete, or failed and acted upon): index what
        was stored, say it."""
        entry = self.restamper.entry(written)
        if isinstance(entry, WorkloadEntry):
            self.on_moved(entry, self.index.put(entry))
        ended = decision.ended
        assert ended is not None
        state = ended.record.state
        if state is State.COMPLETE:
            self.report.rollout_complete(ref, written)
            return Settled(state)
        if state is State.LEFT:
            self.report.rollout_left(ref, written)
            return Settled(state)
        if ended.record.action is Action.PERSON:
            self.report.rolled_back_by_person(ref, written, ended)
        else:
            self.report.rollout_failed(ref, written, ended)
        if not isinstance(entry, WorkloadEntry) or entry.recorded != dict(decision.intended):
            self.metrics.skipped.labels(SkipReason.NOT_STORED.label).inc()
            return RetryAfter("the API server stored another record than planned")
        return Settled(state, ended.record.action)

    def _restamp_from_index(
        self, entry: WorkloadEntry, kind: Served, work: Prelude
    ) -> _Landed | None:
        """A plain re-stamp planned from the index and written without reading the object
        first (see `apply`); None when it needs the object (or the object changed since the
        index saw it: a 409), and `apply` reads it (what was read for this plan is not read
        again for that one)."""
        ref = entry.ref
        restamp = work.from_index(entry)
        if restamp is None:
            return None
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
        stored = get_path(written, kind.entry.meta_path)
        annotations = (stored.get("annotations") if isinstance(stored, dict) else None) or {}
        rolled = parse_mapping(annotations.get(ANN_SOURCES)) != entry.recorded
        return _Landed(written, rolled, True, restamp.observed, restamp.by, restamp.left)

    def _landed(
        self,
        ref: WorkloadRef,
        landed: _Landed,
        changed: Iterable[SourceId],
        first_seen: float | None,
        decision: Decision | None,
    ) -> Outcome:
        """After a write: index what was stored, count and say it, and check it is what was
        planned (otherwise: look again, with backoff, from what the cluster then holds)."""
        obj, rolled = landed.obj, landed.rolled
        if obj is None:
            return self._skipped(SkipReason.GONE)
        entry = self.restamper.entry(obj)
        before = None
        if isinstance(entry, WorkloadEntry):
            before = self.index.put(entry)  # the watch will say the same: nothing to re-check
        changed = frozenset(changed)
        refreshed = decision.refreshed if decision is not None else None
        instead = decision.instead if decision is not None else None
        outcome: Outcome
        if refreshed is not None:
            self.report.refreshed(ref, obj, changed, refreshed, first_seen)
            outcome = Refreshed(refreshed)
        elif rolled and instead is not None:
            self.report.rolled_instead(ref, obj, changed, instead)
        if rolled:
            rollout = decision.rollout if decision is not None else None
            by = rollout.by if rollout is not None else landed.by
            left = rollout.state is State.LEFT if rollout is not None else landed.left
            self.report.rolled(ref, obj, changed, first_seen, by, left=left)
            outcome = Rolled(changed, instead)
        elif refreshed is None and not landed.touched_template:
            self.report.recorded(obj)
            outcome = self._skipped(SkipReason.RECORD_ONLY)
        elif refreshed is None:
            outcome = Skipped(SkipReason.UNCHANGED)  # admission kept the template as it was
        if isinstance(entry, WorkloadEntry):
            self.on_moved(entry, before)  # (the watch's event finds the index up to date)
        if not isinstance(entry, WorkloadEntry) or entry.recorded != landed.intended:
            # Stored is not what was planned: something in the write path (admission on a
            # replica that decided otherwise, another writer) changed it. Never counted as
            # done: looked at again, with backoff, from what the cluster then holds.
            self.metrics.skipped.labels(SkipReason.NOT_STORED.label).inc()
            return RetryAfter("the API server stored another record than planned", rolled=rolled)
        return outcome


class Prelude:
    """What one reconcile does around its decisions, once per distinct need however often a
    conflict makes it decide again. Before a decision: what it asks to be read (the pods of
    the rollout it follows, a source memory does not hold, who made a change) is read into
    its `Inputs`, so that after a 409 only the workload is read again. Before its write: the
    snapshot copies made to exist, the running pods refreshed (a refusal, 403, makes it
    decide again: it rolls instead), the pods created since a refresh brought to it."""

    def __init__(
        self,
        restamper: Restamper,
        pods: PodRefresher,
        snapshots: SnapshotEnsurer | None,
        ref: WorkloadRef,
        kind: WorkloadKind,
        held: Held,
        read: Lookup,
        *,
        editors: Callable[[str, tuple[RolledTo, ...]], str] | None = None,
    ) -> None:
        """`held`: the sources in memory; `read`: one source read (through memory: a read
        of the API server where it has nothing); `editors(namespace, changes)`: who made
        them."""
        self.restamper = restamper
        self.pods = pods
        self.snapshots = snapshots
        self.ref = ref
        self.kind = kind
        self.held, self._read = held, read
        self.editors = editors
        self.inputs = Inputs()
        self.created: list[JSONObject] = []  # copies made for it, said once it is written
        self.refused: RollInstead | None = None
        self._copies: set[str] = set()
        self._refreshed: dict[str, int] = {}
        self._caught_up = False

    def decide(self, obj: JSONObject, *, follow_only: bool = False) -> Decision:
        while True:
            found = self.restamper.decide(
                self.ref,
                obj,
                held=self.held,
                inputs=self.inputs,
                kind=self.kind,
                follow_only=follow_only,
                refused=self.refused,
            )
            if isinstance(found, Decision):
                return found
            self._gather(found, obj)

    def from_index(self, entry: WorkloadEntry) -> IndexRestamp | None:
        """A plain re-stamp planned from the index alone (Restamper.from_index)."""
        while True:
            found = self.restamper.from_index(entry, self.kind, held=self.held, inputs=self.inputs)
            if not isinstance(found, Need):
                return found
            self._gather(found, None)

    def read(self, sid: SourceId) -> SourceRecord | None:
        """A source as memory holds it, or as it was read for this reconcile (read now, the
        first time)."""
        found = self.held(sid)
        if not isinstance(found, Miss):
            return found
        if sid not in self.inputs.sources:
            try:
                self.inputs.sources[sid] = self._read(sid)
            except SourceUnavailable as e:
                self.inputs.sources[sid] = e
        return self.inputs.source(sid)

    def _gather(self, need: Need, obj: JSONObject | None) -> None:
        """Read what a decision asked for into its inputs: each thing once."""
        inputs, read = self.inputs, False
        for sid in sorted(need.sources - inputs.sources.keys()):
            with contextlib.suppress(SourceUnavailable):  # (kept: said by the decision)
                self.read(sid)
            read = True
        if need.pods and obj is not None and inputs.pods_of(obj) is None:
            inputs.pods[pods_key(obj)] = self.pods.running(self.ref, obj)
            read = True
        rolled = need.editors
        if rolled and inputs.editors_of(rolled) is None:
            who = self.editors(self.ref.namespace, rolled) if self.editors is not None else ""
            inputs.editors[reads_of(rolled)] = who
            read = True
        if not read:  # (it would ask again for ever)
            raise RuntimeError(f"{self.ref}: a decision asked for what it was given: {need}")

    def prepare(self, obj: JSONObject, decision: Decision) -> Decision:
        ref = self.ref
        if decision.catch_up and not self._caught_up:
            self._caught_up = True
            self.pods.catch_up(ref, obj, self.read)
        if decision.refresh is not None:
            key = dumps_mapping(decision.refresh)
            if key not in self._refreshed:
                try:
                    self._refreshed[key] = self.pods.refresh(ref, obj, decision.refresh)
                except Forbidden as e:
                    self.refused = RollInstead(
                        Fallback.FORBIDDEN,
                        f"configpin may not patch its pods ({e}); grant it or turn "
                        "on-change: refresh off",
                    )
                    return self.prepare(obj, self.decide(obj))
            decision = dataclasses.replace(decision, refreshed=self._refreshed[key])
        todo = [c for c in decision.copies if c.snapshot_name not in self._copies]
        if todo:
            if self.snapshots is None:  # (the restamper was told: it never asks then)
                return Decision.leave(SkipReason.NO_SNAPSHOTS)
            for warning in self.snapshots.ensure(
                ref.namespace, todo, dry_run=False, on_created=self.created.append
            ):
                log.warning("%s: %s", ref, warning)
            self._copies.update(c.snapshot_name for c in todo)
        return decision
