"""Per-request timing inside `configpin serve`, for `bench.source_writes` (no benchmark).

Python imports `sitecustomize` at start from its path; `bench.source_writes` starts configpin
with this folder on PYTHONPATH and CONFIGPIN_BENCH_TRACE=1. configpin's ASGI app (whatever
`webhook.server.runner.serve_async` is given) is then wrapped: for each POST, the moments
(time.monotonic, the clock the bench times its writes on) the app was called, the body was
read whole, the answer's head and its last body part were handed to the transport, and the
CPU time the event loop's thread spent in between (time.thread_time: what is not CPU in that
span was spent waiting, for a core or for the GIL). It also keeps each run of the cyclic
garbage collector (`gc.callbacks`: its generation, start, duration and thread), which stops
every thread while it runs. Both are kept in memory and answered, as JSON, to
`GET /bench-trace` (which empties them); every other request goes to configpin's app as it is.
Nothing of configpin's own code changes; the wrap costs a few clock reads per request.

CONFIGPIN_BENCH_EXPERIMENT (comma-separated) changes how the process runs, for an experiment
measured beside the same code without it (`bench.source_writes --experiment`):

- `switch=SECONDS`: the interpreter's thread switch interval (`sys.setswitchinterval`; 0.005
  by default);
- `cork`: uvicorn writes an answer's head together with its body, one TLS record and one
  write to the socket, instead of the head first and the body after it;
- `follower`: the controller's listener of source changes returns at once on a replica that
  does not lead (it walks the consumers only to find that it acts on none of them);
- `noproxy`: uvicorn without its proxy-headers middleware (configpin reads no
  X-Forwarded-For);
- `freeze`: `gc.freeze()` at the first `GET /bench-trace` (the bench asks once configpin has
  indexed every workload, before it times anything): what is alive then is left out of every
  later collection;
- `threshold=A:B:C`: `gc.set_threshold(A, B, C)` at start (Python's 700:10:10).

Without CONFIGPIN_BENCH_TRACE it does nothing. The variables are removed from the environment
once read, so that the processes configpin starts (its large-review worker) do not load it.
"""

from __future__ import annotations

import gc
import importlib.abc
import importlib.util
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

_TRACE = os.environ.pop("CONFIGPIN_BENCH_TRACE", "")
_EXPERIMENT = {
    name: value
    for name, _, value in (
        part.partition("=")
        for part in os.environ.pop("CONFIGPIN_BENCH_EXPERIMENT", "").split(",")
        if part
    )
}


class _Collections:
    """Each run of the cyclic garbage collector: (generation, start, seconds, thread)."""

    def __init__(self) -> None:
        self.runs: list[tuple[int, float, float, str]] = []
        self._start = 0.0
        gc.callbacks.append(self)

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = time.monotonic()
        else:
            took = time.monotonic() - self._start
            name = threading.current_thread().name
            self.runs.append((info["generation"], self._start, took, name))


class _Traced:
    """An ASGI app that times the POSTs it passes on to `app`."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.records: list[tuple[str, float, float, float, float, float]] = []
        self.collections = _Collections()
        self.freeze = "freeze" in _EXPERIMENT

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope["method"] == "GET" and scope["path"] == "/bench-trace":
            await self._answer(send)
            return
        if scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        clock = time.monotonic
        called = clock()
        cpu = time.thread_time()  # the event loop's thread: the CPU it spends on this request
        moments = [0.0, 0.0, 0.0]  # body read whole, head sent, last body part sent

        async def timed_receive() -> Any:
            message = await receive()
            if message["type"] == "http.request" and not message.get("more_body", False):
                moments[0] = clock()
            return message

        async def timed_send(message: Any) -> None:
            kind = message["type"]
            if kind == "http.response.start":
                moments[1] = clock()
            await send(message)
            if kind == "http.response.body" and not message.get("more_body", False):
                moments[2] = clock()

        await self.app(scope, timed_receive, timed_send)
        cpu = time.thread_time() - cpu
        self.records.append((scope["path"], called, *moments, cpu))  # type: ignore[arg-type]

    async def _answer(self, send: Any) -> None:
        import json

        if self.freeze:
            self.freeze = False
            gc.freeze()
        body = json.dumps({"requests": self.records, "gc": self.collections.runs}).encode()
        self.records = []
        self.collections.runs = []
        head = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": head})
        await send({"type": "http.response.body", "body": body})


def _patch_runner(module: Any) -> None:
    serve_async = module.serve_async

    async def traced(app: Any, **kwargs: Any) -> None:
        await serve_async(_Traced(app), **kwargs)

    module.serve_async = traced


class _Corked:
    """A transport that holds an HTTP head back until the next write, and writes both at
    once."""

    def __init__(self, transport: Any) -> None:
        self._transport = transport
        self._held = b""

    def write(self, data: bytes) -> None:
        if not self._held and data.startswith(b"HTTP/") and data.endswith(b"\r\n\r\n"):
            self._held = data
            return
        held, self._held = self._held, b""
        self._transport.write(held + data)

    def close(self) -> None:
        if self._held:
            self._transport.write(self._held)
            self._held = b""
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def _patch_httptools(module: Any) -> None:
    cycle = module.RequestResponseCycle
    init = cycle.__init__

    def corked_init(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self.transport = _Corked(self.transport)

    cycle.__init__ = corked_init


def _patch_rollout(module: Any) -> None:
    controller = module.RolloutController
    source_changed = controller.source_changed

    def follower_skips(self: Any, namespace: str, sid: Any) -> None:
        if self.acting():
            source_changed(self, namespace, sid)

    controller.source_changed = follower_skips


def _patch_config(module: Any) -> None:
    config = module.Config
    init = config.__init__

    def without_proxy_headers(self: Any, *args: Any, **kwargs: Any) -> None:
        kwargs["proxy_headers"] = False
        init(self, *args, **kwargs)

    config.__init__ = without_proxy_headers


class _AfterImport(importlib.abc.MetaPathFinder):
    """Calls `patches[name](module)` once module `name` is loaded, from whichever tree
    `configpin serve` runs (a baseline's, from its working directory: at this point of the
    interpreter's start that folder is not on its path yet)."""

    def __init__(self, patches: dict[str, Callable[[Any], None]]) -> None:
        self.patches = patches

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        patch = self.patches.pop(name, None)
        if patch is None:
            return None
        if not self.patches:
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        load = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            load(module)
            patch(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


if _TRACE:
    patches: dict[str, Callable[[Any], None]] = {"webhook.server.runner": _patch_runner}
    if "threshold" in _EXPERIMENT:
        gc.set_threshold(*(int(n) for n in _EXPERIMENT["threshold"].split(":")))
    if "switch" in _EXPERIMENT:
        sys.setswitchinterval(float(_EXPERIMENT["switch"]))
    if "cork" in _EXPERIMENT:
        patches["uvicorn.protocols.http.httptools_impl"] = _patch_httptools
    if "follower" in _EXPERIMENT:
        patches["webhook.controller.rollout"] = _patch_rollout
    if "noproxy" in _EXPERIMENT:
        patches["uvicorn.config"] = _patch_config
    sys.meta_path.insert(0, _AfterImport(patches))
