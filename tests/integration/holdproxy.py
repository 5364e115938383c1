"""A reverse proxy in front of the API server that can hold back the events of ConfigMap
watches: what a replica whose watch lags looks like, made on purpose and released at will; that
can refuse chosen requests as the API server refuses one its user may not make (403); and that
can hold chosen requests back until let go (a read that reaches the server late).

Everything else (lists, GETs, writes, other watches) passes straight through. The proxy
terminates TLS with a certificate of its own and forwards each request, its bearer token
included, to the API server.
"""

from __future__ import annotations

import base64
import http.client
import queue
import ssl
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import yaml

from harness.controlplane import ControlPlane, issue_serving_cert, new_ca
from harness.local_http import JSONHandler

_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "host", "content-length"}


class HoldProxy:
    def __init__(self, plane: ControlPlane, workdir: Path) -> None:
        self.plane = plane
        self.hold = threading.Event()  # set: ConfigMap watch events wait until cleared
        self._released = threading.Condition()
        # (method, path with query) -> refused: answered 403 Forbidden here, never forwarded
        self.refuse: Callable[[str, str], bool] | None = None
        self.refused: list[str] = []  # what was refused ("GET /api/v1/...")
        # (method, path with query) -> held: forwarded only once `let_go()` is called
        self._stall: Callable[[str, str], bool] | None = None
        self.stalled: list[str] = []  # what was held back
        self._go = threading.Event()
        upstream = urlsplit(plane.host)
        self._upstream = (upstream.hostname or "127.0.0.1", upstream.port or 443)
        self._upstream_tls = ssl.create_default_context(cafile=str(plane.ca_file))
        ca = new_ca("hold-proxy-ca")
        pair = issue_serving_cert(ca, "hold-proxy")
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "proxy.crt").write_bytes(pair.cert_pem)
        (workdir / "proxy.key").write_bytes(pair.key_pem)
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(workdir / "proxy.crt", workdir / "proxy.key")
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        port = self.server.server_address[1]
        self.kubeconfig = workdir / "kubeconfig"
        self.kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [
                        {
                            "name": "proxy",
                            "cluster": {
                                "server": f"https://127.0.0.1:{port}",
                                "certificate-authority-data": base64.b64encode(
                                    ca.cert_pem
                                ).decode(),
                            },
                        }
                    ],
                    "users": [{"name": "admin", "user": {"token": plane.token}}],
                    "contexts": [
                        {"name": "proxy", "context": {"cluster": "proxy", "user": "admin"}}
                    ],
                    "current-context": "proxy",
                }
            )
        )
        self.kubeconfig.chmod(0o600)

    def release(self) -> None:
        with self._released:
            self.hold.clear()
            self._released.notify_all()

    def wait_released(self) -> None:
        with self._released:
            while self.hold.is_set():
                self._released.wait(1.0)

    def stall(self, chosen: Callable[[str, str], bool]) -> None:
        """Hold back the requests `chosen` picks (method, path with query) until `let_go`."""
        self._go.clear()
        self._stall = chosen

    def let_go(self) -> None:
        """Forward the requests held back; hold back none from now on."""
        self._stall = None
        self._go.set()

    def start(self) -> None:
        threading.Thread(target=self.server.serve_forever, name="hold-proxy", daemon=True).start()

    def stop(self) -> None:
        self.release()
        self.let_go()
        self.server.shutdown()
        self.server.server_close()

    def upstream(self) -> http.client.HTTPSConnection:
        host, port = self._upstream
        return http.client.HTTPSConnection(host, port, context=self._upstream_tls, timeout=400)


def _watch(target: str) -> tuple[bool, bool]:
    """(a watch, of ConfigMaps)."""
    parts = urlsplit(target)
    watch = parse_qs(parts.query).get("watch", [""])[0] in ("true", "1")
    return watch, watch and parts.path.endswith("/configmaps")


def _handler(proxy: HoldProxy) -> type[JSONHandler]:
    class Handler(JSONHandler):
        protocol_version = "HTTP/1.1"

        def _forward(self) -> None:
            try:
                self._relay()
            except (OSError, http.client.HTTPException):
                # Either side went away (a watch ended, a process stopped): so does this one.
                self.close_connection = True

        def _relay(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            if proxy.refuse is not None and proxy.refuse(self.command, self.path):
                proxy.refused.append(f"{self.command} {self.path}")
                self._forbidden()
                return
            stall = proxy._stall
            if stall is not None and stall(self.command, self.path):
                proxy.stalled.append(f"{self.command} {self.path}")
                proxy._go.wait(60)
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
            conn = proxy.upstream()
            try:
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                watch, held = _watch(self.path)
                if watch and resp.status == 200:
                    self._stream(resp, held=held)
                    self.close_connection = True
                    return
                data = resp.read()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in _HOP_BY_HOP:
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            finally:
                conn.close()

        def _forbidden(self) -> None:
            status = {
                "kind": "Status",
                "apiVersion": "v1",
                "status": "Failure",
                "message": f"{self.command} {urlsplit(self.path).path} is forbidden (the proxy)",
                "reason": "Forbidden",
                "code": 403,
            }
            self.answer_json(status, 403)

        def _stream(self, resp: http.client.HTTPResponse, *, held: bool) -> None:
            self.send_response(200)
            self.send_header("Content-Type", resp.getheader("Content-Type") or "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            lines: queue.Queue[bytes] = queue.Queue()

            def read() -> None:
                try:
                    for line in _lines(resp):
                        lines.put(line)
                finally:
                    lines.put(b"")

            threading.Thread(target=read, daemon=True).start()
            try:
                while True:
                    line = lines.get()
                    if not line:
                        break
                    if held:
                        proxy.wait_released()
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
            except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
                pass

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _forward

    return Handler


def _lines(resp: http.client.HTTPResponse) -> Iterator[bytes]:
    while True:
        try:
            line = resp.readline()
        except Exception:
            return
        if not line:
            return
        yield line


@contextmanager
def hold_proxy(plane: ControlPlane, workdir: Path) -> Iterator[HoldProxy]:
    proxy = HoldProxy(plane, workdir)
    proxy.start()
    try:
        yield proxy
    finally:
        proxy.stop()
