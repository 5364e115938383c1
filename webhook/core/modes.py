"""What a workload asks of configpin on its own metadata: its mode (`configpin.io/mode`) and
what a change of a source does to it (`configpin.io/on-change`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from webhook.core.constants import (
    ANN_MODE,
    ANN_ON_CHANGE,
    MODE_SNAPSHOT,
    MODES,
    ON_CHANGE_POLICIES,
    ON_CHANGE_REFRESH,
    ON_CHANGE_ROLL,
)
from webhook.core.record import annotations_of


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
