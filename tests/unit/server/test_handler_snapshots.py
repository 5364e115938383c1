"""Admission in snapshot mode when the cache is a step behind the cluster."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import jsonpatch

from harness.builders import RecordingWriter
from webhook.core.digest import namespace_key, record_from_object, source_digest
from webhook.core.model import JSONObject, SnapshotRequest, SourceId, SourceKind, SourceRecord
from webhook.inputs.sources import Miss
from webhook.process.config import Settings
from webhook.process.metrics import Metrics
from webhook.server.admission import parse_review
from webhook.server.handler import Admitter

KEY = b"0123456789abcdef0123456789abcdef"


def _cm(value: str) -> JSONObject:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "cfg"},
        "data": {"a": value},
    }


class LaggingReader:
    """Memory says v1 (the watch has not delivered the update); the API server has v2."""

    def __init__(self) -> None:
        self.memory = record_from_object(KEY, SourceKind.CONFIGMAP, _cm("v1"))
        self.server = _cm("v2")

    def peek(self, namespace: str, sid: SourceId) -> SourceRecord | Miss | None:
        return self.memory if sid.name == "cfg" else None

    def get(
        self, namespace: str, sid: SourceId, *, timeout: float | None = None
    ) -> SourceRecord | None:
        found = self.peek(namespace, sid)
        assert not isinstance(found, Miss)
        return found

    def get_object(self, namespace: str, sid: SourceId) -> JSONObject | None:
        return self.server if sid.name == "cfg" else None


class CheckingWriter(RecordingWriter):
    """Like the real writer: never makes a copy whose name lies about its content."""

    def __init__(self, reader: LaggingReader) -> None:
        super().__init__()
        self.reader = reader

    def make(self, namespace: str, request: SnapshotRequest) -> None:
        current = record_from_object(KEY, SourceKind.CONFIGMAP, self.reader.server)
        if source_digest(namespace_key(KEY, namespace), current) != request.content_digest:
            raise RuntimeError(f"{request.source} changed while the admission was being decided")


def _review(obj: dict[str, Any]) -> bytes:
    return json.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "u1",
                "kind": {"group": "apps", "version": "v1", "kind": "Deployment"},
                "operation": "CREATE",
                "namespace": "ns",
                "object": obj,
            },
        }
    ).encode()


def test_a_stale_cache_is_corrected_by_fresh_reads_not_admitted_unchanged() -> None:
    reader = LaggingReader()
    writer = CheckingWriter(reader)
    admitter = Admitter(
        hkey=KEY,
        sources=reader,
        metrics=Metrics(),
        settings=Settings(mode="snapshot"),
        snapshots=writer,
    )
    container = {"name": "c", "image": "x", "envFrom": [{"configMapRef": {"name": "cfg"}}]}
    obj = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {"template": {"metadata": {}, "spec": {"containers": [container]}}},
    }
    out = asyncio.run(admitter.review(parse_review(_review(obj))))
    response = out["response"]
    assert response["allowed"] and "warnings" not in response
    patched = jsonpatch.apply_patch(obj, json.loads(base64.b64decode(response["patch"])))
    name = patched["spec"]["template"]["spec"]["containers"][0]["envFrom"][0]["configMapRef"][
        "name"
    ]
    assert writer.made == [name]  # the copy of v2, the content the API server has now
    v2 = record_from_object(KEY, SourceKind.CONFIGMAP, _cm("v2"))
    assert name == f"cfg-{source_digest(namespace_key(KEY, 'ns'), v2)[:10]}"
