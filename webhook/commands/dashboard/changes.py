"""The changes pages as data: `changes`, each recent change of a consumed source (from who
changed it, on the source; the rollout records that name it, on the workloads; the
controller's Events that say a workload waits for it), and `change`, one change's members in
wave order, each with its rollout as a bar (from its re-stamp to complete, failed, left, or
waiting) and what it waits for.

Pure: no cluster call and no clock (the snapshot says when it was taken); a workload's status
(`configpin status`'s dry run) is handed in by `status_of`. What configpin wrote is read as it
stands: this process holds no digest key, so a record's signature is not checked (as
`configpin status` does not). The pages say so."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from webhook.commands.dashboard.feeds import Note, Snapshot, Source, epoch
from webhook.commands.dashboard.workload import (
    UNSIGNED,
    StatusOf,
    Use,
    WorkloadRef,
    healthy,
    mode_of,
    on_change,
    pinned,
    record_of,
    ref_of,
    since_of,
    uses,
)
from webhook.core.constants import (
    ANN_APPROVED,
    ANN_CHANGED_BY,
    ANN_ROLLOUT_WAVES,
    ANN_SHARED,
    APPROVE_STEP,
    MODE_OFF,
)
from webhook.core.model import JSONObject, SourceId, SourceKind
from webhook.core.reasons import EventReason, Status
from webhook.core.record import ACTION_WORDS, Action, Change, annotations_of, digest_mapping_any
from webhook.core.waves import Member, WaveStep, approval_from, cut_waves, wave_of, wave_order

TIMELINE_PAGE: Final = 100  # rows of a change's timeline page
RECENT: Final = 100  # changes listed at most
_CHANGE_IN_NOTE: Final = re.compile(r"((?:[a-z0-9.-]+/)?(?:configmap|secret)/[^\s@/]+@[0-9a-f]+)")
_WAVE_IN_NOTE: Final = re.compile(r"wave (\d+) of (\d+)")
R = EventReason
_WAITING: Final = (
    R.CONFIG_ROLLOUT_WAITING,
    R.CONFIG_ROLLOUT_AWAITING_APPROVAL,
    R.CONFIG_ROLLOUT_AWAITING_WINDOW,
    R.CONFIG_ROLLOUT_FLAPPING,
)
# what a stale workload's status says it waits for (the others are not pending)
_PENDING: Final = {
    Status.STALE: "configpin",
    Status.WAITING: "configpin",
    Status.AWAITING_APPROVAL: "approval",
    Status.AWAITING_WINDOW: "window",
    Status.FLAPPING: "budget",
}
_ENDS: Final = {
    R.CONFIG_ROLLOUT_COMPLETE: "complete",
    R.CONFIG_ROLLOUT_LEFT: "left",
    R.CONFIG_ROLLOUT_FAILED: "failed",
    R.CONFIG_ROLLED_BACK: "failed",
    R.CONFIG_ROLLED_BACK_BY_PERSON: "failed",
}


# --- changes -----------------------------------------------------------------------------------


@dataclass
class Row:
    """One workload in a change's timeline."""

    ref: WorkloadRef
    wave_annotation: int
    vouches: bool
    state: str  # rolling, complete, failed, left, waiting, pending, checking
    detail: str = ""
    waits_for: str = ""  # wave, cap, approval, stopped, window, budget, configpin
    note: str = ""
    start: float | None = None
    end: float | None = None
    wave: int = 0  # from 1
    said_wave: tuple[int, int] | None = None  # "wave N of M", as an Event said

    def as_dict(self) -> dict[str, Any]:
        kind, namespace, name = self.ref
        return {
            "namespace": namespace,
            "kind": kind,
            "name": name,
            "wave": self.wave,
            "state": self.state,
            "detail": self.detail,
            "waits_for": self.waits_for,
            "note": self.note,
            "start": self.start,
            "end": self.end,
        }


@dataclass
class Facts:
    """What is known of one change."""

    change: Change
    by: str = ""
    at: float = 0.0
    keys: tuple[str, ...] | None = None
    more: int = 0
    current: bool = False  # its source holds this content now (as its record of who says)
    namespaces: set[str] = field(default_factory=set)
    rows: dict[WorkloadRef, Row] = field(default_factory=dict)

    @property
    def ident(self) -> str:
        return str(self.change)


