"""Admission in snapshot mode: latency and API calls when the copies exist vs must be made.

Starts the test control plane (same helpers as the integration tests) and, in this process,
the cluster side of configpin: the source cache, the snapshot index and writer, and the
`Admitter` that `configpin serve` answers with. Each admission is one Deployment in snapshot
mode referencing `--sources` ConfigMaps; it is timed inside the admitter (AdmissionReview in,
AdmissionReview out, copies made before the answer), and the API requests it made are
counted (`Kube.calls`).

- exists: the copies were made before; the writer answers from the cache.
- created: before each admission one ConfigMap is changed (and the cache has seen the
  change), so that admission must make one new copy: read the source, check its digest,
  create the copy.

    .venv/bin/python -m bench.snapshot [--admissions 200] [--sources 3]

Loopback only; bounded (about half a minute with the defaults, control plane start included).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.common import deployment_review
from harness.controlplane import running_control_plane
from webhook.core.constants import LABEL_SNAPSHOT
from webhook.core.model import SourceId, SourceKind
from webhook.inputs.sources import Miss
from webhook.kube.cache import SourceCache
from webhook.kube.copies import SnapshotIndex, SnapshotWriter
from webhook.kube.raw import MERGE_PATCH, Kube, path
from webhook.process.config import Settings
from webhook.process.metrics import Metrics
from webhook.server.admission import parse_review
from webhook.server.handler import Admitter

NAMESPACE = "bench-snapshot"
HKEY = b"bench-snapshot-digest-key-0123456789"


def deployment(sources: int) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": "web",
            "namespace": NAMESPACE,
            "annotations": {"configpin.io/mode": "snapshot"},
        },
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {
                    "containers": [
                        {
                            "name": "app",
                            "image": "registry.invalid/app:1",
                            "envFrom": [
                                {"configMapRef": {"name": f"config-{i}"}} for i in range(sources)
                            ],
                        }
                    ]
                },
            },
        },
    }


def review_body(obj: dict[str, Any]) -> bytes:
    return deployment_review(obj, str(uuid.uuid4()), namespace=NAMESPACE, name="web")


def configmap(i: int, version: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": f"config-{i}"},
        "data": {
            "app.properties": "\n".join(f"key.{j}=value-{version}-{j}" for j in range(40)),
            "log.level": "info",
        },
    }


def wait_until(predicate: Any, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.002)


def summary(name: str, seconds: list[float], calls: list[int]) -> str:
    ms = sorted(s * 1000 for s in seconds)
    p90 = ms[int(0.9 * (len(ms) - 1))]
    return (
        f"{name:8s} n={len(ms):4d}  median {statistics.median(ms):7.3f} ms  p90 {p90:7.3f} ms"
        f"  API calls/admission: median {statistics.median(calls):g}, max {max(calls)}"
    )


def run(admissions: int, sources: int) -> None:
    logging.getLogger("webhook").setLevel(logging.ERROR)  # watches end with the control plane
    with (
        tempfile.TemporaryDirectory(prefix="configpin-bench-") as tmp,
        running_control_plane(Path(tmp)) as plane,
        plane.api_client() as api,
    ):
        kube = Kube(api)
        kube.create(
            path("namespaces"),
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        )
        for i in range(sources):
            kube.create(path("configmaps", NAMESPACE), configmap(i, 0))
        metrics = Metrics()
        cache = SourceCache(kube, HKEY, metrics)
        index = SnapshotIndex(metrics, HKEY)
        index.attach(cache)
        writer = SnapshotWriter(kube, cache, index, HKEY, metrics)
        admitter = Admitter(
            hkey=HKEY,
            sources=cache,
            metrics=metrics,
            settings=Settings(mode="checksum"),
            snapshots=writer,
        )
        cache.start()
        wait_until(lambda: cache.wait_synced(30), "the cache")
        obj = deployment(sources)
        loop = asyncio.new_event_loop()

        def admit() -> tuple[float, int, dict[str, Any]]:
            review = parse_review(review_body(obj))
            calls = kube.calls
            start = time.perf_counter()
            out = loop.run_until_complete(admitter.review(review))
            elapsed = time.perf_counter() - start
            response = dict(out["response"])
            assert response["allowed"] and "patch" in response, response
            assert not response.get("warnings"), response.get("warnings")
            return elapsed, kube.calls - calls, response

        def copies_seen() -> bool:
            return len(index) >= expected

        # Warm up: the first admission makes every copy.
        expected = sources
        admit()
        wait_until(copies_seen, "the copies in the index")

        exists: tuple[list[float], list[int]] = ([], [])
        for _ in range(admissions):
            t, c, _ = admit()
            exists[0].append(t)
            exists[1].append(c)

        created: tuple[list[float], list[int]] = ([], [])
        sid = SourceId(SourceKind.CONFIGMAP, "config-0")
        for version in range(1, admissions + 1):
            before = cache.peek(NAMESPACE, sid)
            kube.patch(
                path("configmaps", NAMESPACE, "config-0"),
                {"data": configmap(0, version)["data"]},
                MERGE_PATCH,
            )
            wait_until(
                lambda b=before: (
                    not isinstance(now := cache.peek(NAMESPACE, sid), Miss) and now != b
                ),
                "the change in the cache",
            )
            t, c, _ = admit()
            created[0].append(t)
            created[1].append(c)
        made = kube.get(path("configmaps", NAMESPACE), labelSelector=f"{LABEL_SNAPSHOT}=true")
        assert len(made["items"]) == sources + admissions, len(made["items"])
        cache.stop()
        loop.close()

    print(f"snapshot-mode admission of a Deployment referencing {sources} ConfigMaps")
    print(summary("exists", *exists))
    print(summary("created", *created) + "  (one new copy each)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--admissions", type=int, default=200)
    parser.add_argument("--sources", type=int, default=3)
    args = parser.parse_args()
    run(max(1, min(args.admissions, 2000)), max(1, min(args.sources, 20)))


if __name__ == "__main__":
    main()
