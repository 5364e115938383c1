"""The HTTP layer: `/mutate` with good and bad input, health, readiness and metrics.

The app runs in-process behind httpx's ASGI transport, which hands the request body to the
app chunk by chunk, as a server would: so a body refused for its size is shown not to have
been read whole.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import jsonpatch
import pytest

from harness.builders import RecordingWriter
from tests.unit.conftest import (
    HKEY,
    NSKEY,
    Store,
    configmap,
    container,
    env_cm,
    env_secret,
    plan,
    pod_spec,
    reading,
    record,
    recorded_sources,
    review,
    secret,
    spec_of,
    vol_cm,
    vol_secret,
    workload,
)
from webhook.core import digest
from webhook.core.constants import ANN_CHANGED_BY, ANN_CHECKSUM, ANN_IGNORE, ANN_SOURCES
from webhook.core.model import (
    JSONObject,
    SnapshotRequest,
    SourceId,
    SourceRecord,
    SourceUnavailable,
)
from webhook.inputs.sources import FileSources, Miss
from webhook.process.config import Settings
from webhook.process.metrics import Metrics
from webhook.server import large
from webhook.server.admission import MAX_WARNING, MAX_WARNINGS_TOTAL, capped_warnings, parse_review
from webhook.server.app import JSON, MAX_BODY, create_app
from webhook.server.handler import Admitter
from webhook.server.intake import Intake, intake
from webhook.server.lifecycle import Lifecycle

pytestmark = pytest.mark.anyio

SOURCES: list[JSONObject] = [
    configmap("cfg", {"a": "1", "b": "2"}),
    secret("creds", {"user": "admin", "pass": "pw"}),
    # binaryData that is not base64: the object exists but cannot be digested
    {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "broken"},
        "binaryData": {"k": "%%"},
    },
    configmap("elsewhere", {"k": "v"}, namespace="other-team"),
]
URL = "http://configpin.test/mutate"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Scope:
    """Where configpin acts: `member` from memory, `confirm` past it (no cluster here)."""

    def __init__(
        self,
        member: Callable[[str], bool],
        confirm: Callable[[str, float], bool] = lambda _ns, _timeout: False,
    ) -> None:
        self.member = member
        self.confirm = confirm

    def __contains__(self, namespace: object) -> bool:
        return isinstance(namespace, str) and self.member(namespace)


@dataclass
class Server:
    client: httpx.AsyncClient
    lifecycle: Lifecycle
    metrics: Metrics
    admitter: Admitter

    async def mutate(self, body: JSONObject, **kw: Any) -> httpx.Response:
        return await self.client.post(URL, json=body, **kw)

    async def admit(self, body: JSONObject) -> dict[str, Any]:
        """POST a review that must be answered 200; return the AdmissionReview."""
        resp = await self.mutate(body)
        assert resp.status_code == 200, resp.text
        assert resp.headers["content-type"] == "application/json"
        out: dict[str, Any] = resp.json()
        return out

    async def still_serving(self) -> None:
        obj = workload("Deployment", reading("cfg", "a"))
        out = await self.admit(review(obj, uid="after"))
        assert out["response"]["uid"] == "after"
        assert out["response"]["allowed"] is True
        assert "patch" in out["response"]


def _server(
    *,
    strict: bool = False,
    mode: str = "checksum",
    max_body: int = MAX_BODY,
    sources: Any = None,
    snapshots: Any = None,
    ready_checks: Sequence[Callable[[], bool]] = (),
    in_scope: Callable[[str], bool] = lambda _ns: True,
    heavy_body: int | None = None,
) -> Server:
    metrics = Metrics()
    lifecycle = Lifecycle()
    admitter = Admitter(
        hkey=HKEY,
        sources=sources if sources is not None else FileSources(HKEY, SOURCES),
        metrics=metrics,
        settings=Settings(mode=mode, strict=strict),
        snapshots=snapshots,
        scope=Scope(in_scope),
    )
    extra = {} if heavy_body is None else {"heavy_body": heavy_body}
    app = create_app(
        admitter, lifecycle, metrics, ready_checks=ready_checks, max_body=max_body, **extra
    )
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app))
    return Server(client, lifecycle, metrics, admitter)


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    s = _server()
    async with s.client:
        yield s


@pytest.fixture
async def strict() -> AsyncIterator[Server]:
    s = _server(strict=True)
    async with s.client:
        yield s


def _patch(response: dict[str, Any]) -> list[dict[str, Any]]:
    assert response["patchType"] == "JSONPatch"
    ops: list[dict[str, Any]] = json.loads(base64.b64decode(response["patch"], validate=True))
    return ops


def _deployment(*env: JSONObject, volumes: Sequence[JSONObject] = ()) -> JSONObject:
    return workload("Deployment", pod_spec(container(env=env), volumes=volumes))


# ---- a good review ----


async def test_patch_is_base64_jsonpatch_and_applies(server: Server) -> None:
    obj = _deployment(env_cm("cfg", "a"), volumes=[vol_secret("creds")])
    out = await server.admit(review(obj, uid="u-1"))
    assert out["apiVersion"] == "admission.k8s.io/v1"
    assert out["kind"] == "AdmissionReview"
    resp = out["response"]
    assert resp["uid"] == "u-1" and resp["allowed"] is True
    assert "warnings" not in resp and "status" not in resp
    mutated = jsonpatch.apply_patch(obj, _patch(resp))
    assert recorded_sources(mutated) == {
        "configmap/cfg": digest.source_digest(NSKEY, record(SOURCES[0]), ["a"]),
        "secret/creds": digest.source_digest(NSKEY, record(SOURCES[1])),
    }
    assert spec_of(mutated) == spec_of(obj)


async def test_the_server_patch_equals_the_core_plan(server: Server) -> None:
    obj = _deployment(env_cm("cfg", "a"), env_secret("creds", "pass"))
    out = await server.admit(review(obj))
    assert _patch(out["response"]) == plan(obj, Store(SOURCES[:2])).patch


async def test_v1beta1_is_answered_in_kind(server: Server) -> None:
    obj = _deployment(env_cm("cfg", "a"))
    out = await server.admit(review(obj, uid="beta", api_version="admission.k8s.io/v1beta1"))
    assert out["apiVersion"] == "admission.k8s.io/v1beta1"
    assert out["kind"] == "AdmissionReview"
    assert out["response"]["uid"] == "beta"
    assert _patch(out["response"])


async def test_nothing_to_pin_is_allowed_without_patch(server: Server) -> None:
    out = await server.admit(review(_deployment()))
    assert out["response"] == {"uid": review(None)["request"]["uid"], "allowed": True}


async def test_an_already_stamped_object_gets_no_patch(server: Server) -> None:
    obj = _deployment(env_cm("cfg", "a"))
    first = await server.admit(review(obj))
    stamped = jsonpatch.apply_patch(obj, _patch(first["response"]))
    again = await server.admit(review(stamped, operation="UPDATE", old=stamped))
    assert "patch" not in again["response"] and again["response"]["allowed"] is True


@pytest.mark.parametrize("operation", ["DELETE", "CONNECT"])
async def test_delete_and_connect_are_allowed_without_patch(server: Server, operation: str) -> None:
    obj = _deployment(env_cm("cfg", "a"))
    body = review(None, operation=operation, old=obj, uid=f"op-{operation}")
    if operation == "CONNECT":
        body["request"]["object"] = {"kind": "PodExecOptions", "apiVersion": "v1"}
    out = await server.admit(body)
    assert out["response"] == {"uid": f"op-{operation}", "allowed": True}


async def test_kinds_it_does_not_handle_are_allowed_without_patch(server: Server) -> None:
    svc = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "web", "namespace": "team-a"},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]},
    }
    out = await server.admit(review(svc, uid="svc"))
    assert out["response"] == {"uid": "svc", "allowed": True}


async def test_subresource_requests_are_allowed_without_patch(server: Server) -> None:
    obj = workload("Deployment", reading("cfg", "a"))
    body = review(obj, operation="UPDATE", old=obj)
    body["request"]["subResource"] = "scale"
    out = await server.admit(body)
    assert "patch" not in out["response"]


async def test_pod_update_is_allowed_without_patch(server: Server) -> None:
    pod = workload("Pod", reading("cfg", "a"))
    out = await server.admit(review(pod, operation="UPDATE", old=pod))
    assert "patch" not in out["response"]


async def test_owned_pods_are_allowed_without_patch(server: Server) -> None:
    pod = workload("Pod", reading("cfg", "a"), owner="ReplicaSet")
    out = await server.admit(review(pod))
    assert "patch" not in out["response"]


async def test_sources_are_looked_up_in_the_request_namespace(server: Server) -> None:
    obj = _deployment(env_cm("elsewhere", "k"))
    here = await server.admit(review(obj, namespace="team-a"))
    assert any("configmap/elsewhere" in w for w in here["response"]["warnings"])
    moved = copy.deepcopy(obj)
    moved["metadata"]["namespace"] = "other-team"
    there = await server.admit(review(moved, namespace="other-team"))
    assert "warnings" not in there["response"] and _patch(there["response"])


# ---- scope: what the webhook configuration selects, enforced on the server too ----


@pytest.mark.parametrize(
    "where",
    [
        "not-selected",  # a namespace that never opted in
        "contradicting",  # the request names one namespace, the object another
        "none",  # no namespace at all
    ],
)
async def test_out_of_scope_reviews_get_nothing(where: str) -> None:
    writer = _Writer()
    s = _server(mode="snapshot", snapshots=writer, in_scope=lambda ns: ns == "team-a")
    async with s.client:
        obj = _deployment(env_cm("cfg", "a"), env_secret("no-such-secret", "k"))
        ns = {"not-selected": "other-team", "contradicting": "team-a", "none": ""}[where]
        if where == "contradicting":
            obj["metadata"]["namespace"] = "other-team"
        out = await s.admit(review(obj, namespace=ns, uid="u-out"))
        assert out["response"] == {"uid": "u-out", "allowed": True}  # no patch, no warning
        assert s.metrics.registry.get_sample_value("configpin_admissions_out_of_scope_total") == 1.0
        assert (
            s.metrics.registry.get_sample_value(
                "configpin_admissions_total",
                {"kind": "Deployment", "operation": "CREATE", "result": "out-of-scope"},
            )
            == 1.0
        )
    assert writer.calls == []  # no side effect


async def test_metric_labels_come_from_fixed_sets(server: Server) -> None:
    obj = _deployment(env_cm("cfg", "a"))
    body = review(obj, uid="u-odd")
    body["request"]["kind"]["kind"] = "Evil" + "x" * 100
    body["request"]["operation"] = "WHATEVER-" + "y" * 100
    await server.admit(body)
    samples = [
        s.labels
        for family in server.metrics.registry.collect()
        for s in family.samples
        if s.name == "configpin_admissions_total"
    ]
    assert samples == [{"kind": "other", "operation": "other", "result": "ignored"}]


# ---- warnings and strict mode ----


async def test_missing_required_source_warns_and_pins_the_rest(server: Server) -> None:
    obj = _deployment(env_cm("cfg", "a"), env_secret("no-such-secret", "k"))
    resp = (await server.admit(review(obj)))["response"]
    assert resp["allowed"] is True
    (warning,) = resp["warnings"]
    assert "secret/no-such-secret" in warning
    assert set(recorded_sources(jsonpatch.apply_patch(obj, _patch(resp)))) == {"configmap/cfg"}


async def test_only_a_missing_source_is_allowed_with_a_warning_and_an_empty_record(
    server: Server,
) -> None:
    resp = (await server.admit(review(_deployment(env_cm("nope", "k")))))["response"]
    assert resp["allowed"] is True
    ops = json.loads(base64.b64decode(resp["patch"]))
    assert [op["value"].get(ANN_SOURCES) for op in ops] == ["{}"]
    assert "configmap/nope" in resp["warnings"][0]


async def test_unreadable_source_is_allowed_unchanged_with_a_warning(server: Server) -> None:
    obj = _deployment(volumes=[vol_cm("broken")])
    resp = (await server.admit(review(obj)))["response"]
    assert resp["allowed"] is True and "patch" not in resp
    (warning,) = resp["warnings"]
    assert "configmap/broken" in warning
    await server.still_serving()


async def test_strict_mode_denies_a_missing_source(strict: Server) -> None:
    resp = (await strict.admit(review(_deployment(env_cm("nope", "k")), uid="s1")))["response"]
    assert resp["uid"] == "s1"
    assert resp["allowed"] is False and "patch" not in resp
    assert resp["status"]["code"] == 403
    assert "configmap/nope" in resp["status"]["message"]


async def test_strict_mode_denies_an_unreadable_source(strict: Server) -> None:
    resp = (await strict.admit(review(_deployment(volumes=[vol_cm("broken")]))))["response"]
    assert resp["allowed"] is False
    assert "configmap/broken" in resp["status"]["message"]
    await strict.still_serving()


async def test_strict_mode_still_patches_good_objects(strict: Server) -> None:
    obj = _deployment(env_cm("cfg", "a"))
    resp = (await strict.admit(review(obj, uid="good")))["response"]
    assert resp["uid"] == "good" and resp["allowed"] is True and "warnings" not in resp
    patched = jsonpatch.apply_patch(obj, _patch(resp))
    assert set(recorded_sources(patched)) == {"configmap/cfg"}


async def test_long_warnings_are_cut(server: Server) -> None:
    name = "n" * 600
    resp = (await server.admit(review(_deployment(env_cm(name, "k")))))["response"]
    (warning,) = resp["warnings"]
    assert len(warning) == MAX_WARNING and warning.endswith("...")


class _Exploding:
    """A source reader that fails in a way nobody planned for."""

    def peek(self, namespace: str, sid: SourceId) -> SourceRecord | Miss | None:
        raise RuntimeError("boom")

    def get(
        self, namespace: str, sid: SourceId, *, timeout: float | None = None
    ) -> SourceRecord | None:
        raise RuntimeError("boom")

    def get_object(self, namespace: str, sid: SourceId) -> JSONObject | None:
        raise RuntimeError("boom")


@pytest.mark.parametrize("is_strict", [False, True])
async def test_an_internal_error_admits_unchanged_unless_strict(
    is_strict: bool, caplog: pytest.LogCaptureFixture
) -> None:
    s = _server(strict=is_strict, sources=_Exploding())
    async with s.client:
        resp = (await s.admit(review(_deployment(env_cm("cfg", "a")), uid="e")))["response"]
    assert resp["uid"] == "e" and "patch" not in resp
    if is_strict:
        assert resp["allowed"] is False and resp["status"]["code"] == 500
    else:
        assert resp["allowed"] is True
        assert "admitted unchanged" in resp["warnings"][0]
    assert "boom" in caplog.text  # logged for the operator, not sent to the client
    assert "boom" not in json.dumps(resp)


class _SlowReader:
    """Answers nothing from memory: admission must read through (off the event loop)."""

    def __init__(self) -> None:
        self.files = FileSources(HKEY, SOURCES)
        self.reads = 0

    def peek(self, namespace: str, sid: SourceId) -> SourceRecord | Miss | None:
        return Miss()

    def get(
        self, namespace: str, sid: SourceId, *, timeout: float | None = None
    ) -> SourceRecord | None:
        self.reads += 1
        return self.files.get(namespace, sid)

    def get_object(self, namespace: str, sid: SourceId) -> JSONObject | None:
        return self.files.get_object(namespace, sid)


async def test_a_cache_miss_reads_through() -> None:
    reader = _SlowReader()
    s = _server(sources=reader)
    async with s.client:
        await s.still_serving()
    assert reader.reads == 1


class _Writer(RecordingWriter):
    def __init__(self, *, fail: bool = False) -> None:
        super().__init__()
        self.fail = fail

    def make(self, namespace: str, request: SnapshotRequest) -> None:
        if self.fail:
            raise RuntimeError("quota exceeded")


@pytest.mark.parametrize("dry_run", [False, True])
async def test_snapshot_mode_asks_for_the_copies_before_answering(dry_run: bool) -> None:
    writer = _Writer()
    s = _server(mode="snapshot", snapshots=writer)
    obj = _deployment(env_cm("cfg", "a"))
    async with s.client:
        resp = (await s.admit(review(obj, dry_run=dry_run)))["response"]
    ((namespace, requests, seen_dry_run),) = writer.calls
    assert namespace == "team-a" and seen_dry_run is dry_run
    (req,) = requests
    mutated = jsonpatch.apply_patch(obj, _patch(resp))
    assert (
        spec_of(mutated)["containers"][0]["env"][0]["valueFrom"]["configMapKeyRef"]["name"]
        == req.snapshot_name
    )


async def test_copies_known_to_exist_are_not_asked_for_again() -> None:
    class _Settled(_Writer):
        def settled(self, namespace: str, requests: Sequence[SnapshotRequest]) -> bool:
            return True

    asked, settled = _Writer(), _Settled()
    obj = _deployment(env_cm("cfg", "a"))
    answers = []
    for writer in (asked, settled):
        s = _server(mode="snapshot", snapshots=writer)
        async with s.client:
            answers.append((await s.admit(review(obj)))["response"])
    assert len(asked.calls) == 1 and settled.calls == []
    assert answers[0]["patch"] == answers[1]["patch"]  # the same decision, without the hop


@pytest.mark.parametrize("is_strict", [False, True])
async def test_failed_snapshot_copies_never_leave_a_dangling_reference(is_strict: bool) -> None:
    s = _server(mode="snapshot", snapshots=_Writer(fail=True), strict=is_strict)
    async with s.client:
        resp = (await s.admit(review(_deployment(env_cm("cfg", "a")))))["response"]
    assert "patch" not in resp
    assert resp["allowed"] is not is_strict
    text = json.dumps(resp)
    assert "snapshot copies could not be created" in text


# ---- bad input: a clear 4xx, and the server keeps serving ----


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"", "empty body"),
        (b"{not json", "not valid JSON"),
        (b"\xff\xfe\x00", "not valid JSON"),
        (b"[]", "not an AdmissionReview"),
        (b'"AdmissionReview"', "not an AdmissionReview"),
        (b'{"apiVersion": "v1", "kind": "Pod"}', "not an AdmissionReview"),
        (b'{"apiVersion": "admission.k8s.io/v2", "kind": "AdmissionReview"}', "apiVersion"),
        (b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}', "no request"),
        (
            b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {}}',
            "no uid",
        ),
        (
            b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":""}}',
            "no uid",
        ),
    ],
    ids=[
        "empty",
        "undecodable",
        "not-utf8",
        "array",
        "string",
        "other-kind",
        "unknown-version",
        "no-request",
        "missing-uid",
        "empty-uid",
    ],
)
async def test_malformed_reviews_get_400(server: Server, body: bytes, message: str) -> None:
    resp = await server.client.post(URL, content=body, headers={"content-type": "application/json"})
    assert resp.status_code == 400
    assert resp.headers["content-type"] == "application/json"
    assert message in resp.json()["error"]
    await server.still_serving()


@pytest.mark.parametrize(
    "content_type", [None, "text/plain", "application/yaml", "application/json-patch+json"]
)
async def test_wrong_content_type_gets_400(server: Server, content_type: str | None) -> None:
    body = json.dumps(review(_deployment(env_cm("cfg", "a")))).encode()
    headers = {} if content_type is None else {"content-type": content_type}
    resp = await server.client.post(URL, content=body, headers=headers)
    assert resp.status_code == 400
    assert "content type must be application/json" in resp.json()["error"]
    await server.still_serving()


async def test_json_content_type_with_parameters_is_accepted(server: Server) -> None:
    body = json.dumps(review(_deployment(env_cm("cfg", "a")))).encode()
    resp = await server.client.post(
        URL, content=body, headers={"content-type": "Application/JSON; charset=utf-8"}
    )
    assert resp.status_code == 200 and resp.json()["response"]["patch"]


async def test_body_over_7_mib_gets_413(server: Server) -> None:
    body = b" " * (MAX_BODY + 1)  # whitespace: it would even parse as far as it goes
    resp = await server.client.post(URL, content=body, headers={"content-type": "application/json"})
    assert resp.status_code == 413
    assert str(MAX_BODY) in resp.json()["error"]
    await server.still_serving()


async def test_body_of_exactly_7_mib_is_read(server: Server) -> None:
    doc = json.dumps(review(_deployment(env_cm("cfg", "a")))).encode()
    body = doc + b" " * (MAX_BODY - len(doc))
    assert len(body) == MAX_BODY
    resp = await server.client.post(URL, content=body, headers={"content-type": "application/json"})
    assert resp.status_code == 200 and resp.json()["response"]["patch"]


class _CountingBody:
    """A streamed request body that records how much of it the server pulled."""

    def __init__(self, chunks: int, size: int) -> None:
        self.total = chunks
        self.size = size
        self.sent = 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for _ in range(self.total):
            self.sent += 1
            yield b" " * self.size


async def test_declared_length_over_the_limit_is_refused_unread(server: Server) -> None:
    body = _CountingBody(chunks=8, size=1024 * 1024)  # 8 MiB, announced up front
    resp = await server.client.post(
        URL,
        content=body,
        headers={"content-type": "application/json", "content-length": str(8 * 1024 * 1024)},
    )
    assert resp.status_code == 413
    assert body.sent == 0
    await server.still_serving()


async def test_streamed_body_over_the_limit_is_cut_off() -> None:
    s = _server(max_body=4096)
    body = _CountingBody(chunks=100, size=1024)  # chunked: no Content-Length
    async with s.client:
        resp = await s.client.post(URL, content=body, headers={"content-type": "application/json"})
        assert resp.status_code == 413
        assert "4096" in resp.json()["error"]
        assert body.sent <= 5  # stopped at the limit, not read to the end
        await s.still_serving()


async def test_a_small_limit_still_admits_small_bodies() -> None:
    s = _server(max_body=64 * 1024)
    async with s.client:
        await s.still_serving()


async def test_only_post_is_served_on_mutate(server: Server) -> None:
    assert (await server.client.get(URL)).status_code == 405
    await server.still_serving()


# ---- health, readiness, metrics ----


async def test_healthz(server: Server) -> None:
    resp = await server.client.get("http://configpin.test/healthz")
    assert resp.status_code == 200 and resp.text == "ok"


async def test_readyz_follows_the_lifecycle(server: Server) -> None:
    async def ready() -> int:
        return (await server.client.get("http://configpin.test/readyz")).status_code

    assert await ready() == 503  # not listening yet
    server.lifecycle.mark_started()
    assert await ready() == 200
    server.lifecycle.begin_shutdown()
    assert await ready() == 503
    # liveness is not readiness
    assert (await server.client.get("http://configpin.test/healthz")).status_code == 200


async def test_readyz_waits_for_every_check() -> None:
    synced = {"cache": False}
    s = _server(ready_checks=[lambda: synced["cache"]])
    s.lifecycle.mark_started()
    async with s.client:
        assert (await s.client.get("http://configpin.test/readyz")).status_code == 503
        synced["cache"] = True
        assert (await s.client.get("http://configpin.test/readyz")).status_code == 200


def _metric(text: str, name: str, **labels: str) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    prefix = f"{name}{{{want}}} " if labels else f"{name} "
    for line in text.splitlines():
        if line.startswith(prefix):
            return float(line[len(prefix) :])
    raise AssertionError(f"no {prefix!r} in metrics:\n{text}")


async def test_metrics_count_admissions_and_bad_requests(server: Server) -> None:
    await server.still_serving()
    await server.admit(review(_deployment(env_cm("nope", "k"))))
    await server.admit(review(None, operation="DELETE", old=_deployment()))
    await server.client.post(URL, content=b"", headers={"content-type": "application/json"})
    await server.client.post(URL, content=b"{}", headers={"content-type": "text/plain"})
    resp = await server.client.get("http://configpin.test/metrics")
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/plain")
    text = resp.text
    # the missing source's Deployment is patched too: with its (empty) record
    patched = _metric(
        text, "configpin_admissions_total", kind="Deployment", operation="CREATE", result="patched"
    )
    assert patched == 2.0
    assert (
        _metric(
            text,
            "configpin_admissions_total",
            kind="Deployment",
            operation="DELETE",
            result="ignored",
        )
        == 1.0
    )
    assert _metric(text, "configpin_bad_requests_total", code="400") == 2.0
    assert _metric(text, "configpin_admission_warnings_total") == 1.0
    assert _metric(text, "configpin_admission_duration_seconds_count") == 3.0


def test_every_app_has_its_own_metrics() -> None:
    a, b = _server(), _server()
    assert a.metrics.registry is not b.metrics.registry


# ---- helpers used above stay honest ----


def test_review_builder_matches_the_wire_format() -> None:
    body = review(_deployment(), uid="x")
    req = body["request"]
    assert req["kind"] == {"group": "apps", "version": "v1", "kind": "Deployment"}
    assert req["namespace"] == "team-a" and req["operation"] == "CREATE"


def test_annotation_names() -> None:
    # the names the chart and the docs use
    assert (ANN_CHECKSUM, ANN_SOURCES) == ("configpin.io/checksum", "configpin.io/sources")


class _HangingReader(_SlowReader):
    """An API server that answers every read after `delay` seconds, honouring the timeout."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay = delay
        self.timeouts: list[float | None] = []

    def get(
        self, namespace: str, sid: SourceId, *, timeout: float | None = None
    ) -> SourceRecord | None:
        self.timeouts.append(timeout)
        if timeout is not None and timeout < self.delay:
            time.sleep(timeout)
            raise SourceUnavailable("timed out")
        time.sleep(self.delay)
        return super().get(namespace, sid, timeout=timeout)


