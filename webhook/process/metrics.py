"""Prometheus metrics, in one registry per process (tests build their own)."""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from enum import StrEnum
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import Metric
from prometheus_client.utils import INF, floatToGoString

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_ROLL_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
_WAIT_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0)


class Tally:
    """A count the event loop keeps as a plain number, folded into its Counter child whenever
    the registry is read (`LoopCounts`): what every admission counts costs an attribute
    increment, not a prometheus_client `inc()` (a lock and four Python calls). Count from the
    event loop's thread only."""

    __slots__ = ("child", "folded", "n")

    def __init__(self, child: Counter) -> None:
        self.child = child
        self.n = 0  # written by the event loop only
        self.folded = 0  # written by `LoopCounts.collect` only, under its lock

    def inc(self) -> None:
        self.n += 1


class LoopCounts:
    """Registered before every other metric: reading the registry first folds the tallies
    into their counters, so what is exposed is exactly what was counted."""

    def __init__(self) -> None:
        self._tallies: list[Tally] = []
        self._lock = threading.Lock()

    def tally(self, child: Counter) -> Tally:
        tally = Tally(child)
        with self._lock:
            self._tallies.append(tally)
        return tally

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            for tally in self._tallies:
                n = tally.n
                if n != tally.folded:
                    tally.child.inc(n - tally.folded)
                    tally.folded = n
        return ()

    def describe(self) -> Iterable[Metric]:
        return ()


class LoopHistogram:
    """A histogram observed from the event loop's thread only, exposed as prometheus_client's
    Histogram exposes one (buckets, count, sum, created), at a fraction of its `observe`."""

    def __init__(
        self, name: str, documentation: str, buckets: Sequence[float], registry: CollectorRegistry
    ) -> None:
        self._name = name
        self._documentation = documentation
        self._bounds = (*buckets, INF)
        self._les = tuple(floatToGoString(b) for b in self._bounds)  # type: ignore[no-untyped-call]
        self._counts = [0] * len(self._bounds)
        self._sum = 0.0
        self._created = time.time()
        registry.register(self)

    def observe(self, amount: float) -> None:
        self._counts[bisect_left(self._bounds, amount)] += 1  # the first bound >= amount
        self._sum += amount

    def describe(self) -> Iterable[Metric]:
        return [Metric(self._name, self._documentation, "histogram")]

    def collect(self) -> Iterable[Metric]:
        metric = Metric(self._name, self._documentation, "histogram")
        total = 0
        for le, n in zip(self._les, list(self._counts), strict=True):
            total += n
            metric.add_sample(f"{self._name}_bucket", {"le": le}, total)
        metric.add_sample(f"{self._name}_count", {}, total)
        metric.add_sample(f"{self._name}_sum", {}, self._sum)
        metric.add_sample(f"{self._name}_created", {}, self._created)
        return [metric]


class AdmissionResult(StrEnum):
    """The `result` label of configpin_admissions_total: what an admission was answered.
    The values are what dashboards and alerts read: never renamed."""

    PATCHED = "patched"  # allowed, with a patch
    UNCHANGED = "unchanged"  # allowed as it is (warnings, maybe): nothing to change
    SKIPPED = "skipped"  # left alone: not configpin's to pin or preview (mode off, owned, ...)
    IGNORED = "ignored"  # not a request this webhook acts on (its operation, kind, subresource)
    OUT_OF_SCOPE = "out-of-scope"  # a namespace configpin does not act in
    DENIED = "denied"  # refused (strict mode)
    INVALID = "invalid"  # a field of the wrong type
    ERROR = "error"  # configpin failed internally: admitted unchanged (strict: refused)


