"""Unit-level builders shared by the unit tests and the benches: sources, pod specs, workloads
of every kind, an in-memory source reader (`Store`), and a plan and its patch as the core makes
them.

Everything here returns plain dicts shaped like what the API server sends (namespaced, as in an
AdmissionReview), so a test reads as the manifest it is about. `harness.manifests` has the
plainer objects an integration test creates in a cluster.
"""

from __future__ import annotations

import base64
import copy
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any, Final, TypedDict, Unpack

import jsonpatch

from webhook.core import digest
from webhook.core.constants import ANN_SOURCES
from webhook.core.kept import parse_mapping
from webhook.core.kinds import BUILTIN_KINDS, template_paths
from webhook.core.model import (
    JSONObject,
    Plan,
    SnapshotRequest,
    SourceId,
    SourceKind,
    SourceRecord,
    SourceUnavailable,
    source_kind,
)
from webhook.core.plan import plan_object
from webhook.core.refs import find_sites, get_path
from webhook.core.snapshot import snapshot_object

HKEY: Final = b"0123456789abcdef0123456789abcdef"

_API_VERSIONS: Final = {k.kind: k.api_version for k in BUILTIN_KINDS}


def b64(text: str | bytes) -> str:
    raw = text.encode() if isinstance(text, str) else text
    return base64.b64encode(raw).decode()


# ---- sources ----


class Meta(TypedDict, total=False):
    """A source's metadata beyond its name (None: none)."""

    namespace: str | None
    annotations: Mapping[str, str] | None
    labels: Mapping[str, str] | None


def _source(kind: str, name: str, meta: Meta) -> JSONObject:
    metadata: JSONObject = {"name": name}
    if (namespace := meta.get("namespace")) is not None:
        metadata["namespace"] = namespace
    if annotations := meta.get("annotations"):
        metadata["annotations"] = dict(annotations)
    if labels := meta.get("labels"):
        metadata["labels"] = dict(labels)
    return {"apiVersion": "v1", "kind": kind, "metadata": metadata}


def configmap(
    name: str,
    data: Mapping[str, str] | None = None,
    *,
    binary: Mapping[str, bytes] | None = None,
    **meta: Unpack[Meta],
) -> JSONObject:
    obj = _source("ConfigMap", name, meta)
    if data is not None:
        obj["data"] = dict(data)
    if binary is not None:
        obj["binaryData"] = {k: b64(v) for k, v in binary.items()}
    return obj


def secret(
    name: str,
    data: Mapping[str, str | bytes] | None = None,
    *,
    string_data: Mapping[str, str] | None = None,
    type_: str | None = "Opaque",
    **meta: Unpack[Meta],
) -> JSONObject:
    """A Secret; `data` values are given plain and stored base64, as the API server does."""
    obj = _source("Secret", name, meta)
    if type_ is not None:
        obj["type"] = type_
    if data is not None:
        obj["data"] = {k: b64(v) for k, v in data.items()}
    if string_data is not None:
        obj["stringData"] = dict(string_data)
    return obj


WORKLOAD_NAMESPACE: Final = "team-a"
NSKEY: Final = digest.namespace_key(HKEY, WORKLOAD_NAMESPACE)
"""The key of the digests in the namespace `workload` puts its objects in."""


def _kind(obj: Mapping[str, Any]) -> SourceKind:
    kind = source_kind(obj["kind"])
    assert kind is not None, obj["kind"]
    return kind


def source_id(obj: Mapping[str, Any]) -> SourceId:
    return SourceId(_kind(obj), obj["metadata"]["name"])


def record(obj: Mapping[str, Any], hkey: bytes = HKEY) -> SourceRecord:
    return digest.record_from_object(hkey, _kind(obj), obj)


class Store:
    """An in-memory stand-in for a source reader, answering the plan's lookups.

    Holds whole objects, like FileSources, so snapshot copies can be made from them and
    then answered for (with `snapshot_of` set) when a plan's output is planned again.
    """

    def __init__(self, objects: Iterable[JSONObject] = (), hkey: bytes = HKEY) -> None:
        self.hkey = hkey
        self.objects: dict[SourceId, JSONObject] = {}
        self.unreadable: set[SourceId] = set()
        self.lookups: list[SourceId] = []
        for obj in objects:
            self.put(obj)

    def put(self, obj: JSONObject) -> None:
        self.objects[source_id(obj)] = obj

    def delete(self, sid: SourceId) -> None:
        del self.objects[sid]

    def lookup(self, sid: SourceId) -> SourceRecord | None:
        self.lookups.append(sid)
        if sid in self.unreadable:
            raise SourceUnavailable("permission denied")
        obj = self.objects.get(sid)
        return None if obj is None else digest.record_from_object(self.hkey, sid.kind, obj)

    def create_snapshots(self, plan: Plan, namespace: str = WORKLOAD_NAMESPACE) -> list[JSONObject]:
        """Make the copies a snapshot-mode plan asks for, as the snapshot writer would."""
        made = []
        for req in plan.snapshots:
            signature = digest.copy_signature(
                self.hkey, namespace, req.snapshot_name, req.content_digest
            )
            snap = snapshot_object(
                req.source.kind,
                self.objects[req.source],
                req.snapshot_name,
                signature=signature,
                namespace=namespace,
            )
            self.put(snap)
            made.append(snap)
        return made


