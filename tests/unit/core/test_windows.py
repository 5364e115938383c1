"""Rollout windows (webhook/core/windows.py): the list as written, what it allows at an instant
and when it next opens, with the clock these tests set (every instant is given)."""

from __future__ import annotations

import ast
import itertools
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from webhook.core import windows as windows_module
from webhook.core.durations import HOUR, MINUTE
from webhook.core.windows import (
    LOOK_AHEAD,
    MAX_TEXT,
    MAX_WINDOWS,
    Kind,
    Window,
    WindowError,
    Windows,
    allows,
    list_allows,
    next_open,
    parse_windows,
    standing,
)

BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")


def at(*when: int, tz: ZoneInfo | None = None, fold: int = 0) -> float:
    """The instant of a wall-clock time (UTC unless a zone is given; `fold` 1: the second of
    a repeated hour)."""
    return datetime(*when, tzinfo=tz or UTC, fold=fold).timestamp()


def window(kind: str, schedule: str, duration: str, zone: str = "UTC") -> Windows:
    return parse_windows(
        f'[{{"kind": "{kind}", "schedule": "{schedule}", "duration": "{duration}", '
        f'"timeZone": "{zone}"}}]'
    )


def wall(when: float | None, tz: ZoneInfo = BERLIN) -> str:
    assert when is not None
    return datetime.fromtimestamp(when, tz).isoformat()


# -- the list as written


def test_the_issue_s_example() -> None:
    text = (
        '[{"kind": "deny", "schedule": "0 22 * * 5", "duration": "60h", '
        '"timeZone": "Europe/Berlin"}]'
    )
    assert parse_windows(text) == (Window(Kind.DENY, "0 22 * * 5", 60 * HOUR, "Europe/Berlin"),)


def test_yaml_as_a_manifest_writes_it() -> None:
    text = """
- kind: allow
  schedule: "0 9 * * MON-FRI"
  duration: 8h
  timeZone: America/New_York
  description: business hours
- kind: deny
  schedule: 0 0 24 12 *
  duration: 48h
"""
    assert parse_windows(text) == (
        Window(Kind.ALLOW, "0 9 * * MON-FRI", 8 * HOUR, "America/New_York"),
        Window(Kind.DENY, "0 0 24 12 *", 48 * HOUR, "UTC"),
    )


@pytest.mark.parametrize("text", ["", "  \n", "[]", "null", "~"])
def test_no_text_is_no_window(text: str) -> None:
    assert parse_windows(text) == ()


def test_the_time_zone_is_utc_unless_given() -> None:
    empty = parse_windows(
        '[{"kind": "allow", "schedule": "0 9 * * *", "duration": "1h", "timeZone": ""}]'
    )
    assert empty == window("allow", "0 9 * * *", "1h") == (Window(Kind.ALLOW, "0 9 * * *", HOUR),)


def _one(**fields: object) -> str:
    """A list of one window: an allow at 09:00 for 1h, with `fields` changed (None: left out)."""
    item = {"kind": "allow", "schedule": "0 9 * * *", "duration": "1h", **fields}
    return json.dumps([{k: v for k, v in item.items() if v is not None}])


