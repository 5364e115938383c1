"""`configpin status` without a cluster: the body of its dry run, how a copy's name is told
from its source's, and how it says a workload's state."""

from __future__ import annotations

import json
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
from webhook.core.reasons import WAIT_STATES, Status
from webhook.core.record import ACTION_WORDS, Action

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
