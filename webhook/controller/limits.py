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
from typing import Final, TypeVar

from cachetools import LRUCache

from webhook.core.budget import Budget, BudgetError, allowance, counted, encode_starts, parse_budget
from webhook.core.current import WorkloadEntry, WorkloadRef
from webhook.core.durations import format_duration
from webhook.core.record import Change, identity
from webhook.core.times import format_time
from webhook.core.waves import Wait, WaitReason
from webhook.core.windows import (
    LOOK_AHEAD,
    WindowError,
    Windows,
    parse_windows,
    said_at,
    standing,
    zone_of,
)
from webhook.process.config import Settings

# Texts whose meaning is kept, and pairs of them whose verdict is: more than a cluster holds
# workloads with lists of their own (at 4,096 a pass over 10,000 distinct texts forgot them as
# it went and asked every schedule again, 6 s a pass: bench.windows distinct-all). The texts
# are the index entries' own strings; a parsed list or a verdict is a few hundred bytes. Past
# that, the least recently asked are forgotten, one at a time (never all at once).
_KEPT_MAX: Final = 65_536
T = TypeVar("T")
_CLUSTER: Final = "the cluster's --rollout-windows"
_UNREADABLE_AGAIN: Final = 60.0  # seconds a list that cannot be read is believed so
HELD: Final = (WaitReason.WINDOW, WaitReason.BUDGET)  # the waits of windows and budgets


