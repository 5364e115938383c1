"""A flapping source whose consumer is also in a window (issue 40): its windows are asked
first, then its budget; `approve --now` lifts both, a plain approval the budget alone."""

from __future__ import annotations

import json

from webhook.controller.limits import RolloutLimits
from webhook.core.current import Delivery, Limits, WorkloadEntry, WorkloadRef
from webhook.core.model import SourceId, SourceKind
from webhook.core.record import Change
from webhook.core.waves import Wait, WaitReason
from webhook.process.config import Settings

HKEY = b"k" * 32
NOW = 1_764_547_200.0  # 2025-12-01T00:00:00Z, a Monday
# open from 09:00 UTC for eight hours, every day
BUSINESS = json.dumps([{"kind": "allow", "schedule": "0 9 * * *", "duration": "8h"}])
CHANGE = Change.of("team-a", SourceId(SourceKind.CONFIGMAP, "cfg"), "c1", shared=False)


def _entry(starts: tuple[float, ...], windows: str | None = BUSINESS) -> WorkloadEntry:
    limits = Limits(windows, "2/1h", starts)
    return WorkloadEntry(
        WorkloadRef("Deployment", "team-a", "app"),
        (),
        {},
        delivery=Delivery(None, None, 0, limits=limits),
    )


def _limits(clock: list[float]) -> RolloutLimits:
    return RolloutLimits(
        Settings(), HKEY, namespace_windows=lambda _ns: None, wall=lambda: clock[0]
    )


def _hold(
    limits: RolloutLimits, entry: WorkloadEntry, *, approved: bool = False, now: bool = False
) -> Wait | None:
    return limits.hold(entry, (CHANGE,), approved=lambda _c: approved, approved_now=lambda _c: now)


def test_a_flapping_workload_in_a_closed_window_waits_for_the_window_then_its_budget() -> None:
    clock = [NOW + 8.5 * 3600]  # 08:30: closed until 09:00
    limits = _limits(clock)
    entry = _entry((clock[0] - 600, clock[0] - 300))  # two starts in the last ten minutes
    wait = _hold(limits, entry)
    assert wait is not None and wait.reason is WaitReason.WINDOW
    assert wait.until == NOW + 9 * 3600 and "they open Mon 2025-12-01 09:00 UTC" in wait.why
    clock[0] = NOW + 9 * 3600  # the window opens; the budget holds until 09:20
    wait = _hold(limits, entry)
    assert wait is not None and wait.reason is WaitReason.BUDGET
    assert wait.until == NOW + 9 * 3600 + 1200 and "configmap/cfg keeps changing" in wait.why
    assert _hold(limits, entry, approved=True) is None  # a person's approval: the budget
    clock[0] = NOW + 9 * 3600 + 1200
    assert _hold(limits, entry) is None


def test_approve_now_lifts_the_window_a_plain_approval_does_not() -> None:
    clock = [NOW + 8.5 * 3600]
    limits = _limits(clock)
    entry = _entry((clock[0] - 600, clock[0] - 300))
    held = _hold(limits, entry, approved=True)
    assert held is not None and held.reason is WaitReason.WINDOW
    assert _hold(limits, entry, approved=True, now=True) is None


def test_a_window_list_that_cannot_be_read_holds_and_names_itself() -> None:
    limits = _limits([NOW])
    wait = _hold(limits, _entry((), windows='[{"kind": "allow"}]'))
    assert wait is not None and wait.reason is WaitReason.WINDOW and wait.until is None
    assert "its configpin.io/rollout-windows cannot be read" in wait.why
