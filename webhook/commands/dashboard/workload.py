"""The dashboard's pages read a workload the way configpin wrote it: its rollout record, where
its pod spec reads each source and how (uses), its mode and on-change policy; and what the
pages share (a workload's reference, the page size, the words on unsigned records).

Pure, as every part of the pages' data (views.py, changes.py): no cluster call, no clock."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from webhook.core.constants import (
    ANN_MODE,
    ANN_ON_CHANGE,
    ANN_ON_FAILURE,
    ANN_REJECTED,
    ANN_ROLLOUT,
    ANN_SOURCES,
    MODE_OFF,
    MODE_SNAPSHOT,
    ON_CHANGE_REFRESH,
)
from webhook.core.kinds import template_paths, workload_kind
from webhook.core.model import JSONObject
from webhook.core.progress import Standing, replicas, standing
from webhook.core.record import annotations_of, digest_mapping_any
from webhook.core.refs import CONTAINER_LISTS, find_sites, get_path

PAGE: Final = 50  # rows of a list page
REPLICAS: Final = ("updated", "ready", "desired")  # a workload's pods, as its rows say them

UNSIGNED: Final = (
    "as configpin's records stand on the objects: this page holds no digest key, so their "
    "signatures are not checked (configpin itself believes only those it signed)"
)


WorkloadRef = tuple[str, str, str]  # kind, namespace, name

StatusOf = Callable[[JSONObject], Mapping[str, Any] | None]


# --- a workload as the pages read it ----------------------------------------------------------


def ref_of(obj: Mapping[str, Any]) -> WorkloadRef:
    meta = obj.get("metadata") or {}
    return (str(obj.get("kind")), str(meta.get("namespace") or ""), str(meta.get("name") or ""))


def _template_annotations(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    paths = template_paths(str(obj.get("kind", "")))
    meta = get_path(obj, paths[0]) if paths else None
    found = meta.get("annotations") if isinstance(meta, dict) else None
    return found if isinstance(found, dict) else {}


def _pod_spec(obj: Mapping[str, Any]) -> dict[str, Any]:
    paths = template_paths(str(obj.get("kind", "")))
    spec = get_path(obj, paths[1]) if paths else None
    return spec if isinstance(spec, dict) else {}


def record_of(obj: Mapping[str, Any]) -> dict[str, Any]:
    """configpin's rollout record on the workload, as it stands ({} when none)."""
    return digest_mapping_any(annotations_of(obj).get(ANN_ROLLOUT))


def since_of(record: Mapping[str, Any]) -> float | None:
    since = record.get("since")
    return float(since) if isinstance(since, int | float) else None


def healthy(obj: Mapping[str, Any]) -> bool:
    kind = workload_kind(str(obj.get("kind")))
    return kind is None or standing(kind, obj) is Standing.HEALTHY


def replicas_of(obj: Mapping[str, Any]) -> dict[str, int] | None:
    """Its updated, ready and desired pods by its own status, as its ConfigRollout says a
    member's (`webhook.core.progress.replicas`); None: its kind counts none."""
    kind = workload_kind(str(obj.get("kind")))
    found = replicas(kind, obj) if kind is not None else None
    return None if found is None else dict(zip(REPLICAS, found, strict=True))


def member_replicas(member: Mapping[str, Any]) -> dict[str, int] | None:
    """A ConfigRollout member's `replicas`, as published (None: not said, or not counts)."""
    said = member.get("replicas")
    if not isinstance(said, Mapping):
        return None
    found: dict[str, int] = {}
    for k in REPLICAS:
        value = said.get(k)
        if not isinstance(value, int) or isinstance(value, bool):
            return None
        found[k] = value
    return found


@dataclass(frozen=True)
class Use:
    """One place a workload's pod spec reads a source."""

    keys: frozenset[str] | None  # None: every key
    how: str  # env, envFrom, volume, subPath
    where: str  # in a person's words
    optional: bool


