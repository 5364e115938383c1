"""The dashboard's HTTP server: the standard library's threading server on the address asked
for (loopback by default), each request handed to the app as a `Request`, its `Response`
written back. Server-sent events (`/api/stream`) tell the page when what it shows changed;
it then reads the JSON again.

Bounded: headers as http.server bounds them, a body of at most `BODY_MAX`, an idle client cut
after `IDLE` seconds, the event stream ended every `STREAM_SECONDS` (the browser reconnects).
"""

from __future__ import annotations

import logging
import socket
import socketserver
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Final

from webhook.commands.dashboard.app import BODY_MAX, App, Request, Response, error
from webhook.commands.dashboard.feeds import Store

log = logging.getLogger(__name__)

IDLE: Final = 30.0
STREAM_SECONDS: Final = 300.0
HEARTBEAT: Final = 15.0


class Server(ThreadingHTTPServer):
    """Bound at once (the port is known before the app is made: `--port 0`); `app` and
    `store` are set before it serves."""

    daemon_threads = True
    request_queue_size = 64
    app: App
    store: Store

    def __init__(self, address: tuple[str, int]) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        super().__init__(address, Handler)

    def server_bind(self) -> None:
        # (HTTPServer.server_bind looks the address up by name: not needed, and slow offline)
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name = str(host)
        self.server_port = int(port)


class Handler(BaseHTTPRequestHandler):
    server: Server
    timeout = IDLE
    protocol_version = "HTTP/1.1"
    server_version = "configpin-dashboard"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    def _request(self, body: bytes = b"") -> Request:
        path, _, query = self.path.partition("?")
        headers = {k.lower(): v for k, v in self.headers.items()}
        return Request(self.command, path, query, headers, body)

    def _send(self, response: Response) -> None:
        self.send_response(response.status)
        for name, value in response.all_headers().items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(response.body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(response.body)

    def do_GET(self) -> None:
        response = self.server.app.handle(self._request())
        if response.stream:
            self._stream(response)
        else:
            self._send(response)

    def do_HEAD(self) -> None:
        self._send(self.server.app.handle(self._request()))

    def do_POST(self) -> None:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0 or length > BODY_MAX:
            self.close_connection = True
            self._send(error(413 if length > 0 else 400, "body too large or length unknown"))
            return
        body = self.rfile.read(length) if length else b""
        self._send(self.server.app.handle(self._request(body)))

    def _other(self) -> None:
        self._send(self.server.app.handle(self._request()))

    do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _other

    def _stream(self, response: Response) -> None:
        """`version: N` whenever the feeds moved, a comment line every HEARTBEAT s."""
        self.close_connection = True
        self.send_response(200)
        headers = response.all_headers()
        headers["Content-Type"] = "text/event-stream"
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        store = self.server.store
        version = -1
        ends = time.monotonic() + STREAM_SECONDS
        try:
            while time.monotonic() < ends and not store.stopped.is_set():
                newer = store.wait_newer(version, HEARTBEAT)
                if newer != version:
                    version = newer
                    self.wfile.write(f"event: version\ndata: {version}\n\n".encode())
                else:
                    self.wfile.write(b": still here\n\n")
                self.wfile.flush()
                time.sleep(0.2)  # (a burst of watch events is one message)
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            return
