"""Plan the mutation of one object: the decision shared by admission and the controller.

Input is the object as a plain dict and a lookup for sources; output is a `Plan` with a
small JSON patch built directly (no whole-object diff), the warnings to return, and the
snapshots that must exist. No change, no patch. What the workload asks for (its mode, its
on-change policy) is read by webhook.core.modes; what configpin keeps on it across writes by
webhook.core.kept; the controller's re-stamp planned from the index alone is here too
(`restamp_from_consumption`: the same per-source rules).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from webhook.core import digest
from webhook.core.constants import (
    ANN_CHECKSUM,
    ANN_MODE,
    ANN_OBSERVED,
    ANN_REFRESHED,
    ANN_REJECTED,
    ANN_ROLLED_AT,
    ANN_ROLLOUT,
    ANN_SOURCES,
    LABEL_SNAPSHOT,
    MODE_CHECKSUM,
    MODE_OFF,
    MODE_SNAPSHOT,
    ON_CHANGE_ROLL,
    SERVICE_ACCOUNT_TOKEN_TYPE,
)
from webhook.core.extra import extra_sources, with_extra
from webhook.core.kept import (
    annotation_ops,
    dumps_mapping,
    kept_record,
    meta_annotations,
    parse_mapping,
    recorded_observed,
    rejected_kept,
    rollout_kept,
    starts_kept,
)
from webhook.core.kinds import (
    POD,
    Path,
    fixed_template,
    kind_matches,
    template_paths,
    workload_kind,
    workload_ref,
)
from webhook.core.model import (
    JSONObject,
    PatchOp,
    Plan,
    SnapshotRequest,
    SourceId,
    SourceRecord,
    SourceUnavailable,
)
from webhook.core.modes import effective_mode, on_change_policy
from webhook.core.names import SUFFIX_LEN, pointer, snapshot_name
from webhook.core.owners import left_to_owner
from webhook.core.progress import Standing, standing
from webhook.core.reasons import SkipReason
from webhook.core.record import (
    Change,
    RolloutRecord,
    State,
    identity,
    rejected,
    started,
    workload_identity,
)
from webhook.core.refs import Consumption, consumption, find_sites, get_path, source_key

Lookup = Callable[[SourceId], SourceRecord | None]
"""Returns the record of a source, None when it does not exist; raises SourceUnavailable."""

MAX_SOURCES: Final = 100
"""Default limit of distinct ConfigMaps/Secrets one object may consume and still be pinned:
beyond it the object is admitted unpinned with a warning, so that one hostile object cannot
cost every replica lookups, digests and memory in proportion to its size."""


_NOTHING: Final[Mapping[str, str]] = {}


class _Builder:
    """The plan being built (a plain class: one per admission, and a dataclass's default
    factories cost the compiled core a call each)."""

    def __init__(self, spec_path: Path, warnings: list[str] | None = None) -> None:
        self.spec_path = spec_path
        self.patch: list[PatchOp] = []
        self.warnings: list[str] = [] if warnings is None else warnings
        self.problems: list[str] = []
        self.snapshots: dict[str, SnapshotRequest] = {}
        self.sources: dict[str, str] = {}
        self.observed: dict[str, str] = {}
        self.missing_required = False
        # An UPDATE of a workload (safe delivery; empty otherwise): the template's own record
        # to keep where a person took it back off a rollout in progress (checksum mode), the
        # content rejected there, where its references pointed before, the changes it rolls
        # back to rejected content (`_plan_live`).
        self.kept: Mapping[str, str] = _NOTHING
        self.rejected: Mapping[str, str] = _NOTHING
        self.old_spec: dict[str, Any] | None = None
        self.old_sources: Mapping[str, str] = _NOTHING
        self.previous: Mapping[str, str] = _NOTHING
        self.lookup: Lookup | None = None
        self.root = b""
        self.namespace = ""
        self.to_rejected: list[Change] = []

    def point_at(self, cons: Consumption, name: str) -> None:
        for site in cons.sites:
            if site.source.name != name:
                self.patch.append(
                    {"op": "replace", "path": pointer(self.spec_path + site.path), "value": name}
                )


def _recorded_key(sid: SourceId, existing: Mapping[str, str]) -> str | None:
    """The key under which `existing` records `sid`: its own, or, for what looks like one
    of our snapshots (`<source>-<10 hex>`), its source's."""
    key = source_key(sid)
    if key in existing:
        return key
    head, sep, suffix = sid.name.rpartition("-")
    if sep and len(suffix) == SUFFIX_LEN and all(c in "0123456789abcdef" for c in suffix):
        key = str(SourceId(sid.kind, head))
        if key in existing:
            return key
    return None


