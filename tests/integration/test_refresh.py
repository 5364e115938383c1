"""on-change: refresh, end to end: configpin (webhook and controller, the webhook registered
as the chart registers it) against the real API server and controller-manager, whose
ReplicaSet controller creates the pods. There is no kubelet: what is tested is what
configpin does, that each pod carries the annotation that makes a kubelet sync its volumes
at once, and that nothing rolls.

This module runs its own configpin (instance `refresh`) with a short coalescing window and
no minimum interval; its namespaces carry the instance label, so no other configpin acts
there.
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
    instance_namespace,
    leading_configpin,
    running_configpin,
)
from harness.controlplane import (
    ControlPlane,
    default_service_account_ready,
    server_minor,
    wait_for,
)
from harness.manifests import configmap, container, deployment, env_key_ref
from tests.integration.instances import instance_fixtures
from tests.integration.test_least_privilege import (  # the chart's RBAC, live
    Install,
    admin,  # noqa: F401 (a fixture)
    install,  # noqa: F401 (a fixture)
)
from tests.timing import SETTLE, WINDOW
from webhook.core.constants import (
    ANN_OBSERVED,
    ANN_ON_CHANGE,
    ANN_REFRESHED,
    ANN_SOURCES,
)
from webhook.kube.raw import MERGE_PATCH, Kube, path

INSTANCE = "refresh"
ARGS = ["--coalesce-window", str(WINDOW), "--min-rollout-interval", "0"]


cp, ns = instance_fixtures(INSTANCE, "refresh", ARGS)


# --- builders and reads


def _refreshing(
    name: str, *, replicas: int = 3, env: bool = False, sub_path: bool = False
) -> dict[str, Any]:
    """Deployment `name` (on-change: refresh) mounting key `a` of ConfigMap app-config as a
    directory (`items`: key `b` is not consumed); `env`: key `a` in an env var too;
    `sub_path`: mounted through subPath instead."""
    c = container(env=[env_key_ref("configmap", "app-config", "a", "A")] if env else ())
    mount: dict[str, Any] = {"name": "cfg", "mountPath": "/etc/app"}
    if sub_path:
        mount |= {"mountPath": "/etc/app/a", "subPath": "a"}
    c["volumeMounts"] = [mount]
    items = [{"key": "a", "path": "a"}]
    volume = {"name": "cfg", "configMap": {"name": "app-config", "items": items}}
    spec = {"containers": [c], "volumes": [volume]}
    return deployment(name, spec, replicas=replicas, annotations={ANN_ON_CHANGE: "refresh"})


def _annotations(obj: dict[str, Any]) -> dict[str, str]:
    return (obj.get("metadata") or {}).get("annotations") or {}


def _template_sources(obj: dict[str, Any]) -> str | None:
    return _annotations(obj["spec"]["template"]).get(ANN_SOURCES)


def _versions(kube: Kube, ns: str, app: str) -> dict[str, str]:
    return {p["metadata"]["name"]: p["metadata"]["resourceVersion"] for p in _pods(kube, ns, app)}


def _pods(kube: Kube, ns: str, app: str) -> list[dict[str, Any]]:
    items = kube.get(path("pods", ns), labelSelector=f"app={app}").get("items") or []
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


def _replicasets(kube: Kube, ns: str, app: str) -> int:
    return len(kube.get(path("replicasets", ns), labelSelector=f"app={app}").get("items") or ())


def _set_cm(kube: Kube, ns: str, data: dict[str, str]) -> None:
    kube.patch(path("configmaps", ns, "app-config"), {"data": data}, content_type=MERGE_PATCH)


def _events(kube: Kube, ns: str, name: str, reason: str) -> list[dict[str, Any]]:
    found = kube.get(
        f"/apis/events.k8s.io/v1/namespaces/{ns}/events", fieldSelector=f"regarding.name={name}"
    )
    return [e for e in found.get("items") or () if e.get("reason") == reason]


def _admitted_now(kube: Kube, ns: str, body: dict[str, Any]) -> dict[str, str]:
    """What admission records for this workload's sources now (a server-side dry run)."""
    probe = json.loads(json.dumps(body))
    probe["metadata"]["name"] = "probe"
    created = kube.create(path("deployments", ns), probe, dryRun="All")
    return dict(json.loads(_template_sources(created) or "{}"))


