"""Which ConfigMaps/Secrets a pod spec consumes, key by key (where a workload keeps its pod
spec: webhook.core.kinds)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, Final

from webhook.core.kinds import Path
from webhook.core.model import SourceId, SourceKind

# (Typed as variable-length tuples, here and below: the compiled core then loops over them by
# index, where a fixed-length tuple type makes it go through a Python iterator.)
CONTAINER_LISTS: Final[tuple[str, ...]] = ("initContainers", "containers", "ephemeralContainers")


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


class RefSite:
    """One place in a pod spec that names a source. `path` leads to the name field.

    Read-only (its fields are Final), and neither a frozen dataclass nor a named tuple:
    several are made per admission, and a plain class is what the compiled core builds
    cheapest (a frozen dataclass costs about five times as much, a named tuple four)."""

    __slots__ = ("keys", "optional", "path", "source")

    def __init__(
        self, source: SourceId, path: Path, keys: frozenset[str] | None, optional: bool
    ) -> None:
        self.source: Final = source
        self.path: Final = path
        self.keys: Final = keys  # None: every key of the object
        self.optional: Final = optional

    def _fields(self) -> tuple[SourceId, Path, frozenset[str] | None, bool]:
        return self.source, self.path, self.keys, self.optional

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RefSite) and self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        return (
            f"RefSite(source={self.source!r}, path={self.path!r}, keys={self.keys!r}, "
            f"optional={self.optional!r})"
        )


class Consumption:
    """All a pod spec consumes of one source: the union over its sites. Read-only, a plain
    class for the reason RefSite is."""

    __slots__ = ("keys", "required", "required_keys", "sites", "source")

    def __init__(
        self,
        source: SourceId,
        keys: frozenset[str] | None,
        required: bool,
        required_keys: frozenset[str],
        sites: tuple[RefSite, ...],
    ) -> None:
        self.source: Final = source
        self.keys: Final = keys  # None: every key
        self.required: Final = required  # some site is not optional: it cannot start without it
        self.required_keys: Final = required_keys  # keys named by non-optional sites
        self.sites: Final = sites

    def _fields(
        self,
    ) -> tuple[SourceId, frozenset[str] | None, bool, frozenset[str], tuple[RefSite, ...]]:
        return self.source, self.keys, self.required, self.required_keys, self.sites

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Consumption) and self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        return (
            f"Consumption(source={self.source!r}, keys={self.keys!r}, "
            f"required={self.required!r}, required_keys={self.required_keys!r}, "
            f"sites={self.sites!r})"
        )


def _items_keys(items: Any) -> frozenset[str] | None:
    if not isinstance(items, list) or not items:
        return None  # no `items` (or an empty list): the whole object is projected
    return frozenset(
        i["key"] for i in items if isinstance(i, dict) and isinstance(i.get("key"), str)
    )


# The fields a pod spec names a source in, by kind (the source kinds' table, SOURCE_FACTS)
_FieldKinds = tuple[tuple[str, SourceKind], ...]
_KEY_REFS: Final[_FieldKinds] = tuple((k.facts.key_ref, k) for k in SourceKind)
_OBJECT_REFS: Final[_FieldKinds] = tuple((k.facts.env_from, k) for k in SourceKind)
_PROJECTED_REFS: Final[_FieldKinds] = tuple((k.facts.volume, k) for k in SourceKind)
# A volume's own reference: its field, the field of the name in it, the kind
_VOLUME_REFS: Final[tuple[tuple[str, str, SourceKind], ...]] = tuple(
    (k.facts.volume, k.facts.volume_name, k) for k in SourceKind
)


_new = tuple.__new__  # builds a named tuple in C, without the Python-level __new__ frame

# The SourceId of each (kind, name) seen lately, made once: finding it (by the name, in its
# kind's table: a string key) costs a fraction of building a named tuple, once per reference
# of every admission. Names come from requests: bounded, and emptied whole when full (plain
# dicts, as webhook.core.digest._memo says why).
_SOURCE_IDS: Final[dict[SourceKind, dict[str, SourceId]]] = {k: {} for k in SourceKind}
_SOURCE_IDS_MAX: Final = 4096


def _source_id(kind: SourceKind, name: str) -> SourceId:
    ids = _SOURCE_IDS[kind]
    sid = ids.get(name)
    if sid is None:
        if len(ids) >= _SOURCE_IDS_MAX:
            ids.clear()
        sid = ids[name] = _new(SourceId, (kind, name))
    return sid


# The annotation key (`str(sid)`, `configmap/<name>`) of each SourceId seen lately: found by
# the id's identity (ids come from `_source_id`), where `SourceId.__str__` is a method call and
# a concatenation, once per source of every admission. Bounded like _SOURCE_IDS.
_KEYS: Final[dict[SourceId, str]] = {}


def source_key(sid: SourceId) -> str:
    """`str(sid)`, remembered."""
    key = _KEYS.get(sid)
    if key is None:
        if len(_KEYS) >= _SOURCE_IDS_MAX:
            _KEYS.clear()
        key = _KEYS[sid] = str(sid)
    return key


# The key set of an env var's reference (one key), made once per key seen lately: building a
# frozenset costs more than finding it, and the digest memo then finds its entry by identity.
_ONE_KEY: Final[dict[str, frozenset[str]]] = {}


def _one_key(key: str) -> frozenset[str]:
    keys = _ONE_KEY.get(key)
    if keys is None:
        if len(_ONE_KEY) >= _SOURCE_IDS_MAX:
            _ONE_KEY.clear()
        keys = _ONE_KEY[key] = frozenset((key,))
    return keys


def _site(kind: SourceKind, ref: Any, path: Path, keys: frozenset[str] | None) -> RefSite | None:
    """The site `ref` names by its `name`, if it names one (`path` leads to that `name`)."""
    if not isinstance(ref, dict):
        return None
    name = ref.get("name")
    if not isinstance(name, str) or not name:
        return None
    optional = ref.get("optional") is True
    return RefSite(_source_id(kind, name), path, keys, optional)


def _volume_sites(spec: dict[str, Any], out: list[RefSite]) -> None:
    for vi, vol in enumerate(spec.get("volumes") or ()):
        if not isinstance(vol, dict):
            continue
        for field, name_field, kind in _VOLUME_REFS:
            ref = vol.get(field)
            if isinstance(ref, dict) and isinstance(name := ref.get(name_field), str) and name:
                out.append(
                    RefSite(
                        _source_id(kind, name),
                        ("volumes", vi, field, name_field),
                        _items_keys(ref.get("items")),
                        ref.get("optional") is True,
                    )
                )
        projected = vol.get("projected")
        if not isinstance(projected, dict):
            continue
        for si, src in enumerate(projected.get("sources") or ()):
            if not isinstance(src, dict):
                continue
            for field, kind in _PROJECTED_REFS:
                if (ref := src.get(field)) is not None:
                    keys = _items_keys(ref.get("items")) if isinstance(ref, dict) else None
                    path: Path = ("volumes", vi, "projected", "sources", si, field, "name")
                    if (found := _site(kind, ref, path, keys)) is not None:
                        out.append(found)


def _container_sites(spec: dict[str, Any], out: list[RefSite]) -> None:
    # Pods may carry hundreds of plain env values: the loop over them stays lean.
    for clist in CONTAINER_LISTS:
        for ci, container in enumerate(spec.get(clist) or ()):
            if not isinstance(container, dict):
                continue
            env_list = container.get("env")
            if env_list:
                for ei, env in enumerate(env_list):
                    value_from = env.get("valueFrom") if isinstance(env, dict) else None
                    if not isinstance(value_from, dict):
                        continue
                    for field, kind in _KEY_REFS:
                        ref = value_from.get(field)
                        if isinstance(ref, dict) and isinstance(key := ref.get("key"), str):
                            path: Path = (clist, ci, "env", ei, "valueFrom", field, "name")
                            if (found := _site(kind, ref, path, _one_key(key))) is not None:
                                out.append(found)
            env_from_list = container.get("envFrom")
            if env_from_list:
                for ei, env_from in enumerate(env_from_list):
                    if not isinstance(env_from, dict):
                        continue
                    for field, kind in _OBJECT_REFS:
                        if (ref := env_from.get(field)) is not None:
                            path = (clist, ci, "envFrom", ei, field, "name")
                            if (found := _site(kind, ref, path, None)) is not None:
                                out.append(found)


def find_sites(pod_spec: dict[str, Any]) -> list[RefSite]:
    """Every reference to a ConfigMap or Secret in a pod spec, in document order."""
    sites: list[RefSite] = []
    _volume_sites(pod_spec, sites)
    _container_sites(pod_spec, sites)
    return sites


_NO_KEYS: Final[frozenset[str]] = frozenset()
_first: Final = itemgetter(0)


def consumption(sites: list[RefSite]) -> dict[SourceId, Consumption]:
    """Group sites by source: the keys consumed (None for all) and whether any site requires it.

    In (kind, name) order: the sites sorted by their source's key (`configmap/<name>` before
    `secret/<name>`, which sort as plain strings, where the tuples' enum kinds would not), each
    run of one source's sites in document order (the sort is stable)."""
    keyed = [(source_key(site.source), site) for site in sites]
    keyed.sort(key=_first)
    out: dict[SourceId, Consumption] = {}
    i = 0
    n = len(keyed)
    while i < n:
        key, s = keyed[i]
        j = i + 1
        while j < n and keyed[j][0] == key:
            j += 1
        source = s.source
        if j == i + 1:  # the usual case: one site, nothing to merge
            if s.optional:
                out[source] = Consumption(source, s.keys, False, _NO_KEYS, (s,))
            else:
                out[source] = Consumption(source, s.keys, True, s.keys or _NO_KEYS, (s,))
            i = j
            continue
        group = tuple(pair[1] for pair in keyed[i:j])
        keys: frozenset[str] | None = _NO_KEYS
        required_keys: frozenset[str] = _NO_KEYS
        required = False
        for s in group:
            keys = None if s.keys is None or keys is None else keys | s.keys
            if not s.optional:
                required = True
                if s.keys is not None:
                    required_keys = required_keys | s.keys
        out[source] = Consumption(source, keys, required, required_keys, group)
        i = j
    return out


