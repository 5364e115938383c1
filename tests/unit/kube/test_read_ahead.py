"""List pages are read one ahead of the handler: in order, never more than one waiting,
errors raised in their place, and the reading thread gone once the list is left."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from webhook.kube.errors import Gone
from webhook.kube.informer import read_ahead


def _pages(count: int, fetched: list[int], fail_at: int | None = None) -> Iterator[int]:
    for i in range(count):
        if i == fail_at:
            raise Gone("/api/v1/configmaps", 410, "Expired: continue token too old")
        fetched.append(i)
        yield i


def _threads() -> set[str]:
    return {t.name for t in threading.enumerate()}


def test_in_order_and_one_ahead_at_most() -> None:
    fetched: list[int] = []
    seen = []
    for page in read_ahead(_pages(20, fetched), name="ahead-order"):
        time.sleep(0.01)  # the caller's work: the next page is fetched meanwhile
        assert len(fetched) <= page + 2  # this one and the next, no more
        seen.append(page)
    assert seen == list(range(20))


def test_the_next_page_is_fetched_while_the_caller_works() -> None:
    fetched: list[int] = []
    pages = read_ahead(_pages(3, fetched), name="ahead-overlap")
    assert next(pages) == 0
    deadline = time.monotonic() + 5
    while len(fetched) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert fetched == [0, 1]  # page 1 is in, page 2 is not asked for yet
    time.sleep(0.05)
    assert fetched == [0, 1]
    assert list(pages) == [1, 2]


def test_an_error_is_raised_in_place_of_its_page() -> None:
    fetched: list[int] = []
    seen = []
    with pytest.raises(Gone):
        for page in read_ahead(_pages(10, fetched, fail_at=4), name="ahead-error"):
            seen.append(page)
    assert seen == [0, 1, 2, 3]


def test_leaving_the_list_stops_the_reading_thread() -> None:
    fetched: list[int] = []
    pages = read_ahead(_pages(100, fetched), name="ahead-left")
    assert next(pages) == 0
    pages.close()
    deadline = time.monotonic() + 5
    while "ahead-left" in _threads() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "ahead-left" not in _threads()
    assert len(fetched) <= 2
