"""The changes pages as data: `changes`, each recent change of a consumed source, and
`change`, one change's members wave by wave, each with its rollout as a bar (from its
re-stamp to complete, failed, left, or waiting) and what it waits for.

A change is what configpin published of it: the source's ConfigRollout (its waves, each member
not done yet with its state and what it waits for, its verdict; webhook.core.rollouts), the
rollout records of the workloads that rolled for it (a record names the wave it started in),
who changed the source (its record), and the end of each rollout by the reason of the
controller's Events. The words for a wait are the core's (`REASONS`); no Event's text is
parsed and no wave is cut here. Where no ConfigRollout says the change (a configpin before
them, rights that do not reach them), the page says what it cannot tell.

Pure: no cluster call and no clock (the snapshot says when it was taken); a workload's status
(`configpin status`'s dry run) is handed in by `status_of`. What configpin wrote is read as it
stands: this process holds no digest key, so a record's signature is not checked (as
`configpin status` does not). The pages say so."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from webhook.commands.dashboard import moments
from webhook.commands.dashboard import rollouts as cr
from webhook.commands.dashboard.feeds import Note, Snapshot, Source, epoch
from webhook.commands.dashboard.workload import (
    UNSIGNED,
    StatusOf,
    Use,
    WorkloadRef,
    member_replicas,
    mode_of,
    on_change,
    pinned,
    record_of,
    ref_of,
    replicas_of,
    since_of,
    uses,
)
from webhook.core.constants import ANN_APPROVED, ANN_CHANGED_BY, ANN_SHARED, MODE_OFF
from webhook.core.model import JSONObject, SourceId, SourceKind
from webhook.core.progress import signal_pods
from webhook.core.reasons import EventReason
from webhook.core.record import ACTION_WORDS, Action, Change, digest_mapping_any
from webhook.core.rollouts import REASONS, MemberState, RolloutReason, rollout_name

TIMELINE_PAGE: Final = 100  # rows of a change's timeline page
RECENT: Final = 100  # changes listed at most
R = EventReason
_ENDS: Final = {
    "complete": (R.CONFIG_ROLLOUT_COMPLETE,),
    "left": (R.CONFIG_ROLLOUT_LEFT,),
    "failed": (R.CONFIG_ROLLOUT_FAILED, R.CONFIG_ROLLED_BACK, R.CONFIG_ROLLED_BACK_BY_PERSON),
}
_ENDED: Final = frozenset(r for reasons in _ENDS.values() for r in reasons)
_STATES: Final = frozenset(s.value for s in MemberState)
_PENDING_WORDS: Final = "stale: configpin has not decided yet (its coalescing window, its queue)"


# --- changes -----------------------------------------------------------------------------------


@dataclass
class Row:
    """One workload in a change's timeline."""

    ref: WorkloadRef
    state: str  # rolling, complete, failed, left, waiting, pending, checking
    detail: str = ""
    waits_for: str = ""  # (waiting) a RolloutReason: what for
    start: float | None = None
    end: float | None = None
    wave: int = 0  # from 1 (0: no wave is said for it)
    until: float | None = None  # (waiting) when it may roll, as configpin said
    rank: tuple[int, float] = (2, 0.0)  # its place in its wave: rolled, listed, neither
    # its updated, ready and desired pods (its own status; else as its ConfigRollout says)
    replicas: dict[str, int] | None = None
    pods: tuple[str, ...] = ()  # (failed) the pods its signal names

    def as_dict(self) -> dict[str, Any]:
        kind, namespace, name = self.ref
        reason = cr.reason_of(self.waits_for)
        return {
            "namespace": namespace,
            "kind": kind,
            "name": name,
            "wave": self.wave,
            "state": self.state,
            "detail": self.detail,
            "waits_for": self.waits_for,
            "waits": REASONS[reason].words if reason is not None else "",
            "until": self.until,
            "start": self.start,
            "end": self.end,
            "replicas": self.replicas,
            "pods": list(self.pods),
        }


@dataclass
class Facts:
    """What is known of one change."""

    change: Change
    by: str = ""
    at: float = 0.0
    keys: tuple[str, ...] | None = None
    digests: list[dict[str, str | None]] | None = None  # (its ConfigRollout's keyDigests)
    more: int = 0
    current: bool = False  # its source holds this content now (as its records say)
    recorded: bool = False  # its source's record of who changed it names it
    namespaces: set[str] = field(default_factory=set)
    rows: dict[WorkloadRef, Row] = field(default_factory=dict)
    # the ConfigRollouts that describe it (one per namespace), and the members they list
    rollouts: list[JSONObject] = field(default_factory=list)
    listed: dict[WorkloadRef, tuple[int, Mapping[str, Any]]] = field(default_factory=dict)
    not_shown: int = 0  # members not done that its ConfigRollouts count but do not list
    waves_said: int = 0  # (no ConfigRollout) the most waves a record says the change had

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


