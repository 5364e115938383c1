"""The ConfigRollout's status as webhook.core.rollouts builds it, and as a reader reads it: its
conditions (one True, with the reason its members give), its counts and members (bounded at
10,000 consumers), its history, and its shape against the chart's CRD (a field the CRD does
not declare is pruned by the API server without a word)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from webhook.core.model import SourceKind
from webhook.core.record import Action
from webhook.core.rollouts import (
    FAILURE_REASONS,
    HISTORY,
    KEY_DIGESTS_SHOWN,
    MEMBERS_SHOWN,
    PODS_SHOWN,
    REASONS,
    WAIT_REASONS,
    ChangeView,
    ConditionType,
    MemberState,
    MemberView,
    RolloutReason,
    about,
    decide,
    key_digests_of,
    rollout_name,
    rollout_status,
    verdict,
)
from webhook.core.waves import WaitReason

CRD = Path(__file__).resolve().parents[3] / "charts/configpin/crds/configrollouts.configpin.io.yaml"
NOW = "2026-12-02T10:00:00Z"
LATER = "2026-12-02T10:05:00Z"
S = MemberState
R = RolloutReason


def _m(
    name: str,
    state: MemberState,
    reason: RolloutReason | None = None,
    wave: int = 1,
    replicas: tuple[int, int, int] | None = None,
    pods: tuple[str, ...] = (),
) -> MemberView:
    why = "why" if reason else ""
    return MemberView("ns", "Deployment", name, wave, state, reason, why, None, replicas, pods)


def _status(
    waves: list[list[MemberView]],
    *,
    consumers: int | None = None,
    previous: Mapping[str, Any] | None = None,
    content: str = "c2",
    now: str = NOW,
) -> dict[str, Any]:
    return rollout_status(
        source="configmap/cfg",
        uid="u1",
        resource_version="7",
        generation=1,
        change=ChangeView(content, ("a",), "alice", NOW, (("a", "3f2a" * 4, "9c1d" * 4),)),
        waves=waves,
        consumers=consumers if consumers is not None else sum(map(len, waves)),
        now=now,
        previous=previous,
    )


def _true(status: Mapping[str, Any]) -> list[tuple[str, str]]:
    return [(c["type"], c["reason"]) for c in status["conditions"] if c["status"] == "True"]


# --- names --------------------------------------------------------------------------------


def test_names_say_the_kind_and_the_source_and_long_ones_are_cut_with_a_hash() -> None:
    assert rollout_name(SourceKind.CONFIGMAP, "cfg") == "configmap-cfg"
    assert rollout_name(SourceKind.SECRET, "cfg") == "secret-cfg"
    long_a, long_b = "a" * 250, "a" * 249 + "b"
    cut_a, cut_b = (
        rollout_name(SourceKind.CONFIGMAP, long_a),
        rollout_name(SourceKind.CONFIGMAP, long_b),
    )
    assert len(cut_a) <= 253 and len(cut_b) <= 253 and cut_a != cut_b
    assert cut_a.startswith("configmap-aaa")


# --- the decision -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("members", "reason"),
    [
        ([_m("a", S.COMPLETE), _m("b", S.LEFT)], R.DELIVERED),
        ([], R.DELIVERED),
        ([_m("a", S.COMPLETE), _m("b", S.PENDING)], R.WAITING),
        ([_m("a", S.COMPLETE), _m("b", S.WAITING)], R.WAITING),  # (a wait naming no reason)
        ([_m("a", S.ROLLING), _m("b", S.WAITING, R.AWAITING_APPROVAL)], R.ROLLING),
        (
            [
                _m("a", S.COMPLETE),
                _m("b", S.WAITING, R.WAITING),
                _m("c", S.WAITING, R.AWAITING_APPROVAL),
            ],
            R.AWAITING_APPROVAL,
        ),
        (
            [_m("a", S.WAITING, R.FLAPPING), _m("b", S.WAITING, R.AWAITING_WINDOW)],
            R.AWAITING_WINDOW,
        ),
        ([_m("a", S.WAITING, R.FLAPPING), _m("b", S.PENDING)], R.FLAPPING),
        ([_m("a", S.FAILED, R.HELD), _m("b", S.ROLLING)], R.HELD),
        ([_m("a", S.FAILED, R.ROLLED_BACK), _m("b", S.FAILED, R.FAILED)], R.FAILED),
        ([_m("a", S.COMPLETE), _m("b", S.WAITING, R.FAILED)], R.FAILED),  # (stopped by a failure)
    ],
)
def test_the_change_takes_the_reason_its_members_give(
    members: list[MemberView], reason: RolloutReason
) -> None:
    assert decide(members) is reason


def test_every_wait_and_every_failure_has_a_reason_and_every_reason_its_words() -> None:
    assert set(WAIT_REASONS) == set(WaitReason)
    assert set(FAILURE_REASONS) == {None, *Action}
    assert set(REASONS) == set(RolloutReason)
    assert all(said.words for said in REASONS.values())
    stalled = {r for r, said in REASONS.items() if said.condition is ConditionType.STALLED}
    assert stalled == {R.FAILED, R.ROLLED_BACK, R.HELD, R.PAUSED, R.ABORTED}


def test_one_condition_is_true_and_the_others_false_with_the_generation() -> None:
    for members, expected in (
        ([[_m("a", S.COMPLETE)]], [("Ready", "Delivered")]),
        ([[_m("a", S.ROLLING)]], [("Reconciling", "Rolling")]),
        ([[_m("a", S.FAILED, R.HELD)]], [("Stalled", "Held")]),
    ):
        status = _status(members)
        assert _true(status) == expected
        assert {c["type"] for c in status["conditions"]} == {"Ready", "Reconciling", "Stalled"}
        assert all(c["observedGeneration"] == 1 for c in status["conditions"])


def test_a_condition_keeps_its_transition_time_while_it_stands() -> None:
    first = _status([[_m("a", S.ROLLING)]])
    again = _status([[_m("a", S.ROLLING)]], previous=first, now=LATER)
    assert again == first  # (nothing to write)
    done = _status([[_m("a", S.COMPLETE)]], previous=first, now=LATER)
    times = {c["type"]: c["lastTransitionTime"] for c in done["conditions"]}
    assert times == {"Ready": LATER, "Reconciling": LATER, "Stalled": NOW}


# --- counts, members, history -------------------------------------------------------------


def test_counts_and_the_summary_kubectl_get_prints() -> None:
    status = _status(
        [
            [_m("a", S.COMPLETE)],
            [
                _m("b", S.WAITING, R.AWAITING_APPROVAL, 2),
                _m("c", S.WAITING, R.AWAITING_APPROVAL, 2),
            ],
        ],
        consumers=5,  # (two more consumers that are no members: they run the content already)
    )
    assert status["counts"] == {"consumers": 5, "members": 3, "ready": 3, "waiting": 2}
    assert status["summary"] == {
        "keys": "a",
        "wave": "2/2",
        "ready": "3/5",
        "state": "AwaitingApproval",
        "changedBy": "alice",
    }
    assert status["waves"] == [
        {"wave": 1, "members": 1, "complete": 1},
        {"wave": 2, "members": 2, "waiting": 2},
    ]
    assert [(m["name"], m["wave"], m["reason"]) for m in status["members"]] == [
        ("b", 2, "AwaitingApproval"),
        ("c", 2, "AwaitingApproval"),
    ]


def test_a_member_shows_its_replicas_and_a_failed_one_the_pods_its_signal_names() -> None:
    rolling = _m("a", S.ROLLING, replicas=(1, 2, 3))
    failed = _m("b", S.FAILED, R.HELD, replicas=(1, 0, 1), pods=("b-7f9-x", "b-7f9-y"))
    pending = _m("c", S.PENDING)  # (a kind whose status says no replicas)
    status = _status([[rolling, failed, pending]])
    a, b, c = status["members"]
    assert a["replicas"] == {"updated": 1, "ready": 2, "desired": 3} and "pods" not in a
    assert b["replicas"] == {"updated": 1, "ready": 0, "desired": 1}
    assert b["pods"] == ["b-7f9-x", "b-7f9-y"]
    assert "replicas" not in c and "pods" not in c
    many = _m("d", S.FAILED, R.HELD, pods=tuple(f"d-{i}" for i in range(PODS_SHOWN + 3)))
    assert len(_status([[many]])["members"][0]["pods"]) == PODS_SHOWN


def test_ten_thousand_consumers_stay_far_under_etcds_limit() -> None:
    """Counts, and the members not done yet by name up to MEMBERS_SHOWN: 10,000 consumers of
    one change, all waiting, make an object of a few tens of kilobytes (etcd takes 1.5 MiB),
    each shown with its replicas (and a failed one's pods) at their largest."""
    big = (2**31 - 1,) * 3
    pods = tuple(f"pod-{i}-" + "y" * 240 for i in range(PODS_SHOWN))
    waves = [
        [
            _m(f"app-{w}-{i}-" + "x" * 200, S.WAITING, R.AWAITING_APPROVAL, w + 1, big)
            for i in range(1000)
        ]
        for w in range(10)
    ]
    waves[0][:50] = [_m(f"bad-{i}-" + "x" * 200, S.FAILED, R.HELD, 1, big, pods) for i in range(50)]
    status = _status(waves)
    assert len(status["members"]) == MEMBERS_SHOWN
    assert status["membersNotShown"] == 10_000 - MEMBERS_SHOWN
    assert len(json.dumps(status)) < 256 * 1024


def test_the_outcomes_of_the_last_changes_are_kept_when_the_source_moves_on() -> None:
    status = _status([[_m("a", S.COMPLETE)]], content="c1")
    for i in range(2, HISTORY + 4):
        status = _status([[_m("a", S.FAILED, R.HELD)]], previous=status, content=f"c{i}")
    assert len(status["history"]) == HISTORY
    assert status["history"][0] == {"content": f"c{HISTORY + 2}", "outcome": "Held", "at": NOW}
    first = _status([[_m("a", S.COMPLETE)]], content="c1")
    second = _status([[_m("a", S.ROLLING)]], previous=first, content="c2")
    assert second["history"] == [{"content": "c1", "outcome": "Delivered", "at": NOW}]
    assert (
        _status([[_m("a", S.ROLLING)]], previous=second, content="c2")["history"]
        == second["history"]
    )


# --- what a reader makes of it -------------------------------------------------------------


def _object(status: dict[str, Any], generation: int = 1) -> dict[str, Any]:
    return {"metadata": {"generation": generation}, "status": status}


def test_a_reader_takes_the_true_condition_about_its_generation_and_source_version() -> None:
    ready = _object(_status([[_m("a", S.COMPLETE)]]))
    assert verdict(ready).ready and verdict(ready).reason == "Delivered"
    held = _object(_status([[_m("a", S.FAILED, R.HELD)]]))
    assert verdict(held).stalled and verdict(held).reason == "Held"
    behind = _object(_status([[_m("a", S.COMPLETE)]]), generation=2)  # (spec written since)
    assert verdict(behind).condition is None
    assert verdict({"metadata": {}, "status": "forged"}).condition is None
    assert about(ready, "u1", "7")
    assert not about(ready, "u1", "8") and not about(ready, "u2", "7")


# --- the CRD -------------------------------------------------------------------------------


def _crd() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(CRD.read_text())
    return doc


def _undeclared(value: Any, schema: Mapping[str, Any], at: str) -> list[str]:
    """The paths of `value` the structural schema would prune."""
    if isinstance(value, dict):
        props, extra = schema.get("properties"), schema.get("additionalProperties")
        out = []
        for k, v in value.items():
            if props is not None and k in props:
                out += _undeclared(v, props[k], f"{at}.{k}")
            elif isinstance(extra, dict):
                out += _undeclared(v, extra, f"{at}.{k}")
            else:
                out.append(f"{at}.{k}")
        return out
    if isinstance(value, list):
        return [
            p for i, v in enumerate(value) for p in _undeclared(v, schema["items"], f"{at}[{i}]")
        ]
    return []


def test_every_field_of_a_status_is_declared_by_the_crd_and_each_column_reads_one() -> None:
    version = _crd()["spec"]["versions"][0]
    schema = version["schema"]["openAPIV3Schema"]["properties"]["status"]
    waves = [[_m(f"a{i}", S.WAITING, R.AWAITING_WINDOW) for i in range(MEMBERS_SHOWN + 1)]]
    waves[0][0] = _m("a0", S.FAILED, R.HELD, replicas=(1, 0, 1), pods=("a0-x",))
    first = _status([[_m("a", S.COMPLETE)]], content="c1")
    status = _status(waves, previous=first)
    status["members"][0]["until"] = LATER
    assert "membersNotShown" in status and status["history"]
    assert _undeclared(status, schema, "status") == []
    for column in version["additionalPrinterColumns"]:
        parts = column["jsonPath"].strip(".").split(".")
        if parts[0] == "metadata":
            continue
        found: Any = {"status": status}
        for part in parts:
            found = found[part]
        assert isinstance(found, str), column
    assert version["subresources"] == {"status": {}}
    assert _crd()["spec"]["names"]["shortNames"] == ["cfgro"]


def test_an_abort_is_stalled_aborted_with_who_before_any_members_failure() -> None:
    """`configpin abort`: the change says Aborted (not the RolledBack its undone members say),
    with who and when, and the command that rolls it again."""
    waves = [[_m("a", S.FAILED, R.ROLLED_BACK)], [_m("b", S.WAITING, R.ABORTED)]]
    status = rollout_status(
        source="configmap/cfg",
        uid="u1",
        resource_version="7",
        generation=1,
        change=ChangeView("c2", ("a",), "alice", NOW),
        waves=waves,
        consumers=2,
        now=NOW,
        aborted=f"bob at {NOW}",
    )
    assert _true(status) == [("Stalled", "Aborted")]
    assert status["change"]["abortedBy"] == "bob" and status["change"]["abortedAt"] == NOW
    said = next(c for c in status["conditions"] if c["status"] == "True")["message"]
    assert "kubectl configpin retry configmap/cfg" in said and "bob" in said
    assert verdict({"status": status}) is not None


def test_the_changed_keys_say_their_old_and_new_digests_and_none_unknown() -> None:
    """Each key the change changed, with its keyed digests (hex: never a value), the old
    missing where it was added and the new where it was removed; only the keys it names, at
    most KEY_DIGESTS_SHOWN; none known (a restart): the names alone, as before."""
    digests = (("b", None, "22" * 8), ("a", "11" * 8, "33" * 8), ("c", "44" * 8, None))
    digests += (("other", "55" * 8, "66" * 8),)  # (not a key the change names)

    def change(view: ChangeView) -> dict[str, Any]:
        body = rollout_status(
            source="configmap/cfg",
            uid="u1",
            resource_version="7",
            generation=1,
            change=view,
            waves=[[_m("w", S.COMPLETE)]],
            consumers=1,
            now=NOW,
        )
        return dict(body["change"])

    said = change(ChangeView("c2", ("a", "b", "c"), digests=digests))
    assert said["keys"] == ["a", "b", "c"]
    assert said["keyDigests"] == [
        {"key": "a", "old": "11" * 8, "new": "33" * 8},
        {"key": "b", "new": "22" * 8},
        {"key": "c", "old": "44" * 8},
    ]
    assert key_digests_of(said) == (
        ("a", "11" * 8, "33" * 8),
        ("b", None, "22" * 8),
        ("c", "44" * 8, None),
    )
    assert "keyDigests" not in change(ChangeView("c2", ("a",)))
    assert key_digests_of(change(ChangeView("c2", ("a",)))) is None
    many = tuple((f"k{i:03}", "11" * 8, "22" * 8) for i in range(KEY_DIGESTS_SHOWN + 5))
    assert len(change(ChangeView("c2", None, digests=many))["keyDigests"]) == KEY_DIGESTS_SHOWN
    assert key_digests_of({"keyDigests": "forged"}) is None
    assert key_digests_of({"keyDigests": [{"key": "a", "old": 1}, "x"]}) == (("a", None, None),)
