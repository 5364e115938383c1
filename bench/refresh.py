"""Hot refresh (`configpin.io/on-change: refresh`): from a ConfigMap update to the last pod's
`configpin.io/refreshed` annotation patched, for 1,000 pods, under the controller's default
client-side rate limit, with the API server's request latency during it.

Starts the test control plane (same helpers as the integration tests; its
kube-controller-manager creates the pods, which stay Pending: there is no scheduler or
kubelet) and configpin as the admission webhook only (`--no-controller`), and runs the
rollout controller in this process with its default options (`--controller-qps` 200,
`--controller-burst` 400, 8 workers) on a client that notes when each pod patch was
acknowledged. The webhook stays in the path as the chart registers it (before 1.28 it is
sent every pod UPDATE and leaves it alone; from 1.28 its matchConditions skip owned pods).

Layouts: `DxP` is D Deployments of P replicas each, all mounting the ConfigMap as a
directory (one workload is refreshed by one worker, its pods one after the other; several
workloads go in parallel, through one shared rate limit).

Each round updates a consumed key and waits until every pod was patched. Latency runs from
just before the ConfigMap update is sent to the API server's acknowledgement of the last
pod patch (watch delivery, the coalescing window, which is 0 here, listing the pods, the
patches). During each round, and during an idle spell of the same length just before it
(the baseline, measured in the same run), the bench reads the API server's own histogram
`apiserver_request_duration_seconds` from its `/metrics` (before and after: the requests
served in between, every verb but WATCH and CONNECT, and the pod PATCHes alone), and a probe
GETs an unrelated ConfigMap every 20 ms (what any other client saw).

    KUBEBUILDER_ASSETS=... .venv/bin/python -m bench.refresh [--layouts 1x1000,10x100] [--rounds 3]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import pct, served, server_histogram
from harness.configpin import (
    CONFIGPIN_NAMESPACE,
    INSTANCE_LABEL,
    ensure_namespace,
    running_configpin,
)
from harness.controller import PatchClock, running_controller
from harness.controlplane import (
    ENABLED_LABEL,
    running_control_plane,
    server_minor,
    wait_for,
)
from harness.manifests import configmap, container, deployment
from webhook.controller.rollout import RolloutController, Tuning
from webhook.core.constants import ANN_ON_CHANGE
from webhook.kube.client import connect
from webhook.kube.digestkey import ensure_digest_key
from webhook.kube.raw import MERGE_PATCH, Kube, path
from webhook.process.config import Settings

INSTANCE = "bench"


def refreshing(name: str, replicas: int) -> dict[str, Any]:
    c = container()
    c["volumeMounts"] = [{"name": "cfg", "mountPath": "/etc/app"}]
    spec = {"containers": [c], "volumes": [{"name": "cfg", "configMap": {"name": "shared"}}]}
    return deployment(name, spec, replicas=replicas, annotations={ANN_ON_CHANGE: "refresh"})


class Probe:
    """GETs one ConfigMap every `interval` seconds and keeps each latency with its time."""

    def __init__(self, kube: Kube, api_path: str, interval: float = 0.02) -> None:
        self.kube, self.api_path, self.interval = kube, api_path, interval
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            t0 = time.perf_counter()
            self.kube.get(self.api_path)
            self.samples.append((t0, time.perf_counter() - t0))

    def between(self, start: float, end: float) -> list[float]:
        return [lat for t, lat in list(self.samples) if start <= t <= end]

    def __enter__(self) -> Probe:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


def run_layout(
    setup: Kube, kube: PatchClock, ctl: RolloutController, deployments: int, pods: int, rounds: int
) -> dict[str, Any]:
    ns = f"bench-{deployments}x{pods}"
    setup.create(
        path("namespaces"),
        {"metadata": {"name": ns, "labels": {ENABLED_LABEL: "true", INSTANCE_LABEL: INSTANCE}}},
    )
    setup.create(path("configmaps", ns), configmap("shared", {"a": "0"}))
    setup.create(path("configmaps", ns), configmap("probe", {"p": "0"}))
    for i in range(deployments):
        setup.create(path("deployments", ns), refreshing(f"d{i}", pods))
    total = deployments * pods

    def created() -> bool:
        found = 0
        for page in setup.list_pages(path("pods", ns)):
            found += len(page.get("items") or ())
        return found == total

    t0 = time.perf_counter()
    wait_for(created, timeout=900, interval=2.0, what=f"{total} pods created")
    print(f"{ns}: {total} pods created in {time.perf_counter() - t0:.0f}s", flush=True)
    time.sleep(5.0)  # the controller-manager's status updates settle
    spans: list[float] = []
    idle: list[dict[str, float]] = []
    busy: list[dict[str, float]] = []
    pod_patches: list[dict[str, float]] = []
    probe_idle: list[float] = []
    probe_busy: list[float] = []
    with Probe(setup, path("configmaps", ns, "probe")) as probe:
        for r in range(1, rounds + 1):
            assert len(ctl.queue) == 0
            kube.patched.clear()
            # the baseline: an idle spell as long as the last round (5 s the first time)
            quiet = spans[-1] if spans else 5.0
            b0, q0 = server_histogram(setup), time.perf_counter()
            time.sleep(quiet)
            b1, q1 = server_histogram(setup), time.perf_counter()
            idle.append(served(b0, b1) | {"seconds": q1 - q0})
            probe_idle += probe.between(q0, q1)
            t0 = time.perf_counter()
            setup.patch(path("configmaps", ns, "shared"), {"data": {"a": str(r)}}, MERGE_PATCH)
            wait_for(
                lambda: len(kube.patched) >= total,
                timeout=600,
                interval=0.01,
                what=f"{total} pods refreshed (round {r})",
            )
            t1 = max(kube.patched.values())
            b2 = server_histogram(setup)
            spans.append(t1 - t0)
            busy.append(served(b1, b2) | {"seconds": t1 - t0})
            pod_patches.append(served(b1, b2, only=("PATCH", "pods")))
            probe_busy += probe.between(t0, t1)
            time.sleep(1.0)  # the workloads' record writes land
    return {
        "layout": f"{deployments}x{pods}",
        "pods": total,
        "rounds": rounds,
        "last_pod": statistics.median(spans),
        "pods_per_s": total / statistics.median(spans),
        "idle": idle,
        "busy": busy,
        "pod_patches": pod_patches,
        "probe_idle": probe_idle,
        "probe_busy": probe_busy,
    }


def _mean(rows: list[dict[str, float]], field: str) -> float:
    return statistics.median(r[field] for r in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layouts", default="1x1000,10x100")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    layouts = [tuple(int(n) for n in s.split("x")) for s in args.layouts.split(",")]

    with tempfile.TemporaryDirectory() as tmp, running_control_plane(Path(tmp) / "cp") as plane:
        api = plane.api_client()  # the official client: ensure_namespace, server_minor
        setup = Kube(connect(plane.kubeconfig))
        ensure_namespace(api)
        minor = server_minor(api)
        with running_configpin(
            plane,
            Path(tmp) / "configpin",
            args=["--no-controller"],
            instance=INSTANCE,
            webhook_name="configpin-bench",
        ):
            kube = PatchClock(api, "/pods/")
            hkey = ensure_digest_key(kube, CONFIGPIN_NAMESPACE, "configpin-digest-key")
            with running_controller(
                kube,
                hkey,
                coalesce_window=0.0,
                min_rollout_interval=0,
                namespace_selector=f"{INSTANCE_LABEL}={INSTANCE}",
                namespace=CONFIGPIN_NAMESPACE,
            ) as ctl:
                results = [run_layout(setup, kube, ctl, d, p, args.rounds) for d, p in layouts]
            logging.disable(logging.WARNING)  # the watches end with the control plane
    o, workers = Settings(), Tuning().workers
    print(
        f"\nrefresh on 1.{minor}: controller qps {o.controller.qps:g}, burst "
        f"{o.controller.burst}, {workers} workers, "
        "coalescing window 0 s; medians of the rounds"
    )
    print(f"{'layout':>8} {'pods':>5} {'rounds':>6} {'last pod':>9} {'pods/s':>7}")
    for r in results:
        print(
            f"{r['layout']:>8} {r['pods']:>5} {r['rounds']:>6} {r['last_pod']:>8.2f}s "
            f"{r['pods_per_s']:>7.0f}"
        )
    print("\nAPI server request latency (its own histogram; every verb but WATCH/CONNECT):")
    print(
        f"{'layout':>8} {'':>8} {'requests/s':>10} {'mean':>8} {'p50':>8} {'p99':>8}  "
        "pod PATCH p50 / p99"
    )
    for r in results:
        for label, rows in (("idle", r["idle"]), ("refresh", r["busy"])):
            rate = statistics.median(row["count"] / row["seconds"] for row in rows)
            line = (
                f"{r['layout']:>8} {label:>8} {rate:>10.0f} {_mean(rows, 'mean') * 1e3:>6.1f}ms "
                f"{_mean(rows, 'p50') * 1e3:>6.1f}ms {_mean(rows, 'p99') * 1e3:>6.1f}ms"
            )
            if label == "refresh":
                pp = r["pod_patches"]
                line += f"  {_mean(pp, 'p50') * 1e3:.1f}ms / {_mean(pp, 'p99') * 1e3:.1f}ms"
            print(line)
    print("\nA probe client's GET of an unrelated ConfigMap every 20 ms:")
    print(
        f"{'layout':>8} {'idle p50':>9} {'p99':>8} {'refresh p50':>12} {'p99':>8} {'p99 ratio':>9}"
    )
    for r in results:
        i50, i99 = pct(r["probe_idle"], 0.5), pct(r["probe_idle"], 0.99)
        b50, b99 = pct(r["probe_busy"], 0.5), pct(r["probe_busy"], 0.99)
        print(
            f"{r['layout']:>8} {i50 * 1e3:>7.1f}ms {i99 * 1e3:>6.1f}ms {b50 * 1e3:>10.1f}ms "
            f"{b99 * 1e3:>6.1f}ms {b99 / i99 if i99 else 0:>9.2f}"
        )


if __name__ == "__main__":
    main()
