"""A change as an object: the `ConfigRollout` (configpin.io/v1alpha1) of one consumed ConfigMap
or Secret, and what its status says (SPEC, "Changes as objects").

Pure: what the controller publishes (`rollout_status`, from the gate's decisions that it
hands in as `MemberView`s) and what a reader makes of it (`verdict`: `kubectl configpin wait`,
`configpin status`, the dashboard). The conditions follow kstatus, which `kubectl wait`, Flux,
Helm and Argo CD read: `Reconciling` True while the change rolls or waits, `Stalled` True when
it cannot go on by itself, `Ready` True when it is delivered; `observedGeneration` says the
status is about the object as it stands.

The reasons and their words sit in one table (`REASONS`) beside their enum, as
`webhook.core.reasons` keeps the Events'. The object is output only: configpin decides from
its signed records, never from it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final, TypeAlias
from urllib.parse import quote

from webhook.core.model import SourceKind
from webhook.core.reasons import Status
from webhook.core.record import Action
from webhook.core.waves import Wait, WaitReason

GROUP: Final = "configpin.io"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "ConfigRollout"
PLURAL: Final = "configrollouts"
SHORT_NAME: Final = "cfgro"
_NAME_MAX: Final = 253  # a DNS subdomain
_HASH_LEN: Final = 10
MEMBERS_SHOWN: Final = 100  # members not done yet listed by name, at most (counts say the rest)
HISTORY: Final = 5  # outcomes of the changes before this one kept
PODS_SHOWN: Final = 5  # pods a failed member's signal names, listed at most


def rollout_path(namespace: str, name: str | None = None) -> str:
    """The API path of a namespace's ConfigRollouts, or of one."""
    at = f"/apis/{GROUP}/{VERSION}/namespaces/{quote(namespace, safe='')}/{PLURAL}"
    return at if name is None else f"{at}/{quote(name, safe='')}"


def rollout_name(kind: SourceKind, name: str) -> str:
    """`configmap-NAME` or `secret-NAME`; where that is longer than a name may be, cut and
    ended with a hash of the whole (two long names never share one)."""
    full = f"{kind.value}-{name}"
    if len(full) <= _NAME_MAX:
        return full
    tail = hashlib.sha256(full.encode()).hexdigest()[:_HASH_LEN]
    return f"{full[: _NAME_MAX - _HASH_LEN - 1].rstrip('.-')}-{tail}"


class ConditionType(StrEnum):
    READY = "Ready"
    RECONCILING = "Reconciling"
    STALLED = "Stalled"


class RolloutReason(StrEnum):
    """Why a change stands where it stands: the reason of its condition that is True."""

    ROLLING = "Rolling"
    AWAITING_APPROVAL = "AwaitingApproval"
    AWAITING_WINDOW = "AwaitingWindow"
    FLAPPING = "Flapping"
    WAITING = "Waiting"
    FAILED = "Failed"
    ROLLED_BACK = "RolledBack"
    HELD = "Held"
    PAUSED = "Paused"
    ABORTED = "Aborted"
    DELIVERED = "Delivered"

    @property
    def said(self) -> Said:
        return REASONS[self]


class MemberState(StrEnum):
    """One workload's part in a change (a member of its waves)."""

    COMPLETE = "complete"  # rolled, every updated pod Ready with the new content
    LEFT = "left"  # scaled to zero while rolling: nothing to deliver to
    ROLLING = "rolling"  # rolling, followed
    WAITING = "waiting"  # stale, held by the gate (its reason says for what)
    PENDING = "pending"  # stale, not decided yet (the coalescing window, the queue)
    FAILED = "failed"  # failed: undone, held, or rolled back by a person

    @property
    def done(self) -> bool:
        return self in (MemberState.COMPLETE, MemberState.LEFT)


@dataclass(frozen=True, slots=True)
class Said:
    condition: ConditionType  # the condition that is True with this reason
    words: str  # the message's head, in a person's words
    rank: int  # (Reconciling) which of several members' reasons the change shows: lowest
    # (a waiting member's reason) the state `configpin status` shows for the workload
    status: Status | None = None


