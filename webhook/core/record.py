"""The rollout record (`configpin.io/rollout`, on the workload's own metadata): what configpin
waits for when it rolls a workload, and the annotations that go with it.

Pure: every value is made from objects as read and the time given.

- `RolloutRecord`: the per-source digests it rolled to and from, the reference names the
  template had before (snapshot mode: the previous copies), when, which change(s) it belongs
  to (`Change`), whether the workload was healthy before, who made the change, and a
  fingerprint of the pod template as configpin wrote it. It is signed with the digest key over
  the workload's identity (`encode`, `decode`, through webhook.core.signed, which signs and
  opens every record of configpin's), so a record a tenant writes is not believed. `started`
  is the one place a record is made.
- `rolled_back`: whether someone else took the template back off the content rolled to;
  `readmitted`: the record of a re-stamp whose admission pinned other content than decided
  (the source moved on between decision and write), which is no one's rollback.
- The content rejected on a workload (`configpin.io/rejected`) and the ops that write
  configpin's annotations on the workload's own metadata (`record_ops`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, Final

import orjson

from webhook.core import digest
from webhook.core.constants import ANN_ON_FAILURE, ANN_REJECTED, ANN_ROLLOUT, ANN_SOURCES
from webhook.core.kinds import WorkloadKind
from webhook.core.model import PatchOp, SourceId, SourceKind
from webhook.core.names import pointer
from webhook.core.refs import find_sites, get_path
from webhook.core.signed import opened, signed

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


# How a rollout and what came of its failure are said, in one table each, which the Events
# (webhook.controller.report) and `configpin status` both read.
ROLLOUT_WORDS: Final[Mapping[State, str]] = {
    State.ROLLING: "a config rollout configpin follows is in progress",
    State.COMPLETE: "the config rollout configpin started is complete: every updated pod is Ready",
    State.FAILED: "the config rollout failed",
    State.LEFT: "its config rollout proves nothing about the change and leaves its waves",
}


@dataclass(frozen=True, slots=True)
class Words:
    short: str  # in a line (`configpin status`)
    full: str  # in an Event's note


ACTION_WORDS: Final[Mapping[Action, Words]] = {
    Action.UNDO: Words(
        "undone",
        "rolled back to the copies of the last content that completed; that content is "
        f"rejected for this workload ({ANN_REJECTED}): its next change rolls as usual",
    ),
    Action.HOLD: Words(
        "held",
        "nothing more is started for this change (changed in place, it cannot be brought "
        f"back), recorded in {ANN_REJECTED}; fix or revert the source (its next change rolls "
        "as usual) or `kubectl rollout undo` the workload",
    ),
    Action.NONE: Words("left as it is", f"no action ({ANN_ON_FAILURE}: none)"),
    Action.PERSON: Words(
        "kept as they left it; later waves stopped",
        "their template is kept as they left it, that content is rejected for this workload "
        f"({ANN_REJECTED}), and the later waves of this change are stopped; its next change "
        "rolls as usual",
    ),
}


def by_whom(by: str) -> str:
    """Who changed the content a rollout rolls to, as both say it (` (changed by alice at
    2026-...Z)`, ` (changed by unknown)`); "" when the record names no one."""
    return f" (changed by {by})" if by else ""


@dataclass(frozen=True, slots=True, order=True)
class Change:
    """One change: a source's new content (`content`: its short form, `digest.content_id`,
    under the digest key itself, so equal content anywhere is the same). A change is its
    namespace's own; `namespace` "" is a change shared across every namespace whose source of
    that name is marked `configpin.io/shared` and holds that content."""

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
        return cls("" if shared else namespace, sid, digest.content_id(content))

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


def annotations_of(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """The annotations on an object's own metadata ({} when it has none)."""
    meta = obj.get("metadata")
    value = meta.get("annotations") if isinstance(meta, dict) else None
    return value if isinstance(value, dict) else {}


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
    # the workload's metadata.generation as configpin's re-stamp stored it (0: not known):
    # while it stands, nothing but that write changed its spec (`readmitted`)
    generation: int = 0
    # (under --rollout-waves) the wave it started in, from 1, and how many its first change
    # (`changes[0]`) had
    wave: tuple[int, int] | None = None

    def _body(self) -> dict[str, Any]:
        body: dict[str, Any] = {
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
        if self.generation:  # (a record without one reads as before it)
            body["generation"] = self.generation
        if self.wave is not None:
            body["wave"] = list(self.wave)
        return body

    def encode(self, hkey: bytes, identity: str) -> str:
        return signed(hkey, _RECORD_DOMAIN, identity, self._body())

    @classmethod
    def decode(cls, hkey: bytes, identity: str, text: Any) -> RolloutRecord | None:
        """The record a workload carries, when configpin wrote it for this very workload
        (`identity`: `workload_identity`); None for anything else."""
        body = opened(hkey, _RECORD_DOMAIN, identity, text, 64 * 1024)
        if body is None:
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
                generation=_count(body.get("generation", 0)),  # (records before it: 0)
                wave=_wave(body.get("wave")),
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
            self.generation,
            self.wave,
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


def _count(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise TypeError("not a count")
    return value


def _wave(value: Any) -> tuple[int, int] | None:
    """A record's wave n of m ([n, m]; None: none, as records before it)."""
    if value is None:
        return None
    if not isinstance(value, list) or len(value) != 2:
        raise TypeError("not a wave")
    n, m = _count(value[0]), _count(value[1])
    if not 1 <= n <= m:
        raise ValueError("not a wave")
    return n, m


def generation_of(obj: Mapping[str, Any]) -> int:
    """The object's metadata.generation (0: none): the API server counts its spec's changes."""
    meta = obj.get("metadata")
    value = meta.get("generation") if isinstance(meta, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _str_map(value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        raise TypeError("not a mapping")
    return {str(k): str(v) for k, v in value.items()}


def identity(kind: str, namespace: str, name: str) -> str:
    """What a rollout record is signed over: the workload's kind, namespace and name (a record
    copied onto another workload is not believed)."""
    return f"{kind}/{namespace}/{name}"


def workload_identity(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return identity(str(obj.get("kind")), str(meta.get("namespace")), str(meta.get("name")))


def rollout_record(hkey: bytes, obj: Mapping[str, Any]) -> RolloutRecord | None:
    return RolloutRecord.decode(hkey, workload_identity(obj), annotations_of(obj).get(ANN_ROLLOUT))


def rejected(obj: Mapping[str, Any]) -> dict[str, str]:
    """The content rollouts of this workload failed with (per-source digests)."""
    value = digest_mapping_any(annotations_of(obj).get(ANN_REJECTED))
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


def readmitted(
    kind: WorkloadKind, obj: Mapping[str, Any], record: RolloutRecord
) -> RolloutRecord | None:
    """`record` as the rollout its own write started, where that write's admission pinned
    other content than configpin decided: the source moved on between the decision and the
    write, and admission stamps what it resolves then. Its spec is still as that write stored
    it (its generation has not moved since: any other change of the spec, a person's
    `kubectl rollout undo` among them, counts one more), so what the template names is what
    configpin rolls there, newer content than decided: `to` takes it. None where the template
    names what the record rolled to, or where the spec changed since (`rolled_back` judges)."""
    if not record.generation or generation_of(obj) != record.generation:
        return None
    names = template_sources(kind, obj)
    if names is None:
        return None
    to = {k: names.get(k, v) for k, v in record.to.items()}
    if to == dict(record.to):
        return None
    return replace(record, to=to)


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
    generation: int = 0,
    wave: tuple[int, int] | None = None,
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
    that second write. `generation`: the workload's metadata.generation as read for a write
    that changes its pod template (0: not known); the record keeps the one that write
    stores (`readmitted`). `wave`: (under waves) the wave it starts in, of how many."""
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
        generation=generation + 1 if generation else 0,
        wave=wave,
    )


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
