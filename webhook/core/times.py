"""RFC 3339 times as Kubernetes writes them, to and from seconds since the epoch, without a
clock and without `datetime` (the core reads no clock; its callers pass the time in).

Kubernetes writes `2026-11-26T17:06:02Z` (metav1.Time) and, for some fields,
`2026-11-26T17:06:02.123456Z` (MicroTime); people and other tools may write an offset
(`+01:00`). The civil-date arithmetic is Howard Hinnant's `days_from_civil`, exact for the
proleptic Gregorian calendar.
"""

from __future__ import annotations

from typing import Any, Final

_SECONDS_PER_DAY: Final = 86_400


def _days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date."""
    year -= month <= 2
    era = (year if year >= 0 else year - 399) // 400
    yoe = year - era * 400
    doy = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146_097 + doe - 719_468


def _civil_from_days(days: int) -> tuple[int, int, int]:
    days += 719_468
    era = (days if days >= 0 else days - 146_096) // 146_097
    doe = days - era * 146_097
    yoe = (doe - doe // 1460 + doe // 36_524 - doe // 146_096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day = doy - (153 * mp + 2) // 5 + 1
    month = mp + (3 if mp < 10 else -9)
    return yoe + era * 400 + (month <= 2), month, day


def _digits(text: str, start: int, count: int) -> int:
    part = text[start : start + count]
    if len(part) != count or not part.isascii() or not part.isdigit():
        raise ValueError(text)
    return int(part)


def parse_time(text: Any) -> float | None:
    """Seconds since the epoch of an RFC 3339 time (a creationTimestamp, a condition's
    lastTransitionTime, configpin's rolled-at); None for anything else."""
    if not isinstance(text, str) or len(text) < 20 or len(text) > 40:
        return None
    try:
        year, month, day = _digits(text, 0, 4), _digits(text, 5, 2), _digits(text, 8, 2)
        hour, minute, second = _digits(text, 11, 2), _digits(text, 14, 2), _digits(text, 17, 2)
        if (text[4], text[7], text[13], text[16]) != ("-", "-", ":", ":") or text[10] not in "Tt ":
            return None
        if not (1 <= month <= 12 and 1 <= day <= 31 and hour < 24 and minute < 60 and second < 61):
            return None
        at = 19
        fraction = 0.0
        if text[at] == ".":
            end = at + 1
            while end < len(text) and text[end].isascii() and text[end].isdigit():
                end += 1
            if end == at + 1:
                return None
            fraction = float("0" + text[at:end])
            at = end
        zone = text[at:]
        if zone in ("Z", "z"):
            offset = 0
        elif len(zone) == 6 and zone[0] in "+-" and zone[3] == ":":
            offset = (_digits(zone, 1, 2) * 60 + _digits(zone, 4, 2)) * 60
            offset = -offset if zone[0] == "-" else offset
        else:
            return None
    except ValueError:
        return None
    days = _days_from_civil(year, month, day)
    if _civil_from_days(days) != (year, month, day):
        return None  # 31 April and the like
    return days * _SECONDS_PER_DAY + hour * 3600 + minute * 60 + second - offset + fraction


def format_time(when: float) -> str:
    """An RFC 3339 time in UTC, to the second (metav1.Time's form)."""
    whole = int(when // 1)
    days, rest = divmod(whole, _SECONDS_PER_DAY)
    year, month, day = _civil_from_days(days)
    hour, rest = divmod(rest, 3600)
    minute, second = divmod(rest, 60)
    return f"{year:04d}-{month:02d}-{day:02d}T{hour:02d}:{minute:02d}:{second:02d}Z"
