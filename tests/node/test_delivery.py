"""Safe delivery on a real node, asserted by what the application pods read: a change whose
content makes the application unready is undone (snapshot mode) and every pod reads the old
content, Ready; in checksum mode the failed first wave holds the change, and the workloads of
the later waves keep running on the old content (their environment). The reader's readiness
depends on its config (harness/apps.py: content with `invalid` in it makes it unready), as a
real application's would.

The chart's defaults: waves `1,10%,100%`, undo in snapshot mode, hold in checksum mode."""

from __future__ import annotations

import time
from typing import Any

import pytest
from kubernetes import client

from harness import images
from harness.apps import (
    deployment_rolled_out,
    is_ready,
    last_seen,
    reader_workload,
    wait_all_read,
    wait_deployment,
    workload_pods,
)
from harness.controlplane import wait_for
from harness.release import Release
from webhook.core.constants import ANN_MODE, ANN_REJECTED, ANN_ROLLOUT, MODE_SNAPSHOT

pytestmark = pytest.mark.usefixtures("pinned")

DEADLINE = 15  # the Deployments' progressDeadlineSeconds
SETTLE = 5.0


def _settings(
    api: client.ApiClient, namespace: str, greeting: str, *, create: bool = False
) -> None:
    core = client.CoreV1Api(api)
    if create:
        body = {"metadata": {"name": "settings"}, "data": {"greeting": greeting}}
        core.create_namespaced_config_map(namespace, body)
    else:
        core.patch_namespaced_config_map("settings", namespace, {"data": {"greeting": greeting}})


def _app(name: str, **kw: Any) -> dict[str, Any]:
    app = reader_workload("Deployment", name, images.SHELL.ref, configmap="settings", **kw)
    app["spec"]["progressDeadlineSeconds"] = DEADLINE
    return app


def _annotations(api: client.ApiClient, namespace: str, name: str) -> dict[str, str]:
    d = client.AppsV1Api(api).read_namespaced_deployment(name, namespace)
    return dict(d.metadata.annotations or {})


def _events(api: client.ApiClient, namespace: str, reason: str) -> list[Any]:
    items = client.CoreV1Api(api).list_namespaced_event(namespace).items
    return [e for e in items if e.reason == reason]


def _template_config(api: client.ApiClient, namespace: str, name: str) -> str:
    d = client.AppsV1Api(api).read_namespaced_deployment(name, namespace)
    [volume] = [v for v in d.spec.template.spec.volumes if v.name == "config"]
    return str(volume.config_map.name)


def _rolled_out_reading(
    api: client.ApiClient, namespace: str, name: str, key: str, value: str
) -> bool:
    """`name` rolled out, and every pod of it read `value` last."""
    if deployment_rolled_out(api, namespace, name) is None:
        return False
    pods = workload_pods(api, namespace, name)
    return bool(pods) and all(
        (s := last_seen(api, namespace, p.metadata.name)) is not None and s.values.get(key) == value
        for p in pods
    )


def _all_ready_reading(
    api: client.ApiClient, namespace: str, name: str, key: str, value: str
) -> None:
    """Every pod of `name` is Ready and what it read last is `value`: none reads anything else."""
    for pod in workload_pods(api, namespace, name):
        assert is_ready(pod), pod.metadata.name
        seen = last_seen(api, namespace, pod.metadata.name)
        assert seen is not None and seen.values[key] == value, (pod.metadata.name, seen)


