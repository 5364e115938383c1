"""Memory of the source cache: bytes per cached ConfigMap/Secret.

Starts the test control plane (same helpers as the integration tests), fills it with N
ConfigMaps and N Secrets of about 1 KiB each, then, in a fresh process, measures the RSS and
the Python heap (tracemalloc) before and after the cache has listed them all.

    .venv/bin/python -m bench.cache_memory [--objects 20000] [--namespaces 20] [--pages 100,256k]

`--pages` compares list pages: a plain number is a fixed count of objects per page, a size
(`64k`, `1m`) a page bounded by bytes of JSON (what ships: `webhook.kube.informer.PAGE_BYTES`).

Goal (issue 3): under 300 bytes per cached object.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.common import REPO
from harness.controlplane import running_control_plane
from webhook.kube.informer import FIRST_PAGE
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
from webhook.process.metrics import Metrics

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
count, size = int(sys.argv[3]), int(sys.argv[4])
for informer in cache.informers.values():
    informer.page_size, informer.page_bytes = count, size
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


def measure(kubeconfig: Path, what: str, pages: str = "100") -> dict[str, float]:
    count, size = page_setting(pages)
    out = subprocess.run(
        [sys.executable, "-c", MEASURE, str(kubeconfig), what, str(count), str(size)],
        check=True,
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def page_setting(text: str) -> tuple[int, int]:
    """(first page's count, bytes per page or 0) of `100` or `256k`."""
    text = text.strip().lower()
    scale = {"k": 1024, "m": 1024 * 1024}.get(text[-1:])
    if scale is None:
        return int(text), 0
    return FIRST_PAGE, int(float(text[:-1]) * scale)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--objects", type=int, default=20000, help="ConfigMaps, and as many Secrets")
    ap.add_argument("--namespaces", type=int, default=20)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument(
        "--pages", default="256k", help="page settings to compare, e.g. 100,500,64k,256k,1m"
    )
    args = ap.parse_args()
    settings = args.pages.split(",")
    with (
        tempfile.TemporaryDirectory() as tmp,
        running_control_plane(Path(tmp)) as plane,
        plane.api_client() as api,
    ):
        kube = Kube(api)
        # what the control plane holds by itself (service account tokens etc.)
        base = {w: measure(plane.kubeconfig, w) for w in ("heap", "rss")}
        took = fill(kube, args.objects, args.namespaces)
        print(f"created {2 * args.objects} objects in {took:.0f}s")
        runs: dict[str, list[tuple[dict[str, float], dict[str, float]]]] = {
            pages: [] for pages in settings
        }
        for _ in range(args.runs):  # interleaved, so that the machine's load is shared
            for pages in settings:
                h = measure(plane.kubeconfig, "heap", pages)
                r = measure(plane.kubeconfig, "rss", pages)
                runs[pages].append((h, r))
                print(
                    f"pages {pages}: objects={h['objects']:.0f} sync={r['sync_seconds']:.1f}s",
                    flush=True,
                )
    print(f"{'pages':>8} {'heap/object':>12} {'RSS/object':>11} {'first sync':>11}  (medians)")
    for pages, rows in runs.items():
        heap, rss, sync = [], [], []
        for h, r in rows:
            n = h["objects"] - base["heap"]["objects"]
            heap.append((h["heap_bytes"] - base["heap"]["heap_bytes"]) / n)
            rss.append((r["rss_bytes"] - base["rss"]["rss_bytes"]) / n)
            sync.append(r["sync_seconds"])
        print(
            f"{pages:>8} {statistics.median(heap):>10.0f} B {statistics.median(rss):>9.0f} B "
            f"{statistics.median(sync):>10.1f}s"
        )
    print("goal: heap < 300 B per cached object")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
