"""configpin and Stakater Reloader running side by side (shared/SPEC.md "Coming from Reloader"):
one restart for one change, whoever sees it first; and `kubectl configpin migrate`, which reads
every Reloader form and changes nothing.

Two configpin replicas of instance `reloader` run as the chart runs them (one Lease, the webhook
registered from the chart's own entry). A stand-in Reloader (harness/reloader.py) watches the
test's namespace and patches pod templates as Reloader does, with its `env-vars` strategy (the
default) or its `annotations` one; with `delay`, it acts seconds after configpin's coalescing
window has passed, so that configpin would act first. The fake `Kubelet` marks the pods Ready.

- Reloader first: its template write goes through configpin's admission, which stamps the new
  digests: configpin finds the workload current, one new ReplicaSet;
- configpin first: it leaves the change to Reloader (a LeftToReloader Event, `configpin status`
  says left-to-reloader and names the annotation), Reloader's write rolls it, one new
  ReplicaSet;
- a source Reloader ignores is rolled by configpin, once; the workload's other source, which
  Reloader rolls it for, still once;
- `configpin migrate -A` on a cluster holding every Reloader form: every object's
  resourceVersion is the same after it, and each form is reported.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from kubernetes import client

from harness.controlplane import ControlPlane, wait_for
from harness.kubelet import Kubelet
from harness.manifests import configmap, container, deployment, env_from, env_key_ref, pod_spec
from harness.manifests import secret as secret_manifest
from harness.reloader import Reloader, env_name
from tests.integration.instances import replicas_fixtures
from tests.integration.workloads import (
    get,
    kubectl_configpin,
    notes,
    quiet,
    replicasets,
    sources,
    stamped,
    status,
    wait_healthy,
)
from webhook.core.constants import ANN_EXTRA_SOURCES
from webhook.core.kinds import builtin
from webhook.kube.raw import MERGE_PATCH, Kube, path
from webhook.kube.workloads import served_prefix

RESYNC = 2.0
COALESCE = 1.0
ARGS = [
    "--coalesce-window", str(COALESCE),
    "--min-rollout-interval", "0",
    "--resync-period", str(RESYNC),
    "--lease-duration", "4",
]  # fmt: skip
AUTO = {"reloader.stakater.com/auto": "true"}
IGNORE = {"reloader.stakater.com/ignore": "true"}
RELOAD = "configmap.reloader.stakater.com/reload"
LATE = 6.0  # seconds the stand-in waits: configpin's window ends first, a resync passes

replicas, ns = replicas_fixtures("reloader", ARGS)


def _app(name: str, annotations: dict[str, str], *sources: str) -> dict[str, Any]:
    """Deployment `name`, one replica, reading key `a` of each ConfigMap of `sources`."""
    env = [env_key_ref("configmap", s, "a", f"V{i}") for i, s in enumerate(sources or ("cfg",))]
    return deployment(name, pod_spec(container(env=env)), replicas=1, annotations=annotations)


def _set(kube: Kube, ns: str, name: str, value: str) -> None:
    kube.patch(path("configmaps", ns, name), {"data": {"a": value}}, content_type=MERGE_PATCH)


def _rolled_once_more(kube: Kube, ns: str, name: str, before: dict[str, str], sets: int) -> None:
    """`name` moved on from `before` to `sets` ReplicaSets, and stays so over resyncs."""
    wait_for(lambda: sources(get(kube, ns, name)) != before, timeout=60, what=f"{name} rolled")
    wait_healthy(kube, ns, [name])
    quiet(kube, ns, {name: sources(get(kube, ns, name))}, 3 * RESYNC)
    assert replicasets(kube, ns, name) == sets


def _reloaders_mark(obj: dict[str, Any], strategy: str, source: str) -> bool:
    """The template carries what the stand-in Reloader wrote for `source`."""
    template = obj["spec"]["template"]
    if strategy == "annotations":
        text = (template["metadata"].get("annotations") or {}).get(
            "reloader.stakater.com/last-reloaded-from"
        )
        return text is not None and json.loads(text)["name"] == source
    var = env_name(source, "ConfigMap")
    return any(e["name"] == var for c in template["spec"]["containers"] for e in c.get("env", []))


@pytest.mark.parametrize("strategy", ["env-vars", "annotations"])
def test_reloader_acting_first_restarts_it_once(kube: Kube, ns: str, strategy: str) -> None:
    """Verified as it was before configpin knew Reloader: admission stamps Reloader's write."""
    kube.create(path("configmaps", ns), configmap("cfg", {"a": "1"}))
    with Kubelet(kube, ns) as kubelet, Reloader(kube, ns, strategy=strategy) as reloader:
        kubelet.allow("web")
        kube.create(path("deployments", ns), _app("web", AUTO))
        first = sources(stamped(kube, ns, "web"))
        wait_healthy(kube, ns, ["web"])
        _set(kube, ns, "cfg", "2")
        _rolled_once_more(kube, ns, "web", first, 2)
        assert reloader.patched == [("Deployment", "web", "configmap/cfg")], reloader.errors
        assert _reloaders_mark(get(kube, ns, "web"), strategy, "cfg")
        _set(kube, ns, "cfg", "3")  # and again
        _rolled_once_more(kube, ns, "web", sources(get(kube, ns, "web")), 3)
        assert len(reloader.patched) == 2


