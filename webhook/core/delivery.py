"""Safe delivery: follow the config rollouts configpin starts, say when one failed and what to
do about it, and roll one change to many workloads in waves.

Pure: every decision is made from objects as read (a workload, its pods) and the time given.

- The rollout record (`configpin.io/rollout`, on the workload's own metadata) is what
  configpin waits for: the per-source digests it rolled to and from, the reference names the
  template had before (snapshot mode: the previous copies), when, which change(s) it belongs
  to, whether the workload was healthy before, and a fingerprint of the pod template as
  configpin wrote it. It is signed with the digest key over the workload's identity, so a
  record a tenant writes is not believed. `started` is the one place a record is made.
- `assess` tells from the workload's status (and its pods) whether that rollout is complete,
  still going, failed (and by which signal) or left (scaled to zero: it proves nothing);
  `rolled_back` whether someone else took the template back off the content rolled to.
- `undo_ops` writes the template's references and configpin's record back to the last content
  that completed there, touching nothing else, and only when nothing else changed since.
- `cut_waves` cuts the workloads a change reaches into waves (`--rollout-waves`), over those
  that can vouch for it (healthy before, with pods): the others join the last wave.
"""

from __future__ import annotations

import hashlib
import hmac
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final, TypeVar

import orjson

from webhook.core import digest
from webhook.core.constants import (
    ANN_CHECKSUM,
    ANN_ON_FAILURE,
    ANN_PROGRESS_DEADLINE,
    ANN_REJECTED,
    ANN_ROLLOUT,
    ANN_ROLLOUT_WAVES,
    ANN_SOURCES,
    ANN_WAVE,
    APPROVE_STEP,
    MODE_SNAPSHOT,
)
from webhook.core.kinds import RolloutStyle, WorkloadKind
from webhook.core.model import JSONObject, PatchOp, SourceId, SourceKind
from webhook.core.names import pointer
from webhook.core.refs import find_sites, get_path
from webhook.core.signed import opened
from webhook.core.times import parse_time

DEFAULT_PROGRESS_DEADLINE: Final = 600.0  # the Deployment default (progressDeadlineSeconds)
_MAX_PROGRESS_DEADLINE: Final = 7 * 24 * 3600.0
RESTART_LIMIT: Final = 3  # an updated pod's container restarted this often: the rollout failed
_WAVE_BOUND: Final = 1_000_000
_CLOCK_SKEW: Final = 1.0  # seconds between configpin's clock and the API server's, tolerated

_RECORD_DOMAIN: Final = b"configpin/rollout/v1"


class State(StrEnum):
    """How a config rollout configpin started stands (the record's `state`)."""

    ROLLING = "rolling"  # followed: its updated pods are not all Ready yet
    COMPLETE = "complete"  # every updated pod Ready with the new content
    FAILED = "failed"  # a failure signal, or a person rolled it back
    LEFT = "left"  # scaled to zero while rolling: it proves nothing about the change


class Action(StrEnum):
    """What a failed rollout led to: the policy the workload asked for
    (`configpin.io/on-failure`: undo, hold, none), or a person's own rollback, kept."""

    UNDO = "undo"
    HOLD = "hold"
    NONE = "none"
    PERSON = "rolled-back-by-person"

    @property
    def rejects(self) -> bool:
        """The content is recorded as rejected on the workload (never rolled to again)."""
        return self is not Action.NONE


ON_FAILURE: Final[tuple[Action, ...]] = (Action.UNDO, Action.HOLD, Action.NONE)


class Standing(StrEnum):
    """How a workload stood before a change: only a healthy one with pods can vouch for it."""

    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"  # not available, or failing already
    EMPTY = "empty"  # no pods (scaled to zero): nothing to prove anything with


class WaitReason(StrEnum):
    """Why a stale workload does not roll yet (the wave gate's answer)."""

    CAP = "cap"  # its namespace has --max-rolling rollouts in flight
    WAVE = "wave"  # an earlier wave of the change is not complete
    STOPPED = "stopped"  # an earlier wave of the change failed: the waves after it never start
    APPROVAL = "approval"  # its wave comes after `approve`: the change is not approved yet


@dataclass(frozen=True, slots=True)
class Wait:
    reason: WaitReason
    why: str  # in a person's words


