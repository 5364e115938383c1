"""When configpin may start a rollout (webhook/controller/limits.py): the rollout windows of the
cluster, the namespace and the workload combined, the rollout budget over the starts the
workload records, what holds them (Holds), and the gate and the controller around them, with
a wall clock each test sets (no test waits for a window)."""

from __future__ import annotations

import copy
from collections.abc import Collection
from datetime import UTC, datetime
from typing import Any

from harness.builders import HKEY, WORKLOAD_NAMESPACE, Store, admitted, configmap, reading, workload
from harness.controller import ApprovingCache
from tests.unit.controller.test_reconcile_requests import FakeServer
from webhook.controller.index import WorkloadIndex
from webhook.controller.leader import AlwaysLeader
from webhook.controller.limits import Holds, RolloutLimits
from webhook.controller.outcome import Poll, Rolled, Settled, Skipped
from webhook.controller.queue import Pending
from webhook.controller.rollout import RolloutController
from webhook.controller.watches import KindHandler
from webhook.controller.waves import Gate
from webhook.core import digest
from webhook.core.budget import counted, decode_starts, encode_starts, parse_budget
from webhook.core.constants import (
    ANN_HELD,
    ANN_ROLLOUT_BUDGET,
    ANN_ROLLOUT_STARTS,
    ANN_ROLLOUT_WINDOWS,
    ANN_SOURCES,
)
from webhook.core.current import WorkloadEntry, WorkloadRef, entry_from_object
from webhook.core.kinds import builtin
from webhook.core.model import JSONObject, SourceId, SourceKind
from webhook.core.reasons import SkipReason
from webhook.core.record import Change, annotations_of, identity, rollout_record
from webhook.core.times import format_time
from webhook.core.waves import Wait, WaitReason
from webhook.kube.cache import SourceCache
from webhook.kube.namespaces import NamespaceSet
from webhook.kube.raw import path
from webhook.kube.workloads import Served
from webhook.process.config import Settings
from webhook.process.metrics import Metrics

NS = WORKLOAD_NAMESPACE
CFG = SourceId(SourceKind.CONFIGMAP, "cfg")
STORE = Store([configmap("cfg", {"a": "1"})])


def at(day: int, hour: int, minute: int = 0, *, month: int = 11) -> float:
    """An instant of 2026, UTC (Monday 30 November, Tuesday 1 December)."""
    return datetime(2026, month, day, hour, minute, tzinfo=UTC).timestamp()


MON = 30
TUE = 1  # (of December)
NOW = at(MON, 10)

# The cluster rolls in business hours (Mon-Fri 09:00-17:00), the namespace not over lunch
# (12:00-13:00), and the workload not in its first hour of the day (09:00-10:00).
BUSINESS = '[{"kind": "allow", "schedule": "0 9 * * 1-5", "duration": "8h"}]'
LUNCH = '[{"kind": "deny", "schedule": "0 12 * * *", "duration": "1h"}]'
EARLY = '[{"kind": "deny", "schedule": "0 9 * * *", "duration": "1h"}]'
UNREADABLE = '[{"kind": "deny", "schedule": "0 22 * *", "duration": "60h"}]'
SAID_UNREADABLE = (
    "window 1: schedule '0 22 * *': 4 fields, five expected "
    "(minute hour day-of-month month day-of-week)"
)


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _limits(
    clock: Clock,
    *,
    cluster: str = "",
    namespaces: dict[str, str] | None = None,
    budget: str = "6/1h",
) -> RolloutLimits:
    """`namespaces`: each namespace's configpin.io/rollout-windows, as its watch keeps it (the
    test may edit the dict)."""
    texts = {} if namespaces is None else namespaces
    return RolloutLimits(
        Settings(rollout_windows=cluster, rollout_budget=budget),
        HKEY,
        namespace_windows=texts.get,
        wall=clock,
    )


