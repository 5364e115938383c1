"""The pool `webhook.kube.raw.Kube` shares between the controller's watches and its requests: a
connection goes back to it clean or not at all. A watch left before the server ends it (a
leader stepping down, a bench's watcher stopping) leaves unread chunks on its connection; handed
to the next request, they were read as its status line (`BadStatusLine('e5')`)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import ThreadingHTTPServer

import pytest
from kubernetes import client as k8s

from harness.local_http import JSONHandler
from webhook.kube.raw import Kube


class _Handler(JSONHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, chunked: as kube-apiserver

    def do_GET(self) -> None:
        if "watch=true" in self.path:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            try:
                for i in range(200):  # events keep coming, as on a busy namespace
                    line = json.dumps({"type": "ADDED", "object": {"n": i}}).encode() + b"\n"
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                    self.wfile.flush()
                    time.sleep(0.005)
                self.wfile.write(b"0\r\n\r\n")
            except OSError:
                pass
            return
        self.answer_json({"kind": "Status", "path": self.path})


@pytest.fixture
def kube() -> Iterator[Kube]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    cfg = k8s.Configuration(host=f"http://127.0.0.1:{httpd.server_address[1]}")
    cfg.connection_pool_maxsize = 1  # one connection: the next request gets the watch's
    api = k8s.ApiClient(cfg)
    try:
        yield Kube(api)
    finally:
        api.close()  # type: ignore[no-untyped-call]
        httpd.shutdown()
        httpd.server_close()


def test_a_watch_left_early_does_not_hand_its_unread_events_to_the_next_request(
    kube: Kube,
) -> None:
    for round_ in range(3):
        with kube.watch("/api/v1/configmaps", "0") as events:
            first = next(events)
        assert first["object"] == {"n": 0}
        # The same (only) pooled connection, or a new one: never one with chunks left on it.
        assert kube.get("/api/v1/namespaces")["path"] == "/api/v1/namespaces", round_


def test_a_watch_read_to_its_end_and_requests_keep_their_connection(kube: Kube) -> None:
    with kube.watch("/api/v1/configmaps", "0") as events:
        assert sum(1 for _ in events) == 200
    for _ in range(3):
        assert kube.get("/api/v1/pods")["kind"] == "Status"
