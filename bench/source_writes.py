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
body. Three more namespaces hold the same ConfigMap, with no consumer:

- **off**: selected by no webhook entry: the API server calls nobody (the baseline);
- **floor-allow**, **floor-patch**: selected by the chart's source-writes entry (same rules,
  object selector and matchConditions) sent to the *floor*, a plain Starlette webhook on
  uvicorn in a process of its own that allows the write, or answers it with a patch of one
  annotation as long as configpin's record: what any webhook costs through this API server.

configpin's source-writes entry is registered once per size (named `c<N>.configpin.io`,
selecting that size's namespace), so that the API server's own metric of each entry's calls
(`apiserver_admission_webhook_admission_duration_seconds`: from its request to the answer
decoded) is one size's. A round writes each namespace once per cycle, in an order drawn anew
each cycle (`--per-round` cycles), so that the machine's moments and the aftermath of the
write before (configpin's watch handling it) fall on every namespace alike. Rounds with the
webhooks registered take turns with rounds with no MutatingWebhookConfiguration at all (the
same writes: they check that `off` is no webhook). Each switch is confirmed by writes before
the timed ones: the answer is seen on the object (`changed-by`, or the floor's annotation,
moves) with the webhooks, never without.

Inside configpin: it is started with bench/_trace on its PYTHONPATH, whose `sitecustomize`
wraps its ASGI app and keeps, for each POST, when the app was called, the body read, the
answer's head and its end handed to the transport (the bench reads them from
`GET /bench-trace`); each timed write is matched to its request by time, so the report splits
each write into configpin's app (of which the handler: body read to head sent) and the rest.
configpin's own `/metrics` give its handler's mean (`configpin_admission_duration_seconds`)
and, with `configpin_admissions_total`, the webhook calls per write (a few writes cost two: the
API server admits a patch again when it retries it inside). `--py-spy FILE` samples
configpin's threads while they hold the GIL (py-spy, `pip install py-spy`) and prints each
thread's share of the time and its stacks. `--baseline REV` also runs REV's configpin (its
`webhook/`, extracted), a follower too, its own namespaces written in the same cycles;
`--experiment LIST` runs this tree's configpin otherwise (its thread switch interval, the
answer's head and body in one write, ...: bench/_trace/sitecustomize.py), beside `--baseline`
(the same revision, as it is); `--gap S` spaces the writes.

configpin runs as a **follower**: a stand-in holds its Lease, so its controller indexes every
workload (as every replica does: each one answers previews) but rolls nothing. Once the
Deployments are made (through it), it is started again, so that it lists them at start as a
replica does in a cluster that has them. Otherwise every
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
consumer either way. It prints p50/p99 per size (wall and CPU time), their ratio to the floor,
and a breakdown of the parts (medians): the parse, the write's facts (`source_write`: the keys'
digests), the rows (`Previewer.rows`) and the warnings (`summary`), and the consumers' order
made again (as on the first write after a workload of the namespace changed). `--profile N`
adds the functions that take the time over N admissions at the largest size (cProfile). This
part runs in a child process in a folder of its own, so `PYTHONPATH=$PWD/build/compiled`
measures the compiled core (only webhook/core is compiled: `Previewer.rows` is
webhook/controller, pure Python in every build). The cluster part serves configpin from the
checkout, pure Python.

    KUBEBUILDER_ASSETS=$(hack/provision-control-plane.sh 1.36.2) \\
        .venv/bin/python -m bench.source_writes --cluster-only [--consumers 1,1000] [--rounds 5]
        [--per-round 200] [--baseline REV] [--py-spy FILE]
    .venv/bin/python -m bench.source_writes --in-process-only [--consumers 1000] [--profile 20]
    .venv/bin/python -m bench.source_writes --quick          # validation: small sizes, seconds

Goal (the issue): p99 < 2 ms per source write at 1,000 consumers.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import bisect
import contextlib
import copy
import cProfile
import datetime
import functools
import os
import pstats
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
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
from starlette.applications import Starlette
from starlette.requests import Request as StarletteRequest
from starlette.responses import Response
from starlette.routing import Route

import webhook.core.plan
from bench.common import (
    REPO,
    baseline_tree,
    child_env,
    control_plane_assets,
    free_port,
    pct,
)
from harness.builders import HKEY, Store, admitted, configmap, container, env_cm, pod_spec
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
from webhook.kube.errors import NotFound
from webhook.kube.lease import format_time
from webhook.kube.raw import MERGE_PATCH, Kube, path
from webhook.process.config import Settings
from webhook.process.metrics import Metrics
from webhook.server.admission import parse_review
from webhook.server.handler import Admitter
from webhook.tls.certgen import generate
from webhook.tls.certs import write_bundle

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
        entry = entry_from_object(admitted(obj, store), "checksum", hkey=HKEY)
        assert isinstance(entry, WorkloadEntry), entry
        index.put(entry)
    cache = StoreCache({NS: store}, frozen=True)
    cut = WaveCut(index, cache, HKEY, Settings(), in_scope=lambda _ns: True)  # type: ignore[arg-type]
    previewer = Previewer(cut, ready=lambda: True)
    sources = FileSources(HKEY, [])
    return Admitter(hkey=HKEY, sources=sources, metrics=Metrics(), preview=previewer)


