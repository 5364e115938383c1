"""Following the config rollouts configpin starts (safe delivery).

When configpin re-stamps a workload it writes, in the same write, a rollout record on the
workload (webhook.core.record.RolloutRecord): what it rolled to and from, when, the previous
references. While that record says `rolling`, the controller looks at the workload again
(on its watch events, and every few seconds for deadlines and restarts) until its status says
complete, a failure signal fires, it is scaled to zero (it left: it proves nothing), or a
person takes its template back off the content rolled to (`kubectl rollout undo`, a GitOps
revert): that is a verdict, kept as the person left it. On a failure, per
`configpin.io/on-failure`:

- undo (snapshot mode's default): the template's references and configpin's record go back
  to the last content that completed there (its copies), when nothing else in the template
  changed since;
- hold (checksum mode's default): nothing more is started for that change;
- none: only said.

Every failure but `none` records the content on the workload as rejected
(`configpin.io/rejected`, never rolled to again), ends the record as failed (later waves of
that change stop), and is said in a Warning Event and `configpin_rollout_failures_total{action}`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from webhook.core import digest
from webhook.core.constants import ANN_OBSERVED, ANN_REJECTED, ANN_ROLLOUT
from webhook.core.current import WorkloadRef
from webhook.core.kinds import WorkloadKind
from webhook.core.model import JSONObject, PatchOp, SourceId
from webhook.core.progress import (
    Progress,
    assess,
    on_failure_policy,
    poll_after,
    undo_ops,
    without_pods,
)
from webhook.core.record import (
    Action,
    RolloutRecord,
    State,
    proven,
    record_ops,
    rejected_text,
    workload_identity,
)

log = logging.getLogger(__name__)

PERSON_SIGNAL = (
    "rolled back by a person: its pod template no longer names the content configpin rolled "
    "to (kubectl rollout undo, a GitOps revert)"
)


@dataclass(frozen=True)
class Ended:
    """How a followed rollout ended, for the Event and the metric."""

    record: RolloutRecord  # as written: state, signal, action
    policy: Action | None = None  # (failed) what the workload asked for (undo, hold, none)
    not_undone: str = ""  # why an undo was not made (then it holds)
    keys: Mapping[str, tuple[str, ...]] | None = None  # the keys the change changed, by source


class Follower:
    def __init__(
        self,
        hkey: bytes,
        *,
        is_copy: Callable[[str, SourceId, str], bool],
        changed_keys: Callable[[str, SourceId], frozenset[str] | None],
    ) -> None:
        """`is_copy(namespace, source, name)`: a copy configpin made of that source;
        `changed_keys(namespace, source)`: which keys its last change changed, when this
        process saw it. Both answer from memory (the snapshot index, the source cache): a
        decision reads nothing from the API server."""
        self.hkey = hkey
        self.is_copy = is_copy
        self.changed_keys = changed_keys

    def record_text(self, obj: JSONObject, record: RolloutRecord) -> str:
        return record.encode(self.hkey, workload_identity(obj))

    @staticmethod
    def progress(
        obj: JSONObject,
        kind: WorkloadKind,
        record: RolloutRecord,
        now: float,
        pods: list[JSONObject] | None,
    ) -> tuple[Progress, float] | None:
        """How its rollout is going, and how soon to look again while it goes on, given its
        live `pods`; None: its pods must be listed first (None given). They are needed only
        where its own status leaves the answer open (not on the look that finds it complete
        or left)."""
        early = without_pods(kind, obj)
        if early is not None:
            return early, 0.0  # (ended: not looked at again)
        if pods is None:
            return None
        return assess(kind, obj, pods, record, now), poll_after(kind, obj, pods, record, now)

    def complete(self, obj: JSONObject, record: RolloutRecord) -> tuple[list[PatchOp], Ended]:
        """Its updated pods are all Ready: the content works there (so it is no longer
        rejected there, where a re-apply rolled it back to content a rollout once failed)."""
        ended = record.ended(State.COMPLETE)
        values: dict[str, str | None] = {ANN_ROLLOUT: self.record_text(obj, ended)}
        kept = proven(obj, record)
        if kept is not None:
            values[ANN_REJECTED] = digest.canonical_mapping(kept) if kept else None
        return record_ops(obj, values), Ended(ended)

    def left(self, obj: JSONObject, record: RolloutRecord) -> tuple[list[PatchOp], Ended]:
        """Scaled to zero while rolling: it proves nothing, and leaves the change's waves."""
        ended = record.ended(State.LEFT)
        return record_ops(obj, {ANN_ROLLOUT: self.record_text(obj, ended)}), Ended(ended)

    def _keys(self, ref: WorkloadRef, record: RolloutRecord) -> Mapping[str, tuple[str, ...]]:
        keys = {}
        for key in record.changed_sources():
            try:
                sid = SourceId.parse(key)
            except ValueError:
                continue
            found = self.changed_keys(ref.namespace, sid)
            if found is not None:
                keys[key] = tuple(sorted(found))
        return keys

    def rolled_back(
        self, ref: WorkloadRef, obj: JSONObject, record: RolloutRecord
    ) -> tuple[list[PatchOp], Ended]:
        """A person took the template back off the content rolled to: the change failed
        there. Their template is kept as it is; the content is rejected there."""
        ended = record.ended(State.FAILED, signal=PERSON_SIGNAL, action=Action.PERSON)
        ops = record_ops(
            obj,
            {ANN_ROLLOUT: self.record_text(obj, ended), ANN_REJECTED: rejected_text(obj, record)},
        )
        return ops, Ended(ended, Action.PERSON, keys=self._keys(ref, record) or None)

    def failed(
        self,
        ref: WorkloadRef,
        obj: JSONObject,
        kind: WorkloadKind,
        record: RolloutRecord,
        mode: str,
        signal: str,
        *,
        policy: Action | None = None,
    ) -> tuple[list[PatchOp], Ended]:
        """What a failure of its rollout leads to: the ops to write, and how it ended.
        `policy`: what to do instead of what the workload asks for (a person's abort: undo,
        holding where it cannot)."""
        if policy is None:
            policy, warning = on_failure_policy(obj, mode)
            if warning:
                log.warning("%s: %s", ref, warning)
        action, not_undone = policy, ""
        ops: list[PatchOp] = []
        if policy is Action.UNDO:
            ns = ref.namespace
            ops, why = undo_ops(
                kind,
                obj,
                record,
                digest.namespace_key(self.hkey, ns),
                lambda key, name: self.is_copy(ns, SourceId.parse(key), name),
            )
            if why is not None:
                action, not_undone, ops = Action.HOLD, why, []
        ended = record.ended(State.FAILED, signal=signal, action=action)
        annotations: dict[str, str | None] = {ANN_ROLLOUT: self.record_text(obj, ended)}
        if action.rejects:
            annotations[ANN_REJECTED] = rejected_text(obj, record)
        if action is Action.UNDO:
            annotations[ANN_OBSERVED] = digest.canonical_mapping(dict(record.before))
        ops += record_ops(obj, annotations)
        return ops, Ended(ended, policy, not_undone, self._keys(ref, record) or None)
