"""Following the config rollouts configpin starts (safe delivery).

When configpin re-stamps a workload it writes, in the same write, a rollout record on the
workload (webhook.core.delivery.RolloutRecord): what it rolled to and from, when, the previous
references. While that record says `rolling`, the controller looks at the workload again
(on its watch events, and every few seconds for deadlines and restarts) until its status says
complete, or a failure signal fires. Then, per `configpin.io/on-failure`:

- undo (snapshot mode's default): the template's references and configpin's record go back
  to the revision before (its copies), when nothing else in the template changed since;
- hold (checksum mode's default): nothing more is started for that change;
- none: only said.

Every failure records the content on the workload as rejected (`configpin.io/rejected`, never
rolled to again; none: not recorded), ends the record as failed (later waves of that change
stop), and is said in a Warning Event and `configpin_rollout_failures_total{action}`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from webhook.controller.index import WorkloadRef
from webhook.core import digest
from webhook.core.constants import (
    ANN_OBSERVED,
    ANN_REJECTED,
    ANN_ROLLOUT,
    ON_FAILURE_HOLD,
    ON_FAILURE_NONE,
    ON_FAILURE_UNDO,
)
from webhook.core.delivery import (
    COMPLETE,
    FAILED,
    ROLLING,
    Progress,
    RolloutRecord,
    assess,
    on_failure_policy,
    poll_after,
    record_ops,
    rejected_text,
    template_fingerprint,
    undo_ops,
    workload_identity,
)
from webhook.core.kinds import WorkloadKind
from webhook.core.model import JSONObject, PatchOp, Plan, SourceId
from webhook.core.refs import find_sites, get_path

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Ended:
    """How a followed rollout ended, for the Event and the metric."""

    record: RolloutRecord  # as written: state, signal, action
    policy: str  # what the workload asked for (undo, hold, none)
    not_undone: str = ""  # why an undo was not made (then it holds)
    keys: Mapping[str, tuple[str, ...]] | None = None  # the keys the change changed, by source


def rolled_record(
    obj: JSONObject,
    after: JSONObject,
    kind: WorkloadKind,
    plan: Plan,
    before: Mapping[str, str],
    changes: Iterable[str],
    now: float,
) -> RolloutRecord:
    """The record of a rollout configpin is about to write (`after`: `obj` as its re-stamp
    leaves it): what it rolls to and from, the references it replaces (snapshot mode), and a
    fingerprint of the template as it will be stored. Kinds whose pods are not replaced (a
    ReplicaSet, a CronJob) have nothing to follow: their record is complete at once."""
    template = get_path(after, kind.template) if kind.template else after
    refs: dict[str, str] = {}
    made = {req.snapshot_name: req.source.name for req in plan.snapshots}
    old_spec, new_spec = get_path(obj, kind.spec_path), get_path(after, kind.spec_path)
    old_sites = {
        s.path: s.source for s in find_sites(old_spec if isinstance(old_spec, dict) else {})
    }
    for site in find_sites(new_spec if isinstance(new_spec, dict) else {}):
        was = old_sites.get(site.path)
        if was is not None and was != site.source and site.source.name in made:
            refs[str(site.source)] = f"{made[site.source.name]}/{was.name}"
    return RolloutRecord(
        ROLLING if kind.rollout is not None else COMPLETE,
        to=dict(plan.sources),
        before=dict(before),
        since=now,
        changes=tuple(changes),
        refs=refs,
        template=template_fingerprint(template),
    )


class Follower:
    def __init__(
        self,
        hkey: bytes,
        *,
        pods: Callable[[WorkloadRef, JSONObject], list[JSONObject]],
        is_copy: Callable[[str, SourceId, str], bool],
        changed_keys: Callable[[str, SourceId], frozenset[str] | None],
    ) -> None:
        """`pods(ref, obj)`: the workload's live pods; `is_copy(namespace, source, name)`: a
        copy configpin made of that source; `changed_keys(namespace, source)`: which keys
        its last change changed, when this process saw it."""
        self.hkey = hkey
        self.pods = pods
        self.is_copy = is_copy
        self.changed_keys = changed_keys

    def record_text(self, obj: JSONObject, record: RolloutRecord) -> str:
        return record.encode(self.hkey, workload_identity(obj))

    def progress(
        self,
        ref: WorkloadRef,
        obj: JSONObject,
        kind: WorkloadKind,
        record: RolloutRecord,
        now: float,
    ) -> tuple[Progress, float]:
        """How its rollout is going, and how soon to look again while it goes on."""
        pods = self.pods(ref, obj) if kind.rollout is not None else []
        return assess(kind, obj, pods, record, now), poll_after(kind, obj, record, now)

    def complete(self, obj: JSONObject, record: RolloutRecord) -> list[PatchOp]:
        return record_ops(obj, {ANN_ROLLOUT: self.record_text(obj, record.ended(COMPLETE))})

    def failed(
        self,
        ref: WorkloadRef,
        obj: JSONObject,
        kind: WorkloadKind,
        record: RolloutRecord,
        mode: str,
        signal: str,
    ) -> tuple[list[PatchOp], Ended]:
        """What a failure of its rollout leads to: the ops to write, and how it ended."""
        policy, warning = on_failure_policy(obj, mode)
        if warning:
            log.warning("%s: %s", ref, warning)
        keys = {}
        for key in record.changed_sources():
            try:
                sid = SourceId.parse(key)
            except ValueError:
                continue
            found = self.changed_keys(ref.namespace, sid)
            if found is not None:
                keys[key] = tuple(sorted(found))
        action, not_undone = policy, ""
        ops: list[PatchOp] = []
        nskey = digest.namespace_key(self.hkey, ref.namespace)
        if policy == ON_FAILURE_UNDO:
            ns = ref.namespace
            ops, why = undo_ops(
                kind,
                obj,
                record,
                nskey,
                lambda key, name: self.is_copy(ns, SourceId.parse(key), name),
            )
            if why is not None:
                action, not_undone, ops = ON_FAILURE_HOLD, why, []
        ended = record.ended(FAILED, signal=signal, action=action)
        annotations: dict[str, str | None] = {ANN_ROLLOUT: self.record_text(obj, ended)}
        if action != ON_FAILURE_NONE:
            annotations[ANN_REJECTED] = rejected_text(obj, record)
        if action == ON_FAILURE_UNDO:
            annotations[ANN_OBSERVED] = digest.canonical_mapping(dict(record.before))
        ops += record_ops(obj, annotations)
        return ops, Ended(ended, policy, not_undone, keys or None)