# ---- pod specs ----


class RefOptions(TypedDict, total=False):
    """What a reference to a source may say beyond its name (None: not said)."""

    items: Iterable[str] | None  # the keys it reads, each to a file of its name (`/` as `_`)
    optional: bool | None


def _ref(
    ref: JSONObject, *, items: Iterable[str] | None = None, optional: bool | None = None
) -> JSONObject:
    if items is not None:
        ref["items"] = [{"key": k, "path": k.replace("/", "_")} for k in items]
    if optional is not None:
        ref["optional"] = optional
    return ref


def env_cm(name: str, key: str, *, var: str = "V", optional: bool | None = None) -> JSONObject:
    ref = _ref({"name": name, "key": key}, optional=optional)
    return {"name": var, "valueFrom": {"configMapKeyRef": ref}}


def env_secret(name: str, key: str, *, var: str = "S", optional: bool | None = None) -> JSONObject:
    ref = _ref({"name": name, "key": key}, optional=optional)
    return {"name": var, "valueFrom": {"secretKeyRef": ref}}


def envfrom_cm(name: str, *, optional: bool | None = None) -> JSONObject:
    return {"configMapRef": _ref({"name": name}, optional=optional)}


def envfrom_secret(name: str, *, optional: bool | None = None) -> JSONObject:
    return {"secretRef": _ref({"name": name}, optional=optional)}


def vol_cm(name: str, *, volume: str | None = None, **options: Unpack[RefOptions]) -> JSONObject:
    return {"name": volume or f"cm-{name}", "configMap": _ref({"name": name}, **options)}


def vol_secret(
    name: str, *, volume: str | None = None, **options: Unpack[RefOptions]
) -> JSONObject:
    return {"name": volume or f"secret-{name}", "secret": _ref({"secretName": name}, **options)}


def proj_cm(name: str, **options: Unpack[RefOptions]) -> JSONObject:
    return {"configMap": _ref({"name": name}, **options)}


def proj_secret(name: str, **options: Unpack[RefOptions]) -> JSONObject:
    return {"secret": _ref({"name": name}, **options)}


def vol_projected(*sources: JSONObject, volume: str = "projected") -> JSONObject:
    return {"name": volume, "projected": {"sources": list(sources)}}


def _lists(obj: JSONObject, **lists: Iterable[JSONObject]) -> JSONObject:
    """`obj` with each of `lists` that is not empty (a list)."""
    obj.update({field: found for field, items in lists.items() if (found := list(items))})
    return obj


def container(
    name: str = "app",
    *,
    env: Iterable[JSONObject] = (),
    env_from: Iterable[JSONObject] = (),
    image: str = "registry.example/app:1.0",
) -> JSONObject:
    return _lists({"name": name, "image": image}, env=env, envFrom=env_from)


def pod_spec(
    *containers: JSONObject,
    init: Iterable[JSONObject] = (),
    ephemeral: Iterable[JSONObject] = (),
    volumes: Iterable[JSONObject] = (),
) -> JSONObject:
    return _lists(
        {"containers": list(containers) or [container()]},
        initContainers=init,
        ephemeralContainers=ephemeral,
        volumes=volumes,
    )


def reading(name: str, key: str) -> JSONObject:
    """A pod spec whose one container reads `key` of ConfigMap `name` (variable V)."""
    return pod_spec(container(env=[env_cm(name, key)]))


# ---- workloads ----


