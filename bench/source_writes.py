"""Writes of a consumed ConfigMap with configpin's source-writes webhook (`sources.configpin.io`:
the preview warnings and the signed `configpin.io/changed-by`), against no webhook at all; and
the webhook's own time per write at N consumers, in process.

**Through the API server** (the way `e2e_create` measures): the test control plane and
configpin (its controller on, so that its workload index fills from its watches) as the
harness starts them. For each size in `--consumers`, a namespace opted in holds ConfigMap
`shared` (four keys) and that many Deployments (0 replicas) each reading its key `a`, created
through configpin's workloads webhook. Each timed write is a merge PATCH of key `a` to a new
value, as `kubectl patch --type merge -p '{"data":{"a":"..."}}'` sends it (fieldManager
kubectl-patch), one at a time; its latency runs from the request to the end of the answer's
body. Rounds alternate (the order flips each round, so drift falls on both alike):

- **without**: no MutatingWebhookConfiguration at all (the fastest thing a user could pick
  instead, and the baseline);
- **with**: configpin's two entries as the chart renders them for this server
  (`register_webhook`; on 1.28+ with their matchConditions).

Each switch is confirmed by writes before the timed ones: configpin's answer is seen on the
object (`changed-by` moves) with the webhook, never without. configpin's handler time for the
timed writes of each size comes from its `/metrics` (`configpin_admission_duration_seconds`,
read before and after; its buckets are coarse, so it gives the mean and the buckets that hold
p50 and p99), and `configpin_admissions_total` says how many webhook calls each write cost (a
few writes cost two: the API server admits a patch again when it retries it inside, as 1.20
did for about one back-to-back write in twenty).

configpin runs as a **follower**: a stand-in holds its Lease, so its controller indexes every
workload (as every replica does: each one answers previews) but rolls nothing. Otherwise every
timed write would start a rollout of every consumer, and the writes would be measured against
those rollouts' traffic, not against the webhook's work. Before timing, a server-side dry run
of each ConfigMap must be previewed with exactly its number of consumers.

**In process** (`Admitter.review`, as `hotpath` does for workloads): `parse_review`,
`Admitter.review` and `orjson.dumps` of an AdmissionReview of a ConfigMap UPDATE (one changed
key; the object and old object as the API server sends them, managed fields and the previous
`changed-by` included), with a `Previewer` over an index of N Deployments that consume that key
(built as tests/unit/controller/test_preview.py builds one). The floor is the same review with
no consumer (the audit record only). These Deployments have 2 replicas and no failing condition
(healthy: the change is cut in waves of 1, 10% and the rest), the cluster's have none (scaled
to zero: one wave), so the two previews differ there; the rows and the summary cost per
consumer either way. It prints p50/p99 per size, their ratio to the floor, and a breakdown
of the parts (medians): the parse, the write's facts (`source_write`: the keys' digests), the
rows (`Previewer.rows`) and the warnings (`summary`). `--profile N` adds the functions that take
the time over N admissions at the largest size (cProfile). This part runs in a child process in
a folder of its own, so `PYTHONPATH=$PWD/build/compiled` measures the compiled core (only
webhook/core is compiled: `Previewer.rows` is webhook/controller, pure Python in every
build). The cluster part serves configpin from the checkout, pure Python.

    KUBEBUILDER_ASSETS=$(hack/provision-control-plane.sh 1.36.2) \\
        .venv/bin/python -m bench.source_writes [--consumers 1,1000] [--rounds 5] [--per-round 100]
    .venv/bin/python -m bench.source_writes --in-process-only [--consumers 1000] [--profile 20]
    .venv/bin/python -m bench.source_writes --quick          # validation: small sizes, seconds

Goal (the issue): p99 < 2 ms per source write at 1,000 consumers.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import datetime
import functools
import os
import pstats
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import urllib3
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

import webhook.core.plan
from bench.common import REPO, child_env, control_plane_assets, pct
from harness.builders import HKEY, Store, apply, configmap, container, env_cm, plan, pod_spec
from harness.builders import workload as workload_of
from harness.configpin import (
    CONFIGPIN_NAMESPACE,
    Configpin,
    ensure_namespace,
    lease_name,
    start_configpin,
)
from harness.controller import StoreCache
from harness.controlplane import (
    ENABLED_LABEL,
    chart_webhooks,
    register_webhook,
    running_control_plane,
    server_minor,
    unregister_webhook,
    wait_for,
)
from harness.manifests import configmap as configmap_manifest
from harness.manifests import container as container_manifest
from harness.manifests import deployment, env_key_ref
from harness.manifests import pod_spec as pod_spec_manifest
from webhook.controller.index import WorkloadIndex
from webhook.controller.preview import Previewer
from webhook.controller.wavecut import WaveCut
from webhook.core import digest
from webhook.core.audit import ChangedBy
from webhook.core.constants import ANN_CHANGED_BY, ANN_SOURCES
from webhook.core.current import WorkloadEntry, entry_from_object
from webhook.core.model import SourceId, SourceKind
from webhook.core.preview import source_write, summary
from webhook.inputs.sources import FileSources
from webhook.kube.lease import format_time
from webhook.kube.raw import MERGE_PATCH, Kube, path
from webhook.process.config import Settings
from webhook.process.metrics import Metrics
from webhook.server.admission import parse_review
from webhook.server.handler import Admitter

CM = "shared"
HOOK = "configpin-bench"
CONSUMED_KEY = "a"
STAND_IN = "bench-stand-in-leader"
GOAL_CONSUMERS = 1000
GOAL_P99 = 0.002  # seconds


def _data(value: str) -> dict[str, str]:
    """The ConfigMap's content: key `a` (what each consumer reads and each write changes) and
    three others of realistic size."""
    return {
        CONSUMED_KEY: value,
        "log-level": "info",
        "feature-flags": "checkout=true,search-v2=false,new-cart=true",
        "app.properties": "\n".join(f"key.{j}=value-{j}" for j in range(40)),
    }


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}"


# ---- in process -------------------------------------------------------------------------------

NS = "shop"
USER = "alice@example.com"


def _configmap_as_served(value: str, changed_by: str | None) -> dict[str, Any]:
    """ConfigMap `shared` as the API server puts it in a review: server metadata, managed
    fields of the apply that made it and of the last `kubectl patch`."""
    notes = {"configpin.io/changed-by": changed_by} if changed_by else {}
    fields: dict[str, Any] = {"f:data": {f"f:{k}": {} for k in _data("")}}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": CM,
            "namespace": NS,
            "uid": "0b7c7a1e-4c55-4f63-9d1c-2f1d9a3e8b10",
            "resourceVersion": "48213",
            "creationTimestamp": "2026-11-20T09:12:44Z",
            "labels": {"app.kubernetes.io/name": "shop", "app.kubernetes.io/part-of": "shop"},
            "annotations": notes,
            "managedFields": [
                {
                    "manager": "kubectl-client-side-apply",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "time": "2026-11-20T09:12:44Z",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": fields,
                },
                {
                    "manager": "kubectl-patch",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "time": "2026-11-26T23:02:26Z",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:data": {f"f:{CONSUMED_KEY}": {}}},
                },
            ],
        },
        "data": _data(value),
    }


def update_review(uid: str = "b1f3e0c2-7a9d-4e1b-8c55-3d2a1f0e9b77") -> bytes:
    """The AdmissionReview of a ConfigMap UPDATE changing key `a`, as the API server sends a
    `kubectl patch` of it: the old object carries the record of the previous change, and so
    does the new one (a merge patch of `data` leaves annotations as they are)."""
    old = _configmap_as_served("v1", None)
    record = digest.record_from_object(HKEY, SourceKind.CONFIGMAP, old)
    content = digest.content_id(digest.source_digest(HKEY, record))
    text = ChangedBy(USER, 1_795_734_146.21, content).encode(
        HKEY, NS, SourceId(SourceKind.CONFIGMAP, CM)
    )
    old = _configmap_as_served("v1", text)
    new = _configmap_as_served("v2", text)
    gvk = {"group": "", "version": "v1", "kind": "ConfigMap"}
    gvr = {"group": "", "version": "v1", "resource": "configmaps"}
    return orjson.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": uid,
                "kind": gvk,
                "resource": gvr,
                "requestKind": gvk,
                "requestResource": gvr,
                "name": CM,
                "namespace": NS,
                "operation": "UPDATE",
                "userInfo": {
                    "username": USER,
                    "uid": "5f0c1a8e-1b9d-4a53-9a2e-9d3f1c0f6b7a",
                    "groups": ["shop-admins", "system:authenticated"],
                },
                "object": new,
                "oldObject": old,
                "dryRun": False,
                "options": {
                    "apiVersion": "meta.k8s.io/v1",
                    "kind": "PatchOptions",
                    "fieldManager": "kubectl-patch",
                },
            },
        }
    )


def build_admitter(consumers: int) -> Admitter:
    """configpin's Admitter as `configpin serve` makes it, its preview a Previewer over an
    index of `consumers` Deployments that read key `a` of ConfigMap `shared` (each stamped
    by admission, as in a cluster), synced."""
    store = Store([configmap(CM, _data("v1"), namespace=NS)])
    index = WorkloadIndex()
    spec = pod_spec(container(env=[env_cm(CM, CONSUMED_KEY, var="A")]))
    for i in range(consumers):
        obj = workload_of("Deployment", spec, name=f"app-{i}", namespace=NS)
        entry = entry_from_object(apply(obj, plan(obj, store)), "checksum", hkey=HKEY)
        assert isinstance(entry, WorkloadEntry), entry
        index.put(entry)
    cache = StoreCache({NS: store}, frozen=True)
    cut = WaveCut(index, cache, HKEY, Settings(), in_scope=lambda _ns: True)  # type: ignore[arg-type]
    previewer = Previewer(cut, ready=lambda: True)
    sources = FileSources(HKEY, [])
    return Admitter(hkey=HKEY, sources=sources, metrics=Metrics(), preview=previewer)


async def _admissions(admitter: Admitter, body: bytes, n: int, budget: float) -> list[float]:
    """Seconds of each of up to `n` admissions of `body` (parse, review, dumps), within
    `budget` seconds."""
    review = admitter.review
    clock = time.perf_counter
    times: list[float] = []
    deadline = clock() + budget
    for _ in range(n):
        start = clock()
        out = await review(parse_review(body))
        orjson.dumps(out)
        end = clock()
        times.append(end - start)
        if end > deadline:
            break
    return times


def _median_us(fn: Callable[[], object], n: int) -> float:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def _breakdown(admitter: Admitter, body: bytes, n: int) -> dict[str, float]:
    """Median µs of each part of the answer, each timed on its own."""
    review = parse_review(body)
    old, new = review.old, review.obj
    assert old is not None and new is not None
    kind = SourceKind.CONFIGMAP
    write = source_write(HKEY, kind, "UPDATE", old, new)
    sid = SourceId(kind, CM)
    preview = admitter.writes.preview
    assert preview is not None
    rows = preview.rows(NS, sid, write.changed, write.record)
    assert rows is not None
    return {
        "parse": _median_us(lambda: parse_review(body), n),
        "facts": _median_us(lambda: source_write(HKEY, kind, "UPDATE", old, new), n),
        "rows": _median_us(lambda: preview.rows(NS, sid, write.changed, write.record), n),
        "summary": _median_us(lambda: summary(kind, NS, CM, write.changed, rows), n),
    }


def _check(admitter: Admitter, body: bytes, consumers: int) -> str:
    """One admission, checked: patched (the record of who changed it), its first warning
    counting every consumer. Returns that warning."""
    out = asyncio.run(admitter.review(parse_review(body)))
    response = out["response"]
    warnings = response.get("warnings") or []
    if not response.get("patch") or not warnings:
        raise SystemExit(f"unexpected answer: {response}")
    said = "no workload consumes it" if consumers == 0 else f"-> {consumers} workloads"
    if said not in warnings[0]:
        raise SystemExit(f"the preview does not count {consumers} consumers: {warnings[0]}")
    return str(warnings[0])


def _where(filename: str) -> str:
    """A profile entry's file, without the machine's paths."""
    file = Path(filename)
    for root in (REPO, *(Path(p) for p in sys.path if p)):
        if file.is_relative_to(root):
            return str(file.relative_to(root))
    return file.name


def _profile(admitter: Admitter, body: bytes, n: int, top: int = 14) -> None:
    profiler = cProfile.Profile()
    profiler.enable()
    asyncio.run(_admissions(admitter, body, n, budget=120.0))
    profiler.disable()
    stats: dict[tuple[str, int, str], tuple[int, int, float, float, Any]]
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    total = sum(v[2] for v in stats.values())
    print(f"  profile of {n} admissions (cProfile, which slows Python calls): {total:.2f} s")
    print(f"  {'calls/adm':>10} {'own ms/adm':>11} {'cum ms/adm':>11}  function")
    for (filename, line, func), (_, calls, own, cum, _) in sorted(
        stats.items(), key=lambda kv: kv[1][2], reverse=True
    )[:top]:
        where = f"{_where(filename)}:{line}({func})" if line else func
        print(f"  {calls / n:>10.0f} {own / n * 1e3:>11.2f} {cum / n * 1e3:>11.2f}  {where}")


def in_process(args: argparse.Namespace) -> None:
    """The in-process part (in the child): each size, its floor first."""
    build = "pure Python" if webhook.core.plan.__file__.endswith(".py") else "compiled"
    sizes = sorted({0, *args.sizes})
    body = update_review()
    print(
        f"In process: parse_review + Admitter.review + orjson.dumps of a ConfigMap UPDATE review "
        f"({len(body):,} bytes, 1 key changed); core: {build}; load average "
        f"{os.getloadavg()[0]:.2f}",
        flush=True,
    )
    print(
        f"  {'consumers':>9} {'admissions':>10} {'p50 us':>9} {'p99 us':>9} {'max us':>9} "
        f"{'p50/floor':>9} {'p99/floor':>9}   parts, medians in us: parse, facts, rows, summary"
    )
    floor: tuple[float, float] | None = None
    admitters = {}
    results: dict[int, tuple[float, float]] = {}
    for n in sizes:
        admitter = admitters[n] = build_admitter(n)
        _check(admitter, body, n)
        asyncio.run(_admissions(admitter, body, args.warmup_admissions, budget=args.max_seconds))
        times = asyncio.run(_admissions(admitter, body, args.iterations, budget=args.max_seconds))
        p50, p99 = pct(times, 0.5), pct(times, 0.99)
        results[n] = (p50, p99)
        floor = floor or (p50, p99)
        parts = _breakdown(admitter, body, max(5, min(200, len(times))))
        print(
            f"  {n if n else '0 (floor)':>9} {len(times):>10} {p50 * 1e6:>9.0f} {p99 * 1e6:>9.0f} "
            f"{max(times) * 1e6:>9.0f} {p50 / floor[0]:>9.2f} {p99 / floor[1]:>9.2f}   "
            + ", ".join(f"{parts[k]:.0f}" for k in ("parse", "facts", "rows", "summary")),
            flush=True,
        )
    largest = max(sizes)
    print(f"  preview at {largest}: {_check(admitters[largest], body, largest)}")
    if GOAL_CONSUMERS in results:
        p99 = results[GOAL_CONSUMERS][1]
        verdict = "ok" if p99 < GOAL_P99 else "MISSED"
        print(f"  goal: p99 < 2 ms per source write at 1,000 consumers: {ms(p99)} ms: {verdict}")
    if args.profile:
        _profile(admitters[largest], body, args.profile)
    for admitter in admitters.values():
        admitter.close()


# ---- through the API server --------------------------------------------------------------------


@dataclass
class Size:
    """One namespace: ConfigMap `shared` and `consumers` Deployments reading its key `a`."""

    consumers: int
    last_record: str | None = None  # `changed-by` as the last write returned it
    lat: dict[str, list[float]] = field(default_factory=lambda: {"without": [], "with": []})
    round_p50: dict[str, list[float]] = field(default_factory=lambda: {"without": [], "with": []})
    handler: Counter[float] = field(default_factory=Counter)  # le -> admissions (cumulative)
    handler_sum: float = 0.0
    calls: float = 0.0
    unanswered: int = 0  # timed writes `with` that configpin's answer did not reach
    preview: str = ""

    @property
    def ns(self) -> str:
        return f"bench-writes-{self.consumers}"


_WARNING = re.compile(r'^\d{3} \S+ "(.*)"$')
_COUNT = re.compile(r"-> (\d+) workloads")


def _warnings(resp: urllib3.BaseHTTPResponse) -> list[str]:
    out = []
    for value in resp.headers.getlist("Warning"):
        m = _WARNING.match(value)
        out.append(m.group(1) if m else value)
    return out


class Writer:
    """Writes of key `a`, each to a value not written before."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self.n = 0

    def write(self, size: Size, *, dry_run: bool = False) -> tuple[float, bool, list[str]]:
        """One merge PATCH, as kubectl patch sends it: (seconds, whether configpin's answer
        reached the stored object, the warnings)."""
        self.n += 1
        query = {"fieldManager": "kubectl-patch", **({"dryRun": "All"} if dry_run else {})}
        start = time.perf_counter()
        resp = self.kube.open(
            "PATCH",
            path("configmaps", size.ns, CM),
            query=query,
            body={"data": {CONSUMED_KEY: f"v{self.n}"}},
            content_type=MERGE_PATCH,
        )
        try:
            data = resp.read()
        finally:
            resp.release_conn()
        took = time.perf_counter() - start
        notes = (orjson.loads(data).get("metadata") or {}).get("annotations") or {}
        record = notes.get(ANN_CHANGED_BY)
        answered = record is not None and record != size.last_record
        if not dry_run:
            size.last_record = record
        return took, answered, _warnings(resp)