C = ConditionType
REASONS: Final[Mapping[RolloutReason, Said]] = {
    RolloutReason.ROLLING: Said(C.RECONCILING, "rolling", 1),
    RolloutReason.AWAITING_APPROVAL: Said(
        C.RECONCILING, "waits for an approval", 2, Status.AWAITING_APPROVAL
    ),
    RolloutReason.AWAITING_WINDOW: Said(
        C.RECONCILING, "waits for a rollout window to open", 3, Status.AWAITING_WINDOW
    ),
    RolloutReason.FLAPPING: Said(
        C.RECONCILING, "held as flapping: its rollout budget is spent", 4, Status.FLAPPING
    ),
    RolloutReason.WAITING: Said(C.RECONCILING, "waits for configpin to roll it", 5, Status.WAITING),
    # (a waiting member's Failed: an earlier wave failed, and the waves after it never start)
    RolloutReason.FAILED: Said(C.STALLED, "failed", 1, Status.WAITING),
    RolloutReason.ROLLED_BACK: Said(C.STALLED, "rolled back", 2),
    RolloutReason.HELD: Said(C.STALLED, "failed and held", 3),
    RolloutReason.PAUSED: Said(C.STALLED, "paused by a person", 4, Status.PAUSED),
    RolloutReason.ABORTED: Said(C.STALLED, "aborted by a person", 0, Status.ABORTED),
    RolloutReason.DELIVERED: Said(C.READY, "delivered", 0),
}
# The gate's wait, as the change's reason.
WAIT_REASONS: Final[Mapping[WaitReason, RolloutReason]] = {
    WaitReason.CAP: RolloutReason.WAITING,
    WaitReason.WAVE: RolloutReason.WAITING,
    WaitReason.STOPPED: RolloutReason.FAILED,
    WaitReason.APPROVAL: RolloutReason.AWAITING_APPROVAL,
    WaitReason.WINDOW: RolloutReason.AWAITING_WINDOW,
    WaitReason.BUDGET: RolloutReason.FLAPPING,
    WaitReason.PAUSED: RolloutReason.PAUSED,
    WaitReason.ABORTED: RolloutReason.ABORTED,
}
# The waits that put `configpin.io/held` on the workload: a person's or a clock's, which can
# last (an earlier wave's, or the cap's, lasts no longer than another member's rollout, which
# a health check sees already).
HELD: Final = (
    WaitReason.APPROVAL,
    WaitReason.WINDOW,
    WaitReason.BUDGET,
    WaitReason.PAUSED,
    WaitReason.ABORTED,
)
HELD_MAX: Final = 1024  # characters of its text


def held_text(wait: Wait | None) -> str | None:
    """`configpin.io/held`'s text for the gate's answer: `REASON: words`; None when it does
    not hold the workload so (not held, or only behind another member's rollout)."""
    if wait is None or wait.reason not in HELD:
        return None
    return f"{WAIT_REASONS[wait.reason].value}: {wait.why}"[:HELD_MAX]


# A failed member's action, as the change's reason.
FAILURE_REASONS: Final[Mapping[Action | None, RolloutReason]] = {
    None: RolloutReason.FAILED,
    Action.NONE: RolloutReason.FAILED,
    Action.UNDO: RolloutReason.ROLLED_BACK,
    Action.PERSON: RolloutReason.ROLLED_BACK,
    Action.HOLD: RolloutReason.HELD,
}


@dataclass(frozen=True, slots=True)
class MemberView:
    """A member of a change as the ConfigRollout shows it."""

    namespace: str
    kind: str
    name: str
    wave: int  # from 1
    state: MemberState
    reason: RolloutReason | None = None  # (waiting, failed) for what, or what came of it
    message: str = ""  # the gate's words, or the failure's
    until: str | None = None  # (waiting) when it may roll, RFC 3339
    replicas: tuple[int, int, int] | None = None  # updated, ready, desired: its own status's
    pods: tuple[str, ...] = ()  # (failed) the pods its failure signal names

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "namespace": self.namespace,
            "kind": self.kind,
            "name": self.name,
            "state": self.state.value,
        }
        if self.reason is not None:
            out["reason"] = self.reason.value
        if self.message:
            out["message"] = self.message
        if self.until is not None:
            out["until"] = self.until
        if self.replicas is not None:
            updated, ready, desired = self.replicas
            out["replicas"] = {"updated": updated, "ready": ready, "desired": desired}
        if self.pods:
            out["pods"] = list(self.pods[:PODS_SHOWN])
        return out


