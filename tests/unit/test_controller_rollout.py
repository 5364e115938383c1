"""Small decisions of the rollout controller: what counts as a rollout, skip reasons."""

from __future__ import annotations

import pytest

from tests.unit.conftest import Store, configmap, pod_spec, vol_cm, workload
from webhook.controller.rollout import _skip_reason, _touches_template
from webhook.core.plan import dumps_mapping, observed_ops, plan_object


@pytest.mark.parametrize(
    ("kind", "path", "rolls"),
    [
        ("Deployment", "/spec/template/metadata/annotations/configpin.io~1sources", True),
        ("Deployment", "/spec/template/spec/volumes/0/configMap/name", True),
        ("Deployment", "/metadata/annotations/configpin.io~1observed", False),
        ("Deployment", "/spec/templateX", False),
        ("CronJob", "/spec/jobTemplate/spec/template/metadata/annotations", True),
        ("CronJob", "/spec/template/metadata", False),
    ],
)
def test_only_template_changes_are_rollouts(kind: str, path: str, rolls: bool) -> None:
    assert _touches_template(kind, [{"op": "add", "path": path, "value": "x"}]) is rolls


def test_a_plan_that_only_records_observed_is_not_a_rollout() -> None:
    store = Store([configmap("c", {"k": "1"})])
    obj = workload("Deployment", pod_spec(volumes=[vol_cm("c")]))
    stamped = plan_object(obj, hkey=store.hkey, lookup=store.lookup)
    assert _touches_template("Deployment", stamped.patch)
    record_only = observed_ops(obj, dumps_mapping(stamped.observed))  # the catch-up baseline
    assert record_only and not _touches_template("Deployment", record_only)


@pytest.mark.parametrize(
    ("reason", "label"),
    [
        ("owned by a controller: its owner's template decides", "not-managed"),
        ("configpin's own object", "not-managed"),
        ("mode off", "mode-off"),
        ("kind Job is not rolled", "not-managed"),
        ("consumes no ConfigMap or Secret", "not-managed"),
        ("current", "current"),
    ],
)
def test_skip_reasons_are_a_small_set_of_labels(reason: str, label: str) -> None:
    assert _skip_reason(reason) == label
