"""`configpin pause` and `resume` (issue 47, shared/SPEC.md "Acting on a change"): the gate and
what is shown. While the content a source holds is paused (its signed record, webhook/core/
verbs.py), the gate (webhook/controller/waves.py) starts no rollout of that change, in any
wave, and says so with who paused it; `resume` lets it go on; a pause of older content holds
no newer change. The ConfigRollout says Stalled/Paused with who and when, a started rollout
still shows as rolling, and `configpin status` and the health checks read `paused`
(webhook/core/rollouts.py). The record itself: tests/unit/server/test_verbs.py."""

from __future__ import annotations

from harness.builders import HKEY, WORKLOAD_NAMESPACE, Store, admitted, configmap, reading, workload
from harness.controller import StoreCache
from webhook.controller.index import WorkloadIndex
from webhook.controller.waves import Gate
from webhook.core import digest
from webhook.core.constants import ANN_ACTED
from webhook.core.current import WorkloadEntry, WorkloadRef, entry_from_object
from webhook.core.model import SourceId, SourceKind
from webhook.core.reasons import Status
from webhook.core.rollouts import (
    ChangeView,
    MemberState,
    MemberView,
    RolloutReason,
    held_text,
    member_wait,
    rollout_status,
    verdict,
)
from webhook.core.times import format_time
from webhook.core.verbs import Acted, Verb
from webhook.core.waves import WaitReason
from webhook.process.config import Settings

NS = WORKLOAD_NAMESPACE
NOW = 1_800_000_000.0
CFG = SourceId(SourceKind.CONFIGMAP, "cfg")
APP = WorkloadRef("Deployment", NS, "app")


class _World:
    """Deployment `app` reading `cfg`; then `cfg` changed: the gate as the controller builds
    it (waves `1,100%`: `app` alone is its first wave)."""

    def __init__(self) -> None:
        self.store = Store([configmap("cfg", {"a": "1"}, namespace=NS)])
        obj = admitted(workload("Deployment", reading("cfg", "a"), name="app"), self.store)
        entry = entry_from_object(obj, "checksum", hkey=HKEY)
        assert isinstance(entry, WorkloadEntry)
        self.index = WorkloadIndex()
        self.index.put(entry)
        self.set("2")
        self.gate = Gate(
            self.index,
            StoreCache(self.store),  # type: ignore[arg-type]
            HKEY,
            Settings(),
            in_scope=lambda _ns: True,
        )

    def set(self, value: str, acted: str | None = None) -> None:
        notes = {ANN_ACTED: acted} if acted is not None else None
        self.store.put(configmap("cfg", {"a": value}, namespace=NS, annotations=notes))

    def content(self) -> str:
        record = self.store.lookup(CFG)
        assert record is not None
        return digest.content_id(digest.source_digest(HKEY, record))

    def say(self, verb: Verb, user: str, at: float = NOW, value: str = "2") -> None:
        """`verb` recorded, as admission records it, of the content `cfg` holds (`value`)."""
        self.set(value)
        acted = Acted(verb, user, at, self.content()).encode(HKEY, NS, CFG)
        self.set(value, acted)

    def wait(self) -> object:
        changes = self.gate.changes(NS, [CFG])
        wait = self.gate.wait(APP, changes)
        if wait is None:
            self.gate.release(APP)
        return wait


def test_a_paused_change_starts_no_rollout_and_says_who_paused_it() -> None:
    world = _World()
    assert world.wait() is None  # (not paused: it rolls)
    world.say(Verb.PAUSE, "alice@example.com")
    wait = world.wait()
    assert wait is not None and wait.reason is WaitReason.PAUSED  # type: ignore[attr-defined]
    why = wait.why  # type: ignore[attr-defined]
    assert f"paused by alice@example.com at {format_time(NOW)}" in why
    assert f"kubectl configpin resume configmap/cfg -n {NS}" in why
    text = held_text(wait)  # type: ignore[arg-type]
    assert text is not None and text.startswith("Paused: ")  # (Argo CD: Suspended)


def test_resume_lets_the_change_roll() -> None:
    world = _World()
    world.say(Verb.PAUSE, "alice")
    assert world.wait() is not None
    world.say(Verb.RESUME, "bob", NOW + 60)
    assert world.wait() is None


def test_a_pause_of_older_content_holds_no_newer_change() -> None:
    world = _World()
    world.say(Verb.PAUSE, "alice")
    assert world.wait() is not None
    record = world.store.lookup(CFG)
    assert record is not None
    acted = (world.store.objects[CFG]["metadata"]["annotations"] or {})[ANN_ACTED]
    world.set("3", acted)  # (the record stays on the source: it names the older content)
    assert world.wait() is None


def _status(members: list[MemberView], paused: str | None) -> dict[str, object]:
    return rollout_status(
        source="configmap/cfg",
        uid="u",
        resource_version="1",
        generation=1,
        change=ChangeView("c" * 20),
        waves=[members[:1], members[1:]],
        consumers=len(members),
        now=format_time(NOW),
        paused=paused,
    )


def _member(
    name: str, wave: int, state: MemberState, reason: RolloutReason | None = None
) -> MemberView:
    words = "paused by alice" if reason is RolloutReason.PAUSED else ""
    return MemberView(NS, "Deployment", name, wave, state, reason, words)


def test_the_configrollout_says_paused_by_whom_while_the_started_rollout_goes_on() -> None:
    who = f"alice at {format_time(NOW)}"
    members = [
        _member("canary", 1, MemberState.ROLLING),
        _member("app", 2, MemberState.WAITING, RolloutReason.PAUSED),
    ]
    body = _status(members, who)
    obj = {"metadata": {"generation": 1}, "status": body}
    said = verdict(obj)
    assert said.stalled and said.reason == "Paused", said
    assert "alice" in said.message and "kubectl configpin resume configmap/cfg" in said.message
    assert body["change"]["pausedBy"] == "alice"  # type: ignore[index]
    assert body["change"]["pausedAt"] == format_time(NOW)  # type: ignore[index]
    assert body["counts"]["rolling"] == 1  # type: ignore[index]  # (followed, not stopped)
    assert member_wait(obj, "Deployment", "app") == (Status.PAUSED, "paused by alice")
    # not paused: the same members roll
    assert verdict(
        {"metadata": {"generation": 1}, "status": _status(members[:1], None)}
    ).reason == ("Rolling")


def test_a_change_delivered_while_paused_is_delivered() -> None:
    """A pause of content every consumer already runs holds nothing: the change is Ready."""
    done = [_member("canary", 1, MemberState.COMPLETE), _member("app", 2, MemberState.COMPLETE)]
    body = _status(done, "alice at x")
    assert verdict({"metadata": {"generation": 1}, "status": body}).reason == "Delivered"
