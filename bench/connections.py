"""Hostile and heavy connections against `configpin serve`: memory per connection, timeouts.

Starts `configpin serve` (no cluster: the embedded default sources, dev certificates in a
temporary folder) in a subprocess, then, from this process, over 127.0.0.1 only:

- idle:   `--idle` TLS connections that complete the handshake and send nothing. RSS per
          connection (the server's RSS with them open, minus before, over their number), and
          how many the server closes within 30 s (and when the last one went).
- drip:   `--drip` connections that send a request one byte a second: a third drips the
          request line and headers, a third sends the headers and drips the body, a third
          sends nothing after the handshake. How many the server closes within 30 s.
- burst:  `--burst` connections opened at once, each answered one `/healthz`, then closed by
          this side. RSS before, at the peak, and `--settle` seconds after they closed.
- edges:  a 200 KB header, a gzip Content-Encoding, a body cut off mid-way; the server
          must answer each (431, 415, a logged disconnect) and still be healthy.

    .venv/bin/python -m bench.connections [--runs 3] [--http h11|httptools] [--loop asyncio|uvloop]
    .venv/bin/python -m bench.connections --server granian    # configpin's app on granian

`--server granian` (granian installed: `pip install granian`, not a dependency) serves
configpin's own app (`create_app`, as `bench.admission`'s granian-configpin) from granian
with its own TLS and uvloop, its header-read timeout set to configpin's (5 s): what the stack
would give configpin at the connection level. Its RSS is that of granian's main process and
its worker together.

Medians over `--runs` fresh servers. Bounded: about 2 minutes per run with the defaults.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ssl
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import Server, open_connection, write_server_files


async def _open_many(server: Server, n: int) -> list[Any]:
    sem = asyncio.Semaphore(32)

    async def one() -> Any:
        async with sem:
            return await open_connection(server)

    return await asyncio.gather(*(one() for _ in range(n)))


async def _closed_by_server(reader: asyncio.StreamReader, start: float, limit: float) -> float:
    """Seconds until the server closed this connection (inf if not within `limit`)."""
    try:
        async with asyncio.timeout(limit):
            while await reader.read(65536):
                pass
    except TimeoutError:
        return float("inf")
    except (ConnectionError, ssl.SSLError):
        pass
    return time.monotonic() - start


async def phase_idle(server: Server, n: int, limit: float) -> dict[str, float]:
    await asyncio.sleep(1.0)
    before = server.rss()
    start = time.monotonic()
    conns = await _open_many(server, n)
    opened = time.monotonic() - start
    await asyncio.sleep(0.3)
    during = server.rss()
    times = await asyncio.gather(*(_closed_by_server(r, start, limit) for r, _ in conns))
    for _, w in conns:
        w.close()
    closed = [t for t in times if t <= 30.0]
    return {
        "kib_per_conn": (during - before) / n,
        "closed_30s": len(closed),
        "last_close_s": max(closed) if closed else float("inf"),
        "open_s": opened,
    }


async def _drip(server: Server, kind: str, start: float, limit: float) -> float:
    reader, writer = await open_connection(server)
    body = b'{"kind":"AdmissionReview"}' * 40
    head = (
        b"POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n"
    )
    if kind == "body":
        writer.write(head)
        slow = body
    elif kind == "headers":
        slow = head
    else:
        slow = b""

    async def drip() -> None:
        with contextlib.suppress(ConnectionError, ssl.SSLError, RuntimeError):
            for i in range(len(slow)):
                writer.write(slow[i : i + 1])
                await writer.drain()
                await asyncio.sleep(1.0)

    dripper = asyncio.create_task(drip())
    try:
        return await _closed_by_server(reader, start, limit)
    finally:
        dripper.cancel()
        writer.close()


async def phase_drip(server: Server, n: int, limit: float) -> dict[str, float]:
    start = time.monotonic()
    kinds = ["headers", "body", "nothing"]
    times = await asyncio.gather(*(_drip(server, kinds[i % 3], start, limit) for i in range(n)))
    closed = [t for t in times if t <= 30.0]
    return {
        "closed_30s": len(closed),
        "last_close_s": max(closed) if closed else float("inf"),
    }


async def phase_burst(server: Server, n: int, settle: float) -> dict[str, float]:
    await asyncio.sleep(1.0)
    before = server.rss()
    request = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n"
    sem = asyncio.Semaphore(32)
    conns: list[Any] = []

    async def one() -> bool:
        # Each connection asks at once (an idle one would be closed by the header timeout)
        # and then stays open, kept alive, until all have been answered.
        async with sem:
            reader, writer = await open_connection(server)
            conns.append(writer)
            writer.write(request)
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
            return head.startswith(b"HTTP/1.1 200")

    ok = await asyncio.gather(*(one() for _ in range(n)), return_exceptions=True)
    peak = server.rss()
    for w in conns:
        w.close()
    await asyncio.sleep(settle)
    after = server.rss()
    return {
        "answered": sum(1 for x in ok if x is True),
        "rss_before_mib": before / 1024,
        "rss_peak_mib": peak / 1024,
        "rss_after_mib": after / 1024,
        "returned_within_mib": (after - before) / 1024,
    }


async def phase_edges(server: Server) -> dict[str, float]:
    big = b"X-Big: " + b"a" * 200_000 + b"\r\n"
    try:
        out = await asyncio.to_thread(server.get, "/healthz", big)
        big_status = out[9:12].decode() or "closed"
    except OSError:
        big_status = "reset"
    gz = b"Content-Encoding: gzip\r\nContent-Type: application/json\r\nContent-Length: 2\r\n"
    reader, writer = await open_connection(server)
    writer.write(b"POST /mutate HTTP/1.1\r\nHost: x\r\n" + gz + b"\r\n{}")
    head = await reader.readuntil(b"\r\n")
    writer.close()
    # a body cut off mid-way
    reader, writer = await open_connection(server)
    writer.write(
        b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 100000\r\n\r\n" + b"{" * 5000
    )
    await writer.drain()
    await asyncio.sleep(0.2)
    writer.transport.abort()
    await asyncio.sleep(0.5)
    healthy = (await asyncio.to_thread(server.get, "/healthz")).startswith(b"HTTP/1.1 200")
    log = server.log.read_text()
    return {
        "header_200kb": float(big_status) if big_status.isdigit() else -1,
        "gzip": float(head[9:12]),
        "healthy_after": float(healthy),
        "tracebacks_in_log": float(log.count("Traceback")),
    }


async def one_run(server: Server, args: argparse.Namespace) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, coro in (
        ("idle", lambda: phase_idle(server, args.idle, args.limit)),
        ("drip", lambda: phase_drip(server, args.drip, args.limit)),
        ("burst", lambda: phase_burst(server, args.burst, args.settle)),
        ("edges", lambda: phase_edges(server)),
    ):
        if name not in args.phases:
            continue
        res = await coro()
        out.update({f"{name}.{k}": v for k, v in res.items()})
        print(f"  {name}: " + ", ".join(f"{k}={v:.1f}" for k, v in res.items()), flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--idle", type=int, default=300)
    parser.add_argument("--drip", type=int, default=30)
    parser.add_argument("--burst", type=int, default=1000)
    parser.add_argument("--settle", type=float, default=30.0)
    parser.add_argument("--limit", type=float, default=40.0, help="longest wait for a close")
    parser.add_argument("--phases", default="idle,drip,burst,edges")
    parser.add_argument("--http")
    parser.add_argument("--loop")
    parser.add_argument("--server-arg", action="append", default=[], help="extra serve flag")
    parser.add_argument(
        "--server",
        choices=("configpin", "granian"),
        default="configpin",
        help="configpin serve (its runner), or configpin's app on granian",
    )
    args = parser.parse_args()
    results: list[dict[str, float]] = []
    stack = f"http={args.http or 'default'} loop={args.loop or 'default'}"
    if args.server == "granian":
        stack = "granian, its TLS, uvloop"
    with tempfile.TemporaryDirectory(prefix="configpin-conn-") as tmp_name:
        if args.server == "granian":
            write_server_files(Path(tmp_name))
        for run in range(args.runs):
            print(f"run {run + 1}/{args.runs} ({stack})", flush=True)
            server = Server(Path(tmp_name), args, args.server_arg)
            try:
                results.append(asyncio.run(one_run(server, args)))
            finally:
                server.stop()
    print(f"\nmedians over {len(results)} run(s), {stack}:")
    for key in results[0]:
        values = [r[key] for r in results]
        print(f"  {key:28} {statistics.median(values):10.1f}   runs: {values}")


if __name__ == "__main__":
    main()