def _rolled_row(
    obj: Mapping[str, Any],
    record: Mapping[str, Any],
    ends: Sequence[Note],
    seen_ends: Mapping[tuple[str, str, str, float], float],
) -> Row:
    ref = ref_of(obj)
    state = str(record.get("state") or "rolling")
    since = since_of(record)
    row = Row(ref, state, start=since, rank=(0, since or 0.0))
    said = cr.record_wave(record)
    if said is not None:
        row.wave = said[0]
    if state == "failed":
        action = _action_words(record.get("action"))
        row.detail = f"{record.get('signal') or 'failed'} ({action})"
        row.pods = signal_pods(str(record.get("signal") or ""))
    elif state == "left":
        row.detail = "scaled to zero while rolling: it proves nothing and left the waves"
    elif state == "rolling":
        row.detail = "re-stamped: updated pods not all Ready yet"
    elif state == "complete":
        row.detail = "every updated pod Ready"
    if state != "rolling" and since is not None:
        wanted = _ENDS.get(state, ())
        found = [n.at for n in ends if n.reason in wanted and n.at >= since - 1]
        if found:
            row.end = min(found)
        else:
            row.end = seen_ends.get((*ref, since))
        if state == "complete" and row.end is not None:
            row.detail += f" after {max(0, round(row.end - since))} s"
    return row


def _listed_row(ref: WorkloadRef, index: int, member: Mapping[str, Any]) -> Row:
    """A member as its ConfigRollout lists it (not done yet): its state, what it waits for
    and the controller's words for it, its wave."""
    state = str(member.get("state"))
    state = state if state in _STATES else MemberState.PENDING.value
    row = Row(ref, state, wave=cr.count(member.get("wave")), rank=(1, float(index)))
    row.replicas = member_replicas(member)
    reason = cr.reason_of(member.get("reason"))
    message = str(member.get("message") or "")
    if state == MemberState.WAITING and reason is not None:
        row.waits_for = reason.value
        row.detail = message
        until = epoch(member.get("until"))
        row.until = until or None
    elif state == MemberState.FAILED:
        words = REASONS[reason].words if reason is not None else "failed"
        row.detail = f"{words}: {message}" if message else words
        pods = member.get("pods")
        row.pods = tuple(str(p) for p in pods) if isinstance(pods, list) else ()
    elif state == MemberState.ROLLING:
        row.detail = "re-stamped: updated pods not all Ready yet"
    elif state == MemberState.PENDING:
        row.detail = _PENDING_WORDS
    return row


def _end_notes(notes: Iterable[Note]) -> dict[WorkloadRef, list[Note]]:
    out: dict[WorkloadRef, list[Note]] = {}
    for note in notes:
        if note.reason in _ENDED:
            out.setdefault((note.kind, note.namespace, note.name), []).append(note)
    return out


def gather(snapshot: Snapshot) -> dict[str, Facts]:
    """Every change the cluster says something about, by its id."""
    facts: dict[str, Facts] = {}

    def get(change: Change) -> Facts:
        found = facts.get(str(change))
        if found is None:
            found = facts[str(change)] = Facts(change)
        return found

    sources = {(s.kind, s.namespace, s.name): s for s in snapshot.sources if not s.copy}
    for source in sources.values():
        found = _changed_by(source)
        if found is None:
            continue
        change, record = found
        f = get(change)
        f.current = f.recorded = True
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
    for obj in snapshot.rollouts:
        _described(get, sources, obj)
    ends = _end_notes(snapshot.notes)
    for obj in snapshot.workloads:
        record = record_of(obj)
        if not record:
            continue
        ref = ref_of(obj)
        for i, text in enumerate(record.get("changes") or ()):
            named = Change.parse(str(text))
            if named is None:
                continue
            f = get(named)
            f.namespaces.add(ref[1])
            row = f.rows[ref] = _rolled_row(obj, record, ends.get(ref, ()), snapshot.ends)
            # (the record's wave is its first change's: in another's, its ConfigRollout's)
            said = cr.record_wave(record) if i == 0 else None
            if said is None:
                row.wave = 0
            if said is not None:
                f.waves_said = max(f.waves_said, said[1])
            elif ref in f.listed:
                row.wave = cr.count(f.listed[ref][1].get("wave"))
            since = since_of(record)
            if since is not None and not f.current and (not f.at or since < f.at):
                f.at = since  # (no record of who changed it: its first rollout's start)
            if not f.by and record.get("by"):
                f.by = _by_text(str(record["by"]))
    for f in facts.values():
        for ref, (index, member) in f.listed.items():
            if ref not in f.rows:
                f.rows[ref] = _listed_row(ref, index, member)
    return facts