KeyDigest: TypeAlias = tuple[str, str | None, str | None]
"""A changed key, its old and its new keyed digest (hex, short; None: added, removed)."""
KEY_DIGESTS_SHOWN: Final = 64  # changed keys whose digests a change keeps and shows, at most
KEY_DIGEST_HEX: Final = 16  # hex digits of a key's digest shown (its first 8 bytes)


@dataclass(frozen=True, slots=True)
class ChangeView:
    """The change a source holds now: its content's short form (keyed, never a value), the
    keys it changed (None: not known to this process), who changed it and when; `digests`:
    the changed keys' old and new keyed digests (None: not known to this process)."""

    content: str
    keys: tuple[str, ...] | None = None
    by: str | None = None
    at: str | None = None
    digests: tuple[KeyDigest, ...] | None = None


def _key_digests(change: ChangeView) -> list[dict[str, str]]:
    """`change.keyDigests`: the changed keys' digests, for the keys it says it changed."""
    named = set(change.keys) if change.keys is not None else None
    out: list[dict[str, str]] = []
    for key, old, new in sorted(change.digests or ()):
        if (named is None or key in named) and len(out) < KEY_DIGESTS_SHOWN:
            row = {"key": key, **({"old": old} if old else {}), **({"new": new} if new else {})}
            out.append(row)
    return out


def key_digests_of(change: Any) -> tuple[KeyDigest, ...] | None:
    """The key digests a ConfigRollout's `status.change` says (None: it says none)."""
    rows = change.get("keyDigests") if isinstance(change, Mapping) else None
    if not isinstance(rows, list):
        return None
    out = []
    for r in rows:
        if isinstance(r, Mapping) and isinstance(r.get("key"), str):
            old, new = r.get("old"), r.get("new")
            out.append(
                (
                    r["key"],
                    old if isinstance(old, str) else None,
                    new if isinstance(new, str) else None,
                )
            )
    return tuple(out)


@dataclass(frozen=True, slots=True)
class Verdict:
    """What a ConfigRollout says of its change, read back."""

    condition: ConditionType | None  # the one True (None: it says nothing that can be read)
    reason: str
    message: str

    @property
    def ready(self) -> bool:
        return self.condition is ConditionType.READY

    @property
    def stalled(self) -> bool:
        return self.condition is ConditionType.STALLED


def _worst(reasons: Sequence[RolloutReason]) -> RolloutReason:
    return min(reasons, key=lambda r: REASONS[r].rank)


def _message(reason: RolloutReason, members: Sequence[MemberView], ready: int, total: int) -> str:
    about = [m for m in members if m.reason is reason or (m.state is MemberState.ROLLING)]
    head = f"{REASONS[reason].words}"
    if reason is RolloutReason.DELIVERED:
        return f"{head}: {ready} of {total} consumers run the content"
    first = next((m for m in about if m.message), None)
    detail = f": {first.kind.lower()}/{first.name}: {first.message}" if first else ""
    return f"{head}{detail}"


def decide(
    members: Sequence[MemberView], paused: bool = False, aborted: bool = False
) -> RolloutReason:
    """The change's reason from its members' states (`aborted`: a person's abort, whatever
    they say: its undone members failed by it)."""
    if aborted:
        return RolloutReason.ABORTED
    failed = [m.reason or RolloutReason.FAILED for m in members if m.state is MemberState.FAILED]
    stopped = [m.reason or RolloutReason.WAITING for m in members if m.state is MemberState.WAITING]
    if failed:
        return _worst(failed)
    if RolloutReason.FAILED in stopped:  # (a later wave's member, stopped by a failure)
        return RolloutReason.FAILED
    if paused and any(not m.state.done for m in members):  # (delivered: nothing to hold)
        return RolloutReason.PAUSED
    if any(m.state is MemberState.ROLLING for m in members):
        return RolloutReason.ROLLING
    if stopped:
        return _worst(stopped)
    if any(m.state is MemberState.PENDING for m in members):
        return RolloutReason.WAITING
    return RolloutReason.DELIVERED