@pytest.mark.parametrize("is_strict", [False, True])
async def test_reads_past_the_cache_end_at_the_deadline(is_strict: bool) -> None:
    reader = _HangingReader(delay=5.0)
    s = _server(sources=reader, strict=is_strict)
    s.admitter.admission.read_deadline = 0.3
    obj = _deployment(env_cm("cfg", "a"), env_secret("creds", "pass"))
    async with s.client:
        start = time.monotonic()
        resp = (await s.admit(review(obj, uid="slow")))["response"]
        took = time.monotonic() - start
    assert took < 1.5, "answered while the API server still waits"
    assert "patch" not in resp
    if is_strict:
        assert resp["allowed"] is False
    else:
        # Whichever comes first, the deadline of the whole read or of the GET it bounds:
        # admitted unchanged, with a warning that says why.
        assert resp["allowed"] and resp["warnings"]
        assert all("not read" in w or "could not be read" in w for w in resp["warnings"])
    assert all(t is not None and t <= 0.3 for t in reader.timeouts), "each read is bounded"


async def test_reads_past_the_cache_have_a_bounded_queue() -> None:
    reader = _HangingReader(delay=0.5)
    s = _server(sources=reader)
    s.admitter.admission.read_deadline = 1.0
    obj = _deployment(env_cm("cfg", "a"))
    async with s.client:
        answers = await asyncio.gather(
            *(s.admit(review(obj, uid=f"q{i}")) for i in range(s.admitter.admission.read_slots + 4))
        )
    busy = [a for a in answers if "busy" in " ".join(a["response"].get("warnings", []))]
    assert len(busy) >= 4


