"""Admission keeps safe delivery's facts (webhook/core/plan.py and kept.py, an UPDATE of a
workload): the rollout record is not rewound by the workload's own writers, a person's
rollback of a rollout in progress is not stamped forward over their head, and content
rejected on a workload does not come back with a re-apply (kept on its last good copy in
snapshot mode; otherwise the rollout it causes is followed)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from harness.builders import ALL
from tests.unit.conftest import (
    HKEY,
    Store,
    apply,
    configmap,
    plan,
    reading,
    recorded_sources,
    workload,
)
from webhook.core.budget import encode_starts
from webhook.core.constants import ANN_MODE, ANN_REJECTED, ANN_ROLLOUT, ANN_ROLLOUT_STARTS
from webhook.core.kept import dumps_mapping
from webhook.core.model import JSONObject, Plan
from webhook.core.record import Action, RolloutRecord, State, rollout_record, workload_identity

NOW = 1_800_000_000.0
SPEC = reading("cfg", "a")


def _update(new: JSONObject, old: JSONObject, store: Store, mode: str) -> Plan:
    return plan(new, store, mode=mode, operation="UPDATE", old=old, now=NOW)


def _ref(obj: JSONObject) -> str:
    name: str = obj["spec"]["template"]["spec"]["containers"][0]["env"][0]["valueFrom"][
        "configMapKeyRef"
    ]["name"]
    return name


def _rolled(mode: str) -> tuple[Store, JSONObject, JSONObject, RolloutRecord]:
    """A workload at v1, and as configpin's controller re-stamped it to v2, its rollout record
    saying rolling."""
    store = Store([configmap("cfg", {"a": "1"})])
    obj = workload("Deployment", SPEC, annotations={ANN_MODE: mode})
    first = plan(obj, store, mode=mode)
    store.create_snapshots(first)
    v1 = apply(obj, first)
    store.put(configmap("cfg", {"a": "2"}))
    second = plan(v1, store, mode=mode, refresh=ALL)
    store.create_snapshots(second)
    v2 = apply(v1, second)
    record = RolloutRecord(
        State.ROLLING,
        to=recorded_sources(v2),
        before=recorded_sources(v1),
        since=NOW - 60,
    )
    v2["metadata"]["annotations"][ANN_ROLLOUT] = record.encode(HKEY, workload_identity(v2))
    return store, v1, v2, record


def _undo(v1: JSONObject, v2: JSONObject, annotations: dict[str, str]) -> JSONObject:
    """`kubectl rollout undo`: the old template, and the old ReplicaSet's copy of the
    workload's annotations in place of the workload's own."""
    new = copy.deepcopy(v2)
    new["spec"]["template"] = copy.deepcopy(v1["spec"]["template"])
    new["metadata"]["annotations"] = annotations
    return new


def _annotations_after(new: JSONObject, p: Plan) -> dict[str, Any]:
    out: dict[str, Any] = apply(new, p)["metadata"].get("annotations") or {}
    return out


def test_the_rollout_record_is_not_rewound_by_an_undo_or_dropped_by_a_replace() -> None:
    store, v1, v2, record = _rolled("snapshot")
    text = v2["metadata"]["annotations"][ANN_ROLLOUT]
    older = RolloutRecord(State.COMPLETE, to={}, before={}, since=NOW - 3600)
    for copied in (
        {},  # the old ReplicaSet had none: dropped
        {ANN_ROLLOUT: older.encode(HKEY, workload_identity(v2))},  # an older one put back
        {ANN_ROLLOUT: text.replace('"rolling"', '"complete"')},  # forged
    ):
        p = _update(_undo(v1, v2, copied), v2, store, "snapshot")
        assert _annotations_after(_undo(v1, v2, copied), p)[ANN_ROLLOUT] == text
    # configpin's own later record goes through
    later = record.ended(State.COMPLETE)
    new = copy.deepcopy(v2)
    new["metadata"]["annotations"][ANN_ROLLOUT] = later.encode(HKEY, workload_identity(v2))
    p = _update(new, v2, store, "snapshot")
    assert rollout_record(HKEY, apply(new, p)) == later


@pytest.mark.parametrize("mode", ["checksum", "snapshot"])
def test_the_budgets_count_is_not_rewound_by_an_undo_or_reset_by_a_replace(mode: str) -> None:
    """`configpin.io/rollout-starts` (the flap guard's count) kept through an undo that puts
    the old ReplicaSet's older copy back, a whole-object replace that leaves it out (with the
    template as it was, or another), its removal alone and a forged one; configpin's own
    later record goes through."""
    store, v1, v2, _ = _rolled(mode)
    who = workload_identity(v2)
    text = encode_starts(HKEY, who, (NOW - 600, NOW - 60))
    v2["metadata"]["annotations"][ANN_ROLLOUT_STARTS] = text
    edited = text.replace(f"{NOW - 60}]", f"{NOW}]")
    assert edited != text
    for copied in (
        {},  # the old ReplicaSet had none: dropped
        {ANN_ROLLOUT_STARTS: encode_starts(HKEY, who, (NOW - 600,))},  # an older one put back
        {ANN_ROLLOUT_STARTS: encode_starts(HKEY, "Deployment/other/app", (NOW,))},  # copied
        {ANN_ROLLOUT_STARTS: edited},
    ):
        undone = _undo(v1, v2, copied)
        assert (
            _annotations_after(undone, _update(undone, v2, store, mode))[ANN_ROLLOUT_STARTS] == text
        ), copied
    for replaced in (_without(v2, ANN_ROLLOUT_STARTS), _undo(v2, v2, {})):
        kept = _annotations_after(replaced, _update(replaced, v2, store, mode))
        assert kept[ANN_ROLLOUT_STARTS] == text
    # configpin's own later record (the oldest start out of its period) goes through
    later = encode_starts(HKEY, who, (NOW - 60, NOW))
    new = copy.deepcopy(v2)
    new["metadata"]["annotations"][ANN_ROLLOUT_STARTS] = later
    assert _annotations_after(new, _update(new, v2, store, mode))[ANN_ROLLOUT_STARTS] == later


def test_a_persons_rollback_in_checksum_mode_is_not_stamped_forward() -> None:
    store, v1, v2, _ = _rolled("checksum")
    undone = _undo(v1, v2, dict(v2["metadata"]["annotations"]))
    p = _update(undone, v2, store, "checksum")
    assert recorded_sources(apply(undone, p)) == recorded_sources(v1)  # as they left it
    # without a rollout of configpin's in progress, an old record is stamped current
    bare = _without(undone, ANN_ROLLOUT)
    p = _update(bare, _without(v2, ANN_ROLLOUT), store, "checksum")
    assert recorded_sources(apply(bare, p)) == recorded_sources(v2)


def _rejected(v2: JSONObject) -> dict[str, str]:
    return {"configmap/cfg": recorded_sources(v2)["configmap/cfg"]}


def _after_failure(
    v1: JSONObject, v2: JSONObject, record: RolloutRecord, action: Action
) -> JSONObject:
    """`v1` as configpin leaves it when the rollout `record` to `v2` failed and it acted
    (`action`: held it, or undid it): `v2`'s content rejected, the rollout ended failed."""
    out = copy.deepcopy(v1)
    out["metadata"]["annotations"][ANN_REJECTED] = dumps_mapping(_rejected(v2))
    out["metadata"]["annotations"][ANN_ROLLOUT] = record.ended(
        State.FAILED, signal="s", action=action
    ).encode(HKEY, workload_identity(v2))
    return out


