"""What a new leader takes from a ConfigRollout it did not write: the source version its status
is about, only where that status describes the content the source holds now and names as its
source the object that owns it (a process that started before its index knew the source was
consumed asks the API server otherwise); and what it says of a member the gate held for an
earlier change of the source."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

from tests.unit.controller.test_limits import CFG, NS, _wait_of, _World
from webhook.controller.outcome import Rolled, Settled
from webhook.controller.publish import _CARRIED, _carried_view, _described
from webhook.controller.watches import KindHandler
from webhook.core.record import Action, State
from webhook.core.rollouts import MemberState, RolloutReason
from webhook.core.waves import WaitReason


def _standing(content: str = "c1", uid: str = "u1", owner: str = "u1") -> dict[str, Any]:
    return {
        "metadata": {"ownerReferences": [{"kind": "ConfigMap", "name": "cfg", "uid": owner}]},
        "status": {
            "source": {"ref": "configmap/cfg", "uid": uid, "resourceVersion": "7"},
            "change": {"content": content, "keys": ["a"], "changedBy": "alice", "changedAt": "t"},
        },
    }


def test_a_status_about_the_content_held_now_and_its_owner_gives_the_version() -> None:
    assert _described(_standing(), "c1") == ("u1", "7", _CARRIED)
    view = _carried_view(_standing(), "c1")
    assert (view.keys, view.by, view.at) == (("a",), "alice", "t")


def test_anything_else_gives_nothing() -> None:
    assert _described(None, "c1") is None
    assert _described(_standing(), "c2") is None  # (another content: the source moved on)
    assert _described(_standing(owner="u9"), "c1") is None  # (not about its owner)
    assert _described({"metadata": {}, "status": "forged"}, "c1") is None
    broken = _standing()
    broken["status"]["source"]["resourceVersion"] = 7
    assert _described(broken, "c1") is None


def test_a_member_held_for_the_change_before_is_not_said_to_wait_for_the_next_one() -> None:
    """Waves 1,approve,100%: change A's canary completed, the other awaits A's approval. The
    source changes again (B) before anyone looked at that one for B: B's ConfigRollout says it
    is not decided yet (pending), not that it waits for an approval (A's words, A's wave);
    once the gate answers for B (its canary has not rolled B: its wave waits), it says that."""
    world = _World(["w0", "w1"], waves="1,approve,100%")
    publisher = world.ctl.publisher
    change_a = world.change("2")
    [[canary], [later]] = world.ctl.gate.cut.plan(change_a)
    assert isinstance(world.reconcile(canary.name), Rolled)
    done = world.progress(canary.name, ready=True)
    assert isinstance(done, Settled) and done.state == "complete"
    assert _wait_of(world.reconcile(later.name)).reason is WaitReason.APPROVAL
    said = publisher._member(later, change_a, 2)
    assert (said.state, said.reason) == (MemberState.WAITING, RolloutReason.AWAITING_APPROVAL)

    change_b = world.change("3")
    assert change_b != change_a
    said = publisher._member(later, change_b, 2)
    assert (said.state, said.reason, said.message) == (MemberState.PENDING, None, "")
    assert _wait_of(world.reconcile(later.name)).reason is WaitReason.WAVE
    said = publisher._member(later, change_b, 2)
    assert (said.state, said.reason) == (MemberState.WAITING, RolloutReason.WAITING)
    assert str(change_b) in said.message


def test_a_member_shows_its_replicas_as_its_watch_moves_them() -> None:
    """Waves 1,100%: the canary rolls; each status its watch sees (updated and ready pods
    moving, nothing else of it) publishes its source's ConfigRollout again, whose member says
    the pods as the Deployment's status counts them; the waiting one says its own."""
    world = _World(["w0", "w1"], waves="1,100%")
    publisher = world.ctl.publisher
    change = world.change("2")
    [[canary], [later]] = world.ctl.gate.cut.plan(change)
    assert isinstance(world.reconcile(canary.name), Rolled)
    assert publisher._member(canary, change, 1).replicas == (2, 2, 2)
    marked: list[Any] = []
    publisher.mark = lambda ns, sid: marked.append((ns, sid))  # type: ignore[method-assign]
    watch = KindHandler(world.ctl, "Deployment")
    obj = copy.deepcopy(world.server.objects[world.path(canary.name)])
    for updated, ready in ((0, 2), (1, 1), (1, 2), (2, 2)):
        obj["status"] = {**obj["status"], "updatedReplicas": updated, "readyReplicas": ready}
        watch.event("MODIFIED", copy.deepcopy(obj))
        said = publisher._member(canary, change, 1)
        assert (said.state, said.replicas) == (MemberState.ROLLING, (updated, ready, 2))
        assert said.body()["replicas"] == {"updated": updated, "ready": ready, "desired": 2}
        assert marked and set(marked) == {(NS, CFG)}
        marked.clear()
    watch.event("MODIFIED", copy.deepcopy(obj))  # (nothing moved: nothing published)
    assert marked == []
    assert _wait_of(world.reconcile(later.name)).reason is WaitReason.WAVE
    said = publisher._member(later, change, 2)
    assert (said.state, said.replicas) == (MemberState.WAITING, (2, 2, 2))


def test_a_failed_member_says_its_signal_and_the_pods_it_names() -> None:
    world = _World(["w0"], waves="100%")
    publisher = world.ctl.publisher
    change = world.change("2")
    [[ref]] = world.ctl.gate.cut.plan(change)
    assert isinstance(world.reconcile(ref.name), Rolled)
    entry = world.ctl.index.get(ref)
    assert entry is not None and entry.delivery is not None and entry.rollout is not None
    for signal, pods in (
        ("updated pod w0-6d4f-x2: container app restarted 3 times", ("w0-6d4f-x2",)),
        ("its progress deadline (600 s) passed: ReplicaSet has timed out", ()),
    ):
        failed = replace(entry.rollout, state=State.FAILED, action=Action.HOLD, signal=signal)
        entry.delivery = replace(entry.delivery, rollout=failed)
        said = publisher._member(ref, change, 1)
        assert (said.state, said.reason) == (MemberState.FAILED, RolloutReason.HELD)
        assert (said.message, said.pods, said.replicas) == (signal, pods, (2, 2, 2))


def test_the_change_says_its_keys_old_and_new_digests_and_after_a_restart_what_it_said() -> None:
    """A change the controller's cache saw: its ConfigRollout says each changed key with its
    old and new digests (hex, different); a controller that did not see it (a restart) says
    what the standing status said of the same content, and the names alone otherwise."""
    world = _World(["w0"], waves="100%")
    publisher = world.ctl.publisher
    change = world.change("2")
    consumers = world.ctl.index.consumers(NS, CFG)
    status = publisher._status(NS, CFG, change, consumers, "u1", "7", None)
    [row] = status["change"]["keyDigests"]
    assert set(row) == {"key", "old", "new"} and row["old"] != row["new"], row
    assert all(len(row[k]) == 16 and int(row[k], 16) >= 0 for k in ("old", "new"))
    assert status["change"]["keys"] == [row["key"]]
    world.ctl.cache._changed_keys.clear()  # (a restart: the change was not seen)
    standing = {"metadata": {"generation": 1}, "status": status}
    publisher.observed.wrote({**standing, "metadata": {"name": "configmap-cfg", "namespace": NS}})
    again = publisher._status(NS, CFG, change, consumers, "u1", "7", None)
    assert again["change"]["keyDigests"] == [row]
    carried = _carried_view(standing, change.content).digests
    assert carried == ((row["key"], row["old"], row["new"]),)
    assert _carried_view(standing, "another").digests is None