def _all_refreshed(kube: Kube, ns: str, app: str, n: int, record: str) -> bool:
    pods = _pods(kube, ns, app)
    return len(pods) == n and all(_annotations(p).get(ANN_REFRESHED) == record for p in pods)


def _start(kube: Kube, ns: str, body: dict[str, Any], n: int) -> dict[str, Any]:
    kube.create(path("configmaps", ns), configmap("app-config", {"a": "1", "b": "1"}))
    created = kube.create(path("deployments", ns), body)
    assert _template_sources(created), "pinned at admission"
    name = body["metadata"]["name"]
    wait_for(lambda: len(_pods(kube, ns, name)) == n, what=f"{n} pods of {name}")
    return created


# --- tests


def test_a_volume_change_refreshes_every_pod_and_rolls_nothing(
    cp: Configpin, kube: Kube, k8s: client.ApiClient, ns: str
) -> None:
    body = _refreshing("web")
    created = _start(kube, ns, body, 3)
    stamped = _template_sources(created)
    for pod in _pods(kube, ns, "web"):
        assert _annotations(pod)[ANN_SOURCES] == stamped  # from the template
        assert ANN_REFRESHED not in _annotations(pod)
    pods_before = cp.metric("configpin_pods_refreshed_total")
    pod_updates = cp.metric("configpin_admissions_total", kind="Pod", operation="UPDATE")

    _set_cm(kube, ns, {"a": "2"})
    changed_at = time.monotonic()

    def record() -> str | None:
        return _annotations(kube.get(path("deployments", ns, "web"))).get(ANN_REFRESHED)

    text = wait_for(record, timeout=15, what="the workload's refresh record")
    # what admission records for the new content (its cache has seen the change by now: the
    # controller that wrote the record shares it)
    expected = _admitted_now(kube, ns, body)
    assert json.loads(text) == expected != json.loads(stamped or "{}")
    wait_for(
        lambda: _all_refreshed(kube, ns, "web", 3, text),
        timeout=15,
        what="every pod refreshed",
    )
    took = time.monotonic() - changed_at
    assert took < 15, f"refreshed within seconds, not after a kubelet sync ({took:.1f}s)"

    dep = kube.get(path("deployments", ns, "web"))
    assert _template_sources(dep) == stamped, "the pod template is left alone"
    assert _annotations(dep)[ANN_OBSERVED] == text
    time.sleep(SETTLE)
    assert _replicasets(kube, ns, "web") == 1, "no rollout"
    for pod in _pods(kube, ns, "web"):
        # provenance: started with the template's content, refreshed to the new one
        assert _annotations(pod)[ANN_SOURCES] == stamped
        assert _annotations(pod)[ANN_REFRESHED] == text
    assert cp.metric("configpin_pods_refreshed_total") == pods_before + 3
    [event] = wait_for(lambda: _events(kube, ns, "web", "Refreshed"), what="the Refreshed event")
    assert "configmap/app-config changed: 3 running pods" in event["note"]
    # the pod UPDATEs it made passed its own admission unchanged: owned pods are sent before
    # 1.28 and left alone; the chart's matchConditions keep them from the webhook after
    sent = cp.metric("configpin_admissions_total", kind="Pod", operation="UPDATE") - pod_updates
    assert sent == (0 if server_minor(k8s) >= 28 else 3)
    assert cp.metric("configpin_admissions_total", kind="Pod", result="patched") == 0

    # scale-up after the refresh: the new pods start with the refreshed content and say so
    kube.patch(path("deployments", ns, "web"), {"spec": {"replicas": 5}}, content_type=MERGE_PATCH)
    wait_for(
        lambda: _all_refreshed(kube, ns, "web", 5, text),
        timeout=20,
        what="the new pods marked with the content they start with",
    )
    assert _replicasets(kube, ns, "web") == 1
    assert cp.metric("configpin_pods_refreshed_total") == pods_before + 5

    # a second change: every pod again, still no rollout
    _set_cm(kube, ns, {"a": "3"})

    def moved() -> str | None:
        now = record()
        return now if now != text else None

    second = wait_for(moved, timeout=15, what="the second refresh")
    wait_for(lambda: _all_refreshed(kube, ns, "web", 5, second), timeout=15, what="5 refreshed")
    assert _replicasets(kube, ns, "web") == 1


