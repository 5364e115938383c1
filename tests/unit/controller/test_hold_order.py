"""A flapping source whose consumer is also in a window (issue 40): the controller's gate
(`Gate.wait`, what every reconcile asks before it starts a rollout) asks its windows first, then
its budget; `approve --now` lifts both, a plain approval the budget alone.

The approvals are the ones the source records (`approve` and `approve --now` on the source, as
the cache reads them); the waves are off, so nothing but the windows and the budget holds it."""

from __future__ import annotations

import json

from harness.builders import HKEY, WORKLOAD_NAMESPACE, Store, admitted, configmap, reading, workload
from harness.controller import ApprovingCache
from webhook.controller.index import WorkloadIndex
from webhook.controller.limits import RolloutLimits
from webhook.controller.waves import Gate
from webhook.core.budget import encode_starts
from webhook.core.constants import ANN_ROLLOUT_BUDGET, ANN_ROLLOUT_STARTS, ANN_ROLLOUT_WINDOWS
from webhook.core.current import WorkloadEntry, WorkloadRef, entry_from_object
from webhook.core.model import SourceId, SourceKind
from webhook.core.record import Change, identity
from webhook.core.waves import Wait, WaitReason
from webhook.process.config import Settings

NS = WORKLOAD_NAMESPACE
NOW = 1_764_547_200.0  # 2025-12-01T00:00:00Z, a Monday
# open from 09:00 UTC for eight hours, every day
BUSINESS = json.dumps([{"kind": "allow", "schedule": "0 9 * * *", "duration": "8h"}])
CFG = SourceId(SourceKind.CONFIGMAP, "cfg")
APP = WorkloadRef("Deployment", NS, "app")


class _World:
    """Deployment `app` reading `cfg`, its own windows and a budget of 2/1h, with the starts it
    records; then `cfg` changed: the gate as the controller builds it, over a wall clock."""

    def __init__(self, starts: tuple[float, ...], windows: str = BUSINESS) -> None:
        self.clock = [NOW]
        store = Store([configmap("cfg", {"a": "1"})])
        obj = admitted(workload("Deployment", reading("cfg", "a"), name="app"), store)
        annotations = obj["metadata"].setdefault("annotations", {})
        annotations |= {ANN_ROLLOUT_WINDOWS: windows, ANN_ROLLOUT_BUDGET: "2/1h"}
        annotations[ANN_ROLLOUT_STARTS] = encode_starts(
            HKEY, identity("Deployment", NS, "app"), starts
        )
        entry = entry_from_object(obj, "checksum", hkey=HKEY)
        assert isinstance(entry, WorkloadEntry)
        self.index = WorkloadIndex()
        self.index.put(entry)
        store.put(configmap("cfg", {"a": "2"}))
        self.cache = ApprovingCache(store)
        limits = RolloutLimits(
            Settings(), HKEY, namespace_windows=lambda _ns: None, wall=lambda: self.clock[0]
        )
        settings = Settings(rollout_waves="off")
        self.gate = Gate(
            self.index,
            self.cache,  # type: ignore[arg-type]
            HKEY,
            settings,
            in_scope=lambda _ns: True,
            limits=limits,
        )
        [self.change] = self.gate.changes(NS, [CFG])

    def wait(self) -> Wait | None:
        """What the gate says of `app`'s rollout to the change (a place it gives is freed)."""
        wait = self.gate.wait(APP, [self.change])
        if wait is None:
            self.gate.release(APP)
        return wait

    def approve(self, *, now: bool = False) -> None:
        self.cache.approved = self.change.content
        if now:
            self.cache.approved_now = self.change.content


def _held(wait: Wait | None, reason: WaitReason) -> Wait:
    assert wait is not None and wait.reason is reason, wait
    return wait


def test_a_flapping_workload_in_a_closed_window_waits_for_the_window_then_its_budget() -> None:
    at_0830 = NOW + 8.5 * 3600  # closed until 09:00
    world = _World((at_0830 - 600, at_0830 - 300))  # two starts in the last ten minutes
    assert isinstance(world.change, Change)
    world.clock[0] = at_0830
    wait = _held(world.wait(), WaitReason.WINDOW)
    assert wait.until == NOW + 9 * 3600 and "they open Mon 2025-12-01 09:00 UTC" in wait.why
    world.clock[0] = NOW + 9 * 3600  # the window opens; the budget holds until 09:20
    wait = _held(world.wait(), WaitReason.BUDGET)
    assert wait.until == NOW + 9 * 3600 + 1200 and "configmap/cfg keeps changing" in wait.why
    world.clock[0] = NOW + 9 * 3600 + 1200
    assert world.wait() is None


def test_a_persons_approval_lifts_the_budget_and_not_the_window() -> None:
    at_0830 = NOW + 8.5 * 3600
    world = _World((at_0830 - 600, at_0830 - 300))
    world.clock[0] = at_0830
    world.approve()
    _held(world.wait(), WaitReason.WINDOW)  # an approval: not the window
    world.clock[0] = NOW + 9 * 3600
    assert world.wait() is None  # the window open, the budget lifted by the approval


def test_approve_now_lifts_the_window_and_the_budget() -> None:
    at_0830 = NOW + 8.5 * 3600
    world = _World((at_0830 - 600, at_0830 - 300))
    world.clock[0] = at_0830
    world.approve(now=True)
    assert world.wait() is None


def test_a_window_list_that_cannot_be_read_holds_and_names_itself() -> None:
    world = _World((), windows='[{"kind": "allow"}]')
    wait = _held(world.wait(), WaitReason.WINDOW)
    assert wait.until is None
    assert "its configpin.io/rollout-windows cannot be read" in wait.why
