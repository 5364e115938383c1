"""A tiny app served by the real runner, for TLS and shutdown tests; and helpers to drive it.

Run as `python -m tests.unit.server._tls_app --cert F --key F --port N [...]` so tests can send
it real signals.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI, Response

from webhook.server.lifecycle import Lifecycle

REPO_ROOT = Path(__file__).resolve().parents[3]


def build_app(lifecycle: Lifecycle) -> FastAPI:
    app = FastAPI()

    @app.get("/readyz")
    def readyz() -> Response:
        if lifecycle.ready:
            return Response("ok", media_type="text/plain")
        return Response("shutting down", status_code=503, media_type="text/plain")

    @app.get("/ping")
    async def ping() -> Response:
        return Response("pong", media_type="text/plain")

    @app.get("/slow")
    async def slow(seconds: float = 1.0) -> Response:
        await asyncio.sleep(seconds)
        return Response(f"slept {seconds}", media_type="text/plain")

    return app


def main(argv: list[str] | None = None) -> None:
    from webhook.server.guard import Limits
    from webhook.server.runner import run, serve_async
    from webhook.server.tls import ReloadingTLSContext

    parser = argparse.ArgumentParser()
    parser.add_argument("--cert", type=Path, required=True)
    parser.add_argument("--key", type=Path, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--shutdown-delay", type=float, default=1.0)
    parser.add_argument("--drain-timeout", type=float, default=5.0)
    parser.add_argument("--keep-alive-timeout", type=float, default=120.0)
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)

    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s"
    )
    lifecycle = Lifecycle()
    run(
        serve_async(
            build_app(lifecycle),
            host=args.host,
            port=args.port,
            tls=ReloadingTLSContext(args.cert, args.key),
            lifecycle=lifecycle,
            shutdown_delay=args.shutdown_delay,
            drain_timeout=args.drain_timeout,
            limits=Limits(keep_alive_timeout=args.keep_alive_timeout),
            log_level=args.log_level,
        )
    )


# ---- helpers for the tests ----


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def served_in_a_thread(app: FastAPI, lifecycle: Lifecycle, **how: Any) -> Iterator[int]:
    """`serve_async(app, ...)` on 127.0.0.1 and a free port (`how`: its other arguments) in a
    thread of this process, until `lifecycle` is ready: yields the port. On leaving, shut down
    by `lifecycle` and joined; the serving must have raised nothing."""
    from webhook.server.runner import serve_async

    port = free_port()
    errors: list[BaseException] = []

    def serve() -> None:
        try:
            asyncio.run(
                serve_async(
                    app,
                    host="127.0.0.1",
                    port=port,
                    lifecycle=lifecycle,
                    log_level="warning",
                    **how,
                )
            )
        except BaseException as e:
            errors.append(e)

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not lifecycle.ready:
            assert time.monotonic() < deadline and thread.is_alive(), errors
            time.sleep(0.02)
        yield port
    finally:
        lifecycle.begin_shutdown()
        thread.join(timeout=10)
    assert not thread.is_alive()
    assert errors == []


def client_context(*ca_pems: bytes) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cadata="".join(p.decode() for p in ca_pems))
    return ctx


def handshake(port: int, ctx: ssl.SSLContext, timeout: float = 5.0) -> tuple[bytes, str]:
    """One TLS handshake against the server; returns (leaf DER, TLS version)."""
    with (
        socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock,
        ctx.wrap_socket(sock, server_hostname="localhost") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
        version = tls.version()
        assert der is not None and version is not None
        return der, version


def get(port: int, ctx: ssl.SSLContext, path: str, timeout: float = 5.0) -> int:
    """A one-off HTTPS GET over a fresh connection; returns the status code."""
    with httpx.Client(verify=ctx, timeout=timeout) as client:
        return client.get(f"https://localhost:{port}{path}").status_code


@contextlib.contextmanager
def running_server(
    tmp_path: Path, cert: Path, key: Path, ca_pem: bytes, *extra_args: str
) -> Iterator[tuple[subprocess.Popen[bytes], int, Path]]:
    """Start the helper in a subprocess, wait until /readyz is 200, kill it afterwards."""
    port = free_port()
    log_path = tmp_path / f"server-{port}.log"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1"}
    cmd = [
        sys.executable,
        "-m",
        "tests.unit.server._tls_app",
        "--cert",
        str(cert),
        "--key",
        str(key),
    ]
    cmd += ["--port", str(port), *extra_args]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_ready(proc, port, client_context(ca_pem), log_path)
        yield proc, port, log_path
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


def _wait_ready(proc: subprocess.Popen[bytes], port: int, ctx: ssl.SSLContext, log: Path) -> None:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"server exited early:\n{log.read_text()}")
        with contextlib.suppress(OSError, httpx.HTTPError):
            if get(port, ctx, "/readyz", timeout=1.0) == 200:
                return
        time.sleep(0.05)
    raise AssertionError(f"server not ready in time:\n{log.read_text()}")


if __name__ == "__main__":
    main()