def _without(obj: JSONObject, annotation: str) -> JSONObject:
    """A copy of `obj` without `annotation`."""
    out = copy.deepcopy(obj)
    del out["metadata"]["annotations"][annotation]
    return out


def test_a_re_apply_keeps_a_snapshot_workload_on_its_last_good_copy() -> None:
    store, v1, v2, record = _rolled("snapshot")
    undone = _after_failure(v1, v2, record, Action.UNDO)  # back on v1's copy, v2 rejected
    reapplied = copy.deepcopy(undone)  # the manifest in Git names the source itself
    reapplied["spec"]["template"]["spec"]["containers"][0]["env"][0]["valueFrom"][
        "configMapKeyRef"
    ]["name"] = "cfg"
    p = _update(reapplied, undone, store, "snapshot")
    stored = apply(reapplied, p)
    assert _ref(stored) == _ref(v1) and recorded_sources(stored) == recorded_sources(v1)
    assert any("rejected" in w and _ref(v1) in w for w in p.warnings)
    assert [r.snapshot_name for r in p.snapshots] == [_ref(v1)]  # kept alive
    # released (the annotation removed): the re-apply rolls to it
    released = _without(reapplied, ANN_REJECTED)
    p = _update(released, _without(undone, ANN_REJECTED), store, "snapshot")
    assert recorded_sources(apply(released, p)) == recorded_sources(v2)


