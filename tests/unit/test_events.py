"""The Event recorder without a cluster: an Event about an object being created waits for it
and carries its uid; none is written for an object that never comes to exist."""

from __future__ import annotations

import ast
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from webhook.kube import events
from webhook.kube.errors import NotFound
from webhook.kube.events import EventRecorder, Regarding

PATH = "/apis/apps/v1/namespaces/shop/deployments/web"


class FakeKube:
    """Objects by API path; Events created are kept."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.created: list[dict[str, Any]] = []
        self.gets = 0
        self.lock = threading.Lock()

    def get(self, api_path: str, *, timeout: float | None = None) -> dict[str, Any]:
        with self.lock:
            self.gets += 1
            if api_path not in self.objects:
                raise NotFound(api_path, 404, "not found")
            return self.objects[api_path]

    def create(self, api_path: str, body: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            self.created.append(body)
        return body


def _stamp(when: float) -> str:
    return datetime.fromtimestamp(when, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _deployment(uid: str, created: float) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": "web",
            "namespace": "shop",
            "uid": uid,
            "creationTimestamp": _stamp(created),
        },
    }


@pytest.fixture(autouse=True)
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(events, "CREATE_FIRST_LOOK", 0.05)
    monkeypatch.setattr(events, "CREATE_WAIT", 0.8)


def _recorder(kube: FakeKube, dropped: list[str]) -> EventRecorder:
    return EventRecorder(kube, "configpin.io/test", "test-0", on_drop=dropped.append).start()  # type: ignore[arg-type]


def _wait(predicate: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_an_event_about_an_object_being_created_waits_for_it_and_carries_its_uid() -> None:
    kube, dropped = FakeKube(), []
    recorder = _recorder(kube, dropped)
    regarding = Regarding("apps/v1", "Deployment", "shop", "web")
    recorder.warning(
        regarding, "SourceMissing", "Admit", "configmap/app-config not found", creating=PATH
    )
    time.sleep(0.2)
    assert kube.created == [], "written before the object exists"
    assert kube.gets >= 1
    kube.objects[PATH] = _deployment("uid-1", time.time())
    _wait(lambda: kube.created)
    recorder.stop()
    [event] = kube.created
    assert event["regarding"]["uid"] == "uid-1"
    assert event["reason"] == "SourceMissing"
    assert dropped == []


def test_no_event_when_the_object_never_comes_to_exist() -> None:
    kube, dropped = FakeKube(), []
    recorder = _recorder(kube, dropped)
    regarding = Regarding("apps/v1", "Deployment", "shop", "web")
    recorder.normal(regarding, "OptedOut", "Admit", "mode off", creating=PATH)
    _wait(lambda: dropped)
    recorder.stop()
    assert kube.created == []
    assert dropped == ["never created"]
    assert 2 <= kube.gets <= 6  # backed off: 0.05, 0.1, 0.2, 0.4, 0.8


def test_an_older_object_of_that_name_is_not_the_one_being_created() -> None:
    """A create that fails as AlreadyExists is admitted first: the Event must not land on the
    object that was there before."""
    kube, dropped = FakeKube(), []
    kube.objects[PATH] = _deployment("older", time.time() - 60)
    recorder = _recorder(kube, dropped)
    recorder.normal(
        Regarding("apps/v1", "Deployment", "shop", "web"), "OptedOut", "Admit", "x", creating=PATH
    )
    _wait(lambda: dropped)
    recorder.stop()
    assert kube.created == []
    assert dropped == ["never created"]


def test_an_object_with_a_uid_is_written_at_once_with_the_related_object() -> None:
    kube, dropped = FakeKube(), []
    recorder = _recorder(kube, dropped)
    copy = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "app-config-0123456789", "namespace": "shop", "uid": "c1"},
    }
    recorder.normal(
        _deployment("uid-2", time.time()),
        "CopyCreated",
        "Snapshot",
        "made",
        related=copy,
        creating=PATH,
    )
    recorder.stop()
    [event] = kube.created
    assert kube.gets == 0
    assert event["regarding"]["uid"] == "uid-2"
    assert event["related"] == {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "namespace": "shop",
        "name": "app-config-0123456789",
        "uid": "c1",
    }


def test_objects_waiting_to_be_created_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(events, "CREATE_WAITING_MAX", 3)
    kube, dropped = FakeKube(), []
    recorder = _recorder(kube, dropped)
    for i in range(5):
        regarding = Regarding("apps/v1", "Deployment", "shop", f"web-{i}")
        recorder.normal(regarding, "OptedOut", "Admit", "x", creating=f"{PATH}-{i}")
    _wait(lambda: len(dropped) == 5)
    recorder.stop()
    assert sorted(dropped) == ["never created"] * 3 + ["queue full"] * 2


# --- the docs' list of Events (docs/operations.md) is the code's -------------------------

REPO = Path(__file__).resolve().parents[2]


def _emitted() -> set[tuple[str, str]]:
    """(reason, type) of every Event the code records: `.normal(...)`/`.warning(...)` called
    on the recorder (held as `events` or `.events` throughout), the reason as a literal second
    argument (the recorder's signature)."""
    found = set()
    for source in (REPO / "webhook").rglob("*.py"):
        for node in ast.walk(ast.parse(source.read_text(), str(source))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            kind = {"normal": "Normal", "warning": "Warning"}.get(node.func.attr)
            owner = node.func.value
            recorder = (isinstance(owner, ast.Name) and owner.id == "events") or (
                isinstance(owner, ast.Attribute) and owner.attr == "events"
            )
            if kind is None or not recorder:
                continue
            reason = node.args[1]
            assert isinstance(reason, ast.Constant) and isinstance(reason.value, str), (
                f"{source.name}:{node.lineno}: an Event reason must be a literal, so that the "
                "list in docs/operations.md can be checked"
            )
            found.add((reason.value, kind))
    return found


def _documented() -> set[tuple[str, str]]:
    text = (REPO / "docs" / "operations.md").read_text()
    assert "<!-- events:begin" in text and "<!-- events:end -->" in text, (
        "docs/operations.md lost its events markers"
    )
    table = text.split("<!-- events:begin", 1)[1].split("<!-- events:end -->", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    return {
        (cells[0].strip("` "), cells[1].strip())
        for cells in (row.strip("|").split("|") for row in rows)
    }


def test_the_docs_list_exactly_the_events_the_code_emits() -> None:
    emitted = _emitted()
    assert len(emitted) >= 12, emitted
    assert _documented() == emitted