def _json(text: Any) -> dict[str, Any]:
    return digest_mapping_any(text)


def _sid(kind: str, name: str) -> SourceId:
    return SourceId(SourceKind(kind), name)


def _by_text(text: str) -> str:
    """A rollout record's `by` ("alice at 2026-...Z"): the user."""
    user, _, _ = text.rpartition(" at ")
    return user or text


def _changed_by(source: Source) -> tuple[Change, dict[str, Any]] | None:
    record = _json(source.annotations.get(ANN_CHANGED_BY))
    content = record.get("content")
    if not isinstance(content, str) or not content:
        return None
    shared = source.annotations.get(ANN_SHARED) == "true"
    change = Change.of(source.namespace, _sid(source.kind, source.name), content, shared=shared)
    return change, record


def _wait_kind(note: Note) -> str:
    if note.reason == R.CONFIG_ROLLOUT_AWAITING_APPROVAL:
        return "approval"
    if note.reason == R.CONFIG_ROLLOUT_AWAITING_WINDOW:
        return "window"
    if note.reason == R.CONFIG_ROLLOUT_FLAPPING:
        return "budget"
    text = note.note
    if "--max-rolling" in text:
        return "cap"
    if "failed (wave" in text or "are not rolled" in text:
        return "stopped"
    if "rolls in waves" in text:
        return "wave"
    return "configpin"


_WAITS: Final = {
    "approval": "an approval",
    "cap": "a place (--max-rolling: too many rollouts in flight in its namespace)",
    "stopped": "nothing: an earlier wave failed, this one will not roll",
    "wave": "an earlier wave to complete",
    "configpin": "configpin",
    "window": "a rollout window",
    "budget": "its rollout budget (flapping: a source keeps changing)",
}


_AFTER_WAVE: Final = re.compile(r"when wave (\d+) is complete \((\d+) of (\d+)")
_IN_FLIGHT: Final = re.compile(r"(\d+) config rollouts are in flight")


def _wait_detail(waits: str, note: str) -> str:
    """What the controller's note adds to what the workload waits for, in a few words."""
    if waits == "wave" and (m := _AFTER_WAVE.search(note)):
        return f"wave {m.group(1)}: {m.group(2)} of {m.group(3)} complete"
    if waits == "cap" and (m := _IN_FLIGHT.search(note)):
        return f"{m.group(1)} rollouts in flight in its namespace"
    if waits == "approval" and "rollout-waves" in note and "comes after approve" not in note:
        return "its own configpin.io/rollout-waves asks for one"
    return ""


def _waiting_notes(notes: Iterable[Note]) -> dict[WorkloadRef, Note]:
    """The latest waiting Event of each workload."""
    latest: dict[WorkloadRef, Note] = {}
    for note in notes:
        if note.reason not in _WAITING:
            continue
        ref = (note.kind, note.namespace, note.name)
        if ref not in latest or note.at >= latest[ref].at:
            latest[ref] = note
    return latest


def _end_notes(notes: Iterable[Note]) -> dict[WorkloadRef, list[Note]]:
    out: dict[WorkloadRef, list[Note]] = {}
    for note in notes:
        if note.reason in _ENDS:
            out.setdefault((note.kind, note.namespace, note.name), []).append(note)
    return out


def _rolled_row(
    obj: Mapping[str, Any],
    record: Mapping[str, Any],
    ends: Sequence[Note],
    seen_ends: Mapping[tuple[str, str, str, float], float],
) -> Row:
    ref = ref_of(obj)
    state = str(record.get("state") or "rolling")
    since = since_of(record)
    healthy = record.get("healthy", True) is not False and state != "left"
    row = Row(ref, wave_of(obj), healthy, state, start=since)
    if state == "failed":
        action = _action_words(record.get("action"))
        row.detail = f"{record.get('signal') or 'failed'} ({action})"
    elif state == "left":
        row.detail = "scaled to zero while rolling: it proves nothing and left the waves"
    elif state == "rolling":
        row.detail = "re-stamped: updated pods not all Ready yet"
    elif state == "complete":
        row.detail = "every updated pod Ready"
    if state != "rolling" and since is not None:
        wanted = _ENDS_WANTED.get(state, ())
        found = [n.at for n in ends if n.reason in wanted and n.at >= since - 1]
        if found:
            row.end = min(found)
        else:
            row.end = seen_ends.get((*ref, since))
        if state == "complete" and row.end is not None:
            row.detail += f" after {max(0, round(row.end - since))} s"
    return row


