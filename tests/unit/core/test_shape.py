"""The edge check of field types: well-typed objects pass, a wrong one is named by its path."""

from __future__ import annotations

import copy

import pytest

from tests.unit.conftest import (
    WORKLOAD_KINDS,
    container,
    env_cm,
    env_secret,
    envfrom_cm,
    envfrom_secret,
    pod_spec,
    proj_cm,
    proj_secret,
    review,
    vol_cm,
    vol_projected,
    vol_secret,
    workload,
)
from webhook.core.shape import ShapeError, check_object, check_request


def _rich(kind: str) -> dict:  # type: ignore[type-arg]
    spec = pod_spec(
        container(
            env=[
                env_cm("a", "k", optional=True),
                env_secret("b", "k"),
                {"name": "X", "value": "1"},
            ],
            env_from=[envfrom_cm("c"), envfrom_secret("d", optional=False)],
        ),
        init=[container("i", env=[env_cm("a", "k")])],
        ephemeral=[container("e")],
        volumes=[
            vol_cm("a", items=["k"], optional=True),
            vol_secret("b"),
            vol_projected(proj_cm("c"), proj_secret("d", items=["x"])),
            {"name": "scratch", "emptyDir": {}},
        ],
    )
    return workload(kind, spec, annotations={"a": "b"}, owner="ReplicaSet")


@pytest.mark.parametrize("kind", WORKLOAD_KINDS)
def test_well_typed_workloads_of_every_kind_pass(kind: str) -> None:
    obj = _rich(kind)
    check_request(review(obj, operation="UPDATE", old=copy.deepcopy(obj))["request"])


def test_null_counts_as_absent() -> None:
    obj = _rich("Deployment")
    obj["metadata"]["annotations"] = None
    obj["spec"]["template"]["spec"]["volumes"] = None
    obj["spec"]["template"]["spec"]["containers"][0]["env"][0]["valueFrom"]["configMapKeyRef"][
        "optional"
    ] = None
    check_object(obj)
    check_request({"operation": "DELETE", "object": None, "oldObject": obj, "dryRun": None})


def test_kinds_it_does_not_handle_are_checked_only_for_what_is_read() -> None:
    check_object({"kind": "Service", "metadata": {"name": "s"}, "spec": 5})
    with pytest.raises(ShapeError):
        check_object({"kind": "Service", "metadata": {"labels": []}})


@pytest.mark.parametrize(
    ("kind", "mutate", "message"),
    [
        (
            "CronJob",
            lambda o: o["spec"]["jobTemplate"]["spec"]["template"]["spec"].update(volumes="x"),
            "spec.jobTemplate.spec.template.spec.volumes: expected a list, got a string",
        ),
        (
            "Pod",
            lambda o: o["spec"]["volumes"][2]["projected"]["sources"][1]["secret"].update(
                items=[{"key": 1}]
            ),
            "spec.volumes[2].projected.sources[1].secret.items[0].key: "
            "expected a string, got a number",
        ),
        (
            "Job",
            lambda o: o["spec"]["template"]["spec"]["initContainers"][0].update(env={"a": 1}),
            "spec.template.spec.initContainers[0].env: expected a list, got an object",
        ),
        (
            "StatefulSet",
            lambda o: o["metadata"]["ownerReferences"][0].update(controller=1),
            "metadata.ownerReferences[0].controller: expected a boolean, got a number",
        ),
        (
            "DaemonSet",
            lambda o: o["spec"]["template"].update(metadata=True),
            "spec.template.metadata: expected an object, got a boolean",
        ),
        (
            "Deployment",
            lambda o: o["spec"]["template"]["spec"]["containers"][0]["envFrom"][1].update(
                secretRef={"name": ["d"]}
            ),
            "spec.template.spec.containers[0].envFrom[1].secretRef.name: "
            "expected a string, got a list",
        ),
    ],
)
def test_a_wrong_field_is_named_by_its_path(kind: str, mutate: object, message: str) -> None:
    obj = _rich(kind)
    mutate(obj)  # type: ignore[operator]
    with pytest.raises(ShapeError) as err:
        check_object(obj)
    assert str(err.value) == message
    with pytest.raises(ShapeError) as err:
        check_request(review(obj)["request"])
    assert str(err.value) == "object." + message


def test_an_old_object_is_checked_for_its_records_only() -> None:
    old = _rich("Deployment")
    old["spec"]["template"]["spec"]["volumes"] = 3  # never read of an old object
    check_request({"operation": "UPDATE", "oldObject": old})
    old["spec"]["template"]["metadata"]["annotations"] = {"configpin.io/sources": 5}
    with pytest.raises(ShapeError, match=r"^oldObject\.spec\.template\.metadata\.annotations"):
        check_request({"operation": "UPDATE", "oldObject": old})