def _delivery(
    b: _Builder,
    obj: JSONObject,
    old: JSONObject,
    root: bytes,
    namespace: str,
    mode: str,
    existing: Mapping[str, str],
    previous: Mapping[str, str],
    lookup: Lookup,
) -> None:
    """What an UPDATE of a workload must keep of safe delivery (see `plan_object`), into `b`:
    nothing to look at for most (no record, no rejected content: two dict lookups)."""
    own, had = meta_annotations(obj.get("metadata")), meta_annotations(old.get("metadata"))
    if ANN_REJECTED in own or ANN_REJECTED in had:
        b.rejected = {**rejected(old), **rejected(obj)}  # (kept: `rejected_kept`)
        spec = get_path(old, b.spec_path)
        b.old_spec = spec if isinstance(spec, dict) else None
        meta = get_path(old, (*b.spec_path[:-1], "metadata"))
        b.old_sources = parse_mapping(meta_annotations(meta).get(ANN_SOURCES)) or {}
        b.previous, b.lookup, b.root, b.namespace = previous, lookup, root, namespace
    if mode == MODE_SNAPSHOT or ANN_ROLLOUT not in had:
        return
    record = RolloutRecord.decode(root, workload_identity(old), had.get(ANN_ROLLOUT))
    if record is None or record.state is not State.ROLLING:
        return
    # A person took the template back off the content configpin is rolling to (`kubectl
    # rollout undo` restores the template's record of before): kept, for the controller to
    # judge as their verdict, never stamped forward again over their head. (Snapshot mode
    # keeps it anyway: its references point at the older copies.)
    kept = {
        k: existing[k]
        for k in record.changed_sources()
        if k in existing and existing[k] == record.before.get(k)
    }
    if kept:
        b.kept = kept


def _keep_last_good(b: _Builder, cons: Consumption, key: str, hkey: bytes) -> bool:
    """Snapshot mode, the source's content rejected on this workload: point its references
    back at the copy they named before this UPDATE (a re-apply names the source itself), when
    that is a copy of this source with other content. True when it did."""
    sid, lookup = cons.source, b.lookup
    if b.old_spec is None or lookup is None:
        return False
    paths = {site.path for site in cons.sites}
    for site in find_sites(b.old_spec):
        name = site.source.name
        if site.path not in paths or site.source.kind != sid.kind or name == sid.name:
            continue
        try:
            snap = lookup(site.source)
        except SourceUnavailable:
            continue
        if snap is None or snap.snapshot_of != sid.name:
            continue
        good = digest.source_digest(hkey, snap, cons.keys)
        if good == b.rejected.get(key):
            continue
        b.sources[key] = good
        b.observed[key] = b.previous.get(key, good)
        b.snapshots[name] = SnapshotRequest(sid, name, digest.source_digest(hkey, snap))
        b.point_at(cons, name)
        b.warnings.append(
            f"{sid}: its content now was rejected for this workload (a rollout of it failed, "
            f"{ANN_REJECTED}): kept on {name}, the copy it ran; remove {ANN_REJECTED} from the "
            "workload to roll to it anyway"
        )
        return True
    return False


