"""Memory of the source cache: bytes per cached ConfigMap/Secret.

Starts the test control plane (same helpers as the integration tests), fills it with N
ConfigMaps and N Secrets of about 1 KiB each, then, in a fresh process, measures the RSS and
the Python heap (tracemalloc) before and after the cache has listed them all.

    .venv/bin/python bench/cache_memory.py [--objects 20000] [--namespaces 20]

Goal (issue 3): under 300 bytes per cached object.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.integration.controlplane import running_control_plane
from webhook.kube.raw import Kube, path


def fill(kube: Kube, objects: int, namespaces: int) -> float:
    start = time.perf_counter()
    names = [f"bench-{i}" for i in range(namespaces)]
    for ns in names:
        kube.create(
            path("namespaces"), {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
        )
    value = "x" * 1000

    def one(i: int) -> None:
        ns = names[i % namespaces]
        kube.create(
            path("configmaps", ns),
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": f"cm-{i}"},
                "data": {"app.properties": value + str(i)},
            },
        )
        kube.create(
            path("secrets", ns),
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": f"secret-{i}"},
                "data": {"password": base64.b64encode((value + str(i)).encode()).decode()},
            },
        )

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(one, range(objects)))
    return time.perf_counter() - start


MEASURE = r"""
import gc, json, sys, time, tracemalloc, resource
from kubernetes import client, config
from webhook.kube.raw import Kube
from webhook.kube.cache import SourceCache
from webhook.metrics import Metrics

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096

cfg = client.Configuration()
config.load_kube_config(config_file=sys.argv[1], client_configuration=cfg)
kube = Kube(client.ApiClient(cfg))
metrics = Metrics()
gc.collect()
trace = sys.argv[2] == "heap"  # tracemalloc's own bookkeeping inflates RSS: measure apart
if trace:
    tracemalloc.start()
heap0 = tracemalloc.get_traced_memory()[0]
rss0 = rss()
t = time.perf_counter()
cache = SourceCache(kube, b"bench-key-0123456789abcdef0123456789", metrics)
cache.start()
assert cache.wait_synced(600)
sync = time.perf_counter() - t
cache.stop()
gc.collect()
heap1 = tracemalloc.get_traced_memory()[0]
rss1 = rss()
result = {"objects": len(cache), "sync_seconds": sync}
result.update(heap_bytes=heap1 - heap0, rss_bytes=rss1 - rss0)
print(json.dumps(result))
"""


def measure(kubeconfig: Path, what: str) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", MEASURE, str(kubeconfig), what],
        check=True,
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--objects", type=int, default=20000, help="ConfigMaps, and as many Secrets")
    ap.add_argument("--namespaces", type=int, default=20)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, running_control_plane(Path(tmp)) as plane:
        with plane.api_client() as api:
            kube = Kube(api)
            # what the control plane holds by itself (service account tokens etc.)
            base = {w: measure(plane.kubeconfig, w) for w in ("heap", "rss")}
            took = fill(kube, args.objects, args.namespaces)
            print(f"created {2 * args.objects} objects in {took:.0f}s")
            runs = [
                (measure(plane.kubeconfig, "heap"), measure(plane.kubeconfig, "rss"))
                for _ in range(args.runs)
            ]
        heap, rss = [], []
        for h, r in runs:
            n = h["objects"] - base["heap"]["objects"]
            heap.append((h["heap_bytes"] - base["heap"]["heap_bytes"]) / n)
            rss.append((r["rss_bytes"] - base["rss"]["rss_bytes"]) / n)
            print(
                f"objects={h['objects']:.0f} sync={r['sync_seconds']:.1f}s"
                f" heap/object={heap[-1]:.0f}B"
            )
            print(f"    rss/object={rss[-1]:.0f}B")
        heap.sort()
        rss.sort()
        print(
            f"median heap growth per cached object: {heap[len(heap) // 2]:.0f} bytes (goal < 300)"
        )
        print(f"median RSS growth per cached object:  {rss[len(rss) // 2]:.0f} bytes")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
