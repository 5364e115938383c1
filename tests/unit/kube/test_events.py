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

from webhook.core.reasons import EVENTS, NORMAL, WARNING, EventReason
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
    recorder.say(
        regarding, EventReason.SOURCE_MISSING, "configmap/app-config not found", creating=PATH
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
    recorder.say(regarding, EventReason.OPTED_OUT, "mode off", creating=PATH)
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
    recorder.say(
        Regarding("apps/v1", "Deployment", "shop", "web"), EventReason.OPTED_OUT, "x", creating=PATH
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
    recorder.say(
        _deployment("uid-2", time.time()),
        EventReason.COPY_CREATED,
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
        recorder.say(regarding, EventReason.OPTED_OUT, "x", creating=f"{PATH}-{i}")
    _wait(lambda: len(dropped) == 5)
    recorder.stop()
    assert sorted(dropped) == ["never created"] * 3 + ["queue full"] * 2


def test_a_reason_is_recorded_with_its_type_and_action_from_the_table() -> None:
    kube, dropped = FakeKube(), []
    recorder = _recorder(kube, dropped)
    deployment = _deployment("uid-3", time.time())
    recorder.say(deployment, EventReason.ROLLED_INSTEAD_OF_REFRESH, "rolled")
    recorder.say(deployment, EventReason.ROLLED_INSTEAD_OF_REFRESH, "in the way", warning=True)
    recorder.say(deployment, EventReason.CONFIG_ROLLED_BACK, "undone")
    with pytest.raises(ValueError, match="never a Warning"):
        recorder.say(deployment, EventReason.RECORDED, "x", warning=True)
    recorder.stop()
    said = [(e["reason"], e["type"], e["action"], e["note"]) for e in kube.created]
    assert said == [
        ("RolledInsteadOfRefresh", "Normal", "Rollout", "rolled"),
        ("RolledInsteadOfRefresh", "Warning", "Rollout", "in the way"),
        ("ConfigRolledBack", "Warning", "Rollout", "undone"),
    ]


# --- the docs' list of Events (docs/operations.md) is the code's -------------------------

REPO = Path(__file__).resolve().parents[3]


def _recorded() -> set[tuple[EventReason, bool]]:
    """(reason, said as a Warning where it has a second type) of every Event the code
    records: `.say(...)` called on the recorder (held as `events`, `.events` or `.recorder`
    throughout), the reason a member of EventReason named in the call."""
    found = set()
    for source in (REPO / "webhook").rglob("*.py"):
        for node in ast.walk(ast.parse(source.read_text(), str(source))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            owner = node.func.value
            recorder = (isinstance(owner, ast.Name) and owner.id == "events") or (
                isinstance(owner, ast.Attribute) and owner.attr in ("events", "recorder")
            )
            if node.func.attr != "say" or not recorder:
                continue
            reason = node.args[1]
            assert (
                isinstance(reason, ast.Attribute)
                and isinstance(reason.value, ast.Name)
                and reason.value.id == "EventReason"
            ), f"{source.name}:{node.lineno}: an Event's reason is a member of EventReason"
            warning = any(k.arg == "warning" for k in node.keywords)
            found.add((EventReason[reason.attr], warning))
    return found


def test_every_reason_is_recorded_somewhere_and_with_its_types() -> None:
    recorded = _recorded()
    assert {reason for reason, _ in recorded} == set(EventReason)
    for reason, warning in recorded:
        assert not warning or WARNING in reason.said.types, reason
    for reason, kind in EVENTS.items():
        assert kind.types[0] in (NORMAL, WARNING) and set(kind.types) <= {NORMAL, WARNING}
        second = len(kind.types) > 1
        assert second == ((reason, True) in recorded), f"{reason}: its Warning is never said"


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
    """docs/operations.md's table of Events is the table of EVENTS, reason by reason and type
    by type (RolledInsteadOfRefresh is a Normal Event, and a Warning where a setting or a
    permission stood in the way: two rows)."""
    table = {(reason.value, t) for reason, kind in EVENTS.items() for t in kind.types}
    assert len(table) >= 20, table
    assert _documented() == table


class _PatchingKube(FakeKube):
    """FakeKube that also keeps the series updates (merge patches of Events)."""

    def __init__(self) -> None:
        super().__init__()
        self.patched: list[tuple[str, dict[str, Any]]] = []

    def patch(self, api_path: str, patch: dict[str, Any], **_: Any) -> dict[str, Any]:
        with self.lock:
            self.patched.append((api_path, patch))
        return patch


def test_repeats_fold_into_a_series_and_the_last_repeated_is_kept_longest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(events, "CACHE_SIZE", 2)  # (series kept, and rate buckets)
    kube, dropped = _PatchingKube(), []
    recorder = EventRecorder(
        kube,  # type: ignore[arg-type]
        "configpin.io/test",
        "test-0",
        on_drop=dropped.append,
        clock=lambda: 1000.0,
    ).start()
    deployment = _deployment("uid-1", 990.0)
    for note in ("a", "b", "a", "c", "a", "b"):  # c evicts b's series, a was repeated since
        recorder.say(deployment, EventReason.OPTED_OUT, note)
    recorder.stop()
    assert dropped == []
    assert [e["note"] for e in kube.created] == ["a", "b", "c", "b"]
    [(path, patch)] = kube.patched  # (stop flushes what is not written yet)
    assert path.endswith("/" + kube.created[0]["metadata"]["name"])
    assert patch["series"]["count"] == 3
