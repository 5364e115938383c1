"""Change preview and audit: what configpin says about a write of a ConfigMap or Secret before
it is stored, and the signed record of who made it.

Pure: the objects of the request, the rows the controller's index gives (one per workload
that consumes the source) and the time given.

- `changed_keys`: the keys whose value a write changes (names only, never values).
- `excluded`: the writes configpin has nothing to say about (Helm release Secrets,
  service-account tokens, leader-election ConfigMaps, its own copies, ignored sources): the
  same rule as the chart's matchConditions, for API servers without them.
- `Row`, `summary`: what each consumer will do (roll, in which wave; refresh in place; nothing,
  as it consumes other keys; hold, its content rejected before; wait for an approval), said
  in a few lines within what kubectl shows well (about 120 characters each).
- `ChangedBy`: the user who changed a source's content, and when, on the source itself
  (`configpin.io/changed-by`), signed with the digest key over the source's namespace, kind,
  name and content: a record anyone else writes, or one left from other content, says
  nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final, NamedTuple

import orjson

from webhook.core.audit import ChangedBy
from webhook.core.constants import (
    ANN_ACT,
    ANN_ACTED,
    ANN_APPROVE,
    ANN_CHANGED_BY,
    ANN_IGNORE,
    ANN_PLAN,
    HELM_RELEASE_TYPE,
    LABEL_SNAPSHOT,
    PLAN_REQUEST,
    SERVICE_ACCOUNT_TOKEN_TYPE,
)
from webhook.core.digest import (
    BadSource,
    content_id,
    key_digests,
    record_from_object,
    source_digest,
)
from webhook.core.model import SourceId, SourceKind, SourceRecord

LEADER_ANNOTATION: Final = "control-plane.alpha.kubernetes.io/leader"
_KEYS_SHOWN: Final = 4  # key names in a line, then "+N"
_NAMES_SHOWN: Final = 3  # workload names in a line, then "+N"
# characters of a name or key shown (tenant-chosen text): a namespace (at most 63) whole, the
# rare longer object name or key cut (the API server allows 253), in plain ASCII
_NAME_MAX: Final = 63
_USER_MAX: Final = 256


def _annotations(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    meta = (obj or {}).get("metadata")
    value = meta.get("annotations") if isinstance(meta, dict) else None
    return value if isinstance(value, dict) else {}


def excluded(kind: SourceKind, obj: Mapping[str, Any]) -> str | None:
    """Why configpin says nothing about a write of this ConfigMap or Secret (None: it does)."""
    meta = obj.get("metadata")
    labels = meta.get("labels") if isinstance(meta, dict) else None
    if isinstance(labels, dict) and labels.get(LABEL_SNAPSHOT) == "true":
        return "a snapshot copy"
    annotations = _annotations(obj)
    if annotations.get(ANN_IGNORE) == "true":
        return f"{ANN_IGNORE}"
    if kind is SourceKind.SECRET and obj.get("type") in (
        HELM_RELEASE_TYPE,
        SERVICE_ACCOUNT_TOKEN_TYPE,
    ):
        return f"a Secret of type {obj.get('type')}"
    if kind is SourceKind.CONFIGMAP and LEADER_ANNOTATION in annotations:
        return "a leader-election ConfigMap"
    return None


def changed_keys(
    hkey: bytes, kind: SourceKind, old: Mapping[str, Any], new: Mapping[str, Any] | None
) -> frozenset[str]:
    """The keys a write adds, changes or removes (`new` None: a deletion, every key). Raises
    BadSource for content that cannot be decoded."""
    before = key_digests(hkey, kind, old)
    if new is None:
        return frozenset(before)
    after = key_digests(hkey, kind, new)
    return frozenset(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))


def shown(text: str) -> str:
    """A name or key as configpin shows it in a warning: printable, bounded."""
    clean = "".join(c if c.isprintable() else "?" for c in text)
    return clean if len(clean) <= _NAME_MAX else clean[: _NAME_MAX - 3] + "..."


def _listed(items: Sequence[str], most: int) -> str:
    out = ", ".join(shown(i) for i in items[:most])
    return out + (f", +{len(items) - most}" if len(items) > most else "")


# --- what each consumer will do -----------------------------------------------------------


class Effect(StrEnum):
    """What a change does to one workload that consumes the source."""

    ROLL = "roll"
    REFRESH = "refresh"  # its running pods are told to sync their volumes (on-change: refresh)
    NOTHING = "nothing"  # it consumes other keys
    HOLD = "hold"  # the content is rejected there (a rollout of it failed before)
    AWAIT = "await-approval"  # it rolls in a wave after `approve`
    WINDOW = "await-window"  # it rolls in its wave once its rollout windows open (the note: when)
    BREAKS = "breaks"  # (a deletion) its next pod start fails: it requires the source
    ABSENT = "absent"  # (a deletion) it reads the source as optional: it rolls, without it
    # Stakater Reloader's annotations ask Reloader to roll it for this source: configpin leaves
    # the restart to Reloader (webhook.core.reloader; the note names the annotation)
    RELOADER = "left-to-reloader"


class Row(NamedTuple):
    """One workload and what the change does to it (a tuple: a preview makes one per
    consumer, thousands for a source many workloads read)."""

    namespace: str
    kind: str
    name: str
    action: Effect
    keys: tuple[str, ...] = ()  # the keys of the change it consumes
    wave: int = 0  # (roll, await) its wave, from 1
    note: str = ""  # why, where there is more to say ("content rejected on ...")

    def as_dict(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "kind": self.kind,
            "name": self.name,
            "action": self.action.value,
            "keys": list(self.keys),
            "wave": self.wave or None,
            "note": self.note,
        }


_PLAN_ROWS: Final = 2000  # rows a plan answers with (an annotation is at most 256 KiB)


def plan_text(keys: Iterable[str], rows: Sequence[Row]) -> str:
    """The full plan, as `configpin plan` reads it from a dry run's result."""
    shown_rows = sorted(rows, key=lambda r: (r.wave or 1_000_000, r.kind, r.name))
    body = {
        "keys": sorted(keys),
        "rows": [r.as_dict() for r in shown_rows[:_PLAN_ROWS]],
        "more": max(0, len(rows) - _PLAN_ROWS),
    }
    return orjson.dumps(body).decode()


