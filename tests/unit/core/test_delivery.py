"""Safe delivery's decisions (webhook/core/record.py, progress.py, waves.py): the rollout
record, how a rollout is going by each kind's status and its pods, undo, and waves."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import pytest

from tests.unit.conftest import (
    HKEY,
    Store,
    apply,
    configmap,
    container,
    plan,
    pod_spec,
    reading,
)
from tests.unit.conftest import workload as make_workload
from webhook.core import digest
from webhook.core.constants import (
    ANN_CHECKSUM,
    ANN_ON_FAILURE,
    ANN_PROGRESS_DEADLINE,
    ANN_ROLLOUT,
    ANN_ROLLOUT_WAVES,
    ANN_SOURCES,
    ANN_WAVE,
)
from webhook.core.kinds import WorkloadKind, builtin
from webhook.core.model import JSONObject, SourceId, SourceKind
from webhook.core.progress import (
    Standing,
    assess,
    on_failure_policy,
    progress_deadline,
    replicas,
    signal_pods,
    standing,
    undo_ops,
)
from webhook.core.record import (
    Action,
    Change,
    RolloutRecord,
    State,
    proven,
    rolled_back,
    rollout_record,
    started,
    template_fingerprint,
    workload_identity,
)
from webhook.core.times import format_time
from webhook.core.waves import (
    Member,
    WaveStep,
    approval_from,
    asks_approval,
    cut_waves,
    parse_waves,
    wave_of,
    wave_order,
    wave_plan,
    wave_sizes,
)

COMPLETE, FAILED, ROLLING, LEFT = State.COMPLETE, State.FAILED, State.ROLLING, State.LEFT
DEPLOYMENT, STATEFULSET, DAEMONSET, REPLICASET = (
    builtin(k) for k in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet")
)
NOW = 1_800_000_000.0
CFG = SourceId(SourceKind.CONFIGMAP, "cfg")


def _record(**kw: Any) -> RolloutRecord:
    fields: dict[str, Any] = {
        "state": ROLLING,
        "to": {"configmap/cfg": "b" * 64},
        "before": {"configmap/cfg": "a" * 64},
        "since": NOW - 30,
        "changes": (Change.of("team-a", CFG, "x" * 64, shared=False),),
    }
    fields.update(kw)
    return RolloutRecord(**fields)


def _annotated(annotations: dict[str, str]) -> JSONObject:
    return {"kind": "Deployment", "metadata": {"name": "w", "annotations": annotations}}


# --- the workload's settings ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "mode", "policy", "warns"),
    [
        (None, "snapshot", "undo", False),
        (None, "checksum", "hold", False),
        ("none", "checksum", "none", False),
        ("hold", "snapshot", "hold", False),
        ("undo", "checksum", "hold", True),  # content changed in place cannot come back
        ("sometimes", "snapshot", "undo", True),
    ],
)
def test_on_failure_defaults_by_mode_and_refuses_what_cannot_be(
    value: str | None, mode: str, policy: str, warns: bool
) -> None:
    obj = _annotated({} if value is None else {ANN_ON_FAILURE: value})
    got, warning = on_failure_policy(obj, mode)
    assert got == policy and (warning is not None) is warns


@pytest.mark.parametrize(
    ("value", "seconds"),
    [(None, 600.0), ("30", 30.0), ("-5", 600.0), ("x", 600.0), ("nan", 600.0), ("1e99", 604800.0)],
)
def test_progress_deadline_is_bounded(value: str | None, seconds: float) -> None:
    obj = _annotated({} if value is None else {ANN_PROGRESS_DEADLINE: value})
    assert progress_deadline(obj) == seconds


def test_wave_annotation_is_an_integer_or_zero() -> None:
    assert wave_of(_annotated({ANN_WAVE: "-3"})) == -3
    assert wave_of(_annotated({ANN_WAVE: "first"})) == 0
    assert wave_of(_annotated({})) == 0


# --- the record ----------------------------------------------------------------------------


def test_a_record_is_believed_only_on_the_workload_it_was_written_for() -> None:
    obj = make_workload("Deployment", pod_spec(container()))
    obj["metadata"]["uid"] = "u-1"
    record = _record(refs={"configmap/cfg-1234567890": "cfg/cfg-0987654321"})
    text = record.encode(HKEY, workload_identity(obj))
    obj["metadata"]["annotations"] = {ANN_ROLLOUT: text}
    assert rollout_record(HKEY, obj) == record
    other = copy.deepcopy(obj)
    other["metadata"]["name"] = "another"  # copied onto another workload
    assert rollout_record(HKEY, other) is None
    assert rollout_record(b"another key".ljust(32, b"."), obj) is None
    forged = text.replace('"rolling"', '"failed"')  # a tenant's edit
    obj["metadata"]["annotations"] = {ANN_ROLLOUT: forged}
    assert rollout_record(HKEY, obj) is None
    obj["metadata"]["annotations"] = {ANN_ROLLOUT: "{not json"}
    assert rollout_record(HKEY, obj) is None


def test_an_ended_record_keeps_what_it_rolled() -> None:
    record = _record()
    failed = record.ended(FAILED, signal="s", action=Action.UNDO)
    assert (failed.state, failed.to, failed.before, failed.signal) == (
        FAILED,
        record.to,
        record.before,
        "s",
    )
    assert record.changed_sources() == ["configmap/cfg"]


# --- how a rollout is going -----------------------------------------------------------------


def _deployment(**status: Any) -> JSONObject:
    return {
        "kind": "Deployment",
        "metadata": {"name": "web", "generation": 4},
        "spec": {"replicas": 2, "progressDeadlineSeconds": 60},
        "status": {"observedGeneration": 4, **status},
    }


def test_a_deployment_is_complete_when_every_updated_pod_is_ready_and_no_old_one_left() -> None:
    record = _record()
    done = _deployment(updatedReplicas=2, replicas=2, readyReplicas=2)
    assert assess(DEPLOYMENT, done, [], record, NOW).state == COMPLETE
    surge = _deployment(updatedReplicas=2, replicas=3, readyReplicas=3)  # an old pod still up
    assert assess(DEPLOYMENT, surge, [], record, NOW).state == ROLLING
    behind = _deployment(updatedReplicas=2, replicas=2, readyReplicas=2)
    behind["status"]["observedGeneration"] = 3  # the controller has not seen the change yet
    assert assess(DEPLOYMENT, behind, [], record, NOW).state == ROLLING


def test_a_deployment_fails_by_its_own_progress_deadline() -> None:
    stuck = _deployment(
        updatedReplicas=1,
        replicas=3,
        readyReplicas=2,
        conditions=[
            {
                "type": "Progressing",
                "status": "False",
                "reason": "ProgressDeadlineExceeded",
                "message": 'ReplicaSet "web-5d4" has timed out progressing.',
            }
        ],
    )
    progress = assess(DEPLOYMENT, stuck, [], _record(since=NOW - 3600), NOW)
    assert progress.state == FAILED and "progress deadline (60 s)" in progress.signal
    assert 'ReplicaSet "web-5d4"' in progress.signal
    # its own deadline only: however long it has been, no deadline of configpin's
    going = _deployment(updatedReplicas=1, replicas=3, readyReplicas=2)
    assert assess(DEPLOYMENT, going, [], _record(since=NOW - 3600), NOW).state == ROLLING


def _pod(
    sources: dict[str, str],
    restarts: int = 0,
    init: bool = False,
    *,
    created: float = NOW - 20,
    ready_since: float | None = None,
) -> JSONObject:
    statuses = [{"name": "app", "restartCount": restarts}]
    key = "initContainerStatuses" if init else "containerStatuses"
    status: JSONObject = {key: statuses}
    if ready_since is not None:
        ready = {"type": "Ready", "status": "True", "lastTransitionTime": format_time(ready_since)}
        status["conditions"] = [ready]
    return {
        "metadata": {
            "name": "web-x",
            "creationTimestamp": format_time(created),
            "annotations": {ANN_SOURCES: digest.canonical_mapping(sources)},
        },
        "status": status,
    }


@pytest.mark.parametrize("init", [False, True])
def test_an_updated_pod_that_keeps_restarting_fails_the_rollout(init: bool) -> None:
    record = _record()
    going = _deployment(updatedReplicas=1, replicas=3, readyReplicas=2)
    old = _pod(dict(record.before), 9)  # an old pod's restarts are not the new config's doing
    assert assess(DEPLOYMENT, going, [old], record, NOW).state == ROLLING
    new = _pod(dict(record.to), 2, init)
    assert assess(DEPLOYMENT, going, [old, new], record, NOW).state == ROLLING
    new = _pod(dict(record.to), 3, init)
    progress = assess(DEPLOYMENT, going, [old, new], record, NOW)
    assert progress.state == FAILED and "restarted 3 times" in progress.signal

    assert signal_pods(progress.signal) == ("web-x",)  # (what the ConfigRollout lists)


def test_a_failure_signal_names_the_pods_it_names_and_no_others() -> None:
    assert signal_pods("its progress deadline (60 s) passed: timed out") == ()
    assert signal_pods("rolled back by a person") == ()


def test_replicas_are_the_updated_ready_and_desired_pods_by_each_kinds_own_status() -> None:
    going = _deployment(updatedReplicas=1, replicas=3, readyReplicas=2)
    assert replicas(DEPLOYMENT, going) == (1, 2, 2)
    assert replicas(DEPLOYMENT, _deployment()) == (0, 0, 2)  # (no pod counted yet)
    sts = {"spec": {"replicas": 3}, "status": {"updatedReplicas": 1, "readyReplicas": 3}}
    assert replicas(STATEFULSET, sts) == (1, 3, 3)
    ds = {"status": {"updatedNumberScheduled": 4, "numberReady": 5, "desiredNumberScheduled": 6}}
    assert replicas(DAEMONSET, ds) == (4, 5, 6)
    # a custom kind's status is read as a Deployment's, where it counts so (a CloneSet does)
    custom = WorkloadKind.parse("apps.kruise.io/v1alpha1/clonesets/CloneSet=spec.template")
    clone = {"spec": {"replicas": 5}, "status": {"updatedReplicas": 2, "readyReplicas": 4}}
    assert replicas(custom, clone) == (2, 4, 5)
    assert replicas(custom, {"status": {"active": 1}}) is None
    # one tuple per distinct triple, shared by every workload that has it
    assert replicas(DEPLOYMENT, copy.deepcopy(going)) is replicas(DEPLOYMENT, going)


def test_restarts_count_from_the_rollouts_start() -> None:
    """An updated pod older than the rollout (a revision rolled back to, scaled up again)
    restarted before it: those restarts are not this rollout's."""
    record = _record(since=NOW - 30)
    going = _deployment(updatedReplicas=1, replicas=3, readyReplicas=2)
    older = _pod(dict(record.to), 9, created=NOW - 3600)
    assert assess(DEPLOYMENT, going, [older], record, NOW).state == ROLLING
    started_by_it = _pod(dict(record.to), 3, created=NOW - 10)
    assert assess(DEPLOYMENT, going, [older, started_by_it], record, NOW).state == FAILED