_ENDS_WANTED: Final = {
    "complete": (R.CONFIG_ROLLOUT_COMPLETE,),
    "left": (R.CONFIG_ROLLOUT_LEFT,),
    "failed": (R.CONFIG_ROLLOUT_FAILED, R.CONFIG_ROLLED_BACK, R.CONFIG_ROLLED_BACK_BY_PERSON),
}


def gather(snapshot: Snapshot) -> dict[str, Facts]:
    """Every change the cluster says something about, by its id."""
    facts: dict[str, Facts] = {}

    def get(change: Change) -> Facts:
        found = facts.get(str(change))
        if found is None:
            found = facts[str(change)] = Facts(change)
        return found

    for source in snapshot.sources:
        if source.copy:
            continue
        found = _changed_by(source)
        if found is None:
            continue
        change, record = found
        f = get(change)
        f.current = True
        f.namespaces.add(source.namespace)
        at = record.get("at")
        if isinstance(at, int | float) and (not f.at or at < f.at):
            f.at = float(at)
            f.by = str(record.get("user") or "")
        keys = record.get("keys")
        if isinstance(keys, list):
            f.keys = tuple(str(k) for k in keys)
            more = record.get("more")
            f.more = more if isinstance(more, int) else 0
    ends = _end_notes(snapshot.notes)
    records: dict[WorkloadRef, dict[str, Any]] = {}
    for obj in snapshot.workloads:
        record = record_of(obj)
        if not record:
            continue
        ref = ref_of(obj)
        records[ref] = record
        for text in record.get("changes") or ():
            named = Change.parse(str(text))
            if named is None:
                continue
            f = get(named)
            f.namespaces.add(ref[1])
            f.rows[ref] = _rolled_row(obj, record, ends.get(ref, ()), snapshot.ends)
            since = since_of(record)
            if since is not None and not f.current and (not f.at or since < f.at):
                f.at = since  # (no record of who changed it: its first rollout's start)
            if not f.by and record.get("by"):
                f.by = _by_text(str(record["by"]))
    by_ref = {ref_of(o): o for o in snapshot.workloads}
    for ref, note in _waiting_notes(snapshot.notes).items():
        waiter = by_ref.get(ref)
        if waiter is None:
            continue
        since = since_of(records.get(ref, {}))
        if since is not None and note.at < since:
            continue  # said before its last rollout started
        match = _CHANGE_IN_NOTE.search(note.note)
        waited = Change.parse(match.group(1)) if match else None
        if waited is None:
            continue
        f = get(waited)
        if ref in f.rows:
            continue
        f.namespaces.add(ref[1])
        waits = _wait_kind(note)
        row = Row(ref, wave_of(waiter), healthy(waiter), "waiting", waits_for=waits, note=note.note)
        row.detail = _wait_detail(waits, note.note)
        row.start = note.at  # (from the change, below, where its time is known)
        said = _WAVE_IN_NOTE.search(note.note)
        if said:
            row.said_wave = (int(said.group(1)), int(said.group(2)))
        f.rows[ref] = row
        if not f.at:
            f.at = note.at
    return facts


def _consumers(snapshot: Snapshot, f: Facts) -> list[tuple[JSONObject, list[Use]]]:
    """The pinned workloads of the change's namespaces that read a key it changed."""
    source = f"{f.change.source.kind.value}/{f.change.source.name}"
    out = []
    for obj in snapshot.workloads:
        ref = ref_of(obj)
        if f.change.namespace and ref[1] != f.change.namespace:
            continue
        if not f.change.namespace and ref[1] not in f.namespaces:
            continue
        found = uses(obj).get(source)
        if not found or not pinned(obj) or mode_of(obj) == MODE_OFF:
            continue
        if f.keys is not None and not f.more:
            changed = set(f.keys)
            if all(u.keys is not None and not (u.keys & changed) for u in found):
                continue  # it reads other keys only
        out.append((obj, found))
    return out


