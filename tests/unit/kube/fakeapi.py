"""A stand-in for the API server on http://127.0.0.1, for the tests of what the user's commands
send (their headers, their query) and of how they take its answers: each request is recorded,
each answered from a table of paths (a path not in it: 200 with an empty list), after `delay`
seconds when a test makes the server slow."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from email.message import Message
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml

from harness.local_http import JSONHandler

TOKEN = "not-a-secret"


@dataclass
class Seen:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: Message


@dataclass
class FakeAPI:
    answers: dict[str, tuple[int, Any]] = field(default_factory=dict)
    delay: float = 0.0
    seen: list[Seen] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def kubeconfig(self, folder: Path, namespace: str = "team-a") -> Path:
        path = folder / "kubeconfig"
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "me", "user": {"token": TOKEN}}],
            "contexts": [
                {
                    "name": "fake",
                    "context": {"cluster": "fake", "user": "me", "namespace": namespace},
                }
            ],
            "current-context": "fake",
        }
        path.write_text(yaml.safe_dump(doc))
        return path

    def paths(self) -> list[str]:
        return [s.path for s in self.seen]


def serve(api: FakeAPI) -> Iterator[FakeAPI]:
    class Handler(JSONHandler):
        protocol_version = "HTTP/1.1"

        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            parts = urlsplit(self.path)
            api.seen.append(Seen(self.command, parts.path, parse_qs(parts.query), self.headers))
            if api.delay:
                time.sleep(api.delay)
            code, body = api.answers.get(parts.path, (200, {"kind": "List", "items": []}))
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # it gave up first
                self.answer_json(body, code)

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _answer

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    api.server = server
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield api
    finally:
        server.shutdown()
        server.server_close()
