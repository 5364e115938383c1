"""Admission throughput and latency over keep-alive HTTPS, against a bare endpoint of one stack.

Starts the real server stack (`webhook.server.runner` under uvicorn, TLS with the reloading
context, the app from `create_app`, sources from files) in a subprocess pinned to one core,
with one extra route, `/bare`, added by this script's own app factory: it reads the body and
returns a constant AdmissionReview, so it costs everything but the admission itself. This
process is the load generator, pinned to another core: a small asyncio HTTP/1.1 client with
pre-built requests, light enough that the server is the bottleneck (both CPU shares are
printed).

For each payload (a Deployment with 10 references; a ~20 KB Pod with 4) and each endpoint:
- closed loop: `--concurrency` connections, each sending its next request when the answer
  arrives: requests/s, and the server's CPU time per request;
- open loop: requests started at a fixed `--rate` whatever the answers, spread over the same
  connections; latency runs from the scheduled start, so queueing is counted (no
  coordinated omission): p50 and p99.
mutate and bare alternate in short slices, so that whatever else the machine runs falls on
both alike.

    .venv/bin/python -m bench.admission [--runs 3] [--seconds 4] [--concurrency 8] [--rate 200]

The servers import `webhook` from PYTHONPATH when it is set (`PYTHONPATH=build/compiled`:
the compiled core, hack/compiled-tree.py), else from this checkout.

Goal (issue 2): mutate at least 60% of bare throughput; p99 under 5 ms at 200 requests/s, on
one core. Loopback only; about 35 seconds per run."""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import jsonpatch
import orjson
from fastapi import FastAPI, Request, Response

from bench.common import (
    HOST,
    admission_review,
    big_pod,
    child_env,
    core_build,
    deployment,
    free_port,
    granian_cmd,
    process_tree,
    write_server_files,
)
from webhook.inputs.sources import FileSources
from webhook.process.digestkey import load_key_file
from webhook.process.metrics import Metrics
from webhook.server import runner
from webhook.server.app import create_app
from webhook.server.handler import Admitter
from webhook.server.lifecycle import Lifecycle
from webhook.server.tls import ReloadingTLSContext

CONFIGPIN = "configpin"
BARE = "bare"
ALLOW_ALL = ("allow-all", "granian-allow-all")
RATE_LABEL = "the fixed rate"

# ---- the server (subprocess) ----

BARE_REVIEW = orjson.dumps(
    {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {"uid": "00000000-0000-0000-0000-000000000000", "allowed": True},
    }
)


def bench_app(manifests: Path, key_file: Path) -> tuple[FastAPI, Lifecycle]:
    """The production app (`create_app` over FileSources) plus the bench-only `/bare` route."""
    hkey = load_key_file(key_file)
    metrics = Metrics()
    lifecycle = Lifecycle()
    sources = FileSources.from_paths(hkey, [manifests])
    admitter = Admitter(hkey=hkey, sources=sources, metrics=metrics)
    app = create_app(admitter, lifecycle, metrics)

    async def bare(request: Request) -> Response:
        await request.body()
        return Response(BARE_REVIEW, media_type="application/json")

    # the same kind of route as configpin's /mutate, so that mutate/bare is admission alone
    app.add_route("/bare", bare, methods=["POST"])

    return app, lifecycle


def allow_all_app() -> FastAPI:
    """The allow-all webhook: what any FastAPI admission webhook costs at the least. It
    parses the review (orjson) for its uid and allows it, unchanged. Its `/mutate` is a plain
    request/response route, as configpin's is: `@app.post` would add FastAPI's dependency
    solving and sub-response per request (~130k instructions), a cost configpin does not pay
    and a user need not either."""
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)

    async def mutate(request: Request) -> Response:
        review = orjson.loads(await request.body())
        out = {
            "apiVersion": review["apiVersion"],
            "kind": "AdmissionReview",
            "response": {"uid": review["request"]["uid"], "allowed": True},
        }
        return Response(orjson.dumps(out), media_type="application/json")

    app.add_route("/mutate", mutate, methods=["POST"])

    @app.get("/readyz")
    async def readyz() -> Response:
        return Response(b"ok", media_type="text/plain")

    return app


