"""Durations as Go writes them (`time.ParseDuration`): `60h`, `1h30m`, `1.5h`, `300ms`, `0`.

A rollout window's `duration` (Argo CD's sync windows read it with Go's parser, so a list
written for one reads the same in the other) and a rollout budget's period. Held to the
nanosecond as an integer, as Go holds it; the range is Go's (an int64 of nanoseconds).
"""

from __future__ import annotations

from typing import Final

NANOSECOND: Final = 1
MICROSECOND: Final = 1_000
MILLISECOND: Final = 1_000_000
SECOND: Final = 1_000_000_000
MINUTE: Final = 60 * SECOND
HOUR: Final = 60 * MINUTE
_MAX: Final = (1 << 63) - 1  # Go's time.Duration is an int64 of nanoseconds

_UNITS: Final[dict[str, int]] = {
    "ns": NANOSECOND,
    "us": MICROSECOND,
    "\u00b5s": MICROSECOND,  # micro sign
    "\u03bcs": MICROSECOND,  # Greek small letter mu
    "ms": MILLISECOND,
    "s": SECOND,
    "m": MINUTE,
    "h": HOUR,
}


class DurationError(ValueError):
    """Not a duration as Go writes one; the message says what is wrong, without a name (the
    caller adds the field's, annotation's or flag's)."""


def parse_duration(text: str) -> int:
    """Nanoseconds of a Go duration (`time.ParseDuration`'s grammar: an optional sign, then
    one or more decimal numbers each with a unit, ns us µs ms s m h; `0` alone needs none).
    A fraction below a nanosecond is dropped."""
    if not text:
        raise DurationError('empty (write it as Go does: "8h", "1h30m", "90s")')
    said = _cut(text)
    rest = text
    negative = rest[0] == "-"
    if rest[0] in "+-":
        rest = rest[1:]
    if rest == "0":
        return 0
    if not rest:
        raise DurationError(f"{said}: a number and a unit expected after the sign")
    total = 0
    most = _MAX + negative  # (Go's range: -(1 << 63) to (1 << 63) - 1)
    while rest:
        at = 0
        while at < len(rest) and rest[at] in "0123456789":
            at += 1
        whole = rest[:at]
        fraction = ""
        if at < len(rest) and rest[at] == ".":
            end = at + 1
            while end < len(rest) and rest[end] in "0123456789":
                end += 1
            fraction = rest[at + 1 : end]
            at = end
            if not whole and not fraction:
                raise DurationError(f"{said}: a number expected around '.'")
        elif not whole:
            raise DurationError(f"{said}: a number expected at {_cut(rest)}")
        end = at
        while end < len(rest) and rest[end] not in "0123456789.":
            end += 1
        unit = rest[at:end]
        if not unit:
            raise DurationError(f"{said}: a unit expected after {_cut(rest[:at])} (ns us ms s m h)")
        scale = _UNITS.get(unit)
        if scale is None:
            raise DurationError(f"{said}: unknown unit {_cut(unit)} (ns us ms s m h)")
        if len(whole) > 19:  # (past Go's range in any unit)
            raise DurationError(f"{said}: out of range (at most about 2562047h)")
        part = int(whole or "0") * scale
        if fraction:
            part += _fraction(fraction, scale)
        total += part
        if total > most:
            raise DurationError(f"{said}: out of range (at most about 2562047h)")
        rest = rest[end:]
    return -total if negative else total


def _cut(text: str) -> str:
    """`text` quoted, cut short for a message."""
    return repr(text) if len(text) <= 40 else repr(text[:37] + "...")


def _fraction(digits: str, scale: int) -> int:
    """Nanoseconds of a unit's decimal fraction, as Go computes them: the digits while they fit
    in 63 bits, then through a float64 (`0.3333333333333333333h` is 20m, as in Go)."""
    value = 0
    divisor = 1.0
    for digit in digits:
        grown = value * 10 + int(digit)
        if value > _MAX // 10 or grown > _MAX + 1:
            break
        value = grown
        divisor *= 10
    return int(float(value) * (float(scale) / divisor))


def format_duration(nanoseconds: int) -> str:
    """A duration as Go's `Duration.String` writes one of whole seconds or more (`60h0m0s`,
    `1h30m0s`, `45s`); below a second, in the largest unit that holds it (`300ms`)."""
    if nanoseconds == 0:
        return "0s"
    sign = "-" if nanoseconds < 0 else ""
    value = abs(nanoseconds)
    if value < SECOND:
        for unit, scale in (("ms", MILLISECOND), ("\u00b5s", MICROSECOND)):
            if value >= scale:
                return sign + _decimal(value, scale) + unit
        return f"{sign}{value}ns"
    hours, value = divmod(value, HOUR)
    minutes, value = divmod(value, MINUTE)
    seconds = _decimal(value, SECOND)
    if hours:
        return f"{sign}{hours}h{minutes}m{seconds}s"
    if minutes:
        return f"{sign}{minutes}m{seconds}s"
    return f"{sign}{seconds}s"


def _decimal(value: int, scale: int) -> str:
    whole, fraction = divmod(value, scale)
    if not fraction:
        return str(whole)
    digits = str(fraction).rjust(len(str(scale)) - 1, "0").rstrip("0")
    return f"{whole}.{digits}"
