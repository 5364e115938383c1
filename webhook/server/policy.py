"""What configpin answers when it cannot decide: the one place it is decided, for both webhooks.

A source that cannot be read, copies that cannot be made, a malformed request or an internal
error admit the object unchanged with a warning that says so, unless the operator chose
strict mode (then refused: 500, or 400 for a malformed request).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from webhook.process.metrics import AdmissionResult
from webhook.server.admission import AdmissionReviewOut, Review, allowed, denied, errored

# An answer, and the result label it is counted under (configpin_admissions_total).
Answer = tuple[AdmissionReviewOut, AdmissionResult]


@dataclass(frozen=True, slots=True)
class Trouble:
    """The policy for trouble: `strict` refuses what it cannot decide."""

    strict: bool = False

    def answer(
        self,
        review: Review,
        message: str,
        *,
        refused_as: AdmissionResult,
        admitted_as: AdmissionResult = AdmissionResult.ERROR,
        warnings: Sequence[str] = (),
        malformed: bool = False,
    ) -> Answer:
        """configpin could not decide: admitted unchanged with a warning that says why, or in
        strict mode refused (400 for a malformed request, else 500), with the result label
        of each."""
        if self.strict:
            if malformed:
                return denied(review, message, code=400, warnings=warnings), refused_as
            return errored(review, message, warnings=warnings), refused_as
        note = f"{message}; admitted unchanged" if malformed else f"{message}: admitted unchanged"
        return allowed(review, [*warnings, note]), admitted_as

    def invalid(self, review: Review, message: str) -> Answer:
        """A field of the wrong type in the request (webhook.core.shape names it)."""
        return self.answer(
            review,
            f"malformed request: {message}",
            refused_as=AdmissionResult.INVALID,
            admitted_as=AdmissionResult.INVALID,
            malformed=True,
        )
