"""Scale: `configpin serve` cold-started on a large cluster. RSS, cold start, the API
server's watches, and one ConfigMap change consumed by 1,000 Deployments.

Starts the test control plane (same helpers as the integration tests) on the real API server
(1.36.2 by default, `--version`) with its kube-controller-manager *without* the deployment
and replicaset controllers: the bench creates each Deployment's ReplicaSet itself (0
replicas, an ownerReference to the Deployment, its template), and nothing else creates any.
The garbage collector, namespace and service-account controllers still run.

The bulk load goes through the webhook, as the chart registers it: a loader configpin
(`--no-controller`) admits every Deployment, so the workloads are stamped as they would be
in a cluster where configpin ran from the start (unstamped ones would each get a baseline
write at the measured configpin's start, which is not what a restart costs). The sources
(ConfigMaps and Secrets, half each, 2 keys of about 100 bytes) and then the Deployments and
their ReplicaSets are created by a thread pool over one connection pool (raw HTTP).

Three stages, each measured on a fresh `configpin serve` process (leader-elected, one
replica, its own Lease; its webhook is not registered, the loader's is):

1. empty: only the opted-in namespaces (the baseline of this run);
2. `--sources` ConfigMaps+Secrets;
3. the same plus `--workloads` Deployments, each with its ReplicaSet.

Per stage: seconds from the process start to `/readyz` OK and to `configpin_controller_up`
= 1 (the controller's index synced), VmRSS 2 s after that, and the API server's
`apiserver_registered_watchers` with that configpin running and without it. Bytes per
source are (RSS 2 - RSS 1) / sources, per workload (RSS 3 - RSS 2) / workloads; the last
line extrapolates to 200k sources + 50k workloads.

Then, on stage 3's configpin (`--coalesce-window 0 --min-rollout-interval 0`, the default
`--controller-qps 200 --controller-burst 400`): `--rounds` times, a consumed key of ConfigMap
`shared` changes, read by 1,000 of the Deployments (`--fanout`); the time until a watch saw
every one's template `configpin.io/sources` change, and the API server's request latency
(`apiserver_request_duration_seconds`, every verb but WATCH/CONNECT) during it against an
idle spell of the same length just before. Medians.

    nice -n 10 .venv/bin/python -m bench.scale                          # 100k + 25k
    nice -n 10 .venv/bin/python -m bench.scale --sources 2000 --workloads 500   # ~1 min

Loopback only; everything lives in a temporary folder.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shlex
import statistics
import subprocess
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from bench.common import (
    REPO,
    Buckets,
    baseline_tree,
    control_plane_assets,
    cpu_seconds,
    rss_kib,
    served,
    server_histogram,
)
from harness import controlplane
from harness.chart import install_crds
from harness.configpin import (
    INSTANCE_LABEL,
    Configpin,
    ensure_namespace,
    running_configpin,
    start_configpin,
)
from harness.controlplane import ENABLED_LABEL, running_control_plane, wait_for
from harness.manifests import configmap, container, deployment, env_key_ref, pod_spec
from webhook.core.constants import ANN_SOURCES
from webhook.kube.errors import KubeError
from webhook.kube.raw import MERGE_PATCH, Kube, path

INSTANCE = "bench"
# Without these two, the bench's ReplicaSets are the only ones, and no pods are made.
WITHOUT = ("deployment", "replicaset")
EXTRAPOLATE = (200_000, 50_000)
GOAL_MB = 150


def pooled_kube(plane: controlplane.ControlPlane, connections: int) -> Kube:
    """A client whose connection pool holds `connections` (the default holds a few)."""
    cfg = plane.configuration()
    cfg.connection_pool_maxsize = connections
    return Kube(client.ApiClient(cfg), timeout=120)


def parallel(threads: int, fn: Callable[[int], None], count: int, what: str) -> float:
    """Run fn(0..count-1) on `threads` threads; print the rate; seconds taken."""
    t0 = time.perf_counter()
    done = 0
    with ThreadPoolExecutor(threads) as pool:
        for _ in pool.map(fn, range(count), chunksize=64):
            done += 1
            if done % 10_000 == 0:
                rate = done / (time.perf_counter() - t0)
                print(f"  {what}: {done}/{count} ({rate:.0f}/s)", flush=True)
    took = time.perf_counter() - t0
    print(f"  {what}: {count} in {took:.0f}s ({count / took:.0f}/s)", flush=True)
    return took


def namespaces(count: int) -> list[str]:
    return [f"scale-{i}" for i in range(count)]


def create_sources(kube: Kube, count: int, nss: list[str], threads: int) -> float:
    """`count` sources: ConfigMap cm-k and Secret sec-k alternately, k-th in nss[k % len]."""
    value = "v" * 100

    def one(i: int) -> None:
        k, ns = i // 2, nss[(i // 2) % len(nss)]
        if i % 2 == 0:
            kube.create(
                path("configmaps", ns), configmap(f"cm-{k}", {"a": f"{value}{k}", "b": "1"})
            )
        else:
            body = {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": f"sec-{k}"},
                "stringData": {"p": f"{value}{k}", "q": "1"},
            }
            kube.create(path("secrets", ns), body)

    return parallel(threads, one, count, "sources")


def create_workloads(
    kube: Kube, count: int, sources: int, nss: list[str], fanout: int, threads: int
) -> float:
    """`count` Deployments, each reading one ConfigMap key and one Secret key of its
    namespace, and its ReplicaSet; the first `fanout` (in nss[0]) also read ConfigMap
    `shared`."""
    pairs = max(1, sources // 2)
    per_ns = max(1, pairs // len(nss))

    def one(i: int) -> None:
        n = 0 if i < fanout else i % len(nss)
        ns = nss[n]
        k = n + len(nss) * ((i * 7919) % per_ns)
        env = [
            env_key_ref("configmap", f"cm-{k}", "a", "A"),
            env_key_ref("secret", f"sec-{k}", "p", "P"),
        ]
        if i < fanout:
            env.append(env_key_ref("configmap", "shared", "a", "S"))
        d = kube.create(path("deployments", ns), deployment(f"d{i}", pod_spec(container(env=env))))
        template = d["spec"]["template"]
        template["metadata"].setdefault("labels", {})["pod-template-hash"] = "h"
        meta = d["metadata"]
        rs = {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {
                "name": f"d{i}-h",
                "labels": template["metadata"]["labels"],
                "annotations": {"deployment.kubernetes.io/revision": "1"},
                "ownerReferences": [
                    {
                        "apiVersion": "apps/v1",
                        "kind": "Deployment",
                        "name": meta["name"],
                        "uid": meta["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": {
                "replicas": 0,
                "selector": {"matchLabels": template["metadata"]["labels"]},
                "template": template,
            },
        }
        kube.create(path("replicasets", ns), rs)

    return parallel(threads, one, count, "deployments+replicasets")


def server_metrics(kube: Kube) -> str:
    """The API server's /metrics; asked again once when a pooled connection the server had
    closed meanwhile fails (the bench's requests are not retried otherwise)."""
    for attempt in (1, 2):
        try:
            resp = kube.open("GET", "/metrics")
            try:
                return resp.read().decode()
            finally:
                resp.release_conn()
        except KubeError:
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def watchers(kube: Kube) -> int:
    """Watches open on the API server: `apiserver_registered_watchers` where it exists (it is
    gone by 1.36), else the WATCH requests of `apiserver_longrunning_requests`."""
    text = server_metrics(kube)
    registered = longrunning = 0.0
    found = False
    for family in text_string_to_metric_families(text):
        if family.name == "apiserver_registered_watchers":
            found = True
            registered += sum(s.value for s in family.samples)
        elif family.name == "apiserver_longrunning_requests":
            longrunning += sum(s.value for s in family.samples if s.labels.get("verb") == "WATCH")
    return int(registered if found else longrunning)


def watchers_metric(kube: Kube) -> str:
    text = server_metrics(kube)
    if "apiserver_registered_watchers" in text:
        return "apiserver_registered_watchers"
    return 'apiserver_longrunning_requests{verb="WATCH"}'


def configpin_args(repo: Path) -> list[str]:
    """The fan-out measures re-stamping: every workload of the change at once, as before safe
    delivery's waves (a tree that has them is told `--rollout-waves off --max-rolling 0`;
    bench.delivery measures the waves), and without a flap guard (`--rollout-budget 0`: the
    rounds change one source far more often than a budget allows)."""
    args = ["--coalesce-window", "0", "--min-rollout-interval", "0", "--lease-name", "scale"]
    # (the settings module, before and after the layout of 2f3cd42 moved it)
    settings = [repo / "webhook" / "config.py", repo / "webhook" / "process" / "config.py"]
    text = "".join(p.read_text() for p in settings if p.is_file())
    if "rollout_waves" in text:
        args += ["--rollout-waves", "off", "--max-rolling", "0"]
    if "rollout_budget" in text:  # (the flap guard held every workload from the 7th round on)
        args += ["--rollout-budget", "0"]
    return args


def apiserver_pid(plane: controlplane.ControlPlane) -> int:
    port = plane.host.rpartition(":")[2]
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            if argv[0].endswith(b"kube-apiserver") and f"--secure-port={port}".encode() in argv:
                return int(proc.name)
    raise RuntimeError("no kube-apiserver process found")


@contextlib.contextmanager
def measured(
    plane: controlplane.ControlPlane,
    workdir: Path,
    setup: Kube,
    label: str,
    timeout: float,
    variant: Variant,
    snapshots: bool,
) -> Iterator[tuple[Configpin, dict[str, float]]]:
    """A fresh configpin (controller on, leader-elected): its cold start, RSS, CPU, watchers.
    Snapshot mode allowed or not (the chart's default: not, and no adoption watches)."""
    time.sleep(2.0)
    idle_watchers = watchers(setup)
    server = apiserver_pid(plane)
    server_cpu0 = process_cpu(server)
    t0 = time.perf_counter()
    cp = start_configpin(
        plane,
        workdir,
        args=[*configpin_args(variant.repo), "--snapshots" if snapshots else "--no-snapshots"],
        instance=INSTANCE,
        ready_timeout=timeout,
        repo=variant.repo,
        env=variant.env,
    )
    ready = time.perf_counter() - t0
    try:
        ready_cpu = process_cpu(cp.proc.pid)
        wait_for(
            lambda: cp.metric("configpin_controller_up") == 1,
            timeout=timeout,
            interval=0.05,
            what="configpin_controller_up 1",
        )
        synced = time.perf_counter() - t0
        figures = {
            "ready": ready,
            "synced": synced,
            "cpu_ready": ready_cpu,
            "cpu_synced": process_cpu(cp.proc.pid),
            "server_cpu": process_cpu(server) - server_cpu0,
        }
        wait_for(lambda: "leading:" in cp.log(), timeout=60, what="configpin leading")
        time.sleep(2.0)
        figures |= {
            "rss": rss_kib(cp.proc.pid) * 1024,
            "watchers": watchers(setup),
            "watchers_without": idle_watchers,
        }
        print(
            f"  {label} [{variant.label}]: ready {ready:.1f}s (CPU {ready_cpu:.1f}s), "
            f"controller up {synced:.1f}s (CPU {figures['cpu_synced']:.1f}s, API server "
            f"{figures['server_cpu']:.1f}s), RSS {figures['rss'] / 2**20:.1f} MB, "
            f"watchers {figures['watchers']} (without configpin {idle_watchers})",
            flush=True,
        )
        yield cp, figures
    finally:
        cp.stop()


def cold_starts(
    plane: controlplane.ControlPlane,
    workdir: Path,
    setup: Kube,
    label: str,
    args: argparse.Namespace,
    variants: list[Variant],
) -> dict[str, dict[str, float]]:
    """`--repeat` cold starts of each variant, taking turns; the medians per variant."""
    runs: dict[str, list[dict[str, float]]] = {v.label: [] for v in variants}
    for r in range(args.repeat):
        for v in variants:
            where = workdir / f"{label}-{v.label.replace(' ', '_')}-{r}"
            with measured(plane, where, setup, label, args.timeout, v, args.snapshots) as (_, f):
                runs[v.label].append(f)
    return {
        name: {k: statistics.median(f[k] for f in rows) for k in rows[0]}
        for name, rows in runs.items()
    }


class TemplateWatch:
    """Watches the Deployments of one namespace: when each one's template digest changed."""

    def __init__(self, kube: Kube, ns: str) -> None:
        self.kube, self.ns = kube, ns
        self.digest: dict[str, str] = {}
        self.changed: dict[str, float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def _digest(obj: dict[str, Any]) -> str:
        ann = obj["spec"]["template"]["metadata"].get("annotations") or {}
        return str(ann.get(ANN_SOURCES, ""))

    def _note(self, obj: dict[str, Any]) -> None:
        name, now = obj["metadata"]["name"], self._digest(obj)
        with self._lock:
            if name in self.digest and self.digest[name] != now:
                self.changed[name] = time.perf_counter()
            self.digest[name] = now

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._list_and_watch()
            except Exception:  # the control plane stopping ends it; else list and watch again
                if self._stop.is_set():
                    return
                time.sleep(0.5)

    def _list_and_watch(self) -> None:
        rv = ""
        for page in self.kube.list_pages(path("deployments", self.ns)):
            for obj in page.get("items") or ():
                self._note(obj)
            rv = page["metadata"]["resourceVersion"]
        self.ready.set()
        with self.kube.watch(path("deployments", self.ns), rv) as events:
            for event in events:
                if event["type"] in ("ADDED", "MODIFIED"):
                    self._note(event["object"])
                elif event["type"] == "ERROR":
                    raise RuntimeError(str(event["object"]))
                if self._stop.is_set():
                    return

    def reset(self) -> None:
        with self._lock:
            self.changed.clear()

    def __enter__(self) -> TemplateWatch:
        self.ready = threading.Event()
        self._thread.start()
        self.ready.wait(120)
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()


@dataclass
class Variant:
    """A configpin source tree the fan-out runs on: this one, or a baseline revision."""

    label: str
    repo: Path
    webhook: bool = True  # its admission registered (False: what the fan-out costs without it)
    env: dict[str, str] = field(default_factory=dict)  # its environment (MALLOC_ARENA_MAX)


@contextlib.contextmanager
def fanout_pair(
    plane: controlplane.ControlPlane, workdir: Path, variant: Variant, extra: list[str]
) -> Iterator[tuple[Configpin, Configpin]]:
    """Two replicas of one variant, as the chart runs them: `webhook` serves every admission
    (`--no-controller`, its webhook registered as the chart registers it) and `leader` runs
    the controller (its webhook not registered), so each re-stamp passes through the other
    replica's admission. (A variant without the webhook registers neither.)"""
    with running_configpin(
        plane,
        workdir / "webhook",
        args=["--no-controller"],
        instance=INSTANCE,
        webhook_name="configpin-scale-fanout" if variant.webhook else None,
        repo=variant.repo,
    ) as webhook:
        leader = start_configpin(
            plane,
            workdir / "leader",
            args=[*configpin_args(variant.repo), *extra],
            instance=INSTANCE,
            repo=variant.repo,
            ready_timeout=300,
        )
        try:
            wait_for(lambda: leader.metric("configpin_leader") == 1, timeout=120, what="leading")
            wait_for(lambda: "leading:" in leader.log(), timeout=60, what="leader checked all")
            time.sleep(2.0)  # its first check of every workload (all current) is done
            yield webhook, leader
        finally:
            leader.stop()


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) of one process so far."""
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")


# configpin's own counters read around each round: (replica, metric, labels, short name)
COUNTERS: tuple[tuple[str, str, dict[str, str], str], ...] = (
    ("webhook", "configpin_source_reads_total", {"how": "fresh"}, "fresh reads"),
    ("webhook", "configpin_source_reads_total", {"how": "cache"}, "cache plans"),
    ("webhook", "configpin_admissions_total", {"result": "unchanged"}, "admitted unchanged"),
    ("leader", "configpin_rollouts_total", {}, "rollouts"),
    ("leader", "configpin_rollouts_skipped_total", {"reason": "not-stored"}, "not-stored"),
    ("leader", "configpin_patch_conflicts_total", {}, "409s"),
    ("leader", "configpin_client_rate_limit_wait_seconds_sum", {}, "rate-limit wait s"),
)


def counters(replicas: dict[str, Configpin], marker: str) -> dict[str, float]:
    out = {name: replicas[who].metric(metric, **labels) for who, metric, labels, name in COUNTERS}
    for who, cp in replicas.items():
        out[f"{who} CPU s"] = process_cpu(cp.proc.pid)
    plane = cpu_seconds((marker, f"configpin-etcd-{os.getpid()}-"))
    for name in ("kube-apiserver", "etcd"):
        out[f"{name} CPU s"] = plane[name]
    return out


def requests_by(
    before: tuple[Buckets, Counter[tuple[str, str]]],
    after: tuple[Buckets, Counter[tuple[str, str]]],
) -> Counter[str]:
    """Requests the API server served between two reads, by "VERB resource"."""
    out: Counter[str] = Counter()
    for key, buckets in after[0].items():
        if key[0] in ("WATCH", "CONNECT"):
            continue
        n = buckets[float("inf")] - before[0].get(key, Counter())[float("inf")]
        if n:
            out[f"{key[0]} {key[1]}"] += n
    return out


def one_round(
    setup: Kube,
    ns: str,
    fanout: int,
    value: str,
    watch: TemplateWatch,
    quiet: float,
    replicas: dict[str, Configpin],
    marker: str,
    timeout: float,
) -> dict[str, Any]:
    """An idle spell of `quiet` seconds, then `shared` changes: until every template of the
    `fanout` Deployments was re-stamped, with the API server's figures and configpin's."""
    b0, q0 = server_histogram(setup), time.perf_counter()
    time.sleep(quiet)
    b1, q1 = server_histogram(setup), time.perf_counter()
    c1 = counters(replicas, marker)
    watch.reset()
    t0 = time.perf_counter()
    setup.patch(path("configmaps", ns, "shared"), {"data": {"a": value}}, MERGE_PATCH)
    wait_for(
        lambda: len(watch.changed) >= fanout,
        timeout=timeout,
        interval=0.01,
        what=f"{fanout} Deployments re-stamped",
    )
    t1 = max(watch.changed.values())
    b2 = server_histogram(setup)
    c2 = counters(replicas, marker)
    return {
        "span": t1 - t0,
        "idle": served(b0, b1) | {"seconds": q1 - q0},
        "busy": served(b1, b2) | {"seconds": t1 - t0},
        "patches": served(b1, b2, only=("PATCH", "deployments")),
        "requests": requests_by(b1, b2),
        "configpin": {k: c2[k] - c1[k] for k in c2},
    }


@contextlib.contextmanager
def _said_on_failure(*replicas: Configpin) -> Iterator[None]:
    """A round that fails prints the replicas' logs (their folders go with the run)."""
    try:
        yield
    except Exception:
        for cp in replicas:
            print(f"--- {cp.url}\n{cp.log()[-12000:]}", flush=True)
        raise


def published(setup: Kube, timeout: float, still: float = 10.0) -> int:
    """Once the ConfigRollouts a first install publishes (one per consumed source) stop
    growing for `still` seconds: how many, and how long that took (printed)."""
    start = time.perf_counter()
    seen, since = -1, time.perf_counter()
    while time.perf_counter() - start < timeout:
        count = len(setup.get("/apis/configpin.io/v1alpha1/configrollouts").get("items") or ())
        if count != seen:
            seen, since = count, time.perf_counter()
        elif count and time.perf_counter() - since >= still:
            break
        time.sleep(1.0)
    took = since - start
    print(f"  ConfigRollouts published (first install): {seen} in {took:.1f}s", flush=True)
    return seen


def fanout_rounds(
    plane: controlplane.ControlPlane,
    setup: Kube,
    workdir: Path,
    ns: str,
    fanout: int,
    rounds: int,
    variants: list[Variant],
    extra: list[str],
    timeout: float,
) -> dict[str, list[dict[str, Any]]]:
    """`rounds` rounds per variant, the variants interleaved (their order alternating from
    round to round), each round on a fresh pair of replicas of its variant."""
    results: dict[str, list[dict[str, Any]]] = {v.label: [] for v in variants}
    quiet = 5.0
    n = 0
    for variant in variants:  # (a first install publishes every consumed source's, once)
        if variant.webhook and (variant.repo / "webhook/controller/publish.py").is_file():
            with fanout_pair(plane, workdir / "publish", variant, extra):
                published(setup, timeout)
            break
    with TemplateWatch(setup, ns) as watch:
        for r in range(rounds):
            order = variants if r % 2 == 0 else variants[::-1]
            for variant in order:
                n += 1
                folder = workdir / f"fanout-{n}-{variant.label.split()[0]}"
                with (
                    fanout_pair(plane, folder, variant, extra) as (webhook, leader),
                    _said_on_failure(leader, webhook),
                ):
                    row = one_round(
                        setup,
                        ns,
                        fanout,
                        str(n),
                        watch,
                        quiet,
                        {"webhook": webhook, "leader": leader},
                        str(workdir),
                        timeout,
                    )
                    time.sleep(2.0)  # the records' writes land
                quiet = row["span"]
                results[variant.label].append(row)
                busy, idle = row["busy"], row["idle"]
                per = ", ".join(f"{k} {v / fanout:.2f}" for k, v in row["requests"].most_common(6))
                print(
                    f"  {variant.label} round {r + 1}: all {fanout} re-stamped in "
                    f"{row['span']:.2f}s; API server p50/p99 {busy['p50'] * 1e3:.1f}/"
                    f"{busy['p99'] * 1e3:.1f} ms ({busy['count']:.0f} requests) vs idle "
                    f"{idle['p50'] * 1e3:.1f}/{idle['p99'] * 1e3:.1f} ms "
                    f"({idle['count']:.0f}); per re-stamp: {per}",
                    flush=True,
                )
                print(
                    "    configpin: "
                    + ", ".join(f"{k} {v:.4g}" for k, v in row["configpin"].items()),
                    flush=True,
                )
    return results


def median_of(rows: list[dict[str, float]], field: str) -> float:
    return statistics.median(r[field] for r in rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--version", default="1.36.2", help="control plane (KUBEBUILDER_ASSETS wins)")
    ap.add_argument("--sources", type=int, default=100_000, help="ConfigMaps+Secrets in all")
    ap.add_argument("--workloads", type=int, default=25_000, help="Deployments (+ ReplicaSets)")
    ap.add_argument("--namespaces", type=int, default=5)
    ap.add_argument("--fanout", type=int, default=1000, help="Deployments reading `shared`")
    ap.add_argument("--rounds", type=int, default=3, help="fan-out rounds per variant")
    ap.add_argument("--threads", type=int, default=32, help="concurrent creates")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per wait at most")
    ap.add_argument(
        "--fanout-only",
        action="store_true",
        help="skip the cold-start stages (RSS, ready times): load, then only the fan-out",
    )
    ap.add_argument(
        "--baseline",
        metavar="REV",
        help="also run the fan-out on this git revision's configpin, rounds interleaved",
    )
    ap.add_argument(
        "--without-webhook",
        action="store_true",
        help="also run the fan-out of this tree with no webhook registered (admission's share)",
    )
    ap.add_argument("--repeat", type=int, default=1, help="cold starts per stage and variant")
    ap.add_argument(
        "--arena-max",
        type=int,
        help="also cold-start this tree with MALLOC_ARENA_MAX set to this (glibc arenas)",
    )
    ap.add_argument(
        "--snapshots",
        action="store_true",
        help="cold starts with snapshot mode allowed (adoption watches), as `serve`'s own "
        "default; without it configpin starts as the chart's default (snapshots.enabled: false)",
    )
    ap.add_argument(
        "--leader-args",
        default="",
        help="extra flags for the fan-out's leader, both variants (e.g. '--controller-qps 400')",
    )
    args = ap.parse_args()
    fanout = min(args.fanout, args.workloads)
    assets = control_plane_assets(args.version)
    # The bench makes each Deployment's ReplicaSet itself: the controller-manager runs
    # without the deployment and replicaset controllers.
    controlplane.CONTROLLERS = tuple(c for c in controlplane.CONTROLLERS if c not in WITHOUT)
    print(f"load average at start: {' '.join(map(str, os.getloadavg()))}", flush=True)
    with (
        tempfile.TemporaryDirectory() as tmp,
        running_control_plane(Path(tmp) / "cp", assets) as plane,
    ):
        with plane.api_client() as api:
            install_crds(api)  # (as the chart does: this tree publishes ConfigRollouts)
        variants = [Variant("this tree", REPO)]
        if args.without_webhook:
            variants.append(Variant("this tree without webhook", REPO, webhook=False))
        if args.baseline:
            rev = subprocess.run(
                ["git", "-C", str(REPO), "rev-parse", "--short", args.baseline],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
            variants.insert(
                0, Variant(f"baseline {rev}", baseline_tree(args.baseline, Path(tmp) / "base"))
            )
        # Cold starts: this tree, the baseline, this tree with capped malloc arenas.
        starts = [v for v in variants if v.webhook]
        if args.arena_max:
            starts.append(
                Variant(
                    f"arena max {args.arena_max}",
                    REPO,
                    env={"MALLOC_ARENA_MAX": str(args.arena_max)},
                )
            )
        print(f"control plane {plane.version}, controllers {','.join(controlplane.CONTROLLERS)}")
        api = plane.api_client()  # the official client: ensure_namespace, server_minor
        print("watchers: " + watchers_metric(Kube(api)), flush=True)
        ensure_namespace(api)
        setup = pooled_kube(plane, args.threads + 4)
        nss = namespaces(args.namespaces)
        for ns in nss:
            setup.create(
                path("namespaces"),
                {
                    "metadata": {
                        "name": ns,
                        "labels": {ENABLED_LABEL: "true", INSTANCE_LABEL: INSTANCE},
                    }
                },
            )
        setup.create(path("configmaps", nss[0]), configmap("shared", {"a": "0"}))
        stages: dict[str, dict[str, dict[str, float]]] = {}
        work = Path(tmp)
        if not args.fanout_only:
            stages["empty"] = cold_starts(plane, work, setup, "empty", args, starts)
        with running_configpin(
            plane,
            Path(tmp) / "loader",
            args=["--no-controller"],
            instance=INSTANCE,
            webhook_name="configpin-scale-loader",
        ):
            print("loading (through the loader configpin's webhook):", flush=True)
            create_sources(setup, args.sources, nss, args.threads)
            if not args.fanout_only:
                stages["sources"] = cold_starts(plane, work, setup, "sources", args, starts)
            create_workloads(setup, args.workloads, args.sources, nss, fanout, args.threads)
            if not args.fanout_only:
                stages["full"] = cold_starts(plane, work, setup, "full", args, starts)
        print(f"fan-out ({', '.join(v.label for v in variants)}):", flush=True)
        fan = fanout_rounds(
            plane,
            setup,
            Path(tmp),
            nss[0],
            fanout,
            args.rounds,
            variants,
            shlex.split(args.leader_args),
            args.timeout,
        )
        logging.disable(logging.WARNING)
    report(args, fanout, stages, fan)


def report(
    args: argparse.Namespace,
    fanout: int,
    stages: dict[str, dict[str, dict[str, float]]],
    fan: dict[str, list[dict[str, Any]]],
) -> None:
    mb = 2**20
    print(f"\nscale: {args.sources} sources, {args.workloads} Deployments (+ ReplicaSets)")
    if stages:
        print(f"cold starts: medians of {args.repeat} per stage and variant")
        print(
            f"{'stage':>8} {'variant':>16} {'ready':>7} {'CPU':>6} {'ctl up':>7} {'CPU':>6} "
            f"{'server':>7} {'RSS':>9} {'watchers':>9} {'without':>8}"
        )
        for stage_name, by_variant in stages.items():
            for name, f in by_variant.items():
                print(
                    f"{stage_name:>8} {name[:16]:>16} {f['ready']:>6.1f}s "
                    f"{f['cpu_ready']:>5.1f}s {f['synced']:>6.1f}s {f['cpu_synced']:>5.1f}s "
                    f"{f['server_cpu']:>6.1f}s {f['rss'] / mb:>6.1f} MB "
                    f"{f['watchers']:>9.0f} {f['watchers_without']:>8.0f}"
                )
        names = list(stages["empty"])
        for name in names:
            e, s, w = (stages[k][name]["rss"] for k in ("empty", "sources", "full"))
            per_source = (s - e) / args.sources if args.sources else 0.0
            per_workload = (w - s) / args.workloads if args.workloads else 0.0
            at = e + per_source * EXTRAPOLATE[0] + per_workload * EXTRAPOLATE[1]
            print(
                f"[{name}] bytes per source {per_source:.0f}, per workload (Deployment + "
                f"ReplicaSet) {per_workload:.0f}; extrapolated to {EXTRAPOLATE[0]:,} sources + "
                f"{EXTRAPOLATE[1]:,} workloads: {at / mb:.0f} MB "
                f"(goal < {GOAL_MB} MB; ratio {at / mb / GOAL_MB:.2f})"
            )
        this = next((n for n in names if n == "this tree"), names[0])
        for name in names:
            if name == this:
                continue
            full, other = stages["full"][this], stages["full"][name]
            above = (full["rss"] - stages["empty"][this]["rss"]) / (
                other["rss"] - stages["empty"][name]["rss"]
            )
            print(
                f"{this} / {name}, full stage: RSS {full['rss'] / other['rss']:.2f} (above "
                f"empty {above:.2f}), ready {full['ready'] / other['ready']:.2f}, controller up "
                f"{full['synced'] / other['synced']:.2f}, CPU to controller up "
                f"{full['cpu_synced'] / other['cpu_synced']:.2f}"
            )
    medians: dict[str, float] = {}
    for label, rows in fan.items():
        if not rows:
            continue
        spans = [r["span"] for r in rows]
        busy, idle = [r["busy"] for r in rows], [r["idle"] for r in rows]
        medians[label] = span = statistics.median(spans)
        print(
            f"fan-out, {label}: {fanout} Deployments re-stamped in "
            f"{', '.join(f'{x:.2f}' for x in spans)} s; median {span:.2f}s "
            f"({fanout / span:.0f}/s)"
        )
        print(
            f"  API server latency, median per round, fan-out vs idle: "
            f"p50 {median_of(busy, 'p50') * 1e3:.1f} vs {median_of(idle, 'p50') * 1e3:.1f} ms, "
            f"p99 {median_of(busy, 'p99') * 1e3:.1f} vs {median_of(idle, 'p99') * 1e3:.1f} ms; "
            f"requests {median_of(busy, 'count'):.0f} vs {median_of(idle, 'count'):.0f}"
        )
        kinds = sorted({k for r in rows for k in r["requests"]})
        per = {k: statistics.median(r["requests"][k] for r in rows) / fanout for k in kinds}
        total = statistics.median(sum(r["requests"].values()) for r in rows) / fanout
        patches = [r["patches"] for r in rows]
        print(
            f"  of which the Deployments' PATCHes: p50 {median_of(patches, 'p50') * 1e3:.1f} ms, "
            f"p99 {median_of(patches, 'p99') * 1e3:.1f} ms"
        )
        print(
            f"  API requests per re-stamp (every client, median): {total:.2f}: "
            + ", ".join(f"{k} {v:.2f}" for k, v in sorted(per.items(), key=lambda kv: -kv[1]))
        )
        names = list(rows[0]["configpin"])
        print(
            "  configpin per round (median): "
            + ", ".join(
                f"{k} {statistics.median(r['configpin'][k] for r in rows):.4g}" for k in names
            )
        )
    if medians:
        (first_label, first), *others = medians.items()
        for label, median in others:
            print(f"fan-out time, {label} / {first_label}: {median / first:.2f}")
    print(f"load average at end: {' '.join(map(str, os.getloadavg()))}")


if __name__ == "__main__":
    main()