LONG_WINDOW = 8.0


@pytest.fixture(scope="module")
def edge(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A configpin of its own with a long coalescing window (instance `refresh-edge`)."""
    with leading_configpin(
        control_plane,
        tmp_path_factory.mktemp("configpin-refresh-edge"),
        instance="refresh-edge",
        webhook_name="configpin-refresh-edge",
        args=["--coalesce-window", str(LONG_WINDOW), "--min-rollout-interval", "0"],
    ) as proc:
        yield proc


def test_the_first_change_refreshes_at_once_and_a_burst_makes_one_more_pass(
    edge: Configpin, kube: Kube, k8s: client.ApiClient
) -> None:
    """A leading edge: the first change is refreshed without waiting for the coalescing
    window (8 s here); the changes that follow within it make one more pass, with the last
    content, when it ends; a rolling workload beside it still waits the window, so that a
    burst rolls it once."""
    with instance_namespace(k8s, "refresh-edge", "edge") as ns:
        body = _refreshing("web", replicas=2)
        _start(kube, ns, body, 2)
        reads = container(env=[env_key_ref("configmap", "app-config", "a", "A")])
        kube.create(path("deployments", ns), deployment("roller", {"containers": [reads]}))

        def roller() -> str | None:
            return _template_sources(kube.get(path("deployments", ns, "roller")))

        rolled = wait_for(roller, what="the roller stamped")
        passes = edge.metric("configpin_pods_refreshed_total")

        def record() -> str | None:
            return _annotations(kube.get(path("deployments", ns, "web"))).get(ANN_REFRESHED)

        _set_cm(kube, ns, {"a": "2"})
        changed_at = time.monotonic()
        first = wait_for(record, timeout=LONG_WINDOW, interval=0.1, what="the first refresh")
        took = time.monotonic() - changed_at
        assert took < LONG_WINDOW / 2, f"refreshed {took:.1f}s after the change: it waited"
        assert roller() == rolled, "a rolling workload waits the window"
        # a burst within the window: one more pass when it ends, with the last content
        for value in ("3", "4", "5"):
            _set_cm(kube, ns, {"a": value})
            time.sleep(0.2)

        def moved() -> str | None:
            now = record()
            return now if now != first else None

        second = wait_for(moved, timeout=3 * LONG_WINDOW, interval=0.1, what="the pass after")
        assert json.loads(second) == _admitted_now(kube, ns, body), "with the last content"
        wait_for(lambda: _all_refreshed(kube, ns, "web", 2, second), timeout=15, what="refreshed")
        wait_for(lambda: roller() != rolled, timeout=3 * LONG_WINDOW, what="the roller re-stamped")
        time.sleep(2.0)
        assert edge.metric("configpin_pods_refreshed_total") == passes + 2 * 2, "two passes"
        assert _replicasets(kube, ns, "web") == 1
        assert _replicasets(kube, ns, "roller") == 2, "the burst rolled it once"


def test_a_statefulset_is_refreshed_without_a_new_revision(
    cp: Configpin, kube: Kube, ns: str
) -> None:
    body = _refreshing("db", replicas=2)
    body["kind"] = "StatefulSet"
    spec = body["spec"]
    spec |= {"serviceName": "db", "podManagementPolicy": "Parallel"}
    kube.create(path("configmaps", ns), configmap("app-config", {"a": "1", "b": "1"}))
    kube.create(path("statefulsets", ns), body)
    wait_for(lambda: len(_pods(kube, ns, "db")) == 2, what="2 pods of the StatefulSet")

    def revisions() -> int:
        found = kube.get(path("controllerrevisions", ns), labelSelector="app=db")
        return len(found.get("items") or ())

    assert revisions() == 1
    _set_cm(kube, ns, {"a": "2"})
    text = wait_for(
        lambda: _annotations(kube.get(path("statefulsets", ns, "db"))).get(ANN_REFRESHED),
        timeout=15,
        what="the refresh",
    )
    wait_for(lambda: _all_refreshed(kube, ns, "db", 2, text), timeout=15, what="both pods")
    time.sleep(SETTLE)
    assert revisions() == 1, "no new revision: nothing rolls"


def test_an_env_consumer_of_the_changed_key_rolls_and_says_why(
    cp: Configpin, kube: Kube, ns: str
) -> None:
    _start(kube, ns, _refreshing("envy", replicas=1, env=True), 1)
    before = cp.metric("configpin_refresh_fallbacks_total", reason="env")
    _set_cm(kube, ns, {"a": "2"})
    wait_for(lambda: _replicasets(kube, ns, "envy") == 2, timeout=15, what="a rollout")
    [event] = wait_for(
        lambda: _events(kube, ns, "envy", "RolledInsteadOfRefresh"), what="the reason, said"
    )
    assert event["type"] == "Normal"
    assert "configmap/app-config" in event["note"] and "through an env var" in event["note"]
    assert cp.metric("configpin_refresh_fallbacks_total", reason="env") == before + 1
    assert "on-change is refresh, but rolled" in cp.log()
    dep = kube.get(path("deployments", ns, "envy"))
    assert ANN_REFRESHED not in _annotations(dep)
    assert not any(ANN_REFRESHED in _annotations(p) for p in _pods(kube, ns, "envy"))


def test_a_subpath_mount_rolls(cp: Configpin, kube: Kube, ns: str) -> None:
    _start(kube, ns, _refreshing("sub", replicas=1, sub_path=True), 1)
    before = cp.metric("configpin_refresh_fallbacks_total", reason="subpath")
    _set_cm(kube, ns, {"a": "2"})
    wait_for(lambda: _replicasets(kube, ns, "sub") == 2, timeout=15, what="a rollout")
    assert cp.metric("configpin_refresh_fallbacks_total", reason="subpath") == before + 1


def test_a_key_it_does_not_consume_changes_nothing(cp: Configpin, kube: Kube, ns: str) -> None:
    _start(kube, ns, _refreshing("quiet", replicas=2), 2)
    pods_before = _versions(kube, ns, "quiet")
    refreshed = cp.metric("configpin_pods_refreshed_total")
    _set_cm(kube, ns, {"b": "2"})  # key b is not among the volume's items
    time.sleep(SETTLE)
    after = _versions(kube, ns, "quiet")
    assert after == pods_before, "no pod written"
    assert _replicasets(kube, ns, "quiet") == 1
    assert ANN_REFRESHED not in _annotations(kube.get(path("deployments", ns, "quiet")))
    assert cp.metric("configpin_pods_refreshed_total") == refreshed


def test_a_restart_after_a_refresh_refreshes_and_rolls_nothing(
    control_plane: ControlPlane, k8s: client.ApiClient, kube: Kube, tmp_path: Path
) -> None:
    instance = "refresh-restart"
    with instance_namespace(k8s, instance, "restart") as ns:
        with leading_configpin(
            control_plane, tmp_path / "first", instance=instance, webhook_name=instance, args=ARGS
        ):
            _start(kube, ns, _refreshing("web"), 3)
            _set_cm(kube, ns, {"a": "2"})
            text = wait_for(
                lambda: _annotations(kube.get(path("deployments", ns, "web"))).get(ANN_REFRESHED),
                timeout=15,
                what="the refresh",
            )
            wait_for(lambda: _all_refreshed(kube, ns, "web", 3, text), timeout=15, what="pods")
        pods = _versions(kube, ns, "web")
        dep = kube.get(path("deployments", ns, "web"))
        with leading_configpin(
            control_plane, tmp_path / "second", instance=instance, webhook_name=instance, args=ARGS
        ) as again:
            time.sleep(SETTLE)  # it checked every workload on taking the lead
            assert again.metric("configpin_pods_refreshed_total") == 0
            assert again.metric("configpin_refreshes_total") == 0
            assert again.metric("configpin_rollouts_total") == 0
            now = _versions(kube, ns, "web")
            assert now == pods
            after = kube.get(path("deployments", ns, "web"))
            assert _annotations(after) == _annotations(dep)
            assert after["spec"]["template"] == dep["spec"]["template"]
            assert _replicasets(kube, ns, "web") == 1


@pytest.mark.parametrize("granted", [True, False], ids=["granted", "withheld"])
def test_under_the_charts_rbac_and_policy(
    granted: bool,
    install: Any,  # noqa: F811
    admin: Kube,  # noqa: F811
    k8s: client.ApiClient,
    control_plane: ControlPlane,
    tmp_path: Path,
) -> None:
    """configpin as the chart's ServiceAccount, with only the chart's RBAC (and, on 1.30+,
    its ValidatingAdmissionPolicy). controller.refreshPods on: it refreshes. Off (no pods
    patch granted) but run with --refresh-pods all the same: the API server answers 403,
    and the workload rolls, with a warning."""
    values = {"controller": {"refreshPods": granted}}
    inst: Install = install(values)
    assert ("--refresh-pods" if granted else "--no-refresh-pods") in inst.args
    given = inst.flags
    kubeconfig = inst.kubeconfig(control_plane, k8s, tmp_path / "sa.kc")
    ns = inst.app_namespace()
    try:
        wait_for(lambda: default_service_account_ready(k8s, ns), what="the default SA")
        with running_configpin(
            control_plane,
            tmp_path / "cp",
            instance=inst.release,
            webhook_name=f"{inst.release}-webhook",
            args=[
                "--kubeconfig", str(kubeconfig),
                "--namespace", inst.namespace,
                "--lease-name", given["--lease-name"],
                "--digest-key-secret", given["--digest-key-secret"],
                "--refresh-pods",
                *ARGS,
            ],
        ) as cp:  # fmt: skip
            wait_for(lambda: cp.metric("configpin_leader") == 1, what="configpin leading")
            kube = admin
            _start(kube, ns, _refreshing("web", replicas=1), 1)
            _set_cm(kube, ns, {"a": "2"})
            if granted:
                text = wait_for(
                    lambda: _annotations(kube.get(path("deployments", ns, "web"))).get(
                        ANN_REFRESHED
                    ),
                    timeout=20,
                    what="the refresh",
                )
                wait_for(lambda: _all_refreshed(kube, ns, "web", 1, text), what="the pod")
                assert _replicasets(kube, ns, "web") == 1
                assert "Forbidden" not in cp.log() and "forbidden" not in cp.log()
                return
            wait_for(lambda: _replicasets(kube, ns, "web") == 2, timeout=20, what="a rollout")
            [event] = wait_for(
                lambda: _events(kube, ns, "web", "RolledInsteadOfRefresh"), what="the warning"
            )
            assert event["type"] == "Warning"
            assert "may not patch its pods" in event["note"]
            assert cp.metric("configpin_refresh_fallbacks_total", reason="forbidden") == 1
            assert not any(ANN_REFRESHED in _annotations(p) for p in _pods(kube, ns, "web"))
    finally:
        admin.delete(path("namespaces", name=ns))
