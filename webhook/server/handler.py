"""The admission decision around the core: dict in, dict out, nothing of HTTP.

Policy for trouble: a source that cannot be read, or an internal error, admits the object
unchanged with a warning that says so, unless the operator chose strict mode (then denied).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Protocol

from prometheus_client import Counter

from webhook.core.digest import BadSource, record_from_object
from webhook.core.model import Plan, SnapshotRequest, SourceId, SourceRecord, SourceUnavailable
from webhook.core.plan import plan_object
from webhook.metrics import Metrics
from webhook.server.admission import AdmissionReviewOut, Review, allowed, denied, patched
from webhook.sources import Miss, SourceReader

log = logging.getLogger(__name__)


class SnapshotWriter(Protocol):
    def ensure(
        self, namespace: str, requests: Sequence[SnapshotRequest], *, dry_run: bool
    ) -> list[str]:
        """Make every requested snapshot exist with its content; return warnings. Blocks.

        Raises on failure: the object must then not point at a copy that does not exist."""
        ...

    def settled(self, namespace: str, requests: Sequence[SnapshotRequest]) -> bool:
        """True when, from memory alone, every copy already exists as requested: `ensure`
        would do nothing. Never blocks."""
        ...


class _NeedsRead(Exception):
    pass


class Admitter:
    def __init__(
        self,
        *,
        hkey: bytes,
        sources: SourceReader,
        metrics: Metrics,
        default_mode: str = "checksum",
        strict: bool = False,
        snapshots: SnapshotWriter | None = None,
    ) -> None:
        self.hkey = hkey
        self.sources = sources
        self.metrics = metrics
        self.default_mode = default_mode
        self.strict = strict
        self.snapshots = snapshots
        # Labelled metric children, looked up once: `labels()` costs more than the count.
        self._read_from_cache = metrics.source_reads.labels("cache")
        self._read_through = metrics.source_reads.labels("read_through")
        self._counts: dict[tuple[str, str, str], Counter] = {}

    def _plan(
        self, review: Review, namespace: str, *, read_through: bool, fresh: bool = False
    ) -> Plan:
        sources = self.sources
        hkey = self.hkey

        def lookup(sid: SourceId) -> SourceRecord | None:
            if fresh:  # past the cache: it may not have seen a change made a moment ago
                obj = sources.get_object(namespace, sid)
                try:
                    return None if obj is None else record_from_object(hkey, sid.kind, obj)
                except BadSource as e:
                    raise SourceUnavailable(str(e)) from e
            if read_through:
                return sources.get(namespace, sid)
            found = sources.peek(namespace, sid)
            if isinstance(found, Miss):
                raise _NeedsRead
            return found

        assert review.obj is not None
        plan = plan_object(
            review.obj,
            hkey=self.hkey,
            lookup=lookup,
            default_mode=self.default_mode,
            operation=review.operation,
            old=review.old,
        )
        (self._read_through if read_through else self._read_from_cache).inc()
        return plan

    async def review(self, review: Review) -> AdmissionReviewOut:
        start = time.perf_counter()
        kind = review.kind
        try:
            out, result = await self._review(review)
        except Exception:
            log.exception("admission of %s %s failed", kind, review.uid)
            msg = "configpin failed internally; see its log"
            if self.strict:
                out, result = denied(review, msg, code=500), "error"
            else:
                out, result = allowed(review, [f"{msg}: admitted unchanged"]), "error"
        key = (kind, review.operation, result)
        counter = self._counts.get(key)
        if counter is None:
            counter = self._counts[key] = self.metrics.admissions.labels(*key)
        counter.inc()
        self.metrics.admission_seconds.observe(time.perf_counter() - start)
        if "warnings" in out["response"]:
            self.metrics.admission_warnings.inc(len(out["response"]["warnings"]))
        return out

    async def _review(self, review: Review) -> tuple[AdmissionReviewOut, str]:
        obj = review.obj
        if (
            review.operation not in ("CREATE", "UPDATE")
            or obj is None
            or review.request.get("subResource")
        ):
            return allowed(review), "ignored"
        namespace = review.namespace or str((obj.get("metadata") or {}).get("namespace") or "")
        try:
            plan = self._plan(review, namespace, read_through=False)
        except _NeedsRead:
            plan = await asyncio.to_thread(self._plan, review, namespace, read_through=True)
        if plan.skipped is not None:
            return allowed(review, plan.warnings), "skipped"
        if plan.problems and self.strict:
            return denied(review, "; ".join(plan.problems), warnings=plan.warnings), "denied"
        warnings = list(plan.warnings)
        writer = self.snapshots
        if (
            plan.snapshots
            and writer is not None
            and not writer.settled(namespace, plan.snapshots)  # the common case: no thread hop
        ):
            try:
                warnings += await asyncio.to_thread(
                    writer.ensure, namespace, plan.snapshots, dry_run=review.dry_run
                )
            except Exception as first:
                # Most often the cache had not yet seen a source change, so the planned copy
                # names content the source no longer has. Decide once more from fresh reads.
                log.info(
                    "snapshots for %s: %s; planning again from fresh reads",
                    kind_name(review),
                    first,
                )
                try:
                    plan = await asyncio.to_thread(
                        self._plan, review, namespace, read_through=True, fresh=True
                    )
                    warnings = list(plan.warnings)
                    warnings += await asyncio.to_thread(
                        writer.ensure, namespace, plan.snapshots, dry_run=review.dry_run
                    )
                except Exception as e:
                    log.warning(
                        "snapshots for %s in %s failed: %s", kind_name(review), namespace, e
                    )
                    msg = f"snapshot copies could not be created ({e})"
                    if self.strict:
                        return denied(review, msg, code=500, warnings=warnings), "denied"
                    return allowed(review, [*warnings, f"{msg}: admitted unchanged"]), "error"
        if not plan.patch:
            return allowed(review, warnings), "unchanged"
        return patched(review, plan.patch, warnings), "patched"


def kind_name(review: Review) -> str:
    name = ((review.obj or {}).get("metadata") or {}).get("name") or "(generated name)"
    return f"{review.kind}/{name}"