def _conditions(
    reason: RolloutReason,
    message: str,
    generation: int,
    now: str,
    previous: Sequence[Mapping[str, Any]],
) -> list[dict[str, Any]]:
    true_one = REASONS[reason].condition
    before = {
        c.get("type"): c
        for c in previous
        if isinstance(c, Mapping) and isinstance(c.get("lastTransitionTime"), str)
    }
    out = []
    for ctype in (ConditionType.READY, ConditionType.RECONCILING, ConditionType.STALLED):
        value = "True" if ctype is true_one else "False"
        if ctype is true_one:
            why, words = reason.value, message
        elif ctype is ConditionType.READY:
            why, words = reason.value, f"not delivered: {message}"
        else:
            why, words = reason.value, ""
        was = before.get(ctype.value)
        since = was["lastTransitionTime"] if was and was.get("status") == value else now
        cond = {
            "type": ctype.value,
            "status": value,
            "reason": why,
            "message": words,
            "observedGeneration": generation,
            "lastTransitionTime": since,
        }
        out.append(cond)
    return out


def _history(previous: Mapping[str, Any], content: str, now: str) -> list[dict[str, Any]]:
    """The outcomes of the last changes before this one: carried from what it said, one added
    when the source moved on from the change it described."""
    kept = [
        h
        for h in previous.get("history") or []
        if isinstance(h, Mapping) and all(isinstance(h.get(k), str) for k in ("content", "outcome"))
    ]
    history = [{k: str(h[k]) for k in ("content", "outcome", "at") if k in h} for h in kept]
    before = previous.get("change")
    said = previous.get("conditions")
    if isinstance(before, Mapping) and before.get("content") not in (None, content):
        outcome = ""
        for c in said if isinstance(said, list) else []:
            if isinstance(c, Mapping) and c.get("status") == "True":
                outcome = str(c.get("reason", ""))
        history.insert(0, {"content": str(before["content"]), "outcome": outcome, "at": now})
    return history[:HISTORY]


def rollout_status(
    *,
    source: str,
    uid: str,
    resource_version: str,
    generation: int,
    change: ChangeView,
    waves: Sequence[Sequence[MemberView]],
    consumers: int,
    now: str,
    previous: Mapping[str, Any] | None = None,
    paused: str | None = None,
    aborted: str | None = None,
) -> dict[str, Any]:
    """The status of a source's ConfigRollout. `waves`: its change's members, wave by wave;
    `consumers`: every workload that consumes the source where configpin acts (the members,
    and those that already run the content or take it in place); `previous`: the status as
    it stands (its conditions' transition times and its history are kept); `paused`: who
    paused the change and when ("USER at TIME", `configpin pause`), None: not paused; `aborted`:
    who aborted it (`configpin abort`), the same way."""
    previous = previous or {}
    members = [m for wave in waves for m in wave]
    reason = decide(members, paused is not None, aborted is not None)
    done = sum(m.state.done for m in members)
    ready = consumers - len(members) + done
    message = _message(reason, members, ready, consumers)
    if reason is RolloutReason.PAUSED and paused:
        message = f"{REASONS[reason].words}: {paused}; kubectl configpin resume {source} goes on"
    if reason is RolloutReason.ABORTED and aborted:
        message = (
            f"{REASONS[reason].words}: {aborted}; kubectl configpin retry {source} rolls it again"
        )
    shown: list[dict[str, Any]] = []
    wave_rows = []
    at_wave = 0
    for i, wave in enumerate(waves, 1):
        counts = {s.value: 0 for s in MemberState}
        for m in wave:
            counts[m.state.value] += 1
            if not m.state.done and len(shown) < MEMBERS_SHOWN:
                shown.append({**m.body(), "wave": i})
        if not at_wave and any(not m.state.done for m in wave):
            at_wave = i
        counted = {k: v for k, v in counts.items() if v}
        wave_rows.append({"wave": i, "members": len(wave), **counted})
    waves_n = len(waves)
    current_wave = at_wave or waves_n
    keys = ",".join(change.keys) if change.keys is not None else ""
    body: dict[str, Any] = {
        "observedGeneration": generation,
        "source": {"ref": source, "uid": uid, "resourceVersion": resource_version},
        "change": {
            "content": change.content,
            **({"keys": list(change.keys)} if change.keys is not None else {}),
            **({"keyDigests": digests} if (digests := _key_digests(change)) else {}),
            **({"changedBy": change.by} if change.by else {}),
            **({"changedAt": change.at} if change.at else {}),
            **_said_fields("paused", paused),
            **_said_fields("aborted", aborted),
        },
        "counts": {
            "consumers": consumers,
            "members": len(members),
            "ready": ready,
            **{
                s.value: n
                for s in MemberState
                if (n := sum(m.state is s for m in members)) and not s.done
            },
        },
        "waves": wave_rows,
        "members": shown,
        "summary": {
            "keys": keys or "-",
            "wave": f"{current_wave}/{waves_n}" if waves_n else "-",
            "ready": f"{ready}/{consumers}",
            "state": reason.value,
            "changedBy": (change.by or "-").split(" at ")[0],
        },
        "conditions": _conditions(
            reason, message, generation, now, previous.get("conditions") or []
        ),
        "history": _history(previous, change.content, now),
    }
    if len(members) - done > len(shown):
        body["membersNotShown"] = len(members) - done - len(shown)
    return body