def _followed(
    b: _Builder, obj: JSONObject, old: JSONObject, root: bytes, namespace: str, now: float
) -> str:
    """The record of the rollout an UPDATE starts to content rejected on the workload (a
    re-apply where no last good copy can be kept): followed like any other, so that its
    failure holds it again and its completion shows the content works there after all."""
    kind = workload_kind(str(obj.get("kind", "")))
    assert kind is not None
    record = started(
        kind,
        None,
        None,
        to=b.sources,
        before=b.old_sources,
        changes=b.to_rejected,
        now=now,
        healthy=standing(kind, old) is Standing.HEALTHY,
        empty=standing(kind, obj) is Standing.EMPTY,
    )
    name = str((obj.get("metadata") or {}).get("name") or "")
    return record.encode(root, identity(kind.kind, namespace, name))


def plan_object(
    obj: JSONObject,
    *,
    hkey: bytes,
    lookup: Lookup,
    default_mode: str = MODE_CHECKSUM,
    operation: str = "CREATE",
    old: JSONObject | None = None,
    refresh: Collection[SourceId] = (),
    namespace: str | None = None,
    max_sources: int = MAX_SOURCES,
    allow_snapshots: bool = True,
    now: float | None = None,
) -> Plan:
    """Decide how `obj` must change so that it pins and records the sources it consumes.

    `allow_snapshots` False: a workload that asks for snapshot mode gets checksum mode and
    a warning (the server may not write copies).
    `namespace`: where the object lives (default: its metadata's, else "default"). Digests
    are keyed for that namespace (`digest.namespace_key`).

    `refresh` (controller): sources whose change the workload must now follow even where its
    template points at a snapshot of older content (a rollback is kept otherwise).

    An UPDATE of a workload keeps safe delivery's facts (`_delivery`): the rollout record it
    carries (a client that drops it or puts an older one back, as `kubectl rollout undo` does
    with the old ReplicaSet's annotations, does not rewind it), a person's rollback of a
    rollout in progress, and content rejected there (kept on the last good copy in snapshot
    mode; otherwise the rollout it causes is followed: a record is written, `now` its start).
    """
    kind = str(obj.get("kind", ""))
    paths = template_paths(kind)
    if paths is None:
        return Plan(skipped=SkipReason.NOT_HANDLED)
    meta = obj.get("metadata") or {}
    if (meta.get("labels") or {}).get(LABEL_SNAPSHOT) == "true":
        return Plan(skipped=SkipReason.OWN_COPY)
    if not kind_matches(obj):
        return Plan(skipped=SkipReason.OTHER_GROUP)
    if left_to_owner(obj) is not None:  # its owner's template decides
        return Plan(skipped=SkipReason.OWNED)
    if workload_ref(obj) is not None:
        return Plan(skipped=SkipReason.WORKLOAD_REF)  # the referenced workload's template
    if operation != "CREATE" and fixed_template(kind):
        return Plan(skipped=SkipReason.FIXED_TEMPLATE)
    mode, mode_warning = effective_mode(obj, default_mode)
    warnings = [mode_warning] if mode_warning else []
    if mode == MODE_SNAPSHOT and not allow_snapshots:
        warnings.append(
            f"{ANN_MODE}: snapshot mode is not enabled on this configpin (it may not write "
            "ConfigMaps or Secrets): checksum mode used"
        )
        mode = MODE_CHECKSUM
    if mode == MODE_OFF:
        return Plan(warnings=warnings, mode=mode, skipped=SkipReason.MODE_OFF)
    on_change = ON_CHANGE_ROLL
    if not fixed_template(kind):  # a Pod or Job is never rolled or refreshed
        on_change, policy_warning = on_change_policy(obj, mode)
        if policy_warning:
            warnings.append(policy_warning)
    meta_path, spec_path = paths
    if namespace is None:
        namespace = str(meta.get("namespace") or "default")
    root, hkey = hkey, digest.namespace_key(hkey, namespace)
    pod_spec = get_path(obj, spec_path)
    if not isinstance(pod_spec, dict):
        return Plan(warnings=warnings, mode=mode, skipped=SkipReason.NO_POD_SPEC)

    extra, extra_warnings = extra_sources(obj)
    warnings.extend(extra_warnings)
    record_kept: dict[str, str] = {}
    count_kept: dict[str, str] = {}
    if operation == "UPDATE" and old is not None and kind != POD:
        record_kept = rollout_kept(obj, old, root)
        count_kept = starts_kept(obj, old, root)
        if not refresh:
            kept = kept_record(obj, old, meta_path, mode, {**record_kept, **count_kept})
            if kept is not None:
                if warnings or on_change != ON_CHANGE_ROLL:
                    return kept.said(warnings, on_change)
                return kept

    template_meta = get_path(obj, meta_path)
    existing = parse_mapping(meta_annotations(template_meta).get(ANN_SOURCES)) or {}
    previous = recorded_observed(obj, old)
    b = _Builder(spec_path=spec_path, warnings=warnings)
    if operation == "UPDATE" and old is not None and kind != POD:
        _delivery(b, obj, old, root, namespace, mode, existing, previous, lookup)

    consumed = with_extra(consumption(find_sites(pod_spec)), extra)
    if len(consumed) > max_sources:
        warnings.append(
            f"consumes {len(consumed)} ConfigMaps/Secrets, more than configpin pins per "
            f"object ({max_sources}): admitted without pinning any"
        )
        return Plan(warnings=warnings, mode=mode, skipped=SkipReason.TOO_MANY_SOURCES)
    _plan_sources(b, consumed.values(), lookup, mode, previous, frozenset(refresh), hkey, existing)
    template_record, workload_record = _records(b, hkey)
    b.patch.extend(annotation_ops(meta_path, template_meta, template_record))
    if kind != POD:
        if old is not None:
            workload_record.update(rejected_kept(obj, old))
            workload_record.update(count_kept)
        if b.to_rejected and old is not None and now is not None:
            workload_record[ANN_ROLLOUT] = _followed(b, obj, old, root, namespace, now)
        else:
            workload_record.update(record_kept)
        b.patch.extend(annotation_ops(("metadata",), obj.get("metadata"), workload_record))
    return Plan(
        patch=b.patch,
        warnings=b.warnings,
        problems=b.problems,
        snapshots=list(b.snapshots.values()),
        sources=b.sources,
        observed=b.observed,
        mode=mode,
        on_change=on_change,
    )


