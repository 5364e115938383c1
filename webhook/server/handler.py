"""The admission decision around the core: dict in, dict out, nothing of HTTP.

Policy for trouble (`Admitter._trouble`, the one place it is decided): a source that cannot
be read, copies that cannot be made, or an internal error admit the object unchanged with a
warning that says so, unless the operator chose strict mode (then refused: 500, or 400 for a
malformed request).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import multiprocessing
import re
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any, Final, Protocol, TypeVar

from webhook.config import Settings
from webhook.core.constants import MODE_SNAPSHOT
from webhook.core.digest import BadSource, record_from_object
from webhook.core.kinds import admitted_kinds, custom_kinds
from webhook.core.model import (
    JSONObject,
    Plan,
    SnapshotEnsurer,
    SourceId,
    SourceKind,
    SourceRecord,
    SourceUnavailable,
)
from webhook.core.owners import pinned_owners
from webhook.core.plan import changes_only_the_record, plan_object
from webhook.core.preview import source_write
from webhook.core.reasons import SkipReason
from webhook.core.shape import ShapeError, check_request
from webhook.kube.events import EventRecorder, Regarding, copy_created_note
from webhook.kube.raw import path
from webhook.metrics import Metrics, Tally
from webhook.server import large
from webhook.server.admission import (
    AdmissionReviewOut,
    BadReview,
    Review,
    allowed,
    denied,
    errored,
    patched,
)
from webhook.server.writes import SOURCE_KINDS, SourcePreview, SourceWrites, source_kind_of
from webhook.sources import Miss, SourceReader

log = logging.getLogger(__name__)


class Scope(Protocol):
    """The namespaces configpin acts in (webhook.kube.namespaces.NamespaceSet): the selection
    the webhook configuration makes, enforced here whatever a request claims."""

    def __contains__(self, namespace: object) -> bool:
        """From memory."""
        ...

    def confirm(self, namespace: str, timeout: float) -> bool:
        """Asked (blocking, on the reader threads) when memory says no, for a namespace
        selected a moment ago."""
        ...


class Excluding:
    """Every namespace but these (no cluster: nothing to select by)."""

    def __init__(self, excluded: frozenset[str] = frozenset()) -> None:
        self.excluded = excluded

    def __contains__(self, namespace: object) -> bool:
        return namespace not in self.excluded

    def confirm(self, namespace: str, timeout: float) -> bool:
        return False


@dataclass(frozen=True, slots=True)
class Unread:
    """No plan: the sources could not be read in time (why, for the warning)."""

    why: str


class _NeedsRead(Exception):
    pass


# Metric label values come from these sets only: a request's fields are whatever its sender
# wrote, and every distinct label value is a time series kept for the life of the process.
_OPERATIONS: Final = frozenset({"CREATE", "UPDATE", "DELETE", "CONNECT"})
# group, version and resource of a review's `resource`, before they go into an API path
_API_NAME: Final = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


def _label(value: str, allowed: frozenset[str]) -> str:
    return value if value in allowed else "other"


_T = TypeVar("_T")


class Admitter:
    def __init__(
        self,
        *,
        hkey: bytes,
        sources: SourceReader,
        metrics: Metrics,
        settings: Settings | None = None,
        snapshots: SnapshotEnsurer | None = None,
        scope: Scope | None = None,
        events: EventRecorder | None = None,
        preview: SourcePreview | None = None,
    ) -> None:
        """`settings`: `configpin serve`'s (mode, strict, max-sources, read deadline and
        workers, snapshots allowed); `scope`: where configpin acts (default: everywhere)."""
        settings = settings or Settings()
        self.hkey = hkey
        self.writes = SourceWrites(hkey, preview)
        self.events = events
        self.scope: Scope = scope if scope is not None else Excluding()
        self.max_sources = settings.max_sources
        self.allow_snapshots = settings.snapshots
        read_workers = settings.read_workers
        # Reads past the cache run on their own few threads, never the loop's default
        # executor, and within a deadline below the webhook's timeout: the answer (unchanged,
        # with a warning) reaches the API server while it still waits for one, and a slow API
        # server or a review naming many missing sources holds at most these threads, each
        # of which gives up at the deadline. Beyond a short queue, a review is answered at
        # once instead of waiting for a thread.
        self.read_deadline = settings.read_deadline
        self._reader = ThreadPoolExecutor(max_workers=read_workers, thread_name_prefix="read")
        self._read_slots = read_workers * 4
        self._reads_pending = 0
        self._out_of_scope = metrics.out_of_scope
        self.sources = sources
        self.metrics = metrics
        self.default_mode = settings.mode
        self.strict = settings.strict
        self.snapshots = snapshots
        # Labelled metric children, looked up once: `labels()` costs more than the count.
        # (counted on the event loop: a tally; the others are counted on reader threads)
        self._read_from_cache = metrics.loop_counts.tally(metrics.source_reads.labels("cache"))
        self._read_through = metrics.source_reads.labels("read_through")
        self._read_fresh = metrics.source_reads.labels("fresh")
        self._counts: dict[tuple[str, str, str], Tally] = {}
        # metric labels: the workload kinds, and the sources whose writes it previews
        self._kinds = frozenset(k.kind for k in admitted_kinds()) | frozenset(SOURCE_KINDS)
        # Large reviews are decided in a worker process (large.py), one at a time.
        self._worker: ProcessPoolExecutor | None = None
        self.large_reviews = asyncio.Lock()

    def close(self) -> None:
        self._reader.shutdown(wait=False, cancel_futures=True)
        if self._worker is not None:
            self._worker.shutdown(wait=False, cancel_futures=True)
            self._worker = None

    def start_worker(self) -> None:
        """Start the worker process for large reviews now rather than at the first one."""
        if self._worker is None:
            self._worker = ProcessPoolExecutor(
                max_workers=1,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=large.configure,
                initargs=(custom_kinds(), pinned_owners()),
            )
            self._worker.submit(large.warm)

    async def _in_worker(self, fn: Callable[..., _T], *args: Any) -> _T:
        self.start_worker()
        assert self._worker is not None
        try:
            return await asyncio.get_running_loop().run_in_executor(self._worker, fn, *args)
        except BrokenProcessPool:
            self._worker = None  # killed (out of memory?): the next large review starts another
            raise

    async def prepare_large(self, body: bytes) -> large.Prepared:
        """Parse and check a large review in the worker. Raises BadReview (answer 400).
        Hold `large_reviews` from here until its answer."""
        prepared = await self._in_worker(large.prepare, body, self.hkey)
        if prepared.outcome == "bad":
            raise BadReview(prepared.message)
        return prepared

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
        deadline = time.monotonic() + self.read_deadline
        options = (self.hkey, self.default_mode, namespace, self.max_sources, self.allow_snapshots)
        for _ in range(3):
            await asyncio.to_thread(self._resolve, namespace, wanted, records, deadline)
            result = await self._in_worker(large.plan, records, *options)
            if isinstance(result, Plan):
                return result
            wanted = result
        raise RuntimeError(f"a large review still wants sources {list(wanted)}")

    def _trouble(
        self,
        review: Review,
        message: str,
        *,
        refused_as: str,
        admitted_as: str = "error",
        warnings: Sequence[str] = (),
        malformed: bool = False,
    ) -> tuple[AdmissionReviewOut, str]:
        """configpin could not decide: admitted unchanged with a warning that says why, or in
        strict mode refused (400 for a malformed request, else 500). With the result label
        of each (`configpin_admissions_total`)."""
        if self.strict:
            if malformed:
                return denied(review, message, code=400, warnings=warnings), refused_as
            return errored(review, message, warnings=warnings), refused_as
        note = f"{message}; admitted unchanged" if malformed else f"{message}: admitted unchanged"
        return allowed(review, [*warnings, note]), admitted_as

    def _invalid(self, review: Review, message: str) -> tuple[AdmissionReviewOut, str]:
        return self._trouble(
            review,
            f"malformed request: {message}",
            refused_as="invalid",
            admitted_as="invalid",
            malformed=True,
        )

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

    async def review(
        self, review: Review, *, prepared: large.Prepared | None = None
    ) -> AdmissionReviewOut:
        """Answer one review; `prepared`: a large one, from `prepare_large` (then `review`
        is its envelope, the objects being in the worker)."""
        start = time.perf_counter()
        kind = review.kind
        try:
            out, result = await self._review(review, prepared)
        except Exception:
            log.exception("admission of %s %s failed", kind, review.uid)
            msg = "configpin failed internally; see its log"
            out, result = self._trouble(review, msg, refused_as="error")
        key = (_label(kind, self._kinds), _label(review.operation, _OPERATIONS), result)
        counter = self._counts.get(key)
        if counter is None:
            counter = self._counts[key] = self.metrics.loop_counts.tally(
                self.metrics.admissions.labels(*key)
            )
        counter.inc()
        self.metrics.admission_seconds.observe(time.perf_counter() - start)
        if "warnings" in out["response"]:
            self.metrics.admission_warnings.inc(len(out["response"]["warnings"]))
        return out

    async def _review(
        self, review: Review, prepared: large.Prepared | None
    ) -> tuple[AdmissionReviewOut, str]:
        # The types of every field the planner reads, checked first: it only ever sees
        # well-typed objects (a large review was checked in the worker).
        if prepared is None:
            try:
                check_request(review.request)
            except ShapeError as e:
                return self._invalid(review, str(e))
        elif prepared.outcome == "invalid":
            return self._invalid(review, prepared.message)
        obj = review.obj
        operation = review.operation
        source_kind = source_kind_of(review)
        if source_kind is not None:
            return await self._source_write(review, source_kind, prepared)
        if (
            operation not in ("CREATE", "UPDATE")
            or obj is None
            or review.request.get("subResource")
        ):
            return allowed(review), "ignored"
        namespace = review.namespace
        if not await self._in_scope(review, obj):
            return allowed(review), "out-of-scope"
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
                    return self._trouble(review, read.why, refused_as="denied")
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
                    return self._trouble(review, read.why, refused_as="denied")
                plan = read
        if self.events is not None and not review.dry_run and obj is not None:
            self._record_events(review, obj, plan)
        if plan.skipped is not None:
            return allowed(review, plan.warnings), "skipped"
        if plan.problems and self.strict:
            return denied(review, "; ".join(plan.problems), warnings=plan.warnings), "denied"
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
                    return self._trouble(review, msg, refused_as="denied", warnings=warnings)
        self._copies_created(review, created)
        if not plan.patch:
            return allowed(review, warnings), "unchanged"
        return patched(review, plan.patch, warnings), "patched"

    async def _in_scope(self, review: Review, obj: JSONObject) -> bool:
        namespace = review.namespace
        claimed = (obj.get("metadata") or {}).get("namespace")
        if (
            not namespace
            or (claimed and claimed != namespace)
            or not (namespace in self.scope or await self._confirmed_in_scope(namespace))
        ):
            # Not a namespace configpin acts in (or a request that contradicts itself, which
            # the API server never sends): nothing is looked up, written or said.
            self._out_of_scope.inc()
            return False
        return True

    async def _source_write(
        self, review: Review, kind: SourceKind, prepared: large.Prepared | None
    ) -> tuple[AdmissionReviewOut, str]:
        """An UPDATE or DELETE of a ConfigMap or Secret (server/writes.py)."""
        old = review.old
        if (
            review.operation not in ("UPDATE", "DELETE")
            or review.request.get("subResource")
            or (old is None and prepared is None)
        ):
            return allowed(review), "ignored"
        if not await self._in_scope(review, old if old is not None else {}):
            return allowed(review), "out-of-scope"
        if prepared is not None:
            write = prepared.write
            if write is None:
                return allowed(review), "ignored"
        else:
            assert old is not None
            write = source_write(self.hkey, kind, review.operation, old, review.obj)
        return self.writes.review(review, write)

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

    def _regarding(self, review: Review) -> tuple[Regarding, str | None] | None:
        """What admission Events about the reviewed object point at, and, for a CREATE (no
        uid yet), the API path the recorder finds it at once it exists (None: unknown)."""
        obj = review.obj
        meta = (obj or {}).get("metadata") or {}
        if obj is None or not meta.get("name"):
            return None  # a name the API server has not generated yet cannot be pointed at
        # the object of a CREATE may not carry its namespace yet (1.20): the request's
        namespace = review.namespace or str(meta.get("namespace") or "")
        regarding = Regarding(
            str(obj.get("apiVersion") or ""),
            str(obj.get("kind") or ""),
            namespace,
            str(meta["name"]),
            str(meta.get("uid") or ""),
        )
        if regarding.uid or review.operation != "CREATE":
            return regarding, None
        resource = review.request.get("resource")
        if not isinstance(resource, dict):
            return regarding, None
        group, version, plural = (
            str(resource.get(k) or "") for k in ("group", "version", "resource")
        )
        if not all(_API_NAME.fullmatch(x) for x in (version, plural)) or (
            group and not _API_NAME.fullmatch(group)
        ):
            return regarding, None
        prefix = f"/apis/{group}/{version}" if group else f"/api/{version}"
        return regarding, path(plural, namespace, regarding.name, prefix=prefix)

    def _record_events(self, review: Review, obj: JSONObject, plan: Plan) -> None:
        """Events for people (`kubectl describe`, `kubectl events`): what admission could not
        pin and why. Queued without waiting; repeats fold into one Event's series."""
        events = self.events
        assert events is not None
        owned = plan.skipped is SkipReason.OWNED
        about = self._regarding(review)
        if owned or about is None:
            # owned objects are the controller's to say (it sees them where the chart's
            # matchConditions keep them from the webhook)
            return
        regarding, creating = about
        if plan.problems:
            events.warning(
                regarding, "SourceMissing", "Admit", "; ".join(plan.problems), creating=creating
            )
        elif plan.skipped is SkipReason.TOO_MANY_SOURCES:
            events.warning(
                regarding, "NotPinned", "Admit", "; ".join(plan.warnings), creating=creating
            )
        elif plan.skipped is SkipReason.MODE_OFF and review.operation == "CREATE":
            # (an owned workload is said by the controller, which sees it wherever the
            # chart's matchConditions keep it from the webhook)
            events.normal(
                regarding,
                "OptedOut",
                "Admit",
                "not pinned: configpin.io/mode is off",
                creating=creating,
            )
        elif (
            plan.mode == MODE_SNAPSHOT
            and plan.observed
            and plan.observed != plan.sources
            and review.operation == "UPDATE"
        ):
            # (checksum mode records past the template too, never a rollback: a baseline, a
            # required source that appeared, a refresh)
            events.normal(
                regarding,
                "RollbackKept",
                "Admit",
                "the pod template points at older snapshot copies (a rollback): kept until "
                "a source changes again",
            )

    def _copies_created(self, review: Review, created: Sequence[JSONObject]) -> None:
        """CopyCreated on the object whose admission made each copy (snapshot mode)."""
        if self.events is None or not created or review.dry_run:
            return
        about = self._regarding(review)
        if about is None:
            return
        regarding, creating = about
        for copy in created:
            self.events.normal(
                regarding,
                "CopyCreated",
                "Snapshot",
                copy_created_note(copy),
                related=copy,
                creating=creating,
            )

    async def _confirmed_in_scope(self, namespace: str) -> bool:
        if self._reads_pending >= self._read_slots:
            return False
        self._reads_pending += 1
        try:
            future = self._reader.submit(self.scope.confirm, namespace, self.read_deadline)
            try:
                return await asyncio.wait_for(asyncio.wrap_future(future), self.read_deadline)
            except TimeoutError:
                future.cancel()
                return False
        finally:
            self._reads_pending -= 1

    async def _plan_reading(
        self, review: Review, namespace: str, *, fresh: bool = False
    ) -> Plan | Unread:
        """Plan with reads past the cache (`fresh`: every source read from the API server),
        on the reader threads, within the deadline."""
        if self._reads_pending >= self._read_slots:
            return Unread("configpin is busy reading sources")
        self._reads_pending += 1
        try:
            deadline = time.monotonic() + self.read_deadline
            future = self._reader.submit(
                self._plan, review, namespace, read_through=True, fresh=fresh, deadline=deadline
            )
            try:
                return await asyncio.wait_for(asyncio.wrap_future(future), self.read_deadline)
            except TimeoutError:
                future.cancel()  # still queued: never runs; running: gives up at the deadline
                return Unread(f"sources not read within {self.read_deadline:g}s")
        finally:
            self._reads_pending -= 1


def kind_name(review: Review) -> str:
    name = ((review.obj or {}).get("metadata") or {}).get("name") or "(generated name)"
    return f"{review.kind}/{name}"
