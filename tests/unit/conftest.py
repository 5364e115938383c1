"""Builders shared by the unit tests: sources, pod specs, workloads of every kind, reviews.

Everything here returns plain dicts shaped like what the API server sends, so a test reads
as the manifest it is about. The builders of sources, pod specs and workloads, the in-memory
`Store`, `plan` and `apply` live in harness/builders.py (the benches use them too) and are
offered here under the same names; what only the tests need is below.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any, Final

import pytest

from harness.builders import (
    ALL,
    HKEY,
    NSKEY,
    WORKLOAD_NAMESPACE,
    Store,
    admitted,
    apply,
    b64,
    configmap,
    container,
    env_cm,
    env_secret,
    envfrom_cm,
    envfrom_secret,
    plan,
    pod_spec,
    proj_cm,
    proj_secret,
    reading,
    record,
    secret,
    source_id,
    vol_cm,
    vol_projected,
    vol_secret,
    workload,
)
from webhook.core.constants import ANN_CHECKSUM, ANN_SOURCES
from webhook.core.kinds import BUILTIN_KINDS, template_paths
from webhook.core.model import JSONObject
from webhook.core.refs import get_path

__all__ = [
    "ALL",
    "HKEY",
    "MUTABLE_TEMPLATE_KINDS",
    "NSKEY",
    "OTHER_KEY",
    "WORKLOAD_KINDS",
    "WORKLOAD_NAMESPACE",
    "Store",
    "admitted",
    "apply",
    "b64",
    "configmap",
    "container",
    "env_cm",
    "env_secret",
    "envfrom_cm",
    "envfrom_secret",
    "merge_patch",
    "plan",
    "pod_spec",
    "proj_cm",
    "proj_secret",
    "reading",
    "record",
    "recorded_checksum",
    "recorded_sources",
    "review",
    "secret",
    "source_id",
    "spec_of",
    "template_annotations",
    "template_meta_of",
    "vol_cm",
    "vol_projected",
    "vol_secret",
    "workload",
]

OTHER_KEY: Final = b"fedcba9876543210fedcba9876543210"

# From the one table of kinds (webhook/core/kinds.py): what admission pins, and of those the
# kinds whose pod template may change after creation (UPDATE is planned like CREATE).
WORKLOAD_KINDS: Final = tuple(k.kind for k in BUILTIN_KINDS if k.admitted)
MUTABLE_TEMPLATE_KINDS: Final = tuple(k.kind for k in BUILTIN_KINDS if k.admitted and k.rolls)

# ---- reading what a plan made ----


def template_meta_of(obj: Mapping[str, Any]) -> JSONObject:
    paths = template_paths(str(obj["kind"]))
    assert paths is not None
    meta = get_path(obj, paths[0])
    return meta if isinstance(meta, dict) else {}


def spec_of(obj: Mapping[str, Any]) -> JSONObject:
    paths = template_paths(str(obj["kind"]))
    assert paths is not None
    spec = get_path(obj, paths[1])
    assert isinstance(spec, dict)
    return spec


def template_annotations(obj: Mapping[str, Any]) -> dict[str, str]:
    return dict(template_meta_of(obj).get("annotations") or {})


def recorded_sources(obj: Mapping[str, Any]) -> dict[str, str]:
    """The `configpin.io/sources` mapping on the template ({} if none)."""
    text = template_annotations(obj).get(ANN_SOURCES)
    return {} if text is None else dict(json.loads(text))


def recorded_checksum(obj: Mapping[str, Any]) -> str | None:
    return template_annotations(obj).get(ANN_CHECKSUM)


def merge_patch(target: Any, patch: Any) -> Any:
    """`patch` applied to `target` as an RFC 7386 JSON merge patch (the input is untouched)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


# ---- admission reviews ----


def review(
    obj: JSONObject | None,
    *,
    operation: str = "CREATE",
    uid: str = "705ab4f5-6393-11e8-b7cc-42010a800002",
    api_version: str = "admission.k8s.io/v1",
    namespace: str | None = None,
    old: JSONObject | None = None,
    dry_run: bool = False,
) -> JSONObject:
    """An AdmissionReview request as the API server sends it."""
    kind = str((obj or old or {}).get("kind", "Pod"))
    api = str((obj or old or {}).get("apiVersion", "v1"))
    group, _, version = api.rpartition("/")
    meta = (obj or old or {}).get("metadata") or {}
    request: JSONObject = {
        "uid": uid,
        "kind": {"group": group, "version": version, "kind": kind},
        "resource": {"group": group, "version": version, "resource": kind.lower() + "s"},
        "requestKind": {"group": group, "version": version, "kind": kind},
        "name": meta.get("name", ""),
        "namespace": namespace if namespace is not None else meta.get("namespace", "default"),
        "operation": operation,
        "userInfo": {"username": "admin", "groups": ["system:authenticated"]},
        "object": obj,
        "oldObject": old,
        "dryRun": dry_run,
        "options": None,
    }
    return {"apiVersion": api_version, "kind": "AdmissionReview", "request": request}


@pytest.fixture
def hkey() -> bytes:
    return HKEY