def _plan_sources(
    b: _Builder,
    consumed: Iterable[Consumption],
    lookup: Lookup,
    mode: str,
    previous: Mapping[str, str],
    refresh: frozenset[SourceId],
    hkey: bytes,
    existing: Mapping[str, str],
) -> None:
    """Plan each consumed source into `b`: its digest recorded, its snapshot requested."""
    for cons in consumed:
        sid = cons.source
        record: SourceRecord | None = None
        try:
            record = lookup(sid)
            if record is not None and record.snapshot_of is not None:
                _plan_pinned(b, cons, record, mode, previous, refresh, lookup, hkey)
            else:
                _plan_live(b, cons, record, mode, hkey)
        except SourceUnavailable as e:
            # A snapshot read fine but its source did not: name (and keep) the source.
            failed = sid
            if record is not None and record.snapshot_of is not None:
                failed = SourceId(sid.kind, record.snapshot_of)
            msg = f"{failed} could not be read ({e}); admitted without pinning it"
            b.warnings.append(msg)
            b.problems.append(msg)
            # Keep what was recorded rather than forget the source: dropping the entry would
            # change the template (a rollout for a read error) and hide the workload from
            # the controller.
            key = _recorded_key(failed, existing)
            if key is not None and key not in b.sources:
                b.sources[key] = existing[key]
                b.observed[key] = previous.get(key, existing[key])
        except digest.BadSource as bad:  # (its own name: a compiled `e` has one type)
            msg = f"{sid} has undecodable content ({bad}); admitted without pinning it"
            b.warnings.append(msg)
            b.problems.append(msg)