@dataclass(frozen=True, slots=True, order=True)
class Change:
    """One change: a source's new content (`content`: a prefix of its digest under the digest
    key itself, so equal content anywhere is the same). A change is its namespace's own;
    `namespace` "" is a change shared across every namespace whose source of that name is
    marked `configpin.io/shared` and holds that content."""

    namespace: str
    source: SourceId
    content: str

    def __str__(self) -> str:
        text = f"{self.source}@{self.content}"
        return f"{self.namespace}/{text}" if self.namespace else text

    @property
    def shared(self) -> bool:
        return not self.namespace

    @classmethod
    def of(cls, namespace: str, sid: SourceId, content: str, *, shared: bool) -> Change:
        return cls("" if shared else namespace, sid, content[:20])

    @classmethod
    def parse(cls, text: str) -> Change | None:
        head, at, content = text.rpartition("@")
        parts = head.split("/")
        if not at or len(parts) not in (2, 3) or not content:
            return None
        namespace = parts[0] if len(parts) == 3 else ""
        try:
            kind = SourceKind(parts[-2])
        except ValueError:
            return None
        return cls(namespace, SourceId(kind, parts[-1]), content)


def _annotations(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    value = meta.get("annotations") if isinstance(meta, dict) else None
    return value if isinstance(value, dict) else {}


# --- the workload's own settings -----------------------------------------------------------


def on_failure_policy(obj: Mapping[str, Any], mode: str) -> tuple[Action, str | None]:
    """What a failed rollout of this workload leads to, and a warning when its annotation asks
    for what it cannot have (an unknown policy; undo in checksum mode, where the content was
    changed in place and cannot be brought back): those hold."""
    default = Action.UNDO if mode == MODE_SNAPSHOT else Action.HOLD
    value = _annotations(obj).get(ANN_ON_FAILURE)
    if value is None:
        return default, None
    if value not in ON_FAILURE:
        return default, f"{ANN_ON_FAILURE}: unknown policy {str(value)[:64]!r}: {default}"
    action = Action(value)
    if action is Action.UNDO and mode != MODE_SNAPSHOT:
        return Action.HOLD, (
            f"{ANN_ON_FAILURE}: undo needs snapshot mode (checksum mode changes content in "
            "place, which cannot be brought back): it holds"
        )
    return action, None


def progress_deadline(obj: Mapping[str, Any]) -> float:
    """Seconds the updated pods of a kind without a deadline of its own may go without one of
    them becoming Ready."""
    value = _annotations(obj).get(ANN_PROGRESS_DEADLINE)
    try:
        seconds = float(value) if isinstance(value, str) else DEFAULT_PROGRESS_DEADLINE
    except ValueError:
        seconds = DEFAULT_PROGRESS_DEADLINE
    if not math.isfinite(seconds) or seconds <= 0:
        return DEFAULT_PROGRESS_DEADLINE
    return min(seconds, _MAX_PROGRESS_DEADLINE)


def wave_of(obj: Mapping[str, Any]) -> int:
    """The workload's place among the waves (lower first; 0 when it does not say)."""
    value = _annotations(obj).get(ANN_WAVE)
    try:
        wave = int(value) if isinstance(value, str) else 0
    except ValueError:
        return 0
    return max(-_WAVE_BOUND, min(_WAVE_BOUND, wave))


# --- the rollout record --------------------------------------------------------------------


@dataclass(frozen=True)
class RolloutRecord:
    """A config rollout configpin started on a workload, and how it went."""

    state: State
    to: Mapping[str, str]  # the per-source digests rolled to
    before: Mapping[str, str]  # ... and from: the last content that completed there
    since: float  # when it started (seconds since the epoch)
    changes: tuple[Change, ...] = ()  # the change(s) it belongs to
    # what the template's references named before, by what they name now (snapshot mode):
    # "configmap/<new copy>" -> "<source>/<previous name>" (the last copy that completed)
    refs: Mapping[str, str] = field(default_factory=dict)
    template: str = ""  # fingerprint of the pod template as configpin wrote it
    signal: str = ""  # (failed) what failed, in a person's words
    action: Action | None = None  # (failed) what came of it
    healthy: bool = True  # healthy with pods before the change: it vouches for it, or not
    by: str = ""  # who changed the content, and when ("alice at 2026-...Z"; "unknown")

    def _body(self) -> dict[str, Any]:
        return {
            "state": self.state.value,
            "to": dict(self.to),
            "before": dict(self.before),
            "since": self.since,
            "changes": [str(c) for c in self.changes],
            "refs": dict(self.refs),
            "template": self.template,
            "signal": self.signal,
            "action": self.action.value if self.action is not None else "",
            "healthy": self.healthy,
            "by": self.by,
        }

    def encode(self, hkey: bytes, identity: str) -> str:
        body = self._body()
        body["sig"] = _sign(hkey, identity, body)
        return orjson.dumps(body, option=orjson.OPT_SORT_KEYS).decode()

    @classmethod
    def decode(cls, hkey: bytes, identity: str, text: Any) -> RolloutRecord | None:
        """The record a workload carries, when configpin wrote it for this very workload
        (`identity`: `workload_identity`); None for anything else."""
        found = opened(text, 64 * 1024)
        if found is None:
            return None
        body, sig = found
        if not hmac.compare_digest(sig, _sign(hkey, identity, body)):
            return None
        try:
            changes = tuple(Change.parse(str(c)) for c in body["changes"])
            action = str(body["action"])
            return cls(
                state=State(body["state"]),
                to=_str_map(body["to"]),
                before=_str_map(body["before"]),
                since=float(body["since"]),
                changes=tuple(c for c in changes if c is not None),
                refs=_str_map(body["refs"]),
                template=str(body["template"]),
                signal=str(body["signal"]),
                action=Action(action) if action else None,
                healthy=body.get("healthy", True) is not False,  # (records before it: healthy)
                by=str(body.get("by", "")),
            )
        except (KeyError, TypeError, ValueError):
            return None

    def ended(
        self, state: State, *, signal: str = "", action: Action | None = None
    ) -> RolloutRecord:
        return RolloutRecord(
            state,
            self.to,
            self.before,
            self.since,
            self.changes,
            self.refs,
            self.template,
            signal,
            action,
            self.healthy,
            self.by,
        )

    def changed_sources(self) -> list[str]:
        """The sources whose digest the rollout changed (`configmap/<name>`)."""
        return sorted(k for k, v in self.to.items() if self.before.get(k) != v)

    @property
    def unproven(self) -> bool:
        """The content it rolled to never completed on the workload, and the template still
        points at it (superseded while rolling, scaled to zero, failed and held or left)."""
        return self.state in (State.ROLLING, State.LEFT) or (
            self.state is State.FAILED and self.action in (Action.HOLD, Action.NONE)
        )


def _str_map(value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        raise TypeError("not a mapping")
    return {str(k): str(v) for k, v in value.items()}


def _sign(hkey: bytes, identity: str, body: Mapping[str, Any]) -> str:
    text = orjson.dumps(dict(body), option=orjson.OPT_SORT_KEYS)
    who = identity.encode()
    msg = _RECORD_DOMAIN + len(who).to_bytes(4, "big") + who + text
    return hmac.digest(hkey, msg, "sha256").hex()


def identity(kind: str, namespace: str, name: str) -> str:
    """What a rollout record is signed over: the workload's kind, namespace and name (a record
    copied onto another workload is not believed)."""
    return f"{kind}/{namespace}/{name}"


def workload_identity(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return identity(str(obj.get("kind")), str(meta.get("namespace")), str(meta.get("name")))


def rollout_record(hkey: bytes, obj: Mapping[str, Any]) -> RolloutRecord | None:
    return RolloutRecord.decode(hkey, workload_identity(obj), _annotations(obj).get(ANN_ROLLOUT))


def rejected(obj: Mapping[str, Any]) -> dict[str, str]:
    """The content rollouts of this workload failed with (per-source digests)."""
    value = digest_mapping_any(_annotations(obj).get(ANN_REJECTED))
    return {str(k): v for k, v in value.items() if isinstance(v, str)}


def template_fingerprint(template: Any) -> str:
    """A fingerprint of a pod template (metadata and spec), to tell later whether anything in
    it changed since configpin wrote it."""
    return hashlib.sha256(orjson.dumps(template, option=orjson.OPT_SORT_KEYS)).hexdigest()[:32]


def template_sources(kind: WorkloadKind, obj: Mapping[str, Any]) -> dict[str, str] | None:
    """The record on the workload's pod template (`configpin.io/sources`): what its pods run."""
    meta = get_path(obj, kind.meta_path)
    annotations = meta.get("annotations") if isinstance(meta, dict) else None
    return digest_mapping(annotations.get(ANN_SOURCES) if isinstance(annotations, dict) else None)


def rolled_back(kind: WorkloadKind, obj: Mapping[str, Any], record: RolloutRecord) -> bool:
    """Whether the pod template no longer names the content `record` rolled to, for a source
    the rollout changed: someone else took it back (`kubectl rollout undo`, a GitOps revert).
    configpin itself never does so without ending the record in the same write."""
    names = template_sources(kind, obj) or {}
    return any(names.get(k) != record.to[k] for k in record.changed_sources())


def started(
    kind: WorkloadKind,
    obj: Mapping[str, Any] | None,
    after: Mapping[str, Any] | None,
    *,
    to: Mapping[str, str],
    before: Mapping[str, str],
    changes: Iterable[Change],
    now: float,
    healthy: bool,
    made: Mapping[str, str] | None = None,
    previous: RolloutRecord | None = None,
    by: str = "",
    empty: bool = False,
) -> RolloutRecord:
    """The record of a rollout configpin is about to write: the one place one is made.

    `obj`: the workload as read, `after`: as the write leaves it (both None when the re-stamp
    is planned from the index alone: then nothing can be undone, which checksum mode never
    does); `before`: the digests its template recorded; `made`: the snapshot copies the
    write points at, by name, and their sources' names; `previous`: the record it carries.

    What it rolls from is the last content that completed there: a rollout that never did
    (superseded while rolling, held, left) passes its own starting point on, so that an undo
    never lands on content that never worked. Kinds whose pods are not replaced (a
    ReplicaSet, a CronJob) have nothing to follow: their record is complete at once. `empty`:
    the workload asks for no pods as written (`standing` says EMPTY): nothing rolls, so its
    record is written `left` at once, as a look at it would end it (`without_pods`), without
    that second write."""
    start = dict(before)
    inherited: Mapping[str, str] = {}
    # (a person's rollback of it leaves the template on good content: nothing to pass on)
    if previous is not None and previous.unproven and not rolled_back(kind, obj or {}, previous):
        for key in previous.changed_sources():
            if to.get(key) == before.get(key):
                continue  # not rolled again by this rollout: its references stay
            if key in previous.before:
                start[key] = previous.before[key]
            else:
                start.pop(key, None)
        inherited = previous.refs
    refs: dict[str, str] = {}
    template = ""
    if obj is not None and after is not None:
        copies = made or {}
        old_spec, new_spec = get_path(obj, kind.spec_path), get_path(after, kind.spec_path)
        old_sites = {
            s.path: s.source for s in find_sites(old_spec if isinstance(old_spec, dict) else {})
        }
        for site in find_sites(new_spec if isinstance(new_spec, dict) else {}):
            was = old_sites.get(site.path)
            if was is not None and was != site.source and site.source.name in copies:
                refs[str(site.source)] = inherited.get(
                    str(was), f"{copies[site.source.name]}/{was.name}"
                )
        found = get_path(after, kind.template) if kind.template else after
        template = template_fingerprint(found)
    if kind.rollout is None:
        state = State.COMPLETE
    elif empty:
        state = State.LEFT
    else:
        state = State.ROLLING
    return RolloutRecord(
        state,
        to=dict(to),
        before=start,
        since=now,
        changes=tuple(changes),
        refs=refs,
        template=template,
        healthy=healthy,
        by=by,
    )


# --- following a rollout -------------------------------------------------------------------


@dataclass(frozen=True)
class Progress:
    state: State
    signal: str = ""  # (failed) the signal, in a person's words


def _status_caught_up(obj: Mapping[str, Any]) -> bool:
    meta, status = obj.get("metadata") or {}, obj.get("status") or {}
    generation = meta.get("generation")
    return isinstance(generation, int) and status.get("observedGeneration", 0) >= generation


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _wanted(how: RolloutStyle, obj: Mapping[str, Any]) -> int | None:
    """How many pods the workload asks for (None: not told yet)."""
    if how is RolloutStyle.DAEMONSET:
        status = obj.get("status") or {}
        if not _status_caught_up(obj):
            return None
        return _int(status.get("desiredNumberScheduled"))
    replicas = (obj.get("spec") or {}).get("replicas", 1)
    return replicas if isinstance(replicas, int) and not isinstance(replicas, bool) else 1


def _complete(how: RolloutStyle, obj: Mapping[str, Any]) -> bool | None:
    """Whether the workload's own status says its rolling update is complete (every updated
    pod Ready, none of the old left); None: it has no rolling update configpin can follow."""
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    strategy = (spec.get("updateStrategy") or {}).get("type")
    if how is not RolloutStyle.DEPLOYMENT and strategy == "OnDelete":
        return None  # its pods change only when someone deletes them
    if not _status_caught_up(obj):
        return False
    if how is RolloutStyle.DEPLOYMENT:
        want = _int(spec.get("replicas", 1))
        return (
            _int(status.get("updatedReplicas")) >= want
            and _int(status.get("replicas")) <= want
            and _int(status.get("readyReplicas")) >= want
        )
    if how is RolloutStyle.STATEFULSET:
        want = _int(spec.get("replicas", 1))
        rolling = (spec.get("updateStrategy") or {}).get("rollingUpdate") or {}
        partition = min(_int(rolling.get("partition")), want)
        return (
            _int(status.get("updatedReplicas")) >= want - partition
            and _int(status.get("readyReplicas")) >= want
        )
    want = _int(status.get("desiredNumberScheduled"))
    return (
        _int(status.get("updatedNumberScheduled")) >= want
        and _int(status.get("numberReady")) >= want
    )


def _conditions(obj: Mapping[str, Any]) -> Iterable[Mapping[str, Any]]:
    for cond in (obj.get("status") or {}).get("conditions") or ():
        if isinstance(cond, dict):
            yield cond


def _deadline_exceeded(obj: Mapping[str, Any]) -> str | None:
    """A Deployment's own signal: Progressing=False, ProgressDeadlineExceeded, for the
    generation it has now."""
    if not _status_caught_up(obj):
        return None
    for cond in _conditions(obj):
        if (
            cond.get("type") == "Progressing"
            and cond.get("status") == "False"
            and cond.get("reason") == "ProgressDeadlineExceeded"
        ):
            seconds = (obj.get("spec") or {}).get("progressDeadlineSeconds", 600)
            message = str(cond.get("message") or "")[:200]
            return f"its progress deadline ({seconds} s) passed: {message}"
    return None


def standing(kind: WorkloadKind, obj: Mapping[str, Any]) -> Standing:
    """How the workload stands now, by its own status: a change it is not healthy for (not
    available, failing already) or has no pods for cannot be proved or disproved on it."""
    how = kind.rollout
    if how is None:
        return Standing.HEALTHY  # its pods are not replaced: nothing to follow or vouch with
    if _wanted(how, obj) == 0:
        return Standing.EMPTY
    if how is RolloutStyle.DEPLOYMENT:
        for cond in _conditions(obj):
            kind_of, status = cond.get("type"), cond.get("status")
            if (kind_of == "Available" and status == "False") or (
                kind_of == "Progressing"
                and status == "False"
                and cond.get("reason") == "ProgressDeadlineExceeded"
            ):
                return Standing.UNHEALTHY
        return Standing.HEALTHY
    if not _status_caught_up(obj):
        return Standing.HEALTHY  # not told yet
    status = obj.get("status") or {}
    if how is RolloutStyle.STATEFULSET:
        want = _wanted(how, obj) or 0
        return Standing.UNHEALTHY if _int(status.get("readyReplicas")) < want else Standing.HEALTHY
    unavailable = _int(status.get("numberUnavailable"))
    return Standing.UNHEALTHY if unavailable > 0 else Standing.HEALTHY


def _updated(pods: Iterable[Mapping[str, Any]], record: RolloutRecord) -> list[Mapping[str, Any]]:
    """The pods that run what the rollout rolled to (they carry its record)."""
    return [p for p in pods if digest_mapping(_annotations(p).get(ANN_SOURCES)) == dict(record.to)]


def _restarted(updated: Iterable[Mapping[str, Any]], record: RolloutRecord) -> str | None:
    """An updated pod started by this rollout whose container restarted RESTART_LIMIT times
    or more: the new content keeps it from running. (An updated pod older than the rollout, of
    a revision rolled back to, restarted before: those restarts are not this rollout's.)"""
    for pod in updated:
        created = parse_time((pod.get("metadata") or {}).get("creationTimestamp"))
        if created is None or created < math.floor(record.since) - _CLOCK_SKEW:
            continue
        status = pod.get("status") or {}
        for key in ("initContainerStatuses", "containerStatuses"):
            for cs in status.get(key) or ():
                if isinstance(cs, dict) and _int(cs.get("restartCount")) >= RESTART_LIMIT:
                    name = (pod.get("metadata") or {}).get("name")
                    return (
                        f"updated pod {name}: container {cs.get('name')} restarted "
                        f"{_int(cs.get('restartCount'))} times"
                    )
    return None


def last_progress(updated: Iterable[Mapping[str, Any]], record: RolloutRecord) -> float:
    """When the rollout last made progress: its start, or the latest time an updated pod
    became Ready."""
    latest = record.since
    for pod in updated:
        for cond in (pod.get("status") or {}).get("conditions") or ():
            ready = isinstance(cond, dict) and cond.get("type") == "Ready"
            if ready and cond.get("status") == "True":
                when = parse_time(cond.get("lastTransitionTime"))
                if when is not None and when > latest:
                    latest = when
    return latest


def digest_mapping_any(text: Any) -> dict[str, Any]:
    """A JSON object annotation as it stands ({} if it is not one)."""
    if not isinstance(text, str) or len(text) > 64 * 1024:
        return {}
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def digest_mapping(text: Any) -> dict[str, str] | None:
    if not isinstance(text, str):
        return None
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        return None
    return value


def without_pods(kind: WorkloadKind, obj: Mapping[str, Any]) -> Progress | None:
    """What the workload's own spec and status say of its rollout with no pod looked at: it
    left (scaled to zero), or it is complete (or has no rolling update to follow); None: the
    pods must be looked at (`assess`)."""
    how = kind.rollout
    if how is None:
        return Progress(State.COMPLETE)
    if _wanted(how, obj) == 0:
        return Progress(State.LEFT)
    done = _complete(how, obj)
    if done is None or done:
        return Progress(State.COMPLETE)
    return None


def assess(
    kind: WorkloadKind,
    obj: Mapping[str, Any],
    pods: Iterable[Mapping[str, Any]],
    record: RolloutRecord,
    now: float,
) -> Progress:
    """How the rollout `record` names is going on `obj` (as read now), its `pods` listed.

    Signals are about this rollout: restarts count from its start, and for kinds without a
    deadline of their own the deadline is time without progress (no updated pod became
    Ready), as a Deployment's is. A workload scaled to zero proves nothing either way: it
    left."""
    early = without_pods(kind, obj)
    if early is not None:
        return early
    how = kind.rollout
    updated = _updated(pods, record)
    restarted = _restarted(updated, record)
    if restarted is not None:
        return Progress(State.FAILED, restarted)
    if how is RolloutStyle.DEPLOYMENT:
        exceeded = _deadline_exceeded(obj)
        if exceeded is not None:
            return Progress(State.FAILED, exceeded)
        return Progress(State.ROLLING)
    deadline = progress_deadline(obj)
    if now - last_progress(updated, record) > deadline:
        return Progress(
            State.FAILED,
            f"none of its updated pods became Ready for {deadline:g} s ({ANN_PROGRESS_DEADLINE})",
        )
    return Progress(State.ROLLING)


def poll_after(
    kind: WorkloadKind,
    obj: Mapping[str, Any],
    pods: Iterable[Mapping[str, Any]],
    record: RolloutRecord,
    now: float,
) -> float:
    """How soon to look again at a rollout still going (its pods' restarts, a deadline)."""
    if kind.rollout is not RolloutStyle.DEPLOYMENT:
        left = last_progress(_updated(pods, record), record) + progress_deadline(obj) - now
        if 0 < left < 5.0:
            return max(0.5, left + 0.1)
    return 5.0


# --- undo ----------------------------------------------------------------------------------


def undo_ops(
    kind: WorkloadKind,
    obj: JSONObject,
    record: RolloutRecord,
    nskey: bytes,
    is_copy: Callable[[str, str], bool],
) -> tuple[list[PatchOp], str | None]:
    """Ops that point the template back at the references of the last content that completed
    (the previous copies) and write configpin's record back to it; or why not: no copy to go
    back to, the template changed since configpin wrote it (an image, a command: not
    configpin's to take back), or a previous copy is not a copy configpin made of that source
    (`is_copy(source key, name)`)."""
    if not record.refs:
        return [], "it kept no copy of the content before it to go back to"
    template = get_path(obj, kind.template) if kind.template else obj
    if not record.template or template_fingerprint(template) != record.template:
        return [], "its pod template changed since configpin's re-stamp (not only its config)"
    spec = get_path(obj, kind.spec_path)
    ops: list[PatchOp] = []
    for site in find_sites(spec if isinstance(spec, dict) else {}):
        ref = record.refs.get(str(site.source))
        if ref is None:
            continue
        source, _, previous = ref.partition("/")
        if previous != source and not is_copy(f"{site.source.kind}/{source}", previous):
            return [], f"its previous reference {previous} is not a copy configpin made of {source}"
        path = pointer((*kind.spec_path, *site.path))
        ops.append({"op": "replace", "path": path, "value": previous})
    if not ops:
        return [], "its template points at no copy configpin made for this rollout"
    before = dict(record.before)
    meta_path = kind.meta_path
    template_ann = get_path(obj, (*meta_path, "annotations"))
    if isinstance(template_ann, dict):
        for key, value in (
            (ANN_SOURCES, digest.canonical_mapping(before)),
            (ANN_CHECKSUM, digest.checksum(nskey, before)),
        ):
            op = "replace" if key in template_ann else "add"
            ops.append(
                {"op": op, "path": pointer((*meta_path, "annotations", key)), "value": value}
            )
    return ops, None


def record_ops(obj: Mapping[str, Any], values: Mapping[str, str | None]) -> list[PatchOp]:
    """Ops that set (None: remove) configpin's annotations on the workload's own metadata."""
    meta = obj.get("metadata") or {}
    annotations = meta.get("annotations")
    ops: list[PatchOp] = []
    if not isinstance(annotations, dict):
        wanted = {k: v for k, v in values.items() if v is not None}
        if wanted:
            ops.append({"op": "add", "path": "/metadata/annotations", "value": wanted})
        return ops
    for key, value in values.items():
        path = pointer(("metadata", "annotations", key))
        if value is None:
            if key in annotations:
                ops.append({"op": "remove", "path": path})
        elif annotations.get(key) != value:
            ops.append(
                {"op": "replace" if key in annotations else "add", "path": path, "value": value}
            )
    return ops


def rejected_text(obj: Mapping[str, Any], record: RolloutRecord) -> str:
    """The workload's rejected content with this rollout's added."""
    out = rejected(obj)
    out.update((k, record.to[k]) for k in record.changed_sources())
    return digest.canonical_mapping(out)


def proven(obj: Mapping[str, Any], record: RolloutRecord) -> dict[str, str] | None:
    """The workload's rejected content less what this completed rollout showed to work there
    (a re-apply rolled it back to that content, and it completed); None: nothing proved."""
    out = rejected(obj)
    kept = {k: v for k, v in out.items() if record.to.get(k) != v}
    return None if len(kept) == len(out) else kept


# --- waves ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class WaveStep:
    count: int = 0  # this many workloads
    fraction: float = 0.0  # or this share of the rest
    approve: bool = False  # no wave: the waves after it wait for the change's approval


def parse_waves(text: str) -> tuple[WaveStep, ...] | None:
    """`--rollout-waves`: comma-separated counts (`1`) and shares of the rest (`10%`), and
    `approve` (the waves after it wait until the change is approved); `off` (None): every
    workload at once. A last step that leaves some out is followed by the rest. Raises
    ValueError saying what is wrong."""
    text = text.strip()
    if text.lower() == "off":
        return None
    steps: list[WaveStep] = []
    for raw in text.split(","):
        item = raw.strip()
        if item.lower() == APPROVE_STEP:
            if steps and steps[-1].approve:
                raise ValueError(
                    f"{text!r}: approve twice in a row; e.g. 1,10%,100% or 1,approve,100%"
                )
            steps.append(WaveStep(approve=True))
            continue
        try:
            if item.endswith("%"):
                share = float(item[:-1])
                if not 0 < share <= 100:
                    raise ValueError
                steps.append(WaveStep(fraction=share / 100))
            else:
                count = int(item)
                if count < 1:
                    raise ValueError
                steps.append(WaveStep(count=count))
        except ValueError:
            raise ValueError(
                f"{item!r} in {text!r}: each wave is a count (1) or a share of the rest (10%), "
                "with approve between waves where they wait for an approval, e.g. 1,10%,100% "
                "or 1,approve,100%; or off"
            ) from None
    if not any(not s.approve for s in steps):
        raise ValueError("no wave given: e.g. 1,10%,100%; or off")
    return tuple(steps)


def approval_from(steps: Sequence[WaveStep] | None) -> int | None:
    """The first wave (from 0) that waits for the change's approval: the one after the first
    `approve` step; None: no step asks for one."""
    waves = [s.approve for s in steps or ()]
    return waves.index(True) if True in waves else None


def asks_approval(obj: Mapping[str, Any]) -> bool:
    """The workload's own wave list holds `approve`: its rollouts wait for an approval."""
    value = _annotations(obj).get(ANN_ROLLOUT_WAVES)
    if not isinstance(value, str) or len(value) > 256:
        return False
    return any(part.strip().lower() == APPROVE_STEP for part in value.split(","))


def wave_sizes(total: int, steps: Sequence[WaveStep]) -> list[int]:
    sizes: list[int] = []
    left = total
    for step in steps:
        if step.approve:
            continue
        if left <= 0:
            break
        size = step.count if step.count else math.ceil(step.fraction * left)
        size = max(1, min(size, left))
        sizes.append(size)
        left -= size
    if left > 0:
        sizes.append(left)
    return sizes


@dataclass(frozen=True, order=True)
class Member:
    """A workload a change reaches."""

    wave: int  # its configpin.io/wave
    namespace: str
    kind: str
    name: str


def _stable(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()[:8]


def wave_order(members: Iterable[Member]) -> list[Member]:
    """Lower configpin.io/wave first; within one, spread across namespaces (one of each in
    turn, the namespaces and the workloads within each in a stable pseudo-random order)."""
    by_wave: dict[int, dict[str, list[Member]]] = {}
    for m in members:
        by_wave.setdefault(m.wave, {}).setdefault(m.namespace, []).append(m)
    out: list[Member] = []
    for wave in sorted(by_wave):
        groups = [
            sorted(ms, key=lambda m: _stable(f"{m.kind}/{m.name}"))
            for _, ms in sorted(by_wave[wave].items(), key=lambda item: _stable(item[0]))
        ]
        for i in range(max(len(g) for g in groups)):
            out.extend(g[i] for g in groups if i < len(g))
    return out


_M = TypeVar("_M")


def cut_waves(
    ordered: Sequence[_M], vouches: Callable[[_M], bool], steps: Sequence[WaveStep] | None
) -> list[list[_M]]:
    """The waves of a change, its members in order: cut over those that can vouch for it
    (healthy with pods before it), the others joining the last wave (never a canary, and what
    comes of them holds no one up)."""
    if steps is None:
        return [list(ordered)] if ordered else []
    counted = [m for m in ordered if vouches(m)]
    others = [m for m in ordered if not vouches(m)]
    plan: list[list[_M]] = []
    at = 0
    for size in wave_sizes(len(counted), steps):
        plan.append(counted[at : at + size])
        at += size
    if others:
        if plan:
            plan[-1] = plan[-1] + others
        else:
            plan.append(others)
    return plan


def wave_plan(members: Iterable[Member], steps: Sequence[WaveStep] | None) -> list[list[Member]]:
    """The waves of members that all vouch for the change."""
    return cut_waves(wave_order(members), lambda _m: True, steps)
