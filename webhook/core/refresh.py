"""Whether a change reaches a workload that asks for `on-change: refresh` without a rollout,
or why it rolls instead (`Fallback`)."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from webhook.core.constants import ON_CHANGE_REFRESH
from webhook.core.kinds import template_paths
from webhook.core.model import JSONObject, Plan, SourceId
from webhook.core.names import pointer
from webhook.core.reasons import Fallback
from webhook.core.refs import get_path, unrefreshable


@dataclass(frozen=True)
class RollInstead:
    """Why a change to a workload that asks for refresh rolls it instead."""

    reason: Fallback
    why: str  # for people


def roll_instead(obj: JSONObject, plan: Plan, changed: Collection[SourceId]) -> RollInstead | None:
    """Whether the controller's `plan` for a workload that asks for `on-change: refresh`,
    following a change of `changed`, must roll it after all (None: a refresh reaches every
    changed source: each reaches its pods only through whole-volume mounts)."""
    if plan.on_change != ON_CHANGE_REFRESH:
        return RollInstead(
            Fallback.SNAPSHOT_MODE, "refresh is refused in snapshot mode (a copy never changes)"
        )
    paths = template_paths(str(obj.get("kind", "")))
    assert paths is not None
    spec_prefix = pointer(paths[1]) + "/"
    if any(str(op.get("path", "")).startswith(spec_prefix) for op in plan.patch):
        return RollInstead(
            Fallback.REFERENCES,
            "its pod template points at snapshot copies, which must point at the live sources "
            "again",
        )
    spec = get_path(obj, paths[1])
    blocked = unrefreshable(spec if isinstance(spec, dict) else {}, changed)
    if blocked:
        sid = min(blocked)
        why = blocked[sid]
        reason = {"subPath": Fallback.SUBPATH, "extra": Fallback.EXTRA}.get(why.how, Fallback.ENV)
        return RollInstead(reason, f"a change of {sid} cannot reach a running process: {why}")
    return None
