"""What configpin says, as people and their tools read it: why it leaves a workload alone
(`SkipReason`), why a workload that asked to be refreshed rolls (`Fallback`), the reason of
each Event it records (`EventReason`, with its type and action in one table, `EVENTS`), and
the states `configpin status` prints (`Status`, `SourceState`). One list each for admission,
the controller, metrics labels, Events and the status command.

The values are an interface: alerts, dashboards and `kubectl get events --field-selector
reason=...` read them, and docs/operations.md lists the Events (tests/unit/kube/test_events.py
holds it to `EVENTS`). A metric label is a time series kept for the life of the process, so
labels come from these enums only, never from a request or an object. Several reasons that a
user acts on the same way share one label (`not-managed`: configpin does not pin the object
at all).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
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
    # Stakater Reloader's annotations ask Reloader to roll it for every source that changed:
    # left to Reloader, whose template write admission stamps (one restart, not two)
    RELOADER = "left-to-reloader"
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
    EXTRA = "extra"  # ... or through no reference at all (configpin.io/extra-sources)
    KIND = "kind"  # configpin does not find the pods of this kind (a custom one)
    DISABLED = "disabled"  # --refresh-pods=false
    FORBIDDEN = "forbidden"  # configpin may not patch its pods

    @property
    def in_the_way(self) -> bool:
        """A setting or a permission stands in the way, not the workload: said as a Warning."""
        return self in (Fallback.DISABLED, Fallback.FORBIDDEN)


class Status(StrEnum):
    """A workload's state in `configpin status` (its STATE column; `state` in -o json)."""

    CURRENT = "current"  # every consumed source is what it recorded
    STALE = "stale"  # a consumed source changed since
    WAITING = "waiting"  # its rollout waits for an earlier wave, or the cap on rollouts
    AWAITING_APPROVAL = "awaiting-approval"  # its wave comes after `approve`: not approved yet
    AWAITING_WINDOW = "awaiting-window"  # its rollout windows do not allow a rollout now
    FLAPPING = "flapping"  # its rollout budget is spent: a source keeps changing
    PAUSED = "paused"  # a person paused the change (`configpin pause`): resumed, it rolls
    ABORTED = "aborted"  # a person aborted the change (`configpin abort`): retried, it rolls
    ROLLING = "rolling"  # a config rollout configpin follows is in progress
    FAILED = "failed"  # it failed: undone, held, left, or rolled back by a person
    REJECTED = "rejected"  # the content a failed rollout brought is kept out
    MISSING = "missing"  # a required source is missing
    # stale only for changes Stakater Reloader's annotations leave to Reloader (not rolled yet)
    LEFT_TO_RELOADER = "left-to-reloader"
    NOT_PINNED = "not-pinned"
    UNKNOWN = "unknown"  # configpin status could not ask the API server

    @property
    def failing(self) -> bool:
        """Shown in capitals: a person must look at it."""
        return self in (Status.STALE, Status.MISSING, Status.FAILED, Status.FLAPPING)

    @property
    def exit_code(self) -> int:
        """What `configpin status` exits with for a workload in this state (the highest of its
        rows): 0 only where it is known to run what its sources hold now, or configpin has
        nothing to deliver to it; 2 where status could not judge."""
        return STATUS_EXIT[self]


# `configpin status`'s exit code per state (docs/status.md lists them; a CI gate reads it):
# every state but these two is a change not yet delivered, or one that failed.
STATUS_EXIT: Final[Mapping[Status, int]] = {
    **dict.fromkeys(Status, 1),
    Status.CURRENT: 0,
    Status.NOT_PINNED: 0,  # nothing of configpin's to deliver (mode off, no sources, ...)
    Status.UNKNOWN: 2,  # not known to be current: the dry run was refused or failed
}


class SourceState(StrEnum):
    """One consumed source's state in `configpin status` (`-o wide`, and the WHY column)."""

    CURRENT = "current"  # what the workload recorded
    STALE = "stale"  # changed since
    NEW = "new"  # consumed now, not recorded
    GONE = "gone"  # recorded, no longer there
    REJECTED = "rejected"  # changed to content a failed rollout brought (kept out)


NORMAL: Final = "Normal"
WARNING: Final = "Warning"


