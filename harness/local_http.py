"""The handler of the local HTTP servers tests put where the API server would be (the unit
tests of configpin's cluster connection, the integration tests' proxy in front of the API
server): it answers JSON and logs nothing."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler
from typing import Any


class JSONHandler(BaseHTTPRequestHandler):
    def answer_json(self, value: Any, code: int = 200) -> None:
        """`code` with `value` as a JSON body of known length."""
        body = json.dumps(value).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: Any) -> None:
        pass
