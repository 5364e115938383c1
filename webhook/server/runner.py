"""Run the ASGI app under uvicorn over TLS, and stop it without dropping admission requests.

Shutdown on SIGTERM (or SIGINT, or anyone calling `lifecycle.begin_shutdown()`):

1. `/readyz` turns 503 and every response says `Connection: close`. The Endpoints
   controller and load balancers take a few seconds to stop routing to this pod, and
   kube-proxy only steers *new* connections: the API server's pooled keep-alive
   connections would keep reaching this pod forever. Closing after each response moves
   them to a new connection, which lands on another replica.
2. For `shutdown_delay` seconds the server keeps accepting and serving as usual.
3. The listener closes; connections that were just accepted get a moment to send their
   request; then uvicorn closes idle connections and waits (up to `drain_timeout`) for
   in-flight requests to finish, runs the app's lifespan shutdown and returns.

A second SIGINT forces an immediate exit; a second SIGTERM skips what is left of the delay.
The certificate is reloaded from disk in the background for the server's whole life.
"""

from __future__ import annotations

import asyncio
import asyncio.sslproto
import contextlib
import logging
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine
from types import FrameType
from typing import Any, cast

import uvicorn
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from webhook.process import allocator
from webhook.process.metrics import Metrics
from webhook.server import memory
from webhook.server.guard import GuardCounters, Limits, guarded
from webhook.server.lifecycle import Lifecycle
from webhook.server.tls import ReloadingTLSContext

logger = logging.getLogger(__name__)

# Longest wait, out of drain_timeout, for connections accepted just before the listener
# closed to deliver their first request; uvicorn closes any connection without one.
_LINGER = 0.5


# The stack configpin runs on (chosen by measurement: bench/README.md). Module attributes so
# that a benchmark can start the same server on another parser or loop.
DEFAULT_HTTP = "httptools"
DEFAULT_LOOP = "uvloop"

# asyncio's TLS transport keeps a read buffer of this size for every connection's whole life
# (256 KiB by default, zero-filled, so all of it is resident): a thousand idle connections
# would hold 256 MiB. One TLS record is at most 16 KiB; reading a record at a time costs a
# few more loop iterations for a large body and nothing else.
_TLS_READ_BUFFER = 16 * 1024


def _http_protocol(http: str) -> type[Any]:
    # Imported on demand: each needs its own optional package.
    if http == "httptools":
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol  # noqa: PLC0415

        return HttpToolsProtocol
    if http == "h11":
        from uvicorn.protocols.http.h11_impl import H11Protocol  # noqa: PLC0415

        return H11Protocol
    raise ValueError(f"unknown HTTP implementation {http!r} (h11 or httptools)")


