"""Hostile clients against the real server stack (runner, guard, app, TLS) on 127.0.0.1.

Behaviour only: each test checks what the server does to a slow, idle, greedy or broken
client, with limits made small so that it happens at once; the figures (how long, how much
memory) are in bench/connections.py.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest

from tests.unit.conftest import HKEY, configmap, reading, review, workload
from tests.unit.server._tls_app import served_in_a_thread
from webhook.inputs.sources import FileSources
from webhook.process.metrics import Metrics
from webhook.server import runner
from webhook.server.app import create_app
from webhook.server.guard import Limits
from webhook.server.handler import Admitter
from webhook.server.lifecycle import Lifecycle
from webhook.server.tls import ReloadingTLSContext
from webhook.tls import certgen, certs

LIMITS = Limits(
    max_connections=6,
    handshake_timeout=1.0,
    header_timeout=0.5,
    body_timeout=0.5,
    keep_alive_timeout=120.0,
    max_header_bytes=4096,
)
GOOD = orjson.dumps(review(workload("Deployment", reading("cfg", "a")), uid="ok"))


@dataclass
class Live:
    port: int
    metrics: Metrics
    ctx: ssl.SSLContext

    def connect(self) -> ssl.SSLSocket:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        return self.ctx.wrap_socket(sock, server_hostname="localhost")

    def count(self, name: str, **labels: str) -> float:
        value = self.metrics.registry.get_sample_value(name, labels)
        return 0.0 if value is None else value


def _answer(tls: ssl.SSLSocket) -> bytes:
    """Everything the server sends until it closes the connection."""
    out = b""
    with contextlib.suppress(OSError):
        while chunk := tls.recv(65536):
            out += chunk
    return out


def _request(tls: ssl.SSLSocket, path: str = "/healthz", close: bool = False) -> bytes:
    head = f"GET {path} HTTP/1.1\r\nHost: x\r\n"
    tls.sendall((head + ("Connection: close\r\n" if close else "") + "\r\n").encode())
    out = b""
    while b"\r\n\r\n" not in out:
        chunk = tls.recv(4096)
        assert chunk, f"closed after {out!r}"
        out += chunk
    head, _, body = out.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        body += tls.recv(4096)
    return out


def _post(body: bytes, extra: str = "", path: str = "/mutate") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n{extra}\r\n"
    ).encode() + body


@pytest.fixture(params=["h11", "httptools"])
def live(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Live]:
    bundle = certgen.generate("configpin", "configpin")
    certs.write_bundle(bundle, tmp_path / "c")
    metrics = Metrics()
    lifecycle = Lifecycle()
    admitter = Admitter(
        hkey=HKEY, sources=FileSources(HKEY, [configmap("cfg", {"a": "1"})]), metrics=metrics
    )
    app = create_app(admitter, lifecycle, metrics, body_timeout=LIMITS.body_timeout)
    with served_in_a_thread(
        app,
        lifecycle,
        tls=ReloadingTLSContext(tmp_path / "c" / "tls.crt", tmp_path / "c" / "tls.key"),
        shutdown_delay=0.0,
        drain_timeout=1.0,
        limits=LIMITS,
        metrics=metrics,
        http=request.param,
    ) as port:
        ctx = ssl.create_default_context(cadata=bundle.ca_cert_pem.decode())
        yield Live(port, metrics, ctx)


def test_a_connection_that_never_sends_a_request_is_closed(live: Live) -> None:
    with live.connect() as tls:
        assert _answer(tls) == b""
    assert live.count("configpin_connection_timeouts_total", phase="headers") == 1


def test_headers_dripped_byte_by_byte_are_cut_off(live: Live) -> None:
    with live.connect() as tls:
        with contextlib.suppress(OSError):
            for byte in b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: yes\r\n":
                tls.sendall(bytes([byte]))
                time.sleep(0.05)
        assert _answer(tls) == b""
    assert live.count("configpin_connection_timeouts_total", phase="headers") == 1


@pytest.mark.parametrize("path", ["/mutate", "/sources"])  # (one transport for both)
def test_a_body_that_does_not_arrive_in_time_gets_408_and_a_closed_connection(
    live: Live, path: str
) -> None:
    with live.connect() as tls:
        tls.sendall(_post(GOOD, path=path)[:-10])
        answer = _answer(tls)
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert b"connection: close" in answer.lower()
    assert live.count("configpin_connection_timeouts_total", phase="body") == 1
    assert live.count("configpin_bad_requests_total", code="408") == 1


def test_an_idle_kept_alive_connection_outlives_the_header_timeout(live: Live) -> None:
    # Between requests only the keep-alive timeout counts (above the API server's 90 s).
    with live.connect() as tls:
        assert _request(tls).startswith(b"HTTP/1.1 200 ")
        time.sleep(LIMITS.header_timeout * 3)
        assert _request(tls).startswith(b"HTTP/1.1 200 ")
        tls.sendall(_post(GOOD))
        answer = b""
        while b'"uid":"ok"' not in answer:
            chunk = tls.recv(65536)
            assert chunk, answer
            answer += chunk
    assert live.count("configpin_connection_timeouts_total", phase="headers") == 0


def test_past_the_connection_cap_new_connections_get_503(live: Live) -> None:
    held = []
    try:
        for _ in range(LIMITS.max_connections):
            tls = live.connect()
            assert _request(tls).startswith(b"HTTP/1.1 200 ")  # kept alive, counted
            held.append(tls)
        with live.connect() as extra:
            assert _answer(extra).startswith(b"HTTP/1.1 503 ")
        assert live.count("configpin_connections_refused_total") == 1
        seen = [live.count("configpin_open_connections") for _ in range(3) if not time.sleep(0.2)]
        assert seen[-1] == LIMITS.max_connections, seen
    finally:
        for tls in held:
            tls.close()
    deadline = time.monotonic() + 5
    while live.count("configpin_open_connections") > 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    with live.connect() as tls:
        assert _request(tls, close=True).startswith(b"HTTP/1.1 200 ")


def test_an_oversized_request_head_gets_431(live: Live) -> None:
    with live.connect() as tls:
        with contextlib.suppress(OSError):
            tls.sendall(
                b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20_000 + b"\r\n\r\n"
            )
        assert _answer(tls).startswith(b"HTTP/1.1 431 ")
    assert live.count("configpin_bad_requests_total", code="431") == 1
    with live.connect() as tls:
        assert _request(tls, close=True).startswith(b"HTTP/1.1 200 ")


def test_an_oversized_request_head_in_one_read_gets_431_and_one_just_under_is_served(
    live: Live,
) -> None:
    # One TLS record, so the head is complete in the read that brings it (the size check after
    # parsing, not the count of bytes that never made a head).
    def head(size: int) -> bytes:
        start = b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Big: "
        return start + b"a" * (size - len(start) - 4) + b"\r\n\r\n"

    with live.connect() as tls:
        with contextlib.suppress(OSError):
            tls.sendall(head(LIMITS.max_header_bytes + 200))
        assert _answer(tls).startswith(b"HTTP/1.1 431 ")
    assert live.count("configpin_bad_requests_total", code="431") == 1
    with live.connect() as tls:
        tls.sendall(head(LIMITS.max_header_bytes - 200))
        assert _answer(tls).startswith(b"HTTP/1.1 200 ")
    assert live.count("configpin_bad_requests_total", code="431") == 1


def test_a_client_gone_mid_body_is_counted_and_logged_in_one_line(
    live: Live, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    with live.connect() as tls:
        tls.sendall(_post(GOOD)[:-10])
        time.sleep(0.1)

    def gone_lines() -> list[logging.LogRecord]:
        return [r for r in caplog.records if "went away" in r.getMessage()]

    # The server counts, then logs, on its own thread: wait for both, not for the first.
    deadline = time.monotonic() + 10
    while (
        live.count("configpin_client_disconnects_total") < 1 or not gone_lines()
    ) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert live.count("configpin_client_disconnects_total") == 1
    gone = gone_lines()
    assert len(gone) == 1 and "\n" not in gone[0].getMessage() and gone[0].exc_info is None
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    with live.connect() as tls:
        assert _request(tls, close=True).startswith(b"HTTP/1.1 200 ")


def test_the_server_runs_on_the_declared_stack() -> None:
    # pyproject.toml declares httptools and uvloop: what was measured is what runs.
    assert (runner.DEFAULT_HTTP, runner.DEFAULT_LOOP) == ("httptools", "uvloop")
    factory = runner._loop_factory(runner.DEFAULT_LOOP)
    assert factory is not None
    loop = factory()
    try:
        assert type(loop).__module__.startswith("uvloop")
    finally:
        loop.close()
    assert runner._http_protocol(runner.DEFAULT_HTTP).__name__ == "HttpToolsProtocol"