def test_the_deadline_of_a_kind_without_one_is_time_without_progress() -> None:
    """A StatefulSet replacing one pod at a time may take longer than its deadline in all;
    it fails only after that long without an updated pod becoming Ready."""
    record = _record(since=NOW - 300)  # longer ago than its 120 s
    going = _statefulset(updatedReplicas=2, readyReplicas=2)
    recent = _pod(dict(record.to), created=NOW - 70, ready_since=NOW - 60)
    assert assess(STATEFULSET, going, [recent], record, NOW).state == ROLLING
    stale_ready = _pod(dict(record.to), created=NOW - 250, ready_since=NOW - 200)
    late = assess(STATEFULSET, going, [stale_ready], record, NOW)
    assert late.state == FAILED and "none of its updated pods became Ready for 120 s" in late.signal
    old_ready = _pod(dict(record.before), ready_since=NOW - 5)  # an old pod proves nothing
    assert assess(STATEFULSET, going, [old_ready], record, NOW).state == FAILED


def test_a_workload_scaled_to_zero_while_rolling_left() -> None:
    zero = _deployment(updatedReplicas=0, replicas=0, readyReplicas=0)
    zero["spec"]["replicas"] = 0
    assert assess(DEPLOYMENT, zero, [], _record(), NOW).state == LEFT