@pytest.mark.parametrize(
    ("strategy", "annotations", "words"),
    [
        ("env-vars", AUTO, "reloader.stakater.com/auto on the workload"),
        (
            "annotations",
            {RELOAD: "settings", ANN_EXTRA_SOURCES: "configmap/settings"},
            "configmap.reloader.stakater.com/reload on the workload",
        ),
    ],
)  # fmt: skip
def test_configpin_leaves_the_change_to_a_slower_reloader(
    kube: Kube,
    control_plane: ControlPlane,
    ns: str,
    strategy: str,
    annotations: dict[str, str],
    words: str,
) -> None:
    """The second form names a source the pod spec does not reference (Reloader's `reload`,
    configpin's extra-sources): both would roll it for its change."""
    source = "settings" if RELOAD in annotations else "cfg"
    kube.create(path("configmaps", ns), configmap("cfg", {"a": "1"}))
    kube.create(path("configmaps", ns), configmap("settings", {"a": "1"}))
    with (
        Kubelet(kube, ns) as kubelet,
        Reloader(kube, ns, strategy=strategy, delay=LATE) as reloader,
    ):
        kubelet.allow("web")
        kube.create(path("deployments", ns), _app("web", annotations))
        first = sources(stamped(kube, ns, "web"))
        assert f"configmap/{source}" in first
        wait_healthy(kube, ns, ["web"])
        changed = time.monotonic()
        _set(kube, ns, source, "2")
        wait_for(
            lambda: notes(kube, ns, "web", "LeftToReloader"), timeout=30, what="LeftToReloader"
        )
        [note] = notes(kube, ns, "web", "LeftToReloader")
        assert f"configmap/{source}" in note and words in note
        row = status(control_plane, ns)["web"]
        if time.monotonic() - changed < LATE:  # (Reloader has not come yet)
            assert row["state"] == "left-to-reloader", row
            assert words in row["reason"] and "let configpin roll" in row["reason"]
        assert sources(get(kube, ns, "web")) == first  # configpin wrote nothing
        _rolled_once_more(kube, ns, "web", first, 2)
        assert reloader.patched == [("Deployment", "web", f"configmap/{source}")]
        assert _reloaders_mark(get(kube, ns, "web"), strategy, source)
        assert status(control_plane, ns)["web"]["state"] == "current"