def configpin_app_from_env() -> FastAPI:
    """configpin's app for a server other than its own runner (granian): paths from the
    environment, ready at once (no runner to say it listens)."""
    app, lifecycle = bench_app(
        Path(os.environ["BENCH_MANIFESTS"]), Path(os.environ["BENCH_KEY_FILE"])
    )
    lifecycle.mark_started()
    return app


def serve(args: argparse.Namespace) -> None:
    pin(args.cpu)
    if args.app == "allow-all":
        import uvicorn

        # A plain uvicorn on its fastest stack, TLS from the same files.
        uvicorn.run(
            allow_all_app(),
            host=HOST,
            port=args.port,
            http="httptools",
            loop="uvloop",
            ssl_certfile=str(args.certs / "tls.crt"),
            ssl_keyfile=str(args.certs / "tls.key"),
            log_level="warning",
            access_log=False,
        )
        return
    app, lifecycle = bench_app(args.manifests, args.key_file)
    runner.run(
        runner.serve_async(
            app,
            host=HOST,
            port=args.port,
            tls=ReloadingTLSContext(args.certs / "tls.crt", args.certs / "tls.key"),
            lifecycle=lifecycle,
            shutdown_delay=0.0,
            drain_timeout=1.0,
            log_level="warning",
            http=args.http,
        ),
        loop=args.loop,
    )


def pin(cpu: int | None) -> str:
    if cpu is None or not hasattr(os, "sched_setaffinity"):
        return "not pinned"
    try:
        os.sched_setaffinity(0, {cpu})
    except OSError as e:
        return f"not pinned ({e.strerror})"
    return f"cpu {cpu}"


# ---- the load generator ----


class Conn:
    """One keep-alive HTTPS connection speaking just enough HTTP/1.1 for this server."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, port: int, ctx: ssl.SSLContext) -> Conn:
        reader, writer = await asyncio.open_connection(
            HOST, port, ssl=ctx, server_hostname="localhost"
        )
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return cls(reader, writer)

    async def request(self, raw: bytes) -> tuple[int, bytes]:
        self.writer.write(raw)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        body = await self.reader.readexactly(length) if length else b""
        return status, body

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(Exception):
            await self.writer.wait_closed()


def http_post(path: str, body: bytes) -> bytes:
    head = (
        f"POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    return head + body


@dataclass
class Phase:
    name: str
    requests: int
    seconds: float
    latencies: list[float]  # seconds
    client_cpu: float  # share of one core used by this process
    server_cpu: float  # share of one core used by the server process
    errors: int

    @property
    def rps(self) -> float:
        return self.requests / self.seconds

    @property
    def cpu_us(self) -> float:
        """Server CPU time per request: what the request costs, whoever else uses the core."""
        return self.server_cpu * self.seconds / max(self.requests, 1) * 1e6

    def pct(self, q: float) -> float:
        lat = sorted(self.latencies)
        if not lat:
            return float("nan")
        return lat[min(len(lat) - 1, int(q * len(lat)))] * 1000


def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) used so far by process `pid` and its children that still
    run."""
    total = 0.0
    for p in process_tree(pid):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


@contextlib.contextmanager
def cpu_meter(server_pid: int) -> Iterator[dict[str, float]]:
    out: dict[str, float] = {}
    wall, mine, theirs = time.perf_counter(), time.process_time(), proc_cpu(server_pid)
    yield out
    elapsed = time.perf_counter() - wall
    out["client"] = (time.process_time() - mine) / elapsed
    out["server"] = (proc_cpu(server_pid) - theirs) / elapsed


async def closed_loop(conns: list[Conn], raw: bytes, seconds: float, server_pid: int) -> Phase:
    """Every connection sends its next request as soon as the answer is in, for `seconds`."""
    latencies: list[float] = []
    errors = 0
    stop_at = time.perf_counter() + seconds

    async def worker(conn: Conn) -> None:
        nonlocal errors
        while (t0 := time.perf_counter()) < stop_at:
            status, _ = await conn.request(raw)
            latencies.append(time.perf_counter() - t0)
            errors += status != 200

    with cpu_meter(server_pid) as cpu:
        t_start = time.perf_counter()
        await asyncio.gather(*(worker(c) for c in conns))
        elapsed = time.perf_counter() - t_start
    return Phase("", len(latencies), elapsed, latencies, cpu["client"], cpu["server"], errors)