@pytest.mark.parametrize("confirmed", [True, False])
async def test_a_namespace_memory_does_not_know_is_confirmed_off_the_loop(
    confirmed: bool,
) -> None:
    asked: list[tuple[str, float]] = []

    def confirm(namespace: str, timeout: float) -> bool:
        asked.append((namespace, timeout))
        return confirmed

    s = _server(in_scope=lambda _ns: False)
    s.admitter.admission.scope = Scope(lambda _ns: False, confirm)
    async with s.client:
        resp = (await s.admit(review(_deployment(env_cm("cfg", "a")))))["response"]
    assert asked == [("team-a", s.admitter.admission.read_deadline)]
    assert ("patch" in resp) is confirmed


# ---- hostile and heavy input ----


async def test_warnings_are_capped_to_what_the_api_server_keeps(server: Server) -> None:
    # 100 missing sources (as many as one object may name), each named at length: far more
    # than the 4 KiB of warnings the API server keeps, 256 characters each.
    refs = [env_cm(f"missing-{i}-{'x' * 60}", "k", var=f"V{i}") for i in range(100)]
    resp = (await server.admit(review(_deployment(*refs))))["response"]
    warnings = resp["warnings"]
    assert all(len(w.encode()) <= MAX_WARNING for w in warnings)
    assert sum(len(w.encode()) for w in warnings) <= MAX_WARNINGS_TOTAL
    assert "configmap/missing-0-xxx" in warnings[0] and "not found" in warnings[0]
    assert warnings[-1].startswith("... and ") and "more warnings" in warnings[-1]
    shown = len(warnings) - 1
    assert int(warnings[-1].split()[2]) == 100 - shown