def _entry(
    name: str = "web",
    *,
    windows: str | None = None,
    budget: str | None = None,
    starts: tuple[float, ...] = (),
) -> WorkloadEntry:
    """A Deployment of NS reading `cfg`, as admitted, with its own limits and the starts its
    record holds (signed for it, as configpin writes them)."""
    notes: dict[str, str] = {}
    if windows is not None:
        notes[ANN_ROLLOUT_WINDOWS] = windows
    if budget is not None:
        notes[ANN_ROLLOUT_BUDGET] = budget
    if starts:
        notes[ANN_ROLLOUT_STARTS] = encode_starts(HKEY, identity("Deployment", NS, name), starts)
    obj = workload("Deployment", reading("cfg", "a"), name=name, annotations=notes)
    found = entry_from_object(admitted(obj, STORE), "checksum", hkey=HKEY)
    assert isinstance(found, WorkloadEntry)
    return found


def _change(content: str = "c2") -> Change:
    return Change.of(NS, CFG, content, shared=False)


def _held(wait: Wait | None, reason: WaitReason = WaitReason.WINDOW) -> Wait:
    assert wait is not None and wait.reason is reason, wait
    return wait


# --- the windows: every list that applies must allow -------------------------------------


def test_each_list_must_allow_and_the_wait_names_the_list_that_holds_and_when_it_opens() -> None:
    clock = Clock(at(MON, 10))
    limits = _limits(clock, cluster=BUSINESS, namespaces={NS: LUNCH})
    web = _entry(windows=EARLY)
    assert limits.window(web) is None  # business hours, not lunch, past its first hour

    clock.now = at(MON, 12, 30)  # the namespace's lunch
    wait = _held(limits.window(web))
    assert wait.why == (
        "outside its rollout windows (namespace team-a's configpin.io/rollout-windows): they "
        "open Mon 2026-11-30 13:00 UTC, and it rolls then, to the content of that time"
    )
    assert wait.until == at(MON, 13)
    clock.now = wait.until
    assert limits.window(web) is None  # open at the opening it named

    clock.now = at(MON, 17)  # the cluster's business hours are over ...
    wait = _held(limits.window(web))
    assert "(the cluster's --rollout-windows)" in wait.why
    # ... and open at 09:00, where the workload's own list holds it until 10:00: the opening
    # is where every list allows it
    assert wait.until == at(TUE, 10, month=12)
    assert "they open Tue 2026-12-01 10:00 UTC" in wait.why

    clock.now = at(TUE, 9, 30, month=12)
    wait = _held(limits.window(web))
    assert "(its configpin.io/rollout-windows)" in wait.why
    assert wait.until == at(TUE, 10, month=12)


def test_two_lists_closed_at_once_are_both_named_and_it_waits_for_the_later() -> None:
    clock = Clock(at(MON, 12, 30))
    limits = _limits(clock, namespaces={NS: LUNCH})
    long_lunch = '[{"kind": "deny", "schedule": "0 12 * * *", "duration": "2h"}]'
    wait = _held(limits.window(_entry(windows=long_lunch)))
    assert (
        "(namespace team-a's configpin.io/rollout-windows and its configpin.io/rollout-windows)"
        in wait.why
    )
    assert wait.until == at(MON, 14)


def test_a_workload_narrows_what_its_namespace_and_the_cluster_allow_never_widens() -> None:
    always = '[{"kind": "allow", "schedule": "0 0 * * *", "duration": "24h"}]'
    clock = Clock(at(MON, 18))
    limits = _limits(clock, cluster=BUSINESS)
    assert _held(limits.window(_entry(windows=always))).until == at(TUE, 9, month=12)
    clock.now = at(MON, 12, 30)
    limits = _limits(clock, namespaces={NS: LUNCH})
    assert _held(limits.window(_entry(windows=always))).until == at(MON, 13)


def test_what_the_windows_say_follows_an_edit_of_the_namespaces_list_at_once() -> None:
    clock = Clock(at(MON, 12, 30))
    texts: dict[str, str] = {}
    limits = _limits(clock, namespaces=texts)
    web = _entry()
    assert limits.window(web) is None
    texts[NS] = LUNCH  # (its watch saw the edit)
    assert _held(limits.window(web)).until == at(MON, 13)
    del texts[NS]
    assert limits.window(web) is None
    assert limits.window_in("other", None) is None  # another namespace's lists are its own


