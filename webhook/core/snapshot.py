"""The immutable copy of a ConfigMap or Secret that snapshot mode points pods at."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from webhook.core.constants import LABEL_SNAPSHOT, LABEL_SOURCE
from webhook.core.model import JSONObject, SourceKind


def snapshot_object(kind: SourceKind, source: Mapping[str, Any], name: str) -> JSONObject:
    """Same data, `immutable: true`, the snapshot labels; Secrets keep their type.

    Only content is copied: none of the source's annotations or labels (they may carry
    tooling state such as last-applied-configuration, which can hold the values again), and
    no ownerReferences (the copy's owners are the revisions that use it).
    """
    meta = source.get("metadata") or {}
    out: JSONObject = {
        "apiVersion": "v1",
        "kind": kind.api_kind,
        "metadata": {
            "name": name,
            "labels": {LABEL_SNAPSHOT: "true", LABEL_SOURCE: str(meta.get("name", ""))},
        },
        "immutable": True,
    }
    if meta.get("namespace"):
        out["metadata"]["namespace"] = meta["namespace"]
    if kind is SourceKind.CONFIGMAP:
        for field in ("data", "binaryData"):
            if source.get(field):
                out[field] = copy.deepcopy(source[field])
    else:
        out["type"] = source.get("type") or "Opaque"
        if source.get("data"):
            out["data"] = copy.deepcopy(source["data"])
        if source.get("stringData"):
            out["stringData"] = copy.deepcopy(source["stringData"])
    return out
