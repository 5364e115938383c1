"""Safe delivery: follow the config rollouts configpin starts, say when one failed and what to
do about it, and roll one change to many workloads in waves.

Pure: every decision is made from objects as read (a workload, its pods) and the time given.

- The rollout record (`configpin.io/rollout`, on the workload's own metadata) is what
  configpin waits for: the per-source digests it rolled to and from, the reference names the
  template had before (snapshot mode: the previous copies), when, which change(s) it belongs
  to, and a fingerprint of the pod template as configpin wrote it. It is signed with the digest
  key over the workload's identity, so a record a tenant writes is not believed.
- `assess` tells from the workload's status (and its pods) whether that rollout is complete,
  still going, or failed, and by which signal.
- `undo_ops` writes the template's references and configpin's record back to the revision
  before the change, touching nothing else, and only when nothing else changed since.
- `wave_plan` orders the workloads a change reaches (configpin.io/wave first, then spread
  across namespaces, stable) and cuts them into waves (`--rollout-waves`).
"""

from __future__ import annotations

import hashlib
import hmac
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from webhook.core import digest
from webhook.core.constants import (
    ANN_CHECKSUM,
    ANN_ON_FAILURE,
    ANN_PROGRESS_DEADLINE,
    ANN_REJECTED,
    ANN_ROLLOUT,
    ANN_SOURCES,
    ANN_WAVE,
    MODE_SNAPSHOT,
    ON_FAILURE_HOLD,
    ON_FAILURE_POLICIES,
    ON_FAILURE_UNDO,
)
from webhook.core.kinds import WorkloadKind
from webhook.core.model import JSONObject, PatchOp, SourceId
from webhook.core.names import pointer
from webhook.core.refs import find_sites, get_path

DEFAULT_PROGRESS_DEADLINE: Final = 600.0  # the Deployment default (progressDeadlineSeconds)
_MAX_PROGRESS_DEADLINE: Final = 7 * 24 * 3600.0
RESTART_LIMIT: Final = 3  # an updated pod's container restarted this often: the rollout failed
_WAVE_BOUND: Final = 1_000_000

ROLLING: Final = "rolling"
COMPLETE: Final = "complete"
FAILED: Final = "failed"

_RECORD_DOMAIN: Final = b"configpin/rollout/v1"


def _annotations(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    value = meta.get("annotations") if isinstance(meta, dict) else None
    return value if isinstance(value, dict) else {}


# --- the workload's own settings -----------------------------------------------------------


def on_failure_policy(obj: Mapping[str, Any], mode: str) -> tuple[str, str | None]:
    """What a failed rollout of this workload leads to, and a warning when its annotation asks
    for what it cannot have (an unknown policy; undo in checksum mode, where the content was
    changed in place and cannot be brought back): those hold."""
    default = ON_FAILURE_UNDO if mode == MODE_SNAPSHOT else ON_FAILURE_HOLD
    value = _annotations(obj).get(ANN_ON_FAILURE)
    if value is None:
        return default, None
    if value not in ON_FAILURE_POLICIES:
        return default, f"{ANN_ON_FAILURE}: unknown policy {str(value)[:64]!r}: {default}"
    if value == ON_FAILURE_UNDO and mode != MODE_SNAPSHOT:
        return ON_FAILURE_HOLD, (
            f"{ANN_ON_FAILURE}: undo needs snapshot mode (checksum mode changes content in "
            "place, which cannot be brought back): it holds"
        )
    return str(value), None


def progress_deadline(obj: Mapping[str, Any]) -> float:
    """Seconds the updated pods of a kind without a deadline of its own have to be Ready."""
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

    state: str  # rolling, complete, failed
    to: Mapping[str, str]  # the per-source digests rolled to
    before: Mapping[str, str]  # ... and from
    since: float  # when it started (seconds since the epoch)
    changes: tuple[str, ...] = ()  # the change(s) it belongs to (`change_of`)
    # what the template's references named before, by what they name now (snapshot mode):
    # "configmap/<new copy>" -> "<source>/<previous name>"
    refs: Mapping[str, str] = field(default_factory=dict)
    template: str = ""  # fingerprint of the pod template as configpin wrote it
    signal: str = ""  # (failed) what failed, in a person's words
    action: str = ""  # (failed) what configpin did about it: undo, hold, none

    def _body(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "to": dict(self.to),
            "before": dict(self.before),
            "since": self.since,
            "changes": list(self.changes),
            "refs": dict(self.refs),
            "template": self.template,
            "signal": self.signal,
            "action": self.action,
        }

    def encode(self, hkey: bytes, identity: str) -> str:
        body = self._body()
        body["sig"] = _sign(hkey, identity, body)
        return orjson.dumps(body, option=orjson.OPT_SORT_KEYS).decode()

    @classmethod
    def decode(cls, hkey: bytes, identity: str, text: Any) -> RolloutRecord | None:
        """The record a workload carries, when configpin wrote it for this very workload
        (`identity`: `workload_identity`); None for anything else."""
        if not isinstance(text, str) or len(text) > 64 * 1024:
            return None
        try:
            body = orjson.loads(text)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(body, dict):
            return None
        sig = body.pop("sig", None)
        if not isinstance(sig, str) or not hmac.compare_digest(sig, _sign(hkey, identity, body)):
            return None
        try:
            return cls(
                state=str(body["state"]),
                to=_str_map(body["to"]),
                before=_str_map(body["before"]),
                since=float(body["since"]),
                changes=tuple(str(c) for c in body["changes"]),
                refs=_str_map(body["refs"]),
                template=str(body["template"]),
                signal=str(body["signal"]),
                action=str(body["action"]),
            )
        except (KeyError, TypeError, ValueError):
            return None

    def ended(self, state: str, *, signal: str = "", action: str = "") -> RolloutRecord:
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
        )

    def changed_sources(self) -> list[str]:
        """The sources whose digest the rollout changed (`configmap/<name>`)."""
        return sorted(k for k, v in self.to.items() if self.before.get(k) != v)