def test_a_list_that_cannot_be_read_holds_and_says_which() -> None:
    clock = Clock(NOW)
    texts = {NS: UNREADABLE}
    limits = _limits(clock, namespaces=texts)
    web = _entry()
    wait = _held(limits.window(web))
    assert wait.why == (
        f"namespace team-a's configpin.io/rollout-windows cannot be read ({SAID_UNREADABLE}): "
        "nothing rolls here until it is fixed or removed"
    )
    assert wait.until is None  # (no opening to look again at: an edit of the list tells)
    assert limits.opening(NS, None) == "nothing rolls here until it is fixed or removed"
    texts[NS] = LUNCH  # fixed: it rolls (10:00 is not lunch), not 60 s later
    assert limits.window(web) is None

    own = _held(_limits(clock).window(_entry(windows=UNREADABLE)))
    assert own.why.startswith(
        f"its configpin.io/rollout-windows cannot be read ({SAID_UNREADABLE})"
    )


# --- the budget -------------------------------------------------------------------------


def test_past_its_budget_it_is_held_until_the_count_th_newest_start_leaves_the_period() -> None:
    clock = Clock(NOW)
    limits = _limits(clock, budget="3/1h")
    starts = (NOW - 5000, NOW - 3000, NOW - 2000, NOW - 1000)  # (the first: outside the hour)
    web = _entry(starts=starts)
    assert web.limits.starts == starts
    wait = _held(limits.spent(web, [_change()]), WaitReason.BUDGET)
    assert wait.until == NOW - 3000 + 3600  # the third newest start leaves the hour
    assert wait.why == (
        "flapping: configpin started 3 rollouts of it within 1h, all the cluster's rollout "
        "budget allows (3/1h), and configmap/cfg keeps changing; it rolls once, to the latest "
        f"content, at {format_time(NOW + 600)} or when a person approves the change"
    )
    clock.now = NOW + 599
    assert limits.spent(web, [_change()]) is not None
    clock.now = NOW + 600
    assert limits.spent(web, [_change()]) is None
    # two within the hour: one more is allowed
    assert _limits(Clock(NOW), budget="3/1h").spent(_entry(starts=starts[2:]), []) is None
    # a budget lowered since those starts: until the second newest leaves the hour
    lowered = _limits(Clock(NOW)).spent(_entry(budget="2/1h", starts=starts), [])
    lowered = _held(lowered, WaitReason.BUDGET)
    assert lowered.until == NOW - 2000 + 3600


def test_a_workloads_own_budget_is_its_own_and_one_that_cannot_be_read_is_the_clusters() -> None:
    clock = Clock(NOW)
    limits = _limits(clock, budget="3/1h")
    starts = (NOW - 20, NOW - 10)
    assert limits.spent(_entry(starts=starts), []) is None  # 2 of 3
    short = _held(limits.spent(_entry(budget="2/30s", starts=starts), []), WaitReason.BUDGET)
    assert short.until == NOW + 10
    assert limits.spent(_entry(budget="0", starts=(NOW - 3, NOW - 2, NOW - 1)), []) is None
    unreadable = _entry(budget="two a minute", starts=(NOW - 3, NOW - 2, NOW - 1))
    assert _held(limits.spent(unreadable, []), WaitReason.BUDGET).until == NOW - 3 + 3600


def test_an_approval_lifts_the_budget_not_a_window_approve_now_lifts_both() -> None:
    clock = Clock(at(MON, 12, 30))
    limits = _limits(clock, namespaces={NS: LUNCH}, budget="2/1h")
    web = _entry(starts=(clock.now - 60, clock.now - 30))
    c1, c2 = _change("c1"), Change.of(NS, SourceId(SourceKind.SECRET, "s"), "c2", shared=False)

    def hold(approved: Collection[Change], now: Collection[Change] = ()) -> Wait | None:
        """As the gate asks them (Gate.wait): the windows, then (the waves, off here) the
        budget."""
        window = limits.window_hold(web, [c1, c2], approved_now=now.__contains__)
        if window is not None:
            return window
        return limits.budget_hold(
            web, [c1, c2], approved=approved.__contains__, approved_now=now.__contains__
        )

    assert _held(hold(()))  # the window
    assert _held(hold({c1, c2})).reason is WaitReason.WINDOW  # an approval: not the window
    assert hold({c1, c2}, {c1, c2}) is None  # --now: neither
    assert _held(hold({c1, c2}, {c1})).reason is WaitReason.WINDOW  # (every change, or none)
    clock.now = at(MON, 13)  # the window opens: the budget holds
    assert _held(hold(()), WaitReason.BUDGET)
    assert _held(hold({c1}), WaitReason.BUDGET)  # (every change, or none)
    assert hold({c1, c2}) is None


