"""The re-stamp decision: given a workload as just read, what to write and what it means.

    rolling, and its template taken back off the content rolled to ──► a person's verdict
        │   (unless its spec is still as configpin's write stored it: admission pinned
        │    newer content than decided there, which is followed as configpin's rollout)
        │
    current? ── yes ──► follow its rollout, if one is in progress; else leave it (pods
        │                created since a refresh are brought to that refresh)
        │ no: some consumed source differs from what it recorded
    plan it as admission does (plan_object, told which sources changed)
        ├─ not pinned (a skip reason), or nothing to write ──► leave it
        ├─ Reloader's annotations leave every changed source to Reloader ──► leave it
        ├─ found unstamped, older than the catch-up window ──► its record only: a baseline
        ├─ a required source that appeared (checksum mode) ──► its record only
        ├─ on-change: refresh, reachable through whole-volume mounts ──► refresh its pods
        ├─ a wave or the cap says not yet ──► wait
        └─ otherwise ──► roll: copies made first (snapshot mode), the template re-stamped

The decision writes nothing and reads nothing from the API server: it says what it wants
(the copies that must exist, the pods to refresh, the patch), and the reconciler does the
writes. What it needs read (the pods of a rollout it follows, a source memory does not hold,
who made a change) it asks for (`Need`); the reconciler's Prelude reads that once into its
`Inputs` and asks again, so a conflict (409) that makes it decide again reads the workload
again and nothing else. Dependencies come in explicitly (the settings, leadership, the clock,
the sources held in memory): it builds no thread and no client, and tests drive it case by
case.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, replace

from webhook.controller.acts import Acts
from webhook.controller.decision import Decision
from webhook.controller.editors import Rolled
from webhook.controller.follow import Follower
from webhook.controller.needs import Held, Inputs, Need, Reads
from webhook.controller.wavecut import carried_on
from webhook.controller.waves import Gate
from webhook.core.constants import (
    ANN_EXTRA_SOURCES,
    ANN_HELD,
    ANN_ON_CHANGE,
    ANN_ROLLOUT,
    ANN_ROLLOUT_STARTS,
    MODE_SNAPSHOT,
    ON_CHANGE_REFRESH,
)
from webhook.core.current import (
    Lookup,
    WorkloadEntry,
    WorkloadRef,
    appeared,
    consumption_of,
    entry_from_object,
    newly_named,
    stale_sources,
)
from webhook.core.extra import extra_sources
from webhook.core.kept import dumps_mapping, observed_ops, refreshed_ops, rolled_at_ops
from webhook.core.kinds import WorkloadKind, template_paths
from webhook.core.model import (
    JSONObject,
    PatchOp,
    Plan,
    SourceId,
)
from webhook.core.modes import effective_mode
from webhook.core.names import pointer
from webhook.core.plan import plan_object, restamp_from_consumption
from webhook.core.progress import Progress, Standing, standing
from webhook.core.reasons import Fallback, SkipReason
from webhook.core.record import (
    Action,
    Change,
    RolloutRecord,
    State,
    generation_of,
    identity,
    readmitted,
    record_ops,
    rolled_back,
    rollout_record,
    started,
    template_sources,
)
from webhook.core.refresh import RollInstead, roll_instead
from webhook.core.refs import Consumption
from webhook.core.reloader import left_to_reloader
from webhook.core.times import format_time, parse_time
from webhook.core.waves import Wait
from webhook.process.config import Settings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Start:
    """What starting a rollout writes on the workload's own metadata beside the re-stamp (an
    annotation's value, None: removed), and its record (None: rollouts are not followed)."""

    annotations: dict[str, str | None]
    rollout: RolloutRecord | None


def _warn(ref: WorkloadRef, warnings: Iterable[str]) -> None:
    for warning in warnings:
        log.warning("%s: %s", ref, warning)


def touches_template(kind: str, ops: Iterable[PatchOp]) -> bool:
    """Whether a write changes the pod template (a rollout), not only the workload's own
    metadata (its record)."""
    paths = template_paths(kind)
    assert paths is not None
    prefix = pointer(paths[0][:-1]) + "/"
    return any(str(op.get("path", "")).startswith(prefix) for op in ops)


def _age(obj: JSONObject, now: float) -> float:
    """Seconds since the object was created (0 when that cannot be told)."""
    created = parse_time((obj.get("metadata") or {}).get("creationTimestamp"))
    return 0.0 if created is None else max(0.0, now - created)


def _asks_refresh(obj: JSONObject) -> bool:
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    return isinstance(annotations, dict) and annotations.get(ANN_ON_CHANGE) == ON_CHANGE_REFRESH