# What a list that cannot be read says: which window, which field, what is wrong.
@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('{"kind": "deny"}', "expected a list of windows, got one window: write it as [{...}]"),
        ('"deny"', "expected a list of windows, got the text 'deny'"),
        ("[1]", "window 1: expected a mapping (kind, schedule, duration, timeZone), got the"),
        (_one(kind=None), "window 1: kind is missing (allow or deny)"),
        (_one(kind='Allow'), "window 1: kind 'Allow': allow or deny"),
        (_one(schedule=None), "window 1: schedule is missing"),
        (_one(schedule=9), "window 1: schedule: expected text, got the number 9"),
        (_one(schedule='0 9 * *'), "window 1: schedule '0 9 * *': 4 fields, five expected"),
        (_one(schedule='0 0 9 * * *'), "6 fields, five expected"),
        (_one(schedule='@daily'), "1 fields, five expected"),
        (_one(schedule='60 9 * * *'), "schedule '60 9 * * *': bad minute (0-59)"),
        (_one(schedule='0 24 * * *'), "bad hour (0-23)"),
        (_one(schedule='0 9 * * 8'), "bad day-of-week (0-7 or SUN-SAT)"),
        (_one(schedule='0 9 * JUNE *'), "month 'JUNE': 1-12 or JAN-DEC"),
        (_one(schedule='0 9 30 2 *'), "bad day-of-month (1-31)"),
        (_one(schedule='0 9 L * *'), "day-of-month 'L': 1-31, with * , - /"),
        (_one(schedule='0 9 * * MON#2'), "day-of-week 'MON#2'"),
        (_one(schedule='0 9 ? * *'), "day-of-month '?'"),
        (_one(schedule='*/0 9 * * *'), "bad minute"),
        (_one(schedule='0 17-9 * * *'), "bad hour"),
        (_one(duration=None), "window 1: duration is missing"),
        (_one(duration=60), 'duration: expected text ("8h", "1h30m"), got the number 60'),
        (_one(duration='1d'), "window 1: duration '1d': unknown unit 'd'"),
        (_one(duration='0'), "duration '0': a window must stay open for some time"),
        (_one(duration='-1h'), "a window must stay open"),
        (_one(timeZone='Mars/Olympus_Mons'), "timeZone 'Mars/Olympus_Mons': no such time zone"),
        (_one(timeZone='/etc/localtime'), "not an IANA time zone name"),
        (_one(timeZone='../../etc/passwd'), "not an IANA time zone name"),
        (_one(timeZone='localtime'), "not an IANA time zone name"),
        (_one(timeZone=1), "timeZone: expected an IANA name, got the number 1"),
        (_one(timezone='UTC'), "window 1: unknown field 'timezone': did you mean 'timeZone'?"),
        (_one(manualSync=True), "manualSync is not read by configpin"),
        (_one(applications=['*']), "unknown field 'applications'"),
        (_one(description=5), "description: expected text"),
        (_one()[:-1] + ', {"kind": "deny"}]', "window 2: schedule is missing"),
        ("- kind: [", "neither JSON nor YAML"),
        ("[{", "neither JSON nor YAML"),
        ("- kind: allow\n  schedule: * * * * *\n", "neither JSON nor YAML"),  # (YAML: an alias)
    ],
)  # fmt: skip
def test_a_list_that_cannot_be_read_says_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(WindowError) as e:
        parse_windows(text)
    assert says in str(e.value)


@pytest.mark.parametrize(
    "text",
    [
        "[" + "9" * 5000 + "]",  # (YAML's int(): past the 4,300 digits Python converts)
        "- kind: " + "9" * 5000,
        _one(duration="9" * 5000 + "h"),
        _one(schedule="0 9 * * " + "1," * 5000 + "8"),
        _one(kind=[["deny"] * 30] * 30),
        "- kind: !!binary aGVsbG8=",
        "- !!python/object/apply:os.system ['true']",
        "- {? [a, b] : 1}",
    ],
)
def test_what_cannot_be_read_is_said_in_a_line(text: str) -> None:
    """Whatever the text holds (a number of thousands of digits, a list where a word goes, a
    tag), reading it raises WindowError, never another error, and says so in one short line
    (it is admission's answer)."""
    with pytest.raises(WindowError) as e:
        parse_windows(text)
    assert len(str(e.value)) < 200 and "\n" not in str(e.value)


def test_not_text_or_too_much_is_refused() -> None:
    with pytest.raises(WindowError, match="expected text, got NoneType"):
        parse_windows(None)
    with pytest.raises(WindowError, match=f"at most {MAX_TEXT}"):
        parse_windows(" " * (MAX_TEXT + 1))
    one = '{"kind": "allow", "schedule": "0 9 * * *", "duration": "1h"}'
    assert len(parse_windows(f"[{','.join([one] * MAX_WINDOWS)}]")) == MAX_WINDOWS
    with pytest.raises(WindowError, match=f"at most {MAX_WINDOWS}"):
        parse_windows(f"[{','.join([one] * (MAX_WINDOWS + 1))}]")