# --- the record of its starts -----------------------------------------------------------


def test_the_record_of_its_starts_reads_back_and_keeps_at_most_the_count() -> None:
    limits = _limits(Clock(NOW), budget="3/1h")
    starts = (NOW - 5000, NOW - 3000, NOW - 2000, NOW - 1000)
    web = _entry(starts=starts)
    text = limits.starts_text(web, NOW)
    assert decode_starts(HKEY, identity("Deployment", NS, "web"), text) == (
        NOW - 2000,
        NOW - 1000,
        NOW,
    )
    assert _entry(starts=(NOW - 2000, NOW - 1000, NOW)).limits.starts == (
        NOW - 2000,
        NOW - 1000,
        NOW,
    )
    assert decode_starts(HKEY, identity("Deployment", NS, "other"), text) == ()  # its own
    # its own budget counts; none: the start alone, which a budget set later counts from
    assert (
        len(
            decode_starts(
                HKEY,
                identity("Deployment", NS, "web"),
                limits.starts_text(_entry(budget="2/1h", starts=starts), NOW),
            )
        )
        == 2
    )
    kept = limits.starts_text(_entry(budget="0", starts=starts), NOW)
    assert decode_starts(HKEY, identity("Deployment", NS, "web"), kept) == (NOW,)
    assert counted(parse_budget("3/1h"), starts, NOW) == (NOW - 2000, NOW - 1000, NOW)


# --- Holds ------------------------------------------------------------------------------


def _ref(name: str) -> WorkloadRef:
    return WorkloadRef("Deployment", NS, name)


def test_a_hold_is_due_when_it_may_roll_and_is_said_once_per_reason() -> None:
    clock = Clock(NOW)
    holds = Holds(clock)
    web, api = _ref("web"), _ref("api")
    window = Wait(WaitReason.WINDOW, "closed", until=NOW + 60)
    assert holds.looked_at(web, window) is True  # newly held
    assert holds.looked_at(web, window) is False  # (the same, seen again)
    assert holds.looked_at(api, Wait(WaitReason.BUDGET, "spent", until=NOW + 30)) is True
    assert holds.count(WaitReason.WINDOW) == 1 and holds.count(WaitReason.BUDGET) == 1
    assert holds.refs() == {web, api}
    assert holds.due() == []
    clock.now = NOW + 30
    assert holds.due() == [api]
    clock.now = NOW + 60
    assert holds.due() == [web]
    assert holds.due() == []  # due once; still held until looked at again
    assert holds.count(WaitReason.WINDOW) == 1
    assert holds.looked_at(web, Wait(WaitReason.BUDGET, "spent", until=NOW + 90)) is True


def test_the_same_hold_seen_pass_after_pass_is_due_once() -> None:
    clock = Clock(NOW)
    holds = Holds(clock)
    web = _ref("web")
    for _ in range(1000):
        holds.looked_at(web, Wait(WaitReason.WINDOW, "closed", until=NOW + 60))
    assert len(holds._due) == 1  # (no growth with the passes)
    clock.now = NOW + 60
    assert holds.due() == [web]


def test_a_hold_that_moves_is_due_at_its_new_time_only() -> None:
    clock = Clock(NOW)
    holds = Holds(clock)
    web = _ref("web")
    holds.looked_at(web, Wait(WaitReason.BUDGET, "spent", until=NOW + 30))
    holds.looked_at(web, Wait(WaitReason.BUDGET, "spent", until=NOW + 90))
    clock.now = NOW + 30
    assert holds.due() == []
    clock.now = NOW + 90
    assert holds.due() == [web]


