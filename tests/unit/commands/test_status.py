"""`configpin status` without a cluster: the body of its dry run, how a copy's name is told
from its source's, and how it says a workload's state."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.conftest import container, env_cm, pod_spec, vol_cm, workload
from webhook.commands.status import (
    SourceStatus,
    StatusReader,
    WorkloadStatus,
    _copies,
    _dry_run_copy,
    copy_of,
)
from webhook.core.constants import ANN_ROLLOUT
from webhook.core.names import snapshot_name
from webhook.core.reasons import STATUS_EXIT, WAIT_STATES, Status
from webhook.core.record import ACTION_WORDS, Action
from webhook.core.rollouts import rollout_path
from webhook.kube.errors import NotFound

DIGEST = "0123456789abcdef" * 4


def test_a_copy_is_told_from_its_source_by_its_name() -> None:
    assert copy_of(snapshot_name("app-config", DIGEST), ["other", "app-config"]) == "app-config"
    long = "x" * 250
    assert copy_of(snapshot_name(long, DIGEST), [long]) == long
    assert copy_of("app-config", ["app-config"]) is None  # the source itself
    assert copy_of("app-config-v2", ["app-config"]) is None
    assert copy_of("app-config-0123456789", ["app"]) is None
    assert copy_of("app-config-XYZ3456789", ["app-config"]) is None


def test_the_dry_run_asks_about_the_sources_not_the_copies() -> None:
    """Admission keeps a template pointing at existing copies: the dry run must name the
    sources, or a snapshot-mode workload would always look current."""
    copy = snapshot_name("app-config", DIGEST)
    spec = pod_spec(container(env=[env_cm(copy, "a"), env_cm("plain", "b")]))
    spec["volumes"] = [vol_cm(copy, volume="v")]
    obj = workload("Deployment", spec, name="web")
    obj["metadata"]["uid"] = "u"
    body = _dry_run_copy(obj, {"configmap/app-config": "d1", "configmap/plain": "d2"})
    out = body["spec"]["template"]["spec"]
    assert out["containers"][0]["env"][0]["valueFrom"]["configMapKeyRef"]["name"] == "app-config"
    assert out["containers"][0]["env"][1]["valueFrom"]["configMapKeyRef"]["name"] == "plain"
    assert out["volumes"][0]["configMap"]["name"] == "app-config"
    assert "uid" not in body["metadata"] and "name" not in body["metadata"]
    assert body["metadata"]["generateName"] == "web-status-"
    # the workload itself is untouched, and its copies are listed
    assert obj["spec"]["template"]["spec"]["volumes"][0]["configMap"]["name"] == copy
    assert _copies(obj, {"configmap/app-config": "d1"}) == [f"configmap/{copy}"]
    # a Secret's copy is not taken for a ConfigMap's
    assert (
        _dry_run_copy(obj, {"secret/app-config": "d"})["spec"]["template"]["spec"]["volumes"][0][
            "configMap"
        ]["name"]
        == copy
    )


# --- the states and their words: the tables of webhook.core.reasons and core.record ------


class _Events:
    """The Events the status command reads (the controller's), as the API server lists them."""

    def __init__(self, *events: dict[str, Any]) -> None:
        self.events = list(events)

    def get(self, api_path: str, **query: Any) -> dict[str, Any]:
        return {"items": self.events}


def _stale(record: dict[str, Any] | None = None) -> tuple[dict[str, Any], WorkloadStatus]:
    meta: dict[str, Any] = {"name": "web", "namespace": "shop", "annotations": {}}
    if record is not None:
        meta["annotations"][ANN_ROLLOUT] = json.dumps(record)
    st = WorkloadStatus("shop", "Deployment", "web", state=Status.STALE)
    st.sources = [SourceStatus("configmap/app-config", "a" * 64, "b" * 64)]
    return {"kind": "Deployment", "metadata": meta}, st


@pytest.mark.parametrize(
    ("reason", "state"),
    [
        ("ConfigRolloutWaiting", Status.WAITING),
        ("ConfigRolloutAwaitingApproval", Status.AWAITING_APPROVAL),
        ("RolloutStarted", Status.STALE),
    ],
)
def test_a_stale_workload_waits_as_the_controllers_last_event_says(
    reason: str, state: Status
) -> None:
    obj, st = _stale()
    event = {"reason": reason, "message": "not rolled yet: wave 2", "lastTimestamp": "t"}
    event["involvedObject"] = {"kind": "Deployment", "name": "web"}
    StatusReader(_Events(event))._delivery(obj, st)  # type: ignore[arg-type]
    assert st.state is state
    assert WAIT_STATES.get(reason, Status.STALE) is state


class _Cluster(_Events):
    """The Events, and the ConfigRollout of configmap/app-config in shop."""

    def __init__(self, rollout: dict[str, Any] | None, *events: dict[str, Any]) -> None:
        super().__init__(*events)
        self.rollout = rollout
        self.asked: list[str] = []

    def get(self, api_path: str, **query: Any) -> dict[str, Any]:
        self.asked.append(api_path)
        if "/configrollouts/" not in api_path:
            return super().get(api_path, **query)
        assert api_path == rollout_path("shop", "configmap-app-config")
        if self.rollout is None:
            raise NotFound("configrollouts", 404, "NotFound")
        return self.rollout


def _rollout(*members: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"generation": 1}, "status": {"members": list(members)}}


