"""Heavy reviews beside normal ones: does a maximum-size review stall everyone else?

Starts `configpin serve` (no cluster: the embedded default sources) and, over 127.0.0.1:

- alone:  normal admissions (a Deployment with 2 references) at `--rate` per second, and
          `/healthz` every 100 ms, for `--seconds`: latency p50 / p99 / max, counted from the
          scheduled start (queueing included);
- heavy:  the same, while `--heavy` clients each send maximum-size reviews back to back: an
          UPDATE of a Deployment of ~3 MiB (tens of thousands of references, the API server's
          request limit) with its ~3 MiB old object, about 6 MiB per body.

    .venv/bin/python -m bench.heavy [--runs 3] [--heavy 4] [--seconds 10] [--http ..] [--loop ..]

At the end it reads the RSS of the server, of its large-review worker (started by the first
heavy review) and of multiprocessing's resource tracker beside it.

The goal (issue 17): normal admissions keep p99 <= 100 ms and their worst wait <= 250 ms
while four maximum-size reviews are in flight; /healthz never waits on admissions.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import ssl
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from bench.common import (
    Pool,
    Server,
    deployment_review,
    exchange,
    post_mutate,
    process_tree,
    rss_kib,
)


def deployment(refs: int, name: str = "app") -> dict[str, Any]:
    env = []
    for i in range(refs):
        ref = (
            {"configMapKeyRef": {"name": "app-config", "key": "feature-flags"}}
            if i % 2
            else {"secretKeyRef": {"name": "app-secret", "key": "api-token"}}
        )
        env.append({"name": f"VAR_{i:06d}", "valueFrom": ref})
    containers = [
        {"name": f"c{c}", "image": "registry.example/app:1.0", "env": env[c::8]} for c in range(8)
    ]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": name}},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": containers}},
        },
    }


def heavy_review(target: int = 3 * 1024 * 1024) -> tuple[bytes, int]:
    per_ref = len(orjson.dumps(deployment(1000))) / 1000
    refs = int(target / per_ref)
    obj = deployment(refs)
    return deployment_review(obj, "heavy", namespace="default", old=obj), refs


async def open_loop(pool: Pool, raw: bytes, rate: float, seconds: float) -> list[float]:
    latencies: list[float] = []
    start = time.monotonic()
    tasks = []

    async def one(scheduled: float) -> None:
        await pool.request(raw)
        latencies.append(time.monotonic() - scheduled)

    n = int(rate * seconds)
    for i in range(n):
        scheduled = start + i / rate
        delay = scheduled - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(scheduled)))
    await asyncio.gather(*tasks)
    return latencies


def _heavy_client(port: int, heavy: bytes, seconds: float, answered: Any) -> None:
    async def run() -> list[float]:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx)
        raw = post_mutate(heavy)
        times = []
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            t0 = time.monotonic()
            body = await exchange(reader, writer, raw)
            assert b'"allowed":true' in body, body[:200]
            times.append(time.monotonic() - t0)
        writer.close()
        return times

    answered.put(asyncio.run(run()))


def _stats(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "p50_ms": 1000 * ordered[len(ordered) // 2],
        "p99_ms": 1000 * ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))],
        "max_ms": 1000 * ordered[-1],
    }


async def one_run(server: Server, args: argparse.Namespace, heavy: bytes) -> dict[str, float]:
    normal = post_mutate(deployment_review(deployment(2, "small"), "normal", namespace="default"))
    health = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    out: dict[str, float] = {}
    for phase in ("alone", "heavy"):
        stop = asyncio.Event()
        heavy_times: list[float] = []

        clients: list[multiprocessing.Process] = []
        answered = multiprocessing.Queue() if phase == "heavy" else None
        if phase == "heavy":
            # In processes of their own: encrypting 6 MiB bodies must not slow down the
            # process that measures the normal admissions' latency.
            clients = [
                multiprocessing.Process(
                    target=_heavy_client, args=(server.port, heavy, args.seconds + 1.0, answered)
                )
                for _ in range(args.heavy)
            ]
            for c in clients:
                c.start()
            await asyncio.sleep(1.0)  # all of them under way
        normals, healths = await asyncio.gather(
            open_loop(
                Pool(server),
                post_mutate(deployment_review(deployment(2, "small"), "n", namespace="default")),
                args.rate,
                args.seconds,
            ),
            open_loop(Pool(server), health, 10.0, args.seconds),
        )
        stop.set()
        for c in clients:
            await asyncio.to_thread(c.join, 60)
        if answered is not None:
            for _ in clients:
                heavy_times.extend(answered.get(timeout=10))
        for k, v in _stats(normals).items():
            out[f"{phase}.normal_{k}"] = v
        for k, v in _stats(healths).items():
            out[f"{phase}.healthz_{k}"] = v
        if heavy_times:
            out[f"{phase}.heavy_answered"] = len(heavy_times)
            out[f"{phase}.heavy_median_s"] = statistics.median(heavy_times)
            out[f"{phase}.heavy_max_s"] = max(heavy_times)
        print(
            f"  {phase}: "
            + ", ".join(
                f"{k.split('.')[1]}={v:.1f}" for k, v in out.items() if k.startswith(phase)
            ),
            flush=True,
        )
    del normal
    out["rss_after_mib"] = server.rss() / 1024
    for role, kib in _rss_by_role(server.proc.pid).items():
        out[f"rss_{role}_mib"] = kib / 1024
    return out


def _rss_by_role(pid: int) -> dict[str, int]:
    """KiB of RSS of the server, its large-review worker and multiprocessing's resource
    tracker (the worker's companion), told apart by their command lines."""
    out = {"server": rss_kib(pid), "worker": 0, "tracker": 0}
    for child in list(process_tree(pid))[1:]:
        try:
            argv = Path(f"/proc/{child}/cmdline").read_bytes()
            kib = rss_kib(child)
        except (OSError, RuntimeError):
            continue
        out["tracker" if b"resource_tracker" in argv else "worker"] += kib
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--heavy", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=50.0, help="normal admissions per second")
    parser.add_argument("--http")
    parser.add_argument("--loop")
    parser.add_argument("--server-arg", action="append", default=[])
    args = parser.parse_args()
    heavy, refs = heavy_review()
    print(f"heavy review: {len(heavy) / 2**20:.1f} MiB, {refs} references in its object (UPDATE)")
    results = []
    with tempfile.TemporaryDirectory(prefix="configpin-heavy-") as tmp:
        for run in range(args.runs):
            print(f"run {run + 1}/{args.runs}", flush=True)
            server = Server(Path(tmp), args, args.server_arg)
            try:
                results.append(asyncio.run(one_run(server, args, heavy)))
            finally:
                server.stop()
    print(f"\nmedians over {len(results)} run(s):")
    for key in results[0]:
        values = [r[key] for r in results]
        print(
            f"  {key:28} {statistics.median(values):10.1f}   runs: {[round(v, 1) for v in values]}"
        )


if __name__ == "__main__":
    main()
