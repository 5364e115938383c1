"""When and how often configpin may start a rollout (SPEC, "Windows and budgets"): the
rollout windows (the cluster's `--rollout-windows`, a namespace's and a workload's
`configpin.io/rollout-windows`, each of which must allow it) and the rollout budget (the
workload's `configpin.io/rollout-budget`, else `--rollout-budget`) over the starts the
workload's own record holds (`configpin.io/rollout-starts`).

Nothing here is remembered between passes but what texts mean: a workload held is a stale
workload, and whether it may roll is asked again of the clock, its annotations and its
namespace's each time it is looked at, so a restart or a new leader holds and releases
exactly what the one before did. What windows say is kept per set of lists until the answer
may change (`webhook.core.windows.standing`): one pass over 10,000 workloads under the same
lists asks the schedules once.
"""

from __future__ import annotations

import heapq
import threading
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Final

from webhook.core.budget import Budget, BudgetError, allowance, counted, encode_starts, parse_budget
from webhook.core.current import WorkloadEntry, WorkloadRef
from webhook.core.durations import format_duration
from webhook.core.record import Change, identity
from webhook.core.waves import Wait, WaitReason
from webhook.core.windows import (
    Standing,
    WindowError,
    Windows,
    parse_windows,
    said_at,
    standing,
    zone_of,
)
from webhook.process.config import Settings

_KEPT_MAX: Final = 4096  # texts whose meaning is kept, and sets of lists whose standing is
_CLUSTER: Final = "the cluster's --rollout-windows"
HELD: Final = (WaitReason.WINDOW, WaitReason.BUDGET)  # the waits of windows and budgets


@dataclass(frozen=True, slots=True)
class _Closed:
    """A list that cannot be read holds what it applies to (never rolls by accident)."""

    where: str
    error: str


class RolloutLimits:
    def __init__(
        self,
        settings: Settings,
        hkey: bytes,
        *,
        namespace_windows: Callable[[str], str | None],
        wall: Callable[[], float],
    ) -> None:
        """`namespace_windows(namespace)`: the text of its `configpin.io/rollout-windows`
        (None: not set); `wall`: the time (seconds since the epoch)."""
        self.hkey = hkey
        self.cluster: Windows = settings.windows()
        self.budget: Budget = settings.budget()
        self.namespace_windows = namespace_windows
        self.wall = wall
        self._lock = threading.Lock()
        self._lists: dict[str, Windows | str] = {}  # text -> list, or why it cannot be read
        self._budgets: dict[str, Budget | str] = {}
        self._standings: dict[tuple[str | None, str | None], Standing] = {}

    # --- what texts mean (kept, bounded)
    def _read_list(self, text: str) -> Windows | str:
        with self._lock:
            found = self._lists.get(text)
        if found is None:
            try:
                found = parse_windows(text)
            except WindowError as e:
                found = str(e)
            with self._lock:
                if len(self._lists) >= _KEPT_MAX:
                    self._lists.clear()
                self._lists[text] = found
        return found

    def budget_of(self, entry: WorkloadEntry) -> Budget:
        """Its own budget where it sets one that can be read, else the cluster's."""
        text = entry.limits.budget
        if text is None:
            return self.budget
        with self._lock:
            found = self._budgets.get(text)
        if found is None:
            try:
                found = parse_budget(text)
            except BudgetError as e:
                found = str(e)
            with self._lock:
                if len(self._budgets) >= _KEPT_MAX:
                    self._budgets.clear()
                self._budgets[text] = found
        return found if isinstance(found, Budget) else self.budget

    # --- windows
    def _lists_of(self, entry: WorkloadEntry) -> tuple[list[tuple[str, Windows]], _Closed | None]:
        """The lists that apply to `entry`, each with where it is written; or the first that
        cannot be read."""
        ns = entry.ref.namespace
        found: list[tuple[str, Windows]] = []
        if self.cluster:
            found.append((_CLUSTER, self.cluster))
        for where, text in (
            (f"namespace {ns}'s configpin.io/rollout-windows", self.namespace_windows(ns)),
            ("its configpin.io/rollout-windows", entry.limits.windows),
        ):
            if text is None:
                continue
            read = self._read_list(text)
            if isinstance(read, str):
                return found, _Closed(where, read)
            if read:
                found.append((where, read))
        return found, None

    def _standing(self, key: tuple[str | None, str | None], lists: Sequence[Windows]) -> Standing:
        now = self.wall()
        with self._lock:
            kept = self._standings.get(key)
        if kept is not None and now < kept.until:
            return kept
        answer = standing(lists, now)
        if not answer.allowed and answer.until <= now:  # (asked at its very edge)
            answer = Standing(False, now)
        with self._lock:
            if len(self._standings) >= _KEPT_MAX:
                self._standings.clear()
            self._standings[key] = answer
        return answer

    def window(self, entry: WorkloadEntry) -> Wait | None:
        """Why the windows that apply to `entry` hold its rollout now (None: they allow it)."""
        found, closed = self._lists_of(entry)
        if closed is not None:
            return Wait(
                WaitReason.WINDOW,
                f"{closed.where} cannot be read ({closed.error}): nothing rolls here until it "
                "is fixed or removed",
            )
        if not found:
            return None
        lists = [windows for _, windows in found]
        key = (self.namespace_windows(entry.ref.namespace), entry.limits.windows)
        now = self.wall()
        answer = self._standing(key, lists)
        if answer.allowed:
            return None
        closing = [where for where, windows in found if not standing([windows], now).allowed]
        which = " and ".join(closing) or "its rollout windows"
        if answer.until > now + 365 * 86_400 - 60:
            when = "they do not open within a year"
        else:
            when = f"they open {said_at(answer.until, zone_of(lists))}"
        return Wait(
            WaitReason.WINDOW,
            f"outside its rollout windows ({which}): {when}, and it rolls then, to the content "
            "of that time",
            until=answer.until,
        )

    def windows_open(self, entry: WorkloadEntry) -> tuple[bool, float | None]:
        """Whether its windows allow a rollout now and, when not, when they open (None: not
        within a year, or a list cannot be read). For the preview."""
        wait = self.window(entry)
        return (True, None) if wait is None else (False, wait.until)

    # --- the budget
    def spent(self, entry: WorkloadEntry, changes: Collection[Change]) -> Wait | None:
        """Why its rollout budget holds it (None: it allows another rollout now)."""
        budget = self.budget_of(entry)
        if budget.unlimited:
            return None
        now = self.wall()
        allows = allowance(budget, entry.limits.starts, now)
        if allows.allows(now):
            return None
        sources = ", ".join(sorted({str(c.source) for c in changes})) or "its config"
        return Wait(
            WaitReason.BUDGET,
            f"flapping: configpin started {allows.used} rollouts of it within "
            f"{format_duration(budget.period)} (its rollout budget, {budget}) and {sources} "
            f"keeps changing; it rolls once, to the latest content, at "
            f"{said_at(allows.at)} or when a person approves the change",
            until=allows.at,
        )

    def hold(
        self,
        entry: WorkloadEntry,
        changes: Sequence[Change],
        *,
        approved: Callable[[Change], bool],
        approved_now: Callable[[Change], bool],
    ) -> Wait | None:
        """Why configpin may not start the rollout of `entry` to `changes` now: its windows,
        then its budget (None: it may). `approve --now` of every change lifts both; an
        approval of every change (a person's) lifts the budget."""
        if changes and all(approved_now(c) for c in changes):
            return None
        wait = self.window(entry)
        if wait is not None:
            return wait
        if changes and all(approved(c) for c in changes):
            return None
        return self.spent(entry, changes)

    # --- the record of its starts
    def starts_text(self, entry: WorkloadEntry, now: float) -> str:
        """`configpin.io/rollout-starts` after a rollout configpin starts at `now`."""
        ref = entry.ref
        kept = counted(self.budget_of(entry), entry.limits.starts, now)
        return encode_starts(self.hkey, identity(ref.kind, ref.namespace, ref.name), kept)