@dataclass(frozen=True, slots=True)
class _Verdict:
    """What the windows of one pair of texts (a namespace's, a workload's) say, until when."""

    allowed: bool
    until: float  # (excluded) it holds at least until then
    why: str  # (closed) which lists hold it
    when: str  # (closed) when they open, as a person reads it
    opens: float | None  # (closed) when they open (None: not within a year, unreadable)


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
        self.cluster: Windows = settings.rollout.windows
        self.budget: Budget = settings.rollout.budget
        self.written = settings.rollout.budget_text
        self.namespace_windows = namespace_windows
        self.wall = wall
        self._lock = threading.Lock()  # (the three caches: the workers and the housekeeping)
        # text -> list, or why it cannot be read
        self._lists: LRUCache[str, Windows | str] = LRUCache(maxsize=_KEPT_MAX)
        self._budgets: LRUCache[str, Budget | str] = LRUCache(maxsize=_KEPT_MAX)
        self._verdicts: LRUCache[tuple[str | None, str | None], _Verdict] = LRUCache(
            maxsize=_KEPT_MAX
        )

    # --- what texts mean (kept, bounded)
    def _read(self, kept: LRUCache[str, T | str], text: str, parse: Callable[[str], T]) -> T | str:
        """What `text` means as `parse` reads it, or why it cannot be read (kept in `kept`)."""
        with self._lock:
            found = kept.get(text)
        if found is None:
            try:
                found = parse(text)
            except (WindowError, BudgetError) as e:
                found = str(e)
            with self._lock:
                kept[text] = found
        return found

    def _read_list(self, text: str) -> Windows | str:
        return self._read(self._lists, text, parse_windows)

    def budget_of(self, entry: WorkloadEntry) -> Budget:
        """Its own budget where it sets one that can be read, else the cluster's."""
        text = entry.limits.budget
        if text is None:
            return self.budget
        found = self._read(self._budgets, text, parse_budget)
        return found if isinstance(found, Budget) else self.budget

    # --- windows
    def _lists_of(
        self, ns: str, own: str | None
    ) -> tuple[list[tuple[str, Windows]], _Closed | None]:
        """The lists that apply to a workload of namespace `ns` whose own list is `own`, each
        with where it is written; or the first that cannot be read."""
        found: list[tuple[str, Windows]] = []
        if self.cluster:
            found.append((_CLUSTER, self.cluster))
        for where, text in (
            (f"namespace {ns}'s configpin.io/rollout-windows", self.namespace_windows(ns)),
            ("its configpin.io/rollout-windows", own),
        ):
            if text is None:
                continue
            read = self._read_list(text)
            if isinstance(read, str):
                return found, _Closed(where, read)
            if read:
                found.append((where, read))
        return found, None

    def _verdict(self, ns: str, own: str | None) -> _Verdict | None:
        """What the windows that apply to a workload of namespace `ns` whose own list is
        `own` say now (None: none apply), kept per pair of texts until it may change."""
        key = (self.namespace_windows(ns), own)
        now = self.wall()
        with self._lock:
            kept = self._verdicts.get(key)
        if kept is not None and now < kept.until:
            return kept
        found, closed = self._lists_of(ns, own)
        if closed is not None:
            verdict = _Verdict(
                False,
                now + _UNREADABLE_AGAIN,
                f"{closed.where} cannot be read ({closed.error})",
                "nothing rolls here until it is fixed or removed",
                None,
            )
        elif not found:
            verdict = _Verdict(True, now + LOOK_AHEAD, "", "", None)
        else:
            lists = [windows for _, windows in found]
            answer = standing(lists, now)
            if answer.allowed:
                verdict = _Verdict(True, answer.until, "", "", None)
            else:
                each = [(w, standing([windows], now)) for w, windows in found]
                closing = [w for w, said in each if not said.allowed]
                until = max(answer.until, now)
                verdict = _Verdict(
                    False,
                    # (kept until one list's own answer changes: which lists hold it is said)
                    max(now, min([until, *(said.until for _, said in each)])),
                    f"outside its rollout windows ({' and '.join(closing)})",
                    opens(until, lists, now),
                    until,
                )
        with self._lock:
            self._verdicts[key] = verdict
        return verdict

    def window(self, entry: WorkloadEntry) -> Wait | None:
        """Why the windows that apply to `entry` hold its rollout now (None: they allow it)."""
        return self.window_in(entry.ref.namespace, entry.limits.windows)

    def window_in(self, ns: str, own: str | None) -> Wait | None:
        """Why the windows that apply to a workload of namespace `ns` whose own list is `own`
        hold its rollout now (None: they allow it)."""
        verdict = self._verdict(ns, own)
        if verdict is None or verdict.allowed:
            return None
        rolls = ", and it rolls then, to the content of that time" if verdict.opens else ""
        return Wait(WaitReason.WINDOW, f"{verdict.why}: {verdict.when}{rolls}", until=verdict.opens)

    def opening(self, ns: str, own: str | None) -> str | None:
        """(the preview) None when the windows allow a rollout now; else when they open."""
        verdict = self._verdict(ns, own)
        return None if verdict is None or verdict.allowed else verdict.when

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
        own = entry.limits.budget
        which = "its" if own is not None and budget is not self.budget else "the cluster's"
        return Wait(
            WaitReason.BUDGET,
            f"flapping: configpin started {allows.used} rollouts of it within "
            f"{_short(format_duration(budget.period))}, all {which} rollout budget allows "
            f"({self._said(budget, own)}), and {sources} keeps changing; it rolls once, to the "
            f"latest content, at {format_time(allows.at)} or when a person approves the change",
            until=allows.at,
        )

    def _said(self, budget: Budget, own: str | None) -> str:
        """The budget as it was written (the annotation's text, or the flag's)."""
        if own is not None and budget is not self.budget:
            return own.strip()
        return self.written

    def window_hold(
        self,
        entry: WorkloadEntry,
        changes: Sequence[Change],
        *,
        approved_now: Callable[[Change], bool],
    ) -> Wait | None:
        """Why its windows hold the rollout of `entry` to `changes` (None: they do not, or
        every change was approved --now)."""
        if changes and all(approved_now(c) for c in changes):
            return None
        return self.window(entry)

    def budget_hold(
        self,
        entry: WorkloadEntry,
        changes: Sequence[Change],
        *,
        approved: Callable[[Change], bool],
        approved_now: Callable[[Change], bool],
    ) -> Wait | None:
        """Why its budget holds the rollout of `entry` to `changes` (None: it does not, or a
        person approved every change)."""
        if changes and all(approved_now(c) or approved(c) for c in changes):
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
        self._held: dict[WorkloadRef, Wait] = {}
        self._due: list[tuple[float, int, WorkloadRef]] = []  # (when to look again, seq, ref)
        self._seq = 0

    def count(self, reason: WaitReason) -> int:
        with self._lock:
            return sum(1 for w in self._held.values() if w.reason is reason)

    def refs(self) -> frozenset[WorkloadRef]:
        with self._lock:
            return frozenset(self._held)

    def of(self, ref: WorkloadRef) -> Wait | None:
        """What holds `ref` (why, and until when), as its last look found; None: not held."""
        with self._lock:
            return self._held.get(ref)

    def looked_at(self, ref: WorkloadRef, wait: Wait | None) -> bool:
        """`ref` was looked at and held by `wait` (None, or another wait: not held); True
        when it was not held before."""
        with self._lock:
            if wait is None or wait.reason not in HELD:
                self._held.pop(ref, None)
                return False
            before = self._held.get(ref)
            self._held[ref] = wait
            if wait.until is not None and (before is None or before.until != wait.until):
                self._seq += 1
                heapq.heappush(self._due, (wait.until, self._seq, ref))
            return before is None or before.reason is not wait.reason

    def due(self) -> list[WorkloadRef]:
        """The held workloads whose windows or budget may allow them now: look at them."""
        now = self.wall()
        out = []
        with self._lock:
            while self._due and self._due[0][0] <= now:
                until, _, ref = heapq.heappop(self._due)
                held = self._held.get(ref)
                if held is not None and held.until == until:
                    out.append(ref)
        return out

    def keep_only(self, refs: Collection[WorkloadRef]) -> None:
        """Only these may still be held (the others are current, or gone)."""
        keep = refs if isinstance(refs, (set, frozenset)) else frozenset(refs)  # (not a list)
        with self._lock:
            for ref in [r for r in self._held if r not in keep]:
                del self._held[ref]

    def clear(self) -> None:
        with self._lock:
            self._held.clear()
            self._due.clear()


def opens(until: float, lists: Sequence[Windows], now: float) -> str:
    """When held windows open, as a person reads it."""
    if until >= now + LOOK_AHEAD - 60:
        return "they do not open within a year"  # (looked that far)
    return f"they open {said_at(until, zone_of(lists))}"


def _short(duration: str) -> str:
    """Go's form without its zero parts: 1h0m0s as 1h, 1m30s as it is."""
    if duration.endswith("m0s"):
        duration = duration[:-2]
    if duration.endswith("h0m"):
        duration = duration[:-2]
    return duration