async def _admissions(
    admitter: Admitter, body: bytes, n: int, budget: float, cpu: list[float] | None = None
) -> list[float]:
    """Seconds of each of up to `n` admissions of `body` (parse, review, dumps), within
    `budget` seconds; each one's CPU seconds (this thread's) into `cpu`."""
    review = admitter.review
    clock, thread = time.perf_counter, time.thread_time
    times: list[float] = []
    deadline = clock() + budget
    for _ in range(n):
        start, started = clock(), thread()
        out = await review(parse_review(body))
        orjson.dumps(out)
        end = clock()
        if cpu is not None:
            cpu.append(thread() - started)
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
    assert isinstance(preview, Previewer)
    lists = preview._lists  # its consumers in wave order, per namespace and source

    def reorder() -> None:
        lists.clear()  # as after a workload of the namespace changed
        preview.consumers(NS, sid)

    return {
        "parse": _median_us(lambda: parse_review(body), n),
        "facts": _median_us(lambda: source_write(HKEY, kind, "UPDATE", old, new), n),
        "rows": _median_us(lambda: preview.rows(NS, sid, write.changed, write.record), n),
        "summary": _median_us(lambda: summary(kind, NS, CM, write.changed, rows), n),
        "order": _median_us(reorder, max(5, n // 10)),
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
        f"{'p50/floor':>9} {'p99/floor':>9} {'CPU p50':>8} {'CPU p99':>8}   parts, medians in "
        "us: parse, facts, rows, summary; the consumers' order, made again on the first write "
        "after a workload of the namespace changed"
    )
    floor: tuple[float, float] | None = None
    admitters = {}
    results: dict[int, tuple[float, float]] = {}
    cpus: dict[int, float] = {}
    for n in sizes:
        admitter = admitters[n] = build_admitter(n)
        _check(admitter, body, n)
        asyncio.run(_admissions(admitter, body, args.warmup_admissions, budget=args.max_seconds))
        cpu: list[float] = []
        times = asyncio.run(
            _admissions(admitter, body, args.iterations, budget=args.max_seconds, cpu=cpu)
        )
        p50, p99 = pct(times, 0.5), pct(times, 0.99)
        results[n] = (p50, p99)
        cpus[n] = pct(cpu, 0.99)
        floor = floor or (p50, p99)
        parts = _breakdown(admitter, body, max(5, min(200, len(times))))
        print(
            f"  {n if n else '0 (floor)':>9} {len(times):>10} {p50 * 1e6:>9.0f} {p99 * 1e6:>9.0f} "
            f"{max(times) * 1e6:>9.0f} {p50 / floor[0]:>9.2f} {p99 / floor[1]:>9.2f} "
            f"{pct(cpu, 0.5) * 1e6:>8.0f} {pct(cpu, 0.99) * 1e6:>8.0f}   "
            + ", ".join(f"{parts[k]:.0f}" for k in ("parse", "facts", "rows", "summary"))
            + f"; {parts['order']:.0f}",
            flush=True,
        )
    largest = max(sizes)
    print(f"  preview at {largest}: {_check(admitters[largest], body, largest)}")
    if GOAL_CONSUMERS in results:
        p99, cpu99 = results[GOAL_CONSUMERS][1], cpus[GOAL_CONSUMERS]
        verdict = "ok" if p99 < GOAL_P99 else "MISSED"
        print(
            f"  goal: p99 < 2 ms per source write at 1,000 consumers: {ms(p99)} ms: {verdict} "
            f"(in CPU time, which the machine's other load does not add to: {ms(cpu99)} ms)"
        )
    if args.profile:
        _profile(admitters[largest], body, args.profile)
    for admitter in admitters.values():
        admitter.close()


# ---- through the API server --------------------------------------------------------------------

FLOOR_HOOK = "configpin-bench-floor"
BASELINE_HOOK = "configpin-bench-baseline"
FLOOR_LABEL = "bench.configpin.io/floor"  # a namespace's value: allow or patch
FLOOR_ANNOTATION = "bench.configpin.io/floor"  # what the floor's patch sets
SIZE_LABEL = "bench.configpin.io/size"  # which of configpin's entries a namespace's writes reach
TRACE = Path(__file__).resolve().parent / "_trace"  # its sitecustomize times configpin's requests
REGISTERED, NONE = "registered", "none"  # the two kinds of rounds
WEBHOOK_SECONDS = "apiserver_admission_webhook_admission_duration_seconds"


@dataclass
class Target:
    """One namespace whose ConfigMap `shared` is written, and who answers its writes in the
    rounds where the webhooks are registered: configpin (`consumers` Deployments read its key
    `a`; each write's answer moves `changed-by`), the floor webhook (`floor`: allow, or patch:
    its annotation moves), or nobody (off: the namespace is selected by no entry)."""

    name: str
    ns: str
    consumers: int = 0
    tree: str = ""  # configpin's: "configpin" (this tree) or "baseline" (--baseline REV)
    floor: str = ""
    hook: str = ""  # the entry that the API server calls for its writes (its metric's label)
    last: str | None = None  # the annotation its answers move, as the last write returned it
    lat: dict[str, list[float]] = field(default_factory=lambda: {REGISTERED: [], NONE: []})
    round_p50: dict[str, list[float]] = field(default_factory=lambda: {REGISTERED: [], NONE: []})
    spans: list[tuple[float, float]] = field(default_factory=list)  # registered writes
    after: list[int] = field(default_factory=list)  # each one's previous write: its consumers
    unanswered: int = 0  # registered writes its webhook's answer did not reach
    preview: str = ""

    @property
    def answered_by(self) -> str | None:
        if self.tree:
            return ANN_CHANGED_BY
        return FLOOR_ANNOTATION if self.floor == "patch" else None


def _targets(sizes: list[int], trees: list[str]) -> list[Target]:
    out = [
        Target(f"{tree}-{n}", f"bench-writes-{tree}-{n}", n, tree, hook=f"c{n}.{tree}.configpin.io")
        for tree in trees
        for n in sizes
    ]
    out.append(Target("floor-allow", "bench-writes-floor-allow", floor="allow"))
    out[-1].hook = "allow.floor.bench.configpin.io"
    out.append(Target("floor-patch", "bench-writes-floor-patch", floor="patch"))
    out[-1].hook = "patch.floor.bench.configpin.io"
    out.append(Target("off", "bench-writes-off"))
    return out


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

    def write(
        self, target: Target, *, dry_run: bool = False
    ) -> tuple[float, float, bool, list[str]]:
        """One merge PATCH, as kubectl patch sends it: (its start and end on the monotonic
        clock, whether the webhook's answer reached the stored object, the warnings)."""
        self.n += 1
        query = {"fieldManager": "kubectl-patch", **({"dryRun": "All"} if dry_run else {})}
        start = time.monotonic()
        resp = self.kube.open(
            "PATCH",
            path("configmaps", target.ns, CM),
            query=query,
            body={"data": {CONSUMED_KEY: f"v{self.n}"}},
            content_type=MERGE_PATCH,
        )
        try:
            data = resp.read()
        finally:
            resp.release_conn()
        end = time.monotonic()
        if resp.status != 200:
            raise SystemExit(f"PATCH {target.ns}/{CM}: {resp.status} {data[:300]!r}")
        answered = False
        if target.answered_by is not None:
            notes = (orjson.loads(data).get("metadata") or {}).get("annotations") or {}
            record = notes.get(target.answered_by)
            answered = record is not None and record != target.last
            if not dry_run:
                target.last = record
        return start, end, answered, _warnings(resp)


# ---- what the processes say about the writes: configpin's /metrics and trace, the API server's


def _configpin_metrics(cp: Configpin) -> tuple[Counter[float], float, float]:
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


def _webhook_seconds(kube: Kube) -> Counter[tuple[str, str]]:
    """The API server's own time per call of each webhook entry (its name): (name, "sum")
    and (name, "count") of apiserver_admission_webhook_admission_duration_seconds, UPDATEs
    admitted. It runs from the API server's request to the webhook to its answer decoded."""
    resp = kube.open("GET", "/metrics")
    try:
        text = resp.read().decode()
    finally:
        resp.release_conn()
    out: Counter[tuple[str, str]] = Counter()
    for family in text_string_to_metric_families(text):
        if family.name != WEBHOOK_SECONDS:
            continue
        for s in family.samples:
            if s.labels.get("operation") != "UPDATE" or s.labels.get("type") != "admit":
                continue
            if s.name.endswith("_sum"):
                out[(s.labels["name"], "sum")] += s.value
            elif s.name.endswith("_count"):
                out[(s.labels["name"], "count")] += s.value
    return out


@dataclass(frozen=True)
class Request:
    """One POST configpin answered, on the monotonic clock (bench/_trace/sitecustomize.py)."""

    path: str
    called: float  # its app called (the head parsed)
    body: float  # the body read whole
    head: float  # the answer's head handed to the transport
    end: float  # its last body part handed to the transport
    cpu: float  # CPU seconds of the event loop's thread from called to end

    @property
    def app(self) -> float:
        return self.end - self.called

    @property
    def handler(self) -> float:
        """Parse, review, encode: from the body read to the answer's head."""
        return self.head - self.body


@dataclass(frozen=True)
class Collection:
    """One run of configpin's cyclic garbage collector (every thread stops meanwhile)."""

    generation: int
    start: float
    seconds: float
    thread: str


def _trace(cp: Configpin) -> tuple[list[Request], list[Collection]]:
    status, text = cp.get("/bench-trace")
    if status != 200:
        raise SystemExit(f"configpin has no /bench-trace ({status}): was it started traced?")
    found = orjson.loads(text)
    return [Request(*r) for r in found["requests"]], [Collection(*c) for c in found["gc"]]


@dataclass
class Seen:
    """What one configpin said about the registered rounds, added up."""

    handler: Counter[float] = field(default_factory=Counter)  # le -> admissions (cumulative)
    handler_sum: float = 0.0
    calls: float = 0.0
    requests: list[Request] = field(default_factory=list)
    collections: list[Collection] = field(default_factory=list)
    seconds: float = 0.0  # the registered rounds' length

    def before(self, cp: Configpin) -> tuple[Counter[float], float, float, float]:
        _trace(cp)  # empties it: only this round's requests are kept
        return (*_configpin_metrics(cp), time.monotonic())

    def after(self, cp: Configpin, before: tuple[Counter[float], float, float, float]) -> None:
        buckets0, sum0, calls0, started = before
        requests, collections = _trace(cp)
        self.requests += requests
        self.collections += [c for c in collections if c.start >= started]
        self.seconds += time.monotonic() - started
        buckets, total, calls = _configpin_metrics(cp)
        buckets.subtract(buckets0)
        self.handler.update(buckets)
        self.handler_sum += total - sum0
        self.calls += calls - calls0


def _mean(webhook: Counter[tuple[str, str]], hook: str) -> float:
    count = webhook[(hook, "count")]
    return webhook[(hook, "sum")] / count if count else 0.0


# ---- the cluster: configpin a follower, its entries and the floor's registered ---------------


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


def _configuration(name: str, hooks: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": hooks,
    }


def _configpin_hooks(
    chart: list[dict[str, Any]], cp: Configpin, tree: str, sizes: list[int]
) -> list[dict[str, Any]]:
    """configpin's entries as the chart renders them for this server (`chart`, as
    register_webhook sent them), sent to `cp`: the source writes' one repeated per size,
    named after it and selecting its namespace only, so that the API server's metric of each
    entry's calls is one size's; the workloads' one for this tree only (the Deployments are
    created through it)."""
    workloads, sources = copy.deepcopy(chart)
    ca = base64.b64encode(cp.ca_pem).decode()

    def to_cp(hook: dict[str, Any]) -> dict[str, Any]:
        """`hook`'s path (its clientConfig's URL as registered) on `cp`."""
        where = urllib.parse.urlsplit(hook["clientConfig"]["url"]).path
        return {"url": cp.url + where, "caBundle": ca}

    hooks = [{**workloads, "clientConfig": to_cp(workloads)}] if tree == "configpin" else []
    for n in sizes:
        hook = copy.deepcopy(sources)
        hook["name"] = f"c{n}.{tree}.configpin.io"
        hook["clientConfig"] = to_cp(sources)
        hook["namespaceSelector"]["matchExpressions"] = [
            *hook["namespaceSelector"].get("matchExpressions", []),
            {"key": SIZE_LABEL, "operator": "In", "values": [f"{tree}-{n}"]},
        ]
        hooks.append(hook)
    return hooks


def _floor_hooks(api: client.ApiClient, url: str, ca: bytes) -> list[dict[str, Any]]:
    """The chart's source-writes entry (rules, objectSelector, matchConditions: the same work
    for the API server before it calls) sent to the floor webhook, one per floor, each
    selecting its own namespace."""
    sources = chart_webhooks(api)[1]
    hooks = []
    for floor in ("allow", "patch"):
        hook = copy.deepcopy(sources)
        hook["name"] = f"{floor}.floor.bench.configpin.io"
        hook["clientConfig"] = {"url": f"{url}/{floor}", "caBundle": base64.b64encode(ca).decode()}
        hook["timeoutSeconds"] = 5
        hook["namespaceSelector"] = {"matchLabels": {FLOOR_LABEL: floor}}
        hooks.append(hook)
    return hooks


def _put(kube: Kube, body: dict[str, Any]) -> None:
    """Create or replace a MutatingWebhookConfiguration."""
    where = path("mutatingwebhookconfigurations")
    name = body["metadata"]["name"]
    try:
        current = kube.get(f"{where}/{name}")
    except NotFound:
        kube.create(where, body)
        return
    body = {**body, "metadata": {**body["metadata"], "resourceVersion": _rv(current)}}
    resp = kube.open("PUT", f"{where}/{name}", body=body)
    try:
        data = resp.read()
    finally:
        resp.release_conn()
    if resp.status != 200:
        raise SystemExit(f"PUT {name}: {resp.status} {data[:300]!r}")


def _rv(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["resourceVersion"])


def _drop(kube: Kube, name: str) -> None:
    with contextlib.suppress(NotFound):
        kube.delete(f"{path('mutatingwebhookconfigurations')}/{name}")


class Floor:
    """The floor webhook: two plain Starlette routes (as configpin's entries are) on
    uvicorn (httptools, uvloop), in a process of its own. Each parses the review for its uid
    and allows it (`/allow`), or answers it with a patch of one annotation of `size` bytes,
    as configpin's record is (`/patch`): what any webhook costs through this API server,
    with no work and nothing else in its process."""

    def __init__(self, folder: Path, size: int) -> None:
        write_bundle(generate("floor", "bench"), folder / "certs")
        self.ca = (folder / "certs" / "ca.crt").read_bytes()
        self.port = free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self.log = folder / "floor.log"
        cmd = [
            sys.executable, "-m", "bench.source_writes", "--floor-server", str(self.port),
            "--floor-certs", str(folder / "certs"), "--floor-size", str(size),
        ]  # fmt: skip
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, cwd=folder, env=child_env()
            )

        def up() -> bool:
            if self.proc.poll() is not None:
                raise SystemExit(f"the floor webhook exited:\n{self.log.read_text()}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port)):
                return True
            return False

        wait_for(up, timeout=30, interval=0.1, what="the floor webhook")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def floor_app(size: int) -> Starlette:
    async def allow(request: StarletteRequest) -> Response:
        review = orjson.loads(await request.body())
        out = {"uid": review["request"]["uid"], "allowed": True}
        return Response(orjson.dumps({**_REVIEW, "response": out}), media_type="application/json")

    async def patch(request: StarletteRequest) -> Response:
        review = orjson.loads(await request.body())
        uid = review["request"]["uid"]
        value = (uid * (size // len(uid) + 1))[:size]
        op = {
            "op": "add",
            "path": "/metadata/annotations/bench.configpin.io~1floor",
            "value": value,
        }
        out = {
            "uid": uid,
            "allowed": True,
            "patchType": "JSONPatch",
            "patch": base64.b64encode(orjson.dumps([op])).decode(),
        }
        return Response(orjson.dumps({**_REVIEW, "response": out}), media_type="application/json")

    return Starlette(
        routes=[Route("/allow", allow, methods=["POST"]), Route("/patch", patch, methods=["POST"])]
    )


_REVIEW = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}


def serve_floor(args: argparse.Namespace) -> None:
    import uvicorn

    uvicorn.run(
        floor_app(args.floor_size),
        host="127.0.0.1",
        port=args.floor_server,
        http="httptools",
        loop="uvloop",
        ssl_certfile=str(args.floor_certs / "tls.crt"),
        ssl_keyfile=str(args.floor_certs / "tls.key"),
        # past the API server's 90 s: it keeps its connections as it does configpin's
        timeout_keep_alive=120,
        log_level="warning",
        access_log=False,
    )


def _namespace(kube: Kube, target: Target) -> None:
    labels = {}
    if target.tree:
        labels = {ENABLED_LABEL: "true", SIZE_LABEL: f"{target.tree}-{target.consumers}"}
    elif target.floor:
        labels = {FLOOR_LABEL: target.floor}
    kube.create(path("namespaces"), {"metadata": {"name": target.ns, "labels": labels}})
    cm = configmap_manifest(CM, _data("v0"))
    cm["metadata"]["annotations"] = {FLOOR_ANNOTATION: "-"}  # the floor's patch replaces it
    kube.create(path("configmaps", target.ns), cm)


def _populate(kube: Kube, target: Target, concurrency: int) -> None:
    """configpin's namespace's Deployments (through configpin's webhook), their ReplicaSets."""
    env = [env_key_ref("configmap", CM, CONSUMED_KEY, "A")]
    spec = pod_spec_manifest(container_manifest(env=env))

    def create(i: int) -> bool:
        made = kube.create(path("deployments", target.ns), deployment(f"app-{i}", spec))
        notes = made["spec"]["template"]["metadata"].get("annotations") or {}
        return ANN_SOURCES in notes

    with ThreadPoolExecutor(concurrency) as pool:
        stamped = sum(pool.map(create, range(target.consumers)))
    if stamped != target.consumers:
        raise SystemExit(f"{target.ns}: {stamped} of {target.consumers} Deployments stamped")

    def replicasets() -> bool:
        # one item and the count of the rest: the controller-manager's ReplicaSet creates
        # (admitted by configpin where there are no matchConditions) are over before timing
        page = kube.get(path("replicasets", target.ns), limit=1)
        rest = int(page["metadata"].get("remainingItemCount") or 0)
        return len(page.get("items") or ()) + rest >= target.consumers

    wait_for(replicasets, timeout=600, interval=0.5, what=f"the ReplicaSets of {target.ns}")


def _previewed(writer: Writer, target: Target) -> bool:
    """A server-side dry run of a change is previewed with exactly this many consumers."""
    _, _, _, warnings = writer.write(target, dry_run=True)
    if not warnings:
        return False
    m = _COUNT.search(warnings[0])
    counted = int(m.group(1)) if m else 0 if "no workload consumes it" in warnings[0] else -1
    target.preview = warnings[0]
    return counted == target.consumers


def _switch(
    kube: Kube, writer: Writer, targets: list[Target], hooks: list[dict[str, Any]], registered: bool
) -> None:
    """configpin's entries and the floor's registered, or no configuration at all; then
    write until every namespace whose answers show shows it, three writes in a row."""
    for body in hooks:
        if registered:
            _put(kube, body)
        else:
            _drop(kube, body["metadata"]["name"])
    for target in targets:
        if target.answered_by is None:
            continue
        streak = [0]

        def seen(target: Target = target, streak: list[int] = streak) -> bool:
            answered = writer.write(target)[2]
            streak[0] = streak[0] + 1 if answered == registered else 0
            return streak[0] >= 3

        what = f"{target.ns} to see the webhooks {'registered' if registered else 'gone'}"
        wait_for(seen, timeout=60, interval=0.05, what=what)


def _round(
    writer: Writer, targets: list[Target], phase: str, cycles: int, gap: float, rng: random.Random
) -> None:
    """`cycles` times, one write to each target, in an order drawn anew each cycle, so that
    the machine's moments and the previous write's aftermath fall on all of them alike."""
    lat: dict[str, list[float]] = {t.name: [] for t in targets}
    order = list(targets)
    before = 0  # the consumers of the namespace written just before
    for _ in range(cycles):
        rng.shuffle(order)
        for target in order:
            start, end, answered, _ = writer.write(target)
            lat[target.name].append(end - start)
            if phase == REGISTERED:
                target.spans.append((start, end))
                target.after.append(before)
                if target.answered_by is not None and not answered:
                    target.unanswered += 1
            before = target.consumers
            if gap:
                time.sleep(gap)
    for target in targets:
        target.lat[phase].extend(lat[target.name])
        target.round_p50[phase].append(pct(lat[target.name], 0.5))


@dataclass
class Tree:
    """A configpin served from a tree: this checkout ("configpin"), or `--baseline REV`'s
    webhook package ("baseline")."""

    name: str
    label: str
    repo: Path
    cp: Configpin | None = None
    seen: Seen = field(default_factory=Seen)

    @property
    def configpin(self) -> Configpin:
        assert self.cp is not None
        return self.cp


@contextlib.contextmanager
def _cluster(
    args: argparse.Namespace, folder: Path, trees: list[Tree]
) -> Iterator[tuple[client.ApiClient, Kube, str, Callable[[], None]]]:
    """The control plane; each tree's configpin a follower, started with the trace
    (bench/_trace); `--experiment` in this tree's (and in no baseline's). The last item
    yielded starts each tree's configpin again (on another port)."""
    assets = control_plane_assets(args.version)
    with (
        running_control_plane(folder / "plane", assets) as plane,
        plane.api_client() as api,
    ):
        kube = Kube(api)
        ensure_namespace(api)
        _hold_lease(kube)
        given = os.environ.get("PYTHONPATH", "")
        traced = {
            "PYTHONPATH": os.pathsep.join(p for p in (str(TRACE), given) if p),
            "CONFIGPIN_BENCH_TRACE": "1",
        }

        def start() -> None:
            for tree in trees:
                if tree.cp is not None:
                    tree.cp.stop()
                env = dict(traced)
                if args.experiment and tree.name == "configpin":
                    env["CONFIGPIN_BENCH_EXPERIMENT"] = args.experiment
                tree.cp = start_configpin(plane, folder / tree.name, env=env, repo=tree.repo)

        try:
            start()
            version = f"{plane.version[0]}.{plane.version[1]} (minor {server_minor(api)})"
            yield api, kube, version, start
        finally:
            for name in (HOOK, BASELINE_HOOK, FLOOR_HOOK):
                unregister_webhook(api, name)
            for tree in trees:
                if tree.cp is not None:
                    tree.cp.stop()


@contextlib.contextmanager
def _py_spy(pid: int, out: Path | None, native: bool) -> Iterator[None]:
    """py-spy sampling configpin's threads while they hold the GIL, if asked (`--py-spy`);
    or, `native`, while they run, with the C frames under the Python ones."""
    if out is None:
        yield
        return
    mode = ["--native"] if native else ["--gil", "--nonblocking"]
    cmd = [
        str(Path(sys.executable).with_name("py-spy")), "record", "--pid", str(pid), "--threads",
        *mode, "--rate", "250", "--format", "raw", "--output", str(out),
    ]  # fmt: skip
    spy = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    started = time.monotonic()
    time.sleep(1.0)
    try:
        yield
    finally:
        spy.send_signal(signal.SIGINT)
        _, err = spy.communicate(timeout=60)
        _spy_summary(out, time.monotonic() - started, 250, err.decode(errors="replace"))


def _spy_summary(raw: Path, seconds: float, rate: int, err: str, top: int = 6) -> None:
    """Per thread: the share of the time it held the GIL; its stacks that held it most."""
    if not raw.exists():
        print(f"  py-spy wrote nothing: {err[-500:]}")
        return
    threads: Counter[str] = Counter()
    stacks: dict[str, Counter[str]] = {}
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        thread = re.sub(r" \(\d+\)|0x[0-9a-f]+", "", frames[0]).strip()
        n = int(count)
        threads[thread] += n
        leaf = "; ".join(_frame(f) for f in frames[1:][-4:])
        stacks.setdefault(thread, Counter())[leaf] += n
    total = seconds * rate
    print(f"  py-spy, {seconds:.0f} s at {rate}/s: the share of the time each thread was seen")
    for thread, n in threads.most_common():
        print(f"    {n / total:7.2%}  {thread}")
        for leaf, k in stacks[thread].most_common(top):
            print(f"        {k / total:7.2%}  {leaf}")


def _frame(frame: str) -> str:
    """A py-spy frame `function (path:line)` without the machine's paths."""
    m = re.match(r"(.*) \((.*):(\d+)\)$", frame)
    return f"{m.group(1)} ({_where(m.group(2))}:{m.group(3)})" if m else frame


def through_api_server(args: argparse.Namespace) -> None:
    rng = random.Random(1)
    webhook: Counter[tuple[str, str]] = Counter()  # the API server's, registered rounds
    with tempfile.TemporaryDirectory(prefix="configpin-writes-") as tmp:
        trees = [Tree("configpin", "this tree", REPO)]
        if args.baseline:
            base = baseline_tree(args.baseline, Path(tmp) / "baseline-tree")
            trees.append(Tree("baseline", f"baseline {args.baseline}", base))
        targets = _targets(args.sizes, [t.name for t in trees])
        pinned = [t for t in targets if t.tree]
        with _cluster(args, Path(tmp), trees) as (api, kube, version, restart):
            writer = Writer(kube)
            this = trees[0].configpin
            chart = register_webhook(api, HOOK, this.url, this.ca_pem)["webhooks"]

            def register() -> list[dict[str, Any]]:
                configs = [
                    _configuration(
                        HOOK if tree.name == "configpin" else BASELINE_HOOK,
                        _configpin_hooks(chart, tree.configpin, tree.name, args.sizes),
                    )
                    for tree in trees
                ]
                for body in configs:
                    _put(kube, body)
                time.sleep(1.5)  # the API server learns of it through an informer
                return configs

            register()
            start = time.monotonic()
            for target in targets:
                _namespace(kube, target)
            for target in pinned:
                _populate(kube, target, args.create_concurrency)
            made = time.monotonic() - start
            # Started again on the cluster as it now is, as a replica starts in a cluster
            # (what it lists at start it keeps in its index; it freezes that once synced).
            restart()
            configs = register()
            for target in pinned:
                wait_for(
                    functools.partial(_previewed, writer, target),
                    timeout=600,
                    interval=1.0,
                    what=f"{target.tree}'s preview of {target.ns} to count {target.consumers}",
                )
            indexed = time.monotonic() - start
            if any(tree.configpin.metric("configpin_leader") != 0 for tree in trees):
                raise SystemExit("configpin leads: its controller would roll every consumer")
            writer.write(pinned[0])
            size = len(pinned[0].last or "")
            floor = Floor(Path(tmp) / "floor", size)
            try:
                configs.append(_configuration(FLOOR_HOOK, _floor_hooks(api, floor.url, floor.ca)))
                spy = Path(args.py_spy).resolve() if args.py_spy else None
                load = [os.getloadavg()[0]]
                with _py_spy(trees[0].configpin.proc.pid, spy, args.py_spy_native):
                    for r in range(args.rounds):
                        for phase in (REGISTERED, NONE) if r % 2 == 0 else (NONE, REGISTERED):
                            _switch(kube, writer, targets, configs, phase == REGISTERED)
                            for _ in range(args.warmup):
                                for target in targets:
                                    writer.write(target)
                            if phase == NONE:
                                _round(writer, targets, phase, args.per_round, args.gap, rng)
                            else:
                                before = [t.seen.before(t.configpin) for t in trees]
                                hooks = _webhook_seconds(kube)
                                _round(writer, targets, phase, args.per_round, args.gap, rng)
                                webhook.update(_webhook_seconds(kube))
                                webhook.subtract(hooks)
                                for tree, then in zip(trees, before, strict=True):
                                    tree.seen.after(tree.configpin, then)
                            load.append(os.getloadavg()[0])
            finally:
                floor.stop()
            conditions = [h["name"] for h in chart if "matchConditions" in h]
            print(
                f"Through the API server {version}; configpin a follower (its controller "
                f"indexes, rolls nothing), pure Python: {', '.join(t.label for t in trees)}; "
                f"the chart's entries {', '.join(h['name'] for h in chart)} (matchConditions: "
                f"{', '.join(conditions) or 'none'}); load average "
                f"{min(load):.2f}-{max(load):.2f}"
                + (f"; this tree runs the experiment {args.experiment}" if args.experiment else "")
            )
            print(
                f"  {sum(t.consumers for t in pinned)} Deployments created and stamped, their "
                f"ReplicaSets made in {made:.1f} s; all previewed {indexed:.1f} s after the "
                f"first; configpin's record {size} bytes, the floor's patch the same"
            )
    _report(args, targets, trees, webhook)


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


def _row(label: str, lat: list[float], rounds: list[float]) -> str:
    return (
        f"  {label:<40} {len(lat):>6} {ms(pct(lat, 0.5)):>7} {ms(pct(lat, 0.9)):>7} "
        f"{ms(pct(lat, 0.99)):>7} {ms(max(lat)):>8}  {ms(min(rounds))}-{ms(max(rounds))}"
    )


def _matched(target: Target, requests: list[Request]) -> list[Request | None]:
    """Each registered write's request to configpin: the one whose app was called within
    the write (None: no such request; a second one in the same write is left out)."""
    called = [r.called for r in requests]
    out: list[Request | None] = []
    for start, end in target.spans:
        i = bisect.bisect_left(called, start)
        out.append(requests[i] if i < len(requests) and called[i] <= end else None)
    return out


def _report(
    args: argparse.Namespace,
    targets: list[Target],
    trees: list[Tree],
    webhook: Counter[tuple[str, str]],
) -> None:
    by = {t.name: t for t in targets}
    off = by["off"]
    print(
        f"  merge PATCH of one key, one at a time{f', {args.gap} s apart' if args.gap else ''}: "
        f"{args.rounds} rounds with the webhooks registered, each beside one with no "
        f"configuration at all; each round {args.per_round} cycles of one write to each "
        "namespace, in a random order. ms over all rounds (round p50s min-max):"
    )
    print(
        f"  {'namespace written: answered by':<40} {'writes':>6} {'p50':>7} {'p90':>7} "
        f"{'p99':>7} {'max':>8}  round p50s"
    )
    labels = {t.name: t.label for t in trees}
    for t in targets:
        who = {
            "off": "nobody (no entry selects it)",
            "floor-allow": "the floor, allowed",
            "floor-patch": "the floor, patched",
        }.get(t.name, f"{labels.get(t.tree, '')}, {t.consumers} consumers")
        print(_row(f"{t.name}: {who}", t.lat[REGISTERED], t.round_p50[REGISTERED]))
    lat = [x for t in targets for x in t.lat[NONE]]
    rounds = [x for t in targets for x in t.round_p50[NONE]]
    print(_row("every namespace, no configuration", lat, rounds))
    base = off.lat[REGISTERED]
    print("  against 'off' in the same cycles (added ms, and x):")
    for t in targets:
        if t is off:
            continue
        w = t.lat[REGISTERED]
        print(
            f"  {t.name:<22} p50 {_added(w, base, 0.5)}, p90 {_added(w, base, 0.9)}, "
            f"p99 {_added(w, base, 0.99)}, max {ms(max(w) - max(base))}"
            + (f"; {t.unanswered} writes NOT answered" if t.unanswered else "")
        )
    if len(trees) > 1:
        print("  this tree against the baseline in the same cycles (added ms, and x):")
        for n in args.sizes:
            w, b = by[f"configpin-{n}"].lat[REGISTERED], by[f"baseline-{n}"].lat[REGISTERED]
            print(
                f"  {n:>5} consumers          p50 {_added(w, b, 0.5)}, p90 {_added(w, b, 0.9)}, "
                f"p99 {_added(w, b, 0.99)}, max {ms(max(w) - max(b))}"
            )
    print(
        "  per write, ms p50 / p99 / max: configpin's app (called to answer sent; its CPU: the "
        "event loop thread's), of which the handler (body read to head sent); the API server's "
        "call of the entry (its metric: mean); the rest of the write (write - app)"
    )
    for t in targets:
        if t.floor:
            print(f"  {t.name:<22} API server's call {ms(_mean(webhook, t.hook))}")
    most = max(args.sizes)
    for t in targets:
        if not t.tree and most:
            _after_many(t, [None] * len(t.spans), most, lead=f"  {t.name:<22} ")
    for tree in trees:
        seen = tree.seen
        requests = sorted(seen.requests, key=lambda r: r.called)
        count = seen.handler[float("inf")]
        writes = sum(len(t.spans) for t in targets if t.tree == tree.name)
        print(
            f"  {tree.label}: {seen.calls / max(1, writes):.3f} webhook calls per write; its "
            f"handler (its /metrics, {count:.0f} admissions): mean "
            f"{ms(seen.handler_sum / max(1, count))} ms, p99 in {bucket(seen.handler, 0.99)} ms "
            "(its histogram's buckets)"
        )
        _collections(seen)
        for t in targets:
            if t.tree != tree.name:
                continue
            matched = _matched(t, requests)
            spans = list(zip(matched, t.spans, strict=True))
            found = [(r, e - s, s, e) for r, (s, e) in spans if r]
            if not found:
                print(f"  {t.name:<22} no request of its writes in the trace")
                continue
            apps = [f[0].app for f in found]
            handlers = [f[0].handler for f in found]
            cpus = [f[0].cpu for f in found]
            rest = [f[1] - f[0].app for f in found]
            print(
                f"  {t.name:<22} app {_three(apps)} (its CPU {_three(cpus)}); handler "
                f"{_three(handlers)}; API server's call {ms(_mean(webhook, t.hook))}; rest "
                f"{_three(rest)}"
                + (
                    f"; {len(matched) - len(found)} writes with no request"
                    if len(found) < len(matched)
                    else ""
                )
            )
            if max(args.sizes):
                _after_many(t, matched, max(args.sizes))
            slow = sorted(found, key=lambda f: f[1])[-max(1, len(found) // 100) :]
            collected = sum(_overlaps(s, e, seen.collections) for _, _, s, e in found)
            slow_collected = sum(_overlaps(s, e, seen.collections) for _, _, s, e in slow)
            print(
                f"  {'':<22} writes during a garbage collection: {collected} of {len(found)}; "
                f"of its slowest 1%: {slow_collected}"
            )
            print(
                f"  {'':<22} its slowest 1% ({len(slow)} writes, from {ms(slow[0][1])} ms): "
                f"write {ms(statistics.median(f[1] for f in slow))}, app "
                f"{ms(statistics.median(f[0].app for f in slow))} (its CPU "
                f"{ms(statistics.median(f[0].cpu for f in slow))}), handler "
                f"{ms(statistics.median(f[0].handler for f in slow))}, rest "
                f"{ms(statistics.median(f[1] - f[0].app for f in slow))} (medians)"
            )
            print(f"  {'':<22} preview: {t.preview}")


def _after_many(t: Target, matched: list[Request | None], most: int, lead: str = " " * 25) -> None:
    """Its writes split by the one before: to a namespace of `most` consumers (configpin's
    watch hands its listener that write's change, with all its consumers, as this write
    arrives) or not."""
    parts = []
    for label, pick in ((f"after a write to {most} consumers", True), ("after another", False)):
        chosen = [
            (e - s, r.app if r else 0.0)
            for (s, e), r, a in zip(t.spans, matched, t.after, strict=True)
            if (a == most) is pick
        ]
        if chosen:
            lat, app = [c[0] for c in chosen], [c[1] for c in chosen]
            parts.append(
                f"{label} ({len(chosen)}): write {ms(pct(lat, 0.5))} / {ms(pct(lat, 0.99))}"
                + (f", app {ms(pct(app, 0.5))} / {ms(pct(app, 0.99))}" if t.tree else "")
            )
    print(f"{lead}p50 / p99 {'; '.join(parts)}")


def _collections(seen: Seen) -> None:
    """Its garbage collector's runs in the registered rounds, by generation."""
    by: dict[int, list[float]] = {}
    for c in seen.collections:
        by.setdefault(c.generation, []).append(c.seconds)
    threads = Counter(c.thread for c in seen.collections if c.generation == 2)
    parts = [
        f"gen {g}: {len(v)} runs, {ms(sum(v))} ms in all, max {ms(max(v))} ms"
        for g, v in sorted(by.items())
    ]
    print(
        f"    garbage collections in {seen.seconds:.0f} s: {'; '.join(parts) or 'none'}"
        + (f" (gen 2 in {', '.join(f'{t} {n}' for t, n in threads.items())})" if threads else "")
    )


def _overlaps(start: float, end: float, collections: list[Collection]) -> bool:
    return any(c.start < end and c.start + c.seconds > start for c in collections)


def _added(w: list[float], base: list[float], q: float) -> str:
    a, b = pct(w, q), pct(base, q)
    return f"{(a - b) * 1e3:+.2f} (x{a / b:.2f})"


def _three(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{ms(pct(values, 0.5))} / {ms(pct(values, 0.99))} / {ms(max(values))}"


# ---- main ------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--consumers",
        default="1,1000",
        help="sizes: Deployments consuming the ConfigMap written, comma-separated (1,1000)",
    )
    ap.add_argument(
        "--rounds",
        type=int,
        default=5,
        help="rounds with the webhooks registered, each beside one with none, in turn (5)",
    )
    ap.add_argument(
        "--per-round",
        type=int,
        default=200,
        help="cycles a round, each one timed write to each namespace (200)",
    )
    ap.add_argument("--warmup", type=int, default=3, help="untimed cycles before those (3)")
    ap.add_argument(
        "--gap", type=float, default=0.0, help="seconds between two writes (0: back to back)"
    )
    ap.add_argument(
        "--experiment",
        default="",
        metavar="LIST",
        help="this tree's configpin runs so (bench/_trace/sitecustomize.py: switch=SECONDS, "
        "cork, follower, noproxy; comma-separated), a baseline as it is",
    )
    ap.add_argument(
        "--py-spy-native",
        action="store_true",
        help="with --py-spy: sample while a thread runs, with its C frames, not the GIL",
    )
    ap.add_argument(
        "--baseline",
        metavar="REV",
        help="through the API server, also REV's configpin, its writes in the same cycles",
    )
    ap.add_argument(
        "--py-spy",
        default="",
        metavar="FILE",
        help="sample configpin's threads holding the GIL with py-spy (pip install py-spy) "
        "into FILE, and print what held it",
    )
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
        help="validation: --consumers 0,20 --rounds 1 --per-round 10 --iterations 200",
    )
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--floor-server", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--floor-certs", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--floor-size", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.floor_server:
        serve_floor(args)
        return
    if args.quick:
        args.consumers, args.rounds, args.per_round, args.iterations = "0,20", 1, 10, 200
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