@pytest.mark.parametrize(
    ("conditions", "replicas", "expected"),
    [
        ([{"type": "Available", "status": "True"}], 2, Standing.HEALTHY),
        ([], 2, Standing.HEALTHY),  # not told yet
        ([{"type": "Available", "status": "False"}], 2, Standing.UNHEALTHY),
        (
            [{"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"}],
            2,
            Standing.UNHEALTHY,
        ),
        ([{"type": "Available", "status": "True"}], 0, Standing.EMPTY),
    ],
)
def test_how_a_deployment_stands_before_a_change(
    conditions: list[JSONObject], replicas: int, expected: Standing
) -> None:
    dep = _deployment(conditions=conditions)
    dep["spec"]["replicas"] = replicas
    assert standing(DEPLOYMENT, dep) is expected


def test_how_a_statefulset_and_a_daemonset_stand() -> None:
    assert standing(STATEFULSET, _statefulset(readyReplicas=3)) is Standing.HEALTHY
    assert standing(STATEFULSET, _statefulset(readyReplicas=1)) is Standing.UNHEALTHY
    ds: JSONObject = {
        "kind": "DaemonSet",
        "metadata": {"generation": 1},
        "status": {"observedGeneration": 1, "desiredNumberScheduled": 2, "numberUnavailable": 1},
    }
    assert standing(DAEMONSET, ds) is Standing.UNHEALTHY
    ds["status"]["desiredNumberScheduled"] = 0
    assert standing(DAEMONSET, ds) is Standing.EMPTY


