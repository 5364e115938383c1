"""Admission of ConfigMap and Secret writes: a preview of what the change will do, said in
admission warnings (`kubectl apply/edit/patch`, `--dry-run=server` print them), and the signed
record of who made it (`configpin.io/changed-by`, on the source). configpin never changes a
source's data and never refuses a write.

Everything is decided from what the request carries (webhook.core.preview.SourceWrite, worked
out in the worker process for a large one) and what this replica already holds (the
controller's index, through `SourcePreview`): no API call on the write's path.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Protocol

from webhook.core import digest
from webhook.core.audit import APPROVED
from webhook.core.constants import (
    ANN_ACT,
    ANN_ACTED,
    ANN_APPROVE,
    ANN_APPROVED,
    ANN_CHANGED_BY,
    ANN_PLAN,
    APPROVE_NOW,
    PLAN_REQUEST,
)
from webhook.core.model import PatchOp, SourceId, SourceKind, SourceRecord, source_kind
from webhook.core.names import pointer
from webhook.core.preview import (
    ChangedBy,
    Row,
    SourceWrite,
    plan_text,
    requester,
    summary,
    wants_plan,
)
from webhook.core.verbs import Acted, Verb
from webhook.process.metrics import AdmissionResult
from webhook.server.admission import AdmissionReviewOut, Review, allowed, patched


class SourcePreview(Protocol):
    """The workloads a source's change reaches (webhook.controller.preview.Previewer)."""

    def rows(
        self,
        namespace: str,
        sid: SourceId,
        changed: frozenset[str],
        new: SourceRecord | None,
    ) -> list[Row] | None: ...


def _annotation_op(write: SourceWrite, key: str, value: str | None) -> list[PatchOp]:
    """The op that sets (None: removes, where the request has it) one annotation of the
    written object."""
    path = pointer(("metadata", "annotations", key))
    if value is None:
        has = {
            ANN_CHANGED_BY: write.sets,
            ANN_PLAN: write.plan,
            ANN_APPROVE: write.approve,
            ANN_ACT: write.act,
            ANN_ACTED: write.acted,
        }
        return [{"op": "remove", "path": path}] if has.get(key) is not None else []
    if not write.metadata:
        return [{"op": "add", "path": "/metadata", "value": {"annotations": {key: value}}}]
    if not write.annotations:
        return [{"op": "add", "path": "/metadata/annotations", "value": {key: value}}]
    return [{"op": "add", "path": path, "value": value}]


