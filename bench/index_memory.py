"""Memory by part, in process: the Python heap each cached source, indexed workload and
owned ReplicaSet costs once listed through configpin's own handlers, and the transient
heap of a relist (the list pages parsed to keep a few digests of each object).

No cluster: objects shaped as the API server lists them in bench/scale.py (ConfigMaps and
Secrets of two keys; Deployments reading one key of a ConfigMap and one of a Secret,
stamped as admission stamps them, with their managedFields; each one's ReplicaSet, owned by
it) are fed page by page to `SourceCache`'s informer handlers, the controller's
`KindHandler` and, with snapshots allowed, the snapshot adopter's ReplicaSet watch, under
tracemalloc. Load-independent: heap bytes, not time or RSS (bench/scale.py has those).

    .venv/bin/python -m bench.index_memory [--objects 20000] [--baseline REV]
    .venv/bin/python -m bench.index_memory --rss 200000,50000 [--baseline REV]

`--baseline REV` measures REV's tree (`git archive`) the same way, in its own process, and
prints the ratios.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import subprocess
import sys
import tempfile
import tracemalloc
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import orjson

from bench.common import REPO, baseline_tree, child_env

PAGE = 100  # objects per simulated list page (the pages' own heap is the transient part)
NS = "scale-0"


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _managed(fields: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            "manager": "kubectl",
            "operation": "Update",
            "apiVersion": "v1",
            "time": "2026-01-01T00:00:00Z",
            "fieldsType": "FieldsV1",
            "fieldsV1": fields,
        }
    ]


def _meta(name: str, i: int, **more: Any) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": NS,
        "uid": f"00000000-0000-4000-8000-{i:012d}",
        "resourceVersion": str(1000 + i),
        "creationTimestamp": "2026-01-01T00:00:00Z",
        **more,
    }


def configmap(i: int) -> dict[str, Any]:
    return {
        "metadata": _meta(
            f"cm-{i}", i, managedFields=_managed({"f:data": {".": {}, "f:a": {}, "f:b": {}}})
        ),
        "data": {"a": "v" * 100 + str(i), "b": "1"},
    }


def secret(i: int) -> dict[str, Any]:
    return {
        "metadata": _meta(
            f"sec-{i}", i, managedFields=_managed({"f:data": {".": {}, "f:p": {}, "f:q": {}}})
        ),
        "data": {"p": "dnZ2" * 34 + "MA==", "q": "MQ=="},
        "type": "Opaque",
    }


def _template(i: int, labels: dict[str, str]) -> dict[str, Any]:
    sources = {f"configmap/cm-{i}": _digest(f"c{i}"), f"secret/sec-{i}": _digest(f"s{i}")}
    env = [
        {"name": "A", "valueFrom": {"configMapKeyRef": {"name": f"cm-{i}", "key": "a"}}},
        {"name": "P", "valueFrom": {"secretKeyRef": {"name": f"sec-{i}", "key": "p"}}},
    ]
    return {
        "metadata": {
            "labels": labels,
            "annotations": {
                "configpin.io/checksum": _digest(f"k{i}"),
                "configpin.io/sources": json.dumps(sources, separators=(",", ":")),
            },
        },
        "spec": {
            "containers": [
                {
                    "name": "app",
                    "image": "registry.invalid/app:1",
                    "env": env,
                    "resources": {},
                    "terminationMessagePath": "/dev/termination-log",
                    "terminationMessagePolicy": "File",
                    "imagePullPolicy": "IfNotPresent",
                }
            ],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "securityContext": {},
            "schedulerName": "default-scheduler",
        },
    }


_SPEC_FIELDS = {
    "f:spec": {
        "f:replicas": {},
        "f:selector": {},
        "f:template": {
            "f:metadata": {"f:annotations": {".": {}, "f:configpin.io/sources": {}}},
            "f:spec": {"f:containers": {'k:{"name":"app"}': {".": {}, "f:env": {}}}},
        },
    }
}


def deployment(i: int) -> dict[str, Any]:
    labels = {"app": f"d{i}"}
    return {
        "metadata": _meta(f"d{i}", i, generation=1, managedFields=_managed(_SPEC_FIELDS)),
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": labels},
            "template": _template(i, labels),
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "25%"},
            },
            "revisionHistoryLimit": 10,
            "progressDeadlineSeconds": 600,
        },
        "status": {},
    }


def replicaset(i: int) -> dict[str, Any]:
    labels = {"app": f"d{i}", "pod-template-hash": "h"}
    owner = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": f"d{i}",
        "uid": f"00000000-0000-4000-8000-{i:012d}",
        "controller": True,
        "blockOwnerDeletion": True,
    }
    meta = _meta(
        f"d{i}-h",
        i,
        generation=1,
        labels=labels,
        annotations={"deployment.kubernetes.io/revision": "1"},
        ownerReferences=[owner],
        managedFields=_managed(_SPEC_FIELDS),
    )
    return {
        "metadata": meta,
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": labels},
            "template": _template(i, labels),
        },
        "status": {"replicas": 0, "observedGeneration": 1},
    }


def pages(make: Callable[[int], dict[str, Any]], count: int) -> Iterator[dict[str, Any]]:
    """Objects as a list hands them over: each page parsed whole from its JSON."""
    for start in range(0, count, PAGE):
        text = orjson.dumps({"items": [make(i) for i in range(start, min(count, start + PAGE))]})
        page = orjson.loads(text)
        del text
        yield from page["items"]
        del page


def measure(
    feed: Callable[[Iterable[dict[str, Any]]], None], make: Any, count: int
) -> dict[str, float]:
    """Heap kept per object after `feed` consumed `count` objects, and the peak above it."""
    gc.collect()
    tracemalloc.start()
    tracemalloc.reset_peak()
    before = tracemalloc.get_traced_memory()[0]
    feed(pages(make, count))
    gc.collect()
    after, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {"kept": (after - before) / count, "transient": (peak - after) / 2**20}


# What both child scripts build, in the tree measured (a baseline's names where they differ).
SETUP = r"""
import json, sys
from kubernetes import client
from bench.index_memory import configmap, secret, deployment, replicaset, measure, pages
try:  # the controller as it is since the house was set in order (issue 25)
    from webhook.process.config import Settings
    from webhook.controller.rollout import RolloutController
    from webhook.controller.watches import KindHandler
    options = Settings()