def test_reads_no_clock() -> None:
    """The module reads the calendar with datetime, never the time (the import contract lets
    it import datetime on that condition)."""
    # (its source beside it: the compiled build's module is an extension, which inspect
    # cannot read the source of)
    tree = ast.parse((Path(str(windows_module.__file__)).parent / "windows.py").read_text())
    clocks = {"now", "utcnow", "today", "time", "monotonic", "perf_counter", "time_ns"}
    called = {
        node.func.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
    } | {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert not called & clocks
    imported = {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    assert "time" not in imported


# -- what a list allows, and when it next opens


def test_no_list_and_an_empty_list_allow_at_any_time() -> None:
    when = at(2026, 11, 27, 18, 0)
    assert allows([], when) and allows([()], when) and allows([(), ()], when)
    assert next_open([], when).at == when
    assert next_open([()], when).at == when


def test_a_window_opens_at_its_start_and_is_closed_at_its_end() -> None:
    nine = window("allow", "0 9 * * *", "8h")
    assert not allows([nine], at(2026, 11, 27, 8, 59, 59))
    assert allows([nine], at(2026, 11, 27, 9, 0))
    assert allows([nine], at(2026, 11, 27, 16, 59, 59))
    assert not allows([nine], at(2026, 11, 27, 17, 0))
    assert next_open([nine], at(2026, 11, 27, 17, 0)).at == at(2026, 11, 28, 9, 0)
    assert next_open([nine], at(2026, 11, 27, 8, 59, 59)).at == at(2026, 11, 27, 9, 0)
    assert next_open([nine], at(2026, 11, 27, 12, 0)).at == at(2026, 11, 27, 12, 0)


def test_a_window_that_spans_midnight() -> None:
    night = window("allow", "0 22 * * *", "4h", "Europe/Berlin")
    assert allows([night], at(2026, 11, 27, 23, 30, tz=BERLIN))
    assert allows([night], at(2026, 11, 28, 0, 0, tz=BERLIN))
    assert allows([night], at(2026, 11, 28, 1, 59, 59, tz=BERLIN))
    assert not allows([night], at(2026, 11, 28, 2, 0, tz=BERLIN))
    assert not allows([night], at(2026, 11, 27, 21, 59, tz=BERLIN))
    assert wall(next_open([night], at(2026, 11, 28, 2, 0, tz=BERLIN)).at) == (
        "2026-11-28T22:00:00+01:00"
    )
    # a deny over the weekend: Friday 22:00 to Monday 10:00 (the issue's example)
    weekend = window("deny", "0 22 * * 5", "60h", "Europe/Berlin")
    assert allows([weekend], at(2026, 11, 27, 21, 59, tz=BERLIN))
    assert not allows([weekend], at(2026, 11, 28, 0, 0, tz=BERLIN))
    assert not allows([weekend], at(2026, 11, 30, 9, 59, tz=BERLIN))
    opens = next_open([weekend], at(2026, 11, 27, 22, 0, tz=BERLIN))
    assert wall(opens.at) == "2026-11-30T10:00:00+01:00"


def test_a_window_longer_than_its_period_is_open_without_a_gap() -> None:
    allow = window("allow", "0 */6 * * *", "7h")  # opens every 6 h, for 7 h
    for hour in range(24):
        for minute in (0, 30, 59):
            assert allows([allow], at(2026, 11, 27, hour, minute))
    deny = window("deny", "0 0 * * *", "25h")  # closed for good
    assert not allows([deny], at(2026, 11, 27, 23, 59))
    opening = next_open([deny], at(2026, 11, 27, 12, 0))
    assert opening.at is None
    assert opening.looked_to > at(2026, 11, 28, 12, 0)  # said how far it looked


def test_a_window_longer_than_its_period_in_another_list_ends_where_its_run_ends() -> None:
    # each opening of 90 min overlaps the next, from 08:00 to 11:30: one run
    deny = window("deny", "0 8-10 * * *", "90m")
    assert not allows([deny], at(2026, 11, 27, 11, 29))
    assert next_open([deny], at(2026, 11, 27, 8, 0)).at == at(2026, 11, 27, 11, 30)


def test_a_deny_inside_an_allow_wins() -> None:
    day = window("allow", "0 9 * * MON-FRI", "8h", "Europe/Berlin")
    lunch = window("deny", "0 12 * * *", "1h", "Europe/Berlin")
    both = (*day, *lunch)
    assert allows([both], at(2026, 11, 27, 11, 59, tz=BERLIN))
    assert not allows([both], at(2026, 11, 27, 12, 0, tz=BERLIN))
    assert not allows([both], at(2026, 11, 27, 12, 59, tz=BERLIN))
    assert allows([both], at(2026, 11, 27, 13, 0, tz=BERLIN))
    assert next_open([both], at(2026, 11, 27, 12, 10, tz=BERLIN)).at == at(
        2026, 11, 27, 13, 0, tz=BERLIN
    )
    # Friday 17:00: closed until Monday 09:00 (no allow window on the weekend)
    assert wall(next_open([both], at(2026, 11, 27, 17, 0, tz=BERLIN)).at) == (
        "2026-11-30T09:00:00+01:00"
    )
    # ... and a deny that covers the allow's opening moves it to the deny's end
    monday = window("deny", "0 8 * * MON", "2h", "Europe/Berlin")
    assert wall(next_open([(*both, *monday)], at(2026, 11, 27, 17, 0, tz=BERLIN)).at) == (
        "2026-11-30T10:00:00+01:00"
    )


def test_every_list_that_applies_must_allow() -> None:
    cluster = window("deny", "0 22 * * 5", "60h", "Europe/Berlin")
    namespace = window("allow", "0 9 * * *", "8h", "Europe/Berlin")
    workload = window("allow", "0 18 * * *", "2h", "Europe/Berlin")  # outside its namespace's
    saturday_ten = at(2026, 11, 28, 10, 0, tz=BERLIN)
    assert list_allows(namespace, saturday_ten) and not allows([cluster, namespace], saturday_ten)
    # the workload's own allow window does not widen its namespace's
    evening = at(2026, 11, 26, 18, 30, tz=BERLIN)
    assert list_allows(workload, evening) and not allows([namespace, workload], evening)
    # so these two never allow at once: said, within the bound
    never = next_open([namespace, workload], at(2026, 11, 26, 12, 0, tz=BERLIN))
    assert never.at is None
    # lists that overlap open where they overlap
    late = window("allow", "0 16 * * *", "2h", "Europe/Berlin")
    assert wall(next_open([namespace, late], at(2026, 11, 26, 7, 0, tz=BERLIN)).at) == (
        "2026-11-26T16:00:00+01:00"
    )


def test_how_long_an_answer_holds() -> None:
    day = window("allow", "0 9 * * MON-FRI", "8h", "Europe/Berlin")
    lunch = window("deny", "0 12 * * *", "1h", "Europe/Berlin")
    both = (*day, *lunch)
    # open at 10:00 until lunch; closed at lunch until 13:00; open then until 17:00
    morning = standing([both], at(2026, 11, 27, 10, 0, tz=BERLIN))
    assert morning.allowed and morning.until == at(2026, 11, 27, 12, 0, tz=BERLIN)
    closed = standing([both], at(2026, 11, 27, 12, 30, tz=BERLIN))
    assert not closed.allowed and closed.until == at(2026, 11, 27, 13, 0, tz=BERLIN)
    late = standing([both], at(2026, 11, 27, 13, 0, tz=BERLIN))
    assert late.allowed and late.until == at(2026, 11, 27, 17, 0, tz=BERLIN)
    # no window: allowed for as long as it looks
    free = standing([()], at(2026, 11, 27, 13, 0))
    assert free.allowed and free.until == at(2026, 11, 27, 13, 0) + LOOK_AHEAD


def test_a_list_that_never_opens_says_how_far_it_looked() -> None:
    always = window("deny", "* * * * *", "1m")
    opening = next_open([always], at(2026, 1, 1))
    assert opening.at is None
    assert at(2026, 1, 1) < opening.looked_to <= at(2026, 1, 1) + LOOK_AHEAD


# -- daylight saving time


def test_berlin_spring_forward() -> None:
    # 2026-03-29: 02:00 CET becomes 03:00 CEST; 02:30 does not exist that day
    early = window("allow", "30 2 * * *", "1h", "Europe/Berlin")
    opens = next_open([early], at(2026, 3, 29, 0, 0, tz=BERLIN)).at
    assert wall(opens) == "2026-03-29T03:00:00+02:00"  # Debian's cron: the first minute after
    assert not allows([early], at(2026, 3, 29, 1, 59, tz=BERLIN))
    assert allows([early], at(2026, 3, 29, 3, 59, tz=BERLIN))
    assert not allows([early], at(2026, 3, 29, 4, 0, tz=BERLIN))
    assert wall(next_open([early], at(2026, 3, 29, 4, 0, tz=BERLIN)).at) == (
        "2026-03-30T02:30:00+02:00"
    )
    # a window of elapsed time across the change: Saturday 22:00 CET + 12h = Sunday 11:00 CEST
    overnight = window("deny", "0 22 * * 6", "12h", "Europe/Berlin")
    assert not allows([overnight], at(2026, 3, 29, 10, 59, tz=BERLIN))
    assert allows([overnight], at(2026, 3, 29, 11, 0, tz=BERLIN))


def test_berlin_fall_back() -> None:
    # 2026-10-25: 03:00 CEST becomes 02:00 CET; 02:00-02:59 happens twice
    early = window("allow", "30 2 * * *", "1h", "Europe/Berlin")
    first = at(2026, 10, 25, 2, 30, tz=BERLIN, fold=0)
    assert next_open([early], at(2026, 10, 25, 0, 0, tz=BERLIN)).at == first
    # an hour of elapsed time: it closes at the second 02:30
    assert allows([early], at(2026, 10, 25, 2, 29, tz=BERLIN, fold=1))
    assert not allows([early], at(2026, 10, 25, 2, 30, tz=BERLIN, fold=1))
    # it opens once that day (Debian's cron): from the second 02:30, next is the next day's
    assert wall(next_open([early], at(2026, 10, 25, 2, 31, tz=BERLIN, fold=1)).at) == (
        "2026-10-26T02:30:00+01:00"
    )
    # from inside the repeated hour, a start in its first occurrence is past (Debian's cron
    # reads the schedule on the wall clock, and so does cronsim): not an opening to come
    late = window("allow", "45 2 * * *", "10m", "Europe/Berlin")
    inside = at(2026, 10, 25, 2, 40, tz=BERLIN, fold=1)
    assert late[0].first_start_after(inside) == at(2026, 10, 26, 2, 45, tz=BERLIN)
    assert not allows([late], inside)
    assert wall(next_open([late], inside).at) == "2026-10-26T02:45:00+01:00"
    # the weekend deny across the change ends an hour earlier on the wall clock
    weekend = window("deny", "0 22 * * 5", "60h", "Europe/Berlin")
    assert wall(next_open([weekend], at(2026, 10, 24, 12, 0, tz=BERLIN)).at) == (
        "2026-10-26T09:00:00+01:00"
    )


def test_new_york_spring_forward() -> None:
    # 2026-03-08: 02:00 EST becomes 03:00 EDT
    two = window("allow", "0 2 * * *", "30m", "America/New_York")
    assert wall(next_open([two], at(2026, 3, 8, 0, 0, tz=NEW_YORK)).at, NEW_YORK) == (
        "2026-03-08T03:00:00-04:00"
    )
    assert wall(next_open([two], at(2026, 3, 8, 4, 0, tz=NEW_YORK)).at, NEW_YORK) == (
        "2026-03-09T02:00:00-04:00"
    )
    # a schedule that follows the clock skips the hour that does not exist
    hourly = window("allow", "15 * * * *", "10m", "America/New_York")
    starts = _starts(
        hourly[0], at(2026, 3, 8, 0, 0, tz=NEW_YORK), at(2026, 3, 9, 0, 0, tz=NEW_YORK)
    )
    assert len(starts) == 23


def test_new_york_fall_back() -> None:
    # 2026-11-01: 02:00 EDT becomes 01:00 EST; 01:00-01:59 happens twice
    one = window("allow", "30 1 * * *", "1h", "America/New_York")
    assert next_open([one], at(2026, 11, 1, 0, 0, tz=NEW_YORK)).at == at(
        2026, 11, 1, 1, 30, tz=NEW_YORK, fold=0
    )
    assert allows([one], at(2026, 11, 1, 1, 10, tz=NEW_YORK, fold=1))
    assert not allows([one], at(2026, 11, 1, 1, 30, tz=NEW_YORK, fold=1))
    assert wall(next_open([one], at(2026, 11, 1, 1, 45, tz=NEW_YORK, fold=1)).at, NEW_YORK) == (
        "2026-11-02T01:30:00-05:00"
    )
    # a schedule that follows the clock opens in both 01:15s
    hourly = window("allow", "15 * * * *", "10m", "America/New_York")
    assert allows([hourly], at(2026, 11, 1, 1, 20, tz=NEW_YORK, fold=0)) and allows(
        [hourly], at(2026, 11, 1, 1, 20, tz=NEW_YORK, fold=1)
    )
    starts = _starts(
        hourly[0], at(2026, 11, 1, 0, 0, tz=NEW_YORK), at(2026, 11, 2, 0, 0, tz=NEW_YORK)
    )
    assert len(starts) == 25


def _starts(w: Window, start: float, end: float) -> list[float]:
    out: list[float] = []
    for s in w.starts_after(start - 1):
        if s >= end:
            return out
        out.append(s)
    return out


# -- properties

_ZONES = st.sampled_from(
    ["UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Asia/Kolkata"]
)
# Around the changes of 2026 and 2027 in both zones, and at any time of year.
_WHEN = st.floats(min_value=at(2026, 1, 1), max_value=at(2027, 12, 31), allow_nan=False)


@st.composite
def _schedules(draw: st.DrawFn) -> str:
    minute = draw(st.sampled_from(["0", "30", "*/15", "5,45", "*", "10-20"]))
    hour = draw(st.sampled_from(["*", "0", "1", "2", "3", "9", "22", "1-3", "*/6", "9-17"]))
    dom = draw(st.sampled_from(["*", "*", "1", "15", "29", "31", "1-7"]))
    month = draw(st.sampled_from(["*", "*", "3", "10,11", "JAN-JUN"]))
    dow = draw(st.sampled_from(["*", "*", "MON-FRI", "0", "6,0", "5"]))
    return f"{minute} {hour} {dom} {month} {dow}"


@st.composite
def _windows(draw: st.DrawFn) -> Window:
    kind = draw(st.sampled_from([Kind.ALLOW, Kind.DENY]))
    minutes = draw(st.sampled_from([1, 10, 30, 60, 90, 8 * 60, 25 * 60, 60 * 60]))
    return Window(kind, draw(_schedules()), minutes * MINUTE, draw(_ZONES))


_LISTS = st.lists(st.lists(_windows(), max_size=3).map(tuple), max_size=3)


@settings(max_examples=60, deadline=None)
@given(_LISTS, _WHEN, st.floats(min_value=0, max_value=1))
def test_the_opening_found_is_the_first(lists: list[Windows], when: float, part: float) -> None:
    """`next_open` names an instant the lists allow, and none before it allows."""
    opening = next_open(lists, when, look_ahead=40 * 86_400.0)
    if opening.at is None:
        assert opening.looked_to > when
        return
    assert opening.at >= when
    assert allows(lists, opening.at)
    if opening.at > when:
        assert not allows(lists, when)
        assert not allows(lists, opening.at - 0.001)
        assert not allows(lists, when + (opening.at - when) * part * 0.999)


@settings(max_examples=60, deadline=None)
@given(_LISTS, _WHEN, st.floats(min_value=0, max_value=1))
def test_the_answer_holds_until_it_says(lists: list[Windows], when: float, part: float) -> None:
    """`standing` answers as `allows` does, and the same at every instant before its `until`
    (what lets a controller ask once per set of lists, not once per workload)."""
    said = standing(lists, when, look_ahead=40 * 86_400.0)
    assert said.allowed is allows(lists, when)
    assert said.until > when
    # (where an answer can change: at a window's start or end; and anywhere)
    edges = [
        edge
        for w in (w for windows in lists for w in windows)
        if (start := w.first_start_after(when)) is not None
        for edge in (start, start + w.seconds)
    ]
    anywhere = (when + (said.until - when) * part * 0.999, said.until - 0.001)
    for at in (*edges, *anywhere):
        if when <= at < said.until:
            assert allows(lists, at) is said.allowed


@settings(max_examples=60, deadline=None)
@given(_LISTS, _windows(), _WHEN, st.floats(min_value=0, max_value=0.999))
def test_a_deny_window_always_wins(
    lists: list[Windows], deny: Window, base: float, part: float
) -> None:
    deny = Window(Kind.DENY, deny.schedule, deny.duration, deny.time_zone)
    start = deny.first_start_after(base)
    assume(start is not None)
    assert start is not None
    when = start + deny.seconds * part  # (inside one of its openings)
    assert deny.open_at(when) is not None
    assert not allows([*lists, (deny,)], when)
    assert not allows([(*lst, deny) for lst in lists] or [(deny,)], when)


@settings(max_examples=60, deadline=None)
@given(st.lists(_windows(), min_size=1, max_size=4).map(tuple), _WHEN)
def test_with_allow_windows_only_inside_one(windows: Windows, when: float) -> None:
    has_allow = any(w.kind is Kind.ALLOW for w in windows)
    if list_allows(windows, when):
        assert all(w.open_at(when) is None for w in windows if w.kind is Kind.DENY)
        if has_allow:
            assert any(w.open_at(when) is not None for w in windows if w.kind is Kind.ALLOW)


@settings(max_examples=60, deadline=None)
@given(_windows(), _WHEN)
def test_an_open_window_is_inside_one_of_its_openings(w: Window, when: float) -> None:
    """Open at `when` exactly when one of its starts is in (when - duration, when]."""
    end = w.open_at(when)
    starts = _starts(w, when - w.seconds, when + 1)
    if end is None:
        assert not [s for s in starts if when - w.seconds < s <= when]
    else:
        assert end - w.seconds <= when < end
        assert end - w.seconds in starts


@settings(max_examples=60, deadline=None)
@given(_windows(), _WHEN)
def test_starts_come_after_and_in_order(w: Window, when: float) -> None:
    starts: list[float] = []
    for start in w.starts_after(when):
        if start >= when + 3 * 86_400:
            break
        starts.append(start)
    assert all(s > when for s in starts)
    assert starts == sorted(set(starts))
    assert all(s % 60 == 0 for s in starts)  # on a whole minute, whatever the zone's offset


_CHANGES = [
    # (zone, a day of each change of the clocks)
    ("Europe/Berlin", (2026, 3, 29)), ("Europe/Berlin", (2026, 10, 25)),
    ("Europe/Berlin", (2027, 3, 28)), ("Europe/Berlin", (2027, 10, 31)),
    ("America/New_York", (2026, 3, 8)), ("America/New_York", (2026, 11, 1)),
    ("America/New_York", (2027, 3, 14)), ("America/New_York", (2027, 11, 7)),
]  # fmt: skip


@settings(max_examples=80, deadline=None)
@given(st.sampled_from(_CHANGES), st.integers(0, 59), st.integers(0, 23))
def test_a_fixed_time_opens_once_a_day_across_a_change_of_the_clocks(
    change: tuple[str, tuple[int, int, int]], minute: int, hour: int
) -> None:
    """Debian's cron: a start in the skipped hour moves to the first minute after it, a start
    in the repeated hour happens once; every day has its one opening."""
    name, (year, month, day) = change
    zone = ZoneInfo(name)
    w = Window(Kind.ALLOW, f"{minute} {hour} * * *", 10 * MINUTE, name)
    first = datetime(year, month, day, tzinfo=zone) - timedelta(days=2)
    starts = _starts(w, first.timestamp(), (first + timedelta(days=5)).timestamp())
    days = [datetime.fromtimestamp(s, zone).date() for s in starts]
    assert days == [(first + timedelta(days=n)).date() for n in range(5)]
    for s in starts:
        local = datetime.fromtimestamp(s, zone)
        assert (local.hour, local.minute) == (hour, minute) or (
            local.date() == datetime(year, month, day).date() and local.minute == 0
        )


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(_CHANGES), st.integers(0, 59))
def test_a_schedule_that_follows_the_clock_opens_each_real_hour(
    change: tuple[str, tuple[int, int, int]], minute: int
) -> None:
    name, (year, month, day) = change
    zone = ZoneInfo(name)
    w = Window(Kind.ALLOW, f"{minute} * * * *", 10 * MINUTE, name)
    start = datetime(year, month, day, tzinfo=zone)
    end = start + timedelta(days=1)
    starts = _starts(w, start.timestamp(), end.timestamp())
    hours = round((end.timestamp() - start.timestamp()) / 3600)  # 23, 24 or 25
    assert len(starts) == hours
    assert all(b - a == 3600 for a, b in itertools.pairwise(starts))


def test_an_instant_a_fraction_of_a_microsecond_before_a_start_is_not_past_it() -> None:
    """(Hypothesis found it) datetime rounds 1830211199.9999998 up to the next second, and the
    start at 1830211200 was taken as not after it: an always-open list read as closed there."""
    always = Window(Kind.ALLOW, "* * * * *", 60_000_000_000)
    when = 1830211199.9999998
    assert always.first_start_after(when) == 1830211200.0
    assert allows([(always,)], when)
    assert standing([(always,)], when).allowed
