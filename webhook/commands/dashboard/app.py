"""The dashboard's routes: a request in, a response out, nothing of HTTP's transport (the
server in `webhook.commands.dashboard.http` parses and writes them).

    GET  /                          the page (its token in a <meta>; its script and style below)
    GET  /assets/app.js, app.css    shipped in the package: nothing comes from elsewhere
    GET  /api/overview              scope, what could be read and what not, version
    GET  /api/changes?q=            recent changes
    GET  /api/change?id=&page=      one change: its waves as a timeline, and its buttons (the
                                    verbs that apply, whether the user's rights allow each)
    GET  /api/sources?q=&page=      ConfigMaps and Secrets and how many read each
    GET  /api/source?kind=&namespace=&name=   who uses which key
    GET  /api/workloads?q=&page=    `configpin status`, a page at a time
    GET  /api/stream                server-sent events: the version, whenever it moves
    POST /api/approve               {kind, namespace, name}: what `kubectl configpin approve` does
    POST /api/pause, /api/resume, /api/abort, /api/retry
                                    {kind, namespace, name}: `kubectl configpin VERB`
    POST /api/preview               {manifest}: what `kubectl configpin plan` would list

Every answer is built here with the fence's headers; the fence is asked first
(`webhook.commands.dashboard.guard`). JSON answers hold names, states, times and configpin's notes:
never a value of a ConfigMap or Secret. The overview says whose rights the page acts with
(`webhook.commands.dashboard.rights`).
"""

from __future__ import annotations

import html
import importlib.resources
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import parse_qs

from webhook.commands.changes import approval, dry_run_plan, sources_in
from webhook.commands.dashboard import actions, changes, views, workload
from webhook.commands.dashboard.feeds import FeedState, Store
from webhook.commands.dashboard.guard import HEADERS, Fence
from webhook.commands.dashboard.rights import Rights, Who
from webhook.commands.dashboard.statuses import StatusBook
from webhook.commands.verbs import PAST, act
from webhook.core.model import SourceKind, typed_source_kind
from webhook.core.verbs import Verb
from webhook.inputs.manifests import InputError
from webhook.kube.errors import KubeError
from webhook.kube.raw import Kube

BODY_MAX: Final = 1024 * 1024  # a pasted manifest, at most
_ASSETS: Final = {
    "app.js": "text/javascript; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)  # names in lower case
    body: bytes = b""

    def arg(self, name: str, default: str = "") -> str:
        values = parse_qs(self.query).get(name)
        return values[0] if values else default

    def page(self) -> int:
        text = self.arg("page", "1")
        return int(text) if text.isdigit() else 1


@dataclass
class Response:
    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)
    stream: bool = False  # server-sent events: the server writes them

    def all_headers(self) -> dict[str, str]:
        return {**HEADERS, "Content-Type": self.content_type, **self.headers}


def json_response(status: int, doc: Any) -> Response:
    return Response(status, json.dumps(doc, separators=(",", ":")).encode())


def error(status: int, message: str) -> Response:
    return json_response(status, {"error": message})


def problems(feeds: Sequence[FeedState], scope: str) -> list[str]:
    """What the page says could not be read: the resource types the user may not list in one
    line (with the API server's first answer), then every other error."""
    refused = [f for f in feeds if f.forbidden]
    out = [f.error for f in feeds if f.error and not f.forbidden]
    if refused:
        names = ", ".join(f.what.split(" in ")[0] for f in refused)
        out.insert(
            0,
            f"you may not list {names} ({scope}): not shown. The API server said: "
            f"{refused[0].forbidden}",
        )
    return out


def asset(name: str) -> bytes:
    return (
        importlib.resources.files("webhook.commands.dashboard")
        .joinpath("assets", name)
        .read_bytes()
    )


