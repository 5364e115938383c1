"""A list+watch API server in memory for the informer's tests (webhook/kube/informer.py) and the
dashboard's feeds (webhook/commands/dashboard/feeds.py): each path answers its lists and its
watches from a script, the last answer standing once the script is spent."""

from __future__ import annotations

import contextlib
import copy
import threading
from collections.abc import Iterator
from typing import Any

Answer = list[dict[str, Any]] | Exception


class ListWatch:
    """`lists[path]`: the answers to its lists in turn (items, or an error raised); `watches`:
    those to its watches (the events, or an error raised when it is opened). A watch sends
    its events, then stays open for `hold` s and ends as the server ends one."""

    def __init__(self, hold: float = 0.2) -> None:
        self.lists: dict[str, list[Answer]] = {}
        self.watches: dict[str, list[Answer]] = {}
        self.calls: list[tuple[str, str]] = []
        self.hold = hold
        self.closed = threading.Event()
        self._lock = threading.Lock()

    def _next(self, script: dict[str, list[Answer]], api_path: str) -> Answer:
        with self._lock:
            answers = script.get(api_path) or [[]]
            return answers.pop(0) if len(answers) > 1 else answers[0]

    def count(self, verb: str, api_path: str) -> int:
        with self._lock:
            return self.calls.count((verb, api_path))

    def list_pages(self, api_path: str, **_query: Any) -> Iterator[dict[str, Any]]:
        with self._lock:
            self.calls.append(("list", api_path))
        answer = self._next(self.lists, api_path)
        if isinstance(answer, Exception):
            raise answer
        yield {"metadata": {"resourceVersion": "5"}, "items": copy.deepcopy(answer)}

    @contextlib.contextmanager
    def watch(self, api_path: str, resource_version: str, **_query: Any) -> Iterator[Any]:
        with self._lock:
            self.calls.append(("watch", api_path))
        answer = self._next(self.watches, api_path)
        if isinstance(answer, Exception):
            raise answer
        yield self._stream(copy.deepcopy(answer))

    def _stream(self, events: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        yield from events
        self.closed.wait(self.hold)