def test_a_source_reloader_ignores_is_rolled_by_configpin_once(kube: Kube, ns: str) -> None:
    kube.create(path("configmaps", ns), configmap("cfg", {"a": "1"}))
    kube.create(path("configmaps", ns), configmap("legacy", {"a": "1"}, annotations=IGNORE))
    with Kubelet(kube, ns) as kubelet, Reloader(kube, ns, delay=LATE) as reloader:
        kubelet.allow("web")
        kube.create(path("deployments", ns), _app("web", AUTO, "cfg", "legacy"))
        first = sources(stamped(kube, ns, "web"))
        wait_healthy(kube, ns, ["web"])
        _set(kube, ns, "legacy", "2")  # Reloader leaves it: configpin's
        _rolled_once_more(kube, ns, "web", first, 2)
        time.sleep(LATE)  # (had the stand-in anything to do, it has done it)
        assert reloader.patched == []
        assert replicasets(kube, ns, "web") == 2
        second = sources(get(kube, ns, "web"))
        _set(kube, ns, "cfg", "2")  # Reloader's: left to it
        _rolled_once_more(kube, ns, "web", second, 3)
        assert reloader.patched == [("Deployment", "web", "configmap/cfg")]


# --- configpin migrate ---------------------------------------------------------------------------


def _workload(kind: str, name: str, spec: dict[str, Any], **annotations: str) -> dict[str, Any]:
    obj = deployment(name, spec, annotations=dict(annotations))
    obj["kind"] = kind
    if kind == "StatefulSet":
        obj["spec"]["serviceName"] = name
    if kind == "DaemonSet":
        obj["spec"].pop("replicas")
    return obj


def _versions(kube: Kube, namespaces: list[str], cronjobs: str) -> dict[str, str]:
    """Every object of the namespaces (and the namespaces), by kind and name: its version."""
    out: dict[str, str] = {}
    resources = [
        ("configmaps", None), ("secrets", None), ("deployments", None),
        ("statefulsets", None), ("daemonsets", None), ("replicasets", None),
        ("cronjobs", cronjobs), ("serviceaccounts", None), ("pods", None),
    ]  # fmt: skip
    for ns in namespaces:
        meta = kube.get(path("namespaces", None, ns, prefix="/api/v1"))["metadata"]
        out[f"namespace/{ns}"] = meta["resourceVersion"]
        for resource, prefix in resources:
            for item in kube.get(path(resource, ns, prefix=prefix)).get("items") or ():
                key = f"{resource}/{ns}/{item['metadata']['name']}"
                out[key] = item["metadata"]["resourceVersion"]
    return out


def _settled(kube: Kube, namespaces: list[str], cronjobs: str) -> dict[str, str]:
    """The versions once the controllers have done with what was created (two reads alike)."""
    last: dict[str, dict[str, str]] = {}

    def still() -> bool:
        now = _versions(kube, namespaces, cronjobs)
        same = now == last.get("v")
        last["v"] = now
        return same

    wait_for(still, timeout=60, interval=2.0, what="the namespaces settled")
    return last["v"]