def _described(
    get: Callable[[Change], Facts],
    sources: Mapping[tuple[str, str, str], Source],
    obj: JSONObject,
) -> None:
    """What a ConfigRollout says of the change its source holds now, into that change's
    facts; one that describes another content (behind, or an earlier change) says nothing
    of the members of this one."""
    found, content = cr.source_of(obj), cr.content_of(obj)
    if found is None or content is None:
        return
    namespace, sid = found
    source = sources.get((sid.kind.value, namespace, sid.name))
    held = _changed_by(source) if source is not None else None
    rv = source.resource_version if source is not None else None
    if not cr.about_now(obj, rv, held[0].content if held else None, content):
        return
    shared = source is not None and source.annotations.get(ANN_SHARED) == "true"
    f = get(Change.of(namespace, sid, content, shared=shared))
    f.current = True
    f.namespaces.add(namespace)
    f.rollouts.append(obj)
    change = cr.status(obj).get("change") or {}
    if not f.by and isinstance(change.get("changedBy"), str):
        f.by = _by_text(change["changedBy"])
    if not f.at:
        f.at = epoch(change.get("changedAt"))
    keys = change.get("keys")
    if f.keys is None and isinstance(keys, list):
        f.keys = tuple(str(k) for k in keys)
    if f.digests is None:
        f.digests = cr.key_digests(obj)
    for ref, member in cr.members(obj):
        f.listed.setdefault(ref, (len(f.listed), member))
    f.not_shown += cr.count(cr.status(obj).get("membersNotShown"))


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
    """The consumers of a change its source holds now that neither rolled for it nor are
    listed by its ConfigRollout (there is none, or it counts more than it lists): stale by
    `configpin status`'s dry run (not rolled yet, or waiting as the status says), or not
    checked yet. No wave is said for them. Those that take it in place (on-change: refresh)
    are no member of the waves."""
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
        row = Row(ref, "pending")
        if status is None:
            row.state, row.detail = (
                "checking",
                "asking the API server (dry run) whether it is stale",
            )
        else:
            state = str(status.get("state") or "")
            reason = cr.status_reason(state)
            if state != "stale" and reason is None:
                continue
            row.detail = str(status.get("reason") or "stale: not rolled yet")
            if reason is not None:
                row.state, row.waits_for = "waiting", reason.value
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


def _summary(f: Facts, others: Sequence[JSONObject] = ()) -> dict[str, Any]:
    """`others`: ConfigRollouts of its source that may say (in their history) how it ended."""
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
        "waiting_approval": sum(1 for r in f.rows.values() if r.waits_for == _APPROVAL),
        "verdict": cr.verdict_of(f.rollouts),
        "moment": moments.moment(
            f.rollouts,
            (r.as_dict() for r in f.rows.values() if r.state == "failed"),
            f"{kind}/{name}",
            sorted(f.namespaces | ({f.change.namespace} - {""})),
        ),
        "ended": None if f.current else moments.ended(cr.outcome(others, f.change.content)),
    }


_APPROVAL: Final = RolloutReason.AWAITING_APPROVAL.value


def changes(snapshot: Snapshot, query: str = "") -> dict[str, Any]:
    """The recent changes, newest first."""
    # (a ConfigRollout of a source never changed describes its content: no change to list)
    facts = [f for f in gather(snapshot).values() if f.rows or f.recorded]
    if query:
        q = query.lower()
        facts = [f for f in facts if q in f.ident.lower() or q in f.by.lower()]
    facts.sort(key=lambda f: (-(f.at or 0), f.ident))
    by_name: dict[str, list[JSONObject]] = {}
    for obj in snapshot.rollouts:
        by_name.setdefault(str((obj.get("metadata") or {}).get("name")), []).append(obj)

    def others(f: Facts) -> list[JSONObject]:
        return by_name.get(rollout_name(f.change.source.kind, f.change.source.name), [])

    return {
        "changes": [_summary(f, others(f)) for f in facts[:RECENT]],
        "total": len(facts),
        "said": UNSIGNED,
    }