def _with_sources(sources: dict[str, str]) -> JSONObject:
    return {
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "team-a"},
        "spec": {
            "template": {
                "metadata": {"annotations": {ANN_SOURCES: digest.canonical_mapping(sources)}},
                "spec": reading("cfg", "a"),
            }
        },
    }


def test_a_template_taken_back_off_the_content_rolled_to_is_a_rollback() -> None:
    record = _record()
    assert not rolled_back(DEPLOYMENT, _with_sources(dict(record.to)), record)
    assert rolled_back(DEPLOYMENT, _with_sources(dict(record.before)), record)
    assert rolled_back(DEPLOYMENT, {"kind": "Deployment", "spec": {}}, record)  # no record at all


def test_a_rollout_that_never_completed_passes_its_starting_point_on() -> None:
    """v1 completed; v2 was rolling (or held, or left) when v3 came: v3's record rolls from
    v1 and its copies, so that an undo never lands on v2."""
    v1, v2, v3 = ("1" * 64, "2" * 64, "3" * 64)
    rolling_v2 = RolloutRecord(
        ROLLING,
        to={"configmap/cfg": v2},
        before={"configmap/cfg": v1},
        since=NOW - 10,
        refs={"configmap/cfg-2222222222": "cfg/cfg-1111111111"},
    )
    at_v2 = _with_sources({"configmap/cfg": v2})
    at_v2["spec"]["template"]["spec"] = reading("cfg-2222222222", "a")
    at_v3 = copy.deepcopy(at_v2)
    at_v3["spec"]["template"]["spec"] = reading("cfg-3333333333", "a")
    common: dict[str, Any] = {
        "to": {"configmap/cfg": v3},
        "before": {"configmap/cfg": v2},
        "changes": (),
        "now": NOW,
        "healthy": True,
        "made": {"cfg-3333333333": "cfg"},
    }
    for previous in (
        rolling_v2,
        rolling_v2.ended(FAILED, signal="s", action=Action.HOLD),
        rolling_v2.ended(LEFT),
    ):
        record = started(DEPLOYMENT, at_v2, at_v3, previous=previous, **common)
        assert record.before == {"configmap/cfg": v1}
        assert record.refs == {"configmap/cfg-3333333333": "cfg/cfg-1111111111"}
    for previous in (  # v2 completed, or was undone (the template went back to v1 then)
        rolling_v2.ended(COMPLETE),
        rolling_v2.ended(FAILED, signal="s", action=Action.UNDO),
    ):
        record = started(DEPLOYMENT, at_v2, at_v3, previous=previous, **common)
        assert record.before == {"configmap/cfg": v2}
        assert record.refs == {"configmap/cfg-3333333333": "cfg/cfg-2222222222"}