def _loop_factory(loop: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    if loop == "uvloop":
        import uvloop  # noqa: PLC0415

        factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
        return factory
    if loop == "asyncio":
        return None
    raise ValueError(f"unknown event loop {loop!r} (asyncio or uvloop)")


def run(server: Coroutine[Any, Any, None], *, loop: str | None = None) -> None:
    """Run `server` (a `serve_async(...)`) until a signal ends it (see the module docstring).
    Must run in the main thread for signals to be handled; returns normally after a graceful
    shutdown."""
    allocator.tune_allocator()
    with asyncio.Runner(loop_factory=_loop_factory(loop or DEFAULT_LOOP)) as runner:
        runner.run(server)


async def serve_async(
    app: ASGIApp,
    *,
    host: str,
    port: int,
    tls: ReloadingTLSContext,
    lifecycle: Lifecycle,
    shutdown_delay: float = 5.0,
    drain_timeout: float = 30.0,
    limits: Limits | None = None,
    metrics: Metrics | None = None,
    log_level: str = "info",
    http: str | None = None,
) -> None:
    """`run` on the current event loop.

    Signals are only captured on the main thread (uvicorn's rule, and Python's). In any
    other thread call `lifecycle.begin_shutdown()` to stop the server the same way.
    """
    limits = limits or Limits()
    metrics = metrics or Metrics()
    asyncio.sslproto.SSLProtocol.max_size = _TLS_READ_BUFFER
    trimmer = memory.Trimmer()
    counters = GuardCounters(
        closed=trimmer.note_closed,
        refused=metrics.connections_refused,
        header_timeouts=metrics.connection_timeouts.labels("headers"),
        headers_too_large=metrics.bad_requests.labels("431"),
    )
    linger = min(_LINGER, drain_timeout / 2)
    config = uvicorn.Config(
        _CloseWhenShuttingDown(app, lifecycle),
        host=host,
        port=port,
        http=guarded(_http_protocol(http or DEFAULT_HTTP), limits, counters),
        # uvicorn builds no context of its own when given a factory; it passes this one
        # to loop.create_server, so reloads on it reach the listening socket.
        ssl_context_factory=lambda _cfg, _default: tls.context,
        # The API server's webhook client drops idle pooled connections after 90 s. If we
        # closed an idle connection first, the API server could send a review on it at the
        # very moment it closes, see a reset, and fail the admission (failurePolicy then
        # decides, and Fail blocks the pod). Idling longer than the client makes the client
        # always the side that closes idle connections. (uvicorn annotates it as int but
        # only hands it to call_later.)
        timeout_keep_alive=cast(int, limits.keep_alive_timeout),
        # h11 refuses a head over its own limit with a bare 400; the guard answers 431 first.
        h11_max_incomplete_event_size=limits.max_header_bytes + 512 * 1024,
        # uvicorn annotates this as int but only hands it to asyncio.wait_for.
        timeout_graceful_shutdown=cast(int, max(drain_timeout - linger, 0.0)),
        lifespan="on",
        access_log=False,
        log_level=log_level,
    )
    server = _Server(
        config,
        lifecycle=lifecycle,
        shutdown_delay=shutdown_delay,
        linger=linger,
        handshake_timeout=limits.handshake_timeout,
    )
    metrics.open_connections.set_function(lambda: len(server.server_state.connections))
    watcher = asyncio.create_task(tls.watch(), name="tls-reload")
    trimming = asyncio.create_task(trimmer.run(), name="memory-trim")
    try:
        await server.serve()
    finally:
        for task in (watcher, trimming):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


class _Server(uvicorn.Server):
    """uvicorn's server with a not-ready period before it stops listening.

    uvicorn's own `handle_exit` stops listening at the first signal, and after the
    shutdown re-raises the signal with the default handler restored, so the process dies
    "killed by SIGTERM" instead of exiting 0. Ours never records the signal for re-raising.
    """

    def __init__(
        self,
        config: uvicorn.Config,
        *,
        lifecycle: Lifecycle,
        shutdown_delay: float,
        linger: float,
        handshake_timeout: float,
    ) -> None:
        super().__init__(config)
        self._handshake_timeout = handshake_timeout
        self._lifecycle = lifecycle
        self._shutdown_delay = shutdown_delay
        self._linger = linger
        self._shutdown_began: float | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        # uvicorn's own startup, for the one case configpin uses (a host and port), with a
        # bound on the TLS handshake, which uvicorn leaves at asyncio's 60 s.
        await self.lifespan.startup()
        if self.lifespan.should_exit:
            sys.exit(3)
        config = self.config

        def create_protocol(_loop: asyncio.AbstractEventLoop | None = None) -> asyncio.Protocol:
            protocol: asyncio.Protocol = config.http_protocol_class(  # type: ignore[call-arg]
                config=config,
                server_state=self.server_state,
                app_state=self.lifespan.state,
                _loop=_loop,
            )
            return protocol

        loop = asyncio.get_running_loop()
        try:
            server = await loop.create_server(
                create_protocol,
                host=config.host,
                port=config.port,
                ssl=config.ssl,
                backlog=config.backlog,
                ssl_handshake_timeout=self._handshake_timeout,
            )
        except OSError as exc:
            logger.error(exc)
            await self.lifespan.shutdown()
            sys.exit(1)
        assert server.sockets is not None
        self.servers = [server]
        self._log_started_message(list(server.sockets))
        self.started = True
        self._lifecycle.mark_started()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        name = signal.Signals(sig).name
        if not self.started:
            # Nobody routes to a server that never listened: no reason to wait.
            self._lifecycle.begin_shutdown()
            self.should_exit = True
        elif self._lifecycle.shutting_down or self.should_exit:
            if sig == signal.SIGINT:
                logger.warning("Received %s again: exiting without draining", name)
                self.force_exit = True
            else:
                logger.info("Received %s again: skipping the rest of the shutdown delay", name)
            self.should_exit = True
        else:
            logger.info(
                "Received %s: not ready any more; serving %.1fs longer, then draining",
                name,
                self._shutdown_delay,
            )
            self._shutdown_began = time.monotonic()
            self._lifecycle.begin_shutdown()

    async def on_tick(self, counter: int) -> bool:
        # Also reached when someone other than a signal began the shutdown.
        if self._lifecycle.shutting_down and not self.should_exit:
            now = time.monotonic()
            if self._shutdown_began is None:
                self._shutdown_began = now
            if now - self._shutdown_began >= self._shutdown_delay:
                logger.info("Shutdown delay over: closing the listener and draining")
                self.should_exit = True
        return await super().on_tick(counter)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        # uvicorn closes the listener and every idle connection in one go. A client that
        # connected just before then may not have sent its request yet, and would lose it.
        # Stop accepting first and give those connections a moment; each gets its
        # response with `Connection: close`.
        for srv in self.servers:
            srv.close()
        deadline = time.monotonic() + self._linger
        # uvicorn offers no event for "connections changed"; it polls the same way.
        while (  # noqa: ASYNC110
            self.server_state.connections and time.monotonic() < deadline and not self.force_exit
        ):
            await asyncio.sleep(0.05)
        await super().shutdown(sockets=sockets)


class _CloseWhenShuttingDown:
    """ASGI wrapper: once the shutdown began, every HTTP response closes its connection."""

    def __init__(self, app: ASGIApp, lifecycle: Lifecycle) -> None:
        self._app = app
        self._lifecycle = lifecycle

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return

        def send_closing(message: Message) -> Awaitable[None]:
            # Not a coroutine of its own: the caller awaits `send`'s (two per request).
            if message["type"] == "http.response.start" and self._lifecycle.shutting_down:
                headers = [
                    (k, v) for k, v in message.get("headers", []) if k.lower() != b"connection"
                ]
                headers.append((b"connection", b"close"))
                message = {**message, "headers": headers}
            return send(message)

        await self._app(scope, receive, send_closing)