def _str_map(value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        raise TypeError("not a mapping")
    return {str(k): str(v) for k, v in value.items()}


def _sign(hkey: bytes, identity: str, body: Mapping[str, Any]) -> str:
    text = orjson.dumps(dict(body), option=orjson.OPT_SORT_KEYS)
    who = identity.encode()
    msg = _RECORD_DOMAIN + len(who).to_bytes(4, "big") + who + text
    return hmac.digest(hkey, msg, "sha256").hex()


def workload_identity(obj: Mapping[str, Any]) -> str:
    """What a rollout record is signed over: the workload's kind, namespace and name (a record
    copied onto another workload is not believed)."""
    meta = obj.get("metadata") or {}
    return "/".join(str(x) for x in (obj.get("kind"), meta.get("namespace"), meta.get("name")))


def identity_of(kind: str, namespace: str, name: str) -> str:
    return f"{kind}/{namespace}/{name}"


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


def change_of(sid: SourceId, content: str) -> str:
    """The name of one change: a source by its kind and name, and its new content, keyed
    without the namespace (`content`: the source's digest under the digest key itself), so
    that the same content reaching workloads in several namespaces is one change."""
    return f"{sid}@{content[:20]}"


# --- following a rollout -------------------------------------------------------------------


@dataclass(frozen=True)
class Progress:
    state: str  # rolling, complete, failed
    signal: str = ""  # (failed) the signal, in a person's words


def _status_caught_up(obj: Mapping[str, Any]) -> bool:
    meta, status = obj.get("metadata") or {}, obj.get("status") or {}
    generation = meta.get("generation")
    return isinstance(generation, int) and status.get("observedGeneration", 0) >= generation


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _complete(how: str, obj: Mapping[str, Any]) -> bool | None:
    """Whether the workload's own status says its rolling update is complete (every updated
    pod Ready, none of the old left); None: it has no rolling update configpin can follow."""
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    strategy = (spec.get("updateStrategy") or {}).get("type")
    if how != "deployment" and strategy == "OnDelete":
        return None  # its pods change only when someone deletes them
    if not _status_caught_up(obj):
        return False
    if how == "deployment":
        want = _int(spec.get("replicas", 1))
        return (
            _int(status.get("updatedReplicas")) >= want
            and _int(status.get("replicas")) <= want
            and _int(status.get("readyReplicas")) >= want
        )
    if how == "statefulset":
        want = _int(spec.get("replicas", 1))
        rolling = (spec.get("updateStrategy") or {}).get("rollingUpdate") or {}
        partition = min(_int(rolling.get("partition")), want)
        return (
            _int(status.get("updatedReplicas")) >= want - partition
            and _int(status.get("readyReplicas")) >= want
        )
    if how == "daemonset":
        want = _int(status.get("desiredNumberScheduled"))
        return (
            _int(status.get("updatedNumberScheduled")) >= want
            and _int(status.get("numberReady")) >= want
        )
    return None


def _deadline_exceeded(obj: Mapping[str, Any]) -> str | None:
    """A Deployment's own signal: Progressing=False, ProgressDeadlineExceeded, for the
    generation it has now."""
    if not _status_caught_up(obj):
        return None
    for cond in (obj.get("status") or {}).get("conditions") or ():
        if (
            isinstance(cond, dict)
            and cond.get("type") == "Progressing"
            and cond.get("status") == "False"
            and cond.get("reason") == "ProgressDeadlineExceeded"
        ):
            seconds = (obj.get("spec") or {}).get("progressDeadlineSeconds", 600)
            message = str(cond.get("message") or "")[:200]
            return f"its progress deadline ({seconds} s) passed: {message}"
    return None


def _restarted(pods: Iterable[Mapping[str, Any]], record: RolloutRecord) -> str | None:
    """An updated pod (it carries the record rolled to) whose container restarted
    RESTART_LIMIT times or more: the new content keeps it from running."""
    for pod in pods:
        sources = digest_mapping(_annotations(pod).get(ANN_SOURCES))
        if sources != dict(record.to):
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


def assess(
    kind: WorkloadKind,
    obj: Mapping[str, Any],
    pods: Iterable[Mapping[str, Any]],
    record: RolloutRecord,
    now: float,
) -> Progress:
    """How the rollout `record` names is going on `obj` (as read now), its `pods` listed."""
    how = kind.rollout
    done = _complete(how, obj) if how is not None else None
    if done is None or done:
        return Progress(COMPLETE)
    restarted = _restarted(pods, record)
    if restarted is not None:
        return Progress(FAILED, restarted)
    if how == "deployment":
        exceeded = _deadline_exceeded(obj)
        if exceeded is not None:
            return Progress(FAILED, exceeded)
        return Progress(ROLLING)
    deadline = progress_deadline(obj)
    if now - record.since > deadline:
        return Progress(
            FAILED,
            f"its updated pods were not all Ready within {deadline:g} s ({ANN_PROGRESS_DEADLINE})",
        )
    return Progress(ROLLING)


def poll_after(
    kind: WorkloadKind, obj: Mapping[str, Any], record: RolloutRecord, now: float
) -> float:
    """How soon to look again at a rollout still going (its pods' restarts, a deadline)."""
    if kind.rollout != "deployment":
        left = record.since + progress_deadline(obj) - now
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
    """Ops that point the template back at the references it had before the rollout (the
    previous copies) and write configpin's record back to what it was; or why not: the
    template changed since configpin wrote it (an image, a command: not configpin's to take
    back), or a previous copy is not a copy configpin made of that source (`is_copy(source
    key, name)`)."""
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


# --- waves ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class WaveStep:
    count: int = 0  # this many workloads
    fraction: float = 0.0  # or this share of the rest


def parse_waves(text: str) -> tuple[WaveStep, ...] | None:
    """`--rollout-waves`: comma-separated counts (`1`) and shares of the rest (`10%`); `off`
    (None): every workload at once. A last step that leaves some out is followed by the rest.
    Raises ValueError saying what is wrong."""
    text = text.strip()
    if text.lower() == "off":
        return None
    steps: list[WaveStep] = []
    for raw in text.split(","):
        item = raw.strip()
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
                "e.g. 1,10%,100%; or off"
            ) from None
    if not steps:
        raise ValueError("no wave given: e.g. 1,10%,100%; or off")
    return tuple(steps)


def wave_sizes(total: int, steps: Sequence[WaveStep]) -> list[int]:
    sizes: list[int] = []
    left = total
    for step in steps:
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


def wave_plan(members: Iterable[Member], steps: Sequence[WaveStep] | None) -> list[list[Member]]:
    ordered = wave_order(members)
    if steps is None:
        return [ordered] if ordered else []
    plan: list[list[Member]] = []
    at = 0
    for size in wave_sizes(len(ordered), steps):
        plan.append(ordered[at : at + size])
        at += size
    return plan