def _handler_metrics(cp: Configpin) -> tuple[Counter[float], float, float]:
    """configpin's handler histogram (cumulative buckets, sum) and its ConfigMap UPDATEs."""
    _, text = cp.get("/metrics")
    buckets: Counter[float] = Counter()
    total = calls = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "configpin_admission_duration_seconds_bucket":
                buckets[float(s.labels["le"])] += int(s.value)
            elif s.name == "configpin_admission_duration_seconds_sum":
                total += s.value
            elif s.name == "configpin_admissions_total" and (
                s.labels.get("kind"),
                s.labels.get("operation"),
            ) == ("ConfigMap", "UPDATE"):
                calls += s.value
    return buckets, total, calls


def _hold_lease(kube: Kube) -> None:
    """A stand-in holds configpin's Lease for a day: configpin stays a follower."""
    now = format_time(datetime.datetime.now(datetime.UTC))
    kube.create(
        path("leases", CONFIGPIN_NAMESPACE),
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": lease_name(None)},
            "spec": {
                "holderIdentity": STAND_IN,
                "leaseDurationSeconds": 86400,
                "acquireTime": now,
                "renewTime": now,
            },
        },
    )


def _populate(kube: Kube, size: Size, concurrency: int) -> None:
    """The namespace, its ConfigMap and its Deployments (through configpin's webhook)."""
    kube.create(
        path("namespaces"),
        {"metadata": {"name": size.ns, "labels": {ENABLED_LABEL: "true"}}},
    )
    kube.create(path("configmaps", size.ns), configmap_manifest(CM, _data("v0")))
    env = [env_key_ref("configmap", CM, CONSUMED_KEY, "A")]
    spec = pod_spec_manifest(container_manifest(env=env))

    def create(i: int) -> bool:
        made = kube.create(path("deployments", size.ns), deployment(f"app-{i}", spec))
        notes = made["spec"]["template"]["metadata"].get("annotations") or {}
        return ANN_SOURCES in notes

    with ThreadPoolExecutor(concurrency) as pool:
        stamped = sum(pool.map(create, range(size.consumers)))
    if stamped != size.consumers:
        raise SystemExit(f"{size.ns}: {stamped} of {size.consumers} Deployments stamped")

    def replicasets() -> bool:
        # one item and the count of the rest: the controller-manager's ReplicaSet creates
        # (admitted by configpin where there are no matchConditions) are over before timing
        page = kube.get(path("replicasets", size.ns), limit=1)
        rest = int(page["metadata"].get("remainingItemCount") or 0)
        return len(page.get("items") or ()) + rest >= size.consumers

    wait_for(replicasets, timeout=600, interval=0.5, what=f"the ReplicaSets of {size.ns}")


