"""Rolling on change, end to end: configpin (webhook and controller) against the real API
server and controller-manager. A rollout is what the controller-manager makes of a new pod
template: a new ReplicaSet (Deployment) or ControllerRevision (StatefulSet, DaemonSet).

This module runs its own configpin (instance `ctl`) with a short coalescing window and no
minimum interval; its namespaces carry the instance label, so no other configpin acts there.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from harness.configpin import (
    Configpin,
    ensure_namespace,
    running_configpin,
)
from harness.controlplane import (
    ControlPlane,
    server_minor,
    wait_for,
)
from harness.manifests import (
    configmap,
    container,
    deployment,
    env_from,
    env_key_ref,
    pod_spec,
)
from tests.integration.instances import instance_fixtures
from tests.timing import SETTLE, WINDOW
from webhook.core.constants import ANN_MODE, ANN_OBSERVED, ANN_SOURCES
from webhook.core.kinds import builtin
from webhook.kube.raw import Kube, path
from webhook.kube.workloads import served_prefix

INSTANCE = "ctl"

CRONJOB = builtin("CronJob")
assert CRONJOB is not None


cp, ns = instance_fixtures(
    INSTANCE, "roll", ["--coalesce-window", str(WINDOW), "--min-rollout-interval", "0"]
)


# --- builders


def _all_keys() -> dict[str, Any]:
    """A pod spec that consumes every key of app-config (envFrom)."""
    return pod_spec(container(env_from=[env_from("configmap", "app-config")]))


def _workload(kind: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    """A StatefulSet or DaemonSet (Deployments: `deployment(..., replicas=1)`)."""
    template = {"metadata": {"labels": {"app": name}}, "spec": spec}
    selector = {"matchLabels": {"app": name}}
    body: dict[str, Any] = {"apiVersion": "apps/v1", "kind": kind, "metadata": {"name": name}}
    if kind == "StatefulSet":
        body["spec"] = {"serviceName": name, "selector": selector, "template": template}
    else:
        body["spec"] = {"selector": selector, "template": template}
    return body


def _resource(kind: str) -> str:
    return kind.lower() + "s"


def _sources(obj: dict[str, Any]) -> dict[str, str]:
    text = ((obj["spec"]["template"].get("metadata") or {}).get("annotations") or {}).get(
        ANN_SOURCES
    )
    return json.loads(text) if text else {}


def _set_cm(kube: Kube, ns: str, name: str, patch: dict[str, Any]) -> None:
    kube.patch(path("configmaps", ns, name), patch, content_type="application/merge-patch+json")


def _count(kube: Kube, resource: str, ns: str, selector: str) -> int:
    return len(kube.get(path(resource, ns), labelSelector=selector).get("items") or ())


def _replicasets(kube: Kube, ns: str, app: str) -> int:
    return _count(kube, "replicasets", ns, f"app={app}")


def _revisions(kube: Kube, ns: str, app: str) -> int:
    return _count(kube, "controllerrevisions", ns, f"app={app}")


def _dry_run_sources(kube: Kube, ns: str, body: dict[str, Any]) -> dict[str, str]:
    """What admission would record for this workload now (a server-side dry run)."""
    created = kube.create(path(_resource(body["kind"]), ns), body, dryRun="All")
    return _sources(created)


def _changes_seen(cp: Configpin) -> float:
    return cp.metric("configpin_source_changes_total")


# --- tests


def test_consumed_key_change_rolls_the_deployment(cp: Configpin, kube: Kube, ns: str) -> None:
    kube.create(path("configmaps", ns), configmap("app-config", {"a": "1", "b": "1"}))
    body = deployment("web", replicas=1)
    created = kube.create(path("deployments", ns), body)
    before = _sources(created)
    assert set(before) == {"configmap/app-config"}
    wait_for(lambda: _replicasets(kube, ns, "web") == 1, what="the first ReplicaSet")
    rollouts = cp.metric("configpin_rollouts_total", kind="Deployment")
    reviewed = cp.metric(
        "configpin_admissions_total", kind="Deployment", operation="UPDATE", result="unchanged"
    )
    restamped = cp.metric(
        "configpin_admissions_total", kind="Deployment", operation="UPDATE", result="patched"
    )

    _set_cm(kube, ns, "app-config", {"data": {"a": "2"}})

    wait_for(lambda: _replicasets(kube, ns, "web") == 2, what="a second ReplicaSet")
    dep = kube.get(path("deployments", ns, "web"))
    assert _sources(dep) != before
    # What the controller brought the workload up to date with is what admission records
    # for the same template now; current, so the template's record is the only one.
    assert ANN_OBSERVED not in (dep["metadata"].get("annotations") or {})
    assert _sources(dep) == _dry_run_sources(kube, ns, deployment("x", replicas=1))
    assert cp.metric("configpin_rollouts_total", kind="Deployment") == rollouts + 1
    # The controller's patch went through the webhook, which had nothing to change.
    assert (
        cp.metric(
            "configpin_admissions_total", kind="Deployment", operation="UPDATE", result="unchanged"
        )
        > reviewed
    )
    assert (
        cp.metric(
            "configpin_admissions_total", kind="Deployment", operation="UPDATE", result="patched"
        )
        == restamped
    )
    assert cp.metric("configpin_change_to_patch_seconds_count") >= 1


def test_sidecar_container_is_pinned_and_restamped(cp: Configpin, kube: Kube, ns: str) -> None:
    """A sidecar (1.28+: an init container with restartPolicy Always) is a container like any
    other: what it reads is pinned, and a change to it rolls the workload. 1.20 knows no
    restartPolicy on a container and drops the field; the init container is pinned all the
    same."""
    kube.create(path("configmaps", ns), configmap("app-config", {"a": "1"}))
    kube.create(path("configmaps", ns), configmap("proxy-config", {"p": "1", "unused": "1"}))
    spec = pod_spec()
    sidecar = container(name="proxy", env=[env_key_ref("configmap", "proxy-config", "p", "P")])
    sidecar["restartPolicy"] = "Always"
    spec["initContainers"] = [sidecar]
    created = kube.create(path("deployments", ns), deployment("web", spec, replicas=1))
    [stored] = created["spec"]["template"]["spec"]["initContainers"]
    assert ("restartPolicy" in stored) is (server_minor(kube.api) >= 28)
    before = _sources(created)
    assert set(before) == {"configmap/app-config", "configmap/proxy-config"}
    wait_for(lambda: _replicasets(kube, ns, "web") == 1, what="the first ReplicaSet")

    _set_cm(kube, ns, "proxy-config", {"data": {"unused": "2"}})
    time.sleep(SETTLE)
    assert _replicasets(kube, ns, "web") == 1, "a key the sidecar does not read rolls nothing"

    _set_cm(kube, ns, "proxy-config", {"data": {"p": "2"}})
    wait_for(lambda: _replicasets(kube, ns, "web") == 2, what="a second ReplicaSet")
    after = _sources(kube.get(path("deployments", ns, "web")))
    assert after["configmap/proxy-config"] != before["configmap/proxy-config"]
    assert after["configmap/app-config"] == before["configmap/app-config"]


@pytest.mark.parametrize("kind", ["StatefulSet", "DaemonSet"])
def test_consumed_key_change_rolls_statefulsets_and_daemonsets(
    cp: Configpin, kube: Kube, ns: str, kind: str
) -> None:
    kube.create(path("configmaps", ns), configmap("app-config", {"a": "1"}))
    created = kube.create(path(_resource(kind), ns), _workload(kind, "app", _all_keys()))
    before = _sources(created)
    wait_for(lambda: _revisions(kube, ns, "app") == 1, what="the first ControllerRevision")

    _set_cm(kube, ns, "app-config", {"data": {"a": "2", "new": "x"}})

    wait_for(lambda: _revisions(kube, ns, "app") == 2, what="a second ControllerRevision")
    obj = kube.get(path(_resource(kind), ns, "app"))
    assert _sources(obj) != before
    # The new revision is the re-stamped template.
    revisions = kube.get(path("controllerrevisions", ns), labelSelector="app=app")["items"]
    newest = max(revisions, key=lambda r: int(r["revision"]))
    recorded = newest["data"]["spec"]["template"]["metadata"]["annotations"][ANN_SOURCES]
    assert json.loads(recorded) == _sources(obj)


def test_unused_key_label_and_annotation_changes_roll_nothing(
    cp: Configpin, kube: Kube, ns: str
) -> None:
    kube.create(path("configmaps", ns), configmap("app-config", {"a": "1", "b": "1"}))
    body = deployment("web", replicas=1)
    created = kube.create(path("deployments", ns), body)
    wait_for(lambda: _replicasets(kube, ns, "web") == 1, what="the first ReplicaSet")
    seen = _changes_seen(cp)
    current = cp.metric("configpin_rollouts_skipped_total", reason="current")

    _set_cm(kube, ns, "app-config", {"data": {"b": "2"}})  # a key the Deployment does not use
    wait_for(lambda: _changes_seen(cp) == seen + 1, what="the unused-key change seen")
    assert cp.metric("configpin_rollouts_skipped_total", reason="current") > current

    _set_cm(kube, ns, "app-config", {"metadata": {"labels": {"team": "x"}}})
    _set_cm(kube, ns, "app-config", {"metadata": {"annotations": {"note": "y"}}})
    # A barrier: the watch delivers in order, so once this change is seen, so were the two
    # metadata changes before it (which the cache does not even report).
    _set_cm(kube, ns, "app-config", {"data": {"b": "3"}})
    wait_for(lambda: _changes_seen(cp) == seen + 2, what="the barrier change seen")
    time.sleep(SETTLE)  # nothing to wait for: a rollout that should not happen
    assert _replicasets(kube, ns, "web") == 1
    assert _sources(kube.get(path("deployments", ns, "web"))) == _sources(created)


def test_a_burst_of_changes_gives_one_rollout(cp: Configpin, kube: Kube, ns: str) -> None:
    kube.create(path("configmaps", ns), configmap("app-config", {"a": "1"}))
    kube.create(path("deployments", ns), deployment("web", replicas=1))
    wait_for(lambda: _replicasets(kube, ns, "web") == 1, what="the first ReplicaSet")
    coalesced = cp.metric("configpin_changes_coalesced_total")
    rollouts = cp.metric("configpin_rollouts_total", kind="Deployment")

    for value in ("2", "3", "4"):
        _set_cm(kube, ns, "app-config", {"data": {"a": value}})

    wait_for(lambda: _replicasets(kube, ns, "web") == 2, what="the rollout")
    time.sleep(SETTLE)  # a second rollout, if there were one, would have started by now
    assert _replicasets(kube, ns, "web") == 2
    assert cp.metric("configpin_rollouts_total", kind="Deployment") == rollouts + 1
    assert cp.metric("configpin_changes_coalesced_total") == coalesced + 2
    # The one rollout carries the latest content.
    latest = _dry_run_sources(kube, ns, deployment("x", replicas=1))
    assert _sources(kube.get(path("deployments", ns, "web"))) == latest


def test_mode_off_workloads_and_owned_replicasets_are_left_alone(
    cp: Configpin, kube: Kube, ns: str
) -> None:
    kube.create(path("configmaps", ns), configmap("app-config", {"a": "1"}))
    off = deployment("off", replicas=1, annotations={ANN_MODE: "off"})
    kube.create(path("deployments", ns), off)
    kube.create(path("deployments", ns), deployment("on", replicas=1))
    wait_for(lambda: _replicasets(kube, ns, "on") == 1, what="the first ReplicaSet")
    wait_for(lambda: _replicasets(kube, ns, "off") == 1, what="the first ReplicaSet (off)")

    _set_cm(kube, ns, "app-config", {"data": {"a": "2"}})

    wait_for(lambda: _replicasets(kube, ns, "on") == 2, what="the rollout of `on`")
    time.sleep(SETTLE)
    assert _replicasets(kube, ns, "off") == 1
    assert _replicasets(kube, ns, "on") == 2  # its old ReplicaSet was not patched into a third


def test_cronjob_job_template_is_restamped(cp: Configpin, kube: Kube, ns: str) -> None:
    prefix = served_prefix(kube, CRONJOB)
    assert prefix is not None
    kube.create(path("configmaps", ns), configmap("app-config", {"a": "1"}))
    spec = {**pod_spec(), "restartPolicy": "Never"}
    cronjob = {
        "apiVersion": prefix.removeprefix("/apis/"),
        "kind": "CronJob",
        "metadata": {"name": "nightly"},
        "spec": {
            "schedule": "0 3 * * *",
            "jobTemplate": {"spec": {"template": {"spec": spec}}},
        },
    }
    created = kube.create(path("cronjobs", ns, prefix=prefix), cronjob)

    def sources(obj: dict[str, Any]) -> dict[str, str]:
        meta = obj["spec"]["jobTemplate"]["spec"]["template"].get("metadata") or {}
        return json.loads((meta.get("annotations") or {}).get(ANN_SOURCES, "{}"))

    before = sources(created)
    assert set(before) == {"configmap/app-config"}
    _set_cm(kube, ns, "app-config", {"data": {"a": "2"}})
    wait_for(
        lambda: sources(kube.get(path("cronjobs", ns, "nightly", prefix=prefix))) != before,
        what="the CronJob's jobTemplate re-stamped",
    )
    assert cp.metric("configpin_rollouts_total", kind="CronJob") >= 1


def test_webhook_keeps_serving_and_controller_reports_up(cp: Configpin) -> None:
    assert cp.get("/readyz")[0] == 200
    assert cp.metric("configpin_controller_up") == 1


def test_no_controller_flag_serves_the_webhook_only(
    control_plane: ControlPlane, k8s: client.ApiClient, tmp_path: Path
) -> None:
    ensure_namespace(k8s)
    with running_configpin(
        control_plane, tmp_path, args=["--no-controller"], instance="nocontroller"
    ) as proc:
        assert proc.get("/readyz")[0] == 200
        assert proc.metric("configpin_controller_up") == 0
        assert proc.metric("configpin_leader") == 0
        assert "controller started" not in proc.log()
