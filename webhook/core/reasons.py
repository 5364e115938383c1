"""Why configpin leaves a workload alone, or rolls one that asked to be refreshed: one list of
reasons for admission, the controller, metrics labels and Events.

A metric label is a time series kept for the life of the process, so labels come from these
enums only, never from a request or an object. Several reasons that a user acts on the same
way share one label (`not-managed`: configpin does not pin the object at all).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final


class SkipReason(StrEnum):
    """Why an object is left as it is (the value names the reason in logs and tests)."""

    # Not configpin's to pin (admission answers "allowed", unchanged; the controller does
    # not index it).
    NOT_HANDLED = "kind-not-handled"  # a kind configpin does not pin
    OTHER_GROUP = "other-group"  # a handled Kind's name, in another API group
    OWN_COPY = "own-copy"  # a snapshot copy configpin made
    OWNED = "owned"  # its controller's template decides (or an operator's, not opted in)
    WORKLOAD_REF = "workload-ref"  # an Argo Rollout running another workload's template
    FIXED_TEMPLATE = "fixed-template"  # a Pod's or Job's template, after its creation
    MODE_OFF = "mode-off"  # configpin.io/mode: off
    NO_POD_SPEC = "no-pod-spec"
    NO_SOURCES = "no-sources"  # consumes no ConfigMap or Secret
    TOO_MANY_SOURCES = "too-many-sources"  # more than --max-sources: admitted unpinned
    # Nothing to do now.
    CURRENT = "current"  # every consumed source is what it recorded
    UNCHANGED = "unchanged"  # planned, and the plan changes nothing
    RECORD_ONLY = "record-only"  # its record written without a rollout (a baseline...)
    WAITING = "waiting"  # its rollout waits for an earlier wave, or the cap on rollouts in flight
    # Cannot act now (looked at again on the next change or resync).
    NAMESPACE = "namespace"  # not in a namespace configpin acts in (any more)
    NOT_LEADER = "not-leader"
    GONE = "gone"  # deleted meanwhile
    NO_SNAPSHOTS = "no-snapshots"  # snapshot mode without the snapshot writer
    NOT_STORED = "not-stored"  # the API server stored another record than planned
    ERROR = "error"

    @property
    def label(self) -> str:
        """The `reason` label of configpin_rollouts_skipped_total."""
        return _NOT_MANAGED_LABEL if self in _NOT_MANAGED else self.value


_NOT_MANAGED_LABEL: Final = "not-managed"
_NOT_MANAGED: Final = frozenset(
    {
        SkipReason.NOT_HANDLED,
        SkipReason.OTHER_GROUP,
        SkipReason.OWN_COPY,
        SkipReason.OWNED,
        SkipReason.WORKLOAD_REF,
        SkipReason.FIXED_TEMPLATE,
        SkipReason.NO_POD_SPEC,
        SkipReason.NO_SOURCES,
        SkipReason.TOO_MANY_SOURCES,
    }
)


class Fallback(StrEnum):
    """Why a change to a workload that asks for `on-change: refresh` rolls it instead (the
    `reason` label of configpin_refresh_fallbacks_total)."""

    SNAPSHOT_MODE = "snapshot-mode"  # a copy never changes
    REFERENCES = "references"  # its template points at copies: it must point back
    ENV = "env"  # the change reaches a container through env or envFrom
    SUBPATH = "subpath"  # ... or through a volume mounted with subPath
    KIND = "kind"  # configpin does not find the pods of this kind (a custom one)
    DISABLED = "disabled"  # --refresh-pods=false
    FORBIDDEN = "forbidden"  # configpin may not patch its pods

    @property
    def in_the_way(self) -> bool:
        """A setting or a permission stands in the way, not the workload: said as a Warning."""
        return self in (Fallback.DISABLED, Fallback.FORBIDDEN)