def _previewed(writer: Writer, size: Size) -> bool:
    """A server-side dry run of a change is previewed with exactly this size's consumers."""
    _, _, warnings = writer.write(size, dry_run=True)
    if not warnings:
        return False
    m = _COUNT.search(warnings[0])
    counted = int(m.group(1)) if m else 0 if "no workload consumes it" in warnings[0] else -1
    size.preview = warnings[0]
    return counted == size.consumers


def _switch(
    api: client.ApiClient, cp: Configpin, variant: str, writer: Writer, sizes: list[Size]
) -> None:
    """Register configpin as the chart does, or no webhook at all; then write until every
    namespace shows it, three writes in a row."""
    if variant == "with":
        register_webhook(api, HOOK, cp.url, cp.ca_pem)
    else:
        unregister_webhook(api, HOOK)
    want = variant == "with"
    for size in sizes:
        streak = [0]

        def seen(size: Size = size, streak: list[int] = streak) -> bool:
            _, answered, _ = writer.write(size)
            streak[0] = streak[0] + 1 if answered == want else 0
            return streak[0] >= 3

        wait_for(seen, timeout=60, interval=0.05, what=f"{size.ns} to see the webhook {variant}")


def _timed(writer: Writer, cp: Configpin, size: Size, variant: str, n: int, warmup: int) -> None:
    for _ in range(warmup):
        writer.write(size)
    before = _handler_metrics(cp) if variant == "with" else None
    lat = []
    for _ in range(n):
        took, answered, _ = writer.write(size)
        lat.append(took)
        if variant == "with" and not answered:
            size.unanswered += 1
    if before is not None:
        buckets, total, calls = _handler_metrics(cp)
        buckets.subtract(before[0])
        size.handler.update(buckets)
        size.handler_sum += total - before[1]
        size.calls += calls - before[2]
    size.lat[variant].extend(lat)
    size.round_p50[variant].append(pct(lat, 0.5))


