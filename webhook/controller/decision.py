"""What the re-stamp decision (webhook.controller.restamp) says of a workload as read: what to
write, or why nothing, and what that write means once stored (the reconciler reads it)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from webhook.controller.follow import Ended
from webhook.core.model import PatchOp, SnapshotRequest
from webhook.core.progress import Progress
from webhook.core.reasons import SkipReason
from webhook.core.record import RolloutRecord
from webhook.core.refresh import RollInstead
from webhook.core.waves import Wait


@dataclass(frozen=True)
class Decision:
    """What to write on a workload as read (`ops`), or why nothing (`skip`), what must be
    done first, and what that write means once stored."""

    ops: list[PatchOp]
    skip: SkipReason | None = None
    intended: Mapping[str, str] = field(default_factory=dict)  # the record it writes
    # before the write: the copies that must exist (snapshot mode), the digests to refresh
    # the running pods to (then `ops` records that refresh), pods created since a refresh to
    # bring to it
    copies: tuple[SnapshotRequest, ...] = ()
    refresh: Mapping[str, str] | None = None
    catch_up: bool = False
    refreshed: int | None = None  # (filled by the reconciler) pods told to sync
    instead: RollInstead | None = None  # why an on-change: refresh workload rolls
    note: str = ""  # why its record alone is written
    # safe delivery (webhook.controller.follow, .waves)
    rollout: RolloutRecord | None = None  # the rollout this write starts
    progress: Progress | None = None  # how the rollout it follows is going
    poll: float | None = None  # still going: look again after this long
    ended: Ended | None = None  # the rollout it followed ended: what came of it
    waiting: Wait | None = None  # why it does not roll yet (a wave, the cap)

    @classmethod
    def leave(cls, reason: SkipReason) -> Decision:
        return cls([], reason)
