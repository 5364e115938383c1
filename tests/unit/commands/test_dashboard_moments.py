"""The dashboard's moments (webhook/commands/dashboard/moments.py): a change its ConfigRollout
says stopped is said as such, in the core's words, with its signal and what a person can do;
one in progress or delivered is no moment."""

from __future__ import annotations

from typing import Any

from webhook.commands.dashboard.moments import ended, moment, slug, title


def _cr(reason: str, condition: str = "Stalled", **change: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "configmap-cfg", "namespace": "ns", "generation": 1},
        "status": {
            "observedGeneration": 1,
            "change": {"content": "abc", **change},
            "conditions": [{"type": condition, "status": "True", "reason": reason,
                            "message": f"{reason.lower()}: words"}],
        },
    }  # fmt: skip


def test_a_paused_change_says_who_and_the_resume_command() -> None:
    obj = _cr("Paused", pausedBy="alice", pausedAt="2026-12-03T14:00:00Z")
    said = moment([obj], [], "configmap/cfg", ["ns"])
    assert said is not None
    assert (said["state"], said["title"], said["words"]) == (
        "paused",
        "Paused",
        "paused by a person",
    )
    assert said["paused_by"] == "alice" and said["paused_at"] == "2026-12-03T14:00:00Z"
    assert said["do"] == ["kubectl configpin resume configmap/cfg -n ns"]


def test_a_rolled_back_or_held_change_names_the_workload_that_failed_and_what_to_do() -> None:
    rows = [{"kind": "Deployment", "namespace": "ns", "name": "canary", "state": "failed",
             "detail": "rolled back by a person"}]  # fmt: skip
    back = moment([_cr("RolledBack")], rows, "configmap/cfg", ["ns"])
    assert back is not None and (back["state"], back["title"]) == ("rolled-back", "Rolled back")
    assert back["signal"] == ["Deployment canary: rolled back by a person"]
    assert "kubectl describe deployment/canary -n ns" in back["do"]
    assert not any("rollout undo" in d for d in back["do"])
    held = moment([_cr("Held")], rows, "configmap/cfg", ["ns"])
    assert held is not None and "kubectl rollout undo deployment/canary -n ns" in held["do"]
    assert any(d.startswith("kubectl configpin retry configmap/cfg -n ns") for d in held["do"])


def test_an_aborted_change_says_who_and_the_retry_command() -> None:
    obj = _cr("Aborted", abortedBy="bob", abortedAt="2026-12-03T15:00:00Z")
    said = moment([obj], [], "configmap/cfg", ["ns"])
    assert said is not None
    assert (said["state"], said["title"], said["words"]) == (
        "aborted",
        "Aborted",
        "aborted by a person",
    )
    assert said["aborted_by"] == "bob" and said["aborted_at"] == "2026-12-03T15:00:00Z"
    assert said["do"][0] == "kubectl configpin retry configmap/cfg -n ns"


def test_a_change_in_progress_or_delivered_is_no_moment() -> None:
    assert moment([_cr("Rolling", "Reconciling")], [], "configmap/cfg", ["ns"]) is None
    assert moment([_cr("Delivered", "Ready")], [], "configmap/cfg", ["ns"]) is None
    assert moment([], [], "configmap/cfg", ["ns"]) is None


def test_a_reason_as_a_badge() -> None:
    assert (slug("RolledBack"), title("RolledBack")) == ("rolled-back", "Rolled back")
    assert ended("") is None and ended("Failed") == {"state": "failed", "title": "Failed"}
