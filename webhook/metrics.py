"""Prometheus metrics, in one registry per process (tests build their own)."""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from collections.abc import Iterable, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import Metric
from prometheus_client.utils import INF, floatToGoString

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_ROLL_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


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


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.loop_counts = LoopCounts()
        r.register(self.loop_counts)  # first: see LoopCounts
        self.admissions = Counter(
            "configpin_admissions_total",
            "Admission requests answered, by object kind, operation and result.",
            ["kind", "operation", "result"],
            registry=r,
        )
        self.admission_seconds = LoopHistogram(
            "configpin_admission_duration_seconds",
            "Time to answer an admission request (in the handler).",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.out_of_scope = Counter(
            "configpin_admissions_out_of_scope_total",
            "Reviews for namespaces configpin does not act in (not selected, excluded, or a "
            "request that contradicts itself): answered allowed, unchanged, with no lookup.",
            registry=r,
        )
        self.admission_warnings = Counter(
            "configpin_admission_warnings_total", "Warnings returned to clients.", registry=r
        )
        self.bad_requests = Counter(
            "configpin_bad_requests_total",
            "Requests refused before admission (4xx), by status.",
            ["code"],
            registry=r,
        )
        self.open_connections = Gauge(
            "configpin_open_connections", "HTTPS connections open now.", registry=r
        )
        self.connections_refused = Counter(
            "configpin_connections_refused_total",
            "Connections answered 503 and closed at once: the connection cap was reached.",
            registry=r,
        )
        self.connection_timeouts = Counter(
            "configpin_connection_timeouts_total",
            "Connections closed for being too slow, by phase: headers (no complete request "
            "head in time), body (answered 408).",
            ["phase"],
            registry=r,
        )
        self.client_disconnects = Counter(
            "configpin_client_disconnects_total",
            "Requests whose client went away before its body was read.",
            registry=r,
        )
        self.heavy_reviews = Counter(
            "configpin_heavy_reviews_total",
            "Reviews large enough to be parsed and planned off the event loop.",
            registry=r,
        )
        self.source_reads = Counter(
            "configpin_source_reads_total",
            "Source lookups made by admission, by how they were answered (cache, read_through; "
            "fresh: past the cache, to settle what a template change records).",
            ["how"],
            registry=r,
        )
        self.cached_sources = Gauge(
            "configpin_cached_sources",
            "ConfigMaps and Secrets held (as digests) in the cache.",
            ["kind"],
            registry=r,
        )
        self.watch_restarts = Counter(
            "configpin_watch_restarts_total",
            "Watches restarted, by resource and reason.",
            ["resource", "reason"],
            registry=r,
        )
        # controller
        self.changes_seen = Counter(
            "configpin_source_changes_total",
            "Consumed-content changes of sources seen by the controller.",
            registry=r,
        )
        self.rollouts = Counter(
            "configpin_rollouts_total",
            "Pod templates re-stamped (rollouts started), by kind.",
            ["kind"],
            registry=r,
        )
        self.coalesced = Counter(
            "configpin_changes_coalesced_total",
            "Changes folded into a rollout already pending.",
            registry=r,
        )
        self.skipped = Counter(
            "configpin_rollouts_skipped_total",
            "Workloads looked at and left alone, by reason.",
            ["reason"],
            registry=r,
        )
        self.owned_skipped = Counter(
            "configpin_owned_workloads_skipped_total",
            "Workloads another controller (an operator) owns, left unpinned (said once per "
            "workload by the leader; opt in with configpin.io/owned: pin or --pin-owned-by).",
            registry=r,
        )
        self.resyncs = Counter(
            "configpin_controller_resyncs_total",
            "Periodic full checks of every workload against the cluster's content.",
            registry=r,
        )
        self.conflicts = Counter(
            "configpin_patch_conflicts_total",
            "Workload writes that met a conflict (409) and were retried.",
            registry=r,
        )
        self.rollout_latency = Histogram(
            "configpin_change_to_patch_seconds",
            "From a source change seen to the workload's template patched.",
            buckets=_ROLL_BUCKETS,
            registry=r,
        )
        self.rate_limit_wait = Histogram(
            "configpin_client_rate_limit_wait_seconds",
            "Time a controller request waited for the client-side rate limit "
            "(--controller-qps, --controller-burst).",
            buckets=(0.001, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0),
            registry=r,
        )
        self.workloads_stale = Gauge(
            "configpin_workloads_stale",
            "Workloads (on the leader) that consume a source whose content differs from what "
            "they recorded: a rollout is due, deferred, or failing. 0 on other replicas.",
            registry=r,
        )
        self.stale_seconds_max = Gauge(
            "configpin_workload_stale_seconds_max",
            "Seconds the longest-stale workload has been stale, as this leader has seen it (0 "
            "when none is).",
            registry=r,
        )
        self.refreshes = Counter(
            "configpin_refreshes_total",
            "Workloads with configpin.io/on-change: refresh whose running pods were told to "
            "sync their volumes instead of a rollout, by kind.",
            ["kind"],
            registry=r,
        )
        self.pods_refreshed = Counter(
            "configpin_pods_refreshed_total",
            "Pods whose configpin.io/refreshed annotation was patched (each makes the kubelet "
            "sync that pod's volumes at once).",
            registry=r,
        )
        self.refresh_fallbacks = Counter(
            "configpin_refresh_fallbacks_total",
            "Changes to on-change: refresh workloads that rolled instead, by why: env (an env "
            "var or envFrom), subpath, snapshot-mode, references (re-pointed from copies), "
            "forbidden (no pod patch permission), disabled (--refresh-pods=false), kind (a "
            "custom workload kind, whose pods it does not find).",
            ["reason"],
            registry=r,
        )
        self.refresh_latency = Histogram(
            "configpin_change_to_refresh_seconds",
            "From a source change seen to the last pod of the workload refreshed.",
            buckets=_ROLL_BUCKETS,
            registry=r,
        )
        self.events_dropped = Counter(
            "configpin_events_dropped_total",
            "Kubernetes Events not written: rate limited per object, queue full, or refused by "
            "the API server.",
            ["reason"],
            registry=r,
        )
        self.is_leader = Gauge(
            "configpin_leader", "1 while this replica holds the leader lease.", registry=r
        )
        # snapshots
        self.snapshots_created = Counter(
            "configpin_snapshots_created_total", "Snapshot copies created.", ["kind"], registry=r
        )
        self.snapshots_adopted = Counter(
            "configpin_snapshots_adopted_total",
            "Owner references added to snapshot copies.",
            registry=r,
        )
        self.snapshots_swept = Counter(
            "configpin_snapshots_swept_total",
            "Unused snapshot copies deleted by the sweep.",
            registry=r,
        )
        self.snapshot_lookalikes = Gauge(
            "configpin_snapshot_lookalikes",
            "Objects that carry the snapshot label without proving they are configpin's "
            "copies (signature, immutability, name): never adopted, reused or deleted.",
            ["kind"],
            registry=r,
        )
        self.snapshots_current = Gauge(
            "configpin_snapshots",
            "Snapshot copies that exist, by namespace.",
            ["namespace"],
            registry=r,
        )