def _pending(snapshot: Snapshot, f: Facts, status_of: StatusOf) -> None:
    """The consumers of a change its source holds now that neither rolled for it nor were
    said to wait: stale by `configpin status`'s dry run (not rolled yet), or not checked yet.
    Those that take it in place (on-change: refresh) are no member of the waves."""
    if not f.current:
        return
    for obj, its_uses in _consumers(snapshot, f):
        ref = ref_of(obj)
        if ref in f.rows:
            continue
        source = f"{f.change.source.kind.value}/{f.change.source.name}"
        if on_change(obj, source, its_uses).startswith("refresh"):
            continue
        meta = obj.get("metadata") or {}
        if epoch(meta.get("creationTimestamp")) > f.at > 0:
            continue  # made after the change: it started with it
        status = status_of(obj)
        row = Row(ref, wave_of(obj), healthy(obj), "pending")
        if status is None:
            row.state, row.detail = (
                "checking",
                "asking the API server (dry run) whether it is stale",
            )
        else:
            state = str(status.get("state") or "")
            if state not in _PENDING:
                continue
            row.detail = str(status.get("reason") or "stale: not rolled yet")
            row.waits_for = _PENDING[Status(state)]
            row.state = "pending" if state == Status.STALE else "waiting"
        f.rows[ref] = row


def _approvals(snapshot: Snapshot, f: Facts) -> list[dict[str, Any]]:
    """Who approved the change's content, in which namespace (as the source records it)."""
    out = []
    for source in snapshot.sources:
        if (
            source.kind != f.change.source.kind.value
            or source.name != f.change.source.name
            or source.namespace not in f.namespaces | ({f.change.namespace} - {""})
        ):
            continue
        record = _json(source.annotations.get(ANN_APPROVED))
        if record.get("content") == f.change.content:
            out.append(
                {
                    "namespace": source.namespace,
                    "user": record.get("user"),
                    "at": record.get("at"),
                    "now": record.get("now") is True,  # `approve --now`
                }
            )
    return out


def _action_words(action: Any) -> str:
    """What came of a failure, in the words `configpin status` and the Events use."""
    try:
        return ACTION_WORDS[Action(str(action))].short
    except ValueError:
        return str(action or "?")


def steps_text(steps: Sequence[WaveStep] | None) -> str:
    if steps is None:
        return "off"
    parts = []
    for s in steps:
        if s.approve:
            parts.append(APPROVE_STEP)
        elif s.count:
            parts.append(str(s.count))
        else:
            parts.append(f"{s.fraction * 100:g}%")
    return ",".join(parts)


def _summary(f: Facts) -> dict[str, Any]:
    counts: dict[str, int] = {}
    for row in f.rows.values():
        counts[row.state] = counts.get(row.state, 0) + 1
    kind, name = f.change.source.kind.value, f.change.source.name
    return {
        "id": f.ident,
        "namespace": f.change.namespace,
        "namespaces": sorted(f.namespaces),
        "shared": f.change.shared,
        "source": {"kind": kind, "name": name},
        "content": f.change.content,
        "by": f.by or "unknown",
        "at": f.at or None,
        "keys": list(f.keys) if f.keys is not None else None,
        "more": f.more,
        "current": f.current,
        "counts": counts,
        "waiting_approval": sum(1 for r in f.rows.values() if r.waits_for == "approval"),
    }


def changes(snapshot: Snapshot, query: str = "") -> dict[str, Any]:
    """The recent changes, newest first."""
    facts = [f for f in gather(snapshot).values() if f.rows or f.current]
    if query:
        q = query.lower()
        facts = [f for f in facts if q in f.ident.lower() or q in f.by.lower()]
    facts.sort(key=lambda f: (-(f.at or 0), f.ident))
    return {
        "changes": [_summary(f) for f in facts[:RECENT]],
        "total": len(facts),
        "said": UNSIGNED,
    }


