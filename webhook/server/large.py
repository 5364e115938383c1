"""Large reviews, parsed, checked and planned in a worker process of their own.

A review of a few MiB (tens of thousands of references, an UPDATE carrying its old object as
well) takes a few hundred milliseconds of pure Python and C parsing. In a thread of the
serving process it would still hold the GIL that the event loop needs, and every other
admission, `/healthz` and `/readyz` would wait for it. In a process of its own it costs the
event loop only the reading of the body.

The worker never reads a source: `prepare` parses and checks the review and names the
sources the object refers to; the serving process looks them up (cache or read-through) and
hands the records to `plan`, which plans from them. The worker holds the one review in
progress between the two calls; the caller runs one review at a time through it.

Only the decision core is imported here, so a spawned worker starts small.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from webhook.core.constants import ANN_ROLLOUT_BUDGET, ANN_ROLLOUT_WINDOWS
from webhook.core.extra import extra_sources, with_extra
from webhook.core.kinds import WorkloadKind, template_paths, use_custom_kinds
from webhook.core.model import JSONObject, Plan, SourceId, SourceRecord, SourceUnavailable
from webhook.core.owners import use_owner_kinds
from webhook.core.plan import plan_object
from webhook.core.preview import SourceWrite, source_write
from webhook.core.record import annotations_of
from webhook.core.refs import consumption, find_sites, get_path
from webhook.core.shape import ShapeError, check_request
from webhook.process import allocator
from webhook.server.admission import BadReview, Review, parse_review
from webhook.server.intake import Intake, intake
from webhook.server.writes import source_kind_of

# What the serving process keeps of the request (the objects stay in the worker).
_LIGHT_FIELDS: Final = (
    "uid",
    "kind",
    "operation",
    "namespace",
    "dryRun",
    "subResource",
    "userInfo",  # (who writes a source: its audit record)
)
# ... and of the objects' annotations: those it checks before planning
_CHECKED: Final = (ANN_ROLLOUT_WINDOWS, ANN_ROLLOUT_BUDGET)


@dataclass(frozen=True)
class Prepared:
    """The outcome of `prepare`: `bad` (answer 400), `invalid` (a field of the wrong type), or
    `taken`: what the intake took it as (`intake`), with, for a workload write, the `sources`
    to look up before calling `plan`, or, for a source write, the `write`."""

    outcome: Literal["bad", "invalid", "taken"]
    message: str = ""
    intake: Intake = Intake.NOTHING
    api_version: str = ""
    request: JSONObject = field(default_factory=dict)
    namespace: str = ""
    sources: tuple[SourceId, ...] = ()
    write: SourceWrite | None = None  # (a source write) what admission needs of it

    def review(self) -> Review:
        """The review as the serving process answers it: its envelope, no objects."""
        return Review(
            api_version=self.api_version, uid=str(self.request["uid"]), request=self.request
        )


_current: Review | None = None


def _stub(obj: JSONObject) -> JSONObject:
    # What the serving process checks the scope with, the name and claimed namespace, and
    # the annotations it checks before planning (webhook.core.modes.unreadable_rollout_limits).
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    claimed = meta.get("namespace") if isinstance(meta, dict) else None
    stub: JSONObject = {"name": name, "namespace": claimed}
    annotations = annotations_of(obj)
    checked = {k: annotations[k] for k in _CHECKED if k in annotations}
    if checked:
        stub["annotations"] = checked
    return {"kind": obj.get("kind"), "metadata": stub}


def _light(review: Review) -> JSONObject:
    light: JSONObject = {k: review.request[k] for k in _LIGHT_FIELDS if k in review.request}
    if review.obj is not None:
        light["object"] = _stub(review.obj)
    if review.old is not None:
        light["oldObject"] = _stub(review.old)
    return light


def prepare(body: bytes, hkey: bytes) -> Prepared:
    """In the worker: parse and check the review and take it in (server/intake.py, as the
    serving process does a small one); name the sources a workload's object refers to (or,
    for a ConfigMap or Secret written, work out what admission needs of the write)."""
    global _current  # noqa: PLW0603 (the worker's one review in progress)
    _current = None
    try:
        review = parse_review(body)
    except BadReview as e:
        return Prepared("bad", str(e))
    del body
    base: dict[str, Any] = {"api_version": review.api_version, "request": _light(review)}
    try:
        check_request(review.request)
    except ShapeError as e:
        return Prepared("invalid", str(e), **base)
    what = intake(review)
    if what is Intake.SOURCE:
        kind = source_kind_of(review)
        assert kind is not None and review.old is not None
        write = source_write(hkey, kind, review.operation, review.old, review.obj)
        return Prepared("taken", intake=what, write=write, **base)
    if what is not Intake.WORKLOAD:
        return Prepared("taken", intake=what, **base)
    obj = review.obj
    assert obj is not None
    namespace = review.namespace
    paths = template_paths(str(obj.get("kind", "")))
    spec = get_path(obj, paths[1]) if paths is not None else None
    sources = (
        tuple(with_extra(consumption(find_sites(spec)), extra_sources(obj)[0]))
        if isinstance(spec, dict)
        else ()
    )
    _current = review
    return Prepared("taken", intake=what, namespace=namespace, sources=sources, **base)


class _Missing(Exception):
    pass


def plan(
    records: Mapping[SourceId, SourceRecord | str | None],
    hkey: bytes,
    default_mode: str,
    namespace: str,
    max_sources: int,
    allow_snapshots: bool,
) -> Plan | tuple[SourceId, ...]:
    """In the worker: plan the prepared review from `records` (None: the source does not
    exist; a string: it could not be read, and why). Returns the plan, or the sources it
    still needs (a snapshot's source) when `records` lacks them."""
    global _current  # noqa: PLW0603
    review = _current
    if review is None or review.obj is None:
        raise RuntimeError("no review prepared")
    wanted: list[SourceId] = []

    def lookup(sid: SourceId) -> SourceRecord | None:
        if sid not in records:
            wanted.append(sid)
            raise _Missing
        found = records[sid]
        if isinstance(found, str):
            raise SourceUnavailable(found)
        return found

    try:
        result = plan_object(
            review.obj,
            hkey=hkey,
            lookup=lookup,
            default_mode=default_mode,
            operation=review.operation,
            old=review.old,
            namespace=namespace,
            max_sources=max_sources,
            allow_snapshots=allow_snapshots,
            now=time.time(),
        )
    except _Missing:
        return tuple(wanted)
    _current = None
    del review
    allocator.release()  # the parsed review was most of this process's memory
    return result


def configure(kinds: tuple[WorkloadKind, ...], owners: frozenset[tuple[str, str]]) -> None:
    """The worker's initializer: the custom kinds and opted-in owners of its parent."""
    use_custom_kinds(kinds)
    use_owner_kinds(owners)


def warm() -> None:
    """Nothing: submitted once at start, so that the first large review finds the worker up."""