def test_what_no_longer_holds_is_let_go() -> None:
    clock = Clock(NOW)
    holds = Holds(clock)
    web, api, db = _ref("web"), _ref("api"), _ref("db")
    for ref in (web, api, db):
        holds.looked_at(ref, Wait(WaitReason.WINDOW, "closed", until=NOW + 60))
    holds.looked_at(web, None)  # it rolled
    holds.looked_at(api, Wait(WaitReason.WAVE, "wave 1 first"))  # (not a window's)
    assert holds.refs() == {db} and holds.count(WaitReason.WINDOW) == 1
    holds.looked_at(web, Wait(WaitReason.WINDOW, "closed", until=NOW + 60))
    holds.keep_only({db})  # web is current now, or gone
    assert holds.refs() == {db}
    clock.now = NOW + 60
    assert holds.due() == [db]
    holds.looked_at(web, Wait(WaitReason.WINDOW, "closed", until=NOW + 120))
    holds.looked_at(db, Wait(WaitReason.WINDOW, "unreadable", until=None))  # (never due)
    holds.clear()  # (not leading any more)
    assert holds.refs() == frozenset() and holds.count(WaitReason.WINDOW) == 0
    holds.looked_at(web, Wait(WaitReason.WINDOW, "closed", until=NOW + 120))  # (leading again)
    clock.now = NOW + 120
    assert holds.due() == [web]  # once: nothing of the leadership before is left


class _Listed(list[WorkloadRef]):
    """The stale workloads as measure_staleness lists them; asking a list whether it holds
    one walks it (what made keep_only quadratic: 10,000 held took 6-7 s a pass)."""

    def __contains__(self, _ref: object) -> bool:
        raise AssertionError("a list was searched")


def test_what_may_stay_held_is_looked_up_once_each() -> None:
    holds = Holds(Clock(NOW))
    refs = [_ref(f"w{i}") for i in range(100)]
    for ref in refs:
        holds.looked_at(ref, Wait(WaitReason.WINDOW, "closed", until=NOW + 60))
    holds.keep_only(_Listed(refs[::2]))
    assert holds.refs() == set(refs[::2])


# --- the controller: a window that closes mid-change, changes while held ------------------

DEPLOYMENT = builtin("Deployment")
assert DEPLOYMENT is not None
MORNING = '[{"kind": "allow", "schedule": "0 9 * * 1-5", "duration": "3h"}]'  # 09:00-12:00


def _source(value: str) -> JSONObject:
    return configmap("cfg", {"a": value}, namespace=NS)