@contextlib.contextmanager
def _cluster(args: argparse.Namespace) -> Iterator[tuple[client.ApiClient, Kube, Configpin, str]]:
    assets = control_plane_assets(args.version)
    with (
        tempfile.TemporaryDirectory(prefix="configpin-writes-") as tmp,
        running_control_plane(Path(tmp) / "plane", assets) as plane,
        plane.api_client() as api,
    ):
        kube = Kube(api)
        ensure_namespace(api)
        _hold_lease(kube)
        cp = start_configpin(plane, Path(tmp) / "configpin")
        try:
            version = f"{plane.version[0]}.{plane.version[1]} (minor {server_minor(api)})"
            yield api, kube, cp, version
        finally:
            unregister_webhook(api, HOOK)
            cp.stop()


def through_api_server(args: argparse.Namespace) -> None:
    sizes = [Size(n) for n in args.sizes]
    with _cluster(args) as (api, kube, cp, version):
        writer = Writer(kube)
        register_webhook(api, HOOK, cp.url, cp.ca_pem)
        hooks = chart_webhooks(api)
        time.sleep(1.5)  # the API server learns of the configuration through an informer
        start = time.monotonic()
        for size in sizes:
            _populate(kube, size, args.create_concurrency)
        made = time.monotonic() - start
        for size in sizes:
            wait_for(
                functools.partial(_previewed, writer, size),
                timeout=600,
                interval=1.0,
                what=f"configpin's preview of {size.ns} to count {size.consumers} consumers",
            )
        indexed = time.monotonic() - start
        if cp.metric("configpin_leader") != 0:
            raise SystemExit("configpin leads: its controller would roll every consumer")
        order = ["without", "with"]
        for r in range(args.rounds):
            for variant in order if r % 2 == 0 else order[::-1]:
                _switch(api, cp, variant, writer, sizes)
                for size in sizes if r % 2 == 0 else sizes[::-1]:
                    _timed(writer, cp, size, variant, args.per_round, args.warmup)
        conditions = [h["name"] for h in hooks if "matchConditions" in h]
        print(
            f"Through the API server {version}; configpin served from the checkout (pure "
            f"Python), a follower (its controller indexes, rolls nothing); entries registered: "
            f"{', '.join(h['name'] for h in hooks)} (matchConditions: "
            f"{', '.join(conditions) or 'none'}); load average {os.getloadavg()[0]:.2f}"
        )
        print(
            f"  {sum(s.consumers for s in sizes)} Deployments created and stamped, their "
            f"ReplicaSets made in {made:.1f} s; all previewed {indexed:.1f} s after the first"
        )
    _report(args, sizes)