def wants_plan(text: str | None) -> bool:
    return text == PLAN_REQUEST


def summary(
    kind: SourceKind,
    namespace: str,
    name: str,
    keys: Iterable[str],
    rows: Sequence[Row],
    *,
    deleted: bool = False,
) -> list[str]:
    """The admission warnings of a write: one line with the counts, then at most two lines
    that name the first workloads that roll and those that break, then where the rest is."""
    what = f"{kind.api_kind} {shown(namespace)}/{shown(name)}"
    if deleted:
        return _deletion(what, rows)
    changed = sorted(keys)
    if not changed:
        return []
    head = f"configpin: {what} keys [{_listed(changed, _KEYS_SHOWN)}]"
    if not rows:
        return [f"{head}: no workload consumes it"]
    counts: dict[Effect, list[Row]] = {}
    for row in rows:
        counts.setdefault(row.action, []).append(row)
    parts = []
    rolling = [*counts.get(Effect.ROLL, ()), *counts.get(Effect.AWAIT, ())]
    rolling += counts.get(Effect.WINDOW, ())
    if rolling:
        waves = sorted({r.wave for r in rolling})
        sizes = [sum(1 for r in rolling if r.wave == w) for w in waves]
        if len(waves) > 1:
            parts.append(
                f"{len(rolling)} roll in {len(waves)} waves ({', '.join(map(str, sizes))})"
            )
        else:
            parts.append(f"{len(rolling)} roll")
    for action, said in (
        (Effect.AWAIT, "wait for an approval"),
        (Effect.REFRESH, "refresh in place"),
        (Effect.RELOADER, "are left to Reloader (its annotations)"),
        (Effect.HOLD, "hold (content rejected before)"),
        (Effect.NOTHING, "consume other keys"),
    ):
        if counts.get(action):
            parts.append(f"{len(counts[action])} {said}")
        if action is Effect.AWAIT and counts.get(Effect.WINDOW):
            parts.append(_windows(counts[Effect.WINDOW]))
    lines = [f"{head} -> {len(rows)} workloads: {', '.join(parts)}"]
    lowest = min((r.wave for r in rolling), default=0)
    first = sorted(r for r in rolling if r.wave == lowest)
    if first and len(rolling) > 1:
        # (a shared source's members elsewhere are named with their namespace)
        names = [f"{r.kind} {_where(r, namespace)}{r.name}" for r in first]
        lines.append(f"configpin: wave {lowest}: {_listed(names, _NAMES_SHOWN)}")
    if len(counts) > 1 or Effect.NOTHING not in counts:  # (all others: nothing to list)
        lines.append(f"configpin: the list: kubectl configpin plan -n {shown(namespace)} -f FILE")
    return lines