# What each metric means: its HELP line, by name (the operator's page, docs/operations.md,
# says the same in more words).
HELP: Final[Mapping[str, str]] = {
    "configpin_admissions_total": (
        "Admission requests answered, by object kind, operation and result."
    ),
    "configpin_webhook_requests_total": (
        "Requests received at each webhook path, before their body is read: /mutate (workloads;"
        " source writes too from an older chart's entry, kept for one release), /sources (writes"
        " of ConfigMaps and Secrets)."
    ),
    "configpin_admission_duration_seconds": "Time to answer an admission request (in the handler).",
    "configpin_admissions_out_of_scope_total": (
        "Reviews for namespaces configpin does not act in (not selected, excluded, or a request"
        " that contradicts itself): answered allowed, unchanged, with no lookup."
    ),
    "configpin_admission_warnings_total": "Warnings returned to clients.",
    "configpin_bad_requests_total": "Requests refused before admission (4xx), by status.",
    "configpin_open_connections": "HTTPS connections open now.",
    "configpin_connections_refused_total": (
        "Connections answered 503 and closed at once: the connection cap was reached."
    ),
    "configpin_connection_timeouts_total": (
        "Connections closed for being too slow, by phase: headers (no complete request head in "
        "time), body (answered 408)."
    ),
    "configpin_client_disconnects_total": (
        "Requests whose client went away before its body was read."
    ),
    "configpin_heavy_reviews_total": (
        "Reviews large enough to be parsed and planned off the event loop."
    ),
    "configpin_source_reads_total": (
        "Source lookups made by admission, by how they were answered (cache, read_through; "
        "fresh: past the cache, to settle what a template change records)."
    ),
    "configpin_cached_sources": "ConfigMaps and Secrets held (as digests) in the cache.",
    "configpin_watch_restarts_total": "Watches restarted, by resource and reason.",
    "configpin_source_changes_total": "Consumed-content changes of sources seen by the controller.",
    "configpin_rollouts_total": "Pod templates re-stamped (rollouts started), by kind.",
    "configpin_changes_coalesced_total": "Changes folded into a rollout already pending.",
    "configpin_rollouts_skipped_total": "Workloads looked at and left alone, by reason.",
    "configpin_rollout_failures_total": (
        "Config rollouts configpin started that failed (a progress deadline, pods not Ready in "
        "time, restarts) or that a person rolled back, by what came of it: undo, hold, none, "
        "rolled-back-by-person."
    ),
    "configpin_owned_workloads_skipped_total": (
        "Workloads another controller (an operator) owns, left unpinned (said once per workload"
        " by the leader; opt in with configpin.io/owned: pin or --pin-owned-by)."
    ),
    "configpin_controller_resyncs_total": (
        "Periodic full checks of every workload against the cluster's content."
    ),
    "configpin_patch_conflicts_total": (
        "Workload writes that met a conflict (409) and were retried."
    ),
    "configpin_change_to_patch_seconds": (
        "From a source change seen to the workload's template patched."
    ),
    "configpin_client_rate_limit_wait_seconds": (
        "Time a controller request waited for the client-side rate limit (--controller-qps, "
        "--controller-burst)."
    ),
    "configpin_workloads_stale": (
        "Workloads (on the leader) that consume a source whose content differs from what they "
        "recorded: a rollout is due, deferred, or failing. 0 on other replicas."
    ),
    "configpin_workload_stale_seconds_max": (
        "Seconds the longest-stale workload has been stale, as this leader has seen it (0 when "
        "none is)."
    ),
    "configpin_rollouts_held": (
        "Stale workloads (on the leader) whose rollout configpin holds, by reason: window (their "
        "rollout windows do not allow one now: awaiting-window), budget (their rollout budget "
        "is spent: flapping). They are not counted in configpin_workloads_stale. 0 on other "
        "replicas."
    ),
    "configpin_rollout_holds_total": (
        "Times a stale workload was first found held, by reason (window, budget)."
    ),
    "configpin_refreshes_total": (
        "Workloads with configpin.io/on-change: refresh whose running pods were told to sync "
        "their volumes instead of a rollout, by kind."
    ),
    "configpin_pods_refreshed_total": (
        "Pods whose configpin.io/refreshed annotation was patched (each makes the kubelet sync "
        "that pod's volumes at once)."
    ),
    "configpin_refresh_fallbacks_total": (
        "Changes to on-change: refresh workloads that rolled instead, by why: env (an env var "
        "or envFrom), subpath, snapshot-mode, references (re-pointed from copies), forbidden "
        "(no pod patch permission), disabled (--refresh-pods=false), kind (a custom workload "
        "kind, whose pods it does not find)."
    ),
    "configpin_change_to_refresh_seconds": (
        "From a source change seen to the last pod of the workload refreshed."
    ),
    "configpin_events_dropped_total": (
        "Kubernetes Events not written: rate limited per object, queue full, or refused by the "
        "API server."
    ),
    "configpin_leader": "1 while this replica holds the leader lease.",
    "configpin_snapshots_created_total": "Snapshot copies created.",
    "configpin_snapshots_adopted_total": "Owner references added to snapshot copies.",
    "configpin_snapshots_swept_total": "Unused snapshot copies deleted by the sweep.",
    "configpin_snapshot_lookalikes": (
        "Objects that carry the snapshot label without proving they are configpin's copies "
        "(signature, immutability, name): never adopted, reused or deleted."
    ),
    "configpin_snapshots": "Snapshot copies that exist, by namespace.",
}


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        count, gauge, histogram = self._counter, self._gauge, self._histogram
        self.loop_counts = LoopCounts()
        r.register(self.loop_counts)  # first: see LoopCounts
        self.admissions = count("configpin_admissions_total", "kind", "operation", "result")
        self.webhook_requests = count("configpin_webhook_requests_total", "path")
        self.admission_seconds = self._loop_histogram("configpin_admission_duration_seconds")
        self.out_of_scope = count("configpin_admissions_out_of_scope_total")
        self.admission_warnings = count("configpin_admission_warnings_total")
        self.bad_requests = count("configpin_bad_requests_total", "code")
        self.open_connections = gauge("configpin_open_connections")
        self.connections_refused = count("configpin_connections_refused_total")
        self.connection_timeouts = count("configpin_connection_timeouts_total", "phase")
        self.client_disconnects = count("configpin_client_disconnects_total")
        self.heavy_reviews = count("configpin_heavy_reviews_total")
        self.source_reads = count("configpin_source_reads_total", "how")
        self.cached_sources = gauge("configpin_cached_sources", "kind")
        self.watch_restarts = count("configpin_watch_restarts_total", "resource", "reason")
        # controller
        self.changes_seen = count("configpin_source_changes_total")
        self.rollouts = count("configpin_rollouts_total", "kind")
        self.coalesced = count("configpin_changes_coalesced_total")
        self.skipped = count("configpin_rollouts_skipped_total", "reason")
        self.rollout_failures = count("configpin_rollout_failures_total", "action")
        self.owned_skipped = count("configpin_owned_workloads_skipped_total")
        self.resyncs = count("configpin_controller_resyncs_total")
        self.conflicts = count("configpin_patch_conflicts_total")
        self.rollout_latency = histogram("configpin_change_to_patch_seconds", buckets=_ROLL_BUCKETS)
        self.rate_limit_wait = histogram(
            "configpin_client_rate_limit_wait_seconds", buckets=_WAIT_BUCKETS
        )
        self.workloads_stale = gauge("configpin_workloads_stale")
        self.stale_seconds_max = gauge("configpin_workload_stale_seconds_max")
        self.rollouts_held = gauge("configpin_rollouts_held", "reason")
        self.rollout_holds = count("configpin_rollout_holds_total", "reason")
        self.refreshes = count("configpin_refreshes_total", "kind")
        self.pods_refreshed = count("configpin_pods_refreshed_total")
        self.refresh_fallbacks = count("configpin_refresh_fallbacks_total", "reason")
        self.refresh_latency = histogram(
            "configpin_change_to_refresh_seconds", buckets=_ROLL_BUCKETS
        )
        self.events_dropped = count("configpin_events_dropped_total", "reason")
        self.is_leader = gauge("configpin_leader")
        # snapshots
        self.snapshots_created = count("configpin_snapshots_created_total", "kind")
        self.snapshots_adopted = count("configpin_snapshots_adopted_total")
        self.snapshots_swept = count("configpin_snapshots_swept_total")
        self.snapshot_lookalikes = gauge("configpin_snapshot_lookalikes", "kind")
        self.snapshots_current = gauge("configpin_snapshots", "namespace")

    def _counter(self, name: str, *labels: str) -> Counter:
        return Counter(name, HELP[name], labels, registry=self.registry)

    def _gauge(self, name: str, *labels: str) -> Gauge:
        return Gauge(name, HELP[name], labels, registry=self.registry)

    def _histogram(self, name: str, *, buckets: Sequence[float]) -> Histogram:
        return Histogram(name, HELP[name], buckets=buckets, registry=self.registry)

    def _loop_histogram(self, name: str) -> LoopHistogram:
        return LoopHistogram(name, HELP[name], _LATENCY_BUCKETS, self.registry)