def workload(
    kind: str,
    spec: JSONObject,
    *,
    name: str = "app",
    namespace: str = WORKLOAD_NAMESPACE,
    annotations: Mapping[str, str] | None = None,
    template_annotations: Mapping[str, str] | None = None,
    template_meta: bool = True,
    owner: str | None = None,
) -> JSONObject:
    """`spec` (a pod spec) wrapped as a workload of `kind`, placed where that kind keeps it.

    `annotations` go on the workload's own metadata; `template_annotations` on the pod
    template's (for a Pod: the same metadata). `owner`: a controller ownerReference's kind.
    """
    meta: JSONObject = {"name": name, "namespace": namespace, "labels": {"app": name}}
    if annotations:
        meta["annotations"] = dict(annotations)
    if owner is not None:
        meta["ownerReferences"] = [
            {
                "apiVersion": "apps/v1",
                "kind": owner,
                "name": f"{name}-owner",
                "uid": "7d2b1c3e-0000-4000-8000-000000000001",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    obj: JSONObject = {"apiVersion": _API_VERSIONS[kind], "kind": kind, "metadata": meta}
    if kind == "Pod":
        if template_annotations:
            meta.setdefault("annotations", {}).update(template_annotations)
        obj["spec"] = spec
        return obj
    template: JSONObject = {}
    if template_meta:
        template["metadata"] = {"labels": {"app": name}}
        if template_annotations:
            template["metadata"]["annotations"] = dict(template_annotations)
    template["spec"] = spec
    selector = {"matchLabels": {"app": name}}
    if kind == "CronJob":
        obj["spec"] = {"schedule": "*/5 * * * *", "jobTemplate": {"spec": {"template": template}}}
    elif kind == "Job":
        template["spec"].setdefault("restartPolicy", "Never")
        obj["spec"] = {"template": template}
    elif kind == "ReplicationController":
        obj["spec"] = {"replicas": 1, "selector": {"app": name}, "template": template}
    elif kind == "DaemonSet":
        obj["spec"] = {"selector": selector, "template": template}
    elif kind == "StatefulSet":
        obj["spec"] = {"serviceName": name, "selector": selector, "template": template}
    else:
        obj["spec"] = {"replicas": 2, "selector": selector, "template": template}
    return obj


def apply(obj: JSONObject, plan: Plan) -> JSONObject:
    """The object as the API server stores it after the plan's patch (the input is untouched)."""
    out: JSONObject = jsonpatch.apply_patch(copy.deepcopy(obj), plan.patch)
    return out


def plan(
    obj: JSONObject,
    store: Store,
    *,
    mode: str = "checksum",
    operation: str = "CREATE",
    old: JSONObject | None = None,
    hkey: bytes = HKEY,
    refresh: Collection[SourceId] | None = None,
    now: float | None = None,
) -> Plan:
    """Plan `obj`. `refresh=ALL`: the controller's re-plan of a workload (an UPDATE of the
    object as it is, following every source it consumes). `now`: the planner's clock."""
    if refresh is not None:
        operation, old = "UPDATE", obj
        if refresh is ALL:
            refresh = _all_sources(obj, store)
    return plan_object(
        obj,
        hkey=hkey,
        lookup=store.lookup,
        default_mode=mode,
        operation=operation,
        old=old,
        refresh=refresh or (),
        now=now,
    )


def admitted(obj: JSONObject, store: Store, **how: Any) -> JSONObject:
    """`obj` as configpin's admission leaves it: planned against `store` (`how`: as `plan`
    takes it) and the plan's patch applied."""
    return apply(obj, plan(obj, store, **how))


class _All(frozenset[SourceId]):
    """Every source the object consumes (or records), resolved by `plan`."""


ALL: Final = _All()


def _all_sources(obj: JSONObject, store: Store) -> frozenset[SourceId]:
    paths = template_paths(str(obj.get("kind", "")))
    assert paths is not None
    found: set[SourceId] = set()
    for site in find_sites(get_path(obj, paths[1]) or {}):
        found.add(site.source)
        try:
            record = store.lookup(site.source)
        except SourceUnavailable:
            record = None
        if record is not None and record.snapshot_of is not None:
            found.add(SourceId(record.kind, record.snapshot_of))
    meta = get_path(obj, paths[0]) or {}
    for key in parse_mapping((meta.get("annotations") or {}).get(ANN_SOURCES)) or {}:
        found.add(SourceId.parse(key))
    return frozenset(found)


class RecordingWriter:
    """A snapshot writer for tests (webhook.core.model.SnapshotEnsurer): it knows nothing in
    advance (`settled` is False), notes every `ensure`, and `make`s each copy asked for (a
    subclass checks or refuses there)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[SnapshotRequest], bool]] = []
        self.made: list[str] = []

    def settled(self, namespace: str, requests: Sequence[SnapshotRequest]) -> bool:
        return False

    def ensure(
        self,
        namespace: str,
        requests: Sequence[SnapshotRequest],
        *,
        dry_run: bool,
        on_created: Callable[[JSONObject], None] | None = None,
    ) -> list[str]:
        self.calls.append((namespace, list(requests), dry_run))
        for req in requests:
            self.make(namespace, req)
            self.made.append(req.snapshot_name)
        return []

    def make(self, namespace: str, request: SnapshotRequest) -> None:
        """Raise to refuse the copy."""
