"""Go durations (webhook/core/durations.py), held to Go's own `time.ParseDuration` cases."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from webhook.core.durations import (
    HOUR,
    MICROSECOND,
    MILLISECOND,
    MINUTE,
    SECOND,
    DurationError,
    format_duration,
    parse_duration,
)

_MAX = (1 << 63) - 1


# Go's time_test.go parseDurationTests, the valid ones (time.ParseDuration's answers)
@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("0", 0), ("5s", 5 * SECOND), ("30s", 30 * SECOND), ("1478s", 1478 * SECOND),
        ("-5s", -5 * SECOND), ("+5s", 5 * SECOND), ("-0", 0), ("+0", 0),
        ("5.0s", 5 * SECOND), ("5.6s", 5 * SECOND + 600 * MILLISECOND),
        ("5.s", 5 * SECOND), (".5s", 500 * MILLISECOND), ("1.0s", SECOND),
        ("1.00s", SECOND), ("1.004s", SECOND + 4 * MILLISECOND),
        ("1.0040s", SECOND + 4 * MILLISECOND), ("100.00100s", 100 * SECOND + MILLISECOND),
        ("10ns", 10), ("11us", 11 * MICROSECOND), ("12\u00b5s", 12 * MICROSECOND),
        ("12\u03bcs", 12 * MICROSECOND), ("13ms", 13 * MILLISECOND), ("14s", 14 * SECOND),
        ("15m", 15 * MINUTE), ("16h", 16 * HOUR), ("3h30m", 3 * HOUR + 30 * MINUTE),
        ("10.5s4m", 4 * MINUTE + 10 * SECOND + 500 * MILLISECOND),
        ("-2m3.4s", -(2 * MINUTE + 3 * SECOND + 400 * MILLISECOND)),
        ("1h2m3s4ms5us6ns", HOUR + 2 * MINUTE + 3 * SECOND + 4 * MILLISECOND + 5 * MICROSECOND + 6),
        ("39h9m14.425s", 39 * HOUR + 9 * MINUTE + 14 * SECOND + 425 * MILLISECOND),
        ("52763797000ns", 52763797000), ("0.3333333333333333333h", 20 * MINUTE),
        ("9007199254740993ns", (1 << 53) + 1), ("9223372036854775807ns", _MAX),
        ("9223372036854775.807us", _MAX), ("9223372036s854ms775us807ns", _MAX),
        ("-9223372036854775808ns", -(1 << 63)), ("-9223372036854775.808us", -(1 << 63)),
        ("0.100000000000000000000h", 6 * MINUTE),
        ("0.830103483285477580700h", 49 * MINUTE + 48 * SECOND + 372539827),
        ("60h", 60 * HOUR),
    ],
)  # fmt: skip
def test_what_go_reads(text: str, want: int) -> None:
    assert parse_duration(text) == want


# ... and the invalid ones, each with what the message says is wrong
@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "empty"), ("3", "a unit expected"), ("-", "after the sign"), ("s", "a number"),
        (".", "a number expected around"), ("-.", "around"), (".s", "around"),
        ("+.s", "around"), ("1d", "unknown unit 'd'"), ("\x85\x85", "a number"),
        ("\xffff", "a number"), ("hello \xffff world", "a number"),
        ("9223372036854775808ns", "out of range"), ("9223372036854775.808us", "out of range"),
        ("-9223372036854775809ns", "out of range"), ("8 h", "unknown unit ' h'"),
        ("1h-5m", "unknown unit 'h-'"), ("9" * 5000 + "h", "out of range"),
    ],
)  # fmt: skip
def test_what_go_refuses(text: str, says: str) -> None:
    with pytest.raises(DurationError, match=says.replace(".", r"\.").replace("+", r"\+")):
        parse_duration(text)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0, "0s"), (1, "1ns"), (1100, "1.1\u00b5s"), (2200 * MICROSECOND, "2.2ms"),
        (3300 * MILLISECOND, "3.3s"), (4 * MINUTE + 5 * SECOND, "4m5s"),
        (4 * MINUTE + 5001 * MILLISECOND, "4m5.001s"),
        (5 * HOUR + 6 * MINUTE + 7001 * MILLISECOND, "5h6m7.001s"),
        (8 * MINUTE + 1, "8m0.000000001s"),
        (60 * HOUR, "60h0m0s"), (-SECOND, "-1s"), (_MAX, "2562047h47m16.854775807s"),
    ],
)  # fmt: skip
def test_formatted_as_go_writes_it(value: int, text: str) -> None:
    # (Go's durationTests, as Duration.String writes them)
    assert format_duration(value) == text


@given(st.integers(min_value=-_MAX, max_value=_MAX))
def test_what_is_written_reads_back(value: int) -> None:
    assert parse_duration(format_duration(value)) == value
