"""`configpin status` without a cluster: the body of its dry run, and how a copy's name is
told from its source's."""

from __future__ import annotations

from tests.unit.conftest import container, env_cm, pod_spec, vol_cm, workload
from webhook.core.names import snapshot_name
from webhook.status import _copies, _dry_run_copy, copy_of

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