class _World:
    """The controller as `configpin serve` builds it, leading, over a fake API server, with
    the wall clock the test sets; NS's window list as its watch keeps it; `names`
    Deployments (2 replicas, healthy) reading `cfg`, stamped, indexed."""

    def __init__(self, names: list[str], *, waves: str, windows: str = MORNING) -> None:
        self.clock = Clock(at(MON, 11))
        self.server = FakeServer()
        self.metrics = Metrics()
        cache = SourceCache(self.server, HKEY, self.metrics)  # type: ignore[arg-type]
        namespaces = NamespaceSet(self.server, self.metrics, label_selector="")  # type: ignore[arg-type]
        meta = {"name": NS, "annotations": {ANN_ROLLOUT_WINDOWS: windows}}
        namespaces.relisted([{"metadata": meta, "status": {"phase": "Active"}}])
        settings = Settings(leader_elect=False, rollout_waves=waves, max_rolling=0)
        ctl = RolloutController(
            self.server,  # type: ignore[arg-type]
            HKEY,
            cache,
            self.metrics,
            settings,
            namespaces=namespaces,
            wall=self.clock,
        )
        ctl.watches.kinds["Deployment"] = Served(DEPLOYMENT, "/apis/apps/v1")
        ctl._synced.set()
        ctl.elector = AlwaysLeader(lambda: None)
        ctl.elector.start()
        self.ctl = ctl
        cache.indexes[SourceKind.CONFIGMAP].relisted([_source("1")])
        for name in names:
            obj = workload("Deployment", reading("cfg", "a"), name=name)
            obj["metadata"]["uid"] = f"5f0c7a6e-0000-4000-8000-{len(name):04d}{name:>08}"
            obj["metadata"]["generation"] = 1
            obj["metadata"]["creationTimestamp"] = format_time(self.clock.now - 3600)
            obj["status"] = self._status(obj, ready=True)
            stamped = admitted(obj, Store([_source("1")]))
            self.server.put(self.path(name), stamped)
            entry = ctl.restamper.entry(copy.deepcopy(stamped))
            assert isinstance(entry, WorkloadEntry)
            ctl.index.put(entry)

    @staticmethod
    def path(name: str) -> str:
        return path("deployments", NS, name, prefix="/apis/apps/v1")

    @staticmethod
    def _status(obj: JSONObject, *, ready: bool) -> JSONObject:
        gen, want = obj["metadata"]["generation"], obj["spec"]["replicas"]
        return {
            "observedGeneration": gen,
            "replicas": want if ready else want + 1,
            "updatedReplicas": want if ready else 1,
            "readyReplicas": want if ready else want - 1,
            "availableReplicas": want if ready else want - 1,
        }

    def change(self, value: str) -> Change:
        """`cfg` is written (its watch's event), and the change it makes."""
        self.ctl.cache.indexes[SourceKind.CONFIGMAP].event("MODIFIED", _source(value))
        [change] = self.ctl.gate.changes(NS, [CFG])
        return change

    def reconcile(self, name: str) -> Any:
        """One look of the rollout queue's worker at it."""
        return self.ctl._reconcile(_ref(name), Pending(0.0, 0.0, {CFG}))

    def progress(self, name: str, *, ready: bool) -> Any:
        """The Deployment controller's answer to its rollout; then the follow queue's look."""
        obj = self.server.objects[self.path(name)]
        obj["metadata"]["generation"] += 1
        obj["status"] = self._status(obj, ready=ready)
        self.server.put(self.path(name), obj)
        return self.ctl.apply(_ref(name), follow_only=True)

    def patches(self, name: str) -> int:
        return self.server.count("PATCH", self.path(name))

    def conflicts(self) -> float | None:
        return self.metrics.registry.get_sample_value("configpin_patch_conflicts_total")

    def held_note(self, name: str) -> Any:
        """The workload's configpin.io/held, as stored."""
        return annotations_of(self.server.objects[self.path(name)]).get(ANN_HELD)

    def held(self, reason: WaitReason = WaitReason.WINDOW) -> float | None:
        return self.metrics.registry.get_sample_value(
            "configpin_rollouts_held", {"reason": reason.value}
        )

    def stale_gauge(self) -> float | None:
        return self.metrics.registry.get_sample_value("configpin_workloads_stale")


def _wait_of(outcome: Any) -> Wait:
    assert isinstance(outcome, Skipped) and outcome.reason is SkipReason.WAITING, outcome
    assert outcome.wait is not None
    return outcome.wait


def test_a_window_that_closes_mid_change_lets_started_rollouts_finish_and_starts_no_new_one() -> (
    None
):
    world = _World(["w0", "w1", "w2"], waves="1,100%")
    change = world.change("2")
    first, second = world.ctl.gate.cut.plan(change)
    [canary] = first
    assert isinstance(world.reconcile(canary.name), Rolled)  # 11:00: the window is open
    assert _wait_of(world.reconcile(second[0].name)).reason is WaitReason.WAVE

    world.clock.now = at(MON, 12)  # the window closes while wave 1 rolls
    assert isinstance(world.progress(canary.name, ready=False), Poll)  # followed, not held
    done = world.progress(canary.name, ready=True)
    assert isinstance(done, Settled) and done.state == "complete"
    for ref in second:  # wave 1 is complete: wave 2 would start, but the window is closed
        wait = _wait_of(world.reconcile(ref.name))
        assert wait.reason is WaitReason.WINDOW and wait.until == at(TUE, 9, month=12)
        assert world.patches(ref.name) == 1  # (configpin.io/held, nothing else)
        assert world.held_note(ref.name).startswith("AwaitingWindow: ")
    assert world.held() == 2
    assert world.ctl.measure_staleness() == 2 and world.stale_gauge() == 0  # held: not overdue

    world.clock.now = at(TUE, 9, month=12)  # it opens: the held ones are due, and roll
    assert sorted(world.ctl.holds.due()) == sorted(second)
    for ref in second:
        assert isinstance(world.reconcile(ref.name), Rolled)
        record = rollout_record(HKEY, world.server.objects[world.path(ref.name)])
        assert record is not None and record.changes == (change,)
        assert world.held_note(ref.name) is None  # (taken off by the re-stamp itself)
        # the held note, then the re-stamp planned from the index, which no watch feeds here:
        # the note's write indexed its version, so that plan lands (no 409, no read)
        assert world.patches(ref.name) == 2
    assert world.conflicts() == 0
    assert world.held() == 0