class EventReason(StrEnum):
    """The reason of each Event configpin records (docs/operations.md says when)."""

    ROLLOUT_STARTED = "RolloutStarted"
    ROLLOUT_DEFERRED = "RolloutDeferred"
    RECORDED = "Recorded"
    REFRESHED = "Refreshed"
    ROLLED_INSTEAD_OF_REFRESH = "RolledInsteadOfRefresh"
    ROLLOUT_FAILED = "RolloutFailed"
    CONFIG_ROLLOUT_WAITING = "ConfigRolloutWaiting"
    CONFIG_ROLLOUT_COMPLETE = "ConfigRolloutComplete"
    CONFIG_ROLLED_BACK = "ConfigRolledBack"
    CONFIG_ROLLOUT_FAILED = "ConfigRolloutFailed"
    CONFIG_ROLLED_BACK_BY_PERSON = "ConfigRolledBackByPerson"
    CONFIG_ROLLOUT_LEFT = "ConfigRolloutLeft"
    CONFIG_ROLLOUT_AWAITING_APPROVAL = "ConfigRolloutAwaitingApproval"
    CONFIG_ROLLOUT_AWAITING_WINDOW = "ConfigRolloutAwaitingWindow"
    CONFIG_ROLLOUT_FLAPPING = "ConfigRolloutFlapping"
    CONFIG_ROLLOUT_PAUSED = "ConfigRolloutPaused"
    CONFIG_ROLLOUT_ABORTED = "ConfigRolloutAborted"
    SKIPPED_OWNED = "SkippedOwned"
    LEFT_TO_RELOADER = "LeftToReloader"
    SOURCE_MISSING = "SourceMissing"
    NOT_PINNED = "NotPinned"
    OPTED_OUT = "OptedOut"
    ROLLBACK_KEPT = "RollbackKept"
    COPY_CREATED = "CopyCreated"
    COPY_REMOVED = "CopyRemoved"
    LOOKALIKE_IGNORED = "LookalikeIgnored"

    @property
    def said(self) -> EventKind:
        return EVENTS[self]


@dataclass(frozen=True, slots=True)
class EventKind:
    """How an Event of one reason is recorded, and what `configpin status` makes of it."""

    types: tuple[str, ...]  # its type; a second one where its caller says (`warning=True`)
    action: str  # what configpin was doing
    # the state it gives a stale workload it was said of last (its rollout's wait)
    status: Status | None = None


_ROLLOUT: Final = "Rollout"
EVENTS: Final[Mapping[EventReason, EventKind]] = {
    EventReason.ROLLOUT_STARTED: EventKind((NORMAL,), _ROLLOUT),
    EventReason.ROLLOUT_DEFERRED: EventKind((NORMAL,), _ROLLOUT),
    EventReason.RECORDED: EventKind((NORMAL,), "Record"),
    EventReason.REFRESHED: EventKind((NORMAL,), "Refresh"),
    # a Warning where a setting or a permission stood in the way (Fallback.in_the_way)
    EventReason.ROLLED_INSTEAD_OF_REFRESH: EventKind((NORMAL, WARNING), _ROLLOUT),
    EventReason.ROLLOUT_FAILED: EventKind((WARNING,), _ROLLOUT),
    EventReason.CONFIG_ROLLOUT_WAITING: EventKind((NORMAL,), _ROLLOUT, Status.WAITING),
    EventReason.CONFIG_ROLLOUT_COMPLETE: EventKind((NORMAL,), _ROLLOUT),
    EventReason.CONFIG_ROLLED_BACK: EventKind((WARNING,), _ROLLOUT),
    EventReason.CONFIG_ROLLOUT_FAILED: EventKind((WARNING,), _ROLLOUT),
    EventReason.CONFIG_ROLLED_BACK_BY_PERSON: EventKind((WARNING,), _ROLLOUT),
    EventReason.CONFIG_ROLLOUT_LEFT: EventKind((NORMAL,), _ROLLOUT),
    EventReason.CONFIG_ROLLOUT_AWAITING_APPROVAL: EventKind(
        (NORMAL,), _ROLLOUT, Status.AWAITING_APPROVAL
    ),
    EventReason.CONFIG_ROLLOUT_AWAITING_WINDOW: EventKind(
        (NORMAL,), _ROLLOUT, Status.AWAITING_WINDOW
    ),
    EventReason.CONFIG_ROLLOUT_FLAPPING: EventKind((WARNING,), _ROLLOUT, Status.FLAPPING),
    EventReason.CONFIG_ROLLOUT_PAUSED: EventKind((NORMAL,), _ROLLOUT, Status.PAUSED),
    EventReason.CONFIG_ROLLOUT_ABORTED: EventKind((WARNING,), _ROLLOUT, Status.ABORTED),
    EventReason.SKIPPED_OWNED: EventKind((NORMAL,), "Skip"),
    EventReason.LEFT_TO_RELOADER: EventKind((NORMAL,), "Skip"),
    EventReason.SOURCE_MISSING: EventKind((WARNING,), "Admit"),
    EventReason.NOT_PINNED: EventKind((WARNING,), "Admit"),
    EventReason.OPTED_OUT: EventKind((NORMAL,), "Admit"),
    EventReason.ROLLBACK_KEPT: EventKind((NORMAL,), "Admit"),
    EventReason.COPY_CREATED: EventKind((NORMAL,), "Snapshot"),
    EventReason.COPY_REMOVED: EventKind((NORMAL,), "Sweep"),
    EventReason.LOOKALIKE_IGNORED: EventKind((WARNING,), "Snapshot"),
}
# The Events whose reason says why a stale workload waits, by reason: the state it shows.
WAIT_STATES: Final[Mapping[str, Status]] = {
    r.value: k.status for r, k in EVENTS.items() if k.status is not None
}
