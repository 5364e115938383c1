"""What counting the stale workloads costs the leader (configpin_workloads_stale,
configpin_workload_stale_seconds_max): one `measure_staleness()` pass over N indexed
Deployments, each consuming 3 ConfigMaps (one key each), a tenth of them stale.

In process, no cluster: the controller's index and a source cache answered from memory, as
on the leader. Prints the median of `--runs` passes per size, the baseline measured in the
same run (walking the same index entries without comparing anything), their ratio, and the
share of one core the count takes at its period (STALE_EVERY).

    .venv/bin/python -m bench.stale_count [--sizes 1000,10000] [--runs 15]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from harness.builders import (
    Store,
    admitted,
    configmap,
    container,
    env_cm,
    pod_spec,
    workload,
)
from harness.controller import StoreCache, offline_controller
from webhook.controller.rollout import RolloutController
from webhook.controller.stale import STALE_EVERY
from webhook.core.current import entry_from_object


def build(size: int) -> RolloutController:
    configs = [configmap(f"config-{i}", {"a": "1"}) for i in range(size // 10 + 3)]
    store = Store(configs)
    objs = []
    for i in range(size):
        spec = pod_spec(
            container(env=[env_cm(f"config-{(i + j) % len(configs)}", "a") for j in range(3)])
        )
        web = workload("Deployment", spec, name=f"web-{i}")
        objs.append(admitted(web, store))
    for i in range(0, len(configs), 30):  # a change to every 30th ConfigMap: ~a tenth stale
        store.put(configmap(f"config-{i}", {"a": "2"}))
    controller = offline_controller(StoreCache(store, frozen=True))
    for obj in objs:
        controller.index.put(entry_from_object(obj, "checksum"))
    return controller


def walker(controller: RolloutController) -> Any:
    """The baseline: the same entries walked, nothing compared."""
    return lambda: sum(1 for e in controller.index.entries() if e.ref.namespace)


def timed(fn: Any, runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000")
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    print(
        f"{'workloads':>10} {'stale':>6} {'count (ms)':>11} {'walk (ms)':>10} {'ratio':>6} "
        f"{'core share':>11}"
    )
    for size in (int(s) for s in args.sizes.split(",")):
        controller = build(size)
        stale = controller.measure_staleness()
        count = timed(controller.measure_staleness, args.runs)
        walk = timed(walker(controller), args.runs)
        print(
            f"{size:>10} {stale:>6} {count * 1e3:>11.2f} {walk * 1e3:>10.2f} "
            f"{count / walk:>6.1f} {count / STALE_EVERY:>10.2%}"
        )
        controller.queue.close()


if __name__ == "__main__":
    main()
