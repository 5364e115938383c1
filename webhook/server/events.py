"""The Events the workloads webhook records, for people (`kubectl describe`, `kubectl events`):
what admission could not pin and why, and the copies it made. Queued without waiting; repeats
fold into one Event's series (webhook.kube.events)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final

from webhook.core.constants import MODE_SNAPSHOT
from webhook.core.model import JSONObject, Plan
from webhook.core.reasons import EventReason, SkipReason
from webhook.kube.events import EventRecorder, Regarding, copy_created_note
from webhook.kube.raw import path
from webhook.server.admission import Review

# group, version and resource of a review's `resource`, before they go into an API path
_API_NAME: Final = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


def regarding(review: Review) -> tuple[Regarding, str | None] | None:
    """What admission Events about the reviewed object point at, and, for a CREATE (no
    uid yet), the API path the recorder finds it at once it exists (None: unknown)."""
    obj = review.obj
    meta = (obj or {}).get("metadata") or {}
    if obj is None or not meta.get("name"):
        return None  # a name the API server has not generated yet cannot be pointed at
    # the object of a CREATE may not carry its namespace yet (1.20): the request's
    namespace = review.namespace or str(meta.get("namespace") or "")
    about = Regarding(
        str(obj.get("apiVersion") or ""),
        str(obj.get("kind") or ""),
        namespace,
        str(meta["name"]),
        str(meta.get("uid") or ""),
    )
    if about.uid or review.operation != "CREATE":
        return about, None
    resource = review.request.get("resource")
    if not isinstance(resource, dict):
        return about, None
    group, version, plural = (str(resource.get(k) or "") for k in ("group", "version", "resource"))
    if not all(_API_NAME.fullmatch(x) for x in (version, plural)) or (
        group and not _API_NAME.fullmatch(group)
    ):
        return about, None
    prefix = f"/apis/{group}/{version}" if group else f"/api/{version}"
    return about, path(plural, namespace, about.name, prefix=prefix)


class AdmissionEvents:
    def __init__(self, recorder: EventRecorder) -> None:
        self.recorder = recorder

    def planned(self, review: Review, plan: Plan) -> None:
        """What admission could not pin and why (or chose not to change)."""
        events = self.recorder
        owned = plan.skipped is SkipReason.OWNED
        about = regarding(review)
        if owned or about is None:
            # owned objects are the controller's to say (it sees them where the chart's
            # matchConditions keep them from the webhook)
            return
        regarded, creating = about
        if plan.problems:
            events.say(
                regarded, EventReason.SOURCE_MISSING, "; ".join(plan.problems), creating=creating
            )
        elif plan.skipped is SkipReason.TOO_MANY_SOURCES:
            events.say(
                regarded, EventReason.NOT_PINNED, "; ".join(plan.warnings), creating=creating
            )
        elif plan.skipped is SkipReason.MODE_OFF and review.operation == "CREATE":
            # (an owned workload is said by the controller, which sees it wherever the
            # chart's matchConditions keep it from the webhook)
            events.say(
                regarded,
                EventReason.OPTED_OUT,
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
            events.say(
                regarded,
                EventReason.ROLLBACK_KEPT,
                "the pod template points at older snapshot copies (a rollback): kept until "
                "a source changes again",
            )

    def copies_created(self, review: Review, created: Sequence[JSONObject]) -> None:
        """CopyCreated on the object whose admission made each copy (snapshot mode)."""
        if not created or review.dry_run:
            return
        about = regarding(review)
        if about is None:
            return
        regarded, creating = about
        for copy in created:
            self.recorder.say(
                regarded,
                EventReason.COPY_CREATED,
                copy_created_note(copy),
                related=copy,
                creating=creating,
            )
