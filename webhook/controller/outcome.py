"""What reconciling one workload came to: the typed result a reconciler returns to its runner
(controller-runtime's `Result` and `TerminalError`, kopf's named causes).

- `Rolled`: its pod template changed, a rolling update starts (the minimum interval between
  its rollouts counts from now);
- `Refreshed`: its running pods were told to sync their volumes, its template left alone;
- `Skipped`: nothing was written, or only its record (`SkipReason.RECORD_ONLY`), and why;
- `Settled`: the rollout configpin followed on it ended: complete, left, or failed and acted
  upon;
- `Poll`: the rollout it follows goes on: look again after `seconds` (no failure);
- `RetryAfter`: it failed and must be looked at again (after `seconds`, or the runner's
  backoff; after the runner's limit, given up).
"""

from __future__ import annotations

from dataclasses import dataclass

from webhook.core.model import SourceId
from webhook.core.reasons import SkipReason
from webhook.core.record import Action, State
from webhook.core.refresh import RollInstead
from webhook.core.waves import Wait


@dataclass(frozen=True, slots=True)
class Rolled:
    changed: frozenset[SourceId] = frozenset()
    instead: RollInstead | None = None  # why a workload that asked for refresh rolled


@dataclass(frozen=True, slots=True)
class Refreshed:
    pods: int  # running pods told to sync now


@dataclass(frozen=True, slots=True)
class Skipped:
    reason: SkipReason
    wait: Wait | None = None  # (SkipReason.WAITING) what its rollout waits for


@dataclass(frozen=True, slots=True)
class Settled:
    state: State  # complete, left, failed
    action: Action | None = None  # (failed) what came of it


@dataclass(frozen=True, slots=True)
class Poll:
    seconds: float  # the rollout it follows goes on: look again after this long


@dataclass(frozen=True, slots=True)
class RetryAfter:
    why: str
    seconds: float | None = None  # None: the runner's backoff by the failures so far
    rolled: bool = False  # it rolled all the same (then stored another record than planned)


Outcome = Rolled | Refreshed | Skipped | Settled | Poll | RetryAfter