class App:
    def __init__(
        self,
        fence: Fence,
        store: Store,
        book: StatusBook,
        kube: Kube,
        *,
        scope: str,
        context: str,
        rights: Rights | None = None,
    ) -> None:
        self.fence = fence
        self.store = store
        self.book = book
        self.kube = kube
        self.scope = scope  # "namespace shop", "every namespace"
        self.context = context
        self.rights = rights  # None: nobody is asked (the kubeconfig's names are said)
        self._routes: dict[tuple[str, str], Callable[[Request], Response]] = {
            ("GET", "/"): self.page,
            ("GET", "/api/overview"): self.overview,
            ("GET", "/api/changes"): self.changes,
            ("GET", "/api/change"): self.change,
            ("GET", "/api/sources"): self.sources,
            ("GET", "/api/source"): self.source,
            ("GET", "/api/workloads"): self.workloads,
            ("GET", "/api/stream"): lambda _r: Response(200, stream=True),
            ("POST", "/api/approve"): self.approve,
            ("POST", "/api/pause"): lambda r: self.verb(r, Verb.PAUSE),
            ("POST", "/api/resume"): lambda r: self.verb(r, Verb.RESUME),
            ("POST", "/api/abort"): lambda r: self.verb(r, Verb.ABORT),
            ("POST", "/api/retry"): lambda r: self.verb(r, Verb.RETRY),
            ("POST", "/api/preview"): self.preview,
        }

    def handle(self, request: Request) -> Response:
        refusal = self.fence.refusal(request.method, request.path, request.headers)
        if refusal is not None:
            return error(refusal.status, refusal.why)
        method = "GET" if request.method == "HEAD" else request.method
        route = self._routes.get((method, request.path))
        if route is not None:
            return route(request)
        if method == "GET" and request.path.startswith("/assets/"):
            name = request.path.removeprefix("/assets/")
            if name in _ASSETS:
                return Response(200, asset(name), _ASSETS[name])
        if any(path == request.path for _, path in self._routes):
            return error(405, f"{request.method} is not served at {request.path}")
        return error(404, "not found")

    # --- the page
    def page(self, _request: Request) -> Response:
        text = asset("index.html").decode()
        text = text.replace("{{token}}", html.escape(self.fence.token, quote=True))
        return Response(200, text.encode(), "text/html; charset=utf-8")

    # --- reads
    def _status_of(self) -> Callable[[dict[str, Any]], Mapping[str, Any] | None]:
        snapshot = self.store.snapshot()
        versions = {(s.kind, s.namespace, s.name): s.resource_version for s in snapshot.sources}
        marks: dict[tuple[str, str, str], float] = {}
        for n in snapshot.notes:
            key = (n.kind, n.namespace, n.name)
            marks[key] = max(marks.get(key, 0.0), n.at)

        def status_of(obj: dict[str, Any]) -> Mapping[str, Any] | None:
            version = StatusBook.version(obj, versions, marks.get(workload.ref_of(obj), 0.0))
            return self.book.get(obj, version)

        return status_of

    def overview(self, _request: Request) -> Response:
        snapshot = self.store.snapshot()
        return json_response(
            200,
            {
                "version": snapshot.version,
                "scope": self.scope,
                "context": self.context,
                "who": (self.rights.who() if self.rights else Who("")).as_dict(),
                "ready": self.store.ready(),
                "feeds": [f.as_dict() for f in snapshot.feeds],
                "errors": problems(snapshot.feeds, self.scope),
                "counts": {
                    "workloads": len(snapshot.workloads),
                    "sources": sum(1 for s in snapshot.sources if not s.copy),
                },
                "said": workload.UNSIGNED,
            },
        )

    def changes(self, request: Request) -> Response:
        return json_response(200, changes.changes(self.store.snapshot(), request.arg("q")))

    def change(self, request: Request) -> Response:
        status_of = self._status_of()
        snapshot = self.store.snapshot()
        found = changes.change(snapshot, request.arg("id"), status_of, request.page())
        if found is None:
            return error(404, "no such change is known here (any more)")
        found["buttons"] = actions.buttons(found, snapshot.rollouts, self._may)
        return json_response(200, found)

    def _may(self, kind: SourceKind, namespace: str, name: str) -> dict[str, Any]:
        if self.rights is None:
            return {"allowed": None, "why": ""}
        return self.rights.may_update(kind, namespace, name).as_dict()

    def sources(self, request: Request) -> Response:
        doc = views.sources(self.store.snapshot(), request.arg("q"), request.page())
        return json_response(200, doc)

    def source(self, request: Request) -> Response:
        kind = request.arg("kind")
        if kind not in {k.value for k in SourceKind}:
            return error(400, "kind: configmap or secret")
        doc = views.source(
            self.store.snapshot(),
            kind,
            request.arg("namespace"),
            request.arg("name"),
            self.store.secret_keys,
        )
        return json_response(200, doc)

    def workloads(self, request: Request) -> Response:
        status_of = self._status_of()
        doc = views.workloads(self.store.snapshot(), status_of, request.arg("q"), request.page())
        return json_response(200, doc)

    # --- changes, with the user's own rights
    def _body(self, request: Request) -> dict[str, Any] | Response:
        if len(request.body) > BODY_MAX:
            return error(413, f"at most {BODY_MAX // 1024} KiB")
        try:
            doc = json.loads(request.body or b"{}")
        except ValueError:
            return error(400, "not JSON")
        if not isinstance(doc, dict):
            return error(400, "a JSON object is expected")
        return doc

    def _source(self, request: Request) -> tuple[SourceKind, str, str] | Response:
        doc = self._body(request)
        if isinstance(doc, Response):
            return doc
        kind, ns, name = (str(doc.get(k) or "") for k in ("kind", "namespace", "name"))
        source = typed_source_kind(kind)
        if source is None or not ns or not name:
            return error(400, "kind (configmap or secret), namespace and name are needed")
        return source, ns, name

    def _refused(self, e: KubeError, said: str, source: tuple[SourceKind, str, str]) -> Response:
        """The API server's answer to a press; a refusal (403) stands as the source's answer
        (its buttons greyed with it) for a while."""
        kind, ns, name = source
        message = f"the API server refused the {said} of {kind.value}/{name} in {ns}: {e}"
        if e.status == 403 and self.rights is not None:
            self.rights.refused(kind, ns, name, message)
        status = e.status if e.status in (403, 404, 409, 422) else 502
        return json_response(status, {"error": message, "refused": True})

    def verb(self, request: Request, verb: Verb) -> Response:
        """`kubectl configpin VERB`: the same request, with the user's own rights."""
        found = self._source(request)
        if isinstance(found, Response):
            return found
        kind, ns, name = found
        what = f"{kind.value}/{name} in {ns}"
        try:
            record = act(self.kube, kind, ns, name, verb)
        except KubeError as e:
            return self._refused(e, verb.value, found)
        if record is None:
            return error(
                502,
                f"configpin did not record the {verb.value} of {what} (is it installed for this "
                "namespace, running, and as new as this dashboard?)",
            )
        self.store.bump()
        return json_response(
            200,
            {
                "verb": verb.value,
                "user": record.get("user"),
                "content": record.get("content"),
                "message": f"{PAST[verb]} {what} by {record.get('user', '?')}",
            },
        )

    def approve(self, request: Request) -> Response:
        found = self._source(request)
        if isinstance(found, Response):
            return found
        source, ns, name = found
        what = f"{source.value}/{name} in {ns}"
        try:
            record = approval(self.kube, source, ns, name)
        except KubeError as e:
            return self._refused(e, "approval", found)
        if record is None:
            return error(
                502,
                f"configpin did not record the approval of {what} (is it installed for this "
                "namespace, and running?)",
            )
        self.store.bump()
        return json_response(
            200,
            {
                "approved": what,
                "user": record.get("user"),
                "content": record.get("content"),
                "message": f"{'approved --now' if record.get('now') is True else 'approved'} "
                f"{what} by {record.get('user', '?')}: the waves waiting for it roll",
            },
        )

    def preview(self, request: Request) -> Response:
        doc = self._body(request)
        if isinstance(doc, Response):
            return doc
        text = doc.get("manifest")
        namespace = str(doc.get("namespace") or "")
        if not isinstance(text, str) or not text.strip():
            return error(400, "paste a ConfigMap or Secret manifest")
        try:
            objects = sources_in(text.encode(), "the manifest")
        except InputError as e:
            return error(400, str(e))
        if not objects:
            return error(400, "no ConfigMap or Secret (apiVersion v1) in the manifest")
        results = []
        for obj in objects:
            meta = obj.get("metadata")
            if not isinstance(meta, dict) or not meta.get("name"):
                return error(400, f"a {obj.get('kind')} without metadata.name")
            ns = str(meta.get("namespace") or namespace or self.store.namespace or "default")
            item: dict[str, Any] = {"kind": obj["kind"], "namespace": ns, "name": meta["name"]}
            try:
                item.update(dry_run_plan(self.kube, ns, obj))
            except KubeError as e:
                item["error"] = f"the API server refused the dry run: {e}"
            results.append(item)
        return json_response(200, {"plans": results})