def _windows(rows: Sequence[Row]) -> str:
    """`4 wait for their window, opens Mon 2026-11-30 09:00 Europe/Berlin` (the first to
    open, where they open at different times)."""
    prefix = "they open "

    def at(row: Row) -> str:  # ("they open Mon 2026-11-30 09:00 ZONE": by the date on)
        return row.note[len(prefix) + 4 :] if row.note.startswith(prefix) else "~"

    first = min(rows, key=at).note
    when = "opens " + first[len(prefix) :] if first.startswith(prefix) else first
    more = "the first " if any(r.note != first for r in rows) else ""
    return f"{len(rows)} wait for their window, {more}{when}"


def _where(row: Row, namespace: str) -> str:
    return "" if row.namespace == namespace else f"{row.namespace}/"


def _deletion(what: str, rows: Sequence[Row]) -> list[str]:
    if not rows:
        return []
    breaks = sorted(r for r in rows if r.action is Effect.BREAKS)
    optional = [r for r in rows if r.action is Effect.ABSENT]
    lines = [f"configpin: deleting {what}: {len(rows)} workloads consume it"]
    if breaks:
        names = [f"{r.kind} {r.name}" for r in breaks]
        lines.append(
            f"configpin: {len(breaks)} require it, their next pod start fails: "
            f"{_listed(names, _NAMES_SHOWN)}"
        )
    if optional:
        lines.append(f"configpin: {len(optional)} read it as optional and roll without it")
    return lines


# --- who changed it -----------------------------------------------------------------------


def requester(request: Mapping[str, Any]) -> str:
    """The user an admission request comes from (its `userInfo.username`), bounded."""
    info = request.get("userInfo")
    name = info.get("username") if isinstance(info, dict) else None
    if not isinstance(name, str) or not name:
        return "unknown"
    return name[:_USER_MAX]


def changed_by_text(obj: Mapping[str, Any] | None) -> Any:
    return _annotations(obj).get(ANN_CHANGED_BY)


def changed_by_of(
    hkey: bytes, namespace: str, sid: SourceId, obj: Mapping[str, Any], content: str
) -> ChangedBy | None:
    """Who changed `obj` (a source as read) to the content it holds (`content`: its digest
    under the digest key itself, or its `content_id`), when configpin recorded it."""
    return ChangedBy.decode(hkey, namespace, sid, changed_by_text(obj), content_id(content))


# --- a write, as admission needs it -------------------------------------------------------


