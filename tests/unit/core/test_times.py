"""RFC 3339 times without datetime (webhook/core/times.py), held to the standard library's."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from webhook.core.times import format_time, parse_time

# (from 1000: strftime does not pad a shorter year)
_WHEN = st.datetimes(
    min_value=datetime(1000, 1, 2), max_value=datetime(9999, 12, 30), timezones=st.just(UTC)
)


@given(_WHEN)
def test_format_is_what_kubernetes_writes(when: datetime) -> None:
    # (to the second: a float of seconds since the epoch holds microseconds only near now)
    whole = when.replace(microsecond=0)
    assert format_time(whole.timestamp()) == whole.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert format_time(whole.timestamp() + 0.5) == format_time(whole.timestamp())


@given(_WHEN, st.integers(min_value=-14 * 60, max_value=14 * 60))
def test_parse_agrees_with_the_standard_library(when: datetime, minutes: int) -> None:
    local = when.astimezone(timezone(timedelta(minutes=minutes)))
    offset = local.strftime("%z")
    for text in (
        local.strftime("%Y-%m-%dT%H:%M:%S") + offset[:3] + ":" + offset[3:],
        when.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        when.strftime("%Y-%m-%dT%H:%M:%SZ"),
    ):
        expected = datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
        assert parse_time(text) == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize(
    "text",
    [None, 5, "", "yesterday", "2026-02-30T00:00:00Z", "2026-13-01T00:00:00Z",
     "2026-01-01T25:00:00Z", "2026-01-01T00:00:00", "2026-01-01T00:00:00+0100",
     "2026-01-01T00:00:00.Z",
     "\uff12\uff10\uff12\uff16-01-01T00:00:00Z"],  # (fullwidth digits)
)  # fmt: skip
def test_anything_else_is_none(text: object) -> None:
    assert parse_time(text) is None