except ImportError:  # a baseline from before
    from webhook.controller.rollout import ControllerOptions, RolloutController
    from webhook.controller.rollout import _KindHandler as KindHandler
    options = ControllerOptions()
from webhook.core.model import SourceKind
from webhook.kube.cache import SourceCache
from webhook.kube.namespaces import NamespaceSet
from webhook.kube.raw import Kube
from webhook.process.metrics import Metrics

kube = Kube(client.ApiClient(client.Configuration()))
metrics = Metrics()
hkey = b"bench-key-0123456789abcdef0123456789"
cache = SourceCache(kube, hkey, metrics)
ctl = RolloutController(
    kube, hkey, cache, metrics, options,
    namespaces=NamespaceSet(kube, metrics, label_selector="x"),
)
"""

# Run in the tree measured, with that tree and then the checkout (bench) on PYTHONPATH.
MEASURE = (
    SETUP
    + r"""
count = int(sys.argv[1])
cm, sec = cache.indexes[SourceKind.CONFIGMAP], cache.indexes[SourceKind.SECRET]
out = {
    "ConfigMap (source cache)": measure(cm.relisted, configmap, count),
    "Secret (source cache)": measure(sec.relisted, secret, count),
    "Deployment (workload index)": measure(
        KindHandler(ctl, "Deployment").relisted, deployment, count
    ),
    "ReplicaSet it owns (workload index)": measure(
        KindHandler(ctl, "ReplicaSet").relisted, replicaset, count
    ),
}
assert len(ctl.index) == count
try:
    from webhook.controller.adoption import OwnerWatch, SnapshotAdopter, owner_kinds
    from webhook.kube.copies import SnapshotIndex, SnapshotWriter
    index = SnapshotIndex(metrics, hkey)
    writer = SnapshotWriter(kube, cache, index, hkey, metrics)
    adopter = SnapshotAdopter(writer)
    replicasets = next(k for k in owner_kinds() if k.kind == "ReplicaSet")