def test_warnings_within_the_budget_are_kept_whole() -> None:
    few = ["a" * 200] * 20  # 4,000 bytes: fits without a summary
    assert capped_warnings(few) == few
    assert capped_warnings(["é" * 200]) == ["é" * 126 + "..."]  # 256 bytes, not characters


@pytest.mark.parametrize("encoding", ["gzip", "br", "deflate", "gzip, identity", "x-custom"])
async def test_a_content_encoding_other_than_identity_gets_415(
    server: Server, encoding: str
) -> None:
    body = json.dumps(review(_deployment(env_cm("cfg", "a")))).encode()
    resp = await server.client.post(
        URL,
        content=body,
        headers={"content-type": "application/json", "content-encoding": encoding},
    )
    assert resp.status_code == 415
    assert encoding in resp.json()["error"]
    await server.still_serving()


async def test_identity_content_encoding_is_accepted(server: Server) -> None:
    body = json.dumps(review(_deployment(env_cm("cfg", "a")))).encode()
    resp = await server.client.post(
        URL,
        content=body,
        headers={"content-type": "application/json", "content-encoding": "identity"},
    )
    assert resp.status_code == 200 and "patch" in resp.json()["response"]


def _set(path: str, value: Any) -> Callable[[JSONObject], None]:
    """A mutation of a review's request: set the field at a dotted path (ints index lists)."""

    def mutate(request: JSONObject) -> None:
        *parents, last = [int(p) if p.isdigit() else p for p in path.split(".")]
        here: Any = request
        for p in parents:
            here = here[p]
        here[last] = value

    return mutate