def _said_fields(verb: str, said: str | None) -> dict[str, str]:
    """`pausedBy` and `pausedAt` (`abortedBy`, `abortedAt`) of the change, from "USER at TIME"
    (a time holds no " at ")."""
    if not said:
        return {}
    user, _, at = said.rpartition(" at ")
    return {f"{verb}By": user, f"{verb}At": at}


def verdict(obj: Mapping[str, Any]) -> Verdict:
    """What a ConfigRollout says (its conditions, as kstatus reads them): Ready, Stalled or
    Reconciling True, with its reason; None where its status is not about the object as it
    stands (observedGeneration behind) or says nothing."""
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    if not isinstance(status, Mapping) or not isinstance(meta, Mapping):
        return Verdict(None, "", "no status")
    if status.get("observedGeneration") != meta.get("generation"):
        return Verdict(None, "", "its status is not about its generation yet")
    found = {c.get("type"): c for c in status.get("conditions") or [] if isinstance(c, Mapping)}
    for ctype in (ConditionType.STALLED, ConditionType.READY, ConditionType.RECONCILING):
        c = found.get(ctype.value)
        if c is not None and c.get("status") == "True":
            return Verdict(ctype, str(c.get("reason", "")), str(c.get("message", "")))
    return Verdict(None, "", "no condition is True")


def member_wait(obj: Mapping[str, Any], kind: str, name: str) -> tuple[Status, str] | None:
    """What a ConfigRollout says a member (`kind`/`name` of its namespace) waits for: the
    state `configpin status` shows and the gate's words; None where it does not say."""
    status = obj.get("status") or {}
    members = status.get("members") if isinstance(status, Mapping) else None
    for m in members if isinstance(members, list) else ():
        if not isinstance(m, Mapping) or (m.get("kind"), m.get("name")) != (kind, name):
            continue
        if m.get("state") != MemberState.WAITING.value:
            return None
        try:
            said = REASONS[RolloutReason(str(m.get("reason")))]
        except ValueError:
            return None
        return (said.status, str(m.get("message") or "")) if said.status else None
    return None


def about(obj: Mapping[str, Any], uid: str, resource_version: str) -> bool:
    """The ConfigRollout's status is about the source as it stands: that object (uid) at
    that version (what `kubectl configpin wait` waits for: never an earlier change)."""
    status = obj.get("status") or {}
    source = status.get("source") if isinstance(status, Mapping) else None
    return (
        isinstance(source, Mapping)
        and source.get("uid") == uid
        and source.get("resourceVersion") == resource_version
    )
