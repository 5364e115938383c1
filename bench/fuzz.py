"""Thousands of mutated AdmissionReviews against `configpin serve`: no internal error, ever.

Reviews of every workload kind, with references of every kind, get one to three fields
replaced by a value of another JSON type (or removed), and are sent over keep-alive HTTPS
connections on 127.0.0.1. Counted: answers by status, admission responses that say
"failed internally", tracebacks in the server's log; `/healthz` is checked at the end.

    .venv/bin/python -m bench.fuzz [--reviews 5000] [--seed 1] [--http ..] [--loop ..]
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import random
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson

from bench.common import Pool, Server, post_mutate

KINDS = {
    "Pod": ("v1", None),
    "Deployment": ("apps/v1", ("spec", "template")),
    "StatefulSet": ("apps/v1", ("spec", "template")),
    "DaemonSet": ("apps/v1", ("spec", "template")),
    "ReplicaSet": ("apps/v1", ("spec", "template")),
    "ReplicationController": ("v1", ("spec", "template")),
    "Job": ("batch/v1", ("spec", "template")),
    "CronJob": ("batch/v1", ("spec", "jobTemplate", "spec", "template")),
}


def pod_spec() -> dict[str, Any]:
    cm = {"name": "app-config", "key": "feature-flags"}
    sec = {"name": "app-secret", "key": "api-token", "optional": True}
    return {
        "containers": [
            {
                "name": "app",
                "image": "registry.example/app:1",
                "env": [
                    {"name": "A", "valueFrom": {"configMapKeyRef": cm}},
                    {"name": "B", "valueFrom": {"secretKeyRef": sec}},
                    {"name": "C", "value": "plain"},
                ],
                "envFrom": [{"configMapRef": {"name": "app-config"}}],
            }
        ],
        "initContainers": [
            {"name": "init", "image": "x", "envFrom": [{"secretRef": {"name": "gone"}}]}
        ],
        "volumes": [
            {
                "name": "a",
                "configMap": {
                    "name": "app-config",
                    "items": [{"key": "app.properties", "path": "p"}],
                },
            },
            {"name": "b", "secret": {"secretName": "app-secret", "optional": False}},
            {
                "name": "c",
                "projected": {
                    "sources": [
                        {"configMap": {"name": "app-config"}},
                        {"secret": {"name": "app-secret"}},
                    ]
                },
            },
        ],
    }


def workload(kind: str) -> dict[str, Any]:
    api, path = KINDS[kind]
    meta = {
        "name": "app",
        "namespace": "default",
        "labels": {"app": "app"},
        "annotations": {"a": "b"},
    }
    obj: dict[str, Any] = {"apiVersion": api, "kind": kind, "metadata": meta}
    if path is None:
        obj["spec"] = pod_spec()
        return obj
    here = obj
    for part in path[:-1]:
        here = here.setdefault(part, {})
    here[path[-1]] = {"metadata": {"labels": {"app": "app"}}, "spec": pod_spec()}
    return obj


def review(kind: str, update: bool, uid: str) -> dict[str, Any]:
    obj = workload(kind)
    group, _, version = KINDS[kind][0].rpartition("/")
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": group, "version": version, "kind": kind},
            "namespace": "default",
            "operation": "UPDATE" if update else "CREATE",
            "object": obj,
            "oldObject": copy.deepcopy(obj) if update else None,
            "dryRun": False,
        },
    }


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    if isinstance(node, dict):
        items: Any = node.items()
    elif isinstance(node, list):
        items = enumerate(node)
    else:
        return out
    for key, child in items:
        out.append((*prefix, key))
        out.extend(_paths(child, (*prefix, key)))
    return out


def _value(rng: random.Random) -> Any:
    return rng.choice(
        [
            None,
            True,
            rng.randint(-(2**40), 2**40),
            rng.random() * 1e6,
            "".join(rng.choice("ab/.-~é\x00") for _ in range(rng.randint(0, 6))),
            [rng.randint(0, 9), "x"],
            {"k": rng.randint(0, 9)},
            {},
            [],
        ]
    )


def mutated(rng: random.Random, uid: str) -> bytes:
    body = review(rng.choice(list(KINDS)), rng.random() < 0.5, uid)
    for _ in range(rng.randint(1, 3)):
        path = rng.choice(_paths(body))
        here: Any = body
        for part in path[:-1]:
            here = here[part]
        if isinstance(here, dict) and rng.random() < 0.2:
            del here[path[-1]]
        else:
            here[path[-1]] = _value(rng)
    return orjson.dumps(body)


async def run(server: Server, args: argparse.Namespace) -> dict[str, int]:
    rng = random.Random(args.seed)
    bodies = [post_mutate(mutated(rng, f"u-{i}")) for i in range(args.reviews)]
    statuses: Counter[str] = Counter()
    pools = [Pool(server) for _ in range(args.concurrency)]
    queue = list(reversed(bodies))

    async def worker(pool: Pool) -> None:
        while queue:
            raw = queue.pop()
            try:
                body = await pool.request(raw)
            except RuntimeError as e:  # a non-200 answer
                statuses[str(e.args[0][9:12], "ascii", "replace")] += 1
                continue
            statuses["200"] += 1
            if b"internally" in body:
                statuses["internal"] += 1
            elif b"malformed request" in body:
                statuses["200 malformed"] += 1

    start = time.monotonic()
    await asyncio.gather(*(worker(p) for p in pools))
    statuses["seconds"] = round(time.monotonic() - start)
    health = server.get("/healthz")
    statuses["healthy_after"] = int(health.startswith(b"HTTP/1.1 200"))
    statuses["tracebacks_in_log"] = server.log.read_text().count("Traceback")
    return dict(statuses)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reviews", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--http")
    parser.add_argument("--loop")
    parser.add_argument("--server-arg", action="append", default=[])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="configpin-fuzz-") as tmp:
        server = Server(Path(tmp), args, args.server_arg)
        try:
            result = asyncio.run(run(server, args))
        finally:
            server.stop()
    print(f"{args.reviews} mutated reviews (seed {args.seed}):")
    for key, value in sorted(result.items()):
        print(f"  {key:20} {value}")
    if (
        result.get("internal", 0)
        or result.get("tracebacks_in_log", 0)
        or not result["healthy_after"]
    ):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
