"""Workloads another controller owns: left to their owner, unless the owner is opted in.

A workload with a `controller: true` ownerReference is made from its owner's template (a
Deployment's ReplicaSet, a CronJob's Job) or by an operator. configpin pins the owner's
template where it knows the owner; an operator's workload is skipped by default and pinned
when its owner kind is configured (`--pin-owned-by`) or the workload itself says
`configpin.io/owned: "pin"`. Neither ever applies to a Pod, nor to a workload whose owner is
a kind configpin pins itself: that one's template decides.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, Final

from webhook.core.constants import ANN_OWNED, OWNED_PIN
from webhook.core.kinds import BUILTIN_GROUP_KINDS, POD, custom_kind, group_of
from webhook.core.refs import get_path

_KIND: Final = re.compile(r"^[A-Z][A-Za-z0-9]{0,62}$")
_GROUP: Final = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*$")

# (group, Kind) of owners whose workloads are pinned although owned: set once at start.
_pinned_owners: set[tuple[str, str]] = set()


def parse_owner_kinds(text: str) -> frozenset[tuple[str, str]]:
    """Comma-separated `Kind.group` (`Kind` alone: the core group). Raises ValueError."""
    out: set[tuple[str, str]] = set()
    for entry in text.split(","):
        item = entry.strip()
        if not item:
            continue
        kind, _, group = item.partition(".")
        if not _KIND.match(kind) or (group and not _GROUP.match(group)):
            raise ValueError(f"{item!r}: expected Kind.group, e.g. Foo.example.com")
        if (group, kind) in BUILTIN_GROUP_KINDS:
            raise ValueError(
                f"{item!r}: a {kind} is configpin's own business (its template is pinned), "
                "not an operator's"
            )
        out.add((group, kind))
    return frozenset(out)


def use_owner_kinds(kinds: Iterable[tuple[str, str]]) -> None:
    _pinned_owners.clear()
    _pinned_owners.update(kinds)


def pinned_owners() -> frozenset[tuple[str, str]]:
    return frozenset(_pinned_owners)


def controller_of(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The ownerReference with `controller: true`, if any."""
    for ref in get_path(obj, ("metadata", "ownerReferences")) or ():
        if isinstance(ref, dict) and ref.get("controller") is True:
            return ref
    return None


def _known_owner(group: str, kind: str) -> bool:
    custom = custom_kind(kind)
    return (group, kind) in BUILTIN_GROUP_KINDS or (custom is not None and custom.group == group)


def operator_owned(obj: Mapping[str, Any]) -> bool:
    """Owned by a controller of a kind configpin does not know (an operator's workload)."""
    owner = controller_of(obj)
    if owner is None or obj.get("kind") == POD:
        return False
    return not _known_owner(group_of(str(owner.get("apiVersion") or "")), str(owner.get("kind")))


def left_to_owner(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The controller ownerReference that keeps configpin off this object, or None when
    configpin pins it (not owned, or owned by an opted-in operator)."""
    owner = controller_of(obj)
    if owner is None:
        return None
    if obj.get("kind") == POD:
        return owner
    group, kind = group_of(str(owner.get("apiVersion") or "")), str(owner.get("kind") or "")
    if _known_owner(group, kind):
        return owner
    if (group, kind) in _pinned_owners:
        return None
    annotations = get_path(obj, ("metadata", "annotations"))
    if isinstance(annotations, dict) and annotations.get(ANN_OWNED) == OWNED_PIN:
        return None
    return owner


def owned_reason(owner: Mapping[str, Any]) -> str:
    """Why a workload `owner` controls is left to it, and how to pin it anyway (the
    SkippedOwned Event and `configpin status` say it alike)."""
    return (
        f"owned by {owner.get('kind', '?')} {owner.get('name', '?')}, another controller, "
        f"whose template decides (pin it anyway: {ANN_OWNED}: {OWNED_PIN} on it, or "
        "--pin-owned-by for its owner's kind)"
    )


def is_controlled(obj: Mapping[str, Any]) -> bool:
    refs = get_path(obj, ("metadata", "ownerReferences")) or ()
    return any(isinstance(r, dict) and r.get("controller") is True for r in refs)