def _rollout_said(snapshot: Snapshot, f: Facts) -> str:
    """What the page cannot tell, where no ConfigRollout describes the change ("": one does)."""
    if f.rollouts:
        return ""
    name = rollout_name(f.change.source.kind, f.change.source.name)
    where = sorted(f.namespaces | ({f.change.namespace} - {""}))
    others = [
        o
        for o in snapshot.rollouts
        if (o.get("metadata") or {}).get("name") == name
        and (o.get("metadata") or {}).get("namespace") in where
    ]
    return cr.cannot_tell(
        others,
        snapshot.rollouts_feed,
        name,
        where,
        current=f.current,
        content=f.change.content,
    )


def _order(row: Row) -> tuple[Any, ...]:
    """Wave by wave (those no wave is said for last); in a wave, those that rolled (by their
    start), then as the ConfigRollout lists them, then the rest by name."""
    return (row.wave == 0, row.wave, row.rank, row.ref[1], row.ref[0], row.ref[2])


def _history(named: Sequence[JSONObject], where: set[str]) -> list[dict[str, Any]]:
    """The source's earlier changes and how each ended, latest first, as its ConfigRollouts'
    history says them (those of the change's namespaces)."""
    out = []
    for obj in named:
        ns = str((obj.get("metadata") or {}).get("namespace") or "")
        for h in cr.status(obj).get("history") or () if ns in where else ():
            if isinstance(h, Mapping) and h.get("content"):
                said = moments.ended(str(h.get("outcome") or ""))
                out.append({"namespace": ns, "content": str(h["content"]), "ended": said,
                            "at": epoch(h.get("at")) or None})  # fmt: skip
    return sorted(out, key=lambda r: -(r["at"] or 0))


def change(
    snapshot: Snapshot,
    ident: str,
    status_of: StatusOf,
    page: int = 1,
) -> dict[str, Any] | None:
    """One change: its members wave by wave, as a timeline (None: nothing says so)."""
    f = gather(snapshot).get(ident)
    if f is None:
        return None
    if not f.rollouts or f.not_shown:
        _pending(snapshot, f, status_of)
    for row in f.rows.values():
        if row.state in ("waiting", "pending", "checking") and f.at and row.start is None:
            row.start = f.at  # it has waited since the change
    ordered = sorted(f.rows.values(), key=_order)
    sizes = cr.wave_sizes(f.rollouts)
    waves = len(sizes) if f.rollouts else f.waves_said
    approvals = _approvals(snapshot, f)
    asking = [r for r in ordered if r.waits_for == _APPROVAL]
    after = min((r.wave for r in asking if r.wave), default=0) - 1
    pages = max(1, math.ceil(len(ordered) / TIMELINE_PAGE))
    page = min(max(1, page), pages)
    shown = ordered[(page - 1) * TIMELINE_PAGE : page * TIMELINE_PAGE]
    objs = {ref_of(o): o for o in snapshot.workloads}
    for row in shown:  # (its own status, where the page holds it: fresher than published)
        obj = objs.get(row.ref)
        if obj is not None:
            row.replicas = replicas_of(obj)
    starts = [r.start for r in ordered if r.start is not None]
    ends = [r.end for r in ordered if r.end is not None]
    going = any(r.state in ("rolling", "waiting", "pending", "checking") for r in ordered)
    begin = min([*starts, *([f.at] if f.at else [])], default=snapshot.now)
    finish = snapshot.now if going or not ends else max(ends)
    name = rollout_name(f.change.source.kind, f.change.source.name)
    named = [o for o in snapshot.rollouts if (o.get("metadata") or {}).get("name") == name]
    return {
        **_summary(f, named),
        "key_digests": f.digests,
        "history": _history(named, f.namespaces | ({f.change.namespace} - {""})),
        "waves": waves,
        "wave_sizes": sizes,
        "rollout": {
            "names": sorted(
                f"{(o.get('metadata') or {}).get('namespace')}/"
                f"{(o.get('metadata') or {}).get('name')}"
                for o in f.rollouts
            ),
            "said": _rollout_said(snapshot, f),
            "not_shown": f.not_shown,
        },
        "approval": {
            "asked": bool(asking),
            "after_wave": after if after >= 1 else None,
            "approved": approvals,
            "namespaces": sorted({r.ref[1] for r in asking}),
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
