"""What a new leader takes from a ConfigRollout it did not write: the source version its status
is about, only where that status describes the content the source holds now and names as its
source the object that owns it (a process that started before its index knew the source was
consumed asks the API server otherwise); and what it says of a member the gate held for an
earlier change of the source."""

from __future__ import annotations

from typing import Any

from tests.unit.controller.test_limits import _wait_of, _World
from webhook.controller.outcome import Rolled, Settled
from webhook.controller.publish import _CARRIED, _carried_view, _described
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