def test_changes_while_held_roll_once_to_the_latest_content_when_the_window_opens() -> None:
    world = _World(["web"], waves="off")
    world.clock.now = at(MON, 12, 30)  # closed
    world.change("2")
    assert _wait_of(world.reconcile("web")).reason is WaitReason.WINDOW
    latest = world.change("3")  # a second change while it waits
    assert _wait_of(world.reconcile("web")).reason is WaitReason.WINDOW
    # (configpin.io/held, written once: the second look finds it says so already)
    assert world.patches("web") == 1 and world.held() == 1
    assert world.held_note("web").startswith("AwaitingWindow: ")

    world.clock.now = at(TUE, 9, month=12)
    world.ctl._housekeeping()  # its hold is due: looked at again, queued
    assert world.ctl.queue.pending(_ref("web")) is not None
    assert isinstance(world.reconcile("web"), Rolled)
    assert world.patches("web") == 2  # the note, and one rollout (no 409: see above) ...
    assert world.conflicts() == 0
    assert world.held_note("web") is None
    stored = world.server.objects[world.path("web")]
    record = rollout_record(HKEY, stored)
    assert record is not None and record.changes == (latest,)  # ... to the latest content
    template = stored["spec"]["template"]["metadata"]["annotations"][ANN_SOURCES]
    three = digest.record_from_object(HKEY, CFG.kind, _source("3"))
    expected = digest.source_digest(digest.namespace_key(HKEY, NS), three, frozenset({"a"}))
    assert expected in template
    starts = decode_starts(
        HKEY,
        identity("Deployment", NS, "web"),
        stored["metadata"]["annotations"][ANN_ROLLOUT_STARTS],
    )
    assert starts == (at(TUE, 9, month=12),)  # counted in the same write


# --- the gate: after the waves, before the cap; approvals -----------------------------------


def test_the_gate_asks_the_windows_first_the_waves_then_the_budget_and_the_cap() -> None:
    store = Store([configmap("cfg", {"a": "1"})])
    index = WorkloadIndex()
    objs = {}
    for name in ("w0", "w1", "w2"):
        obj = admitted(workload("Deployment", reading("cfg", "a"), name=name), store)
        objs[name] = obj
        found = entry_from_object(obj, "checksum", hkey=HKEY)
        assert isinstance(found, WorkloadEntry)
        index.put(found)
    store.put(configmap("cfg", {"a": "2"}))
    cache = ApprovingCache(store)
    clock = Clock(at(MON, 12, 30))
    limits = _limits(clock, namespaces={NS: LUNCH}, budget="2/1h")
    settings = Settings(rollout_waves="1,100%", max_rolling=1)
    gate = Gate(index, cache, HKEY, settings, in_scope=lambda _ns: True, limits=limits)  # type: ignore[arg-type]
    [change] = gate.changes(NS, [CFG])
    [[canary], later] = gate.cut.plan(change)
    # its windows are asked first: a later wave's member in a closed window says so
    assert _held(gate.wait(later[0], [change]), WaitReason.WINDOW).until == at(MON, 13)
    assert _held(gate.wait(canary, [change])).until == at(MON, 13)
    assert gate.in_flight(NS) == 0  # a held workload takes no place under the cap

    cache.approved = change.content  # an approval: not the window
    assert _held(gate.wait(canary, [change])).until == at(MON, 13)
    cache.approved_now = change.content  # approve --now: it rolls now, its place taken
    assert gate.wait(canary, [change]) is None
    assert gate.in_flight(NS) == 1
    gate.release(canary)
    cache.approved = cache.approved_now = None

    # past its budget, at 13:00: held as flapping until the change is approved
    obj = copy.deepcopy(objs[canary.name])
    obj["metadata"].setdefault("annotations", {})[ANN_ROLLOUT_STARTS] = encode_starts(
        HKEY, identity("Deployment", NS, canary.name), (at(MON, 12, 10), at(MON, 12, 20))
    )
    found = entry_from_object(obj, "checksum", hkey=HKEY)
    assert isinstance(found, WorkloadEntry)
    index.put(found)
    clock.now = at(MON, 13)
    assert _held(gate.wait(later[0], [change]), WaitReason.WAVE)  # the waves, then the budget
    assert _held(gate.wait(canary, [change]), WaitReason.BUDGET).until == at(MON, 13, 10)
    cache.approved = change.content
    assert gate.wait(canary, [change]) is None


