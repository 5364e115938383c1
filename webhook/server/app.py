"""The FastAPI application: a thin HTTP layer over `Admitter.review`.

Transport faults are not admission decisions: an empty or undecodable body, a wrong content
type or a body that is not an AdmissionReview get 400, a body over the limit 413 (refused by
its Content-Length, or cut off while streaming, never read whole into memory).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final

import orjson
from fastapi import FastAPI, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from webhook.metrics import Metrics
from webhook.server.admission import BadReview, parse_review
from webhook.server.handler import Admitter
from webhook.server.lifecycle import Lifecycle

MAX_BODY: Final = 7 * 1024 * 1024  # as controller-runtime: the API server's limit is 3 MiB objects
JSON: Final = "application/json"


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
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _TooLarge
        chunks.append(chunk)
    return b"".join(chunks)


def _problem(metrics: Metrics, code: int, message: str) -> Response:
    metrics.bad_requests.labels(str(code)).inc()
    return Response(orjson.dumps({"error": message}), status_code=code, media_type=JSON)


def create_app(
    admitter: Admitter,
    lifecycle: Lifecycle,
    metrics: Metrics,
    *,
    ready_checks: Sequence[Callable[[], bool]] = (),
    max_body: int = MAX_BODY,
) -> FastAPI:
    app = FastAPI(title="configpin", docs_url=None, redoc_url=None, openapi_url=None)

    @app.post("/mutate")
    async def mutate(request: Request) -> Response:
        content_type = request.headers.get("content-type", "")
        if content_type.split(";", 1)[0].strip().lower() != JSON:
            return _problem(metrics, 400, f"content type must be {JSON}, got {content_type!r}")
        try:
            body = await _read_body(request, max_body)
        except _TooLarge:
            return _problem(metrics, 413, f"body larger than {max_body} bytes")
        try:
            review = parse_review(body)
        except BadReview as e:
            return _problem(metrics, 400, str(e))
        out = await admitter.review(review)
        return Response(orjson.dumps(out), media_type=JSON)

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