async def open_loop(
    conns: list[Conn], raw: bytes, rate: float, seconds: float, server_pid: int
) -> Phase:
    """Start a request every 1/rate s on a free connection; latency from the scheduled start."""
    free: asyncio.Queue[Conn] = asyncio.Queue()
    for c in conns:
        free.put_nowait(c)
    latencies: list[float] = []
    errors = 0

    async def one(scheduled: float) -> None:
        nonlocal errors
        conn = await free.get()
        try:
            status, _ = await conn.request(raw)
        finally:
            free.put_nowait(conn)
        latencies.append(time.perf_counter() - scheduled)
        if status != 200:
            errors += 1

    n = int(rate * seconds)
    pending: list[asyncio.Task[None]] = []
    loop = asyncio.get_running_loop()
    with cpu_meter(server_pid) as cpu:
        t0 = time.perf_counter() + 0.01
        for i in range(n):
            scheduled = t0 + i / rate
            delay = scheduled - time.perf_counter()
            if delay > 0:
                # Sleep until just before, then yield until the moment: a timer that fires
                # late would be charged to the server as latency.
                await asyncio.sleep(max(0.0, delay - 0.0005))
                while time.perf_counter() < scheduled:  # noqa: ASYNC110
                    await asyncio.sleep(0)
            pending.append(loop.create_task(one(scheduled)))
        await asyncio.gather(*pending)
        elapsed = time.perf_counter() - t0
    return Phase("", n, elapsed, latencies, cpu["client"], cpu["server"], errors)


async def check(conn: Conn, review: bytes, raw_mutate: bytes, raw_bare: bytes, refs: int) -> None:
    """The server answers as it should before anything is measured."""
    status, body = await conn.request(raw_mutate)
    if status != 200:
        raise SystemExit(f"/mutate answered {status}: {body[:300]!r}")
    resp = orjson.loads(body)["response"]
    if not resp.get("patch") or resp.get("warnings"):
        raise SystemExit(f"/mutate gave no patch, or warned: {resp}")
    obj = orjson.loads(review)["request"]["object"]
    mutated = jsonpatch.apply_patch(obj, orjson.loads(base64.b64decode(resp["patch"])))
    meta = (
        mutated["metadata"] if mutated["kind"] == "Pod" else mutated["spec"]["template"]["metadata"]
    )
    pinned = json.loads(meta["annotations"]["configpin.io/sources"])
    if len(pinned) != refs:
        raise SystemExit(f"expected {refs} pinned sources, got {sorted(pinned)}")
    status, _ = await conn.request(raw_bare)
    if status != 200:
        raise SystemExit(f"/bare answered {status}")


def merge(name: str, slices: list[Phase]) -> Phase:
    """One phase from interleaved slices: counts and times add up, CPU shares are weighted."""
    seconds = sum(p.seconds for p in slices)
    return Phase(
        name,
        sum(p.requests for p in slices),
        seconds,
        [x for p in slices for x in p.latencies],
        sum(p.client_cpu * p.seconds for p in slices) / seconds,
        sum(p.server_cpu * p.seconds for p in slices) / seconds,
        sum(p.errors for p in slices),
    )


@dataclass
class Target:
    """One endpoint of one server process."""

    name: str  # as printed: configpin, bare, allow-all, ...
    port: int
    path: str
    pid: int


