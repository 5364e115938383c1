"""How many workloads are stale, and for how long (configpin_workloads_stale,
configpin_workload_stale_seconds_max), counted by the leader from its index."""

from __future__ import annotations

from harness.controller import StoreCache, offline_controller
from tests.unit.conftest import (
    ALL,
    HKEY,
    Store,
    admitted,
    apply,
    configmap,
    plan,
    reading,
    workload,
)
from webhook.core.constants import ANN_ROLLOUT_WINDOWS
from webhook.core.current import entry_from_object, stale_sources
from webhook.process.config import Settings
from webhook.process.metrics import Metrics


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _sample(metrics: Metrics, name: str) -> float:
    value = metrics.registry.get_sample_value(name)
    assert value is not None
    return value


def test_a_workload_counts_as_stale_from_the_change_until_it_is_current() -> None:
    store = Store([configmap("app-config", {"a": "1"})])
    clock, metrics = Clock(), Metrics()
    controller = offline_controller(StoreCache(store), metrics, clock=clock)
    spec = reading("app-config", "a")
    web = workload("Deployment", spec, name="web")
    stamped = admitted(web, store)
    other = apply(workload("Deployment", spec, name="other"), plan(web, store))
    for obj in (stamped, other):
        controller.index.put(entry_from_object(obj, "checksum"))

    assert controller.measure_staleness() == 0
    assert _sample(metrics, "configpin_workloads_stale") == 0
    assert _sample(metrics, "configpin_workload_stale_seconds_max") == 0

    store.put(configmap("app-config", {"a": "2"}))  # both consume it: both stale
    clock.now += 10
    assert controller.measure_staleness() == 2
    clock.now += 90
    assert _sample(metrics, "configpin_workloads_stale") == 2
    assert _sample(metrics, "configpin_workload_stale_seconds_max") == 90

    # `web` is rolled (its record now names the new content); `other` is still waiting
    rolled = admitted(stamped, store, operation="UPDATE", old=stamped, refresh=ALL)
    controller.index.put(entry_from_object(rolled, "checksum"))
    assert controller.measure_staleness() == 1
    clock.now += 5
    assert _sample(metrics, "configpin_workload_stale_seconds_max") == 95

    # the content goes back to what `other` recorded: nothing is stale any more
    store.put(configmap("app-config", {"a": "1"}))
    controller.index.remove(entry_from_object(rolled, "checksum").ref)  # (web: deleted)
    assert controller.measure_staleness() == 0
    assert _sample(metrics, "configpin_workload_stale_seconds_max") == 0


def test_only_the_leader_counts() -> None:
    store = Store([configmap("app-config", {"a": "1"})])
    clock, metrics = Clock(), Metrics()
    controller = offline_controller(StoreCache(store), metrics, clock=clock)
    web = workload("Deployment", reading("app-config", "a"))
    controller.index.put(entry_from_object(admitted(web, store), "checksum"))
    store.put(configmap("app-config", {"a": "2"}))
    assert controller.measure_staleness() == 1
    assert controller.elector is not None
    controller.elector.stop()  # leadership lost: another replica counts now
    assert controller.measure_staleness() == 0
    assert _sample(metrics, "configpin_workloads_stale") == 0
    assert _sample(metrics, "configpin_workload_stale_seconds_max") == 0


def test_a_workload_seen_stale_by_a_check_counts_from_the_change() -> None:
    """A change is checked at once (source_changed): its age counts from then, not from the
    next periodic count."""
    store = Store([configmap("app-config", {"a": "1"})])
    clock, metrics = Clock(), Metrics()
    controller = offline_controller(StoreCache(store), metrics, clock=clock)
    web = workload("Deployment", reading("app-config", "a"))
    entry = entry_from_object(admitted(web, store), "checksum")
    controller.index.put(entry)
    store.put(configmap("app-config", {"a": "2"}))
    assert controller.check(entry, seen=clock.now)
    clock.now += 30
    controller.measure_staleness()
    assert _sample(metrics, "configpin_workload_stale_seconds_max") == 30
    controller.queue.close()


def test_a_workload_its_windows_hold_is_counted_held_not_stale() -> None:
    """A stale workload whose rollout windows hold it is not overdue: it is counted in
    configpin_rollouts_held{reason="window"}, not in configpin_workloads_stale, from the pass
    that found it held (the gate's answer) until it is current or rolls."""
    store = Store([configmap("app-config", {"a": "1"})])
    clock, metrics = Clock(), Metrics()
    wall = Clock()
    wall.now = 1_796_041_800.0  # Mon 2026-11-30 12:30 UTC
    lunch = '[{"kind": "deny", "schedule": "0 12 * * *", "duration": "1h"}]'
    settings = Settings(rollout_waves="off")  # (each rolls alone: none waits for another)
    controller = offline_controller(
        StoreCache(store), metrics, clock=clock, wall=wall, settings=settings
    )
    spec = reading("app-config", "a")
    objs = {
        name: admitted(workload("Deployment", spec, name=name, annotations=notes), store)
        for name, notes in (
            ("web", {ANN_ROLLOUT_WINDOWS: lunch}),
            ("api", {ANN_ROLLOUT_WINDOWS: lunch}),
            ("db", None),
        )
    }
    for obj in objs.values():
        controller.index.put(entry_from_object(obj, "checksum", hkey=HKEY))
    store.put(configmap("app-config", {"a": "2"}))

    def looked_at() -> None:  # (what the rollout queue's worker finds of each)
        for entry in controller.index.entries():
            stale = stale_sources(entry, store.lookup, HKEY)
            if stale:
                _, wait = controller.gate.admit(entry.ref, stale, entry)
                controller.gate.release(entry.ref)
                controller.holds.looked_at(entry.ref, wait)

    looked_at()
    assert controller.measure_staleness() == 3
    assert _sample(metrics, "configpin_workloads_stale") == 1  # db: overdue
    held = {"reason": "window"}
    assert metrics.registry.get_sample_value("configpin_rollouts_held", held) == 2
    clock.now += 600
    assert _sample(metrics, "configpin_workload_stale_seconds_max") == 600  # db's

    # web is rolled by a person meanwhile: current, no longer held
    rolled = admitted(objs["web"], store, operation="UPDATE", old=objs["web"], refresh=ALL)
    controller.index.put(entry_from_object(rolled, "checksum", hkey=HKEY))
    assert controller.measure_staleness() == 2
    assert metrics.registry.get_sample_value("configpin_rollouts_held", held) == 1
    wall.now += 1800  # 13:00: api's window opens; looked at, it may roll: overdue now
    looked_at()
    controller.measure_staleness()
    assert metrics.registry.get_sample_value("configpin_rollouts_held", held) == 0
    assert _sample(metrics, "configpin_workloads_stale") == 2
    controller.queue.close()