@pytest.mark.parametrize(
    ("reason", "state"),
    [
        ("AwaitingWindow", Status.AWAITING_WINDOW),
        ("AwaitingApproval", Status.AWAITING_APPROVAL),
        ("Flapping", Status.FLAPPING),
        ("Waiting", Status.WAITING),
        ("Failed", Status.WAITING),  # (an earlier wave failed: the later ones never start)
    ],
)
def test_a_stale_workload_waits_as_its_sources_configrollout_says_before_any_event(
    reason: str, state: Status
) -> None:
    """The gate's decision as the ConfigRollout publishes it is what status shows (its
    words too); an older Event that says otherwise is not read."""
    obj, st = _stale()
    member = {"kind": "Deployment", "name": "web", "state": "waiting", "reason": reason}
    event = {"reason": "ConfigRolloutWaiting", "message": "an old wait", "lastTimestamp": "t"}
    event["involvedObject"] = {"kind": "Deployment", "name": "web"}
    cluster = _Cluster(_rollout({**member, "message": "the gate's words"}), event)
    StatusReader(cluster)._delivery(obj, st)  # type: ignore[arg-type]
    assert (st.state, st.reason) == (state, "the gate's words")
    assert not [p for p in cluster.asked if "/events" in p]


@pytest.mark.parametrize(
    "rollout",
    [
        None,  # (no CRD, or not allowed to read it)
        _rollout({"kind": "Deployment", "name": "other", "state": "waiting", "reason": "Waiting"}),
        _rollout({"kind": "Deployment", "name": "web", "state": "rolling"}),
    ],
)
def test_where_the_configrollout_does_not_say_the_last_event_does(
    rollout: dict[str, Any] | None,
) -> None:
    obj, st = _stale()
    event = {"reason": "ConfigRolloutAwaitingApproval", "message": "wave 2", "lastTimestamp": "t"}
    event["involvedObject"] = {"kind": "Deployment", "name": "web"}
    StatusReader(_Cluster(rollout, event))._delivery(obj, st)  # type: ignore[arg-type]
    assert (st.state, st.reason) == (Status.AWAITING_APPROVAL, "wave 2")


@pytest.mark.parametrize("action", list(Action))
def test_a_failed_rollout_is_said_in_the_words_the_event_uses(action: Action) -> None:
    record = {"state": "failed", "signal": "progress deadline", "action": action.value}
    obj, st = _stale({**record, "by": "alice at 2026-01-01T00:00:00Z"})
    st.sources = [SourceStatus("configmap/app-config", "a" * 64, "a" * 64)]
    st.state = Status.CURRENT
    StatusReader(_Events())._delivery(obj, st)  # type: ignore[arg-type]
    assert st.state is Status.FAILED
    assert st.reason == (
        f"the config rollout failed: progress deadline ({ACTION_WORDS[action].short})"
        " (changed by alice at 2026-01-01T00:00:00Z)"
    )
    doc = st.as_dict()
    assert type(doc["state"]) is str and type(doc["sources"][0]["state"]) is str
    assert yaml.safe_load(yaml.safe_dump(doc))["state"] == "failed"  # (-o yaml)


def test_every_state_has_its_exit_code_and_docs_status_lists_them_all() -> None:
    """0 only for a workload known to be current (or with nothing to deliver); 2 where status
    could not judge; 1 for every change not delivered yet or failed. docs/status.md's table
    says the same of every state."""
    assert set(STATUS_EXIT) == set(Status)
    assert {s for s in Status if s.exit_code == 0} == {Status.CURRENT, Status.NOT_PINNED}
    assert Status.UNKNOWN.exit_code == 2
    assert all(Status(s).exit_code == 1 for s in Status if s.failing)
    page = (Path(__file__).resolve().parents[3] / "docs" / "status.md").read_text()
    table = page.split("<!-- states:begin")[1].split("<!-- states:end -->")[0]
    rows = [line.split("|")[1:3] for line in table.splitlines() if line.startswith("| `")]
    documented = {cell.strip().strip("`"): int(code) for cell, code in rows}
    assert documented == {s.value: s.exit_code for s in Status}
