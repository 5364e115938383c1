"""How many workloads are stale, and for how long (configpin_workloads_stale,
configpin_workload_stale_seconds_max), counted by the leader from its index."""

from __future__ import annotations

from harness.controller import StoreCache, offline_controller
from tests.unit.conftest import (
    ALL,
    Store,
    admitted,
    apply,
    configmap,
    plan,
    reading,
    workload,
)
from webhook.core.current import entry_from_object
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