def _records(b: _Builder, hkey: bytes) -> tuple[dict[str, str | None], dict[str, str | None]]:
    """The annotations the plan in `b` wants (None: absent) on the pod template, and on the
    workload's own metadata."""
    # A template whose only sources were required and missing still gets a record, an empty
    # one: it says configpin admitted it (so no pod of it could start before the sources
    # existed), which the controller tells apart from a workload admitted while configpin
    # was unreachable.
    sources_text = dumps_mapping(b.sources) if b.sources or b.missing_required else None
    if sources_text is not None:
        template: dict[str, str | None] = {
            ANN_CHECKSUM: digest.checksum_of_text(hkey, sources_text),
            ANN_SOURCES: sources_text,
        }
    else:
        template = {ANN_CHECKSUM: None, ANN_SOURCES: None}
    # Written only while it differs from the template's record (a rollback being kept).
    # A second patch operation on the workload's own metadata costs the API server about
    # as much again as the first (bench/e2e_create.py), so the usual case carries none.
    # A refresh record goes with it: the template's record is current again, and new
    # pods start from the template.
    observed = dumps_mapping(b.observed) if b.observed != b.sources and b.observed else None
    return template, {ANN_OBSERVED: observed, ANN_REFRESHED: None}


@dataclass(frozen=True)
class Restamp:
    """A re-stamp planned from what a workload consumes alone (`restamp_from_consumption`)."""

    merge_patch: JSONObject  # the guarded JSON merge patch of the workload
    sources: dict[str, str]
    observed: dict[str, str]
    warnings: list[str]


def restamp_from_consumption(
    kind: str,
    consumed: Iterable[Consumption],
    *,
    hkey: bytes,
    lookup: Lookup,
    namespace: str,
    recorded: Mapping[str, str],
    resource_version: str,
    rolled_at: str,
) -> Restamp | None:
    """The controller's re-stamp of a checksum-mode workload whose references all name live
    sources, planned without its object: what `plan_object` records then depends only on
    what the pod spec consumes (sources, keys, required) and on the sources' content, and it
    is planned here by the same per-source rules. Written as a JSON merge patch, which needs
    nothing else of the object, guarded by `resource_version`: the version whose consumption
    and record (`recorded`, the template's) the caller planned from. `rolled_at`: the time
    recorded for the rollout (`rolled_at_ops`).

    None when the object is needed after all: a reference names a snapshot copy (to be
    pointed back at its source), or a source is missing, unreadable or undecodable."""
    paths = template_paths(kind)
    if paths is None:
        return None
    pinned = False

    def live_only(sid: SourceId) -> SourceRecord | None:
        nonlocal pinned
        found = lookup(sid)
        if found is not None and found.snapshot_of is not None:
            pinned = True
        return found

    b = _Builder(spec_path=paths[1])
    hkey = digest.namespace_key(hkey, namespace)
    _plan_sources(b, consumed, live_only, MODE_CHECKSUM, recorded, frozenset(), hkey, recorded)
    if pinned or b.problems or b.patch or b.snapshots:
        return None
    template, workload = _records(b, hkey)
    body: JSONObject = {
        "metadata": {
            "resourceVersion": resource_version,
            "annotations": {**workload, ANN_ROLLED_AT: rolled_at},
        }
    }
    node = body
    for key in paths[0]:
        if not isinstance(key, str):
            return None  # a template inside a list: never one of the kinds' paths
        node = node.setdefault(key, {})
    node["annotations"] = template
    return Restamp(body, b.sources, b.observed, b.warnings)