def test_a_re_apply_that_rolls_a_checksum_workload_to_rejected_content_is_followed() -> None:
    store, v1, v2, record = _rolled("checksum")
    # held, then a person's rollout undo: the template on v1
    held = _after_failure(v1, v2, record, Action.HOLD)
    reapplied = copy.deepcopy(held)
    reapplied["spec"]["template"]["spec"]["containers"][0]["image"] = "app:2"  # what Git says
    p = _update(reapplied, held, store, "checksum")
    stored = apply(reapplied, p)
    assert recorded_sources(stored) == recorded_sources(v2)  # it rolls to it...
    followed = rollout_record(HKEY, stored)  # ... and that rollout is followed
    assert followed is not None and followed.state is State.ROLLING and followed.since == NOW
    assert dict(followed.to) == recorded_sources(v2)
    assert dict(followed.before) == recorded_sources(v1)
    assert [str(c.source) for c in followed.changes] == ["configmap/cfg"]
    assert json.loads(stored["metadata"]["annotations"][ANN_REJECTED]) == _rejected(v2)


def test_a_re_apply_to_rejected_content_at_zero_replicas_writes_its_rollout_left() -> None:
    """Nothing rolls at zero replicas: the rollout the re-apply starts is recorded `left` in
    the same write (as a re-stamp at zero replicas is), not `rolling` for the controller to
    end with a second write through admission."""
    store, v1, v2, record = _rolled("checksum")
    held = _after_failure(v1, v2, record, Action.HOLD)
    reapplied = copy.deepcopy(held)
    reapplied["spec"]["template"]["spec"]["containers"][0]["image"] = "app:2"
    reapplied["spec"]["replicas"] = 0  # what Git says now too
    stored = apply(reapplied, _update(reapplied, held, store, "checksum"))
    assert recorded_sources(stored) == recorded_sources(v2)
    followed = rollout_record(HKEY, stored)
    assert followed is not None and followed.state is State.LEFT and followed.since == NOW
    assert dict(followed.to) == recorded_sources(v2)


def test_rejected_content_is_kept_through_an_undo_and_released_by_removing_it_alone() -> None:
    store, v1, v2, _ = _rolled("snapshot")
    held = copy.deepcopy(v2)
    held["metadata"]["annotations"][ANN_REJECTED] = dumps_mapping(_rejected(v2))
    # an undo puts back an old ReplicaSet's copy of the annotations, without it
    undone = _undo(v1, held, {})
    p = _update(undone, held, store, "snapshot")
    assert json.loads(_annotations_after(undone, p)[ANN_REJECTED]) == _rejected(v2)
    # `kubectl annotate deployment/app configpin.io/rejected-`: the template as it was
    released = _without(held, ANN_REJECTED)
    p = _update(released, held, store, "snapshot")
    assert ANN_REJECTED not in _annotations_after(released, p)
