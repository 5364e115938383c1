"""configpin's webhooks, one handler at each path: dict in, dict out, nothing of HTTP (the
transport, server/app.py, is one for both).

- `/mutate`, the workloads webhook (chart entry `mutate.configpin.io`): a CREATE or UPDATE of
  a pod or a workload, planned (server/workloads.py).
- `/sources`, the sources webhook (chart entry `sources.configpin.io`): an UPDATE or DELETE of
  a ConfigMap or Secret, previewed and its editor recorded (server/sources.py).

What each acts on is decided by one intake (server/intake.py), in this process or in the
worker process for a large review. Anything else is allowed unchanged, and counted.

A chart older than the `/sources` path registers its sources entry at `/mutate`: `/mutate`
answers source writes too, as before, for one release (`LEGACY_SOURCES_AT_MUTATE`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Final

from webhook.core.model import SnapshotEnsurer
from webhook.core.shape import ShapeError, check_request
from webhook.inputs.sources import SourceReader
from webhook.kube.events import EventRecorder
from webhook.process.config import Settings
from webhook.process.metrics import AdmissionResult, Metrics
from webhook.server import large
from webhook.server.admission import AdmissionReviewOut, Review, allowed
from webhook.server.context import Admission, Scope
from webhook.server.events import AdmissionEvents
from webhook.server.intake import Intake, intake
from webhook.server.policy import Answer
from webhook.server.sources import SourceAdmission
from webhook.server.workloads import WorkloadAdmission
from webhook.server.writes import SourcePreview, SourceWrites

log = logging.getLogger(__name__)

WORKLOADS_PATH: Final = "/mutate"
SOURCES_PATH: Final = "/sources"
# Source writes answered at /mutate as well: what a chart from before /sources registers
# (its `sources.configpin.io` entry posts there). Kept for one release, then /mutate answers
# workload writes only.
LEGACY_SOURCES_AT_MUTATE: Final = True

Decide = Callable[[Review, "large.Prepared | None"], Awaitable[Answer]]


class Webhook:
    """One webhook at its path: the reviews it acts on, by what the intake takes them as, and
    who decides each; every answer timed and counted, an internal error answered by the
    policy for trouble."""

    def __init__(self, path: str, admission: Admission, deciders: Mapping[Intake, Decide]) -> None:
        self.path = path
        self.admission = admission
        self.deciders = dict(deciders)

    async def review(
        self, review: Review, *, prepared: large.Prepared | None = None
    ) -> AdmissionReviewOut:
        """Answer one review; `prepared`: a large one, from `Admission.prepare_large` (then
        `review` is its envelope, the objects being in the worker)."""
        admission = self.admission
        metrics = admission.metrics
        start = time.perf_counter()
        try:
            wrong = self._wrong_field(review, prepared)
            if wrong is not None:
                out, result = admission.trouble.invalid(review, wrong)
            else:
                decide = self.deciders.get(intake(review) if prepared is None else prepared.intake)
                if decide is None:
                    out, result = allowed(review), AdmissionResult.IGNORED
                else:
                    out, result = await decide(review, prepared)
        except Exception:
            log.exception("admission of %s %s failed", review.kind, review.uid)
            msg = "configpin failed internally; see its log"
            out, result = admission.trouble.answer(review, msg, refused_as=AdmissionResult.ERROR)
        admission.count(review, result)
        metrics.admission_seconds.observe(time.perf_counter() - start)
        if "warnings" in out["response"]:
            metrics.admission_warnings.inc(len(out["response"]["warnings"]))
        return out

    @staticmethod
    def _wrong_field(review: Review, prepared: large.Prepared | None) -> str | None:
        """A field of the wrong type among those the deciders read, checked first: they
        only ever see well-typed objects (a large review was checked in the worker)."""
        if prepared is not None:
            return prepared.message if prepared.outcome == "invalid" else None
        try:
            check_request(review.request)
        except ShapeError as e:
            return str(e)
        return None

    async def review_large(self, body: bytes) -> AdmissionReviewOut:
        """Answer a large review: parsed, checked and taken in by the worker process, one at
        a time whichever webhook it came to. Raises BadReview (answer 400)."""
        admission = self.admission
        async with admission.large_reviews:
            prepared = await admission.prepare_large(body)
            return await self.review(prepared.review(), prepared=prepared)


class Admitter:
    """The webhooks configpin serves, by path, over one `Admission` (what they share)."""

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
        workers, snapshots allowed); `scope`: where configpin acts (default: everywhere);
        `preview`: the controller's view of the workloads, for the sources webhook."""
        settings = settings or Settings()
        self.metrics = metrics
        self.admission = Admission(hkey=hkey, metrics=metrics, settings=settings, scope=scope)
        self.workload_writes = WorkloadAdmission(
            self.admission,
            sources=sources,
            settings=settings,
            snapshots=snapshots,
            events=AdmissionEvents(events) if events is not None else None,
        )
        self.source_writes = SourceAdmission(self.admission, preview)
        workloads: dict[Intake, Decide] = {Intake.WORKLOAD: self.workload_writes.decide}
        if LEGACY_SOURCES_AT_MUTATE:
            workloads[Intake.SOURCE] = self.source_writes.decide
        self.webhooks: Mapping[str, Webhook] = {
            WORKLOADS_PATH: Webhook(WORKLOADS_PATH, self.admission, workloads),
            SOURCES_PATH: Webhook(
                SOURCES_PATH, self.admission, {Intake.SOURCE: self.source_writes.decide}
            ),
        }
        # `/mutate`'s answer (and, until the legacy path goes, every review's)
        self.review = self.webhooks[WORKLOADS_PATH].review

    @property
    def writes(self) -> SourceWrites:
        return self.source_writes.writes

    def start_worker(self) -> None:
        """Start the worker process for large reviews now rather than at the first one."""
        self.admission.start_worker()

    def close(self) -> None:
        self.admission.close()