def _plan_live(
    b: _Builder, cons: Consumption, record: SourceRecord | None, mode: str, hkey: bytes
) -> None:
    """A reference to a source by its own name (or to an object that is not a snapshot)."""
    sid = cons.source
    if record is None:
        if cons.required:
            msg = f"{sid} not found: the pod cannot start until it exists"
            b.warnings.append(msg)
            b.problems.append(msg)
            b.missing_required = True
        else:
            key = source_key(sid)
            b.sources[key] = digest.ABSENT
            b.observed[key] = digest.ABSENT
        return
    if record.ignored:
        return
    key_digests = record.key_digests
    for required in cons.required_keys:  # (a loop: cheaper than a subset test of the keys view)
        if required not in key_digests:
            missing = sorted(k for k in cons.required_keys if k not in key_digests)
            b.warnings.append(
                f"{sid} has no key {', '.join(map(repr, missing))} that the pod requires"
            )
            break
    value = digest.source_digest(hkey, record, cons.keys)
    key = source_key(sid)
    if b.kept and key in b.kept:  # a person's rollback of a rollout in progress (checksum)
        b.sources[key] = b.observed[key] = b.kept[key]
        return
    if b.rejected and b.rejected.get(key) == value:
        if mode == MODE_SNAPSHOT and _keep_last_good(b, cons, key, hkey):
            return
        if b.old_sources.get(key) != value:  # (this write rolls it to that content)
            content = digest.source_digest(b.root, record)
            b.to_rejected.append(Change.of(b.namespace, sid, content, shared=record.shared))
    b.sources[key] = value
    b.observed[key] = value
    if mode != MODE_SNAPSHOT or not cons.sites:
        return  # (no site: named by configpin.io/extra-sources, read by the app by its name)
    if record.secret_type == SERVICE_ACCOUNT_TOKEN_TYPE:
        b.warnings.append(
            f"{sid} is a service-account token: refused for snapshot, the pod uses it live"
        )
        return
    content = digest.source_digest(hkey, record)
    name = snapshot_name(record.name, content)
    b.snapshots[name] = SnapshotRequest(sid, name, content)
    b.point_at(cons, name)


def _plan_pinned(
    b: _Builder,
    cons: Consumption,
    snap: SourceRecord,
    mode: str,
    previous: Mapping[str, str],
    refresh: frozenset[SourceId],
    lookup: Lookup,
    hkey: bytes,
) -> None:
    """A reference to one of configpin's snapshots: keep it (snapshot mode, no refresh asked)
    or resolve the snapshot's source anew (checksum mode, or the controller following a change)."""
    assert snap.snapshot_of is not None
    source = SourceId(snap.kind, snap.snapshot_of)
    key = str(source)
    if mode == MODE_SNAPSHOT and source not in refresh:
        value = digest.source_digest(hkey, snap, cons.keys)
        b.sources[key] = value
        # Pinned to what the source holds now: the workload is current (this is also what
        # the controller's own re-pointing looks like). Pinned to older content: a rollback,
        # kept; the workload stays recorded as up to date with what it had seen before, so
        # the controller leaves it alone until the source changes again.
        try:
            now = lookup(source)
        except SourceUnavailable:
            now = None
        if now is not None and not now.ignored and now.snapshot_of is None:
            current = digest.source_digest(hkey, now, cons.keys) == value
        else:
            current = False
        b.observed[key] = value if current else previous.get(key, value)
        # Kept, so it must go on existing: the writer un-marks a copy the sweep has marked
        # (costs nothing when the copy is known and unmarked).
        content = digest.source_digest(hkey, snap)
        b.snapshots[snap.name] = SnapshotRequest(source, snap.name, content)
        return
    record = lookup(source)
    if record is None or record.ignored:
        # The source is gone (or opted out): the snapshot is the only copy left; keep it.
        value = digest.source_digest(hkey, snap, cons.keys)
        b.sources[key] = value
        b.observed[key] = value
        b.warnings.append(f"{source} not found: {cons.source} (its snapshot) stays in use")
        return
    live = Consumption(source, cons.keys, cons.required, cons.required_keys, cons.sites)
    _plan_live(b, live, record, mode, hkey)
    if mode != MODE_SNAPSHOT:
        b.point_at(live, source.name)  # checksum mode: back to the live source