def plan_update(
    obj: JSONObject,
    ref: WorkloadRef,
    hkey: bytes,
    settings: Settings,
    read: Lookup,
    *,
    refresh: Collection[SourceId] = (),
) -> Plan:
    """The workload as it stands, planned as admission plans an UPDATE of it; `refresh`: the
    sources whose change it must now follow (even where its template points at older copies)."""
    return plan_object(
        obj,
        hkey=hkey,
        lookup=read,
        default_mode=settings.admission.mode,
        operation="UPDATE",
        old=obj,
        refresh=refresh,
        namespace=ref.namespace,
        max_sources=settings.admission.max_sources,
        allow_snapshots=settings.snapshots.enabled,
    )


@dataclass(frozen=True)
class IndexRestamp:
    """A plain re-stamp planned from the index alone: a merge patch guarded by the
    resourceVersion the index saw."""

    merge_patch: JSONObject
    observed: dict[str, str]
    by: str = ""  # who made the change(s) it rolls to
    left: bool = False  # at zero replicas: its record is written ended (nothing rolls)


class Restamper:
    def __init__(
        self,
        hkey: bytes,
        settings: Settings,
        *,
        copies: bool,
        is_leader: Callable[[], bool],
        follower: Follower | None = None,
        gate: Gate | None = None,
        wall: Callable[[], float] = time.time,
        acts: Acts | None = None,
    ) -> None:
        """`copies`: snapshot copies can be written (the reconciler has the writer);
        `follower`, `gate`: safe delivery (None: rollouts are started and not followed, every
        workload at once); `acts`: what a person's abort or retry asks of a workload."""
        self.hkey = hkey
        self.settings = settings
        self.copies = copies
        self.is_leader = is_leader
        self.follower = follower
        self.gate = gate
        self.wall = wall
        self.acts = acts

    def entry(self, obj: JSONObject) -> WorkloadEntry | SkipReason:
        return entry_from_object(
            obj, self.settings.admission.mode, self.settings.admission.max_sources, self.hkey
        )

    def done(self, ref: WorkloadRef) -> None:
        """Its reconcile ended: what it wrote is in the index (a place reserved is freed)."""
        if self.gate is not None:
            self.gate.release(ref)

    @staticmethod
    def _rolled(
        entry: WorkloadEntry,
        changes: tuple[Change, ...],
        to: Mapping[str, str],
        peek: Lookup,
    ) -> tuple[Rolled, ...]:
        """What `entry` rolls to (`to`) of `changes`: each change, the keys it reads of its
        source and their digest (who made it is the last writer of those keys)."""
        rolled = []
        for change in changes:
            sid = change.source
            consumed = consumption_of(entry, sid, peek)  # (None: its copy is gone: unknown)
            keys = consumed.keys if consumed is not None else None
            rolled.append(Rolled(change, keys, to.get(str(sid), "") if consumed else ""))
        return tuple(rolled)

    def _admit(
        self, entry: WorkloadEntry, stale: Collection[SourceId]
    ) -> tuple[tuple[Change, ...], Wait | None]:
        gate = self.gate
        return gate.admit(entry.ref, stale, entry) if gate is not None else ((), None)

    def _starts(self, entry: WorkloadEntry, now: float) -> str | None:
        """`configpin.io/rollout-starts` after a rollout started now (None: no budget kept)."""
        limits = self.gate.limits if self.gate is not None else None
        return limits.starts_text(entry, now) if limits is not None else None

    def decide(
        self,
        ref: WorkloadRef,
        obj: JSONObject,
        *,
        held: Held,
        inputs: Inputs,
        kind: WorkloadKind,
        follow_only: bool = False,
        refused: RollInstead | None = None,
    ) -> Decision | Need:
        """`held`: the sources as this replica holds them (memory only, what staleness is
        judged by); `inputs`: what was read for it (the sources memory did not hold among
        them); `kind`: its entry in the table of kinds; `follow_only`: only look at the
        rollout configpin follows there; `refused`: its pods may not be refreshed (it rolls
        instead). A `Need`: what must be read into `inputs` before it can be decided."""
        settings = self.settings
        read = Reads(held, inputs)
        peek = read.peek
        obj.setdefault("kind", ref.kind)
        entry = self.entry(obj)
        if isinstance(entry, SkipReason):
            return Decision.leave(entry)
        record = rollout_record(self.hkey, obj) if self.follower is not None else None
        if self.acts is not None and (acted := self._acted(ref, obj, entry, kind, record)):
            return acted
        following = record if record is not None and entry.rolling else None
        amended = False
        if following is not None and rolled_back(kind, obj, following):
            found = readmitted(kind, obj, following)
            if found is None:
                return self._verdict(ref, obj, entry, following)
            # configpin's own write, its content newer than decided: that is what it rolls,
            # and who made that content made the change it rolls
            rolled = self._rolled(entry, found.changes, found.to, peek)
            by = inputs.editors_of(rolled)
            if by is None:
                return Need(editors=rolled)
            following = record = replace(found, by=by or found.by)
            amended = True
        stale = stale_sources(entry, peek, self.hkey)
        if following is not None and (
            not stale or (follow_only and stale.isdisjoint(c.source for c in following.changes))
        ):
            # (stale for other sources only: the rollout in flight is followed all the same,
            # so that it ends and frees its place even while that new change waits)
            return self._follow(ref, obj, kind, following, inputs, amended=amended)
        if follow_only:  # nothing in progress to look at (or a change to roll: not here)
            return Decision.leave(SkipReason.CURRENT)
        if not stale:
            if entry.refreshed is not None and settings.rollout.refresh_pods:
                return Decision([], SkipReason.CURRENT, catch_up=True)
            return Decision.leave(SkipReason.CURRENT)
        if stale <= left_to_reloader(entry.reloader, stale, peek, entry.recorded_for).keys():
            return Decision.leave(SkipReason.RELOADER)  # (its restart is stamped at admission)
        plan = plan_update(obj, ref, self.hkey, settings, read, refresh=stale)
        if (need := read.need()) is not None:
            return need
        if plan.skipped is not None:
            return Decision.leave(plan.skipped)
        if not entry.stamped and _age(obj, self.wall()) > settings.rollout.catch_up_window:
            return self._record_only(ref, obj, plan.observed, "found unstamped: a baseline")
        named = newly_named(entry, stale, extra_sources(obj)[0])
        came = appeared(entry, stale) if plan.mode != MODE_SNAPSHOT else set()
        if stale <= came | named:
            # No pod of it could start before the source existed: they start with what it
            # holds now. (Snapshot mode rolls instead: its revisions must point at copies.)
            # A source just named in configpin.io/extra-sources: its pods read what it holds
            # already (the app reads it itself), and nothing in them points at it. The
            # record is completed; a rollout would restart them for nothing.
            completed = {**entry.recorded}
            completed.update((str(sid), plan.observed[str(sid)]) for sid in stale)
            why = (
                "a required source appeared"
                if stale <= came
                else f"newly named in {ANN_EXTRA_SOURCES}"
            )
            return self._record_only(ref, obj, completed, why)
        if not plan.patch:
            return Decision.leave(SkipReason.UNCHANGED)
        instead = None
        if _asks_refresh(obj):
            instead = roll_instead(obj, plan, stale)
            if instead is None and not kind.refreshable:
                instead = RollInstead(
                    Fallback.KIND, f"configpin does not find the pods of a {ref.kind} to refresh"
                )
            if instead is None and not settings.rollout.refresh_pods:
                instead = RollInstead(
                    Fallback.DISABLED,
                    "pod refresh is turned off on this configpin (--refresh-pods=false)",
                )
            if instead is None:
                instead = refused
            if instead is None:
                ops = refreshed_ops(obj, dumps_mapping(plan.observed))
                return Decision(ops, intended=plan.observed, refresh=plan.observed)
        changes, waiting = self._admitted(entry, stale)
        if waiting is not None:
            return Decision([], SkipReason.WAITING, waiting=waiting)
        if plan.snapshots and not self.copies:
            log.error("%s: snapshot mode needs the snapshot writer; not rolled", ref)
            return Decision.leave(SkipReason.NO_SNAPSHOTS)
        if not self.is_leader():
            return Decision.leave(SkipReason.NOT_LEADER)
        ops = list(plan.patch)
        copies = tuple(plan.snapshots)
        if self.acts is not None and not touches_template(ref.kind, ops):
            ops += self.acts.restart_ops(ref, obj, kind, stale)  # (retried, held there)
        if not touches_template(ref.kind, ops):
            _warn(ref, plan.warnings)
            return Decision(ops, intended=plan.observed, instead=instead, copies=copies)
        now = self.wall()
        ops += rolled_at_ops(obj, format_time(now))
        # (imported at the first rollout: a replica that never rolls does not hold it)
        import jsonpatch  # noqa: PLC0415

        after = jsonpatch.apply_patch(copy.deepcopy(obj), ops)
        start = self._start(
            entry,
            kind,
            changes,
            plan.sources,
            read,
            inputs,
            now,
            before=template_sources(kind, obj) or entry.recorded,
            standing_now=standing(kind, obj),
            generation=generation_of(obj),
            rewrite=(obj, after),
            made={req.snapshot_name: req.source.name for req in plan.snapshots},
            previous=record,
        )
        if isinstance(start, Need):
            return start
        _warn(ref, plan.warnings)
        ops += record_ops(after, start.annotations)
        return Decision(
            ops, intended=plan.observed, instead=instead, rollout=start.rollout, copies=copies
        )

    def _admitted(
        self, entry: WorkloadEntry, stale: Collection[SourceId]
    ) -> tuple[tuple[Change, ...], Wait | None]:
        """The gate's answer for a stale workload: the changes a rollout of it now belongs to
        (those its last rollout carries on among them), or why it waits."""
        changes, waiting = self._admit(entry, stale)
        if waiting is not None:
            return changes, waiting
        return changes + carried_on(entry, stale, changes), None

    def _start(
        self,
        entry: WorkloadEntry,
        kind: WorkloadKind,
        changes: tuple[Change, ...],
        to: Mapping[str, str],
        read: Reads,
        inputs: Inputs,
        now: float,
        *,
        before: Mapping[str, str],
        standing_now: Standing,
        generation: int,
        rewrite: tuple[JSONObject, JSONObject] | None = None,
        made: Mapping[str, str] | None = None,
        previous: RolloutRecord | None = None,
    ) -> _Start | Need:
        """What a rollout configpin starts now to `to` writes beside its re-stamp, whether
        planned from the object (`rewrite`: the workload as read and as the re-stamp leaves
        it) or from the index alone: the one place both make its record and encode it. A
        `Need`: who made the content must be read first."""
        rolled = self._rolled(entry, changes, to, read.peek)
        by = inputs.editors_of(rolled) if self.follower is not None else ""
        if by is None:
            return Need(editors=rolled)
        annotations: dict[str, str | None] = {ANN_HELD: None}  # (it rolls: no longer held)
        if (starts := self._starts(entry, now)) is not None:
            annotations[ANN_ROLLOUT_STARTS] = starts
        if self.follower is None:
            return _Start(annotations, None)
        ref = entry.ref
        obj, after = rewrite if rewrite is not None else (None, None)
        rollout = started(
            kind,
            obj,
            after,
            to=to,
            before=before,
            changes=changes,
            now=now,
            healthy=standing_now is Standing.HEALTHY,
            made=made,
            previous=previous,
            by=by,
            empty=standing_now is Standing.EMPTY,
            generation=generation,
            wave=self.gate.place(ref, changes) if self.gate is not None else None,
        )
        annotations[ANN_ROLLOUT] = rollout.encode(
            self.hkey, identity(ref.kind, ref.namespace, ref.name)
        )
        return _Start(annotations, rollout)

    def _acted(
        self,
        ref: WorkloadRef,
        obj: JSONObject,
        entry: WorkloadEntry,
        kind: WorkloadKind,
        record: RolloutRecord | None,
    ) -> Decision | None:
        """A person's abort of the content it rolled (taken back, snapshot mode), or retry of
        content that failed here (a stale member of its change again): webhook.controller.acts."""
        assert self.acts is not None
        mode = effective_mode(obj, self.settings.admission.mode)[0]
        aborted = self.acts.abort(ref, obj, kind, record, mode)
        retried = self.acts.retry(ref, obj, entry) if aborted is None else None
        if aborted is None and retried is None:
            return None
        if not self.is_leader():
            return Decision.leave(SkipReason.NOT_LEADER)
        if aborted is not None:
            ops, ended = aborted
            done = ended.record
            intended = done.before if done.action is Action.UNDO else done.to
            progress = Progress(State.FAILED, done.signal)
            return Decision(ops, intended=intended, progress=progress, ended=ended)
        assert retried is not None
        ops, observed, who = retried
        return Decision(ops, intended=observed, note=f"retried by {who}: it rolls in its wave")

    def _verdict(
        self, ref: WorkloadRef, obj: JSONObject, entry: WorkloadEntry, record: RolloutRecord
    ) -> Decision:
        """A person took the template back off the content configpin was rolling to: that
        change failed here. Their template stays as they left it."""
        assert self.follower is not None
        if not self.is_leader():
            return Decision.leave(SkipReason.NOT_LEADER)
        ops, ended = self.follower.rolled_back(ref, obj, record)
        progress = Progress(State.FAILED, ended.record.signal)
        return Decision(ops, intended=entry.recorded, progress=progress, ended=ended)

    def _follow(
        self,
        ref: WorkloadRef,
        obj: JSONObject,
        kind: WorkloadKind,
        record: RolloutRecord,
        inputs: Inputs,
        *,
        amended: bool = False,
    ) -> Decision | Need:
        """The rollout configpin started goes on, completed, left or failed. `amended`: its
        record is not the one stored (`readmitted`): written while it goes on (`ended` None),
        as it ends otherwise."""
        assert self.follower is not None
        assessed = self.follower.progress(obj, kind, record, self.wall(), inputs.pods_of(obj))
        if assessed is None:
            return Need(pods=True)
        progress, poll = assessed
        if progress.state is State.ROLLING and not (amended and self.is_leader()):
            return Decision([], SkipReason.CURRENT, progress=progress, poll=poll)
        if not self.is_leader():
            return Decision.leave(SkipReason.NOT_LEADER)
        if progress.state is State.ROLLING:
            ops = record_ops(obj, {ANN_ROLLOUT: self.follower.record_text(obj, record)})
            log.info(
                "%s: its re-stamp was admitted with newer content than decided (%s): "
                "followed as configpin's rollout of it",
                ref,
                dumps_mapping(dict(record.to)),
            )
            return Decision(ops, SkipReason.CURRENT, record.to, progress=progress, poll=poll)
        if progress.state is State.COMPLETE:
            ops, ended = self.follower.complete(obj, record)
            return Decision(ops, intended=record.to, progress=progress, ended=ended)
        if progress.state is State.LEFT:
            ops, ended = self.follower.left(obj, record)
            return Decision(ops, intended=record.to, progress=progress, ended=ended)
        mode = effective_mode(obj, self.settings.admission.mode)[0]
        ops, ended = self.follower.failed(ref, obj, kind, record, mode, progress.signal)
        undone = ended.record.action is Action.UNDO
        intended = record.before if undone else record.to
        return Decision(ops, intended=intended, progress=progress, ended=ended)

    @staticmethod
    def _record_only(
        ref: WorkloadRef, obj: JSONObject, observed: dict[str, str], why: str
    ) -> Decision:
        """The record alone, on the workload's metadata: its template stays as it is."""
        ops = observed_ops(obj, dumps_mapping(observed)) if observed else []
        if not ops:
            return Decision.leave(SkipReason.UNCHANGED)
        log.info("%s: recorded %s without a rollout (%s)", ref, dumps_mapping(observed), why)
        return Decision(ops, intended=observed, note=why)

    def from_index(
        self, entry: WorkloadEntry, kind: WorkloadKind, *, held: Held, inputs: Inputs
    ) -> IndexRestamp | Need | None:
        """A plain re-stamp (checksum mode, on-change roll, its record on its template, every
        stale source a change of content) planned from the index entry alone; None when it
        needs the object read first (or waits: the read says so); a `Need`, as `decide`.
        (Checksum mode has nothing to undo: the record's starting point is the template's.)"""
        ref, rv = entry.ref, entry.restamp_rv
        if rv is None or not entry.stamped:
            return None
        read = Reads(held, inputs)
        stale = stale_sources(entry, read.peek, self.hkey)
        if not stale or any(str(sid) not in entry.recorded for sid in stale):
            return None  # (a source it never recorded: appeared, or newly named; decide)
        if stale <= left_to_reloader(entry.reloader, stale, read.peek, entry.recorded_for).keys():
            return None  # (left to Reloader: decide says so)
        changes, waiting = self._admitted(entry, stale)
        if waiting is not None or (self.acts is not None and self.acts.wants(entry)):
            return None  # (waits, or a person's retry: decide says what)
        restamp = restamp_from_consumption(
            ref.kind,
            [Consumption(c.source, c.keys, c.required, frozenset(), ()) for c in entry.consumes],
            hkey=self.hkey,
            lookup=read,
            namespace=ref.namespace,
            recorded=entry.recorded,
            resource_version=str(rv),
            rolled_at=format_time(now := self.wall()),
        )
        if (need := read.need()) is not None:
            return need
        if restamp is None or not self.is_leader():
            return None
        start = self._start(
            entry,
            kind,
            changes,
            restamp.observed,
            read,
            inputs,
            now,
            before=entry.recorded,
            standing_now=entry.standing,
            generation=entry.generation,
        )
        if isinstance(start, Need):
            return start
        _warn(ref, restamp.warnings)
        patch = restamp.merge_patch
        patch.setdefault("metadata", {}).setdefault("annotations", {}).update(start.annotations)
        rollout = start.rollout
        if rollout is None:
            return IndexRestamp(patch, restamp.observed)
        return IndexRestamp(patch, restamp.observed, rollout.by, rollout.state is State.LEFT)
