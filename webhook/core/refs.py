"""Where a workload keeps its pod template, and which ConfigMaps/Secrets a pod spec consumes."""

from __future__ import annotations

from collections.abc import Mapping
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


_CONFIGMAP: Final = SourceKind.CONFIGMAP
_SECRET: Final = SourceKind.SECRET
_KEY_REFS: Final = (("configMapKeyRef", _CONFIGMAP), ("secretKeyRef", _SECRET))
_OBJECT_REFS: Final = (("configMapRef", _CONFIGMAP), ("secretRef", _SECRET))


def _add(
    out: list[RefSite],
    kind: SourceKind,
    ref: Any,
    path: Path,
    name_field: str,
    keys: frozenset[str] | None,
) -> None:
    """Append the site `ref` names, if it names one (`path` leads to `ref`)."""
    if not isinstance(ref, dict):
        return
    name = ref.get(name_field)
    if not isinstance(name, str) or not name:
        return
    optional = ref.get("optional") is True
    out.append(RefSite(SourceId(kind, name), (*path, name_field), keys, optional))


def _ref_items(ref: Any) -> frozenset[str] | None:
    return _items_keys(ref.get("items")) if isinstance(ref, dict) else None


def _volume_sites(spec: Mapping[str, Any], out: list[RefSite]) -> None:
    for vi, vol in enumerate(spec.get("volumes") or ()):
        if not isinstance(vol, dict):
            continue
        if (cm := vol.get("configMap")) is not None:
            _add(out, _CONFIGMAP, cm, ("volumes", vi, "configMap"), "name", _ref_items(cm))
        if (sec := vol.get("secret")) is not None:
            _add(out, _SECRET, sec, ("volumes", vi, "secret"), "secretName", _ref_items(sec))
        projected = vol.get("projected")
        if isinstance(projected, dict):
            for si, src in enumerate(projected.get("sources") or ()):
                if not isinstance(src, dict):
                    continue
                if (ref := src.get("configMap")) is not None:
                    path: Path = ("volumes", vi, "projected", "sources", si, "configMap")
                    _add(out, _CONFIGMAP, ref, path, "name", _ref_items(ref))
                if (ref := src.get("secret")) is not None:
                    path = ("volumes", vi, "projected", "sources", si, "secret")
                    _add(out, _SECRET, ref, path, "name", _ref_items(ref))


def _container_sites(spec: Mapping[str, Any], out: list[RefSite]) -> None:
    # Pods may carry hundreds of plain env values: the loop over them stays lean.
    for clist in CONTAINER_LISTS:
        for ci, container in enumerate(spec.get(clist) or ()):
            if not isinstance(container, dict):
                continue
            for ei, env in enumerate(container.get("env") or ()):
                value_from = env.get("valueFrom") if isinstance(env, dict) else None
                if not isinstance(value_from, dict):
                    continue
                for field, kind in _KEY_REFS:
                    ref = value_from.get(field)
                    if isinstance(ref, dict) and isinstance(key := ref.get("key"), str):
                        path: Path = (clist, ci, "env", ei, "valueFrom", field)
                        _add(out, kind, ref, path, "name", frozenset((key,)))
            for ei, env_from in enumerate(container.get("envFrom") or ()):
                if not isinstance(env_from, dict):
                    continue
                for field, kind in _OBJECT_REFS:
                    if (ref := env_from.get(field)) is not None:
                        _add(out, kind, ref, (clist, ci, "envFrom", ei, field), "name", None)


def find_sites(pod_spec: Mapping[str, Any]) -> list[RefSite]:
    """Every reference to a ConfigMap or Secret in a pod spec, in document order."""
    sites: list[RefSite] = []
    _volume_sites(pod_spec, sites)
    _container_sites(pod_spec, sites)
    return sites


_NO_KEYS: Final[frozenset[str]] = frozenset()


def _source_order(source: SourceId) -> tuple[str, str]:
    return source.kind, source.name  # SourceId's own order, compared without its __lt__


def consumption(sites: list[RefSite]) -> dict[SourceId, Consumption]:
    """Group sites by source: the keys consumed (None for all) and whether any site requires it."""
    grouped: dict[SourceId, list[RefSite]] = {}
    for site in sites:
        group = grouped.get(site.source)
        if group is None:
            grouped[site.source] = [site]
        else:
            group.append(site)
    out: dict[SourceId, Consumption] = {}
    for source in sorted(grouped, key=_source_order):
        group = grouped[source]
        keys: frozenset[str] | None = _NO_KEYS
        required_keys: frozenset[str] = _NO_KEYS
        required = False
        for s in group:
            keys = None if s.keys is None or keys is None else keys | s.keys
            if not s.optional:
                required = True
                if s.keys is not None:
                    required_keys = required_keys | s.keys
        out[source] = Consumption(
            source=source,
            keys=keys,
            required=required,
            required_keys=required_keys,
            sites=tuple(group),
        )
    return out
