"""The FastAPI application: one thin HTTP layer over each webhook's handler (`/mutate`,
`/sources`: server/handler.py), the same for every path.

Transport faults are not admission decisions: an empty or undecodable body, a wrong content
type or a body that is not an AdmissionReview get 400, a body over the limit 413 (refused by
its Content-Length, or cut off while streaming, never read whole into memory), a compressed
body 415 (the API server never compresses one), a body not complete within the body timeout
408 (and the connection closed). A client that goes away mid-body is counted and logged in
one line.

A large review (over `heavy_body` bytes: thousands of references) is parsed, checked and
planned in a worker process, one at a time (server/large.py), so that it never holds the
event loop or its GIL: other admissions, `/healthz` and `/readyz` are answered meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Final

import orjson
from fastapi import FastAPI, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import ClientDisconnect

from webhook.process.metrics import Metrics
from webhook.server.admission import BadReview, parse_review
from webhook.server.handler import Admitter, Webhook
from webhook.server.lifecycle import Lifecycle

MAX_BODY: Final = 7 * 1024 * 1024  # as controller-runtime: the API server's limit is 3 MiB objects
JSON: Final = "application/json"
HEAVY_BODY: Final = 256 * 1024  # ~ 3,000 references: planned in a few ms, past that off the loop

log = logging.getLogger(__name__)


class _TooLarge(Exception):
    pass


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            if int(declared) > limit:
                raise _TooLarge
        except ValueError:
            pass
    # The ASGI messages read directly (what `request.stream()` does, without an async
    # generator per request): most bodies are whole in the first.
    receive = request.receive
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        kind = message["type"]
        if kind == "http.disconnect":
            raise ClientDisconnect
        if kind != "http.request":
            continue
        chunk: bytes = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _TooLarge
        if not message.get("more_body", False):
            if not chunks:
                return chunk
            chunks.append(chunk)
            return b"".join(chunks)
        chunks.append(chunk)


async def _read_body_within(request: Request, limit: int, seconds: float) -> bytes:
    """`_read_body`, raising TimeoutError past `seconds`: what `asyncio.timeout` does,
    with a bare timer (a quarter of its cost, on every admission)."""
    task = asyncio.current_task()
    assert task is not None
    cancelling = task.cancelling()
    expired = False

    def expire() -> None:
        nonlocal expired
        expired = True
        task.cancel()

    timer = asyncio.get_running_loop().call_later(seconds, expire)
    try:
        return await _read_body(request, limit)
    except asyncio.CancelledError:
        # ours, unless someone else cancelled the task too (then it stays cancelled)
        if expired and task.uncancel() <= cancelling:
            raise TimeoutError from None
        raise
    finally:
        timer.cancel()


def _problem(metrics: Metrics, code: int, message: str, *, close: bool = False) -> Response:
    metrics.bad_requests.labels(str(code)).inc()
    headers = {"connection": "close"} if close else None
    return Response(
        orjson.dumps({"error": message}), status_code=code, media_type=JSON, headers=headers
    )


def _client(request: Request) -> str:
    return f"{request.client.host}:{request.client.port}" if request.client else "a client"


def create_app(
    admitter: Admitter,
    lifecycle: Lifecycle,
    metrics: Metrics,
    *,
    ready_checks: Sequence[Callable[[], bool]] = (),
    max_body: int = MAX_BODY,
    body_timeout: float = 10.0,
    heavy_body: int = HEAVY_BODY,
) -> FastAPI:
    app = FastAPI(title="configpin", docs_url=None, redoc_url=None, openapi_url=None)
    body_timeouts = metrics.connection_timeouts.labels("body")

    def endpoint(webhook: Webhook) -> Callable[[Request], Awaitable[Response]]:
        """The one transport every webhook path is served by: a webhook's own handler behind
        the same checks, limits and worker process."""
        received = metrics.loop_counts.tally(metrics.webhook_requests.labels(webhook.path))

        async def admit(request: Request) -> Response:
            received.inc()
            encoding = request.headers.get("content-encoding")
            if encoding is not None and encoding.strip().lower() not in ("", "identity"):
                return _problem(
                    metrics, 415, f"content encoding {encoding!r} is not supported: send identity"
                )
            content_type = request.headers.get("content-type", "")
            if content_type.split(";", 1)[0].strip().lower() != JSON:
                return _problem(metrics, 400, f"content type must be {JSON}, got {content_type!r}")
            try:
                body = await _read_body_within(request, max_body, body_timeout)
            except _TooLarge:
                return _problem(metrics, 413, f"body larger than {max_body} bytes")
            except TimeoutError:
                body_timeouts.inc()
                log.info(
                    "%s sent no complete body within %ss: answered 408",
                    _client(request),
                    body_timeout,
                )
                return _problem(
                    metrics, 408, f"request body not complete within {body_timeout}s", close=True
                )
            except ClientDisconnect:
                metrics.client_disconnects.inc()
                log.info("%s went away before its request body was complete", _client(request))
                return Response(status_code=400)  # nobody reads it
            if len(body) <= heavy_body:
                try:
                    review = parse_review(body)
                except BadReview as e:
                    return _problem(metrics, 400, str(e))
                out = await webhook.review(review)
                return Response(orjson.dumps(out), media_type=JSON)
            metrics.heavy_reviews.inc()
            try:
                out = await webhook.review_large(body)
            except BadReview as e:
                return _problem(metrics, 400, str(e))
            return Response(orjson.dumps(out), media_type=JSON)

        return admit

    # Plain request/response routes (Starlette's, through FastAPI's `add_route`): the
    # endpoint takes the request and returns the response itself, so FastAPI's per-request
    # dependency solving, sub-response and telemetry context (a fifth of what the API server
    # waits for on a small review) are left out. Nothing else changes: same middleware,
    # same 405 for other methods.
    for path, webhook in admitter.webhooks.items():
        app.add_route(path, endpoint(webhook), methods=["POST"])

    @app.get("/healthz")
    async def healthz() -> Response:
        return Response(b"ok", media_type="text/plain")

    @app.get("/readyz")
    async def readyz() -> Response:
        if lifecycle.ready and all(check() for check in ready_checks):
            return Response(b"ok", media_type="text/plain")
        return Response(b"not ready", status_code=503, media_type="text/plain")

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app
