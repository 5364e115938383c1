"""configpin_changes_coalesced_total counts changes folded into a pending rollout: source
changes, not the other reasons a pending workload is looked at again (its own status moving,
a resync, its namespace selected)."""

from __future__ import annotations

from harness.builders import WORKLOAD_NAMESPACE
from harness.controller import StoreCache, offline_controller
from tests.unit.conftest import Store, admitted, configmap, reading, workload
from webhook.core.current import entry_from_object
from webhook.core.model import SourceId, SourceKind
from webhook.process.metrics import Metrics


def _coalesced(metrics: Metrics) -> float:
    value = metrics.registry.get_sample_value("configpin_changes_coalesced_total")
    assert value is not None
    return value


def test_only_source_changes_count_as_coalesced() -> None:
    store = Store([configmap("app-config", {"a": "1"})])
    metrics = Metrics()
    controller = offline_controller(StoreCache(store), metrics)
    entry = entry_from_object(
        admitted(workload("Deployment", reading("app-config", "a")), store), "checksum"
    )
    controller.index.put(entry)
    sid = SourceId(SourceKind.CONFIGMAP, "app-config")
    try:
        for value in ("2", "3", "4"):  # three changes: the first makes it pending
            store.put(configmap("app-config", {"a": value}))
            controller.source_changed(WORKLOAD_NAMESPACE, sid)
        assert controller.queue.pending(entry.ref) is not None
        assert _coalesced(metrics) == 2

        # its Deployment's status moves, a resync, its namespace is selected again: the
        # pending rollout is found again each time, but no change joined it
        controller.check(entry, pods_moved=True)
        controller.check_all()
        controller.namespace_selected(WORKLOAD_NAMESPACE)
        assert _coalesced(metrics) == 2
    finally:
        controller.queue.close()
