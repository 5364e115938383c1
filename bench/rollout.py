"""Rolling on change: latency from a ConfigMap update to the template patch, and API requests
per rollout, with 1, 100 and 1,000 Deployments referencing the same ConfigMap.

Starts the test control plane (same helpers as the integration tests) and configpin as the
admission webhook only (`--no-controller`), and runs the rollout controller in this process
on a counting client, so that every request it makes is counted by verb. The webhook stays
in the path: each controller patch is reviewed by it, as in a cluster.

Each round updates a consumed key of the ConfigMap and waits until every Deployment's
template was patched. Latency runs from just before the ConfigMap update is sent to the
moment the API server acknowledged the Deployment's patch (so it includes the watch
delivery of the change, the controller's work and the patch through the webhook). The
coalescing window is 0 here (`--window`): the figure is what comes on top of the window.

    .venv/bin/python -m bench.rollout [--sizes 1,100,1000] [--rounds 30,5,3] [--workers 8]

Loopback only; bounded by `--timeout` per round. Deployments have 0 replicas: the
controller-manager still makes a ReplicaSet per rollout, but no pods.

It also prints the CPU each process used while rolling, and the whole machine's: the
Python client has no client-side rate limit (client-go's default of 5 requests/s would
allow 2.5 rollouts/s, kube-controller-manager's 20/s 10 rollouts/s), so what bounds the
1,000 case is whatever saturates first, on a small machine its CPU.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import urllib3

from bench.common import cpu_seconds, pct
from harness.configpin import (
    CONFIGPIN_NAMESPACE,
    INSTANCE_LABEL,
    ensure_namespace,
    running_configpin,
)
from harness.controller import PatchClock, running_controller
from harness.controlplane import ENABLED_LABEL, running_control_plane, wait_for
from harness.manifests import configmap, container, deployment, env_key_ref, pod_spec
from webhook.controller.rollout import RolloutController, Tuning
from webhook.kube.client import connect
from webhook.kube.digestkey import ensure_digest_key
from webhook.kube.raw import Kube, path

INSTANCE = "bench"


class CountingKube(PatchClock):
    """Counts requests by verb, and notes when each Deployment patch was acknowledged."""

    def __init__(self, api: Any) -> None:
        super().__init__(api, "/deployments/")
        self.by_verb: Counter[str] = Counter()

    def open(self, method: str, api_path: str, **kwargs: Any) -> urllib3.BaseHTTPResponse:
        with self._lock:
            verb = (
                "WATCH" if method == "GET" and (kwargs.get("query") or {}).get("watch") else method
            )
            self.by_verb[verb] += 1
        return super().open(method, api_path, **kwargs)


def shared_reader(name: str) -> dict[str, Any]:
    """Deployment `name` (0 replicas) reading key `a` of ConfigMap `shared`."""
    env = [env_key_ref("configmap", "shared", "a", "A")]
    return deployment(name, pod_spec(container(env=env)))


def machine_busy() -> float:
    """CPU seconds the whole machine spent busy so far (every process, ours or not)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def run_size(
    setup: Kube,
    kube: CountingKube,
    ctl: RolloutController,
    size: int,
    rounds: int,
    timeout: float,
    markers: tuple[str, ...],
) -> dict[str, Any]:
    ns = f"bench-{size}"
    setup.create(
        path("namespaces"),
        {"metadata": {"name": ns, "labels": {ENABLED_LABEL: "true", INSTANCE_LABEL: INSTANCE}}},
    )
    setup.create(path("configmaps", ns), configmap("shared", {"a": "0"}))
    with ThreadPoolExecutor(8) as pool:
        list(
            pool.map(
                lambda i: setup.create(path("deployments", ns), shared_reader(f"d{i}")),
                range(size),
            )
        )
    wait_for(
        lambda: sum(1 for _ in ctl.index.entries(namespace=ns)) == size,
        timeout=120,
        what=f"{size} Deployments indexed",
    )
    paths = {path("deployments", ns, f"d{i}") for i in range(size)}
    latencies: list[float] = []
    spans: list[float] = []
    calls: Counter[str] = Counter()
    cpu: Counter[str] = Counter()
    for r in range(1, rounds + 1):
        time.sleep(0.2)
        assert len(ctl.queue) == 0
        before = Counter(kube.by_verb)
        kube.patched.clear()
        cpu_before = cpu_seconds(markers)
        cpu_before["(whole machine)"] = machine_busy()
        t0 = time.perf_counter()
        setup.patch(
            path("configmaps", ns, "shared"),
            {"data": {"a": str(r)}},
            content_type="application/merge-patch+json",
        )
        wait_for(
            lambda: paths <= kube.patched.keys(),
            timeout=timeout,
            interval=0.005,
            what=f"{size} Deployments patched (round {r})",
        )
        after = cpu_seconds(markers)
        after["(whole machine)"] = machine_busy()
        cpu += after - cpu_before
        done = {p: kube.patched[p] - t0 for p in paths}
        latencies.extend(done.values())
        spans.append(max(done.values()))
        calls += Counter(kube.by_verb) - before
    rollouts = size * rounds
    return {
        "size": size,
        "rounds": rounds,
        "p50": pct(latencies, 0.50),
        "p99": pct(latencies, 0.99),
        "max": max(latencies),
        "all_patched": statistics.median(spans),
        "per_s": size / statistics.median(spans),
        "calls": {k: v / rollouts for k, v in sorted(calls.items())},
        # CPU time is counted in 10 ms ticks: over shorter spans the shares mean nothing.
        "cpu": {k: v / sum(spans) for k, v in cpu.most_common()} if sum(spans) >= 1 else {},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1,100,1000")
    parser.add_argument("--rounds", default="30,5,3")
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--window", type=float, default=0.0)
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds per round at most")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    rounds = [int(s) for s in args.rounds.split(",")]
    rounds += [rounds[-1]] * (len(sizes) - len(rounds))

    with tempfile.TemporaryDirectory() as tmp, running_control_plane(Path(tmp) / "cp") as plane:
        markers = (tmp, f"configpin-etcd-{os.getpid()}-")
        api = plane.api_client()  # the official client: ensure_namespace, server_minor
        setup = Kube(connect(plane.kubeconfig))
        ensure_namespace(api)
        with running_configpin(
            plane,
            Path(tmp) / "configpin",
            args=["--no-controller"],
            instance=INSTANCE,
            webhook_name="configpin-bench",
        ):
            kube = CountingKube(api)
            hkey = ensure_digest_key(kube, CONFIGPIN_NAMESPACE, "configpin-digest-key")
            with running_controller(
                kube,
                hkey,
                tuning=Tuning(workers=args.workers),
                coalesce_window=args.window,
                min_rollout_interval=0,
                rollout_waves="off",  # re-stamping every workload at once: bench.delivery's waves
                max_rolling=0,
                namespace_selector=f"{INSTANCE_LABEL}={INSTANCE}",
                namespace=CONFIGPIN_NAMESPACE,
            ) as ctl:
                results = [
                    run_size(setup, kube, ctl, size, n, args.timeout, markers)
                    for size, n in zip(sizes, rounds, strict=True)
                ]
            # The watches end when the control plane stops: expected, not worth a warning.
            logging.disable(logging.WARNING)
    print(f"\nrollout controller: {args.workers} workers, coalescing window {args.window}s")
    print(f"{'deployments':>11} {'rounds':>6} {'p50':>8} {'p99':>8} {'max':>8} "
          f"{'all done':>9} {'rollouts/s':>10}  requests per rollout")  # fmt: skip
    for r in results:
        calls = ", ".join(f"{k} {v:.2f}" for k, v in r["calls"].items())
        print(
            f"{r['size']:>11} {r['rounds']:>6} {r['p50'] * 1e3:>6.0f}ms {r['p99'] * 1e3:>6.0f}ms "
            f"{r['max'] * 1e3:>6.0f}ms {r['all_patched']:>8.2f}s {r['per_s']:>10.0f}  {calls}"
        )
    print(f"\nCPU busy while rolling (cores, of {os.cpu_count()}), by process:")
    for r in results:
        if not r["cpu"]:
            print(f"{r['size']:>11}  (rolled too fast to measure)")
            continue
        machine = r["cpu"].pop("(whole machine)", 0.0)
        busy = ", ".join(f"{k} {v:.2f}" for k, v in r["cpu"].items())
        print(f"{r['size']:>11}  machine {machine:.2f}, ours {sum(r['cpu'].values()):.2f}: {busy}")


if __name__ == "__main__":
    main()
