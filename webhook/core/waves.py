"""The waves of a change: one change consumed by several workloads rolls in waves
(`--rollout-waves`), a wave starting when the previous one's rollouts are complete.

Pure: the steps of a wave list, the order of a change's members and the cut of that order
into waves. Who the members are (the workloads a change reaches) is worked out from the index
by webhook.controller.wavecut.WaveCut, which the wave gate and the preview both call.

- `parse_waves`: `--rollout-waves` (counts, shares of the rest, `approve` between waves).
- `wave_order`: lower `configpin.io/wave` first, then a stable place of each workload's own
  (`wave_place`), the same in every change, so that no two changes order two workloads apart;
  `rolled_first`: the members that rolled for the change already before the others.
- `cut_waves` cuts the members in order into waves over those that can vouch for the change
  (healthy before, with pods): the others join the last wave, never one before an approval
  that a canary waits for. `approval_from`: the first wave that waits for the change's
  approval.
- `Wait`: why a stale workload does not roll yet (the gate's answer).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final, TypeVar

from webhook.core.constants import ANN_ROLLOUT_WAVES, ANN_WAVE, APPROVE_STEP
from webhook.core.record import annotations_of

_WAVE_BOUND: Final = 1_000_000


class WaitReason(StrEnum):
    """Why a stale workload does not roll yet (the wave gate's answer)."""

    CAP = "cap"  # its namespace has --max-rolling rollouts in flight
    WAVE = "wave"  # an earlier wave of the change is not complete
    STOPPED = "stopped"  # an earlier wave of the change failed: the waves after it never start
    APPROVAL = "approval"  # its wave comes after `approve`: the change is not approved yet
    WINDOW = "window"  # its rollout windows do not allow a rollout now (status awaiting-window)
    BUDGET = "budget"  # its rollout budget is spent: it is held as flapping
    PAUSED = "paused"  # a person paused the change (`configpin pause`): no rollout of it starts
    ABORTED = "aborted"  # a person aborted the change (`configpin abort`): none starts again


@dataclass(frozen=True, slots=True)
class Wait:
    """The gate's answer for one stale workload, as every face of configpin reads it: the
    ConfigRollout's member, its Event, `configpin status`, the dashboard."""

    reason: WaitReason
    why: str  # in a person's words
    # (windows, budget) when, in seconds since the epoch, it may roll: looked at again then
    until: float | None = None
    wave: int | None = None  # (waves) its wave, from 1
    waves: int | None = None  # (waves) how many the change has


def wave_of(obj: Mapping[str, Any]) -> int:
    """The workload's place among the waves (lower first; 0 when it does not say)."""
    value = annotations_of(obj).get(ANN_WAVE)
    try:
        wave = int(value) if isinstance(value, str) else 0
    except ValueError:
        return 0
    return max(-_WAVE_BOUND, min(_WAVE_BOUND, wave))


@dataclass(frozen=True)
class WaveStep:
    count: int = 0  # this many workloads
    fraction: float = 0.0  # or this share of the rest
    approve: bool = False  # no wave: the waves after it wait for the change's approval


def parse_waves(text: str) -> tuple[WaveStep, ...] | None:
    """`--rollout-waves`: comma-separated counts (`1`) and shares of the rest (`10%`), and
    `approve` (the waves after it wait until the change is approved); `off` (None): every
    workload at once. A last step that leaves some out is followed by the rest. Raises
    ValueError saying what is wrong."""
    text = text.strip()
    if text.lower() == "off":
        return None
    steps: list[WaveStep] = []
    for raw in text.split(","):
        item = raw.strip()
        if item.lower() == APPROVE_STEP:
            if steps and steps[-1].approve:
                raise ValueError(
                    f"{text!r}: approve twice in a row; e.g. 1,10%,100% or 1,approve,100%"
                )
            steps.append(WaveStep(approve=True))
            continue
        try:
            if item.endswith("%"):
                share = float(item[:-1])
                if not 0 < share <= 100:
                    raise ValueError
                steps.append(WaveStep(fraction=share / 100))
            else:
                count = int(item)
                if count < 1:
                    raise ValueError
                steps.append(WaveStep(count=count))
        except ValueError:
            raise ValueError(
                f"{item!r} in {text!r}: each wave is a count (1) or a share of the rest (10%), "
                "with approve between waves where they wait for an approval, e.g. 1,10%,100% "
                "or 1,approve,100%; or off"
            ) from None
    if not any(not s.approve for s in steps):
        raise ValueError("no wave given: e.g. 1,10%,100%; or off")
    return tuple(steps)


def approval_from(steps: Sequence[WaveStep] | None) -> int | None:
    """The first wave (from 0) that waits for the change's approval: the one after the first
    `approve` step; None: no step asks for one."""
    waves = [s.approve for s in steps or ()]
    return waves.index(True) if True in waves else None


def asks_approval(obj: Mapping[str, Any]) -> bool:
    """The workload's own wave list holds `approve`: its rollouts wait for an approval."""
    value = annotations_of(obj).get(ANN_ROLLOUT_WAVES)
    if not isinstance(value, str) or len(value) > 256:
        return False
    return any(part.strip().lower() == APPROVE_STEP for part in value.split(","))


def wave_sizes(total: int, steps: Sequence[WaveStep]) -> list[int]:
    sizes: list[int] = []
    left = total
    for step in steps:
        if step.approve:
            continue
        if left <= 0:
            break
        size = step.count if step.count else math.ceil(step.fraction * left)
        size = max(1, min(size, left))
        sizes.append(size)
        left -= size
    if left > 0:
        sizes.append(left)
    return sizes


@dataclass(frozen=True, order=True)
class Member:
    """A workload a change reaches."""

    wave: int  # its configpin.io/wave
    namespace: str
    kind: str
    name: str


def _stable(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()[:8]


def wave_place(member: Member) -> tuple[int, bytes, bytes]:
    """A workload's place in the order of every change it is a member of: its
    configpin.io/wave, then a stable pseudo-random place from its kind and name, its namespace
    breaking a tie (the same name in several namespaces). It depends on the workload alone,
    never on the other members of a change: so any two changes order the members they share
    the same way, and one never waits for a workload that waits for it (two shared changes
    each cutting its own round of namespaces could put each other's canary in a later wave,
    and both waited for ever)."""
    return (member.wave, _stable(f"{member.kind}/{member.name}"), _stable(member.namespace))


def wave_order(members: Iterable[Member]) -> list[Member]:
    """Lower configpin.io/wave first, then by `wave_place`: within one namespace a stable
    pseudo-random order; across the namespaces of a shared change their workloads interleave
    (each namespace's in proportion to how many it has, the same name in each one namespace
    after another), and any subset of members keeps the order."""
    return sorted(members, key=wave_place)


_M = TypeVar("_M")


def rolled_first(ordered: Sequence[_M], rolled: Callable[[_M], bool]) -> list[_M]:
    """The members in order, those that rolled for the change already first (a member that
    joined the change since, such as a reader of keys only a later write changed, takes no
    wave from one that rolled: the waves it held, and what came of them, stay where they
    were)."""
    first = [m for m in ordered if rolled(m)]
    if not first:
        return list(ordered)
    return first + [m for m in ordered if not rolled(m)]


def cut_waves(
    ordered: Sequence[_M], vouches: Callable[[_M], bool], steps: Sequence[WaveStep] | None
) -> list[list[_M]]:
    """The waves of a change, its members in order: cut over those that can vouch for it
    (healthy with pods before it), the others joining the last wave (never a canary, and what
    comes of them holds no one up). Where the steps hold `approve` and the waves of those that
    vouch all come before it (the canary alone vouches), the others' wave is the first after
    it: a member that cannot vouch never takes the content before it is approved behind a
    canary (one scaled to zero while it waited would start with it when scaled up again).
    Where none vouches (a broken app's config fix), they all roll at once, as without waves."""
    if steps is None:
        return [list(ordered)] if ordered else []
    counted = [m for m in ordered if vouches(m)]
    others = [m for m in ordered if not vouches(m)]
    plan: list[list[_M]] = []
    at = 0
    for size in wave_sizes(len(counted), steps):
        plan.append(counted[at : at + size])
        at += size
    if others:
        approval = approval_from(steps)
        if approval is not None and plan and len(plan) <= approval:
            plan += [[] for _ in range(approval - len(plan))]
            plan.append(others)
        elif plan:
            plan[-1] = plan[-1] + others
        else:
            plan.append(others)
    return plan


def wave_plan(members: Iterable[Member], steps: Sequence[WaveStep] | None) -> list[list[Member]]:
    """The waves of members that all vouch for the change."""
    return cut_waves(wave_order(members), lambda _m: True, steps)
