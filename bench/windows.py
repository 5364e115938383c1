"""What rollout windows cost the leader per pass: N stale Deployments, each held by its windows
(closed now), against the same N with no windows, measured in the same run.

A pass is what the leader does over every workload, as the offline controller
(harness/controller.py) runs it without an API server: `measure_staleness()` (the stale count,
which leaves out what the windows hold), and for each workload the stale check and, where it
is stale, the gate's decision (`Gate.admit`: the waves, then the windows and the budget, then
the cap) noted in `Holds` as the worker notes it, its place under the cap given back. No
reconcile, no write: the decision on the workload as read is not timed here.

The cluster: N Deployments in 20 namespaces, each reading one key of two of its namespace's
50 ConfigMaps, every ConfigMap changed since (every workload stale). The wall clock is set to
Saturday 2026-11-28 12:00 UTC. The cases, each a fresh controller over the same objects:

- **none**: no window list anywhere (the baseline; the budget, 6/1h, is asked as always);
- **mixed**: the cluster's `--rollout-windows` (business hours, Europe/Berlin: closed on
  Saturday), a weekend deny on a quarter of the namespaces (5 lists), and a tenth of the
  workloads with one of 4 lists of their own (every one held);
- **distinct**: as mixed, but a tenth of the workloads each with a list written for it
  (business hours, its name in the window's `description`): N/10 texts, the same meaning;
- **distinct-all**: every workload with a list written for it: N texts, more than limits.py
  keeps (4,096 texts, 4,096 pairs: then it forgets them all at once).

What windows say is kept per pair of texts (the namespace's, the workload's) until it may
change (webhook/controller/limits.py). Three kinds of pass:

- **warm**: the passes after the first (what the leader runs every few seconds);
- **expired**: the first pass after what was kept expired (the kept verdicts dropped before
  each timed pass: each pair asked of the schedules again, the lists still read);
- **start**: the first pass after a start (the texts' meaning dropped too: every list read
  again, every pair asked).

A **resync** row: the periodic resync's check of every workload (`check_all`) once the
passes above noted what is held, its CPU ms, and how many workloads it hands to the workers,
each of which a worker reads from the API server again and decides.

Printed: medians of `--runs` passes (wall and CPU ms), the stale count's part of it, how many
workloads the windows hold (configpin_rollouts_held) and how many count as stale
(configpin_workloads_stale) after two passes, the pairs of texts kept, and each case's CPU
time against **none**'s of the same kind in the same run. `--waves` sets the gate's waves:
off by default (every stale workload reaches the windows: their worst case); with waves, the
later waves' members wait for the first and never ask them.

    .venv/bin/python -m bench.windows [--workloads 10000] [--runs 15] [--waves off]
    .venv/bin/python -m bench.windows --profile distinct-all:warm --runs 1   # where it goes
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import gc
import pstats
import statistics
import time
from datetime import UTC, datetime
from typing import Any

from harness.builders import (
    HKEY,
    Store,
    admitted,
    configmap,
    container,
    env_cm,
    pod_spec,
    workload,
)
from harness.controller import FixedNamespaces, StoreCache, offline_controller
from webhook.controller.rollout import RolloutController
from webhook.core.constants import ANN_ROLLOUT_WINDOWS
from webhook.core.current import WorkloadEntry, stale_sources
from webhook.core.waves import WaitReason
from webhook.process.config import Settings

NAMESPACES = 20
CONFIGS = 50  # per namespace
SATURDAY_NOON = datetime(2026, 11, 28, 12, tzinfo=UTC).timestamp()
CASES = ("none", "mixed", "distinct", "distinct-all")
KINDS = ("warm", "expired", "start")

BUSINESS = (
    '[{"kind": "allow", "schedule": "0 9 * * 1-5", "duration": "8h", "timeZone": "Europe/Berlin"}]'
)


def _weekend(i: int) -> str:
    """A namespace's list: no rollout from Friday afternoon to Monday morning."""
    return (
        f'[{{"kind": "deny", "schedule": "0 {14 + i} * * 5", "duration": "{66 - i}h", '
        '"timeZone": "Europe/Berlin"}]'
    )