WRONG_TYPES = [
    ("object.metadata", "a string"),
    ("object.metadata.annotations", ["x"]),
    ("object.metadata.labels.app", 5),
    ("object.metadata.ownerReferences", {"controller": True}),
    ("object.spec.template", 7),
    ("object.spec.template.metadata.annotations", "x"),
    ("object.spec.template.spec.volumes", 12),
    ("object.spec.template.spec.volumes.0.configMap.items", "k"),
    ("object.spec.template.spec.volumes.0.configMap.optional", "true"),
    ("object.spec.template.spec.containers", {"name": "app"}),
    ("object.spec.template.spec.containers.0.env", 3.5),
    ("object.spec.template.spec.containers.0.env.0.valueFrom", "cfg"),
    ("object.spec.template.spec.containers.0.env.0.valueFrom.configMapKeyRef.name", 1),
    ("object.spec.template.spec.containers.0.envFrom.0.secretRef", ["creds"]),
    ("oldObject.metadata.annotations", 1),
    ("operation", 1),
    ("kind", "Deployment"),
    ("dryRun", "no"),
]


def _typed_review() -> JSONObject:
    obj = workload(
        "Deployment",
        pod_spec(
            container(env=[env_cm("cfg", "a")], env_from=[{"secretRef": {"name": "creds"}}]),
            volumes=[vol_cm("cfg", items=["a"])],
        ),
    )
    return review(obj, operation="UPDATE", old=json.loads(json.dumps(obj)))