def _mounts(spec: Mapping[str, Any]) -> dict[str, list[tuple[str, str, str]]]:
    """Volume name -> (container, mountPath, subPath) of each mount of it."""
    out: dict[str, list[tuple[str, str, str]]] = {}
    for clist in CONTAINER_LISTS:
        for container in spec.get(clist) or ():
            if not isinstance(container, dict):
                continue
            for mount in container.get("volumeMounts") or ():
                if isinstance(mount, dict) and isinstance(mount.get("name"), str):
                    sub = str(mount.get("subPath") or mount.get("subPathExpr") or "")
                    out.setdefault(mount["name"], []).append(
                        (str(container.get("name") or "?"), str(mount.get("mountPath") or ""), sub)
                    )
    return out


def uses(obj: Mapping[str, Any]) -> dict[str, list[Use]]:
    """How the workload's pod spec reads each source ("configmap/<name>" -> its uses)."""
    spec = _pod_spec(obj)
    mounts: dict[str, list[tuple[str, str, str]]] | None = None
    out: dict[str, list[Use]] = {}
    for site in find_sites(spec):
        where = site.path
        key = f"{site.source.kind.value}/{site.source.name}"
        if where[0] == "volumes":
            if mounts is None:
                mounts = _mounts(spec)
            volume = get_path(spec, where[:2])
            vname = str(volume.get("name") if isinstance(volume, dict) else "?")
            found = mounts.get(vname) or [("", "", "")]
            for container, at, sub in found:
                place = f" at {at}" if at else ""
                cont = f" in {container}" if container else ""
                if sub:
                    use = Use(
                        site.keys,
                        "subPath",
                        f"volume {vname}, subPath {sub}{place}{cont}",
                        site.optional,
                    )
                else:
                    kind = "projected volume" if "projected" in where else "volume"
                    use = Use(site.keys, "volume", f"{kind} {vname}{place}{cont}", site.optional)
                out.setdefault(key, []).append(use)
            continue
        container = get_path(spec, where[:2])
        cname = str(container.get("name") if isinstance(container, dict) else "?")
        if where[2] == "env":
            env = get_path(spec, where[:4])
            var = str(env.get("name") if isinstance(env, dict) else "?")
            use = Use(site.keys, "env", f"env {var} in {cname}", site.optional)
        else:
            use = Use(site.keys, "envFrom", f"envFrom in {cname}", site.optional)
        out.setdefault(key, []).append(use)
    return out


def mode_of(obj: Mapping[str, Any]) -> str:
    return str(annotations_of(obj).get(ANN_MODE) or "")


def pinned(obj: Mapping[str, Any]) -> bool:
    return bool(digest_mapping_any(_template_annotations(obj).get(ANN_SOURCES)))


def on_change(obj: Mapping[str, Any], source: str, its_uses: Sequence[Use]) -> str:
    """What a change of `source` does to the workload: roll, refresh, or nothing."""
    own = annotations_of(obj)
    if mode_of(obj) == MODE_OFF:
        return "nothing (configpin.io/mode: off)"
    if not pinned(obj):
        return "nothing (not pinned)"
    kind = workload_kind(str(obj.get("kind")))
    if kind is not None and not kind.rolls:
        return f"nothing (a {kind.kind}'s pod template cannot change)"
    rejected = digest_mapping_any(own.get(ANN_REJECTED))
    held = (
        f"; hold where its content was rejected before ({ANN_REJECTED})"
        if source in rejected
        else ""
    )
    if own.get(ANN_ON_CHANGE) == ON_CHANGE_REFRESH and mode_of(obj) != MODE_SNAPSHOT:
        if all(u.how == "volume" for u in its_uses):
            return "refresh" + held
        return "roll (refresh cannot reach an env var or a subPath mount)" + held
    return "roll" + held


def on_failure(obj: Mapping[str, Any]) -> str:
    value = annotations_of(obj).get(ANN_ON_FAILURE)
    if isinstance(value, str) and value:
        return value
    return (
        "undo" if mode_of(obj) == MODE_SNAPSHOT else "configpin's default (hold in checksum mode)"
    )