async def drive(args: argparse.Namespace, targets: list[Target], ca_pem: bytes) -> list[Phase]:
    """Per payload: closed loop, then open loop; the endpoints alternate in slices of
    `--slice` seconds, so whatever else the machine does falls on all alike."""
    ctx = ssl.create_default_context(cadata=ca_pem.decode())
    conns: dict[int, list[Conn]] = {}
    for t in targets:
        if t.port not in conns:
            conns[t.port] = [await Conn.open(t.port, ctx) for _ in range(args.concurrency)]
    payloads = {
        "deployment": (admission_review(deployment(), "d-1"), 10),
        "pod20k": (admission_review(big_pod(), "p-1"), 4),
    }
    n_slices = max(1, round(args.seconds / args.slice))
    phases: list[Phase] = []
    try:
        for payload, (body, refs) in payloads.items():
            raw = {t.name: http_post(t.path, body) for t in targets}
            cp = next(t for t in targets if t.name == CONFIGPIN)
            await check(conns[cp.port][0], body, raw[CONFIGPIN], raw[BARE], refs)
            for t in targets:
                status, answer = await conns[t.port][0].request(raw[t.name])
                if status != 200:
                    raise SystemExit(f"{t.name} answered {status}: {answer[:300]!r}")
            for t in targets:  # warm up every one, unmeasured
                await closed_loop(conns[t.port], raw[t.name], args.warmup / 2, t.pid)
            closed: dict[str, list[Phase]] = {t.name: [] for t in targets}
            opened: dict[str, list[Phase]] = {t.name: [] for t in targets}
            for _ in range(n_slices):
                for t in targets:
                    closed[t.name].append(
                        await closed_loop(conns[t.port], raw[t.name], args.slice, t.pid)
                    )
            for _ in range(n_slices):
                for t in targets:
                    opened[t.name].append(
                        await open_loop(conns[t.port], raw[t.name], args.rate, args.slice, t.pid)
                    )
            for t in targets:
                phases.append(merge(f"{payload}/{t.name}/closed", closed[t.name]))
                phases.append(merge(f"{payload}/{t.name}/open", opened[t.name]))
    finally:
        for pool in conns.values():
            for c in pool:
                await c.close()
    return phases


def wait_ready(
    port: int, ca_pem: bytes, proc: subprocess.Popen[bytes], log: Path, timeout: float = 30
) -> None:
    ctx = ssl.create_default_context(cadata=ca_pem.decode())
    deadline = time.monotonic() + timeout
    request = b"GET /readyz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited early:\n{log.read_text()}")
        try:
            with (
                socket.create_connection((HOST, port), timeout=1) as sock,
                ctx.wrap_socket(sock, server_hostname="localhost") as tls,
            ):
                tls.sendall(request)
                if tls.recv(64).startswith(b"HTTP/1.1 200"):
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise SystemExit(f"server not ready in time:\n{log.read_text()}")


def _server_cmd(args: argparse.Namespace, tmp: Path, port: int, app: str) -> list[str]:
    """The command of one server process: configpin's runner, a plain uvicorn (allow-all),
    or granian (either app), pinned to the server's core. Run it in `tmp` with
    `child_env()`, so that `webhook` comes from PYTHONPATH where it is set."""
    if app.startswith("granian"):
        factory = "configpin_app_from_env" if app == "granian-configpin" else "allow_all_app"
        quiet = ["--log-level", "warning", "--no-access-log"]
        cmd = granian_cmd(port, tmp / "certs", factory, tmp, quiet)
        if args.server_cpu is not None:
            cmd = ["taskset", "-c", str(args.server_cpu), *cmd]
        return cmd
    cmd = [
        sys.executable,
        "-m",
        "bench.admission",
        "--serve",
        "--app",
        app,
        "--port",
        str(port),
        "--certs",
        str(tmp / "certs"),
        "--manifests",
        str(tmp / "sources"),
        "--key-file",
        str(tmp / "digest.key"),
    ]
    if args.server_cpu is not None:
        cmd += ["--cpu", str(args.server_cpu)]
    for flag in ("http", "loop"):
        if getattr(args, flag):
            cmd += [f"--{flag}", getattr(args, flag)]
    return cmd


def one_run(args: argparse.Namespace, tmp: Path, ca_pem: bytes) -> list[Phase]:
    """Start every server (each fresh per run, all on the server's core), measure, stop."""
    procs: list[subprocess.Popen[bytes]] = []
    targets: list[Target] = []
    env = child_env(BENCH_MANIFESTS=str(tmp / "sources"), BENCH_KEY_FILE=str(tmp / "digest.key"))
    try:
        for app in args.servers:
            port = free_port()
            log = tmp / f"server-{app}-{port}.log"
            with log.open("wb") as fh:
                proc = subprocess.Popen(
                    _server_cmd(args, tmp, port, app),
                    stdout=fh,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=tmp,
                )
            procs.append(proc)
            wait_ready(port, ca_pem, proc, log)
            if app == "configpin":
                targets += [
                    Target(CONFIGPIN, port, "/mutate", proc.pid),
                    Target(BARE, port, "/bare", proc.pid),
                ]
            else:
                targets.append(Target(app, port, "/mutate", proc.pid))
        return asyncio.run(drive(args, targets, ca_pem))
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


