"""End to end: Deployment creates through the real API server with configpin registered,
against the same run without it.

Starts the test control plane and configpin (same helpers as the integration tests), then
alternates rounds without a webhook, with a null webhook (configpin in mode off: the same
round trip, no work) and with configpin, each round creating Deployments (each referencing a
ConfigMap and a Secret) at fixed concurrency, and prints creates/s and p50/p99 create
latency for each, and their ratios (medians over rounds). The null webhook separates what
the API server pays for calling any webhook from what configpin's admission adds.

The webhook is registered as the chart registers it for the server's version. On 1.28+ that
includes matchConditions (the API server does not call configpin for controller-owned
objects); a further variant, `with-all`, registers configpin without them, to show what they
save. It prints the webhook calls configpin answered per Deployment created for each.

    KUBEBUILDER_ASSETS=$(hack/provision-control-plane.sh 1.36.2) \
        .venv/bin/python -m bench.e2e_create [--per-round 200] [--rounds 3] [--concurrency 4]

Goals: issue 3, with configpin within 10% of without; issue 11 (1.28+), one webhook call per
Deployment create and creates/s with configpin >= 0.95 of without.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.common import cpu_seconds
from harness.configpin import ensure_namespace, start_configpin
from harness.controlplane import (
    ENABLED_LABEL,
    chart_webhook,
    default_service_account_ready,
    register_webhook,
    running_control_plane,
    server_minor,
    unregister_webhook,
    wait_for,
)
from harness.manifests import (
    configmap,
    container,
    deployment,
    env_from,
    env_key_ref,
    pod_spec,
    secret,
)
from webhook.kube.raw import Kube, path

REPLICAS = [0]


def app(name: str) -> dict[str, object]:
    """Deployment `name` reading all of ConfigMap app-config and key `token` of Secret
    app-secret; 0 replicas by default, to measure admission of the Deployment itself, not pod
    churn (`--replicas 1`: the ReplicaSet also creates a Pod, which stays Pending)."""
    return deployment(
        name,
        pod_spec(
            container(
                env_from=[env_from("configmap", "app-config")],
                env=[env_key_ref("secret", "app-secret", "token", "T")],
            )
        ),
        replicas=REPLICAS[0],
    )


CPU: dict[str, Counter[str]] = {}  # variant -> CPU seconds by process, summed over rounds
MARKERS: list[str] = []  # the temporary paths that name our processes' command lines


CREATED = [0]  # Deployments created so far


def settle(kube: Kube, ns: str) -> None:
    """Wait until the controller-manager has made every ReplicaSet (and Pod) of the
    Deployments created so far, so that its backlog is neither counted against the next
    variant's calls nor competing with its creates."""

    def count(resource: str) -> int:
        # one item and the count of the rest: cheap for the API server, whose CPU is measured
        page = kube.get(path(resource, ns), limit=1)
        rest = int(page["metadata"].get("remainingItemCount") or 0)
        return len(page.get("items") or ()) + rest

    wait_for(
        lambda: (
            count("replicasets") >= CREATED[0]
            and (REPLICAS[0] == 0 or count("pods") >= CREATED[0] * REPLICAS[0])
        ),
        timeout=300,
        interval=0.5,
        what="the controller-manager to catch up",
    )


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
    with ThreadPoolExecutor(concurrency) as pool:  # the creates, timed; then the settling
        list(pool.map(one, range(count)))
    took = time.perf_counter() - start
    CREATED[0] += count
    settle(kube, ns)
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
    ap.add_argument("--replicas", type=int, default=0)
    args = ap.parse_args()
    REPLICAS[0] = args.replicas
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
        wait_for(lambda: default_service_account_ready(api, ns), what="the default account")
        kube.create(path("configmaps", ns), configmap("app-config", {"a": "1"}))
        kube.create(path("secrets", ns), secret("app-secret", {"token": "t"}))
        cp = start_configpin(plane, Path(tmp) / "configpin", args=["--no-controller"])
        # The same webhook round trip with no work behind it: what the API server pays for
        # calling any webhook, as against what configpin's admission adds to it.
        null = start_configpin(
            plane, Path(tmp) / "null", args=["--no-controller", "--mode", "off"], instance="null"
        )
        conditions = "matchConditions" in chart_webhook(api)
        results: dict[str, list[tuple[float, list[float]]]] = {
            "without": [],
            "null-hook": [],
            "with": [],
        }
        if conditions:
            results["with-all"] = []
        calls: Counter[str] = Counter()

        def answered() -> float:
            return cp.metric("configpin_admissions_total")

        try:
            round_(kube, ns, 50, args.concurrency, "warm")  # warm connections and caches
            for r in range(args.rounds):
                unregister_webhook(api, "configpin-bench")
                time.sleep(1.5)
                results["without"].append(
                    round_(kube, ns, args.per_round, args.concurrency, f"a{r}", "without")
                )
                register_webhook(api, "configpin-bench", null.url, null.ca_pem)
                time.sleep(1.5)
                results["null-hook"].append(
                    round_(kube, ns, args.per_round, args.concurrency, f"n{r}", "null-hook")
                )
                for variant, tag in (("with", "b"), ("with-all", "c")):
                    if variant not in results:
                        continue
                    register_webhook(
                        api,
                        "configpin-bench",
                        cp.url,
                        cp.ca_pem,
                        match_conditions=variant == "with",
                    )
                    time.sleep(1.5)
                    before = answered()
                    results[variant].append(
                        round_(kube, ns, args.per_round, args.concurrency, f"{tag}{r}", variant)
                    )
                    calls[variant] += int(answered() - before)
            print(f"API server {plane.version[0]}.{plane.version[1]} (minor {server_minor(api)})")
            for variant, n in calls.items():
                per = n / (args.per_round * args.rounds)
                print(f"webhook calls per Deployment create, {variant}: {per:.2f}")
            count = cp.metric("configpin_admission_duration_seconds_count")
            total = cp.metric("configpin_admission_duration_seconds_sum")
            print(f"configpin: {count:.0f} admissions for {args.per_round * args.rounds} creates")
            for kind in ("Deployment", "ReplicaSet", "Pod"):
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
    for label in ("null-hook", "with", "with-all"):
        if label not in summary:
            continue
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