def test_a_completed_rollout_proves_content_rejected_before() -> None:
    record = _record()
    obj = _annotated(
        {
            "configpin.io/rejected": digest.canonical_mapping(
                {"configmap/cfg": record.to["configmap/cfg"], "secret/s": "f" * 64}
            )
        }
    )
    assert proven(obj, record) == {"secret/s": "f" * 64}
    assert proven(_annotated({}), record) is None


def test_a_change_reads_back_as_itself() -> None:
    own = Change.of("team-a", CFG, "c" * 64, shared=False)
    shared = Change.of("team-a", CFG, "c" * 64, shared=True)
    assert str(own) == f"team-a/configmap/cfg@{'c' * 20}" and not own.shared
    assert str(shared) == f"configmap/cfg@{'c' * 20}" and shared.shared
    for change in (own, shared):
        assert Change.parse(str(change)) == change
    assert Change.parse("nonsense") is None and Change.parse("x/y/z/w@c") is None


def _statefulset(
    partition: int | None = None, strategy: str = "RollingUpdate", **status: Any
) -> JSONObject:
    update: dict[str, Any] = {"type": strategy}
    if partition is not None:
        update["rollingUpdate"] = {"partition": partition}
    return {
        "kind": "StatefulSet",
        "metadata": {"name": "db", "generation": 2, "annotations": {ANN_PROGRESS_DEADLINE: "120"}},
        "spec": {"replicas": 3, "updateStrategy": update},
        "status": {"observedGeneration": 2, **status},
    }


def test_a_statefulset_fails_by_configpins_deadline_and_completes_at_its_partition() -> None:
    record = _record(since=NOW - 60)
    going = _statefulset(updatedReplicas=1, readyReplicas=2)
    assert assess(STATEFULSET, going, [], record, NOW).state == ROLLING
    late = assess(STATEFULSET, going, [], _record(since=NOW - 121), NOW)
    assert late.state == FAILED and "for 120 s" in late.signal
    held = _statefulset(partition=2, updatedReplicas=1, readyReplicas=3)  # only ordinal 2 rolls
    assert assess(STATEFULSET, held, [], record, NOW).state == COMPLETE
    on_delete = _statefulset(strategy="OnDelete", updatedReplicas=0, readyReplicas=3)
    assert assess(STATEFULSET, on_delete, [], _record(since=NOW - 999), NOW).state == COMPLETE


def test_a_daemonset_completes_when_every_scheduled_pod_is_updated_and_ready() -> None:
    ds: JSONObject = {
        "kind": "DaemonSet",
        "metadata": {"name": "agent", "generation": 5},
        "spec": {},
        "status": {
            "observedGeneration": 5,
            "desiredNumberScheduled": 2,
            "updatedNumberScheduled": 2,
            "numberReady": 1,
        },
    }
    assert assess(DAEMONSET, ds, [], _record(), NOW).state == ROLLING
    ds["status"]["numberReady"] = 2
    assert assess(DAEMONSET, ds, [], _record(), NOW).state == COMPLETE


def test_a_kind_whose_pods_are_not_replaced_has_nothing_to_follow() -> None:
    rs = {
        "kind": "ReplicaSet",
        "metadata": {"generation": 1},
        "spec": {"replicas": 5},
        "status": {},
    }
    assert assess(REPLICASET, rs, [], _record(since=NOW - 9999), NOW).state == COMPLETE