# ---- instructions per request (callgrind), whatever else the machine runs ----


async def send_n(conns: list[Conn], raw: bytes, n: int) -> int:
    """`n` requests over every connection (closed loop); returns how many were not 200."""
    left, errors = n, 0

    async def worker(conn: Conn) -> None:
        nonlocal left, errors
        while left > 0:
            left -= 1
            status, _ = await conn.request(raw)
            errors += status != 200

    await asyncio.gather(*(worker(c) for c in conns))
    return errors


def callgrind(pid: int, *command: str) -> None:
    subprocess.run(["callgrind_control", *command, str(pid)], check=True, capture_output=True)


def counted(pid: int, out: Path) -> int:
    """Dump what callgrind counted since the last dump; return the instructions."""
    before = set(out.parent.glob(f"{out.name}.{pid}.*"))
    callgrind(pid, "--dump")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for dump in set(out.parent.glob(f"{out.name}.{pid}.*")) - before:
            for line in dump.read_text(errors="replace").splitlines():
                if line.startswith("totals:"):
                    return int(line.split()[1])
        time.sleep(0.2)
    raise SystemExit(f"no callgrind dump of {pid}")


async def count_server(
    args: argparse.Namespace, targets: list[Target], ca_pem: bytes, out: Path
) -> dict[str, int]:
    """Instructions the server runs per request of each target and payload: callgrind counts
    only while the requests run (connections are opened and warmed up before), so TLS
    handshakes, start-up and idle time are left out."""
    ctx = ssl.create_default_context(cadata=ca_pem.decode())
    conns = [await Conn.open(targets[0].port, ctx) for _ in range(args.concurrency)]
    found: dict[str, int] = {}
    try:
        for payload, body in (
            ("deployment", admission_review(deployment(), "d-1")),
            ("pod20k", admission_review(big_pod(), "p-1")),
        ):
            for t in targets:
                raw = http_post(t.path, body)
                if await send_n(conns, raw, 200):  # warm: caches, memo, first-time imports
                    raise SystemExit(f"{t.name} answered other than 200")
                callgrind(t.pid, "--instr=on")
                errors = await send_n(conns, raw, args.instructions)
                callgrind(t.pid, "--instr=off")
                if errors:
                    raise SystemExit(f"{t.name}: {errors} answers other than 200")
                found[f"{payload}/{t.name}"] = counted(t.pid, out) // args.instructions
    finally:
        for c in conns:
            await c.close()
    return found


def instructions(args: argparse.Namespace, tmp: Path, ca_pem: bytes) -> None:
    """Each server (not granian) under callgrind in turn; prints instructions per request."""
    if shutil.which("callgrind_control") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    found: dict[str, int] = {}
    if args.callgrind_dir is not None:
        args.callgrind_dir.mkdir(parents=True, exist_ok=True)
    for app in (a for a in args.servers if not a.startswith("granian")):
        port = free_port()
        out = (args.callgrind_dir or tmp) / f"callgrind-{app}"
        log = tmp / f"server-{app}-{port}.log"
        cmd = [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            f"--callgrind-out-file={out}.%p",
            *_server_cmd(args, tmp, port, app),
        ]
        with log.open("wb") as fh:
            proc = subprocess.Popen(
                cmd,
                stdout=fh,
                stderr=subprocess.STDOUT,
                env=child_env(PYTHONHASHSEED="0"),
                cwd=tmp,
            )
        try:
            wait_ready(port, ca_pem, proc, log, timeout=600)
            targets = (
                [
                    Target(CONFIGPIN, port, "/mutate", proc.pid),
                    Target(BARE, port, "/bare", proc.pid),
                ]
                if app == "configpin"
                else [Target(app, port, "/mutate", proc.pid)]
            )
            found |= asyncio.run(count_server(args, targets, ca_pem, out))
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    print(
        f"\nserver instructions per request (callgrind; {args.instructions} requests per "
        f"endpoint over {args.concurrency} connections, after 200 unmeasured)"
    )
    for payload in ("deployment", "pod20k"):
        cells = {k.split("/")[1]: v for k, v in found.items() if k.startswith(payload + "/")}
        line = ", ".join(f"{name} {n:,}" for name, n in cells.items())
        if "allow-all" in cells:
            line += (
                f"; allow-all/configpin {cells['allow-all'] / cells[CONFIGPIN]:.0%} (goal >= 60%)"
            )
        print(f"{payload:<11} {line}")