def test_migrate_reports_every_form_and_changes_nothing(
    kube: Kube, k8s: client.ApiClient, control_plane: ControlPlane, ns: str
) -> None:
    cronjob_kind = builtin("CronJob")
    assert cronjob_kind is not None
    cronjobs = served_prefix(kube, cronjob_kind)
    assert cronjobs is not None
    cm, sec = "configmap", "secret"
    reads = pod_spec(
        container(env=[env_key_ref(cm, "cfg", "a", "A")], env_from=[env_from(sec, "token")])
    )
    marks = {"matched": {"reloader.stakater.com/match": "true"}, "legacy": IGNORE}
    for name in ("cfg", "matched", "legacy", "settings"):
        kube.create(
            path("configmaps", ns), configmap(name, {"a": "1"}, annotations=marks.get(name))
        )
    kube.create(path("secrets", ns), secret_manifest("token", {"t": "1"}))
    ignored = secret_manifest("ignored", {"t": "1"})
    ignored["metadata"]["annotations"] = dict(IGNORE)
    kube.create(path("secrets", ns), ignored)
    forms = {
        "auto": AUTO,
        "typed": {
            "configmap.reloader.stakater.com/auto": "true",
            "secret.reloader.stakater.com/auto": "true",
        },
        "named": {
            "configmap.reloader.stakater.com/reload": "cfg,settings",
            "secret.reloader.stakater.com/reload": "token",
        },
        "pattern": {"configmap.reloader.stakater.com/reload": "set.*"},
        "search": {
            "reloader.stakater.com/search": "true",
            "configmaps.exclude.reloader.stakater.com/reload": "legacy",
        },
        "paused": {**AUTO, "deployment.reloader.stakater.com/pause-period": "5m"},
    }
    for name, asked in forms.items():
        kube.create(path("deployments", ns), _workload("Deployment", name, reads, **asked))
    kube.create(path("statefulsets", ns), _workload("StatefulSet", "sts", reads, **AUTO))
    daemon = _workload("DaemonSet", "ds", reads)
    daemon["spec"]["template"]["metadata"]["annotations"] = dict(AUTO)
    kube.create(path("daemonsets", ns), daemon)
    job_spec = {**reads, "restartPolicy": "Never"}
    cron = {
        "apiVersion": cronjobs.removeprefix("/apis/"),
        "kind": "CronJob",
        "metadata": {"name": "nightly", "annotations": AUTO},
        "spec": {
            "schedule": "0 3 * * *",
            "jobTemplate": {"spec": {"template": {"spec": job_spec}}},
        },
    }
    kube.create(path("cronjobs", ns, prefix=cronjobs), cron)
    core = client.CoreV1Api(k8s)
    other = f"{ns}-out"
    core.create_namespace({"metadata": {"name": other}})  # not opted in
    try:
        wait_for(lambda: core.list_namespaced_service_account(other).items, what="its SA")
        kube.create(path("configmaps", other), configmap("cfg", {"a": "1"}))
        kube.create(path("deployments", other), _workload("Deployment", "web", reads, **AUTO))
        before = _settled(kube, [ns, other], cronjobs)
        text = kubectl_configpin(["migrate", "-A"], control_plane.kubeconfig)
        done = kubectl_configpin(["migrate", "-n", ns, "-o", "json"], control_plane.kubeconfig)
        assert _versions(kube, [ns, other], cronjobs) == before  # nothing changed
    finally:
        core.delete_namespace(other)
    assert text.returncode == 0, text.stderr
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    found = {(s["kind"], s["name"]): s for s in report["subjects"]}
    assert set(found) == {
        *(("Deployment", n) for n in forms),
        ("StatefulSet", "sts"), ("DaemonSet", "ds"), ("CronJob", "nightly"),
        ("ConfigMap", "matched"), ("ConfigMap", "legacy"), ("Secret", "ignored"),
    }  # fmt: skip

    def verdict(kind: str, name: str, key: str) -> dict[str, Any]:
        return next(f for f in found[(kind, name)]["findings"] if f["annotation"].startswith(key))

    assert verdict("Deployment", "auto", "reloader.stakater.com/auto")["verdict"] == "same"
    named = verdict("Deployment", "named", "configmap.reloader.stakater.com/reload")
    assert named["commands"] == [
        f"kubectl annotate -n {ns} deployment/named {ANN_EXTRA_SOURCES}=configmap/settings"
    ]
    pattern = verdict("Deployment", "pattern", "configmap.reloader.stakater.com/reload")
    assert pattern["verdict"] == "differently"
    assert pattern["commands"] == [
        f"kubectl annotate -n {ns} deployment/pattern {ANN_EXTRA_SOURCES}=configmap/settings"
    ]
    assert verdict("Deployment", "search", "reloader.stakater.com/search")["verdict"] == (
        "differently"
    )
    assert verdict("Deployment", "paused", "deployment.reloader")["verdict"] == "differently"
    assert "(on its pod template)" in found[("DaemonSet", "ds")]["findings"][0]["annotation"]
    assert verdict("CronJob", "nightly", "reloader.stakater.com/auto")["verdict"] == "differently"
    assert verdict("ConfigMap", "legacy", "reloader.stakater.com/ignore")["commands"] == [
        f"kubectl annotate -n {ns} configmap/legacy configpin.io/ignore=true"
    ]
    assert "left to Reloader" in found[("Deployment", "auto")]["both_run"]
    assert report["opt_in"] == []  # (its one namespace is opted in)
    assert f"kubectl label namespace {other} configpin.io/enabled=true" in text.stdout
    assert f"Deployment {other}/web" in text.stdout
