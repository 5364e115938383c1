"""How long the tests wait for something that should not happen, in one place.

A test that asserts a rollout (or a refresh, a second write) did *not* happen must wait until
it would have: the controller acts a coalescing window after the change it saw, then writes
through admission, and the workload's controller answers within a second or two. One margin
past the window, the same in every module: `settled(window)`.
"""

from __future__ import annotations

from typing import Final

WINDOW: Final = 0.5  # the coalescing window the tests' own configpins run with
CHART_WINDOW: Final = 2.0  # the chart's default (controller.coalesceWindowSeconds)
MARGIN: Final = 3.0  # past the window: a reconcile, its write through admission, the watch


def settled(window: float = WINDOW) -> float:
    """Seconds after a change by which anything it set off would have started."""
    return window + MARGIN


SETTLE: Final = settled()  # (a configpin with the tests' window)
NODE_SETTLE: Final = settled(CHART_WINDOW)  # (configpin installed by its chart on a node)