def bucket(cumulative: Counter[float], q: float) -> str:
    """The bucket of a histogram (cumulative counts by upper bound) that holds its `q`
    quantile, in ms: "0.50-1.00", or "> 2500.00"."""
    total = cumulative[float("inf")]
    lower = 0.0
    for edge in sorted(cumulative):
        if cumulative[edge] >= q * total:
            return f"> {ms(lower)}" if edge == float("inf") else f"{ms(lower)}-{ms(edge)}"
        lower = edge
    return "-"


def _report(args: argparse.Namespace, sizes: list[Size]) -> None:
    print(
        f"  merge PATCH of one key, one at a time: {args.rounds} rounds x {args.per_round} "
        "writes per size and variant, alternating; p50/p99 over all rounds (round p50s min-max)"
    )
    print(
        f"  {'consumers':>9} {'variant':>8} {'writes':>6} {'p50 ms':>8} {'p99 ms':>8}  round p50s"
    )
    for size in sizes:
        for variant in ("without", "with"):
            lat, rounds = size.lat[variant], size.round_p50[variant]
            print(
                f"  {size.consumers:>9} {variant:>8} {len(lat):>6} {ms(pct(lat, 0.5)):>8} "
                f"{ms(pct(lat, 0.99)):>8}  {ms(min(rounds))}-{ms(max(rounds))}"
            )
        count = size.handler[float("inf")]
        w, wo = size.lat["with"], size.lat["without"]
        p50w, p50o, p99w, p99o = pct(w, 0.5), pct(wo, 0.5), pct(w, 0.99), pct(wo, 0.99)
        print(
            f"  {size.consumers:>9} with - without: p50 {p50w * 1e3 - p50o * 1e3:+.2f} ms "
            f"(x{p50w / p50o:.2f}), p99 {p99w * 1e3 - p99o * 1e3:+.2f} ms (x{p99w / p99o:.2f}); "
            f"webhook calls per write {size.calls / max(1, len(w)):.2f}"
            + (
                f" ({count - size.calls:+.0f} admissions of other requests)"
                if count != size.calls
                else ""
            )
            + (f"; {size.unanswered} writes NOT answered by configpin" if size.unanswered else "")
        )
        mean = size.handler_sum / max(1, count)
        p50, p99 = bucket(size.handler, 0.5), bucket(size.handler, 0.99)
        print(
            f"  {size.consumers:>9} configpin's handler (its /metrics, {count:.0f} admissions): "
            f"mean {ms(mean)} ms; p50 in {p50} ms, p99 in {p99} ms (its histogram's buckets)"
        )
        print(f"  {'':>9} preview: {size.preview}")


