"""Per-connection limits around uvicorn's HTTP protocol: timeouts, a connection cap, header size.

uvicorn times out only idle keep-alive connections, and only once they have answered a
request: a connection that never sends a complete request head is kept forever, and one that
sends a 200 KB header is dropped without an answer. The guard adds, for either of uvicorn's
parsers (h11, httptools):

- a connection cap: past `max_connections`, a new connection is answered 503 and closed at once;
- a header timeout (Go's `ReadHeaderTimeout`): the request line and headers must be complete
  within `header_timeout` of the handshake (a new connection) or of the first byte after an
  idle spell (a kept-alive one), else the connection is closed;
- a header size limit: a request head larger than `max_header_bytes` is answered 431 and the
  connection closed.

The body timeout lives in the app (it answers 408), the handshake timeout in the listener,
and the idle timeout between requests is uvicorn's own keep-alive timeout.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from prometheus_client import Counter

logger = logging.getLogger(__name__)

_CLOSE: Final = b"connection: close\r\ncontent-type: text/plain; charset=utf-8\r\n"


def _raw_response(status: bytes, text: bytes) -> bytes:
    return (
        b"HTTP/1.1 "
        + status
        + b"\r\n"
        + _CLOSE
        + b"content-length: "
        + str(len(text)).encode()
        + b"\r\n\r\n"
        + text
    )


_OVER_CAPACITY: Final = _raw_response(b"503 Service Unavailable", b"too many connections\n")
_HEADERS_TOO_LARGE: Final = _raw_response(
    b"431 Request Header Fields Too Large", b"request header fields too large\n"
)


@dataclass(frozen=True)
class Limits:
    """Bounds on what one client can hold. Defaults suit a webhook behind the API server: its
    requests carry a small head, send their body at once, and reuse connections for up to
    90 s (so the idle timeout stays above that: the client, never the server, ends an idle
    connection, and never sends on one the server is closing)."""

    max_connections: int = 1000
    handshake_timeout: float = 5.0
    header_timeout: float = 5.0
    body_timeout: float = 10.0
    keep_alive_timeout: float = 120.0
    max_header_bytes: int = 32 * 1024


@dataclass(frozen=True)
class GuardCounters:
    """Where the guard counts what it cut off (children of the process's metrics)."""

    closed: Callable[[], None]
    refused: Counter
    header_timeouts: Counter
    headers_too_large: Counter


def guarded(base: type[Any], limits: Limits, counters: GuardCounters) -> type[Any]:
    """A subclass of uvicorn's protocol class `base` (H11Protocol or HttpToolsProtocol) that
    enforces `limits`. Both keep the request in progress in `self.cycle`."""

    class Guarded(base):  # type: ignore[misc]
        _head_timer: asyncio.TimerHandle | None = None
        _head_bytes: int = 0

        def connection_made(self, transport: asyncio.Transport) -> None:
            super().connection_made(transport)
            if len(self.connections) > limits.max_connections:
                counters.refused.inc()
                logger.debug("connection refused: %d open", len(self.connections))
                transport.write(_OVER_CAPACITY)
                transport.close()
                self.connections.discard(self)  # gone as far as the cap is concerned
                return
            # The first request head must follow the handshake promptly.
            self._arm_head_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_head_timer()
            counters.closed()
            super().connection_lost(exc)

        def _in_request(self) -> bool:
            cycle = self.cycle
            return cycle is not None and not cycle.response_complete

        def _arm_head_timer(self) -> None:
            if self._head_timer is None:
                self._head_timer = self.loop.call_later(limits.header_timeout, self._head_late)

        def _cancel_head_timer(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_late(self) -> None:
            self._head_timer = None
            if self._in_request() or self.transport.is_closing():
                return
            counters.header_timeouts.inc()
            logger.debug(
                "connection closed: no complete request head in %ss", limits.header_timeout
            )
            self.transport.close()

        def data_received(self, data: bytes) -> None:
            waiting = not self._in_request()
            super().data_received(data)
            if self._in_request():
                if waiting:
                    self._cancel_head_timer()
                    received = self._head_bytes + len(data)
                    self._head_bytes = 0
                    # The head came in with these bytes, so it is no larger than they are, and
                    # `_head_size` counts at most a third more (4 per header line, which takes
                    # 3 or more): only a read that large needs the head measured.
                    if (
                        received * 4 > limits.max_header_bytes * 3
                        and self._head_size() > limits.max_header_bytes
                    ):
                        self.cycle.disconnected = True  # the app's answer goes nowhere
                        self._headers_too_large()
                return
            if self.transport.is_closing():
                return
            if waiting:
                # The first byte after an idle spell starts the clock, unless the head came
                # whole with it (the usual case: no timer to arm and cancel per request).
                self._arm_head_timer()
            self._head_bytes += len(data)
            if self._head_bytes > limits.max_header_bytes:
                self._headers_too_large()

        def _head_size(self) -> int:
            size = len(self.scope.get("raw_path") or b"") + len(
                self.scope.get("query_string") or b""
            )
            for name, value in self.headers:
                size += len(name) + len(value) + 4
            return size

        def _headers_too_large(self) -> None:
            counters.headers_too_large.inc()
            self._cancel_head_timer()
            self.transport.write(_HEADERS_TOO_LARGE)
            self.transport.close()

    Guarded.__name__ = Guarded.__qualname__ = f"Guarded{base.__name__}"
    return Guarded
