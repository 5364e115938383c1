"""NamespaceSet.confirm: the API server's answer for a namespace the watch has not shown as
selected, kept a few seconds and a thousand names at most (no API server: a fake `get`)."""

from __future__ import annotations

from typing import Any, cast

import pytest

from webhook.kube import namespaces as namespaces_module
from webhook.kube.errors import KubeError
from webhook.kube.namespaces import NamespaceSet
from webhook.kube.raw import Kube
from webhook.process.metrics import Metrics


class _Kube:
    """Answers the namespace lists `confirm` asks for: `selected` are selected."""

    def __init__(self, selected: set[str]) -> None:
        self.selected = selected
        self.asked: list[str] = []

    def get(self, api_path: str, **query: Any) -> dict[str, Any]:
        assert api_path == "/api/v1/namespaces"
        name = str(query["fieldSelector"]).removeprefix("metadata.name=")
        self.asked.append(name)
        meta = {"name": name}
        return {"items": [{"metadata": meta}] if name in self.selected else []}


@pytest.fixture
def now(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    clock = [1000.0]
    monkeypatch.setattr(namespaces_module.time, "monotonic", lambda: clock[0])
    return clock


def _namespaces(kube: _Kube) -> NamespaceSet:
    return NamespaceSet(cast(Kube, kube), Metrics(), label_selector="configpin.io/enabled=true")


def test_an_answer_is_kept_for_its_ttl_then_asked_again(now: list[float]) -> None:
    kube = _Kube({"labelled-a-moment-ago"})
    namespaces = _namespaces(kube)
    assert namespaces.confirm("labelled-a-moment-ago", 1.0)
    assert not namespaces.confirm("not-selected", 1.0)
    now[0] += namespaces_module._CONFIRMED_TTL - 0.1
    assert namespaces.confirm("labelled-a-moment-ago", 1.0)
    assert not namespaces.confirm("not-selected", 1.0)
    assert kube.asked == ["labelled-a-moment-ago", "not-selected"]  # kept
    now[0] += 0.1
    assert not namespaces.confirm("not-selected", 1.0)
    assert kube.asked[2:] == ["not-selected"]  # expired: asked again


def test_answers_are_bounded_the_oldest_evicted_first(
    now: list[float], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(namespaces_module, "_CONFIRMED_MAX", 3)
    kube = _Kube(set())
    namespaces = _namespaces(kube)
    for i in range(5):
        assert not namespaces.confirm(f"ns-{i}", 1.0)
    del kube.asked[:]
    for i in (2, 3, 4):
        assert not namespaces.confirm(f"ns-{i}", 1.0)
    assert kube.asked == []  # the last three kept
    assert not namespaces.confirm("ns-0", 1.0)
    assert kube.asked == ["ns-0"]  # the first evicted


def test_a_failed_read_is_not_kept(now: list[float]) -> None:
    class _Failing(_Kube):
        def get(self, api_path: str, **query: Any) -> dict[str, Any]:
            super().get(api_path, **query)
            raise KubeError("listing namespaces", 503, "unavailable")

    kube = _Failing({"a"})
    namespaces = _namespaces(kube)
    assert not namespaces.confirm("a", 1.0)
    assert not namespaces.confirm("a", 1.0)
    assert kube.asked == ["a", "a"]
