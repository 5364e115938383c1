"""Custom-resource workloads and operator-owned workloads, live: the CRDs of Argo Rollouts and
OpenKruise CloneSet installed in the test API server (no Argo or Kruise controller), configpin
as a process behind the webhook registered as the chart renders it with those kinds.

A Rollout and a CloneSet are pinned at admission and re-stamped when their ConfigMap changes,
in checksum and snapshot mode (their copies owned by them while they point at them, and
collected by the garbage collector with them); a Rollout with `workloadRef` is left alone and
its Deployment is pinned and rolled; an operator's Deployment is skipped with an Event, and
pinned once it opts in.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from harness.configpin import Configpin, instance_namespace, leading_configpin
from harness.controlplane import ControlPlane, wait_for
from harness.manifests import (
    configmap,
    container,
    deployment,
    env_key_ref,
    pod_spec,
)
from tests.integration.crds import (
    CLONESET,
    CLONESET_CRD,
    ROLLOUT_CRD,
    WIDGET,
    WIDGET_CRD,
    installed,
)
from tests.integration.workloads import replicasets, revision, state
from tests.timing import SETTLE
from webhook.core.constants import (
    ANN_MODE,
    ANN_OWNED,
    ANN_ROLLED_AT,
    ANN_SOURCES,
    LABEL_SNAPSHOT,
)
from webhook.core.kinds import custom_kinds, parse_custom_kinds, use_custom_kinds
from webhook.kube.raw import MERGE_PATCH, Kube, path
from webhook.kube.workloads import served_custom_kinds

INSTANCE = "custom-kinds"
# (its configpin's window is 0.3 s, its resync 1 s): long enough for a second rollout, one that
# should not happen, to have started
ROLLOUTS = "/apis/argoproj.io/v1alpha1"
CLONESETS = "/apis/apps.kruise.io/v1alpha1"
KINDS = {
    "Rollout": ("argoproj.io/v1alpha1", ROLLOUTS, "rollouts"),
    "CloneSet": ("apps.kruise.io/v1alpha1", CLONESETS, "clonesets"),
    "Widget": ("widgets.example.com/v1", "/apis/widgets.example.com/v1", "widgets"),
}


@pytest.fixture(scope="module")
def cp(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Configpin]:
    # The CRDs first: configpin finds the served kinds when it starts.
    with (
        control_plane.api_client() as api,
        installed(api, ROLLOUT_CRD, CLONESET_CRD),
        leading_configpin(
            control_plane,
            tmp_path_factory.mktemp("configpin-custom-kinds"),
            instance=INSTANCE,
            webhook_name="configpin-custom-kinds",
            args=[
                "--workload-kinds",
                f"{CLONESET},{WIDGET}",
                # a kind whose CRD appears later is watched from the next resync
                "--resync-period",
                "1",
                "--snapshots",
                "--coalesce-window",
                "0.3",
                "--min-rollout-interval",
                "0",
            ],
            chart_values={"workloadKinds": [CLONESET, WIDGET]},
        ) as proc,
    ):
        yield proc


@pytest.fixture
def ns(k8s: client.ApiClient, cp: Configpin) -> Iterator[str]:
    with instance_namespace(k8s, INSTANCE, "custom") as name:
        yield name


def custom_workload(
    kind: str, name: str, spec: dict[str, Any], annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name}
    if annotations:
        metadata["annotations"] = annotations
    return {
        "apiVersion": KINDS[kind][0],
        "kind": kind,
        "metadata": metadata,
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": spec},
        },
    }


def _path(kind: str, ns: str, name: str | None = None) -> str:
    return path(KINDS[kind][2], ns, name, prefix=KINDS[kind][1])


def _template_annotations(obj: dict[str, Any]) -> dict[str, str]:
    return dict(((obj["spec"]["template"].get("metadata") or {}).get("annotations")) or {})


def _sources(obj: dict[str, Any]) -> dict[str, str]:
    text = _template_annotations(obj).get(ANN_SOURCES)
    return {} if text is None else dict(json.loads(text))


def _volume_name(obj: dict[str, Any]) -> str:
    return str(obj["spec"]["template"]["spec"]["volumes"][0]["configMap"]["name"])


def _spec_reading(source: str) -> dict[str, Any]:
    spec = pod_spec(container(env=[env_key_ref("configmap", source, "a", "A")]))
    spec["volumes"] = [{"name": "cfg", "configMap": {"name": source}}]
    return spec


@pytest.mark.parametrize("kind", ["Rollout", "CloneSet"])
def test_pinned_at_admission_and_restamped_on_change_checksum(
    k8s: client.ApiClient, ns: str, kind: str, cp: Configpin
) -> None:
    kube = Kube(k8s)
    kube.create(path("configmaps", ns), configmap("app-config", {"a": "1"}))
    created = kube.create(
        _path(kind, ns), custom_workload(kind, "web", _spec_reading("app-config"))
    )
    # admission stamped it, and the API server kept the stamp (the CRD's schema allows it)
    first = _sources(created)
    assert list(first) == ["configmap/app-config"]
    assert _volume_name(created) == "app-config"

    kube.patch(path("configmaps", ns, "app-config"), {"data": {"a": "2"}}, MERGE_PATCH)
    rolled = wait_for(
        lambda: (o := kube.get(_path(kind, ns, "web"))) and _sources(o) != first and o,
        what=f"{kind} re-stamped",
    )
    assert list(_sources(rolled)) == ["configmap/app-config"]
    assert ANN_ROLLED_AT in rolled["metadata"]["annotations"]
    wait_for(lambda: cp.metric("configpin_rollouts_total", kind=kind) >= 1, what="counted")


def _copies(kube: Kube, ns: str) -> dict[str, dict[str, Any]]:
    found = kube.get(path("configmaps", ns), labelSelector=f"{LABEL_SNAPSHOT}=true")
    return {c["metadata"]["name"]: c for c in found.get("items") or ()}


def _owner_kinds(copy: dict[str, Any]) -> set[tuple[str, str]]:
    return {(r["kind"], r["name"]) for r in copy["metadata"].get("ownerReferences") or ()}


@pytest.mark.parametrize("kind", ["Rollout", "CloneSet"])
def test_snapshot_mode_copies_owned_while_pointed_at_and_collected(
    k8s: client.ApiClient, ns: str, kind: str
) -> None:
    kube = Kube(k8s)
    kube.create(path("configmaps", ns), configmap("app-config", {"a": "1"}))
    created = kube.create(
        _path(kind, ns),
        custom_workload(kind, "web", _spec_reading("app-config"), {ANN_MODE: "snapshot"}),
    )
    first = _volume_name(created)
    assert first.startswith("app-config-")
    assert first in _copies(kube, ns)
    # the workload owns the copy its template points at (as a CronJob does)
    wait_for(
        lambda: (kind, "web") in _owner_kinds(_copies(kube, ns)[first]),
        what=f"{first} owned by the {kind}",
    )

    kube.patch(path("configmaps", ns, "app-config"), {"data": {"a": "2"}}, MERGE_PATCH)
    rolled = wait_for(
        lambda: (o := kube.get(_path(kind, ns, "web"))) and _volume_name(o) != first and o,
        what=f"{kind} re-pointed at a new copy",
    )
    second = _volume_name(rolled)
    assert second.startswith("app-config-")
    wait_for(
        lambda: (kind, "web") in _owner_kinds(_copies(kube, ns)[second]),
        what=f"{second} owned by the {kind}",
    )
    # the old copy is let go (its revisions, Argo's ReplicaSets or Kruise's
    # ControllerRevisions, would hold it; here there are none): the sweep's to collect
    wait_for(
        lambda: (kind, "web") not in _owner_kinds(_copies(kube, ns).get(first) or _NO_COPY),
        what=f"{first} no longer owned by the {kind}",
    )

    # deleting the workload: the garbage collector removes the copy it owned
    kube.delete(_path(kind, ns, "web"), {"propagationPolicy": "Background"})
    wait_for(lambda: second not in _copies(kube, ns), timeout=120, what=f"{second} collected")


_NO_COPY: dict[str, Any] = {"metadata": {}}


def test_workload_ref_rollout_is_handled_as_its_deployment(k8s: client.ApiClient, ns: str) -> None:
    kube = Kube(k8s)
    kube.create(path("configmaps", ns), configmap("app-config", {"a": "1"}))
    dep = kube.create(path("deployments", ns), deployment("web"))
    first = _sources(dep)
    assert list(first) == ["configmap/app-config"]
    rollout = {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Rollout",
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "web"}},
            "workloadRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
        },
    }
    created = kube.create(_path("Rollout", ns), rollout)
    # Argo refuses a workloadRef Rollout whose template carries labels or annotations
    assert "template" not in created["spec"]

    kube.patch(path("configmaps", ns, "app-config"), {"data": {"a": "2"}}, MERGE_PATCH)
    wait_for(
        lambda: _sources(kube.get(path("deployments", ns, "web"))) != first,
        what="the referenced Deployment re-stamped",
    )
    assert "template" not in kube.get(_path("Rollout", ns, "web"))["spec"]


def _events(kube: Kube, ns: str, name: str) -> dict[str, dict[str, Any]]:
    found = kube.get(
        f"/apis/events.k8s.io/v1/namespaces/{ns}/events", fieldSelector=f"regarding.name={name}"
    )
    return {
        e["reason"]: e
        for e in found.get("items") or ()
        if e.get("reportingController") == "configpin.io/configpin"
    }


def _owned_by(owner: dict[str, Any], name: str, annotations: dict[str, str] | None = None) -> Any:
    dep = deployment(name, annotations=annotations)
    dep["metadata"]["ownerReferences"] = [
        {
            "apiVersion": owner["apiVersion"],
            "kind": owner["kind"],
            "name": owner["metadata"]["name"],
            "uid": owner["metadata"]["uid"],
            "controller": True,
        }
    ]
    return dep


def test_operator_owned_skipped_with_an_event_and_pinned_when_opted_in(
    k8s: client.ApiClient, ns: str, cp: Configpin
) -> None:
    kube = Kube(k8s)
    kube.create(path("configmaps", ns), configmap("app-config", {"a": "1"}))
    # an operator's object as the owner (any kind configpin does not pin itself; it exists,
    # so the garbage collector leaves the Deployments be)
    owner = kube.create(path("configmaps", ns), configmap("operator-state", {"x": "1"}))
    before = cp.metric("configpin_owned_workloads_skipped_total")
    skipped = kube.create(path("deployments", ns), _owned_by(owner, "operated"))
    assert _sources(skipped) == {}
    note = wait_for(lambda: _events(kube, ns, "operated").get("SkippedOwned"), what="SkippedOwned")[
        "note"
    ]
    assert "owned by ConfigMap operator-state" in note
    assert f"{ANN_OWNED}: pin" in note
    assert cp.metric("configpin_owned_workloads_skipped_total") >= before + 1

    pinned = kube.create(path("deployments", ns), _owned_by(owner, "opted-in", {ANN_OWNED: "pin"}))
    first = _sources(pinned)
    assert list(first) == ["configmap/app-config"]
    # the operator puts its own template back (configpin's record dropped): admitted with the
    # record restored, so nothing is stale and nothing rolls (the same generation); the
    # source's change then rolls it once: one new ReplicaSet. (Not counted in generations: a
    # Deployment's generation also moves when only its own annotations change, as configpin's
    # rollout record does when the rollout ends.)
    reverted = kube.patch(
        path("deployments", ns, "opted-in"),
        {"spec": {"template": {"metadata": {"annotations": {ANN_SOURCES: None}}}}},
        MERGE_PATCH,
    )
    assert _sources(reverted) == first
    assert reverted["metadata"]["generation"] == pinned["metadata"]["generation"]
    kube.patch(path("configmaps", ns, "app-config"), {"data": {"a": "2"}}, MERGE_PATCH)
    wait_for(
        lambda: state(kube.get(path("deployments", ns, "opted-in"))) == "left",
        what="the opted-in Deployment re-stamped, and its rollout over (it has no replicas)",
    )
    time.sleep(SETTLE)  # a second rollout would have started by now
    settled = wait_for(
        lambda: (
            (d := kube.get(path("deployments", ns, "opted-in")))
            and d["status"].get("observedGeneration") == d["metadata"]["generation"]
            and d
        ),
        what="the Deployment controller caught up",
    )
    assert _sources(settled) != first
    assert replicasets(kube, ns, "opted-in") == 2
    assert revision(settled) == 2
    # the one left to its operator is still unpinned
    assert _sources(kube.get(path("deployments", ns, "operated"))) == {}


def test_an_opt_in_on_a_deployment_does_not_reach_its_replicasets(
    k8s: client.ApiClient, ns: str
) -> None:
    """The Deployment controller copies a Deployment's annotations onto its ReplicaSets: the
    opt-in written there must not make configpin stamp them (their owner's template rules)."""
    kube = Kube(k8s)
    kube.create(path("configmaps", ns), configmap("app-config", {"a": "1"}))
    kube.create(path("deployments", ns), deployment("web", annotations={ANN_OWNED: "pin"}))
    [rs] = wait_for(lambda: kube.get(path("replicasets", ns)).get("items"), what="the ReplicaSet")
    assert rs["metadata"]["annotations"].get(ANN_OWNED) == "pin"
    dep = kube.get(path("deployments", ns, "web"))
    # the ReplicaSet's template is the Deployment's, record and all: nothing of its own
    assert _template_annotations(rs) == _template_annotations(dep)


def test_status_reports_custom_kinds(
    k8s: client.ApiClient, ns: str, control_plane: ControlPlane
) -> None:
    kube = Kube(k8s)
    kube.create(path("configmaps", ns), configmap("app-config", {"a": "1"}))
    kube.create(
        _path("CloneSet", ns), custom_workload("CloneSet", "clones", _spec_reading("app-config"))
    )
    kube.create(path("deployments", ns), deployment("web"))
    rollout = {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Rollout",
        "metadata": {"name": "web"},
        "spec": {"workloadRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"}},
    }
    kube.create(_path("Rollout", ns), rollout)
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "webhook",
            "status",
            "-n",
            ns,
            "-o",
            "json",
            "--kubeconfig",
            str(control_plane.kubeconfig),
            "--workload-kinds",
            CLONESET,
        ],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    rows = {(r["kind"], r["name"]): r for r in json.loads(out.stdout)}
    assert rows[("CloneSet", "clones")]["state"] == "current"
    assert rows[("Deployment", "web")]["state"] == "current"
    assert "workloadRef" in rows[("Rollout", "web")]["reason"]
    assert rows[("Rollout", "web")]["state"] == "not-pinned"