# --- undo ----------------------------------------------------------------------------------


NSKEY = digest.namespace_key(HKEY, "team-a")


def _rolled_snapshot() -> tuple[JSONObject, JSONObject, RolloutRecord]:
    """A snapshot-mode Deployment before and after configpin re-stamped it to new copies."""
    store = Store([configmap("cfg", {"a": "1"})])
    obj = make_workload(
        "Deployment",
        reading("cfg", "a"),
        annotations={"configpin.io/mode": "snapshot"},
    )
    p = plan(obj, store, mode="snapshot")
    store.create_snapshots(p)
    before = apply(obj, p)
    store.put(configmap("cfg", {"a": "2"}))
    p2 = plan(before, store, mode="snapshot", refresh={next(iter(store.objects))})
    store.create_snapshots(p2)
    after = apply(before, p2)
    old_ref = before["spec"]["template"]["spec"]["containers"][0]["env"][0]["valueFrom"][
        "configMapKeyRef"
    ]["name"]
    new_ref = after["spec"]["template"]["spec"]["containers"][0]["env"][0]["valueFrom"][
        "configMapKeyRef"
    ]["name"]
    assert old_ref != new_ref
    record = RolloutRecord(
        ROLLING,
        to=p2.sources,
        before=p.sources,
        since=NOW,
        refs={f"configmap/{new_ref}": f"cfg/{old_ref}"},
        template=template_fingerprint(after["spec"]["template"]),
    )
    return before, after, record


def test_undo_points_the_template_back_at_the_previous_copies_and_record() -> None:
    before, after, record = _rolled_snapshot()
    ops, why = undo_ops(DEPLOYMENT, after, record, NSKEY, lambda _source, _name: True)
    assert why is None
    undone = jsonpatch.apply_patch(copy.deepcopy(after), ops)
    assert undone["spec"]["template"]["spec"] == before["spec"]["template"]["spec"]
    annotations = undone["spec"]["template"]["metadata"]["annotations"]
    assert (
        annotations[ANN_SOURCES]
        == before["spec"]["template"]["metadata"]["annotations"][ANN_SOURCES]
    )
    assert (
        annotations[ANN_CHECKSUM]
        == before["spec"]["template"]["metadata"]["annotations"][ANN_CHECKSUM]
    )


def test_undo_takes_back_only_what_configpin_changed() -> None:
    _, after, record = _rolled_snapshot()
    after["spec"]["template"]["spec"]["containers"][0]["image"] = "app:2"  # a deploy meanwhile
    ops, why = undo_ops(DEPLOYMENT, after, record, NSKEY, lambda _s, _n: True)
    assert ops == [] and why is not None and "changed since" in why


def test_undo_never_points_at_what_is_not_a_copy_configpin_made() -> None:
    _, after, record = _rolled_snapshot()
    ops, why = undo_ops(DEPLOYMENT, after, record, NSKEY, lambda _s, _n: False)
    assert ops == [] and why is not None and "not a copy configpin made" in why


# --- waves ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "steps"),
    [
        ("1,10%,100%", (WaveStep(count=1), WaveStep(fraction=0.1), WaveStep(fraction=1.0))),
        (" 2 , 50% ", (WaveStep(count=2), WaveStep(fraction=0.5))),
        ("1,approve,100%", (WaveStep(count=1), WaveStep(approve=True), WaveStep(fraction=1.0))),
        ("off", None),
    ],
)
def test_waves_parse(text: str, steps: tuple[WaveStep, ...] | None) -> None:
    assert parse_waves(text) == steps


@pytest.mark.parametrize(
    "text", ["", "0", "1,,2", "150%", "-1", "ten", "approve", "1,approve,approve,100%"]
)
def test_bad_waves_are_refused_with_the_form(text: str) -> None:
    with pytest.raises(ValueError, match=r"1,10%,100%"):
        parse_waves(text)


