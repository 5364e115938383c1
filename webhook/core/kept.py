"""What configpin keeps on a workload across writes that are not its own: the record on its
pod template (`configpin.io/sources`, `configpin.io/checksum`) and on its own metadata
(`configpin.io/observed`, when it last rolled or refreshed, the rollout record, the content
rejected there, the rollout budget's count), restored where a client drops them and never
rewound by one, and the ops that write them.

An UPDATE that leaves the pod template as it was keeps its record (`kept_record`); one that
changes it keeps the rollout record (`rollout_kept`) and the content rejected there
(`rejected_kept`); either keeps the budget's count (`starts_kept`). The plan itself:
webhook.core.plan.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, Final

from webhook.core import digest
from webhook.core.budget import decode_starts
from webhook.core.constants import (
    ANN_CHECKSUM,
    ANN_OBSERVED,
    ANN_REFRESHED,
    ANN_REJECTED,
    ANN_ROLLED_AT,
    ANN_ROLLOUT,
    ANN_ROLLOUT_STARTS,
    ANN_SOURCES,
)
from webhook.core.kinds import Path, template_paths
from webhook.core.model import JSONObject, PatchOp, Plan
from webhook.core.names import pointer
from webhook.core.record import RolloutRecord, rejected, workload_identity
from webhook.core.refs import get_path

dumps_mapping = digest.canonical_mapping  # the text of a sources/observed annotation


def parse_mapping(text: Any) -> dict[str, str] | None:
    if not isinstance(text, str):
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        return None
    return value


def meta_annotations(meta: Any) -> Mapping[str, Any]:
    annotations = meta.get("annotations") if isinstance(meta, dict) else None
    return annotations if isinstance(annotations, dict) else {}


def recorded_observed(obj: Mapping[str, Any], old: Mapping[str, Any] | None) -> dict[str, str]:
    """What the workload was last brought up to date with (see ANN_OBSERVED).

    The new object's own record wins; a client that replaced the object whole (dropping the
    annotation) falls back to the old object's record, then to the old template's sources.
    """
    for candidate in (obj, old):
        if candidate is None:
            continue
        parsed = parse_mapping(meta_annotations(candidate.get("metadata")).get(ANN_OBSERVED))
        if parsed is not None:
            return parsed
    if old is not None:
        paths = template_paths(str(old.get("kind", "")))
        if paths is not None:
            parsed = parse_mapping(meta_annotations(get_path(old, paths[0])).get(ANN_SOURCES))
            if parsed is not None:
                return parsed
    return {}


def annotation_ops(meta_path: Path, meta: Any, desired: Mapping[str, str | None]) -> list[PatchOp]:
    """Ops that make the annotations at meta_path hold `desired` (None: absent)."""
    current = meta_annotations(meta)
    wanted = {k: v for k, v in desired.items() if v is not None and current.get(k) != v}
    unwanted = [k for k, v in desired.items() if v is None and k in current]
    if not wanted and not unwanted:
        return []
    if not isinstance(meta, dict):
        return [{"op": "add", "path": pointer(meta_path), "value": {"annotations": wanted}}]
    if not isinstance(meta.get("annotations"), dict):
        return [{"op": "add", "path": pointer((*meta_path, "annotations")), "value": wanted}]
    ops: list[PatchOp] = [
        {"op": "add", "path": pointer((*meta_path, "annotations", k)), "value": v}
        for k, v in wanted.items()
    ]
    ops.extend({"op": "remove", "path": pointer((*meta_path, "annotations", k))} for k in unwanted)
    return ops


# What configpin writes on a pod template: the record, never a change the pods must follow.
_TEMPLATE_RECORD: Final[tuple[str, ...]] = (ANN_CHECKSUM, ANN_SOURCES)
# What it writes on a workload's own metadata.
_WORKLOAD_RECORD: Final[tuple[str, ...]] = (ANN_OBSERVED, ANN_ROLLED_AT, ANN_REFRESHED)


def _without_record(template: Any) -> Any:
    """The pod template with configpin's record taken out (a shallow copy where needed); an
    empty metadata or annotations map counts as absent."""
    if not isinstance(template, dict):
        return template
    meta = template.get("metadata")
    if not isinstance(meta, dict):
        return template
    annotations = meta_annotations(meta)
    rest = {k: v for k, v in annotations.items() if k not in _TEMPLATE_RECORD}
    new_meta = {k: v for k, v in meta.items() if k != "annotations"}
    if rest:
        new_meta["annotations"] = rest
    out = {k: v for k, v in template.items() if k != "metadata"}
    if new_meta:
        out["metadata"] = new_meta
    return out


def kept_record(
    obj: JSONObject, old: JSONObject, meta_path: Path, mode: str, record_kept: Mapping[str, str]
) -> Plan | None:
    """An UPDATE that leaves the pod template as it was (configpin's record aside) and does
    not itself set a different record: the template keeps the record it has (restored where
    a client that replaced the object whole dropped it), stamped or not. Whether the workload
    is stale is the controller's to decide, from the cluster's state; admission stamping here
    would start a rollout nobody asked for (a label edit, a `replicas` change, the
    controller's own baseline write). None when the request changes the template, or sets a
    record of its own (the controller re-stamping): that is planned. `record_kept`: the
    workload's rollout record to keep (`rollout_kept`)."""
    if not _same_but_record(obj, old, meta_path):
        return None
    new_ann = meta_annotations(get_path(obj, meta_path))
    old_ann = meta_annotations(get_path(old, meta_path))
    if _sets_record(new_ann, old_ann):
        return None
    # Restore what a whole-object replace dropped; never write anything new.
    ops = annotation_ops(
        meta_path,
        get_path(obj, meta_path),
        {k: old_ann[k] for k in _TEMPLATE_RECORD if k in old_ann and k not in new_ann},
    )
    obj_ann = meta_annotations(obj.get("metadata"))
    had = meta_annotations(old.get("metadata"))
    restore = {k: had[k] for k in _WORKLOAD_RECORD if k in had and k not in obj_ann}
    ops += annotation_ops(("metadata",), obj.get("metadata"), {**restore, **record_kept})
    sources = parse_mapping(old_ann.get(ANN_SOURCES)) or {}
    observed = parse_mapping(obj_ann.get(ANN_OBSERVED, had.get(ANN_OBSERVED))) or sources
    return Plan(patch=ops, sources=sources, observed=observed, mode=mode, kept=True)


def rollout_kept(obj: JSONObject, old: JSONObject, root: bytes) -> dict[str, str]:
    """The rollout record the workload carries (`configpin.io/rollout`, signed by configpin
    for it), to keep when an UPDATE drops it, forges it or puts an older one back (`kubectl
    rollout undo` puts the old ReplicaSet's copy of the workload's annotations back):
    configpin's account of what it rolls must not be rewound by its subject. A record written
    by configpin since (a later start, the same rollout moved on) goes through: {}."""
    return _newest_kept(obj, old, root, ANN_ROLLOUT, _rollout_since)


def starts_kept(obj: JSONObject, old: JSONObject, root: bytes) -> dict[str, str]:
    """The record of configpin's last rollout starts (`configpin.io/rollout-starts`, the
    rollout budget's count) to keep when an UPDATE drops it, forges it or puts an older one
    back: a whole-object replace (`kubectl replace`, a GitOps tool's Replace or force) leaves
    it out, and `kubectl rollout undo` puts back the old ReplicaSet's copy of the workload's
    annotations. The count a flap guard keeps must not be reset or rewound by such a write.
    A record configpin wrote since (one whose newest start is no older) goes through: {}."""
    return _newest_kept(obj, old, root, ANN_ROLLOUT_STARTS, _newest_start)


def _rollout_since(root: bytes, who: str, text: Any) -> float | None:
    record = RolloutRecord.decode(root, who, text)
    return None if record is None else record.since


def _newest_start(root: bytes, who: str, text: Any) -> float | None:
    starts = decode_starts(root, who, text)
    return starts[-1] if starts else None


def _newest_kept(
    obj: JSONObject,
    old: JSONObject,
    root: bytes,
    annotation: str,
    newness: Callable[[bytes, str, Any], float | None],
) -> dict[str, str]:
    """The old object's signed record in `annotation`, where the UPDATE drops it, forges it
    or puts an older one back; {} where it keeps it or brings one at least as new.
    `newness(root, identity, text)`: how new a record is, None where it is not believed."""
    had = meta_annotations(old.get("metadata")).get(annotation)
    if had is None:
        return {}
    now = meta_annotations(obj.get("metadata")).get(annotation)
    if now == had:
        return {}
    who = workload_identity(old)
    before = newness(root, who, had)
    if before is None:
        return {}
    after = newness(root, who, now) if now is not None else None
    if after is not None and after >= before:
        return {}
    return {annotation: had}


def rejected_kept(obj: JSONObject, old: JSONObject) -> dict[str, str]:
    """An UPDATE that changes the pod template keeps the content rejected on the workload
    (`configpin.io/rejected`) that it drops (`kubectl rollout undo` puts an old ReplicaSet's
    copy back; a re-apply that replaces the object whole leaves it out): what it sets is
    added to it. Removing it by itself (`kubectl annotate ... configpin.io/rejected-`, which
    leaves the template as it is) releases it, and never comes here."""
    had = meta_annotations(old.get("metadata")).get(ANN_REJECTED)
    if had is None:
        return {}
    mine = meta_annotations(obj.get("metadata")).get(ANN_REJECTED)
    if mine == had:
        return {}
    union = {**rejected(old), **rejected(obj)}
    text = dumps_mapping(union)
    return {} if text == mine else {ANN_REJECTED: text}


def _same_but_record(obj: JSONObject, old: JSONObject, meta_path: Path) -> bool:
    """The pod template (its metadata at `meta_path`) is the old one, configpin's record aside."""
    template_path = meta_path[:-1]
    new_t, old_t = get_path(obj, template_path), get_path(old, template_path)
    return bool(_without_record(new_t) == _without_record(old_t))


def _sets_record(new_ann: Mapping[str, Any], old_ann: Mapping[str, Any]) -> bool:
    """The template's annotations carry a record of configpin's other than the old ones."""
    return any(k in new_ann for k in _TEMPLATE_RECORD) and any(
        new_ann.get(k) != old_ann.get(k) for k in _TEMPLATE_RECORD
    )


def changes_only_the_record(obj: JSONObject, old: JSONObject | None) -> bool:
    """An UPDATE whose pod template is the old one but for configpin's record, which it sets
    otherwise: what the controller's re-stamp looks like (or a client that writes configpin's
    annotations itself). A deploy, any other change of the template, is not one."""
    paths = template_paths(str(obj.get("kind", "")))
    if old is None or paths is None or not _same_but_record(obj, old, paths[0]):
        return False
    meta_path = paths[0]
    return _sets_record(
        meta_annotations(get_path(obj, meta_path)), meta_annotations(get_path(old, meta_path))
    )


def observed_ops(obj: JSONObject, observed: str | None) -> list[PatchOp]:
    """Ops that set (or, with None, remove) the workload's `configpin.io/observed` record."""
    return annotation_ops(("metadata",), obj.get("metadata"), {ANN_OBSERVED: observed})


def refreshed_ops(obj: JSONObject, record: str) -> list[PatchOp]:
    """Ops that record on the workload's metadata a refresh of its running pods to `record`
    (the JSON of per-source digests): what its pods were handed (`configpin.io/refreshed`)
    is what it is now up to date with (`configpin.io/observed`)."""
    return annotation_ops(
        ("metadata",), obj.get("metadata"), {ANN_OBSERVED: record, ANN_REFRESHED: record}
    )


def rolled_at_ops(obj: JSONObject, when: str) -> list[PatchOp]:
    """Ops that record on the workload's metadata when configpin last rolled it."""
    return annotation_ops(("metadata",), obj.get("metadata"), {ANN_ROLLED_AT: when})