def change(
    snapshot: Snapshot,
    ident: str,
    steps: Sequence[WaveStep] | None,
    status_of: StatusOf,
    page: int = 1,
) -> dict[str, Any] | None:
    """One change: its members in wave order, as a timeline (None: nothing says so)."""
    f = gather(snapshot).get(ident)
    if f is None:
        return None
    _pending(snapshot, f, status_of)
    for row in f.rows.values():
        if row.state in ("waiting", "pending") and f.at and (row.start or f.at + 1) > f.at:
            row.start = f.at  # it has waited since the change
    by_ref = {ref_of(o): o for o in snapshot.workloads}
    rows = list(f.rows.values())
    members = {Member(r.wave_annotation, r.ref[1], r.ref[0], r.ref[2]): r for r in rows}
    ordered = [members[m] for m in wave_order(members)]
    plan = cut_waves(ordered, lambda r: r.vouches, steps)
    for i, wave in enumerate(plan):
        for row in wave:
            row.wave = i + 1
    approve_at = approval_from(steps)
    approvals = _approvals(snapshot, f)
    approved_in = {a["namespace"] for a in approvals}
    _earlier_waves_done(plan, approve_at, approved_in)
    waiting_in = sorted({r.ref[1] for r in rows if r.waits_for == "approval"})
    asks = [
        r.ref[1]
        for r in rows
        if r.state in ("pending", "waiting", "checking")
        and (
            (approve_at is not None and r.wave > approve_at)
            or _asks_approval(by_ref.get(r.ref, {}))
        )
        and r.ref[1] not in approved_in
    ]
    said = {r.said_wave[1] for r in rows if r.said_wave is not None}
    note = ""
    if said and said != {len(plan)}:
        note = (
            f"configpin's Events say {', '.join(map(str, sorted(said)))} waves; this page cut "
            f"them with --rollout-waves {steps_text(steps)}: start the dashboard with the "
            "--rollout-waves configpin runs with"
        )
    pages = max(1, math.ceil(len(ordered) / TIMELINE_PAGE))
    page = min(max(1, page), pages)
    shown = ordered[(page - 1) * TIMELINE_PAGE : page * TIMELINE_PAGE]
    starts = [r.start for r in rows if r.start is not None]
    ends = [r.end for r in rows if r.end is not None]
    going = any(r.state in ("rolling", "waiting", "pending", "checking") for r in rows)
    begin = min([*starts, *([f.at] if f.at else [])], default=snapshot.now)
    finish = snapshot.now if going or not ends else max(ends)
    return {
        **_summary(f),
        "waves": len(plan),
        "wave_sizes": [len(w) for w in plan],
        "waves_setting": steps_text(steps),
        "waves_note": note,
        "approval": {
            "asked": bool(waiting_in or asks),
            "after_wave": approve_at,
            "approved": approvals,
            "namespaces": sorted(set(waiting_in) | set(asks)),
        },
        "rows": [r.as_dict() for r in shown],
        "total": len(ordered),
        "page": page,
        "pages": pages,
        "begin": begin,
        "finish": max(finish, begin + 1),
        "now": snapshot.now,
        "said": UNSIGNED,
    }


def _earlier_waves_done(
    plan: Sequence[Sequence[Row]], approve_at: int | None, approved_in: set[str]
) -> None:
    """A workload the controller last said waits for an earlier wave, whose earlier waves have
    all completed since: the Event is history, not what it waits for now. Past the approval
    step, without an approval in its namespace, it waits for one; otherwise for configpin's
    next look (its next Event says the rest)."""
    done = True
    for number, wave in enumerate(plan, start=1):
        if done:
            for row in wave:
                if row.waits_for != "wave":
                    continue
                if (
                    approve_at is not None
                    and number > approve_at
                    and (row.ref[1] not in approved_in)
                ):
                    row.waits_for, row.detail = "approval", ""
                else:
                    row.waits_for = "configpin"
                    row.detail = "its earlier waves completed: configpin rolls it next"
        done = done and all(row.state == "complete" for row in wave)


def _asks_approval(obj: Mapping[str, Any]) -> bool:
    value = annotations_of(obj).get(ANN_ROLLOUT_WAVES)
    return isinstance(value, str) and APPROVE_STEP in [p.strip() for p in value.split(",")]