@dataclass(frozen=True)
class SourceWrite:
    """What admission needs of an UPDATE or DELETE of a ConfigMap or Secret: worked out from
    the request's objects, in the serving process or, for a large one, in the worker (then
    only this crosses back)."""

    kind: SourceKind
    name: str
    deleting: bool
    excluded: str | None  # why configpin says nothing about it (None: it does)
    changed: frozenset[str] = frozenset()  # the keys the write changes
    record: SourceRecord | None = None  # the source as written (None: deleted, or excluded)
    had: str | None = None  # its changed-by record before ...
    sets: str | None = None  # ... and as the request writes it
    annotations: bool = False  # the request's object has an annotations map
    metadata: bool = False  # ... a metadata map
    bad: bool = False  # content that cannot be decoded (the API server refuses it itself)
    plan: str | None = None  # the request's configpin.io/plan ("request": `configpin plan`)
    approve: str | None = None  # ... its configpin.io/approve ("request": `configpin approve`)
    prior: str | None = None  # (a change of content) what it held before, as a Change names it
    act: str | None = None  # its configpin.io/act ("pause", "resume": a person's verb)
    # the verb its configpin.io/acted record names, as written ("": none readable; None: it
    # carries no record); what admission keeps of it on a change of content, never believed
    acted: str | None = None

    def __reduce__(self) -> tuple[type[SourceWrite], tuple[Any, ...]]:
        # Pickled (back from the large-review worker) by its fields, never by setting them one
        # by one on a frozen instance, which a compiled class refuses.
        return SourceWrite, (
            self.kind,
            self.name,
            self.deleting,
            self.excluded,
            self.changed,
            self.record,
            self.had,
            self.sets,
            self.annotations,
            self.metadata,
            self.bad,
            self.plan,
            self.approve,
            self.prior,
            self.act,
            self.acted,
        )


def source_write(
    hkey: bytes,
    kind: SourceKind,
    operation: str,
    old: Mapping[str, Any],
    new: Mapping[str, Any] | None,
) -> SourceWrite:
    """The facts of a write of a source (`new` None: a deletion)."""
    name = str((old.get("metadata") or {}).get("name") or "")
    deleting = operation == "DELETE"
    reason = excluded(kind, old) or (excluded(kind, new) if new is not None else None)
    if reason is not None:
        return SourceWrite(kind, name, deleting, reason)
    try:
        before = key_digests(hkey, kind, old)
        record = None if new is None or deleting else record_from_object(hkey, kind, new)
    except BadSource:
        return SourceWrite(kind, name, deleting, None, bad=True)
    if record is None:
        changed = frozenset(before)
    else:
        after = record.key_digests
        changed = frozenset(
            k for k in before.keys() | after.keys() if before.get(k) != after.get(k)
        )
    had, sets = changed_by_text(old), changed_by_text(new)
    prior = None
    if changed and record is not None and isinstance(had, str):
        # (the content its record of who made it must be for, to be carried on)
        held = SourceRecord(kind, name, before, record.secret_type)
        prior = content_id(source_digest(hkey, held))
    asked = _annotations(new).get(ANN_PLAN)
    approve = _annotations(new).get(ANN_APPROVE)
    act = _annotations(new).get(ANN_ACT)
    acted = _annotations(new).get(ANN_ACTED)
    meta = (new or {}).get("metadata")
    return SourceWrite(
        kind,
        name,
        deleting,
        None,
        changed,
        record,
        had if isinstance(had, str) else None,
        sets if isinstance(sets, str) else None,
        isinstance(meta, dict) and isinstance(meta.get("annotations"), dict),
        isinstance(meta, dict),
        plan=asked if isinstance(asked, str) else None,
        approve=approve if isinstance(approve, str) else None,
        prior=prior,
        act=act if isinstance(act, str) else None,
        acted=None if acted is None else _verb_named(acted),
    )


def _verb_named(text: Any) -> str:
    """The verb a configpin.io/acted record names, unverified ("" when it names none)."""
    if not isinstance(text, str) or len(text) > 2048:
        return ""
    try:
        body = orjson.loads(text)
    except orjson.JSONDecodeError:
        return ""
    verb = body.get("verb") if isinstance(body, dict) else None
    return verb if isinstance(verb, str) else ""


__all__ = [
    "BadSource",
    "ChangedBy",
    "Effect",
    "Row",
    "changed_keys",
    "excluded",
    "requester",
    "source_write",
    "summary",
]
