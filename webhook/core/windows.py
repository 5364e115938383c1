"""Rollout windows: when configpin may start a rollout (SPEC, "Windows and budgets").

A window list has the fields and meaning of Argo CD's sync windows, written as JSON or YAML:

    [{"kind": "deny", "schedule": "0 22 * * 5", "duration": "60h", "timeZone": "Europe/Berlin"}]

- `kind`: `allow` or `deny`.
- `schedule`: a five-field cron expression (minute hour day-of-month month day-of-week, with
  `*`, lists, ranges, steps and the names JAN-DEC, SUN-SAT) for when the window opens, read in
  `timeZone` as Debian's cron reads it (cronsim): a start in the hour that a change to summer
  time skips happens at the first minute after it, a start in the hour that the change back
  repeats happens once (at its first occurrence), and a schedule whose minute or hour is a
  wildcard follows the clock (`0 * * * *` starts at each real hour: 23 or 25 on those days).
- `duration`: how long it stays open, as Go writes durations (`8h`, `1h30m`); elapsed time,
  as Go's `Time.Add` counts it, so a 60h window across a change of the clocks ends an hour
  earlier or later on the wall clock. A window is open from its start (included) to its end
  (excluded); one longer than its period is open without a gap.
- `timeZone`: an IANA name (`Europe/Berlin`), default UTC; from the tz database (zoneinfo,
  with the tzdata package where the system has none).
- `description`: free text, for people (as Argo CD allows).

A list allows an instant where none of its deny windows is open and, if it has allow windows,
one of them is open: a deny window always wins. The lists that apply to a workload (the
cluster's `--rollout-windows`, its namespace's and its own `configpin.io/rollout-windows`)
must each allow it: a workload's own allow window does not widen its namespace's, nor the
cluster's, and a deny anywhere holds it.

Pure: no clock; every instant is given, in seconds since the epoch. `datetime` is used for the
calendar only (the import contract allows it here, and tests/unit/core/test_windows.py holds
this module to reading no clock).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, tzinfo
from enum import StrEnum
from typing import Any, Final
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import orjson
from cronsim import CronSim, CronSimError

from webhook.core.durations import SECOND, DurationError, format_duration, parse_duration

MAX_TEXT: Final = 16 * 1024  # characters of a list read
MAX_WINDOWS: Final = 64  # windows in one list
DEFAULT_TIME_ZONE: Final = "UTC"
# How far `next_open` looks (a yearly window opens within it), and how many window boundaries
# it visits at most on the way (a list denied minute after minute stops it sooner).
LOOK_AHEAD: Final = 366 * 86_400.0
MAX_STEPS: Final = 10_000

_FIELDS: Final = ("minute", "hour", "day-of-month", "month", "day-of-week")
_RANGES: Final = ("0-59", "0-23", "1-31", "1-12 or JAN-DEC", "0-7 or SUN-SAT")
# One term of a field as Vixie cron writes it: `*`, a number or a name, a range, each with an
# optional step. Extensions some parsers read (`L`, `W`, `#`, `?`, `@daily`, a seconds field)
# are refused, so a list means the same to every cron reader, Argo CD's included.
_TERM: Final = re.compile(r"(\*|(\d{1,2}|[A-Za-z]{3})(-(\d{1,2}|[A-Za-z]{3}))?)(/\d{1,2})?")
_KNOWN: Final = ("kind", "schedule", "duration", "timeZone", "description")
_TZ_NAME: Final = re.compile(r"[A-Za-z0-9_+\-]+(/[A-Za-z0-9_+\-]+)*")


class Kind(StrEnum):
    ALLOW = "allow"
    DENY = "deny"


class WindowError(ValueError):
    """A window list that cannot be read; the message names what is wrong (which window,
    which field), and the caller adds the annotation's or flag's name."""


@dataclass(frozen=True, slots=True)
class Window:
    kind: Kind
    schedule: str  # five-field cron, as written
    duration: int  # nanoseconds, > 0
    time_zone: str = DEFAULT_TIME_ZONE  # an IANA name

    @property
    def seconds(self) -> float:
        return self.duration / SECOND

    def __str__(self) -> str:
        return (
            f"{self.kind.value} {self.schedule!r} for {format_duration(self.duration)}"
            f" ({self.time_zone})"
        )

    def first_start_after(self, after: float) -> float | None:
        """The first start strictly after `after` (None: none within cronsim's 50 years)."""
        for start in self.starts_after(after):
            return start
        return None

    def starts_after(self, after: float) -> Iterable[float]:
        """Its starts strictly after `after`, in order."""
        # (from the whole second at or before it: datetime rounds an instant to the nearest
        # microsecond, and a start just after `after` would be skipped where that rounds up)
        it = CronSim(self.schedule, datetime.fromtimestamp(after // 1, _zone(self.time_zone)))
        last = after
        while True:
            try:
                start = next(it).timestamp()
            except StopIteration:
                return
            # (Debian's cron reads a fixed-time schedule in wall-clock time: from inside the
            # repeated hour after the change back, it names that hour's first occurrence, which
            # is past; it is not a start after `after`)
            if start > last:
                last = start
                yield start

    def open_at(self, when: float) -> float | None:
        """The end of this window's opening that holds `when`, or None when it is closed then.
        (The end of the earliest start that holds it; later ones may reach further.)"""
        start = self.first_start_after(when - self.seconds)
        if start is None or start > when:
            return None
        return start + self.seconds

    def run_end(self, when: float, steps: _Steps, until: float) -> float:
        """Where the openings that hold `when` (open at `when`) stop holding one another up:
        openings that overlap or touch are one. Past `until`, where it stops looking."""
        span = self.seconds
        first = self.first_start_after(when - span)
        assert first is not None and first <= when
        end = first + span
        for start in self.starts_after(first):
            steps.left -= 1
            if start > end or end > until or steps.left <= 0:
                break
            end = max(end, start + span)
        return end


Windows = tuple[Window, ...]


@dataclass(slots=True)
class _Steps:
    """What is left of a search's bound (`MAX_STEPS`): each list asked and each start visited
    counts one."""

    left: int


def _zone(name: str) -> tzinfo:
    # (UTC as datetime's own: cronsim reads no summer time into it)
    return UTC if name == DEFAULT_TIME_ZONE else ZoneInfo(name)


@dataclass(frozen=True, slots=True)
class Opening:
    """When windows next allow a rollout: `at` (the instant asked about when they allow it
    then), or None when they do not before `looked_to`, where the search stopped."""

    at: float | None
    looked_to: float


@dataclass(frozen=True, slots=True)
class Standing:
    """Whether windows allow a rollout at an instant, and until when (excluded) that answer
    holds at least: the same for every workload under the same lists, so a controller asks
    once per set of lists until then, not once per workload and pass."""

    allowed: bool
    until: float


def parse_windows(text: Any) -> Windows:
    """A window list from its text (JSON or YAML); empty text is an empty list (no window)."""
    if not isinstance(text, str):
        raise WindowError(f"expected text, got {type(text).__name__}")
    if len(text) > MAX_TEXT:
        raise WindowError(f"{len(text)} characters: at most {MAX_TEXT}")
    if not text.strip():
        return ()
    try:
        value: Any = orjson.loads(text)
    except orjson.JSONDecodeError:
        value = _yaml(text)
    return windows_from(value)


def windows_from(value: Any) -> Windows:
    """A window list from its decoded JSON or YAML."""
    if value is None:
        return ()
    if isinstance(value, dict):
        raise WindowError("expected a list of windows, got one window: write it as [{...}]")
    if not isinstance(value, list):
        raise WindowError(f"expected a list of windows, got {_what(value)}")
    if len(value) > MAX_WINDOWS:
        raise WindowError(f"{len(value)} windows: at most {MAX_WINDOWS}")
    out: list[Window] = []
    for at, item in enumerate(value, 1):
        try:
            out.append(_window(item))
        except WindowError as e:
            raise WindowError(f"window {at}: {e}") from None
    return tuple(out)


def _window(item: Any) -> Window:
    if not isinstance(item, dict):
        raise WindowError(
            f"expected a mapping (kind, schedule, duration, timeZone), got {_what(item)}"
        )
    for key in item:
        if key not in _KNOWN:
            raise WindowError(_unknown(str(key)))
    kind = item.get("kind")
    if kind is None:
        raise WindowError("kind is missing (allow or deny)")
    if not isinstance(kind, str):
        raise WindowError(f"kind: allow or deny, got {_what(kind)}")
    if kind not in (Kind.ALLOW.value, Kind.DENY.value):
        raise WindowError(f"kind {_short(kind)}: allow or deny")
    schedule = item.get("schedule")
    if schedule is None:
        raise WindowError('schedule is missing (a five-field cron expression: "0 9 * * 1-5")')
    if not isinstance(schedule, str):
        raise WindowError(f"schedule: expected text, got {_what(schedule)}")
    raw = item.get("duration")
    if raw is None:
        raise WindowError('duration is missing (as Go writes durations: "8h", "1h30m")')
    if not isinstance(raw, str):
        raise WindowError(f'duration: expected text ("8h", "1h30m"), got {_what(raw)}')
    try:
        duration = parse_duration(raw)
    except DurationError as e:
        raise WindowError(f"duration {e}") from None
    if duration <= 0:
        raise WindowError(f"duration {_short(raw)}: a window must stay open for some time")
    zone = item.get("timeZone")
    if zone is None or zone == "":
        zone = DEFAULT_TIME_ZONE
    elif not isinstance(zone, str):
        raise WindowError(f"timeZone: expected an IANA name, got {_what(zone)}")
    _check_zone(zone)
    description = item.get("description")
    if description is not None and not isinstance(description, str):
        raise WindowError(f"description: expected text, got {_what(description)}")
    window = Window(Kind(kind), " ".join(schedule.split()), duration, zone)
    _check_schedule(schedule, window)
    return window


def _check_schedule(text: str, window: Window) -> None:
    fields = text.split()
    if len(fields) != len(_FIELDS):
        raise WindowError(
            f"schedule {_short(text)}: {len(fields)} fields, five expected "
            "(minute hour day-of-month month day-of-week)"
        )
    for name, allowed, field in zip(_FIELDS, _RANGES, fields, strict=True):
        if not all(_TERM.fullmatch(term) for term in field.split(",")):
            raise WindowError(
                f"schedule {_short(text)}: {name} {_short(field)}: {allowed}, with * , - /"
            )
    try:
        CronSim(window.schedule, datetime(2000, 1, 1, tzinfo=UTC))
    except CronSimError as e:
        said = str(e).removeprefix("Bad ")
        names = dict(zip(_FIELDS, _RANGES, strict=True))
        where = f"{said} ({names[said]})" if said in names else said
        raise WindowError(f"schedule {_short(text)}: bad {where}") from None


def _check_zone(name: str) -> None:
    # (a path, or the machine's own zone, is no IANA name: the same list must mean the same
    # instant on every replica)
    if len(name) > 64 or not _TZ_NAME.fullmatch(name) or name in ("localtime", "Local"):
        raise WindowError(f"timeZone {_short(name)}: not an IANA time zone name (Europe/Berlin)")
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise WindowError(
            f"timeZone {name!r}: no such time zone in the tz database (Europe/Berlin, UTC)"
        ) from None


def _unknown(key: str) -> str:
    for known in _KNOWN:
        if key.lower() == known.lower():
            return f"unknown field {key!r}: did you mean {known!r}?"
    if key == "manualSync":
        return (
            "manualSync is not read by configpin (`kubectl configpin approve --now` starts a "
            "rollout outside its window)"
        )
    return f"unknown field {_short(key)} (kind, schedule, duration, timeZone, description)"


def _short(value: str | int | float) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**60:
        return "a number of more than 60 digits"  # (and str() refuses one of 4,300)
    text = repr(value)
    return text if len(text) <= 66 else text[:63] + "..."


def _what(value: Any) -> str:
    if isinstance(value, bool):
        return "true or false"
    if isinstance(value, (int, float)):
        return f"the number {_short(value)}"
    if isinstance(value, str):
        return f"the text {_short(value)}"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


def _yaml(text: str) -> Any:
    # (imported only for text that is not JSON: the serving process leaves YAML out,
    # tests/unit/project/test_imports.py)
    import yaml  # noqa: PLC0415

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        problem = getattr(e, "problem", None) or "not JSON, nor YAML"
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        raise WindowError(f"neither JSON nor YAML: {problem}{where}") from None
    except (ValueError, OverflowError):
        # (a value its constructors refuse: an integer of thousands of digits, a date out of
        # range)
        raise WindowError("neither JSON nor YAML: a value out of range") from None


# -- what the windows allow


def list_allows(windows: Windows, when: float) -> bool:
    """One list: no deny window open at `when`, and an allow window open if it has any."""
    allows = False
    has_allow = False
    for window in windows:
        if window.kind is Kind.DENY:
            if window.open_at(when) is not None:
                return False
        else:
            has_allow = True
            allows = allows or window.open_at(when) is not None
    return allows or not has_allow


def allows(lists: Iterable[Windows], when: float) -> bool:
    """Whether configpin may start a rollout at `when` under every list that applies (the
    cluster's, the namespace's, the workload's): each must allow it."""
    return all(list_allows(windows, when) for windows in lists)


def next_open(lists: Sequence[Windows], when: float, *, look_ahead: float = LOOK_AHEAD) -> Opening:
    """When the lists next allow a rollout, from `when` on (`when` itself if they allow it
    then). A list blocks until its open deny windows close (the whole run of openings that
    overlap or touch), or, with allow windows and none open, until one of them next opens;
    the lists block until the latest of those, and are asked again there."""
    until = when + look_ahead
    at = when
    steps = _Steps(MAX_STEPS)
    while at <= until and steps.left > 0:
        blocked_to = at
        for windows in lists:
            blocked_to = max(blocked_to, _blocked_to(windows, at, steps, until))
        if blocked_to == at:
            return Opening(at, at)
        if blocked_to == float("inf"):
            return Opening(None, until)  # an allow window that never opens again
        at = blocked_to
    return Opening(None, min(at, until))


def standing(lists: Sequence[Windows], when: float, *, look_ahead: float = LOOK_AHEAD) -> Standing:
    """Whether the lists allow a rollout at `when` (`allows`), and until when that holds at
    least. Closed: until they open (`next_open`), or as far as that looked. Open: until the
    first of a deny window's next start and, in each list with allow windows, the end of the
    run of openings of the allow window open now that reaches furthest."""
    if not allows(lists, when):
        opening = next_open(lists, when, look_ahead=look_ahead)
        return Standing(False, opening.looked_to if opening.at is None else opening.at)
    until = when + look_ahead
    holds = until
    steps = _Steps(MAX_STEPS)
    for windows in lists:
        reach = when
        for window in windows:
            if window.kind is Kind.DENY:
                start = window.first_start_after(when)
                if start is not None:
                    holds = min(holds, start)
            elif window.open_at(when) is not None:
                reach = max(reach, window.run_end(when, steps, until))
        if reach > when:
            holds = min(holds, reach)
    return Standing(True, holds)


def _blocked_to(windows: Windows, at: float, steps: _Steps, until: float) -> float:
    """Until when one list surely blocks a rollout from `at` (`at`: it allows one then)."""
    steps.left -= 1
    denied_to = at
    for window in windows:
        if window.kind is Kind.DENY and window.open_at(at) is not None:
            denied_to = max(denied_to, window.run_end(at, steps, until))
    if denied_to > at:
        return denied_to
    opens = float("inf")
    has_allow = False
    for window in windows:
        if window.kind is Kind.ALLOW:
            has_allow = True
            if window.open_at(at) is not None:
                return at
            start = window.first_start_after(at)
            if start is not None:
                opens = min(opens, start)
    return opens if has_allow else at


def said_at(when: float, zone: str = DEFAULT_TIME_ZONE) -> str:
    """An instant as a person reads it in a window's time zone: `Mon 2026-11-30 09:00
    Europe/Berlin` (to the minute: cron's resolution)."""
    local = datetime.fromtimestamp(when, _zone(zone))
    return f"{local:%a %Y-%m-%d %H:%M} {zone}"


def zone_of(lists: Iterable[Windows]) -> str:
    """The time zone to say a list's times in: its first window's (UTC when it has none)."""
    for windows in lists:
        for window in windows:
            return window.time_zone
    return DEFAULT_TIME_ZONE
