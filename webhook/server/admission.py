"""AdmissionReview wire format: parse a request, build every response through named constructors.

Each response echoes the request's `uid`, `apiVersion` and `kind`: the API server rejects a
response whose uid does not match, and answers `v1beta1` reviews in kind.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, NotRequired, TypedDict

import orjson
from pybase64 import b64encode

from webhook.core.model import JSONObject, PatchOp

API_VERSIONS: Final = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")
# What the API server keeps of a webhook's warnings: 256 characters each, 4 KiB in all (more
# are dropped). Sending more only costs both sides; the last one says how many were left out.
MAX_WARNING: Final = 256
MAX_WARNINGS_TOTAL: Final = 4096
_SUMMARY_ROOM: Final = 64


class Status(TypedDict, total=False):
    code: int
    message: str
    reason: str


class AdmissionResponse(TypedDict):
    uid: str
    allowed: bool
    patch: NotRequired[str]
    patchType: NotRequired[str]
    status: NotRequired[Status]
    warnings: NotRequired[list[str]]


class AdmissionReviewOut(TypedDict):
    apiVersion: str
    kind: str
    response: AdmissionResponse


class BadReview(ValueError):
    """The body is not an AdmissionReview we can answer: a transport fault, answered 400."""


class Review:
    """One AdmissionReview request, read-only (its fields are Final): a plain class, since a
    frozen dataclass's `__init__` costs a `__setattr__` per field on every admission. What
    admission reads of the request is taken out once, here (it is read several times per
    admission; `request` is never changed afterwards)."""

    __slots__ = ("api_version", "kind", "namespace", "obj", "old", "operation", "request", "uid")

    def __init__(self, *, api_version: str, uid: str, request: JSONObject) -> None:
        self.api_version: Final = api_version
        self.uid: Final = uid
        self.request: Final = request
        get = request.get
        self.operation: Final = str(get("operation", ""))
        self.namespace: Final = str(get("namespace") or "")
        o = get("object")
        self.obj: Final[JSONObject | None] = o if isinstance(o, dict) else None
        o = get("oldObject")
        self.old: Final[JSONObject | None] = o if isinstance(o, dict) else None
        k = get("kind")
        self.kind: Final = str(k.get("kind", "")) if isinstance(k, dict) else ""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Review) and (self.api_version, self.uid, self.request) == (
            other.api_version,
            other.uid,
            other.request,
        )

    __hash__ = None  # type: ignore[assignment]  # (a dict inside)

    def __repr__(self) -> str:
        return f"Review(api_version={self.api_version!r}, uid={self.uid!r}, request=...)"

    @property
    def dry_run(self) -> bool:
        return self.request.get("dryRun") is True


def parse_review(body: bytes) -> Review:
    if not body:
        raise BadReview("empty body: expected an AdmissionReview")
    try:
        doc: Any = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise BadReview(f"body is not valid JSON: {e}") from e
    if not isinstance(doc, dict) or doc.get("kind") != "AdmissionReview":
        raise BadReview("body is not an AdmissionReview")
    api_version = doc.get("apiVersion")
    if api_version not in API_VERSIONS:
        raise BadReview(f"unsupported AdmissionReview apiVersion {api_version!r}")
    request = doc.get("request")
    if not isinstance(request, dict):
        raise BadReview("AdmissionReview has no request")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise BadReview("AdmissionReview request has no uid")
    return Review(api_version=str(api_version), uid=uid, request=request)


def _review(review: Review, response: AdmissionResponse) -> AdmissionReviewOut:
    return {"apiVersion": review.api_version, "kind": "AdmissionReview", "response": response}


def _cut(warning: str) -> str:
    if len(warning) <= MAX_WARNING and warning.isascii():
        return warning
    raw = warning.encode()
    if len(raw) <= MAX_WARNING:
        return warning
    return raw[: MAX_WARNING - 3].decode(errors="ignore") + "..."


def capped_warnings(warnings: Sequence[str]) -> list[str]:
    """At most what the API server keeps: each cut to 256 bytes, 4 KiB in all, the rest
    counted in a last warning."""
    out: list[str] = []
    total = 0
    for i, warning in enumerate(warnings):
        text = _cut(warning)
        size = len(text.encode())
        room = MAX_WARNINGS_TOTAL - (0 if i == len(warnings) - 1 else _SUMMARY_ROOM)
        if total + size > room:
            out.append(f"... and {len(warnings) - i} more warnings, left out")
            break
        out.append(text)
        total += size
    return out


def _warnings(response: AdmissionResponse, warnings: Sequence[str]) -> AdmissionResponse:
    if warnings:
        response["warnings"] = capped_warnings(warnings)
    return response


def allowed(review: Review, warnings: Sequence[str] = ()) -> AdmissionReviewOut:
    return _review(review, _warnings({"uid": review.uid, "allowed": True}, warnings))


def patched(
    review: Review, patch: list[PatchOp], warnings: Sequence[str] = ()
) -> AdmissionReviewOut:
    if not patch:
        return allowed(review, warnings)
    response: AdmissionResponse = {
        "uid": review.uid,
        "allowed": True,
        "patchType": "JSONPatch",
        "patch": b64encode(orjson.dumps(patch)).decode(),
    }
    return _review(review, _warnings(response, warnings))


def denied(
    review: Review, message: str, code: int = 403, warnings: Sequence[str] = ()
) -> AdmissionReviewOut:
    response: AdmissionResponse = {
        "uid": review.uid,
        "allowed": False,
        "status": {
            "code": code,
            "message": message,
            "reason": "Forbidden" if code == 403 else "BadRequest",
        },
    }
    return _review(review, _warnings(response, warnings))


def errored(
    review: Review, message: str, code: int = 500, warnings: Sequence[str] = ()
) -> AdmissionReviewOut:
    """Refused because configpin could not decide (strict mode), not as a policy decision."""
    response: AdmissionResponse = {
        "uid": review.uid,
        "allowed": False,
        "status": {"code": code, "message": message, "reason": "InternalError"},
    }
    return _review(review, _warnings(response, warnings))
