"""A rollout's progress: how a workload stood before a change, how the config rollout configpin
started on it is going, and what a failed one leads to.

Pure: every decision is made from objects as read (a workload, its pods) and the time given.

- `standing`: how a workload stands by its own status (only a healthy one with pods can vouch
  for a change).
- `assess` tells from the workload's status (and its pods) whether the rollout its record
  (webhook.core.record) names is complete, still going, failed (and by which signal: its
  restarts since the rollout began, a deadline without progress) or left (scaled to zero: it
  proves nothing).
- `on_failure_policy`: what a failed rollout leads to (undo, hold, none); `undo_ops` writes the
  template's references and configpin's record back to the last content that completed
  there, touching nothing else, and only when nothing else changed since.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

from webhook.core import digest
from webhook.core.constants import (
    ANN_CHECKSUM,
    ANN_ON_FAILURE,
    ANN_PROGRESS_DEADLINE,
    ANN_SOURCES,
    MODE_SNAPSHOT,
)
from webhook.core.kinds import RolloutStyle, WorkloadKind
from webhook.core.model import JSONObject, PatchOp
from webhook.core.names import pointer
from webhook.core.record import (
    ON_FAILURE,
    Action,
    RolloutRecord,
    State,
    annotations_of,
    digest_mapping,
    template_fingerprint,
)
from webhook.core.refs import find_sites, get_path
from webhook.core.times import parse_time

DEFAULT_PROGRESS_DEADLINE: Final = 600.0  # the Deployment default (progressDeadlineSeconds)
_MAX_PROGRESS_DEADLINE: Final = 7 * 24 * 3600.0
RESTART_LIMIT: Final = 3  # an updated pod's container restarted this often: the rollout failed
_CLOCK_SKEW: Final = 1.0  # seconds between configpin's clock and the API server's, tolerated


class Standing(StrEnum):
    """How a workload stood before a change: only a healthy one with pods can vouch for it."""

    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"  # not available, or failing already
    EMPTY = "empty"  # no pods (scaled to zero): nothing to prove anything with


# --- the workload's own settings ---------------------------------------------------------


def on_failure_policy(obj: Mapping[str, Any], mode: str) -> tuple[Action, str | None]:
    """What a failed rollout of this workload leads to, and a warning when its annotation asks
    for what it cannot have (an unknown policy; undo in checksum mode, where the content was
    changed in place and cannot be brought back): those hold."""
    default = Action.UNDO if mode == MODE_SNAPSHOT else Action.HOLD
    value = annotations_of(obj).get(ANN_ON_FAILURE)
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
    value = annotations_of(obj).get(ANN_PROGRESS_DEADLINE)
    try:
        seconds = float(value) if isinstance(value, str) else DEFAULT_PROGRESS_DEADLINE
    except ValueError:
        seconds = DEFAULT_PROGRESS_DEADLINE
    if not math.isfinite(seconds) or seconds <= 0:
        return DEFAULT_PROGRESS_DEADLINE
    return min(seconds, _MAX_PROGRESS_DEADLINE)


# --- following a rollout -------------------------------------------------------------------


@dataclass(frozen=True)
class Progress:
    state: State
    signal: str = ""  # (failed) the signal, in a person's words


Replicas = tuple[int, int, int]  # (updated, ready, desired) pods, as the workload's status says
_REPLICAS_MAX: Final = 4096  # distinct triples shared (bounded, as webhook.core.current's pairs)
# (Any, not the tuple they are: the compiled core would box each one anew: webhook.core.current)
_replicas: dict[Any, Any] = {}
_RESTARTED: Final = re.compile(r"^updated pod (\S+): container ")


def replicas(kind: WorkloadKind, obj: Mapping[str, Any]) -> Any:
    """Its updated, ready and desired pods by its own status (a Deployment's or StatefulSet's
    updatedReplicas, readyReplicas and spec.replicas; a DaemonSet's updatedNumberScheduled,
    numberReady and desiredNumberScheduled; a custom kind's where its status has them as a
    Deployment's does); None: it says none. One tuple per distinct triple, shared: the index
    keeps one for each of tens of thousands of workloads."""
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    if not isinstance(spec, Mapping) or not isinstance(status, Mapping):
        return None
    found: Any
    if kind.rollout is RolloutStyle.DAEMONSET:
        keys = ("updatedNumberScheduled", "numberReady", "desiredNumberScheduled")
        found = tuple(_int(status.get(k)) for k in keys)
    elif kind.rollout is not None or "updatedReplicas" in status or "readyReplicas" in status:
        want = spec.get("replicas", 1)
        found = (_int(status.get("updatedReplicas")), _int(status.get("readyReplicas")), _int(want))
    else:
        return None
    shared = _replicas.get(found)
    if shared is None:
        if len(_replicas) >= _REPLICAS_MAX:
            _replicas.clear()
        shared = _replicas.setdefault(found, found)
    return shared


def signal_pods(signal: str) -> tuple[str, ...]:
    """The pods a failure signal names (`assess`'s restarts name the updated pod; a deadline
    names none)."""
    found = _RESTARTED.match(signal)
    return (found.group(1),) if found else ()


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
    return [
        p for p in pods if digest_mapping(annotations_of(p).get(ANN_SOURCES)) == dict(record.to)
    ]


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