except ImportError:
    from webhook.controller.snapshots import OWNER_KINDS, SnapshotAdopter
    from webhook.controller.snapshots import _OwnerWatch as OwnerWatch
    from webhook.kube.snapshots import SnapshotIndex, SnapshotWriter
    index = SnapshotIndex(metrics, hkey)
    writer = SnapshotWriter(kube, cache, index, hkey, metrics)
    adopter = SnapshotAdopter(kube, cache, index, writer, hkey, metrics)
    replicasets = OWNER_KINDS[0]

watch = OwnerWatch(adopter, replicasets)
out["ReplicaSet (adoption watch, snapshots allowed)"] = measure(watch.relisted, replicaset, count)
print(json.dumps(out))
"""
)


# RSS, not heap: no tracemalloc (its own bookkeeping inflates RSS); glibc's malloc_trim after
# each stage, as the informer calls it after every relist.
RSS_MEASURE = (
    SETUP
    + r"""
import ctypes, gc

def rss():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmRSS"))

def settle():
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    return rss()

sources, workloads = int(sys.argv[1]), int(sys.argv[2])
start = settle()
cache.indexes[SourceKind.CONFIGMAP].relisted(pages(configmap, sources // 2))
cache.indexes[SourceKind.SECRET].relisted(pages(secret, sources - sources // 2))
listed = settle()
KindHandler(ctl, "Deployment").relisted(pages(deployment, workloads))
KindHandler(ctl, "ReplicaSet").relisted(pages(replicaset, workloads))
end = settle()
print(json.dumps({"start": start, "source": (listed - start) / sources,
                  "workload": (end - listed) / workloads}))
"""
)


def _child(script: str, tree: Path, *args: int) -> Any:
    out = subprocess.run(
        [sys.executable, "-c", script, *map(str, args)],
        check=True,
        capture_output=True,
        text=True,
        env=child_env(tree),
        cwd=tree,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_rss(tree: Path, sources: int, workloads: int) -> dict[str, float]:
    result: dict[str, float] = _child(RSS_MEASURE, tree, sources, workloads)
    return result


def run(tree: Path, count: int) -> dict[str, dict[str, float]]:
    result: dict[str, dict[str, float]] = _child(MEASURE, tree, count)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--objects", type=int, default=20_000, help="objects of each kind")
    ap.add_argument("--baseline", help="also measure this revision's tree (git archive)")
    ap.add_argument(
        "--rss",
        metavar="SOURCES,WORKLOADS",
        help="RSS instead of heap: that many sources (half ConfigMaps) and workloads (a "
        "Deployment and its ReplicaSet each), no tracemalloc, malloc_trim after each stage",
    )
    args = ap.parse_args()
    trees = {"this tree": REPO}
    with tempfile.TemporaryDirectory() as tmp:
        if args.baseline:
            trees[args.baseline] = baseline_tree(args.baseline, Path(tmp))
        if args.rss:
            sources, workloads = (int(n) for n in args.rss.split(","))
            for name, tree in trees.items():
                r = run_rss(tree, sources, workloads)
                print(
                    f"{name}: RSS at rest {r['start'] / 2**20:.1f} MB; per source "
                    f"{r['source']:.0f} B, per workload {r['workload']:.0f} B "
                    f"({sources} sources, {workloads} workloads, list pages of {PAGE})"
                )
            return
        results = {name: run(tree, args.objects) for name, tree in trees.items()}
    names = list(results)
    print(f"{args.objects} objects of each kind, list pages of {PAGE}, Python heap (tracemalloc)")
    header = "".join(f" {n[:12]:>12} {'peak':>7}" for n in names)
    print(f"{'part':<47}{header}" + ("   ratio" if len(names) > 1 else ""))
    for part in results[names[0]]:
        row = ""
        for n in names:
            r = results[n].get(part)
            row += f" {r['kept']:>10.0f} B {r['transient']:>4.1f}MB" if r else f" {'-':>12} {'':>7}"
        base = results[names[-1]].get(part)
        ratio = ""
        if len(names) > 1 and base and base["kept"] > 1:
            ratio = f"   {results[names[0]][part]['kept'] / base['kept']:.2f}"
        print(f"{part:<47}{row}{ratio}")
    print("kept: heap per object once listed; peak: the heap above that during the list")


if __name__ == "__main__":
    main()
