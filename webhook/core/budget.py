"""The rollout budget, a flap guard (SPEC, "Windows and budgets"): at most COUNT rollouts that
configpin starts on a workload within PERIOD (`--rollout-budget`, `configpin.io/rollout-budget`;
default `6/1h`; `0` for none). Past it the workload is held as flapping until the oldest of
those rollouts leaves the period, then rolls once, to the latest content.

The count is kept in the cluster, on the workload itself (`configpin.io/rollout-starts`): the
times configpin started its last rollouts there, newest last, at most COUNT of them and none
older than PERIOD (older ones cannot hold it back), as JSON signed with the digest key over the
workload's identity like the rollout record, so a restart or a leader change does not reset
it and a tenant cannot reset it either (a record configpin did not write there counts as
none: the budget is spent by rollouts, never granted by a record). It is written in the same
patch as the rollout record that starts the rollout, so a rollout is never started uncounted.

`Limits`: what a workload says of its windows, its budget and configpin's starts there, as
the controller's index keeps it (`limits_of`).

Pure: the time is given; instants are seconds since the epoch.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from webhook.core.constants import ANN_ROLLOUT_BUDGET, ANN_ROLLOUT_STARTS, ANN_ROLLOUT_WINDOWS
from webhook.core.durations import SECOND, DurationError, format_duration, parse_duration
from webhook.core.record import annotations_of, workload_identity
from webhook.core.signed import opened, signed

DEFAULT_BUDGET: Final = "6/1h"
MAX_COUNT: Final = 100  # a larger count guards nothing (and bounds the record: ~1.6 kB)
MIN_PERIOD: Final = SECOND
_STARTS_DOMAIN: Final = b"configpin/rollout-starts/v1"
_STARTS_MAX: Final = 4096  # characters of a record believed


class BudgetError(ValueError):
    """Not a budget; the message says what is wrong (the caller adds the flag's or the
    annotation's name)."""


@dataclass(frozen=True, slots=True)
class Budget:
    """At most `count` rollouts within `period` (nanoseconds); `count` 0: no budget."""

    count: int
    period: int = 0

    @property
    def unlimited(self) -> bool:
        return self.count == 0

    @property
    def seconds(self) -> float:
        return self.period / SECOND

    def __str__(self) -> str:
        return "0" if self.unlimited else f"{self.count}/{format_duration(self.period)}"


NO_BUDGET: Final = Budget(0)


def parse_budget(text: Any) -> Budget:
    """`COUNT/PERIOD` (`6/1h`, `2/30s`: PERIOD as Go writes durations), or `0` for none."""
    if not isinstance(text, str):
        raise BudgetError(
            f"expected text (COUNT/PERIOD, like 6/1h, or 0), got {type(text).__name__}"
        )
    value = text.strip()
    if value == "0":
        return NO_BUDGET
    count_text, slash, period_text = value.partition("/")
    if not slash:
        raise BudgetError(f"{_short(text)}: COUNT/PERIOD expected (6/1h), or 0 for none")
    if not (count_text.isascii() and count_text.isdigit()):
        raise BudgetError(f"{_short(text)}: the count {_short(count_text)} is not a whole number")
    count = int(count_text) if len(count_text) <= 6 else MAX_COUNT + 1
    if count == 0:
        raise BudgetError(
            f"{_short(text)}: a count of 0 would never roll (0 alone turns the budget off)"
        )
    if count > MAX_COUNT:
        raise BudgetError(
            f"{_short(text)}: at most {MAX_COUNT} rollouts per period (a larger count guards "
            "nothing; 0 turns the budget off)"
        )
    try:
        period = parse_duration(period_text)
    except DurationError as e:
        raise BudgetError(f"{_short(text)}: the period {e}") from None
    if period < MIN_PERIOD:
        raise BudgetError(f"{_short(text)}: the period must be at least 1s")
    return Budget(count, period)


@dataclass(frozen=True, slots=True)
class Allowance:
    """What the budget says at an instant: how many rollouts configpin started within the
    period before it (`used`), and from when it allows the next (`at`: the instant asked
    about when it allows one then)."""

    used: int
    at: float

    def allows(self, now: float) -> bool:
        return self.at <= now


def allowance(budget: Budget, starts: Iterable[float], now: float) -> Allowance:
    """Whether the budget allows configpin to start another rollout of the workload at `now`,
    given when it started the ones before; if not, when it does again. A start recorded after
    `now` (another replica's clock ahead of this one's) counts as within the period."""
    if budget.unlimited:
        return Allowance(0, now)
    recent = sorted(s for s in starts if s > now - budget.seconds)
    if len(recent) < budget.count:
        return Allowance(len(recent), now)
    # (free again once the count-th newest start leaves the period)
    return Allowance(len(recent), max(now, recent[-budget.count] + budget.seconds))


def counted(budget: Budget, starts: Iterable[float], now: float) -> tuple[float, ...]:
    """The starts to keep after a rollout configpin starts at `now`: `now` and those before it
    still within the period, the newest `budget.count` (with no budget: `now` alone, which
    a budget set later counts from)."""
    kept = sorted([*(s for s in starts if s > now - budget.seconds), now])
    return tuple(kept[-max(budget.count, 1) :])


# -- the record on the workload


def encode_starts(hkey: bytes, identity: str, starts: Sequence[float]) -> str:
    """The text of `configpin.io/rollout-starts` for the workload (`identity`:
    webhook.core.record.workload_identity)."""
    return signed(hkey, _STARTS_DOMAIN, identity, {"starts": [float(s) for s in starts]})


def decode_starts(hkey: bytes, identity: str, text: Any) -> tuple[float, ...]:
    """The starts the workload's record holds, when configpin wrote it for this very workload;
    none for anything else (absent, edited, copied from another workload)."""
    body = opened(hkey, _STARTS_DOMAIN, identity, text, _STARTS_MAX)
    if body is None:
        return ()
    starts = body.get("starts")
    if not isinstance(starts, list):
        return ()
    out = [float(s) for s in starts if isinstance(s, (int, float)) and not isinstance(s, bool)]
    return tuple(sorted(out)[-MAX_COUNT:])


# -- what a workload says of its windows, its budget and its starts (the index keeps it)


@dataclass(frozen=True, slots=True)
class Limits:
    """What a workload says of when and how often configpin may roll it: its own
    `configpin.io/rollout-windows` and `configpin.io/rollout-budget` as written (None: not
    set; read by webhook.controller.limits, which keeps what each text means), and when
    configpin started its last rollouts (`configpin.io/rollout-starts`, as believed)."""

    windows: str | None
    budget: str | None
    starts: tuple[float, ...] = ()


NO_LIMITS: Final = Limits(None, None)


def limits_of(obj: Mapping[str, Any], hkey: bytes | None) -> Limits | None:
    """The workload's `Limits`; None when it says nothing of them."""
    own = annotations_of(obj)
    windows, budget = own.get(ANN_ROLLOUT_WINDOWS), own.get(ANN_ROLLOUT_BUDGET)
    text = own.get(ANN_ROLLOUT_STARTS)
    starts = (
        decode_starts(hkey, workload_identity(obj), text)
        if text is not None and hkey is not None
        else ()
    )
    if windows is None and budget is None and not starts:
        return None
    return Limits(_text(windows), _text(budget), starts)


def _text(value: Any) -> str | None:
    return value if value is None or isinstance(value, str) else str(value)


def _short(value: str) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
