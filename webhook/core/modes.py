"""What a workload asks of configpin on its own metadata: its mode (`configpin.io/mode`), what
a change of a source does to it (`configpin.io/on-change`), and when and how often configpin
may roll it (`configpin.io/rollout-windows`, `configpin.io/rollout-budget`), which admission
refuses to set to what cannot be read."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from webhook.core.budget import BudgetError, parse_budget
from webhook.core.constants import (
    ANN_MODE,
    ANN_ON_CHANGE,
    ANN_ROLLOUT_BUDGET,
    ANN_ROLLOUT_WINDOWS,
    MODE_SNAPSHOT,
    MODES,
    ON_CHANGE_POLICIES,
    ON_CHANGE_REFRESH,
    ON_CHANGE_ROLL,
)
from webhook.core.kinds import rolled_kinds
from webhook.core.record import annotations_of
from webhook.core.windows import WindowError, parse_windows


def effective_mode(obj: Mapping[str, Any], default_mode: str) -> tuple[str, str | None]:
    """The mode for this object and a warning if its annotation holds an unknown mode."""
    value = annotations_of(obj).get(ANN_MODE)
    if value is None:
        return default_mode, None
    if value in MODES:
        return str(value), None
    return default_mode, f"{ANN_MODE}: unknown mode {value!r}, using {default_mode!r}"


def on_change_policy(obj: Mapping[str, Any], mode: str) -> tuple[str, str | None]:
    """What a change of a source does to this workload (`roll` or `refresh`), and a warning
    when its annotation asks for what it cannot have: an unknown policy, or `refresh` in
    snapshot mode, whose copies never change (a pod pointing at one cannot be handed new
    content in place). Both roll."""
    value = annotations_of(obj).get(ANN_ON_CHANGE)
    if value is None or value == ON_CHANGE_ROLL:
        return ON_CHANGE_ROLL, None
    if value not in ON_CHANGE_POLICIES:
        return ON_CHANGE_ROLL, (
            f"{ANN_ON_CHANGE}: unknown policy {str(value)[:64]!r} (roll or refresh): it rolls"
        )
    if mode == MODE_SNAPSHOT:
        return ON_CHANGE_ROLL, (
            f"{ANN_ON_CHANGE}: refresh is refused in snapshot mode (a copy never changes, so "
            "a running pod cannot be handed new content): it rolls"
        )
    return ON_CHANGE_REFRESH, None


def unreadable_rollout_limits(obj: Mapping[str, Any], old: Mapping[str, Any] | None) -> str | None:
    """Why a write of a workload is refused: it sets its rollout windows or its rollout budget
    to a value that cannot be read (the message names the annotation and what is wrong);
    None otherwise. A value the write leaves as it was (`old`: the object before an UPDATE)
    is not refused, so that a workload that holds one from before (configpin upgraded, or
    its webhook bypassed) can still be rolled back, restarted or fixed."""
    mine = annotations_of(obj)
    if ANN_ROLLOUT_WINDOWS not in mine and ANN_ROLLOUT_BUDGET not in mine:
        return None
    if obj.get("kind") not in {k.kind for k in rolled_kinds()}:
        return None  # (a Pod, or a kind configpin never rolls: nothing reads them there)
    before = annotations_of(old) if old is not None else {}
    for key in (ANN_ROLLOUT_WINDOWS, ANN_ROLLOUT_BUDGET):
        value = mine.get(key)
        if value is None or (key in before and before.get(key) == value):
            continue
        try:
            if key == ANN_ROLLOUT_WINDOWS:
                parse_windows(value)
            else:
                parse_budget(value)
        except (WindowError, BudgetError) as e:
            return f"{key}: {e}"
    return None