@pytest.mark.parametrize(("path", "value"), WRONG_TYPES, ids=[p for p, _ in WRONG_TYPES])
async def test_a_field_of_the_wrong_type_is_named_never_an_internal_error(
    server: Server, path: str, value: Any
) -> None:
    body = _typed_review()
    _set(path, value)(body["request"])
    resp = (await server.admit(body))["response"]
    assert resp["allowed"] is True and "patch" not in resp
    (warning,) = resp["warnings"]
    expected = path.replace(".0", "[0]")
    assert warning.startswith(f"malformed request: {expected}: expected "), warning
    assert "internally" not in warning
    results = {
        s.labels["result"]
        for m in server.metrics.registry.collect()
        if m.name == "configpin_admissions"
        for s in m.samples
        if s.name == "configpin_admissions_total"
    }
    assert results == {"invalid"}


async def test_strict_mode_denies_a_field_of_the_wrong_type_as_bad_request(strict: Server) -> None:
    body = _typed_review()
    _set("object.spec.template.spec.volumes", 12)(body["request"])
    resp = (await strict.admit(body))["response"]
    assert resp["allowed"] is False
    assert resp["status"]["code"] == 400 and resp["status"]["reason"] == "BadRequest"
    assert "object.spec.template.spec.volumes: expected a list" in resp["status"]["message"]


async def test_a_heavy_review_is_answered_as_a_light_one() -> None:
    obj = _deployment(env_cm("cfg", "a"), env_secret("creds", "pass"))
    light, heavy = _server(), _server(heavy_body=0)
    wrong = copy.deepcopy(obj)
    wrong["spec"]["template"]["spec"]["volumes"] = 5
    try:
        async with light.client, heavy.client:
            a = (await light.admit(review(obj)))["response"]
            b = (await heavy.admit(review(obj)))["response"]
            bad = await heavy.client.post(URL, content=b"{", headers={"content-type": JSON})
            invalid = (await heavy.admit(review(wrong)))["response"]
            deleted = (await heavy.admit(review(None, operation="DELETE", old=obj)))["response"]
    finally:
        heavy.admitter.close()
    assert a == b and "patch" in a
    assert invalid["warnings"] == [
        "malformed request: object.spec.template.spec.volumes: expected a list, got a number;"
        " admitted unchanged"
    ]
    assert deleted == {"uid": review(None)["request"]["uid"], "allowed": True}
    assert heavy.metrics.registry.get_sample_value("configpin_heavy_reviews_total") == 4
    assert light.metrics.registry.get_sample_value("configpin_heavy_reviews_total") == 0
    assert bad.status_code == 400