class Holds:
    """The stale workloads whose rollout windows or budget hold them now, as this leader last
    looked (for `configpin_rollouts_held`, and to look at each again when it may roll). Memory
    only, and only a help: a new leader looks at every workload and finds the same."""

    def __init__(self, wall: Callable[[], float]) -> None:
        self.wall = wall
        self._lock = threading.Lock()
        self._held: dict[WorkloadRef, tuple[WaitReason, float | None]] = {}
        self._due: list[tuple[float, int, WorkloadRef]] = []  # (when to look again, seq, ref)
        self._seq = 0

    def count(self, reason: WaitReason) -> int:
        with self._lock:
            return sum(1 for r, _ in self._held.values() if r is reason)

    def refs(self) -> frozenset[WorkloadRef]:
        with self._lock:
            return frozenset(self._held)

    def looked_at(self, ref: WorkloadRef, wait: Wait | None) -> bool:
        """`ref` was looked at and held by `wait` (None, or another wait: not held); True
        when it was not held before."""
        with self._lock:
            if wait is None or wait.reason not in HELD:
                self._held.pop(ref, None)
                return False
            before = self._held.get(ref)
            self._held[ref] = (wait.reason, wait.until)
            if wait.until is not None and (before is None or before[1] != wait.until):
                self._seq += 1
                heapq.heappush(self._due, (wait.until, self._seq, ref))
            return before is None or before[0] is not wait.reason

    def due(self) -> list[WorkloadRef]:
        """The held workloads whose windows or budget may allow them now: look at them."""
        now = self.wall()
        out = []
        with self._lock:
            while self._due and self._due[0][0] <= now:
                until, _, ref = heapq.heappop(self._due)
                held = self._held.get(ref)
                if held is not None and held[1] == until:
                    out.append(ref)
        return out

    def keep_only(self, refs: Collection[WorkloadRef]) -> None:
        """Only these may still be held (the others are current, or gone)."""
        with self._lock:
            for ref in [r for r in self._held if r not in refs]:
                del self._held[ref]

    def clear(self) -> None:
        with self._lock:
            self._held.clear()
            self._due.clear()
