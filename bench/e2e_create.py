"""End to end: Deployment creates through the real API server with configpin registered,
against the same run without it.

Starts the test control plane and configpin (same helpers as the integration tests), then
alternates rounds without a webhook, with a null webhook (configpin in mode off: the same
round trip, no work) and with configpin, each round creating Deployments (each referencing a
ConfigMap and a Secret) at fixed concurrency, and prints creates/s and p50/p99 create
latency for each, and their ratios (medians over rounds). The null webhook separates what
the API server pays for calling any webhook from what configpin's admission adds.

    .venv/bin/python bench/e2e_create.py [--per-round 200] [--rounds 3] [--concurrency 4]

Goal (issue 3): with configpin within 10% of without.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.rollout import cpu_seconds
from tests.integration.configpin_proc import ensure_namespace, start_configpin
from tests.integration.controlplane import (
    ENABLED_LABEL,
    register_webhook,
    running_control_plane,
    unregister_webhook,
)
from tests.integration.manifests import (
    configmap,
    container,
    deployment,
    env_from,
    env_key_ref,
    pod_spec,
    secret,
)
from webhook.kube.raw import Kube, path


def app(name: str) -> dict[str, object]:
    """Deployment `name` reading all of ConfigMap app-config and key `token` of Secret
    app-secret; 0 replicas, to measure admission of the Deployment itself, not pod churn."""
    return deployment(
        name,
        pod_spec(
            container(
                env_from=[env_from("configmap", "app-config")],
                env=[env_key_ref("secret", "app-secret", "token", "T")],
            )
        ),
    )


CPU: dict[str, Counter[str]] = {}  # variant -> CPU seconds by process, summed over rounds
MARKERS: list[str] = []  # the temporary paths that name our processes' command lines


def round_(
    kube: Kube, ns: str, count: int, concurrency: int, tag: str, variant: str = ""
) -> tuple[float, list[float]]:
    lat: list[float] = []
    before = cpu_seconds(tuple(MARKERS))

    def one(i: int) -> None:
        t = time.perf_counter()
        kube.create(path("deployments", ns), app(f"{tag}-{i}"))
        lat.append(time.perf_counter() - t)

    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(one, range(count)))
    took = time.perf_counter() - start
    if variant:
        CPU.setdefault(variant, Counter()).update(cpu_seconds(tuple(MARKERS)) - before)
        CPU[variant]["creates"] += count
    return count / took, sorted(lat)


def pct(values: list[float], p: float) -> float:
    return values[min(len(values) - 1, int(p * len(values)))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--per-round", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=4)
    args = ap.parse_args()
    with (
        tempfile.TemporaryDirectory() as tmp,
        running_control_plane(Path(tmp) / "plane") as plane,
        plane.api_client() as api,
    ):
        MARKERS.append(tmp)
        kube = Kube(api)
        ensure_namespace(api)
        ns = "bench-e2e"
        kube.create(
            path("namespaces"),
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": ns, "labels": {ENABLED_LABEL: "true"}},
            },
        )
        kube.create(path("configmaps", ns), configmap("app-config", {"a": "1"}))
        kube.create(path("secrets", ns), secret("app-secret", {"token": "t"}))
        cp = start_configpin(plane, Path(tmp) / "configpin", args=["--no-controller"])
        # The same webhook round trip with no work behind it: what the API server pays for
        # calling any webhook, as against what configpin's admission adds to it.
        null = start_configpin(
            plane, Path(tmp) / "null", args=["--no-controller", "--mode", "off"], instance="null"
        )
        results: dict[str, list[tuple[float, list[float]]]] = {
            "without": [],
            "null-hook": [],
            "with": [],
        }
        try:
            round_(kube, ns, 50, args.concurrency, "warm")  # warm connections and caches
            for r in range(args.rounds):
                unregister_webhook(api, "configpin-bench")
                time.sleep(1.5)
                results["without"].append(
                    round_(kube, ns, args.per_round, args.concurrency, f"a{r}", "without")
                )
                register_webhook(api, "configpin-bench", null.url + "/mutate", null.ca_pem)
                time.sleep(1.5)
                results["null-hook"].append(
                    round_(kube, ns, args.per_round, args.concurrency, f"n{r}", "null-hook")
                )
                register_webhook(api, "configpin-bench", cp.url + "/mutate", cp.ca_pem)
                time.sleep(1.5)
                results["with"].append(
                    round_(kube, ns, args.per_round, args.concurrency, f"b{r}", "with")
                )
            count = cp.metric("configpin_admission_duration_seconds_count")
            total = cp.metric("configpin_admission_duration_seconds_sum")
            print(f"configpin: {count:.0f} admissions for {args.per_round * args.rounds} creates")
            for kind in ("Deployment", "ReplicaSet"):
                for op in ("CREATE", "UPDATE"):
                    n = cp.metric("configpin_admissions_total", kind=kind, operation=op)
                    print(f"    {kind} {op}: {n:.0f}")
            print(f"    mean handler time {1000 * total / max(count, 1):.2f} ms")
            mutated = kube.get(path("deployments", ns, f"b{args.rounds - 1}-0"))
            assert "configpin.io/checksum" in mutated["spec"]["template"]["metadata"]["annotations"]
        finally:
            unregister_webhook(api, "configpin-bench")
            cp.stop()
            null.stop()
    summary = {}
    for label, rounds in results.items():
        rate = statistics.median(r[0] for r in rounds)
        p50 = statistics.median(pct(r[1], 0.5) for r in rounds) * 1000
        p99 = statistics.median(pct(r[1], 0.99) for r in rounds) * 1000
        summary[label] = (rate, p50, p99)
        print(
            f"{label:8s} creates/s={rate:7.1f} p50={p50:6.1f}ms p99={p99:6.1f}ms"
            f"  (median of {len(rounds)} rounds)"
        )
    print("CPU ms per create, by process:")
    names = sorted({n for c in CPU.values() for n in c} - {"creates", "bench (controller)"})
    for variant, cpu in CPU.items():
        row = ", ".join(f"{n} {1000 * cpu[n] / cpu['creates']:.2f}" for n in names if cpu[n])
        print(f"    {variant:9s} {row}")
    for label in ("null-hook", "with"):
        w, wo = summary[label], summary["without"]
        print(
            f"ratio {label}/without: throughput {w[0] / wo[0]:.2f},"
            f" p50 {w[1] / wo[1]:.2f}, p99 {w[2] / wo[2]:.2f}"
        )
    w, wo = summary["with"], summary["null-hook"]
    print(
        f"ratio with/null-hook: throughput {w[0] / wo[0]:.2f},"
        f" p50 {w[1] / wo[1]:.2f}, p99 {w[2] / wo[2]:.2f}"
    )


if __name__ == "__main__":
    main()