async def test_a_heavy_source_write_is_answered_as_a_light_one() -> None:
    """A ConfigMap of 1 MiB (what etcd stores, about) updated: decided in the worker, the
    same answer as in the serving process (the signed record of who changed it, as `admin`,
    for the same content), and a deletion or a write of an ignored one says nothing."""
    big = "x" * (1 << 20)
    old = configmap("web", {"a": big, "b": "1"}, namespace="shop")
    new = configmap("web", {"a": big, "b": "2"}, namespace="shop")
    quiet = configmap("q", {"a": "1"}, namespace="shop", annotations={ANN_IGNORE: "true"})
    light, heavy = _server(), _server(heavy_body=0)
    try:
        async with light.client, heavy.client:
            a = (await light.admit(review(new, operation="UPDATE", old=old)))["response"]
            b = (await heavy.admit(review(new, operation="UPDATE", old=old)))["response"]
            gone = (await heavy.admit(review(None, operation="DELETE", old=old)))["response"]
            skip = (await heavy.admit(review(quiet, operation="UPDATE", old=quiet)))["response"]
    finally:
        heavy.admitter.close()

    def recorded(resp: JSONObject) -> tuple[str, str]:
        [op] = json.loads(base64.b64decode(resp["patch"]))
        assert op["path"] == "/metadata/annotations"
        body = json.loads(op["value"][ANN_CHANGED_BY])
        return body["user"], body["content"]

    assert recorded(a) == recorded(b) and recorded(a)[0] == "admin"
    assert "patch" not in gone and "warnings" not in gone
    assert "patch" not in skip and "warnings" not in skip
    assert heavy.metrics.registry.get_sample_value("configpin_heavy_reviews_total") == 3


class _Blocking:
    """A source reader whose reads wait until the test lets them go."""

    def __init__(self) -> None:
        self.files = FileSources(HKEY, SOURCES)
        self.entered = threading.Event()
        self.release = threading.Event()

    def peek(self, namespace: str, sid: SourceId) -> SourceRecord | Miss | None:
        self.entered.set()
        assert self.release.wait(10)
        return self.files.peek(namespace, sid)

    def get(
        self, namespace: str, sid: SourceId, *, timeout: float | None = None
    ) -> SourceRecord | None:
        self.entered.set()
        assert self.release.wait(10)
        return self.files.get(namespace, sid)

    def get_object(self, namespace: str, sid: SourceId) -> JSONObject | None:
        return self.files.get_object(namespace, sid)


async def test_health_and_other_admissions_do_not_wait_for_a_heavy_review() -> None:
    blocking = _Blocking()
    s = _server(sources=blocking, heavy_body=10_000)
    async with s.client:
        pad = {"padding": "x" * 20_000}
        big = _deployment(env_cm("cfg", "a"))
        big["metadata"]["annotations"] = pad
        heavy = asyncio.create_task(s.mutate(review(big, uid="heavy")))
        # a thread's Event, not the loop's: the planner sets it from a worker thread
        assert await asyncio.to_thread(blocking.entered.wait, 10)
        # The heavy review waits for its sources (read in a thread): the loop is free.
        assert (await s.client.get("http://configpin.test/healthz")).status_code == 200
        assert (await s.client.get("http://configpin.test/readyz")).status_code in (200, 503)
        assert not heavy.done()
        blocking.release.set()
        resp = await heavy
    s.admitter.close()
    assert resp.status_code == 200 and resp.json()["response"]["uid"] == "heavy"


# ---- two webhooks, each at its own path, one transport ----

SOURCES_URL = "http://configpin.test/sources"
PATHS = ["/mutate", "/sources"]


def _source_update(name: str = "cfg", **kw: Any) -> JSONObject:
    """A ConfigMap UPDATE (key `a` changed) as the API server sends it to the sources entry."""
    old = configmap(name, {"a": "1"}, namespace="team-a", **kw)
    new = configmap(name, {"a": "2"}, namespace="team-a", **kw)
    return review(new, operation="UPDATE", old=old)


def _requests(metrics: Metrics, path: str) -> float:
    return metrics.registry.get_sample_value("configpin_webhook_requests_total", {"path": path})


async def test_a_source_write_is_answered_at_its_own_path_and_at_mutate_for_one_release(
    server: Server,
) -> None:
    """The chart's sources entry posts to /sources; an older chart's posts to /mutate, which
    answers it the same (kept for one release). Each path counts what it received."""
    at_sources = await server.client.post(SOURCES_URL, json=_source_update())
    at_mutate = await server.client.post(URL, json=_source_update())
    assert at_sources.status_code == at_mutate.status_code == 200, at_sources.text
    answer = at_sources.json()["response"]
    [op] = _patch(answer)
    assert op["path"] == "/metadata/annotations" and ANN_CHANGED_BY in op["value"]
    assert at_mutate.json()["response"].keys() == answer.keys()
    [legacy] = _patch(at_mutate.json()["response"])
    assert json.loads(legacy["value"][ANN_CHANGED_BY])["user"] == "admin"
    assert _requests(server.metrics, "/sources") == 1
    assert _requests(server.metrics, "/mutate") == 1
    assert (
        server.metrics.registry.get_sample_value(
            "configpin_admissions_total",
            {"kind": "ConfigMap", "operation": "UPDATE", "result": "patched"},
        )
        == 2
    )


