"""The sources webhook's decision (`/sources`): an UPDATE or DELETE of a ConfigMap or Secret
in a namespace configpin acts in, previewed, and its editor recorded (server/writes.py). Never
a refusal, never a change of its data, never an API call."""

from __future__ import annotations

from webhook.core.preview import source_write
from webhook.process.metrics import AdmissionResult
from webhook.server import large
from webhook.server.admission import Review, allowed
from webhook.server.context import Admission
from webhook.server.policy import Answer
from webhook.server.writes import SourcePreview, SourceWrites, source_kind_of


class SourceAdmission:
    def __init__(self, admission: Admission, preview: SourcePreview | None = None) -> None:
        """`preview`: the controller's view of the workloads (None: no controller here)."""
        self.admission = admission
        self.writes = SourceWrites(admission.hkey, preview)

    async def decide(self, review: Review, prepared: large.Prepared | None) -> Answer:
        """A review the intake took as a source write (server/intake.py); `prepared`: a
        large one's, the write worked out in the worker."""
        old = review.old
        assert old is not None  # (a large one's carries its name and namespace only)
        if not await self.admission.in_scope(review, old):
            return allowed(review), AdmissionResult.OUT_OF_SCOPE
        if prepared is not None:
            write = prepared.write
            assert write is not None
        else:
            kind = source_kind_of(review)
            assert kind is not None
            write = source_write(self.admission.hkey, kind, review.operation, old, review.obj)
        return self.writes.review(review, write)