# ---- main ------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--consumers",
        default="1,1000",
        help="sizes: Deployments consuming the ConfigMap written, comma-separated (1,1000)",
    )
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds (5)")
    ap.add_argument(
        "--per-round", type=int, default=100, help="timed writes per size and variant a round (100)"
    )
    ap.add_argument("--warmup", type=int, default=3, help="untimed writes before those (3)")
    ap.add_argument("--create-concurrency", type=int, default=8)
    ap.add_argument(
        "--version", default="1.36.2", help="control plane (KUBEBUILDER_ASSETS wins; 1.36.2)"
    )
    ap.add_argument(
        "--iterations", type=int, default=2000, help="admissions per size, in process (2000)"
    )
    ap.add_argument(
        "--max-seconds", type=float, default=60.0, help="in process: at most this long a size"
    )
    ap.add_argument("--warmup-admissions", type=int, default=50, help=argparse.SUPPRESS)
    ap.add_argument(
        "--profile", type=int, default=0, metavar="N", help="profile N admissions, largest size"
    )
    which = ap.add_mutually_exclusive_group()
    which.add_argument("--in-process-only", action="store_true")
    which.add_argument("--cluster-only", action="store_true")
    ap.add_argument(
        "--quick",
        action="store_true",
        help="validation: --consumers 0,20 --rounds 2 --per-round 10 --iterations 200",
    )
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.quick:
        args.consumers, args.rounds, args.per_round, args.iterations = "0,20", 2, 10, 200
    args.sizes = [int(s) for s in args.consumers.split(",") if s.strip()]
    if args.child:
        in_process(args)
        return
    if not args.cluster_only:
        # In a child started in a folder of its own: `webhook` comes from PYTHONPATH where it
        # is set (the compiled tree), else from this checkout.
        cmd = [
            sys.executable,
            "-m",
            "bench.source_writes",
            "--child",
            "--consumers",
            ",".join(map(str, args.sizes)),
            "--iterations",
            str(args.iterations),
            "--max-seconds",
            str(args.max_seconds),
            "--warmup-admissions",
            str(args.warmup_admissions),
            "--profile",
            str(args.profile),
        ]
        with tempfile.TemporaryDirectory(prefix="configpin-writes-") as tmp:
            done = subprocess.run(cmd, env=child_env(), cwd=tmp, check=False)
        if done.returncode:
            raise SystemExit(done.returncode)
    if not args.in_process_only:
        through_api_server(args)


if __name__ == "__main__":
    main()