def test_an_approve_step_makes_no_wave_and_gates_the_waves_after_it() -> None:
    steps = parse_waves("1,10%,approve,100%")
    assert steps is not None
    assert wave_sizes(20, steps) == [1, 2, 17]
    assert approval_from(steps) == 2  # the third wave (from 0) waits
    assert approval_from(parse_waves("1,10%,100%")) is None
    assert asks_approval({"metadata": {"annotations": {ANN_ROLLOUT_WAVES: " Approve "}}})
    assert not asks_approval({"metadata": {"annotations": {ANN_ROLLOUT_WAVES: "1,100%"}}})


@pytest.mark.parametrize(
    ("total", "sizes"),
    [(1, [1]), (2, [1, 1]), (20, [1, 2, 17]), (1000, [1, 100, 899]), (0, [])],
)
def test_default_waves_are_one_then_a_tenth_of_the_rest_then_the_rest(
    total: int, sizes: list[int]
) -> None:
    steps = parse_waves("1,10%,100%")
    assert steps is not None
    assert wave_sizes(total, steps) == sizes
    assert sum(sizes) == total


def test_steps_that_leave_some_out_are_followed_by_the_rest() -> None:
    assert wave_sizes(10, (WaveStep(count=2), WaveStep(fraction=0.25))) == [2, 2, 6]


def test_waves_order_by_annotation_then_spread_across_namespaces() -> None:
    members = [Member(0, ns, "Deployment", f"w{i}") for ns in ("a", "b", "c") for i in range(3)]
    members.append(Member(-1, "prod", "Deployment", "canary"))
    members.append(Member(5, "a", "Deployment", "last"))
    order = wave_order(reversed(members))
    assert order[0].name == "canary" and order[-1].name == "last"
    middle = order[1:-1]
    assert {m.namespace for m in middle[:3]} == {"a", "b", "c"}  # one of each namespace first
    assert order == wave_order(members)  # stable, whatever order they were found in
    plan_ = wave_plan(members, parse_waves("1,10%,100%"))
    assert [len(w) for w in plan_] == [1, 1, 9] and plan_[0][0].name == "canary"
    assert wave_plan(members, None) == [order]


def test_only_workloads_that_vouch_cut_the_waves_the_others_join_the_last() -> None:
    names = [f"w{i}" for i in range(12)]
    broken = {"w0", "w5"}  # not healthy before the change (or scaled to zero)
    plan_ = cut_waves(names, lambda n: n not in broken, parse_waves("1,10%,100%"))
    assert plan_[0] == ["w1"]  # never a broken one first
    assert [len(w) for w in plan_] == [1, 1, 10]
    assert set(plan_[-1]) >= broken
    # nobody vouches (a broken app's config fix): they all roll at once
    assert cut_waves(["a", "b"], lambda _n: False, parse_waves("1,10%,100%")) == [["a", "b"]]


def test_the_others_never_join_a_wave_before_an_approval_behind_a_canary() -> None:
    """Those that cannot vouch (not healthy before the change, scaled to zero) join the
    last wave; where every wave of those that vouch comes before `approve` (the canary alone
    vouches), the others' wave is the first after it: they wait for the approval too. Where
    none vouches, they all roll at once, approve or not."""
    steps = parse_waves("1,approve,100%")
    vouch = {"canary", "w1"}.__contains__
    assert cut_waves(["canary", "w1", "z1", "z2"], vouch, steps) == [
        ["canary"],
        ["w1", "z1", "z2"],
    ]
    alone = {"canary"}.__contains__  # (the others scaled to zero while they waited)
    assert cut_waves(["canary", "z1", "z2"], alone, steps) == [["canary"], ["z1", "z2"]]
    assert cut_waves(["z1", "z2"], lambda _n: False, steps) == [["z1", "z2"]]
    late = parse_waves("1,1,approve,100%")
    assert cut_waves(["canary", "z1"], alone, late) == [["canary"], [], ["z1"]]
    assert cut_waves(["canary", "w1", "z1"], vouch, late) == [["canary"], ["w1"], ["z1"]]
