"""webhook/kube/informer: the list+watch the controller runs (list, watch from there, relist on
410, retry with backoff), and the hooks a reader with a person's rights needs (the dashboard):
a namespace, each failure told (`on_error`, which says how long to wait), a watch told open
(`on_watch`), lists again instead of a watch (`poll`). Against `ListWatch`, an API server in
memory."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

import pytest

from tests.unit.kube.listwatch import ListWatch
from webhook.core.model import JSONObject
from webhook.kube.errors import Forbidden, Gone, KubeError
from webhook.kube.informer import Informer
from webhook.process.metrics import Metrics

DEPLOYMENTS = "/apis/apps/v1/deployments"
IN_SHOP = "/apis/apps/v1/namespaces/shop/deployments"


def _dep(name: str, rv: str = "1") -> dict[str, Any]:
    return {"metadata": {"namespace": "shop", "name": name, "resourceVersion": rv}}


class _Handler:
    def __init__(self) -> None:
        self.names: set[str] = set()
        self.relists = 0

    def relisted(self, items: Iterable[JSONObject]) -> None:
        self.names = {i["metadata"]["name"] for i in items}
        self.relists += 1

    def event(self, kind: str, obj: JSONObject) -> None:
        name = obj["metadata"]["name"]
        if kind == "DELETED":
            self.names.discard(name)
        else:
            self.names.add(name)


def _until(what: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def _running(informer: Informer) -> Informer:
    informer.start()
    return informer


def test_the_controllers_informer_lists_watches_and_relists_on_410_as_before(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No hook (the controller's): every namespace; the watch's events kept; a 410 relists;
    a failed list is logged as a warning and tried again after its backoff."""
    api = ListWatch()
    api.lists[DEPLOYMENTS] = [KubeError("GET", 500, "InternalError"), [_dep("a")], [_dep("b")]]
    api.watches[DEPLOYMENTS] = [
        [{"type": "ADDED", "object": _dep("c", "6")}],
        Gone(DEPLOYMENTS, 410, "expired"),
        [],
    ]
    handler = _Handler()
    with caplog.at_level(logging.WARNING, logger="webhook.kube.informer"):
        informer = _running(Informer(api, "deployments", handler, Metrics()))  # type: ignore[arg-type]
        try:
            _until(lambda: handler.relists == 2)
        finally:
            informer.stop()
    assert informer.api_path == DEPLOYMENTS
    assert handler.names == {"b"}  # (a, then c by the watch, then relisted after the 410)
    assert api.calls[:4] == [("list", DEPLOYMENTS)] * 2 + [("watch", DEPLOYMENTS)] * 2
    assert any("watch of deployments failed" in r.getMessage() for r in caplog.records)


def test_on_error_is_told_each_failure_and_says_how_long_to_wait(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A failed list, then a failed watch: each told with what was being done, the wait it
    answers (0: at once) kept instead of the backoff, and nothing logged above debug (the
    caller says it). `on_watch` is told when a watch is open; the namespace is in the path."""
    api = ListWatch()
    api.lists[IN_SHOP] = [Forbidden("GET", 403, "Forbidden: list"), [_dep("a")]]
    api.watches[IN_SHOP] = [KubeError("GET", None, "NewConnectionError"), []]
    told: list[tuple[str, str]] = []
    opened: list[float] = []

    def on_error(doing: str, error: Exception) -> float:
        told.append((doing, type(error).__name__))
        return 0.0

    handler = _Handler()
    with caplog.at_level(logging.INFO, logger="webhook.kube.informer"):
        informer = _running(
            Informer(
                api,  # type: ignore[arg-type]
                "deployments",
                handler,
                Metrics(),
                namespace="shop",
                on_error=on_error,
                on_watch=lambda: opened.append(time.monotonic()),
            )
        )
        try:
            _until(lambda: bool(opened))
        finally:
            informer.stop()
    assert told == [("list", "Forbidden"), ("watch", "KubeError")]
    assert handler.names == {"a"}
    assert api.calls[:2] == [("list", IN_SHOP), ("list", IN_SHOP)]  # (no backoff waited)
    assert not caplog.records


def test_poll_lists_again_instead_of_watching() -> None:
    api = ListWatch()
    api.lists[IN_SHOP] = [[_dep("a")], [_dep("a"), _dep("b")]]
    handler = _Handler()
    informer = Informer(
        api,  # type: ignore[arg-type]
        "deployments",
        handler,
        Metrics(),
        namespace="shop",
        poll=0.02,
        on_error=lambda _d, _e: None,
    )
    informer.start()
    try:
        _until(lambda: api.count("list", IN_SHOP) >= 3)
    finally:
        informer.stop()
    assert handler.names == {"a", "b"}
    assert api.count("watch", IN_SHOP) == 0
