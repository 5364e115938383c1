"""The rollout budget (webhook/core/budget.py): `COUNT/PERIOD` as written, what it allows at an
instant the test sets, and the signed record of the starts it counts."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.core.budget import (
    DEFAULT_BUDGET,
    MAX_COUNT,
    NO_BUDGET,
    Budget,
    BudgetError,
    allowance,
    counted,
    decode_starts,
    encode_starts,
    parse_budget,
)
from webhook.core.durations import HOUR, SECOND
from webhook.core.record import identity

HKEY = b"k" * 32
APP = identity("Deployment", "team-a", "app")
NOW = 1_795_000_000.0  # the clock these tests set


@pytest.mark.parametrize(
    ("text", "budget"),
    [
        ("6/1h", Budget(6, HOUR)), ("2/30s", Budget(2, 30 * SECOND)),
        (" 3/1h30m ", Budget(3, 5400 * SECOND)), ("0", NO_BUDGET),
        (f"{MAX_COUNT}/24h", Budget(MAX_COUNT, 24 * HOUR)), ("1/1s", Budget(1, SECOND)),
    ],
)  # fmt: skip
def test_what_a_budget_reads(text: str, budget: Budget) -> None:
    assert parse_budget(text) == budget


def test_the_default_is_six_an_hour() -> None:
    assert parse_budget(DEFAULT_BUDGET) == Budget(6, HOUR)
    assert str(parse_budget(DEFAULT_BUDGET)) == "6/1h0m0s" and str(NO_BUDGET) == "0"
    assert NO_BUDGET.unlimited and not Budget(6, HOUR).unlimited


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "COUNT/PERIOD expected"), ("6", "COUNT/PERIOD expected (6/1h), or 0 for none"),
        ("1h", "COUNT/PERIOD expected"), ("six/1h", "the count 'six' is not a whole number"),
        ("-1/1h", "the count '-1' is not a whole number"), ("1.5/1h", "not a whole number"),
        ("0/1h", "a count of 0 would never roll (0 alone turns the budget off)"),
        (f"{MAX_COUNT + 1}/1h", f"at most {MAX_COUNT} rollouts per period"),
        ("6/", "the period empty"), ("6/1d", "the period '1d': unknown unit 'd'"),
        ("6/0", "the period must be at least 1s"), ("6/-1h", "at least 1s"),
        ("6/500ms", "at least 1s"), ("\uff16/1h", "not a whole number"),  # (a fullwidth 6)
        ("9" * 5000 + "/1h", "at most 100"), ("6/" + "9" * 5000 + "h", "out of range"),
    ],
)  # fmt: skip
def test_what_is_not_a_budget_says_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(BudgetError) as e:
        parse_budget(text)
    assert says in str(e.value)


def test_not_text_is_refused() -> None:
    with pytest.raises(BudgetError, match="expected text"):
        parse_budget(6)


def test_past_its_count_a_workload_waits_until_the_oldest_leaves_the_period() -> None:
    budget = parse_budget("2/30s")
    assert allowance(budget, [], NOW).allows(NOW)
    assert allowance(budget, [NOW - 10], NOW).allows(NOW)
    held = allowance(budget, [NOW - 20, NOW - 10], NOW)
    assert held.used == 2 and not held.allows(NOW)
    assert held.at == NOW + 10  # the start 20 s ago leaves the 30 s period 10 s from now
    assert allowance(budget, [NOW - 20, NOW - 10], held.at).allows(held.at)
    assert not allowance(budget, [NOW - 20, NOW - 10], held.at - 0.001).allows(held.at - 0.001)
    # starts older than the period count for nothing
    assert allowance(budget, [NOW - 31, NOW - 30, NOW - 10], NOW).allows(NOW)


def test_six_an_hour() -> None:
    budget = parse_budget("6/1h")
    starts = [NOW - 3000 + 60 * n for n in range(6)]  # six in the last 50 minutes
    held = allowance(budget, starts, NOW)
    assert (held.used, held.at) == (6, NOW - 3000 + 3600)
    assert allowance(budget, starts[1:], NOW).allows(NOW)


def test_no_budget_allows_every_rollout() -> None:
    assert allowance(NO_BUDGET, [NOW - n for n in range(1000)], NOW).allows(NOW)


def test_a_start_ahead_of_this_clock_counts() -> None:
    # (another replica, its clock a little ahead, started one "after" now)
    budget = parse_budget("1/30s")
    held = allowance(budget, [NOW + 2], NOW)
    assert not held.allows(NOW) and held.at == NOW + 32


def test_the_starts_kept_are_bounded_by_the_count_and_the_period() -> None:
    budget = parse_budget("3/1h")
    assert counted(budget, [], NOW) == (NOW,)
    assert counted(budget, [NOW - 7200, NOW - 60], NOW) == (NOW - 60, NOW)
    assert counted(budget, [NOW - 300, NOW - 200, NOW - 100], NOW) == (NOW - 200, NOW - 100, NOW)
    assert counted(NO_BUDGET, [NOW - 300, NOW - 200], NOW) == (NOW,)


@settings(max_examples=200, deadline=None)
@given(
    st.integers(min_value=1, max_value=8),
    st.integers(min_value=1, max_value=600),
    st.lists(st.floats(min_value=0, max_value=3600), max_size=40),
)
def test_never_more_than_count_within_any_period(
    count: int, period: int, gaps: list[float]
) -> None:
    """However often a source changes, configpin starts at most COUNT rollouts within any
    PERIOD, when it starts one as soon as the budget allows, keeping only what `counted`
    keeps; and it never waits while the budget allows one."""
    budget = Budget(count, period * SECOND)
    kept: tuple[float, ...] = ()
    started: list[float] = []
    clock = NOW
    for gap in gaps:
        clock += gap  # a change arrives
        said = allowance(budget, kept, clock)
        when = max(clock, said.at)
        assert allowance(budget, kept, when).allows(when)
        if when > clock:
            assert not said.allows(clock) and said.used == count
        clock = when
        kept = counted(budget, kept, clock)
        started.append(clock)
        assert len(kept) <= count
    for at in started:
        within = [s for s in started if at <= s < at + budget.seconds]
        assert len(within) <= count


def test_the_record_on_the_workload_is_believed_only_as_configpin_wrote_it() -> None:
    starts = (NOW - 120, NOW - 60.5, NOW)
    text = encode_starts(HKEY, APP, starts)
    assert decode_starts(HKEY, APP, text) == starts
    # copied onto another workload, edited, signed with another key, or not a record: none
    other = identity("Deployment", "team-a", "other")
    assert decode_starts(HKEY, other, text) == ()
    assert decode_starts(HKEY, APP, text.replace(str(NOW - 120), str(NOW - 7200))) == ()
    assert decode_starts(b"x" * 32, APP, text) == ()
    for junk in (None, "", "[]", '{"starts": []}', "x" * 10_000):
        assert decode_starts(HKEY, APP, junk) == ()


def test_the_record_stays_small() -> None:
    budget = parse_budget(f"{MAX_COUNT}/24h")
    kept: tuple[float, ...] = ()
    for n in range(3 * MAX_COUNT):
        kept = counted(budget, kept, NOW + n * 0.123456789)
    text = encode_starts(HKEY, APP, kept)
    assert len(kept) == MAX_COUNT and len(text) < 2500
    assert decode_starts(HKEY, APP, text) == kept