def _sub_path_mounts(spec: dict[str, Any]) -> dict[str, str]:
    """Volume name -> a container that mounts it with `subPath`/`subPathExpr` (a file the
    kubelet never updates in a running container)."""
    out: dict[str, str] = {}
    for clist in CONTAINER_LISTS:
        for container in spec.get(clist) or ():
            if not isinstance(container, dict):
                continue
            for mount in container.get("volumeMounts") or ():
                if not isinstance(mount, dict) or not isinstance(mount.get("name"), str):
                    continue
                if mount.get("subPath") or mount.get("subPathExpr"):
                    out.setdefault(mount["name"], str(container.get("name") or "?"))
    return out


@dataclass(frozen=True, slots=True)
class Unrefreshable:
    """Why a change of a source cannot reach a running process of a pod spec."""

    how: str  # "env", "envFrom", "subPath" or "extra" (referenced nowhere in the pod spec)
    container: str
    volume: str | None = None

    def __str__(self) -> str:
        if self.how == "extra":
            return "its pod spec does not reference it (configpin.io/extra-sources names it)"
        if self.how == "subPath":
            return f"volume {self.volume} is mounted with subPath in container {self.container}"
        via = "an env var" if self.how == "env" else "envFrom"
        return f"it reaches container {self.container} through {via}"


