"""The workloads webhook's decision (`/mutate`): a CREATE or UPDATE of a pod or a workload,
planned from this replica's cache (or reads past it, within a deadline), with the snapshot
copies its plan needs made first, and Events for what could not be pinned.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

from webhook.core.digest import BadSource, record_from_object
from webhook.core.kept import changes_only_the_record
from webhook.core.model import (
    JSONObject,
    Plan,
    SnapshotEnsurer,
    SourceId,
    SourceRecord,
    SourceUnavailable,
)
from webhook.core.modes import unreadable_rollout_limits
from webhook.core.plan import plan_object
from webhook.inputs.sources import Miss, SourceReader
from webhook.process.config import Settings
from webhook.process.metrics import AdmissionResult
from webhook.server import large
from webhook.server.admission import Review, allowed, denied, patched
from webhook.server.context import Admission, Busy
from webhook.server.events import AdmissionEvents
from webhook.server.policy import Answer

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Unread:
    """No plan: the sources could not be read in time (why, for the warning)."""

    why: str


class _NeedsRead(Exception):
    pass


class WorkloadAdmission:
    def __init__(
        self,
        admission: Admission,
        *,
        sources: SourceReader,
        settings: Settings,
        snapshots: SnapshotEnsurer | None = None,
        events: AdmissionEvents | None = None,
    ) -> None:
        """`settings`: `configpin serve`'s (mode, max-sources, snapshots allowed)."""
        self.admission = admission
        self.hkey = admission.hkey
        self.sources = sources
        self.snapshots = snapshots
        self.events = events
        self.max_sources = settings.admission.max_sources
        self.allow_snapshots = settings.snapshots.enabled
        self.default_mode = settings.admission.mode
        self.strict = settings.admission.strict
        metrics = admission.metrics
        # (counted on the event loop: a tally; the others are counted on reader threads)
        self._read_from_cache = metrics.loop_counts.tally(metrics.source_reads.labels("cache"))
        self._read_through = metrics.source_reads.labels("read_through")
        self._read_fresh = metrics.source_reads.labels("fresh")

    async def decide(self, review: Review, prepared: large.Prepared | None) -> Answer:
        """A review the intake took as a workload write (server/intake.py); `prepared`: a
        large one's, its object being in the worker."""
        obj = review.obj
        assert obj is not None
        trouble = self.admission.trouble
        if not await self.admission.in_scope(review, obj):
            return allowed(review), AdmissionResult.OUT_OF_SCOPE
        unreadable = unreadable_rollout_limits(obj, review.old)
        if unreadable is not None:
            # (whatever the mode: a list configpin cannot read must never roll anything by
            # accident, nor hold it by surprise)
            return denied(review, unreadable, code=400), AdmissionResult.DENIED
        namespace = review.namespace
        if prepared is not None:
            # Its object is in the worker: planned there from this replica's cache (a large
            # template change is not re-read fresh; the controller's stored-record check and
            # resync settle a lagging cache for it).
            plan = await self._plan_large(prepared, namespace)
        else:
            try:
                plan = self._plan(review, namespace, read_through=False)
            except _NeedsRead:
                read = await self._plan_reading(review, namespace)
                if isinstance(read, Unread):
                    return trouble.answer(review, read.why, refused_as=AdmissionResult.DENIED)
                plan = read
            if (
                review.operation == "UPDATE"
                and plan.skipped is None
                and not plan.kept
                and plan.sources
                and not self._agrees(review, plan)
            ):
                # The request changes the pod template (a deploy, or the controller
                # re-stamping): what it records now is settled by the API server, not by this
                # replica's cache, which may lag a source change by a moment (the ConfigMap of
                # the same `kubectl apply`, a change another replica's controller is rolling).
                # A few GETs, on a request that starts a rollout anyway, within the read
                # deadline; never a recorded digest replaced by the older content a lagging
                # watch still holds.
                read = await self._plan_reading(review, namespace, fresh=True)
                if isinstance(read, Unread):
                    return trouble.answer(review, read.why, refused_as=AdmissionResult.DENIED)
                plan = read
        if self.events is not None and not review.dry_run:
            self.events.planned(review, plan)
        if plan.skipped is not None:
            return allowed(review, plan.warnings), AdmissionResult.SKIPPED
        if plan.problems and self.strict:
            return denied(
                review, "; ".join(plan.problems), warnings=plan.warnings
            ), AdmissionResult.DENIED
        warnings = list(plan.warnings)
        writer = self.snapshots
        created: list[JSONObject] = []
        if (
            plan.snapshots
            and writer is not None
            and not writer.settled(namespace, plan.snapshots)  # the common case: no thread hop
        ):
            try:
                warnings += await self._ensure_copies(writer, review, namespace, plan, created)
            except Exception as first:
                # Most often the cache had not yet seen a source change, so the planned copy
                # names content the source no longer has. Decide once more from fresh reads
                # (a large review is answered as failed instead).
                log.info(
                    "snapshots for %s: %s; planning again from fresh reads",
                    kind_name(review),
                    first,
                )
                try:
                    if prepared is not None:  # its object is in the worker: not retried
                        raise first
                    plan = await asyncio.to_thread(
                        self._plan, review, namespace, read_through=True, fresh=True
                    )
                    warnings = list(plan.warnings)
                    warnings += await self._ensure_copies(writer, review, namespace, plan, created)
                except Exception as e:
                    log.warning(
                        "snapshots for %s in %s failed: %s", kind_name(review), namespace, e
                    )
                    self._copies_created(review, created)
                    msg = f"snapshot copies could not be created ({e})"
                    return trouble.answer(
                        review, msg, refused_as=AdmissionResult.DENIED, warnings=warnings
                    )
        self._copies_created(review, created)
        if not plan.patch:
            return allowed(review, warnings), AdmissionResult.UNCHANGED
        return patched(review, plan.patch, warnings), AdmissionResult.PATCHED

    def _copies_created(self, review: Review, created: Sequence[JSONObject]) -> None:
        if self.events is not None:
            self.events.copies_created(review, created)

    # -- planning

    def _plan(
        self,
        review: Review,
        namespace: str,
        *,
        read_through: bool,
        fresh: bool = False,
        deadline: float | None = None,
    ) -> Plan:
        sources = self.sources
        hkey = self.hkey
        peek = sources.peek

        def from_memory(sid: SourceId) -> SourceRecord | None:
            # (every admission but the few that read: once per source, kept lean)
            found = peek(namespace, sid)
            if isinstance(found, Miss):
                raise _NeedsRead
            return found

        def reading(sid: SourceId) -> SourceRecord | None:
            if fresh:  # past the cache: it may not have seen a change made a moment ago
                if deadline is not None and deadline <= time.monotonic():
                    raise SourceUnavailable("not read in time")
                obj = sources.get_object(namespace, sid)
                try:
                    return None if obj is None else record_from_object(hkey, sid.kind, obj)
                except BadSource as e:
                    raise SourceUnavailable(str(e)) from e
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise SourceUnavailable("not read in time")
            return sources.get(namespace, sid, timeout=left)

        obj = review.obj
        assert obj is not None
        plan = plan_object(
            obj,
            hkey=self.hkey,
            lookup=reading if fresh or read_through else from_memory,
            default_mode=self.default_mode,
            operation=review.operation,
            old=review.old,
            namespace=namespace,
            max_sources=self.max_sources,
            allow_snapshots=self.allow_snapshots,
            now=time.time(),
        )
        if fresh:
            self._read_fresh.inc()
        else:
            (self._read_through if read_through else self._read_from_cache).inc()
        return plan

    async def _plan_reading(
        self, review: Review, namespace: str, *, fresh: bool = False
    ) -> Plan | Unread:
        """Plan with reads past the cache (`fresh`: every source read from the API server),
        on the reader threads, within the deadline."""
        admission = self.admission
        deadline = time.monotonic() + admission.read_deadline
        try:
            return await admission.read(
                self._plan, review, namespace, read_through=True, fresh=fresh, deadline=deadline
            )
        except Busy:
            return Unread("configpin is busy reading sources")
        except TimeoutError:
            return Unread(f"sources not read within {admission.read_deadline:g}s")

    def _resolve(
        self,
        namespace: str,
        wanted: Sequence[SourceId],
        records: dict[SourceId, SourceRecord | str | None],
        deadline: float,
    ) -> None:
        """Look up what a large review refers to (a thread: reads may go to the API)."""
        for sid in wanted:
            left = deadline - time.monotonic()
            try:
                if left <= 0:
                    raise SourceUnavailable("not read in time")
                found = self.sources.get(namespace, sid, timeout=left)
            except SourceUnavailable as e:
                records[sid] = str(e)
                continue
            records[sid] = found
            if found is not None and found.snapshot_of is not None:
                source = SourceId(found.kind, found.snapshot_of)
                if source not in records:
                    self._resolve(namespace, [source], records, deadline)
        self._read_through.inc()

    async def _plan_large(self, prepared: large.Prepared, namespace: str) -> Plan:
        records: dict[SourceId, SourceRecord | str | None] = {}
        wanted: Sequence[SourceId] = prepared.sources
        deadline = time.monotonic() + self.admission.read_deadline
        options = (self.hkey, self.default_mode, namespace, self.max_sources, self.allow_snapshots)
        for _ in range(3):
            await asyncio.to_thread(self._resolve, namespace, wanted, records, deadline)
            result = await self.admission.in_worker(large.plan, records, *options)
            if isinstance(result, Plan):
                return result
            wanted = result
        raise RuntimeError(f"a large review still wants sources {list(wanted)}")

    @staticmethod
    async def _ensure_copies(
        writer: SnapshotEnsurer,
        review: Review,
        namespace: str,
        plan: Plan,
        created: list[JSONObject],
    ) -> list[str]:
        """The plan's copies made to exist, off the event loop (it may write)."""
        return await asyncio.to_thread(
            functools.partial(
                writer.ensure,
                namespace,
                plan.snapshots,
                dry_run=review.dry_run,
                on_created=created.append,
            )
        )

    @staticmethod
    def _agrees(review: Review, plan: Plan) -> bool:
        """A re-stamp (the template unchanged but for configpin's record, which the request
        sets) that this replica, from its cache, would leave exactly as it is: its writer (the
        controller, on whichever replica leads) and this replica's watch have seen the same
        content, and the record it carries is kept. Nothing is replaced, so nothing older can
        replace anything newer: no fresh reads. Any disagreement (a watch that lags on
        either side, a record written by hand) and any deploy are settled by fresh reads."""
        return (
            not plan.patch
            and not plan.problems
            and review.obj is not None
            and changes_only_the_record(review.obj, review.old)
        )


def kind_name(review: Review) -> str:
    name = ((review.obj or {}).get("metadata") or {}).get("name") or "(generated name)"
    return f"{review.kind}/{name}"
