"""Check the types of every field the planner reads, before it reads them.

The API server only sends objects it decoded into its own types, so a field of the wrong type
comes from a client that is not the API server (or is broken). The planner is written for
well-typed objects; this walk, over exactly the fields it reads (refs.py, plan.py), is what
lets it stay that way. A wrong field is reported by its path, e.g.
`object.spec.template.spec.volumes[2].configMap.items: expected a list, got a string`.

`null` counts as absent wherever Kubernetes allows the field to be absent. The happy path
raises nothing and builds no path: it costs a few microseconds for an ordinary workload.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from webhook.core.kinds import template_paths
from webhook.core.model import SourceKind
from webhook.core.refs import CONTAINER_LISTS


class ShapeError(ValueError):
    """A field has the wrong type. `path` runs from the outermost field inwards."""

    def __init__(self, expected: str, got: Any) -> None:
        super().__init__(expected)
        self.expected = expected
        self.got = _type_name(got)
        self._parts: list[str | int] = []

    def at(self, part: str | int) -> ShapeError:
        self._parts.append(part)  # added innermost first, on the way out
        return self

    @property
    def path(self) -> str:
        out = ""
        for part in reversed(self._parts):
            out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
        return out

    def __str__(self) -> str:
        return f"{self.path}: expected {self.expected}, got {self.got}"


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


_OBJECT: Final = "an object"
_LIST: Final = "a list"
_STRING: Final = "a string"
_BOOL: Final = "a boolean"


def _obj(parent: dict[str, Any], key: str) -> dict[str, Any] | None:
    value = parent.get(key)
    if value is None or isinstance(value, dict):
        return value
    raise ShapeError(_OBJECT, value).at(key)


def _list(parent: dict[str, Any], key: str) -> list[Any]:
    value = parent.get(key)
    if value is None:
        return []
    if isinstance(value, list):
        return value
    raise ShapeError(_LIST, value).at(key)


def _str(parent: dict[str, Any], key: str) -> None:
    value = parent.get(key)
    if value is not None and not isinstance(value, str):
        raise ShapeError(_STRING, value).at(key)


def _strs(parent: dict[str, Any], keys: tuple[str, ...]) -> None:
    for key in keys:
        value = parent.get(key)
        if value is not None and value.__class__ is not str and not isinstance(value, str):
            raise ShapeError(_STRING, value).at(key)


def _bool(parent: dict[str, Any], key: str) -> None:
    value = parent.get(key)
    if value is not None and not isinstance(value, bool):
        raise ShapeError(_BOOL, value).at(key)


def _string_map(parent: dict[str, Any], key: str) -> None:
    value = _obj(parent, key)
    if value:
        for k, v in value.items():
            if not isinstance(v, str):
                raise ShapeError(_STRING, v).at(k).at(key)


_NAME_FIELDS: Final[tuple[str, ...]] = ("name", "namespace")


def _metadata(obj: dict[str, Any]) -> None:
    meta = _obj(obj, "metadata")
    if meta is None:
        return
    try:
        _strs(meta, _NAME_FIELDS)
        _string_map(meta, "labels")
        _string_map(meta, "annotations")
        for i, ref in enumerate(_list(meta, "ownerReferences")):
            if not isinstance(ref, dict):
                raise ShapeError(_OBJECT, ref).at(i).at("ownerReferences")
            try:
                _bool(ref, "controller")
            except ShapeError as e:
                raise e.at(i).at("ownerReferences") from None
    except ShapeError as e:
        raise e.at("metadata") from None


def _ref(ref: Any, name_field: str, items: bool, key: bool) -> None:
    """configMap / secret / configMapKeyRef / ... : a name, maybe items or a key, optional."""
    if not isinstance(ref, dict):
        raise ShapeError(_OBJECT, ref)
    if (name := ref.get(name_field)) is not None and not isinstance(name, str):
        raise ShapeError(_STRING, name).at(name_field)
    if key and (k := ref.get("key")) is not None and not isinstance(k, str):
        raise ShapeError(_STRING, k).at("key")
    if (optional := ref.get("optional")) is not None and optional.__class__ is not bool:
        raise ShapeError(_BOOL, optional).at("optional")
    if items and (listed := ref.get("items")) is not None:
        if not isinstance(listed, list):
            raise ShapeError(_LIST, listed).at("items")
        for i, item in enumerate(listed):
            if not isinstance(item, dict):
                raise ShapeError(_OBJECT, item).at(i).at("items")
            if (k := item.get("key")) is not None and not isinstance(k, str):
                raise ShapeError(_STRING, k).at("key").at(i).at("items")


# The fields a pod spec names a source in (the source kinds' table; variable-length tuple
# types: see refs.CONTAINER_LISTS)
_VOLUME_REFS: Final[tuple[tuple[str, str], ...]] = tuple(
    (k.facts.volume, k.facts.volume_name) for k in SourceKind
)
_PROJECTED_REFS: Final[tuple[str, ...]] = tuple(k.facts.volume for k in SourceKind)


def _volume(vol: Any) -> None:
    if not isinstance(vol, dict):
        raise ShapeError(_OBJECT, vol)
    for field, name_field in _VOLUME_REFS:
        if (ref := vol.get(field)) is not None:
            try:
                _ref(ref, name_field, True, False)
            except ShapeError as e:
                raise e.at(field) from None
    projected = _obj(vol, "projected")
    if projected is None:
        return
    try:
        sources = _list(projected, "sources")
    except ShapeError as e:
        raise e.at("projected") from None
    for si, src in enumerate(sources):
        if not isinstance(src, dict):
            raise ShapeError(_OBJECT, src).at(si).at("sources").at("projected")
        for kind in _PROJECTED_REFS:
            if (ref := src.get(kind)) is not None:
                try:
                    _ref(ref, "name", True, False)
                except ShapeError as e:
                    raise e.at(kind).at(si).at("sources").at("projected") from None


_KEY_REFS: Final[tuple[str, ...]] = tuple(k.facts.key_ref for k in SourceKind)
_OBJECT_REFS: Final[tuple[str, ...]] = tuple(k.facts.env_from for k in SourceKind)


def _container(c: Any) -> None:
    if not isinstance(c, dict):
        raise ShapeError(_OBJECT, c)
    for ei, env in enumerate(_list(c, "env")):
        if not isinstance(env, dict):
            raise ShapeError(_OBJECT, env).at(ei).at("env")
        value_from = env.get("valueFrom")
        if value_from is None:
            continue
        if not isinstance(value_from, dict):
            raise ShapeError(_OBJECT, value_from).at("valueFrom").at(ei).at("env")
        for field in _KEY_REFS:
            if (ref := value_from.get(field)) is not None:
                try:
                    _ref(ref, "name", False, True)
                except ShapeError as e:
                    raise e.at(field).at("valueFrom").at(ei).at("env") from None
    for ei, env_from in enumerate(_list(c, "envFrom")):
        if not isinstance(env_from, dict):
            raise ShapeError(_OBJECT, env_from).at(ei).at("envFrom")
        for field in _OBJECT_REFS:
            if (ref := env_from.get(field)) is not None:
                try:
                    _ref(ref, "name", False, False)
                except ShapeError as e:
                    raise e.at(field).at(ei).at("envFrom") from None


def _pod_spec(spec: dict[str, Any]) -> None:
    for vi, vol in enumerate(_list(spec, "volumes")):
        try:
            _volume(vol)
        except ShapeError as e:
            raise e.at(vi).at("volumes") from None
    for clist in CONTAINER_LISTS:
        for ci, c in enumerate(_list(spec, clist)):
            try:
                _container(c)
            except ShapeError as e:
                raise e.at(ci).at(clist) from None


def _prefix(e: ShapeError, parts: tuple[str | int, ...]) -> ShapeError:
    for part in reversed(parts):
        e.at(part)
    return e


def _walk(obj: dict[str, Any], path: tuple[str | int, ...], check: Callable[[Any], None]) -> None:
    """Follow `path` from `obj`, every step an object (or absent), and check what is there."""
    here = obj
    for i, part in enumerate(path):
        try:
            nxt = _obj(here, str(part))
        except ShapeError as e:
            raise _prefix(e, path[:i]) from None
        if nxt is None:
            return
        here = nxt
    try:
        check(here)
    except ShapeError as e:
        raise _prefix(e, path) from None


def check_object(obj: Any, *, full: bool = True) -> None:
    """Raise ShapeError if a field the planner reads has the wrong type.

    `full=False` checks only what is read of an old object (its metadata and its template's
    annotations)."""
    if not isinstance(obj, dict):
        raise ShapeError(_OBJECT, obj)
    _str(obj, "kind")
    _metadata(obj)
    kind = obj.get("kind")
    paths = template_paths(kind) if isinstance(kind, str) else None
    if paths is None:
        return
    meta_path, spec_path = paths
    if meta_path != ("metadata",):
        _walk(obj, meta_path, _template_metadata)
    if full:
        _walk(obj, spec_path, _pod_spec)


def _template_metadata(meta: dict[str, Any]) -> None:
    _string_map(meta, "labels")
    _string_map(meta, "annotations")


_REQUEST_STRINGS: Final[tuple[str, ...]] = ("operation", "namespace", "subResource")


_OBJECTS: Final[tuple[tuple[str, bool], ...]] = (("object", True), ("oldObject", False))


def check_request(request: dict[str, Any]) -> None:
    """The fields of an AdmissionReview request that admission reads, and its objects."""
    _strs(request, _REQUEST_STRINGS)
    _bool(request, "dryRun")
    kind = _obj(request, "kind")
    if kind is not None:
        try:
            _str(kind, "kind")
        except ShapeError as e:
            raise e.at("kind") from None
    for field, full in _OBJECTS:
        value = request.get(field)
        if value is None:
            continue
        try:
            check_object(value, full=full)
        except ShapeError as e:
            raise e.at(field) from None