OWN = (
    '[{"kind": "deny", "schedule": "0 22 * * *", "duration": "10h", "timeZone": "UTC"}]',
    '[{"kind": "allow", "schedule": "0 10 * * 1-4", "duration": "6h", '
    '"timeZone": "America/New_York"}]',
    '[{"kind": "deny", "schedule": "30 11 * * *", "duration": "2h"}]',
    '[{"kind": "allow", "schedule": "0 6 * * MON", "duration": "48h", "timeZone": "Asia/Tokyo"}]',
)


def _own(case: str, i: int, name: str) -> str | None:
    if case == "distinct-all" or (case == "distinct" and i % 10 == 0):
        return (
            '[{"kind": "allow", "schedule": "0 9 * * 1-5", "duration": "8h", '
            f'"timeZone": "Europe/Berlin", "description": "{name}: business hours"}}]'
        )
    if case == "mixed" and i % 10 == 0:
        return OWN[(i // 10) % len(OWN)]
    return None


class Cluster:
    """The objects every case reads: the sources as changed since, the workloads as admitted
    before (stamped for the old content), by namespace."""

    def __init__(self, size: int) -> None:
        self.namespaces = [f"ns-{n:02d}" for n in range(NAMESPACES)]
        self.stores: dict[str, Store] = {}
        self.workloads: list[dict[str, Any]] = []
        for n, ns in enumerate(self.namespaces):
            store = Store(
                [configmap(f"config-{c}", {"a": "1"}, namespace=ns) for c in range(CONFIGS)]
            )
            for i in range(n, size, NAMESPACES):
                refs = [env_cm(f"config-{(i + j) % CONFIGS}", "a") for j in range(2)]
                obj = workload(
                    "Deployment", pod_spec(container(env=refs)), name=f"web-{i}", namespace=ns
                )
                self.workloads.append(admitted(obj, store))
            for c in range(CONFIGS):
                store.put(configmap(f"config-{c}", {"a": "2"}, namespace=ns))
            self.stores[ns] = store
        self.cache = StoreCache(self.stores, frozen=True)

    def controller(self, case: str, waves: str) -> RolloutController:
        windows = case != "none"
        namespaces = FixedNamespaces(
            self.namespaces,
            {ns: _weekend(n) for n, ns in enumerate(self.namespaces[: NAMESPACES // 4])}
            if windows
            else {},
        )
        settings = Settings(rollout_windows=BUSINESS if windows else "", rollout_waves=waves)
        ctl = offline_controller(
            self.cache, wall=lambda: SATURDAY_NOON, settings=settings, namespaces=namespaces
        )
        for i, obj in enumerate(self.workloads):
            own = _own(case, i, obj["metadata"]["name"])
            if own is not None:
                obj = copy.deepcopy(obj)
                obj["metadata"].setdefault("annotations", {})[ANN_ROLLOUT_WINDOWS] = own
            entry = ctl.restamper.entry(obj)
            assert isinstance(entry, WorkloadEntry), entry
            ctl.index.put(entry)
        return ctl


def one_pass(ctl: RolloutController) -> float:
    """One pass of the leader over every workload; the seconds of its stale count."""
    start = time.perf_counter()
    ctl.measure_staleness()
    counted = time.perf_counter() - start
    gate, holds = ctl.gate, ctl.holds
    for entry in ctl.index.entries():
        ref = entry.ref
        stale = stale_sources(entry, ctl._peek(ref.namespace), HKEY)  # (as check() asks)
        if stale:
            _, wait = gate.admit(ref, stale, entry)
            gate.release(ref)  # (no rollout is written here)
            holds.looked_at(ref, wait)
    return counted


def resync(ctl: RolloutController) -> tuple[float, int]:
    """The periodic resync's check of every workload (`check_all`, after the passes above
    noted what is held): its CPU seconds, and how many workloads it handed to the workers
    (each one read of the workload from the API server, and a decision), taken back out."""
    cpu = time.process_time()
    ctl.check_all()
    spent = time.process_time() - cpu
    handed = [entry.ref for entry in ctl.index.entries() if ctl.queue.pending(entry.ref)]
    for ref in handed:
        ctl.queue.forget(ref)
    return spent, len(handed)


def _forget(ctl: RolloutController, kind: str) -> None:
    """What is kept of the windows, dropped before a pass of `kind`."""
    limits = ctl.limits
    if kind in ("expired", "start"):
        limits._verdicts.clear()
    if kind == "start":
        limits._lists.clear()
        limits._budgets.clear()


def timed(ctl: RolloutController, kind: str, runs: int) -> dict[str, float]:
    walls, cpus, counts = [], [], []
    for _ in range(runs):
        _forget(ctl, kind)
        wall, cpu = time.perf_counter(), time.process_time()
        counts.append(one_pass(ctl))
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return {
        "wall": statistics.median(walls),
        "cpu": statistics.median(cpus),
        "count": statistics.median(counts),
    }


def profile(ctl: RolloutController, kind: str, runs: int) -> None:
    prof = cProfile.Profile()
    for _ in range(runs):
        _forget(ctl, kind)
        prof.enable()
        one_pass(ctl)
        prof.disable()
    pstats.Stats(prof).sort_stats("cumulative").print_stats(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--workloads", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--waves", default="off", help="the gate's --rollout-waves (off)")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument(
        "--profile", metavar="CASE:KIND", help="profile passes of one case and kind instead"
    )
    args = parser.parse_args()
    started = time.perf_counter()
    cluster = Cluster(args.workloads)
    print(
        f"{args.workloads} workloads in {NAMESPACES} namespaces, all stale; waves {args.waves}; "
        f"built in {time.perf_counter() - started:.1f} s"
    )
    if args.profile:
        case, kind = args.profile.split(":")
        ctl = cluster.controller(case, args.waves)
        one_pass(ctl)
        profile(ctl, kind, args.runs)
        return
    cases = args.cases.split(",")
    results: dict[tuple[str, str], dict[str, float]] = {}
    print(
        f"{'case':>12} {'pass':>8} {'wall ms':>9} {'cpu ms':>8} {'count ms':>9} "
        f"{'held':>6} {'stale':>6} {'pairs':>6} {'x none (cpu)':>13}"
    )
    for case in cases:
        ctl = cluster.controller(case, args.waves)
        gc.collect()
        gc.freeze()  # (as configpin serve does once the controller has synced)
        one_pass(ctl)  # (the first: the waves' changes worked out, the lists read)
        one_pass(ctl)  # (its count leaves out what the first found held)
        held = ctl.holds.count(WaitReason.WINDOW)
        stale = ctl.metrics.registry.get_sample_value("configpin_workloads_stale") or 0
        pairs = len(ctl.limits._verdicts)
        resyncs = [resync(ctl) for _ in range(args.runs)]
        handed = max(n for _, n in resyncs)
        resync_cpu = statistics.median(t for t, _ in resyncs)
        for kind in KINDS:
            got = results[case, kind] = timed(ctl, kind, args.runs)
            base = results.get(("none", kind))
            ratio = f"{got['cpu'] / base['cpu']:>13.2f}" if base and case != "none" else ""
            print(
                f"{case:>12} {kind:>8} {got['wall'] * 1e3:>9.1f} {got['cpu'] * 1e3:>8.1f} "
                f"{got['count'] * 1e3:>9.1f} {held:>6} {stale:>6.0f} {pairs:>6} {ratio}"
            )
        print(
            f"{case:>12} {'resync':>8} {'':>9} {resync_cpu * 1e3:>8.1f} {'':>9} {held:>6} "
            f"{stale:>6.0f} {pairs:>6}   {handed} handed to a worker (each: one read)"
        )
        ctl.queue.close()
        gc.unfreeze()
        del ctl


if __name__ == "__main__":
    main()
