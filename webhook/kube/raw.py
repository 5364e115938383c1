"""Raw JSON requests to the API server over a `webhook.kube.client.Connection`.

We read and write plain dicts, never the generated models: models drop fields they do not
know and cost far more to build than the JSON they come from (controller-runtime's note on
`PatchResponseFromRaw`). The connection owns TLS, the pool and the credentials, token
refresh included.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import quote, urlencode

import orjson
import urllib3

from webhook.core.durations import SECOND, format_duration
from webhook.core.kinds import BUILTIN_KINDS
from webhook.core.model import JSONObject, SourceKind
from webhook.kube.client import Connection
from webhook.kube.errors import (
    AlreadyExists,
    Conflict,
    Forbidden,
    Gone,
    Invalid,
    KubeError,
    NotFound,
)

if TYPE_CHECKING:
    from kubernetes import client as k8s

JSON: Final = "application/json"
JSON_PATCH: Final = "application/json-patch+json"
MERGE_PATCH: Final = "application/merge-patch+json"

_BY_STATUS: Final[dict[int, type[KubeError]]] = {
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    410: Gone,
    422: Invalid,
}

MAX_PAGE_ITEMS: Final = 5000  # objects per list page at most, however small they are

# resource -> (API path prefix, namespaced)
RESOURCES: Final[Mapping[str, str]] = {
    **{k.resource: k.facts.prefix for k in SourceKind},
    "namespaces": "/api/v1",
    "serviceaccounts": "/api/v1",
    "leases": "/apis/coordination.k8s.io/v1",
    "mutatingwebhookconfigurations": "/apis/admissionregistration.k8s.io/v1",
    # the workload kinds at their preferred version (CronJobs on 1.20: workloads.served_prefix)
    **{k.resource: k.prefix() for k in BUILTIN_KINDS},
}


def path(
    resource: str, namespace: str | None = None, name: str | None = None, prefix: str | None = None
) -> str:
    base = prefix or RESOURCES[resource]
    parts = [base]
    if namespace:
        parts.append(f"/namespaces/{quote(namespace, safe='')}")
    parts.append(f"/{resource}")
    if name:
        parts.append(f"/{quote(name, safe='')}")
    return "".join(parts)


def _error(what: str, resp: urllib3.BaseHTTPResponse, body: bytes) -> KubeError:
    status = resp.status
    reason = ""
    try:
        doc = orjson.loads(body)
        if isinstance(doc, dict):
            reason = str(doc.get("reason") or "")
            # The message can quote the object; keep only its first line, shortened.
            message = str(doc.get("message") or "").splitlines()[0:1]
            reason = f"{reason}: {message[0][:300]}" if message else reason
    except (orjson.JSONDecodeError, ValueError):
        reason = resp.reason or ""
    cls = _BY_STATUS.get(status, KubeError)
    if status == 409 and reason.startswith("AlreadyExists"):
        cls = AlreadyExists
    return cls(what, status, reason)


class Kube:
    """Plain-dict access to the API server.

    `api` is a Connection (`webhook.kube.client.connect`), or an official client ApiClient
    (tests and benchmarks), whose host, pool and credentials are then used."""

    def __init__(self, api: Connection | k8s.ApiClient, *, timeout: float = 30.0) -> None:
        self.api = api
        self.conn = api if isinstance(api, Connection) else Connection.of_api_client(api)
        self.timeout: float | urllib3.Timeout | None = timeout
        self.limit = self.conn.request_timeout
        if self.limit is not None:  # the person's --request-timeout wins over our default
            self.timeout = urllib3.Timeout(total=self.limit) if self.limit else None
        self.calls = 0  # requests made, for benchmarks and tests

    def _headers(self, content_type: str | None) -> dict[str, str]:
        headers = {"Accept": JSON, "User-Agent": "configpin", **self.conn.headers()}
        if content_type:
            headers["Content-Type"] = content_type
        return headers

    def _all_headers(self, content_type: str | None) -> Mapping[str, str]:
        """`_headers`, and the connection's header lines: a name may repeat (one
        Impersonate-Group line per group), which a dict cannot hold."""
        headers = self._headers(content_type)
        if not self.conn.lines:
            return headers
        lines = urllib3.HTTPHeaderDict(headers)
        for name, value in self.conn.lines:
            lines.add(name, value)
        return lines

    def _url(self, api_path: str, query: Mapping[str, Any] | None) -> str:
        url = self.conn.host + api_path
        if query:
            q = {
                k: ("true" if v is True else "false" if v is False else v)
                for k, v in query.items()
                if v is not None
            }
            url += "?" + urlencode(q)
        return url

    def open(
        self,
        method: str,
        api_path: str,
        *,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str | None = None,
        timeout: float | tuple[float, float] | urllib3.Timeout | None = None,
    ) -> urllib3.BaseHTTPResponse:
        """Send a request; the response is not read (callers stream or read it). Under a
        --request-timeout, the API server is told it too (`timeout`, as client-go tells it), so
        that it gives up on the request (a slow admission webhook's dry run) when we do."""
        self.calls += 1
        if self.limit and not (query or {}).get("watch"):
            query = {**(query or {}), "timeout": format_duration(round(self.limit * SECOND))}
        data = orjson.dumps(body) if body is not None else None
        try:
            resp: urllib3.BaseHTTPResponse = self.conn.pool.request(
                method,
                self._url(api_path, query),
                body=data,
                headers=self._all_headers(content_type or (JSON if data is not None else None)),
                timeout=urllib3.Timeout(connect=timeout[0], read=timeout[1])
                if isinstance(timeout, tuple)
                else (timeout or self.timeout),  # a urllib3.Timeout as it is
                preload_content=False,
                retries=False,
            )
        except urllib3.exceptions.HTTPError as e:
            raise KubeError(f"{method} {api_path}", None, type(e).__name__) from e
        if resp.status >= 400:
            body = resp.read()
            resp.release_conn()
            raise _error(f"{method} {api_path}", resp, body)
        return resp

    def request(self, method: str, api_path: str, **kwargs: Any) -> JSONObject:
        resp = self.open(method, api_path, **kwargs)
        with _returned(resp):
            data = resp.read()
        doc = orjson.loads(data) if data else {}
        return doc if isinstance(doc, dict) else {}

    def get(self, api_path: str, *, timeout: float | None = None, **query: Any) -> JSONObject:
        return self.request("GET", api_path, query=query or None, timeout=timeout)

    def create(self, api_path: str, body: JSONObject, **query: Any) -> JSONObject:
        return self.request("POST", api_path, body=body, query=query or None)

    def replace(self, api_path: str, body: JSONObject) -> JSONObject:
        return self.request("PUT", api_path, body=body)

    def patch(
        self, api_path: str, patch: Any, content_type: str = JSON_PATCH, **query: Any
    ) -> JSONObject:
        return self.request(
            "PATCH", api_path, body=patch, content_type=content_type, query=query or None
        )

    def delete(self, api_path: str, body: JSONObject | None = None) -> JSONObject:
        return self.request("DELETE", api_path, body=body)

    def list_pages(
        self,
        api_path: str,
        *,
        page_size: int = 500,
        page_bytes: int | None = None,
        **query: Any,
    ) -> Iterator[JSONObject]:
        """Each page of a list (chunked with `limit`/`continue`); the last one carries the
        list's resourceVersion. A continue token that expired (410) raises Gone.

        With `page_bytes`, pages are bounded by size rather than by count: the first asks
        for `page_size` objects, each next one for as many as the objects seen so far say
        fit in `page_bytes` of JSON (at least 1, at most `MAX_PAGE_ITEMS`). Small objects
        then come in few round trips, and large ones (Secrets of hundreds of KB) never make a
        page of hundreds of MB to parse at once."""
        token: str | None = None
        limit, seen_bytes, seen_items = page_size, 0, 0
        while True:
            resp = self.open("GET", api_path, query={"limit": limit, "continue": token, **query})
            with _returned(resp):
                data = resp.read()
            doc = orjson.loads(data) if data else {}
            page: JSONObject = doc if isinstance(doc, dict) else {}
            if page_bytes:
                seen_bytes += len(data)
                seen_items += len(page.get("items") or ())
                if seen_items:
                    fit = page_bytes * seen_items // seen_bytes
                    limit = max(1, min(MAX_PAGE_ITEMS, fit))
            del data, doc
            yield page
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return

    @contextlib.contextmanager
    def watch(
        self, api_path: str, resource_version: str, *, timeout_seconds: int = 300, **query: Any
    ) -> Iterator[Iterator[JSONObject]]:
        """A watch from `resource_version`: yields event dicts until the server ends it. Under
        a --request-timeout the server is asked to end it within that time (the caller watches
        again), and the stream is waited for that long and a little more, for the end."""
        timeout: tuple[float, float] | None = (10.0, timeout_seconds + 30.0)
        if self.limit is not None:
            if self.limit:
                timeout_seconds = max(1, min(timeout_seconds, math.ceil(self.limit)))
                timeout = (self.limit, timeout_seconds + min(self.limit, 30.0))
            else:  # 0: no timeout (the server still ends a watch when it will)
                timeout = None
        resp = self.open(
            "GET",
            api_path,
            query={
                "watch": True,
                "resourceVersion": resource_version,
                "allowWatchBookmarks": True,
                "timeoutSeconds": timeout_seconds,
                **query,
            },
            timeout=timeout,
        )
        with _returned(resp):
            yield _events(resp)


@contextlib.contextmanager
def _returned(resp: urllib3.BaseHTTPResponse) -> Iterator[None]:
    """The response's connection back to the pool once the block ends, closed first unless
    the body was read to its end: a connection with unread bytes (a watch left early, a read
    cut short) would hand them to the next request as its status line."""
    try:
        yield
    finally:
        if not resp.closed:  # the body was not read to its end
            resp.close()
        resp.release_conn()


def _events(resp: urllib3.BaseHTTPResponse) -> Iterator[JSONObject]:
    buffer = bytearray()
    for chunk in resp.stream(65536, decode_content=True):
        buffer += chunk
        start = 0
        while (nl := buffer.find(b"\n", start)) >= 0:
            line = bytes(buffer[start:nl])
            start = nl + 1
            if line.strip():
                event = orjson.loads(line)
                if isinstance(event, dict):
                    yield event
        del buffer[:start]
    if buffer.strip():
        event = orjson.loads(buffer)
        if isinstance(event, dict):
            yield event
