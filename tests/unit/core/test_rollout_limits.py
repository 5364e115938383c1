"""What admission refuses of a workload's rollout windows and budget (webhook/core/modes.py,
`unreadable_rollout_limits`): a value that cannot be read, when the write sets or changes it,
with a message that names the annotation."""

from __future__ import annotations

import pytest

from tests.unit.conftest import container, env_cm, pod_spec, workload
from webhook.core.constants import ANN_ROLLOUT_BUDGET, ANN_ROLLOUT_WINDOWS
from webhook.core.model import JSONObject
from webhook.core.modes import unreadable_rollout_limits

SPEC = pod_spec(container(env=[env_cm("cfg", "a")]))
GOOD_WINDOWS = '[{"kind": "deny", "schedule": "0 22 * * 5", "duration": "60h"}]'
BAD_WINDOWS = '[{"kind": "deny", "schedule": "0 22 * *", "duration": "60h"}]'


def _deployment(**annotations: str) -> JSONObject:
    return workload("Deployment", SPEC, annotations=annotations)


def _with(key: str, value: str, kind: str = "Deployment") -> JSONObject:
    return workload(kind, SPEC, annotations={key: value})


@pytest.mark.parametrize("kind", ["Deployment", "StatefulSet", "DaemonSet"])
def test_readable_values_are_admitted(kind: str) -> None:
    obj = workload(
        kind, SPEC, annotations={ANN_ROLLOUT_WINDOWS: GOOD_WINDOWS, ANN_ROLLOUT_BUDGET: "2/30s"}
    )
    assert unreadable_rollout_limits(obj, None) is None
    assert unreadable_rollout_limits(_with(ANN_ROLLOUT_BUDGET, "0"), None) is None
    assert unreadable_rollout_limits(_deployment(), None) is None


def test_unreadable_windows_are_refused_by_name() -> None:
    said = unreadable_rollout_limits(_with(ANN_ROLLOUT_WINDOWS, BAD_WINDOWS), None)
    assert said == (
        "configpin.io/rollout-windows: window 1: schedule '0 22 * *': 4 fields, five expected "
        "(minute hour day-of-month month day-of-week)"
    )


def test_an_unreadable_budget_is_refused_by_name() -> None:
    said = unreadable_rollout_limits(_with(ANN_ROLLOUT_BUDGET, "6 per hour"), None)
    assert said == (
        "configpin.io/rollout-budget: '6 per hour': COUNT/PERIOD expected (6/1h), or 0 for none"
    )


def test_a_yaml_list_is_read() -> None:
    text = "- kind: allow\n  schedule: 0 9 * * 1-5\n  duration: 8h\n  timeZone: Europe/Berlin\n"
    assert unreadable_rollout_limits(_with(ANN_ROLLOUT_WINDOWS, text), None) is None
    broken = text.replace("8h", "8 hours")
    said = unreadable_rollout_limits(_with(ANN_ROLLOUT_WINDOWS, broken), None)
    assert said is not None and said.startswith("configpin.io/rollout-windows: window 1: duration")


def test_a_value_the_write_leaves_as_it_was_is_not_refused() -> None:
    """A workload that holds an unreadable value from before (set while configpin did not
    check it) can still be written: rolled back, restarted, scaled, or fixed."""
    held = _with(ANN_ROLLOUT_WINDOWS, BAD_WINDOWS)
    restarted = _with(ANN_ROLLOUT_WINDOWS, BAD_WINDOWS)
    restarted["spec"]["template"]["metadata"] = {"annotations": {"restartedAt": "now"}}
    assert unreadable_rollout_limits(restarted, held) is None
    # changed to another unreadable value, or set where there was none: refused
    other = _with(ANN_ROLLOUT_WINDOWS, BAD_WINDOWS.replace("60h", "6h"))
    assert unreadable_rollout_limits(other, held) is not None
    assert unreadable_rollout_limits(held, _deployment()) is not None
    # fixed: admitted
    assert unreadable_rollout_limits(_with(ANN_ROLLOUT_WINDOWS, GOOD_WINDOWS), held) is None


def test_only_kinds_configpin_rolls_are_checked() -> None:
    # (a Pod's copy of the annotation, or a kind configpin never rolls, means nothing)
    assert unreadable_rollout_limits(_with(ANN_ROLLOUT_WINDOWS, BAD_WINDOWS, "Pod"), None) is None
    service = {
        "kind": "Service",
        "metadata": {"name": "s", "annotations": {ANN_ROLLOUT_BUDGET: "x"}},
    }
    assert unreadable_rollout_limits(service, None) is None