def report(runs: list[list[Phase]]) -> None:
    def med(name: str, f: Callable[[Phase], float]) -> float:
        return statistics.median(f(next(p for p in run if p.name == name)) for run in runs)

    names = list(dict.fromkeys(p.name.split("/")[1] for p in runs[0]))
    print(f"\nmedians of {len(runs)} run(s)")
    print(
        f"{'':<29} {'closed loop':^34}   {'open loop at rate':^22}\n"
        f"{'payload':<11} {'endpoint':<17} {'req/s':>7} {'p50 ms':>6} {'p99 ms':>6}"
        f" {'srv cpu':>7} {'us/req':>6}   {'p50 ms':>6} {'p99 ms':>6} {'max':>6}   {'cli cpu':>7}"
    )
    contended = False
    for payload in ("deployment", "pod20k"):
        rps, cost = {}, {}
        for endpoint in names:
            c, o = f"{payload}/{endpoint}/closed", f"{payload}/{endpoint}/open"
            rps[endpoint] = med(c, lambda p: p.rps)
            cost[endpoint] = med(c, lambda p: p.cpu_us)
            server_cpu = med(c, lambda p: p.server_cpu)
            contended |= server_cpu < 0.9
            cells = [
                f"{rps[endpoint]:>7.0f}",
                f"{med(c, lambda p: p.pct(0.5)):>6.2f}",
                f"{med(c, lambda p: p.pct(0.99)):>6.2f}",
                f"{server_cpu:>7.0%}",
                f"{cost[endpoint]:>6.0f}  ",
                f"{med(o, lambda p: p.pct(0.5)):>6.2f}",
                f"{med(o, lambda p: p.pct(0.99)):>6.2f}",
                f"{med(o, lambda p: max(p.latencies) * 1000):>6.1f}  ",
                f"{med(c, lambda p: p.client_cpu):>7.0%}",
            ]
            print(f"{payload:<11} {endpoint:<17} " + " ".join(cells))
        p99 = med(f"{payload}/{CONFIGPIN}/open", lambda p: p.pct(0.99))
        allow = [n for n in names if n in ALLOW_ALL]
        if allow:
            # the baseline: the fastest allow-all webhook measured, by throughput
            fastest = max(allow, key=lambda n: rps[n])
            ratio = rps[CONFIGPIN] / rps[fastest]
            cpu_ratio = cost[fastest] / cost[CONFIGPIN]
            verdict = "ok" if ratio >= 0.6 and p99 < 5 else "MISSED"
            print(
                f"{payload:<11} configpin/{fastest}: throughput {ratio:.0%}, per CPU second "
                f"{cpu_ratio:.0%} (goal >= 60%); p99 at {RATE_LABEL} {p99:.2f} ms "
                f"(goal < 5 ms): {verdict}"
            )
        print(
            f"{payload:<11} configpin/bare (same server): throughput "
            f"{rps[CONFIGPIN] / rps[BARE]:.0%}, per CPU second {cost[BARE] / cost[CONFIGPIN]:.0%}"
        )
    if contended:
        print(
            "note: a server had less than 90% of its core in some closed-loop phase (other"
            " processes on it); compare the per-CPU-second ratio, and rerun on a quiet machine"
        )
    errors = sum(p.errors for run in runs for p in run)
    if errors:
        print(f"non-200 answers: {errors}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--seconds", type=float, default=4.0, help="measured seconds per endpoint and loop"
    )
    parser.add_argument(
        "--slice", type=float, default=0.5, help="seconds before switching mutate and bare"
    )
    parser.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds first")
    parser.add_argument("--concurrency", type=int, default=8, help="connections (closed loop)")
    parser.add_argument("--rate", type=float, default=200.0, help="requests/s (open loop)")
    parser.add_argument("--runs", type=int, default=1, help="repeat, and print the medians")
    parser.add_argument("--server-cpu", type=int, default=0, help="core for the server")
    parser.add_argument("--client-cpu", type=int, default=1, help="core for the load generator")
    parser.add_argument("--json", type=Path, help="also write every phase here")
    parser.add_argument(
        "--instructions",
        type=int,
        metavar="N",
        help="instead: count the server's instructions per request with callgrind over N "
        "requests per endpoint (load-independent; about 2 minutes for 300)",
    )
    parser.add_argument(
        "--callgrind-dir",
        type=Path,
        help="with --instructions: keep callgrind's dumps here (one per endpoint and payload, "
        "in the order measured), for callgrind_annotate",
    )
    parser.add_argument(
        "--http", help="HTTP parser of the server: h11 or httptools (default: ours)"
    )
    parser.add_argument(
        "--loop", help="event loop of the server: asyncio or uvloop (default: ours)"
    )
    parser.add_argument(
        "--servers",
        default=None,
        help="comma-separated servers to start: configpin (always), allow-all (plain uvicorn, "
        "httptools + uvloop), granian-allow-all, granian-configpin (default: every one "
        "installed)",
    )
    # the server side, run by the script itself in a subprocess
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--certs", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--manifests", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--key-file", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--cpu", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--app", default="configpin", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args)
        return
    have_granian = importlib.util.find_spec("granian") is not None
    wanted = (
        args.servers.split(",")
        if args.servers
        else ["allow-all", *(["granian-allow-all", "granian-configpin"] if have_granian else [])]
    )
    args.servers = ["configpin", *(w for w in wanted if w != "configpin")]
    if not have_granian and any(w.startswith("granian") for w in args.servers):
        raise SystemExit("granian is not installed (pip install granian)")

    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(cpus) < 2:
        print("fewer than two cores: server and load generator share one; figures are pessimistic")
        args.server_cpu = args.client_cpu = None
    client_pinning = pin(args.client_cpu)
    with tempfile.TemporaryDirectory(prefix="configpin-bench-") as tmp_name:
        tmp = Path(tmp_name)
        stack = f"http={args.http or runner.DEFAULT_HTTP} loop={args.loop or runner.DEFAULT_LOOP}"
        print(
            f"server: {'not pinned' if args.server_cpu is None else f'cpu {args.server_cpu}'}, "
            f"load generator: {client_pinning}; python {sys.version.split()[0]}; "
            f"stack: {stack}; servers: {', '.join(args.servers)}; "
            f"core: {core_build(child_env(), tmp)}; load average {os.getloadavg()[0]:.2f}"
        )
        ca_pem = write_server_files(tmp)
        sizes = {
            "deployment": len(admission_review(deployment(), "d-1")),
            "pod20k": len(admission_review(big_pod(), "p-1")),
        }
        print(
            "payloads: "
            + ", ".join(f"{k} {v / 1024:.1f} KiB" for k, v in sizes.items())
            + f"; {args.concurrency} connections closed loop, {args.rate:.0f} req/s open loop, "
            f"{args.seconds:g}s per endpoint and loop in {args.slice:g}s slices"
        )
        if args.instructions:
            instructions(args, tmp, ca_pem)
            return
        runs = []
        for i in range(args.runs):
            phases = one_run(args, tmp, ca_pem)
            runs.append(phases)
            print(
                f"run {i + 1}: "
                + ", ".join(
                    f"{p.name.replace('/closed', '')} {p.rps:.0f}/s"
                    for p in phases
                    if "closed" in p.name
                )
            )
    if args.json:
        args.json.write_text(
            json.dumps(
                [
                    [
                        {
                            "phase": p.name,
                            "rps": p.rps,
                            "p50_ms": p.pct(0.5),
                            "p99_ms": p.pct(0.99),
                            "server_cpu": p.server_cpu,
                            "server_cpu_us_per_request": p.cpu_us,
                            "client_cpu": p.client_cpu,
                            "errors": p.errors,
                        }
                        for p in run
                    ]
                    for run in runs
                ],
                indent=1,
            )
        )
    report(runs)


if __name__ == "__main__":
    main()