def unrefreshable(
    pod_spec: dict[str, Any], sources: Iterable[SourceId]
) -> dict[SourceId, Unrefreshable]:
    """Of `sources`, those whose change cannot reach a running process of this pod spec,
    with why: an env var (`valueFrom`) or `envFrom` is read once at container start, and a
    volume mounted with `subPath` is a copy the kubelet never updates. The rest reach it only
    through whole-volume mounts (`configMap`, `secret`, `projected`), which the kubelet
    updates in place: a refresh makes it do that at once."""
    wanted = frozenset(sources)
    sub_paths: dict[str, str] | None = None
    volumes = pod_spec.get("volumes") or ()
    out: dict[SourceId, Unrefreshable] = {}
    sites = find_sites(pod_spec)
    for site in sites:
        if site.source not in wanted or site.source in out:
            continue
        where = site.path
        if where[0] == "volumes":
            if sub_paths is None:
                sub_paths = _sub_path_mounts(pod_spec)
            volume = get_path(volumes, where[1:2])
            name = volume.get("name") if isinstance(volume, dict) else None
            if isinstance(name, str) and name in sub_paths:
                out[site.source] = Unrefreshable("subPath", sub_paths[name], name)
            continue
        container = get_path(pod_spec, where[:2])
        cname = container.get("name") if isinstance(container, dict) else None
        out[site.source] = Unrefreshable(str(where[2]), str(cname or "?"))
    if len(out) < len(wanted):
        referenced = {site.source for site in sites}
        for sid in wanted:
            if sid not in referenced:  # (named by configpin.io/extra-sources alone)
                out[sid] = Unrefreshable("extra", "")
    return out
