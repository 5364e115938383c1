"""Where a workload keeps its pod template, and which ConfigMaps/Secrets a pod spec consumes."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

from webhook.core.model import SourceId, SourceKind

Path = tuple[str | int, ...]

# kind -> (path of the pod template's metadata, path of the pod spec)
_TEMPLATE: Final = (("spec", "template", "metadata"), ("spec", "template", "spec"))
_WORKLOAD_PATHS: Final[Mapping[str, tuple[Path, Path]]] = {
    "Pod": (("metadata",), ("spec",)),
    "Deployment": _TEMPLATE,
    "StatefulSet": _TEMPLATE,
    "DaemonSet": _TEMPLATE,
    "ReplicaSet": _TEMPLATE,
    "ReplicationController": _TEMPLATE,
    "Job": _TEMPLATE,
    "CronJob": (
        ("spec", "jobTemplate", "spec", "template", "metadata"),
        ("spec", "jobTemplate", "spec", "template", "spec"),
    ),
}
WORKLOAD_KINDS: Final = frozenset(_WORKLOAD_PATHS)
CONTAINER_LISTS: Final = ("initContainers", "containers", "ephemeralContainers")


def template_paths(kind: str) -> tuple[Path, Path] | None:
    """(metadata path, pod spec path) for a workload kind, None for kinds we do not handle."""
    return _WORKLOAD_PATHS.get(kind)


def get_path(obj: Any, path: Path) -> Any:
    for part in path:
        if isinstance(part, int):
            if not isinstance(obj, list) or part >= len(obj):
                return None
            obj = obj[part]
        else:
            if not isinstance(obj, dict):
                return None
            obj = obj.get(part)
    return obj


@dataclass(frozen=True, slots=True)
class RefSite:
    """One place in a pod spec that names a source. `path` leads to the name field."""

    source: SourceId
    path: Path
    keys: frozenset[str] | None  # None: every key of the object
    optional: bool


@dataclass(frozen=True, slots=True)
class Consumption:
    """All a pod spec consumes of one source: the union over its sites."""

    source: SourceId
    keys: frozenset[str] | None  # None: every key
    required: bool  # some site is not optional: the pod cannot start without it
    required_keys: frozenset[str]  # keys named by non-optional sites
    sites: tuple[RefSite, ...]


def _items_keys(items: Any) -> frozenset[str] | None:
    if not isinstance(items, list) or not items:
        return None  # no `items` (or an empty list): the whole object is projected
    return frozenset(
        i["key"] for i in items if isinstance(i, dict) and isinstance(i.get("key"), str)
    )


def _site(
    kind: SourceKind, ref: Any, path: Path, name_field: str, keys: frozenset[str] | None
) -> RefSite | None:
    if not isinstance(ref, dict):
        return None
    name = ref.get(name_field)
    if not isinstance(name, str) or not name:
        return None
    return RefSite(SourceId(kind, name), (*path, name_field), keys, ref.get("optional") is True)


def _volume_sites(spec: Mapping[str, Any]) -> Iterator[RefSite | None]:
    for vi, vol in enumerate(spec.get("volumes") or ()):
        if not isinstance(vol, dict):
            continue
        base: Path = ("volumes", vi)
        if (cm := vol.get("configMap")) is not None:
            yield _site(
                SourceKind.CONFIGMAP,
                cm,
                (*base, "configMap"),
                "name",
                _items_keys(cm.get("items") if isinstance(cm, dict) else None),
            )
        if (sec := vol.get("secret")) is not None:
            yield _site(
                SourceKind.SECRET,
                sec,
                (*base, "secret"),
                "secretName",
                _items_keys(sec.get("items") if isinstance(sec, dict) else None),
            )
        projected = vol.get("projected")
        if isinstance(projected, dict):
            for si, src in enumerate(projected.get("sources") or ()):
                if not isinstance(src, dict):
                    continue
                sbase: Path = (*base, "projected", "sources", si)
                for field, kind in (
                    ("configMap", SourceKind.CONFIGMAP),
                    ("secret", SourceKind.SECRET),
                ):
                    if (ref := src.get(field)) is not None:
                        keys = _items_keys(ref.get("items") if isinstance(ref, dict) else None)
                        yield _site(kind, ref, (*sbase, field), "name", keys)


def _container_sites(spec: Mapping[str, Any]) -> Iterator[RefSite | None]:
    for clist in CONTAINER_LISTS:
        for ci, container in enumerate(spec.get(clist) or ()):
            if not isinstance(container, dict):
                continue
            cbase: Path = (clist, ci)
            for ei, env in enumerate(container.get("env") or ()):
                value_from = env.get("valueFrom") if isinstance(env, dict) else None
                if not isinstance(value_from, dict):
                    continue
                for field, kind in (
                    ("configMapKeyRef", SourceKind.CONFIGMAP),
                    ("secretKeyRef", SourceKind.SECRET),
                ):
                    ref = value_from.get(field)
                    if isinstance(ref, dict) and isinstance(ref.get("key"), str):
                        keys = frozenset((ref["key"],))
                        yield _site(
                            kind, ref, (*cbase, "env", ei, "valueFrom", field), "name", keys
                        )
            for ei, env_from in enumerate(container.get("envFrom") or ()):
                if not isinstance(env_from, dict):
                    continue
                for field, kind in (
                    ("configMapRef", SourceKind.CONFIGMAP),
                    ("secretRef", SourceKind.SECRET),
                ):
                    if (ref := env_from.get(field)) is not None:
                        yield _site(kind, ref, (*cbase, "envFrom", ei, field), "name", None)


def find_sites(pod_spec: Mapping[str, Any]) -> list[RefSite]:
    """Every reference to a ConfigMap or Secret in a pod spec, in document order."""
    sites = [s for s in _volume_sites(pod_spec) if s is not None]
    sites.extend(s for s in _container_sites(pod_spec) if s is not None)
    return sites


def consumption(sites: list[RefSite]) -> dict[SourceId, Consumption]:
    """Group sites by source: the keys consumed (None for all) and whether any site requires it."""
    grouped: dict[SourceId, list[RefSite]] = {}
    for site in sites:
        grouped.setdefault(site.source, []).append(site)
    out: dict[SourceId, Consumption] = {}
    for source, group in sorted(grouped.items()):
        keys: frozenset[str] | None = frozenset()
        required_keys: set[str] = set()
        for s in group:
            keys = None if s.keys is None or keys is None else keys | s.keys
            if not s.optional and s.keys is not None:
                required_keys |= s.keys
        out[source] = Consumption(
            source=source,
            keys=keys,
            required=any(not s.optional for s in group),
            required_keys=frozenset(required_keys),
            sites=tuple(group),
        )
    return out
