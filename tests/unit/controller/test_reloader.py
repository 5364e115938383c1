"""A change that Stakater Reloader's annotations ask Reloader to roll a workload for is left to
Reloader (one restart, not two); any other change is configpin's, as before."""

from __future__ import annotations

import pytest

from harness.builders import WORKLOAD_NAMESPACE
from harness.controller import StoreCache, offline_controller
from tests.unit.conftest import (
    HKEY,
    Store,
    admitted,
    configmap,
    container,
    env_cm,
    pod_spec,
    workload,
)
from tests.unit.controller.test_preview import NS, _world  # (its world of Deployments)
from tests.unit.controller.test_restamp import Case
from webhook.controller.restamp import touches_template
from webhook.core import digest
from webhook.core.current import WorkloadEntry, entry_from_object
from webhook.core.model import JSONObject, SourceId, SourceKind
from webhook.core.preview import Effect, summary
from webhook.core.reasons import SkipReason
from webhook.process.config import Settings
from webhook.process.metrics import Metrics

AUTO = {"reloader.stakater.com/auto": "true"}
IGNORE = {"reloader.stakater.com/ignore": "true"}
SPEC = pod_spec(container(env=[env_cm("cfg", "a"), env_cm("other", "a")]))
CFG = SourceId(SourceKind.CONFIGMAP, "cfg")


def _store() -> Store:
    return Store([configmap("cfg", {"a": "1"}), configmap("other", {"a": "1"})])


def _workload(store: Store, annotations: dict[str, str] | None = None) -> JSONObject:
    obj = admitted(workload("Deployment", SPEC, annotations=annotations), store)
    obj["metadata"]["resourceVersion"] = "41"
    return obj


def _skipped(metrics: Metrics) -> float:
    value = metrics.registry.get_sample_value(
        "configpin_rollouts_skipped_total", {"reason": "left-to-reloader"}
    )
    return value or 0.0


def test_a_change_reloader_rolls_it_for_is_left_to_reloader() -> None:
    store = _store()
    obj = _workload(store, AUTO)
    case = Case(store)
    store.put(configmap("cfg", {"a": "2"}))
    assert case.decide(obj).skip is SkipReason.RELOADER
    assert case.from_index(obj) is None  # (the plain path leaves it to the decision)


def test_without_reloaders_annotations_the_same_change_rolls() -> None:
    store = _store()
    obj = _workload(store)
    store.put(configmap("cfg", {"a": "2"}))
    assert touches_template("Deployment", Case(store).decide(obj).ops)


def test_a_source_reloader_ignores_is_rolled_by_configpin() -> None:
    store = _store()
    obj = _workload(store, AUTO)
    store.put(configmap("cfg", {"a": "2"}, annotations=IGNORE))
    decision = Case(store).decide(obj)
    assert decision.skip is None and touches_template("Deployment", decision.ops)


def test_a_change_of_another_source_too_rolls_both() -> None:
    """`reload` names one source; the other changes at once: configpin rolls (never a missed
    change), recording both."""
    store = _store()
    obj = _workload(store, {"configmap.reloader.stakater.com/reload": "cfg"})
    store.put(configmap("cfg", {"a": "2"}))
    case = Case(store)
    assert case.decide(obj).skip is SkipReason.RELOADER
    store.put(configmap("other", {"a": "2"}))
    decision = case.decide(obj)
    assert touches_template("Deployment", decision.ops)
    assert set(decision.intended) == {"configmap/cfg", "configmap/other"}


def test_snapshot_mode_is_never_left_to_reloader() -> None:
    store = _store()
    obj = _workload(store, AUTO)
    case = Case(store)
    case.settings = Settings(mode="snapshot")
    store.put(configmap("cfg", {"a": "2"}))
    assert case.decide(obj).skip is not SkipReason.RELOADER


@pytest.mark.parametrize(
    ("annotations", "source_annotations", "queued"),
    [
        (AUTO, None, False),
        (AUTO, IGNORE, True),
        (None, None, True),
        ({"configmap.reloader.stakater.com/reload": "nothing-here"}, None, True),
    ],
)
def test_the_controller_does_not_queue_what_it_leaves_to_reloader(
    annotations: dict[str, str] | None,
    source_annotations: dict[str, str] | None,
    queued: bool,
) -> None:
    store = _store()
    metrics = Metrics()
    controller = offline_controller(StoreCache(store), metrics)
    entry = entry_from_object(_workload(store, annotations), "checksum")
    assert isinstance(entry, WorkloadEntry)
    controller.index.put(entry)
    try:
        store.put(configmap("cfg", {"a": "2"}, annotations=source_annotations))
        controller.source_changed(WORKLOAD_NAMESPACE, CFG)
        assert (controller.queue.pending(entry.ref) is not None) is queued
        assert _skipped(metrics) == (0 if queued else 1)
        if not queued:  # still stale until Reloader's restart is admitted
            assert controller.measure_staleness() == 1
    finally:
        controller.queue.close()


def test_the_preview_says_which_consumers_are_left_to_reloader() -> None:
    """A write of `cfg`: `auto` is restarted by Reloader (said, with the annotation); `plain`
    and `ignored-by-reloader` roll as ever; a write that also marks the source ignore rolls
    both."""
    reads = pod_spec(container(env=[env_cm("web-config", "a")]))
    store = Store([configmap("web-config", {"a": "1"}, namespace=NS)])
    previewer, _ = _world(
        store, {"auto": {"spec": reads, "annotations": AUTO}, "plain": {"spec": reads}}
    )
    sid = SourceId(SourceKind.CONFIGMAP, "web-config")
    new = digest.record_from_object(
        HKEY, sid.kind, configmap("web-config", {"a": "2"}, namespace=NS)
    )
    rows = previewer.rows(NS, sid, frozenset({"a"}), new)
    assert rows is not None
    by = {r.name: r for r in rows}
    assert by["auto"].action is Effect.RELOADER
    assert by["auto"].note == "reloader.stakater.com/auto on the workload"
    assert by["plain"].action is Effect.ROLL
    [line, *_] = summary(sid.kind, NS, "web-config", {"a"}, rows)
    assert "1 roll" in line and "1 are left to Reloader" in line
    ignored = configmap("web-config", {"a": "2"}, namespace=NS, annotations=IGNORE)
    rows = previewer.rows(
        NS, sid, frozenset({"a"}), digest.record_from_object(HKEY, sid.kind, ignored)
    )
    assert rows is not None and {r.action for r in rows} == {Effect.ROLL}