async def test_what_is_not_a_source_write_is_allowed_unchanged_at_sources(server: Server) -> None:
    """/sources acts on ConfigMap and Secret writes only: a workload /mutate would patch, a
    CREATE of a ConfigMap, a write of a subresource are allowed unchanged there, and counted
    (`ignored`)."""
    deployment = review(_deployment(env_cm("cfg", "a")))
    created = review(configmap("cfg", {"a": "1"}, namespace="team-a"))
    status = _source_update()
    status["request"]["subResource"] = "status"
    for body in (deployment, created, status):
        resp = await server.client.post(SOURCES_URL, json=body)
        assert resp.status_code == 200
        assert resp.json()["response"] == {"uid": body["request"]["uid"], "allowed": True}
    assert "patch" in (await server.admit(deployment))["response"]  # (at /mutate: pinned)
    ignored = {
        (s.labels["kind"], s.labels["operation"])
        for m in server.metrics.registry.collect()
        if m.name == "configpin_admissions"
        for s in m.samples
        if s.name == "configpin_admissions_total" and s.labels["result"] == "ignored"
    }
    assert ignored == {("Deployment", "CREATE"), ("ConfigMap", "CREATE"), ("ConfigMap", "UPDATE")}
    assert _requests(server.metrics, "/sources") == 3


async def test_a_source_write_out_of_scope_gets_nothing_at_sources() -> None:
    s = _server(in_scope=lambda ns: ns != "team-a")
    async with s.client:
        body = _source_update()
        resp = (await s.client.post(SOURCES_URL, json=body)).json()["response"]
    assert resp == {"uid": body["request"]["uid"], "allowed": True}
    assert s.metrics.registry.get_sample_value("configpin_admissions_out_of_scope_total") == 1


@pytest.mark.parametrize("route", PATHS)
async def test_bad_input_is_answered_alike_at_every_path(route: str) -> None:
    """One transport for both webhooks: the same 400, 405, 413 and 415, counted alike."""
    s = _server(max_body=4096)
    url = f"http://configpin.test{route}"
    good = json.dumps(_source_update()).encode()
    cases = [
        (b"", {"content-type": JSON}, 400, "empty body"),
        (b"{not json", {"content-type": JSON}, 400, "not valid JSON"),
        (b'{"apiVersion": "v1", "kind": "Pod"}', {"content-type": JSON}, 400, "AdmissionReview"),
        (good, {"content-type": "text/plain"}, 400, "content type must be application/json"),
        (good, {"content-type": JSON, "content-encoding": "gzip"}, 415, "gzip"),
        (b" " * 5000, {"content-type": JSON}, 413, "4096"),
    ]
    async with s.client:
        for body, headers, code, message in cases:
            resp = await s.client.post(url, content=body, headers=headers)
            assert resp.status_code == code, (code, resp.text)
            assert message in resp.json()["error"]
        streamed = _CountingBody(chunks=100, size=1024)  # no Content-Length: cut off
        resp = await s.client.post(url, content=streamed, headers={"content-type": JSON})
        assert resp.status_code == 413 and streamed.sent <= 5
        assert (await s.client.get(url)).status_code == 405
        assert (await s.client.post(url, content=good, headers={"content-type": JSON})).is_success
    count = s.metrics.registry.get_sample_value
    assert count("configpin_bad_requests_total", {"code": "400"}) == 4
    assert count("configpin_bad_requests_total", {"code": "413"}) == 2
    assert count("configpin_bad_requests_total", {"code": "415"}) == 1
    assert _requests(s.metrics, route) == len(cases) + 2


async def test_a_heavy_review_at_sources_is_taken_in_by_the_one_intake() -> None:
    """In the worker process as in the serving process, at /sources as at /mutate: a source
    write is previewed and recorded, a write of its subresource is left alone, and a
    workload is pinned at /mutate only."""
    light, heavy = _server(), _server(heavy_body=0)
    status = _source_update()
    status["request"]["subResource"] = "status"
    bodies = [_source_update(), status, review(_deployment(env_cm("cfg", "a")))]
    try:
        async with light.client, heavy.client:
            for route in PATHS:
                url = f"http://configpin.test{route}"
                for body in bodies:
                    a = (await light.client.post(url, json=body)).json()["response"]
                    b = (await heavy.client.post(url, json=body)).json()["response"]
                    if "patch" in a:  # (the record's time differs)
                        assert "patch" in b and len(_patch(a)) == len(_patch(b))
                        a.pop("patch"), b.pop("patch")
                    assert a == b, (route, body["request"].get("subResource"), a, b)
                status_answer = (await heavy.client.post(url, json=status)).json()["response"]
                assert status_answer == {"uid": status["request"]["uid"], "allowed": True}
    finally:
        heavy.admitter.close()
    assert heavy.metrics.registry.get_sample_value("configpin_heavy_reviews_total") == 8


@pytest.mark.parametrize(
    "body",
    [
        _source_update(),
        {**_source_update(), "request": {**_source_update()["request"], "subResource": "status"}},
        review(None, operation="DELETE", old=configmap("cfg", {"a": "1"}, namespace="team-a")),
        review(configmap("cfg", {"a": "1"}, namespace="team-a")),
        review(_deployment(env_cm("cfg", "a"))),
        review(None, operation="DELETE", old=_deployment()),
        {
            **review(_deployment()),
            "request": {**review(_deployment())["request"], "subResource": "scale"},
        },
    ],
    ids=["update", "status", "delete", "create", "workload", "workload-delete", "scale"],
)
def test_the_worker_takes_a_review_in_as_the_serving_process_does(body: JSONObject) -> None:
    """One intake, run where the review is parsed: the large-review worker's verdict is the
    serving process's (it once skipped the subresource check, left to a second look)."""
    raw = json.dumps(body).encode()
    prepared = large.prepare(raw, HKEY)
    assert prepared.outcome == "taken"
    assert prepared.intake is intake(parse_review(raw))
    assert (prepared.write is not None) == (prepared.intake is Intake.SOURCE)