def test_a_kind_not_served_is_left_alone_then_watched_once_served(
    k8s: client.ApiClient, ns: str, cp: Configpin
) -> None:
    """A configured kind whose CRD is not installed is no error: discovery leaves it out;
    once its CRD is installed, the next resync watches it."""
    kube = Kube(k8s)
    configured = parse_custom_kinds(f"{CLONESET},{WIDGET}")
    before = custom_kinds()
    use_custom_kinds(configured)
    try:
        assert {k.kind for k in served_custom_kinds(kube)} == {"CloneSet"}
    finally:
        use_custom_kinds(before)
    assert "Traceback" not in cp.log()

    kube.create(path("configmaps", ns), configmap("app-config", {"a": "1"}))
    with installed(k8s, WIDGET_CRD):
        wait_for(lambda: "Widget is served now" in cp.log(), what="configpin watching Widgets")
        created = kube.create(
            _path("Widget", ns), custom_workload("Widget", "w", _spec_reading("app-config"))
        )
        first = _sources(created)
        assert list(first) == ["configmap/app-config"]
        kube.patch(path("configmaps", ns, "app-config"), {"data": {"a": "2"}}, MERGE_PATCH)
        wait_for(
            lambda: _sources(kube.get(_path("Widget", ns, "w"))) != first,
            what="the Widget re-stamped",
        )
