"""The immutable copy of a ConfigMap or Secret that snapshot mode points pods at."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from webhook.core.constants import (
    ANN_SIGNATURE,
    ANN_SOURCE,
    LABEL_SNAPSHOT,
    LABEL_SOURCE,
    MAX_LABEL_VALUE,
)
from webhook.core.model import JSONObject, SourceKind


def snapshot_object(
    kind: SourceKind,
    source: Mapping[str, Any],
    name: str,
    *,
    signature: str,
    namespace: str | None = None,
) -> JSONObject:
    """Same data, `immutable: true`, the snapshot label, the source's name and the signature
    (webhook.core.digest.copy_signature); Secrets keep their type.

    The source's full name is in the annotation `configpin.io/source`; the label of the same
    name is added only where the name fits a label value (63 characters), for selecting.
    Only content is copied: none of the source's annotations or labels (they may carry
    tooling state such as last-applied-configuration, which can hold the values again), and
    no ownerReferences (the copy's owners are the revisions that use it).
    """
    meta = source.get("metadata") or {}
    source_name = str(meta.get("name", ""))
    labels = {LABEL_SNAPSHOT: "true"}
    if len(source_name) <= MAX_LABEL_VALUE:
        labels[LABEL_SOURCE] = source_name
    out: JSONObject = {
        "apiVersion": kind.facts.api_version,
        "kind": kind.api_kind,
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {ANN_SOURCE: source_name, ANN_SIGNATURE: signature},
        },
        "immutable": True,
    }
    if namespace or meta.get("namespace"):
        out["metadata"]["namespace"] = namespace or meta["namespace"]
    facts = kind.facts
    if facts.default_type is not None:
        out["type"] = source.get("type") or facts.default_type
    for field, _, _ in facts.content:
        if source.get(field):
            out[field] = copy.deepcopy(source[field])
    return out
