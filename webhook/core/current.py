"""Whether a workload is current: what the controller keeps of each workload (its index
entry, compactly: tens of thousands are held) and the test of which sources it is stale for.

Per workload the entry keeps only what the controller decides with: its key, what it
consumes of which source (the keys, and whether it is required), the digests it recorded
(`configpin.io/observed`, else the template's `configpin.io/sources`) and what safe delivery
needs to know of it. A workload's whole object is read again, fresh, only when it must be
patched.

`stale_sources` mirrors `plan_object`'s rules, so that the index and the planner agree on
what "current" means: a source needs action when the digest of what the workload consumes
of it now differs from the digest the workload recorded for it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import orjson

from webhook.core import digest
from webhook.core.budget import NO_LIMITS, Limits, limits_of
from webhook.core.constants import (
    ANN_HELD,
    ANN_OBSERVED,
    ANN_REFRESHED,
    ANN_REJECTED,
    ANN_ROLLED_AT,
    ANN_ROLLOUT,
    ANN_ROLLOUT_WAVES,
    ANN_SOURCES,
    ANN_WAVE,
    LABEL_SNAPSHOT,
    MODE_CHECKSUM,
    MODE_OFF,
    ON_CHANGE_REFRESH,
)
from webhook.core.extra import extra_sources, with_extra
from webhook.core.kept import parse_mapping
from webhook.core.kinds import template_paths, workload_kind, workload_ref
from webhook.core.model import JSONObject, SourceId, SourceKind, SourceRecord
from webhook.core.modes import effective_mode, on_change_policy
from webhook.core.owners import left_to_owner
from webhook.core.plan import MAX_SOURCES
from webhook.core.progress import Replicas, Standing, replicas, standing
from webhook.core.reasons import SkipReason
from webhook.core.record import (
    Action,
    Change,
    RolloutRecord,
    State,
    generation_of,
    readmitted,
    rejected,
    rollout_record,
)
from webhook.core.refs import consumption, find_sites, get_path, unrefreshable
from webhook.core.reloader import ReloaderAsks, reloader_asks
from webhook.core.times import parse_time
from webhook.core.waves import asks_approval, wave_of


@dataclass(frozen=True, slots=True, order=True)
class WorkloadRef:
    kind: str
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class Consumed:
    source: SourceId
    keys: frozenset[str] | None  # None: every key
    required: bool


@dataclass(frozen=True, slots=True)
class RolloutBrief:
    """What the index keeps of a workload's rollout record (the rest is read with the object):
    how it stands, which change(s) it belongs to, whether the workload vouches for them.
    Shared by every workload of a change."""

    state: State
    changes: tuple[Change, ...]
    healthy: bool
    # what it rolled to, for the sources it changed (`configmap/<name>`, digest): a change of
    # the same source whose content there is the same (a write of keys it does not read) is
    # carried by this rollout, not rolled again (webhook.controller.wavecut.WaveCut.rollout_for)
    to: tuple[tuple[str, str], ...] = ()
    action: Action | None = None  # (failed) what came of it: undone, held, left, a person's
    signal: str = ""  # (failed) its signal, as the record says it (its pods: progress.signal_pods)

    def rolled_to(self, source: str) -> str | None:
        """The digest it rolled `source` (`configmap/<name>`) to, if it changed it."""
        for key, value in self.to:
            if key == source:
                return value
        return None


@dataclass(frozen=True, slots=True)
class Delivery:
    """What safe delivery keeps of a workload (webhook.core.record, progress, waves),
    compactly: only a workload with something to say has one (a record, rejected content, a
    wave, a standing other than healthy, a paused rollout)."""

    rollout: RolloutBrief | None
    rejected: tuple[tuple[str, str], ...] | None
    wave: int
    standing: Standing = Standing.HEALTHY
    paused: bool = False  # a paused Deployment: its rollout holds no place (--max-rolling)
    # on-change: refresh (as honoured): the sources a change of which reaches its running
    # pods in place (whole-volume mounts only), as `configmap/<name>`; None: it rolls
    refreshes: frozenset[str] | None = None
    approve: bool = False  # its own wave list holds approve: each change waits for approval
    limits: Limits | None = None  # its own rollout windows and budget, and its starts


# A workload with nothing else to say than how it stands (scaled to zero, unavailable): one
# shared Delivery each, not one per workload.
_STANDING_ONLY: Final = {s: Delivery(None, None, 0, s) for s in Standing}

_BRIEFS_MAX: Final = 4096  # (plain dicts, as digest._memo says why)
_Rolled = tuple[tuple[str, str], ...]  # (source, digest) rolled to
_BriefKey = tuple[State, tuple[Change, ...], bool, _Rolled, Action | None, str]
_briefs: dict[_BriefKey, RolloutBrief] = {}


def _brief(record: RolloutRecord | None) -> RolloutBrief | None:
    """One RolloutBrief per (state, changes, healthy, content rolled to, action, a failure's
    signal), bounded like `_how`."""
    if record is None:
        return None
    to = tuple((k, record.to[k]) for k in record.changed_sources())
    signal = record.signal if record.state is State.FAILED else ""
    key = (record.state, record.changes, record.healthy, to, record.action, signal)
    found = _briefs.get(key)
    if found is None:
        if len(_briefs) >= _BRIEFS_MAX:
            _briefs.clear()
        brief = RolloutBrief(
            record.state, record.changes, record.healthy, to, record.action, signal
        )
        found = _briefs.setdefault(key, brief)
    return found


_DIGEST_SIZE: Final = 32  # a source digest (sha256 hex in the annotations) as raw bytes
_NONE: Final = bytes(_DIGEST_SIZE)
_KINDS: Final = {k.value: k for k in SourceKind}
# (keys, required) pairs, shared by every consumption that reads the same keys the same way;
# bounded (a flood of distinct key sets only stops the sharing, never grows it past this).
_HOWS_MAX: Final = 4096
# (Typed Any, not as the tuple it is: the compiled core passes a fixed-length tuple unboxed
# and boxes it again where it is stored, a new object each time, which would share nothing.)
_hows: dict[Any, Any] = {}


def _how(keys: frozenset[str] | None, required: bool) -> Any:
    key: Any = (keys, required)
    found = _hows.get(key)
    if found is None:
        if len(_hows) >= _HOWS_MAX:
            _hows.clear()
        if keys is not None:
            key = (frozenset(sys.intern(k) for k in keys), required)
        found = _hows.setdefault(key, key)
    return found


def _source_id(text: str) -> SourceId:
    kind, _, name = text.partition("/")
    return SourceId(_KINDS[kind], name)


def _packed(value: str) -> bytes | None:
    """The raw bytes of a digest as the annotations write it (64 lowercase hex), else None."""
    if len(value) != 2 * _DIGEST_SIZE:
        return None
    try:
        raw = bytes.fromhex(value)
    except ValueError:
        return None
    return raw if raw != _NONE and raw.hex() == value else None


class WorkloadEntry:
    """What the controller keeps of one workload, compactly: tens of thousands are held.

    `uses` alternates the text of each consumed source (`configmap/<name>`, the key of the
    records) with its (keys, required) pair, shared between workloads; `digests` packs, in
    the same order, the raw digest recorded for each consumed source (zeros: none, or one
    that `extra` holds); `extra` holds the recorded pairs that do not fit there (a snapshot's
    source, a source no longer consumed, a value that is not a digest). `consumes` and
    `recorded` give them back as the planner's types."""

    __slots__ = (
        "delivery",
        "digests",
        "extra",
        "generation",
        "held",
        "pods",
        "ref",
        "refreshed",
        "reloader",
        "replicas",
        "restamp_rv",
        "rolled_at",
        "stamped",
        "uses",
    )

    def __init__(
        self,
        ref: WorkloadRef,
        consumes: Iterable[Consumed],
        recorded: Mapping[str, str],
        rolled_at: float | None = None,
        stamped: bool = True,  # it carries a record (admitted by configpin, or a baseline), even {}
        # on-change: refresh (as honoured: not in snapshot mode) and the record of what its
        # pods were last refreshed to; `pods` fingerprints its status, which moves as pods
        # come and go (a scale-up, a replaced pod), so that a new pod is brought to the
        # refreshed content.
        refreshed: Mapping[str, str] | None = None,
        pods: int = 0,
        # The resourceVersion it was indexed at, where a change can be re-stamped from this
        # entry alone (`plan.restamp_from_consumption`: checksum mode, on-change roll, its
        # record on its template: no `configpin.io/observed`); None: the controller reads the
        # object first. Not part of what the entry says (equality): a status update changes
        # only this.
        restamp_rv: str | int | None = None,
        # Safe delivery, where there is anything to say (most workloads: None): the rollout
        # configpin follows or last followed, the content it rejected, its wave.
        delivery: Delivery | None = None,
        # Its metadata.generation at `restamp_rv` (0: none kept), which the rollout record of
        # a re-stamp planned from the entry alone says its write made (+1). Not part of what
        # the entry says either.
        generation: int = 0,
        # It carries `configpin.io/held` (what the controller says of a hold there, for GitOps
        # tools' health checks; a hold is decided again where a client took it away). Not part
        # of what the entry says either: writing it moves nothing configpin decides by.
        held: bool = False,
        # What it asks of Stakater Reloader (webhook.core.reloader; checksum mode only): the
        # changes Reloader rolls it for are left to Reloader. None for nearly every workload.
        reloader: ReloaderAsks | None = None,
        # Its updated, ready and desired pods (progress.replicas, shared), which its
        # ConfigRollout shows while it is a member not done. Not part of what the entry says.
        replicas: Replicas | None = None,
    ) -> None:
        uses: list[object] = []
        packed: list[bytes] = []
        left = dict(recorded)
        for c in consumes:
            text = str(c.source)
            uses += (text, _how(c.keys, c.required))
            raw = _packed(left[text]) if text in left else None
            if raw is not None:
                del left[text]
            packed.append(raw or _NONE)
        self.ref = ref
        self.uses: tuple[Any, ...] = tuple(uses)
        self.digests = b"".join(packed)
        self.extra: tuple[tuple[str, str], ...] | None = tuple(left.items()) or None
        self.rolled_at = rolled_at
        self.stamped = stamped
        self.refreshed = refreshed
        self.pods = pods
        self.restamp_rv = restamp_rv
        self.delivery = delivery
        self.generation = generation
        self.held = held
        self.reloader = reloader
        self.replicas = replicas

    def _fields(self) -> tuple[object, ...]:
        return (
            self.ref,
            self.uses,
            self.digests,
            self.extra,
            self.rolled_at,
            self.stamped,
            self.refreshed,
            self.pods,
            self.delivery,
            self.reloader,
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, WorkloadEntry):
            return NotImplemented
        return self._fields() == other._fields()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"WorkloadEntry({self.ref!r}, consumes={self.consumes!r}, "
            f"recorded={self.recorded!r}, rolled_at={self.rolled_at!r}, "
            f"stamped={self.stamped!r}, refreshed={self.refreshed!r}, pods={self.pods!r}, "
            f"restamp_rv={self.restamp_rv!r}, delivery={self.delivery!r}, held={self.held!r})"
        )

    @property
    def rollout(self) -> RolloutBrief | None:
        return self.delivery.rollout if self.delivery is not None else None

    @property
    def rolling(self) -> bool:
        """A config rollout configpin started is in progress here (it follows it)."""
        brief = self.delivery.rollout if self.delivery is not None else None
        return brief is not None and brief.state is State.ROLLING

    @property
    def standing(self) -> Standing:
        return self.delivery.standing if self.delivery is not None else Standing.HEALTHY

    @property
    def paused(self) -> bool:
        return self.delivery is not None and self.delivery.paused

    @property
    def rejected(self) -> Mapping[str, str]:
        found = self.delivery.rejected if self.delivery is not None else None
        return dict(found) if found else {}

    @property
    def wave(self) -> int:
        return self.delivery.wave if self.delivery is not None else 0

    @property
    def limits(self) -> Limits:
        found = self.delivery.limits if self.delivery is not None else None
        return found if found is not None else NO_LIMITS

    @property
    def consumes(self) -> tuple[Consumed, ...]:
        uses = self.uses
        return tuple(Consumed(_source_id(uses[i]), *uses[i + 1]) for i in range(0, len(uses), 2))

    @property
    def recorded(self) -> dict[str, str]:
        """ "configmap/<name>" -> the digest it was last brought up to date with."""
        out = {}
        uses, digests, size = self.uses, self.digests, _DIGEST_SIZE
        for j in range(len(digests) // size):
            raw = digests[j * size : (j + 1) * size]
            if raw != _NONE:
                out[uses[2 * j]] = raw.hex()
        if self.extra:
            out.update(self.extra)
        return out

    def recorded_for(self, text: str) -> str | None:
        """The digest recorded for one source (`configmap/<name>`), if any."""
        uses, size = self.uses, _DIGEST_SIZE
        for i in range(0, len(uses), 2):
            if uses[i] == text:
                raw = self.digests[i // 2 * size : (i // 2 + 1) * size]
                if raw != _NONE:
                    return raw.hex()
                break
        for key, value in self.extra or ():
            if key == text:
                return value
        return None

    def index_texts(self) -> set[str]:
        """The sources whose change concerns this workload, as `configmap/<name>`: those it
        names, and those it recorded (a template pointing at a snapshot records the
        snapshot's source)."""
        texts = set(self.uses[::2])
        for key, _ in self.extra or ():
            kind, slash, _name = key.partition("/")
            if slash and kind in _KINDS:
                texts.add(key)
        return texts


def _annotations(meta: Any) -> Mapping[str, Any]:
    value = meta.get("annotations") if isinstance(meta, dict) else None
    return value if isinstance(value, dict) else {}


def entry_from_object(
    obj: JSONObject, default_mode: str, max_sources: int = MAX_SOURCES, hkey: bytes | None = None
) -> WorkloadEntry | SkipReason:
    """The index entry of a workload, or why the controller leaves it alone."""
    kind = str(obj.get("kind", ""))
    known = workload_kind(kind)
    if known is None or not known.rolls:
        # Pods and Jobs: their templates are immutable (a Job keeps the config it was
        # created with; its CronJob's jobTemplate is re-stamped)
        return SkipReason.NOT_HANDLED if known is None else SkipReason.FIXED_TEMPLATE
    paths = template_paths(kind)
    assert paths is not None
    meta = obj.get("metadata") or {}
    if (meta.get("labels") or {}).get(LABEL_SNAPSHOT) == "true":
        return SkipReason.OWN_COPY
    if left_to_owner(obj) is not None:
        return SkipReason.OWNED
    if workload_ref(obj) is not None:
        return SkipReason.WORKLOAD_REF  # a Rollout's workloadRef: its Deployment is indexed
    mode, _ = effective_mode(obj, default_mode)
    if mode == MODE_OFF:
        return SkipReason.MODE_OFF
    pod_spec = get_path(obj, paths[1])
    if not isinstance(pod_spec, dict):
        return SkipReason.NO_POD_SPEC
    consumed = with_extra(consumption(find_sites(pod_spec)), extra_sources(obj)[0])
    consumes = [Consumed(sid, c.keys, c.required) for sid, c in consumed.items()]
    if not consumes:
        return SkipReason.NO_SOURCES
    if len(consumes) > max_sources:
        return SkipReason.TOO_MANY_SOURCES  # admission left it unpinned too
    recorded = parse_mapping(_annotations(meta).get(ANN_OBSERVED))
    if recorded is None:
        recorded = parse_mapping(_annotations(get_path(obj, paths[0])).get(ANN_SOURCES))
    stamped = recorded is not None
    recorded = recorded or {}
    ref = WorkloadRef(kind, sys.intern(str(meta.get("namespace", ""))), str(meta.get("name", "")))
    rolled_at = parse_time(_annotations(meta).get(ANN_ROLLED_AT))
    refreshed = None
    pods = 0
    refreshes = on_change_policy(obj, mode)[0] == ON_CHANGE_REFRESH
    if refreshes:
        refreshed = parse_mapping(_annotations(meta).get(ANN_REFRESHED))
        if refreshed is not None:
            pods = hash(orjson.dumps(obj.get("status"), option=orjson.OPT_SORT_KEYS))
    restamp_rv, generation = None, 0
    if mode == MODE_CHECKSUM and not refreshes and ANN_OBSERVED not in _annotations(meta):
        restamp_rv = _compact_version(meta.get("resourceVersion"))
        generation = generation_of(obj)
    delivery = None
    own = _annotations(meta)
    stands = standing(known, obj)
    paused = (obj.get("spec") or {}).get("paused") is True
    in_place = None
    if refreshes:
        blocked = unrefreshable(pod_spec, [c.source for c in consumes])
        in_place = frozenset(str(c.source) for c in consumes if c.source not in blocked)
    approve = ANN_ROLLOUT_WAVES in own and asks_approval(obj)
    limits = limits_of(obj, hkey)
    if (
        ANN_ROLLOUT in own
        or ANN_REJECTED in own
        or ANN_WAVE in own
        or paused
        or refreshes
        or approve
        or limits is not None
    ):
        record = rollout_record(hkey, obj) if hkey is not None else None
        if record is not None and record.state is State.ROLLING:
            # (a re-stamp admitted with newer content than decided rolls that content:
            # the waves count it so before the controller amends its record)
            record = readmitted(known, obj, record) or record
        refused = tuple(sorted(rejected(obj).items())) or None
        delivery = Delivery(
            _brief(record), refused, wave_of(obj), stands, paused, in_place, approve, limits
        )
    elif stands is not Standing.HEALTHY:
        delivery = _STANDING_ONLY[stands]
    return WorkloadEntry(
        ref,
        consumes,
        recorded,
        rolled_at,
        stamped,
        refreshed,
        pods,
        restamp_rv,
        delivery,
        generation,
        ANN_HELD in own,
        reloader_asks(kind, obj, pod_spec) if mode == MODE_CHECKSUM else None,
        replicas(known, obj),
    )


def _compact_version(value: Any) -> str | int | None:
    """A resourceVersion as kept in the index: opaque text, held as an int where it reads back
    as the same text (etcd's are: half the memory of the string)."""
    if not isinstance(value, str) or not value:
        return None
    if value.isascii() and value.isdigit() and str(int(value)) == value:
        return int(value)
    return value


def appeared(entry: WorkloadEntry, stale: Iterable[SourceId]) -> set[SourceId]:
    """Of `stale`, the sources the workload requires by their own name but never recorded
    although configpin admitted it: they did not exist then (a warning said so), so no pod
    of it could start before they did. (A workload that carries no record at all was
    admitted while configpin was unreachable: nothing can be told of it.)"""
    if not entry.stamped:
        return set()
    recorded = entry.recorded
    required = {c.source for c in entry.consumes if c.required}
    return {sid for sid in stale if sid in required and str(sid) not in recorded}


def newly_named(
    entry: WorkloadEntry, stale: Iterable[SourceId], named: Iterable[SourceId]
) -> set[SourceId]:
    """Of `stale`, the sources `configpin.io/extra-sources` names (`named`, webhook.core.extra)
    that the workload never recorded although configpin admitted it: named since (an edit of
    the annotation alone leaves its template, and the record there, as it was)."""
    if not entry.stamped:
        return set()
    recorded, names = entry.recorded, set(named)
    return {sid for sid in stale if sid in names and str(sid) not in recorded}


Lookup = Callable[[SourceId], SourceRecord | None]


def consumption_of(entry: WorkloadEntry, sid: SourceId, lookup: Lookup) -> Consumed | None:
    """What `entry` reads of source `sid`, by its own name or through a snapshot copy of it
    (as `lookup` holds the copy); None: it does not read it."""
    uses = entry.uses
    for i in range(0, len(uses), 2):
        key = _source_id(uses[i])
        if key != sid:
            if key.kind is not sid.kind or not key.name.startswith(sid.name + "-"):
                continue
            copy = lookup(key)
            if copy is None or copy.snapshot_of != sid.name:
                continue
        return Consumed(sid, *uses[i + 1])
    return None


def consumed_digest(entry: WorkloadEntry, sid: SourceId, lookup: Lookup, hkey: bytes) -> str | None:
    """The digest of what `entry` reads of source `sid` (`consumption_of`) as `lookup` holds
    the source now, as `stale_sources` takes it; None: it does not read it, or the source does
    not exist (or is ignored)."""
    consumed = consumption_of(entry, sid, lookup)
    if consumed is None:
        return None
    record = lookup(sid)
    if record is None or record.ignored:
        return None
    nskey = digest.namespace_key(hkey, entry.ref.namespace)
    return digest.source_digest(nskey, record, consumed.keys)


def stale_sources(entry: WorkloadEntry, lookup: Lookup, hkey: bytes) -> set[SourceId]:
    """The sources whose current consumed digest differs from the one the workload recorded.

    Left out, as `plan_object` leaves them unrecorded: a required source that does not exist
    (rolling would only make pods that cannot start), an ignored one, and the source of a
    snapshot when that source is gone. An optional source that does not exist is "absent".
    A template pointing at a snapshot is compared through the snapshot's source: a rollback
    to an older snapshot is current as long as the source is what the workload observed.
    """
    stale: set[SourceId] = set()
    rejected = entry.rejected
    root, hkey = hkey, digest.namespace_key(hkey, entry.ref.namespace)
    uses, digests, size = entry.uses, entry.digests, _DIGEST_SIZE
    for i in range(0, len(uses), 2):
        text = uses[i]
        keys, required = uses[i + 1]
        key = _source_id(text)
        record = lookup(key)
        if record is not None and record.snapshot_of is not None:
            key = SourceId(record.kind, record.snapshot_of)
            record = lookup(key)
            if record is None:
                continue
            recorded = entry.recorded_for(str(key))
        else:
            raw = digests[i // 2 * size : (i // 2 + 1) * size]
            recorded = raw.hex() if raw != _NONE else entry.recorded_for(text)
        if record is None:
            if required:
                continue
            current = digest.ABSENT
        elif record.ignored:
            continue
        else:
            current = digest.source_digest(hkey, record, keys)
        if recorded == current or (rejected and rejected.get(str(key)) == current):
            continue  # current, or content a rollout of it failed with: never rolled to again
        if record is not None and recorded == digest.source_digest(root, record, keys):
            # Recorded by a version whose digests were not bound to the namespace, for the
            # content there is now: current. Upgrading rolls nothing; the next change
            # records the new digest.
            continue
        stale.add(key)
    return stale
