"""The wave gate (webhook/controller/waves.py): which stale workloads may roll to a change now,
worked out from the index and the source cache alone."""

from __future__ import annotations

from typing import Any

from harness.controller import StoreCache
from tests.unit.conftest import (
    HKEY,
    Store,
    apply,
    configmap,
    container,
    env_cm,
    plan,
    pod_spec,
    workload,
)
from webhook.config import Settings
from webhook.controller.index import WorkloadIndex, WorkloadRef, entry_from_object
from webhook.controller.waves import Gate
from webhook.core.constants import ANN_ROLLOUT, ANN_WAVE
from webhook.core.delivery import RolloutRecord, identity_of
from webhook.core.model import SourceId, SourceKind

CFG = SourceId(SourceKind.CONFIGMAP, "cfg")


def _setup(
    names: dict[str, list[str]],
    *,
    waves: str = "1,10%,100%",
    cap: int = 0,
    scope: set[str] | None = None,
) -> tuple[Gate, WorkloadIndex, dict[str, Store], dict[WorkloadRef, Any]]:
    """Workloads consuming `cfg` in each namespace, stamped; then `cfg` changes everywhere
    to the same content."""
    stores = {ns: Store([configmap("cfg", {"a": "1"}, namespace=ns)]) for ns in names}
    index = WorkloadIndex()
    objs: dict[WorkloadRef, Any] = {}
    for ns, workloads in names.items():
        for name in workloads:
            obj = workload(
                "Deployment", pod_spec(container(env=[env_cm("cfg", "a")])), name=name, namespace=ns
            )
            obj = apply(obj, plan(obj, stores[ns]))
            entry = entry_from_object(obj, "checksum", hkey=HKEY)
            index.put(entry)
            objs[entry.ref] = obj
    for ns, store in stores.items():
        store.put(configmap("cfg", {"a": "2"}, namespace=ns))
    settings = Settings(rollout_waves=waves, max_rolling=cap)
    in_scope = (lambda ns: True) if scope is None else scope.__contains__
    return Gate(index, StoreCache(stores), HKEY, settings, in_scope=in_scope), index, stores, objs


def _record(index: WorkloadIndex, obj: Any, ref: WorkloadRef, change: str, state: str) -> None:
    record = RolloutRecord(state, to={}, before={}, since=0.0, changes=(change,))
    obj["metadata"].setdefault("annotations", {})[ANN_ROLLOUT] = record.encode(
        HKEY, identity_of(ref.kind, ref.namespace, ref.name)
    )
    index.put(entry_from_object(obj, "checksum", hkey=HKEY))


def test_the_first_wave_goes_alone_and_the_next_when_it_completed() -> None:
    gate, index, _, objs = _setup({"team-a": [f"w{i}" for i in range(12)]})
    [change] = gate.changes("team-a", [CFG])
    plan_ = gate.plan(change)
    assert [len(w) for w in plan_] == [1, 2, 9]
    first, second, third = plan_
    assert gate.wait(first[0], [change]) is None
    assert "wave 1 is complete (0 of 1" in (gate.wait(second[0], [change]) or "")
    _record(index, objs[first[0]], first[0], change, "rolling")
    assert gate.wait(second[0], [change]) is not None
    _record(index, objs[first[0]], first[0], change, "complete")
    assert gate.wait(second[0], [change]) is None
    assert "wave 2 is complete (0 of 2" in (gate.wait(third[0], [change]) or "")


def test_a_failure_stops_every_later_wave() -> None:
    gate, index, _, objs = _setup({"team-a": [f"w{i}" for i in range(5)]})
    [change] = gate.changes("team-a", [CFG])
    first, *later = gate.plan(change)
    _record(index, objs[first[0]], first[0], change, "failed")
    for wave in later:
        assert "failed" in (gate.wait(wave[0], [change]) or "")


def test_the_same_content_in_several_namespaces_is_one_change_spread_across_them() -> None:
    gate, *_ = _setup({ns: ["a", "b", "c"] for ns in ("dev", "stage", "prod")})
    changes = {gate.changes(ns, [CFG]) for ns in ("dev", "stage", "prod")}
    assert len(changes) == 1
    [[change]] = changes
    order = [ref for wave in gate.plan(change) for ref in wave]
    assert {r.namespace for r in order[:3]} == {"dev", "stage", "prod"}


def test_workloads_configpin_does_not_act_for_hold_no_wave() -> None:
    gate, *_ = _setup({"team-a": ["w0", "w1"], "elsewhere": ["x0", "x1", "x2"]}, scope={"team-a"})
    [change] = gate.changes("team-a", [CFG])
    members = gate.members(change)
    assert {r.namespace for r in members} == {"team-a"}


def test_the_wave_annotation_goes_first() -> None:
    gate, index, _, objs = _setup({"team-a": [f"w{i}" for i in range(6)]})
    canary = WorkloadRef("Deployment", "team-a", "w4")
    objs[canary]["metadata"].setdefault("annotations", {})[ANN_WAVE] = "-1"
    index.put(entry_from_object(objs[canary], "checksum", hkey=HKEY))
    [change] = gate.changes("team-a", [CFG])
    assert gate.plan(change, refresh=True)[0] == [canary]


def test_waves_off_roll_every_workload_at_once_under_the_cap() -> None:
    gate, index, _, objs = _setup({"team-a": ["w0", "w1", "w2"]}, waves="off", cap=1)
    [change] = gate.changes("team-a", [CFG])
    refs = list(objs)
    assert all(gate.wait(r, [change]) is None for r in refs)
    _record(index, objs[refs[0]], refs[0], change, "rolling")
    assert "--max-rolling 1" in (gate.wait(refs[1], [change]) or "")