def test_an_edit_of_the_namespaces_window_list_looks_at_what_it_holds_again() -> None:
    world = _World(["web"], waves="off")
    ctl = world.ctl
    ctl.namespaces.listeners.append(ctl.namespace_selected)  # (as the controller starts)
    world.clock.now = at(MON, 12, 30)  # closed
    world.change("2")
    assert _wait_of(world.reconcile("web")).reason is WaitReason.WINDOW
    relabelled = {
        "name": NS,
        "labels": {"team": "a"},
        "annotations": {ANN_ROLLOUT_WINDOWS: MORNING},
    }
    ctl.namespaces.event("MODIFIED", {"metadata": relabelled, "status": {"phase": "Active"}})
    assert ctl.queue.pending(_ref("web")) is None  # (its list is as it was)
    ctl.namespaces.event("MODIFIED", {"metadata": {"name": NS}, "status": {"phase": "Active"}})
    assert ctl.namespaces.windows_of(NS) is None
    assert ctl.queue.pending(_ref("web")) is not None  # its list was removed: looked at again
    assert isinstance(world.reconcile("web"), Rolled)
    assert world.held() == 0


def test_a_window_hold_whose_held_marker_a_reapply_took_away_is_marked_again() -> None:
    """A change waits for its window; the worker marks the workload `configpin.io/held`, and
    the resyncs take the hold as known from then on (no worker reads it again). A GitOps tool
    re-applies the workload as Git says, without the marker, and nothing else of it moves:
    its watch's event hands it to a worker, which marks it again (its template untouched);
    a resync after a relist that missed that event does the same."""
    world = _World(["web"], waves="off")
    ctl, ref = world.ctl, _ref("web")
    handler = KindHandler(ctl, "Deployment")
    world.clock.now = at(MON, 12, 30)  # closed
    world.change("2")
    assert _wait_of(world.reconcile("web")).reason is WaitReason.WINDOW
    assert world.held_note("web").startswith("AwaitingWindow: ")
    entry = ctl.index.get(ref)
    assert entry is not None and entry.held  # (indexed with its write, not after the watch)
    ctl.check_all()
    assert ctl.queue.pending(ref) is None  # a resync: held, as memory says, and marked
    marked = copy.deepcopy(world.server.objects[world.path("web")])
    handler.event("MODIFIED", copy.deepcopy(marked))  # (the marker's own event: nothing)
    assert ctl.queue.pending(ref) is None

    def reapplied() -> JSONObject:
        obj = copy.deepcopy(marked)
        del obj["metadata"]["annotations"][ANN_HELD]
        obj["metadata"]["resourceVersion"] = str(int(obj["metadata"]["resourceVersion"]) + 1)
        world.server.put(world.path("web"), obj)
        return copy.deepcopy(obj)

    handler.event("MODIFIED", reapplied())
    assert ctl.queue.pending(ref) is not None
    ctl.queue.forget(ref)
    patched = world.patches("web")
    assert _wait_of(world.reconcile("web")).reason is WaitReason.WINDOW
    assert world.held_note("web").startswith("AwaitingWindow: ")
    assert world.patches("web") == patched + 1  # (the marker, nothing else)
    stored = world.server.objects[world.path("web")]
    assert stored["spec"]["template"] == marked["spec"]["template"]

    handler.relisted([reapplied()])  # (the event missed: a relist finds it unmarked)
    assert ctl.queue.pending(ref) is not None
    ctl.queue.forget(ref)
    assert _wait_of(world.reconcile("web")).reason is WaitReason.WINDOW
    assert world.held_note("web").startswith("AwaitingWindow: ")
    ctl.check_all()
    assert ctl.queue.pending(ref) is None