class SourceWrites:
    def __init__(
        self,
        hkey: bytes,
        preview: SourcePreview | None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`preview`: the controller's view of the workloads (None: no controller here, so
        nothing to preview; the record of who changed it is written all the same)."""
        self.hkey = hkey
        self.preview = preview
        self.clock = clock

    def review(
        self, review: Review, write: SourceWrite
    ) -> tuple[AdmissionReviewOut, AdmissionResult]:
        """The answer to an UPDATE or DELETE of a ConfigMap or Secret in a namespace
        configpin acts in, with the result label of `configpin_admissions_total`."""
        if write.excluded is not None or write.bad:
            return allowed(review), AdmissionResult.SKIPPED
        namespace = review.namespace
        sid = SourceId(write.kind, write.name)
        ops = [] if write.deleting else self._audit(review, write, namespace, sid)
        if write.approve is not None and not write.deleting:
            ops += self._approve(review, write, namespace, sid)
        if write.act is not None and not write.deleting:
            ops += self._act(review, write, namespace, sid)
        elif write.changed and write.acted not in (None, Verb.ABORT.value) and not write.deleting:
            # A verb is said of the content it was said to: a write that changes the content
            # takes it away, so that a pause of A holds neither B nor A stored again after B.
            # An abort stays: the content it rejects, stored again, is still rejected (the
            # record names its content, so it holds no other; it is not believed unsigned).
            ops += _annotation_op(write, ANN_ACTED, None)
        warnings: Sequence[str] = ()
        asked = wants_plan(write.plan) and review.dry_run
        if write.plan is not None and not asked and not write.deleting:
            ops += _annotation_op(write, ANN_PLAN, None)  # never stored
        if self.preview is not None and (write.changed or write.deleting or asked):
            rows = self.preview.rows(namespace, sid, write.changed, write.record)
            if asked and not write.deleting:
                text = plan_text(write.changed, rows) if rows is not None else "not-ready"
                ops += _annotation_op(write, ANN_PLAN, text)
            if rows is None:
                warnings = [
                    f"configpin: {write.kind.api_kind} {namespace}/{write.name}: no preview yet "
                    "(this replica is still reading the cluster's workloads)"
                ]
            else:
                warnings = summary(
                    write.kind, namespace, write.name, write.changed, rows, deleted=write.deleting
                )
        if ops:
            return patched(review, ops, warnings), AdmissionResult.PATCHED
        return allowed(review, warnings), AdmissionResult.UNCHANGED

    def _approve(
        self, review: Review, write: SourceWrite, namespace: str, sid: SourceId
    ) -> list[PatchOp]:
        """`configpin approve` asked (with the right to update the source): the signed record
        of who approved the content it holds now, in place of the request; asked with --now,
        a record that says so. An ordinary approval of content approved --now already keeps
        that record: it does not take the override back, nor the name of who overrode."""
        ops = _annotation_op(write, ANN_APPROVE, None)
        record = write.record
        if write.approve in (PLAN_REQUEST, APPROVE_NOW) and record is not None:
            content = digest.content_id(digest.source_digest(self.hkey, record))
            now = write.approve == APPROVE_NOW
            if not now and record.approved_now == content:
                return ops
            who = ChangedBy(requester(review.request), self.clock(), content, now=now)
            text = who.encode(self.hkey, namespace, sid, domain=APPROVED)
            ops += _annotation_op(write, ANN_APPROVED, text)
        return ops

    def _act(
        self, review: Review, write: SourceWrite, namespace: str, sid: SourceId
    ) -> list[PatchOp]:
        """`configpin pause`, `resume`, `abort` or `retry` asked (with the right to update the
        source): the signed record of who said it, when, and of which content, in place of the
        request (a value that is no verb is taken away and records nothing)."""
        ops = _annotation_op(write, ANN_ACT, None)
        record = write.record
        if write.act in tuple(Verb) and record is not None:
            content = digest.content_id(digest.source_digest(self.hkey, record))
            acted = Acted(Verb(write.act), requester(review.request), self.clock(), content)
            ops += _annotation_op(write, ANN_ACTED, acted.encode(self.hkey, namespace, sid))
        return ops

    def _audit(
        self, review: Review, write: SourceWrite, namespace: str, sid: SourceId
    ) -> list[PatchOp]:
        """The source's record of who changed its content: made anew when this write changes
        it, naming the keys it changed and carrying on, from the record of the content before
        it, who last changed each of the others; otherwise kept as it was (a record the
        client sets itself is not configpin's)."""
        if write.changed and write.record is not None:
            content = digest.content_id(digest.source_digest(self.hkey, write.record))
            user, now = requester(review.request), self.clock()
            before = None
            if write.prior is not None:
                before = ChangedBy.decode(self.hkey, namespace, sid, write.had, write.prior)
            if before is not None:
                who = before.after(user, now, content, write.changed)
            else:
                who = ChangedBy.first(user, now, content, write.changed)
            return _annotation_op(write, ANN_CHANGED_BY, who.encode(self.hkey, namespace, sid))
        if write.had == write.sets:
            return []
        return _annotation_op(write, ANN_CHANGED_BY, write.had)


def source_kind_of(review: Review) -> SourceKind | None:
    """The source kind a review is of (a core-group ConfigMap or Secret), else None."""
    kind = review.request.get("kind")
    if not isinstance(kind, dict) or kind.get("group", ""):
        return None
    return source_kind(review.kind)