def test_a_change_that_makes_the_application_unready_is_undone_and_its_pods_read_the_old_content(
    k8s: client.ApiClient, snapshots: Release, namespace: str
) -> None:
    _settings(k8s, namespace, "good", create=True)
    app = _app("app", files=["greeting"], annotations={ANN_MODE: MODE_SNAPSHOT})
    client.AppsV1Api(k8s).create_namespaced_deployment(namespace, app)
    wait_deployment(k8s, namespace, "app")
    first = _template_config(k8s, namespace, "app")
    wait_all_read(k8s, namespace, "app", {"file:/config/greeting": "good"})

    _settings(k8s, namespace, "invalid")
    # The new revision's pod reads the new copy, and is not Ready: the rollout cannot progress.
    wait_for(
        lambda: _template_config(k8s, namespace, "app") != first, timeout=60, what="re-stamped"
    )
    wait_for(
        lambda: any(
            (s := last_seen(k8s, namespace, p.metadata.name)) is not None
            and s.file("/config/greeting") == "invalid"
            for p in workload_pods(k8s, namespace, "app")
        ),
        timeout=90,
        what="a pod of the new revision reading the new content",
    )
    # The Deployment controller says the deadline passed; configpin undoes.
    wait_for(
        lambda: _template_config(k8s, namespace, "app") == first,
        timeout=DEADLINE + 90,
        what="the template back on the first copy",
    )
    wait_deployment(k8s, namespace, "app")
    wait_all_read(k8s, namespace, "app", {"file:/config/greeting": "good"})
    _all_ready_reading(k8s, namespace, "app", "file:/config/greeting", "good")
    annotations = _annotations(k8s, namespace, "app")
    assert '"state":"failed"' in annotations[ANN_ROLLOUT].replace(" ", "")
    assert ANN_REJECTED in annotations
    assert _events(k8s, namespace, "ConfigRolledBack")
    # The source is the user's: configpin leaves it as they wrote it, and does not roll to it.
    source = client.CoreV1Api(k8s).read_namespaced_config_map("settings", namespace)
    assert source.data == {"greeting": "invalid"}
    time.sleep(SETTLE)
    assert _template_config(k8s, namespace, "app") == first

    # The fix is a new change: it rolls as usual.
    _settings(k8s, namespace, "fixed")
    wait_for(
        lambda: _template_config(k8s, namespace, "app") not in (first,),
        timeout=60,
        what="the fix re-stamped",
    )
    wait_deployment(k8s, namespace, "app")
    wait_all_read(k8s, namespace, "app", {"file:/config/greeting": "fixed"}, timeout=90)
    _all_ready_reading(k8s, namespace, "app", "file:/config/greeting", "fixed")


def test_a_failed_first_wave_holds_the_change_and_the_other_workloads_keep_the_old_content(
    k8s: client.ApiClient, configpin: Release, namespace: str
) -> None:
    """Checksum mode, three Deployments reading the greeting from their environment (what a
    running container cannot be changed under: only a rollout brings it)."""
    _settings(k8s, namespace, "good", create=True)
    names = ("one", "two", "three")
    apps = client.AppsV1Api(k8s)
    for name in names:
        apps.create_namespaced_deployment(
            namespace, _app(name, env={"GREETING": "greeting"}, replicas=1)
        )
    for name in names:
        wait_deployment(k8s, namespace, name)
        wait_all_read(k8s, namespace, name, {"env:GREETING": "good"})

    _settings(k8s, namespace, "invalid")

    def rolled() -> list[str]:
        return [n for n in names if ANN_ROLLOUT in _annotations(k8s, namespace, n)]

    [first] = wait_for(rolled, timeout=60, what="the first wave")
    rest = [n for n in names if n != first]
    wait_for(
        lambda: (
            '"state":"failed"' in _annotations(k8s, namespace, first)[ANN_ROLLOUT].replace(" ", "")
        ),
        timeout=DEADLINE + 90,
        what="the first wave failed",
    )
    assert _events(k8s, namespace, "ConfigRolloutFailed")
    time.sleep(SETTLE)
    assert rolled() == [first]  # held: no later wave
    for name in rest:
        _all_ready_reading(k8s, namespace, name, "env:GREETING", "good")

    # The fix is a new change: every workload rolls to it, the held one too.
    _settings(k8s, namespace, "fixed")
    for name in names:  # in waves: one, then the rest, each once the one before is complete
        wait_for(
            lambda n=name: _rolled_out_reading(k8s, namespace, n, "env:GREETING", "fixed"),
            timeout=180,
            interval=1.0,
            what=f"{name} rolled out, every pod reading the fix",
        )
