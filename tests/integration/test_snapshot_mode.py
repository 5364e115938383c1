"""Snapshot mode end to end: the real API server calls configpin, the real controller-manager
runs the Deployment, StatefulSet and DaemonSet controllers and the garbage collector.

The session configpin serves (checksum by default); each workload here opts into snapshot
mode with `configpin.io/mode: snapshot` on its own metadata.
"""

from __future__ import annotations

import contextlib
import copy
import json
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from harness.configpin import Configpin
from harness.controlplane import wait_for
from harness.manifests import configmap, secret
from webhook.core.kinds import builtin
from webhook.kube.errors import Conflict, Invalid, NotFound
from webhook.kube.raw import JSON_PATCH, MERGE_PATCH, Kube, path
from webhook.kube.workloads import served_prefix

SOURCES = "configpin.io/sources"
COPY = re.compile(r"^(?P<source>.+)-[0-9a-f]{10}$")

CRONJOB = builtin("CronJob")
assert CRONJOB is not None
# The session's configpin serves this module's namespaces.
pytestmark = pytest.mark.usefixtures("configpin")


# --- manifests


def pod_spec(cm: str = "app-config", sec: str = "app-secret") -> dict[str, Any]:
    return {
        "containers": [
            {
                "name": "app",
                "image": "registry.invalid/app:1",
                "envFrom": [{"configMapRef": {"name": cm}}],
                "env": [
                    {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": sec, "key": "token"}}}
                ],
                "volumeMounts": [{"name": "config", "mountPath": "/etc/app"}],
            }
        ],
        "volumes": [{"name": "config", "configMap": {"name": cm}}],
    }


def workload(kind: str, name: str, spec: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """A workload of `kind` in snapshot mode around pod spec `spec`."""
    labels = {"app": name}
    obj: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": kind,
        "metadata": {"name": name, "annotations": {"configpin.io/mode": "snapshot"}},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": spec},
            **extra,
        },
    }
    if kind == "StatefulSet":
        obj["spec"].setdefault("serviceName", name)
    return obj


def deployment(name: str = "web", spec: dict[str, Any] | None = None, **extra: Any) -> Any:
    # Recreate: pods never get ready here (no kubelet), so a rolling update would never scale
    # the old ReplicaSet down, and only scaled-down ReplicaSets fall to revisionHistoryLimit.
    extra.setdefault("strategy", {"type": "Recreate"})
    return workload("Deployment", name, spec or pod_spec(), replicas=1, **extra)


RESOURCES = {
    "ConfigMap": "configmaps",
    "Secret": "secrets",
    "Pod": "pods",
    "Job": "jobs",
    "Deployment": "deployments",
    "StatefulSet": "statefulsets",
    "DaemonSet": "daemonsets",
    "ReplicaSet": "replicasets",
    "ControllerRevision": "controllerrevisions",
}


# --- reading


def names_in(spec: dict[str, Any]) -> set[str]:
    """Every ConfigMap/Secret name the pod spec references (volumes, env, envFrom)."""
    found = {v["configMap"]["name"] for v in spec.get("volumes") or () if "configMap" in v}
    found |= {v["secret"]["secretName"] for v in spec.get("volumes") or () if "secret" in v}
    for c in spec["containers"]:
        for e in c.get("envFrom") or ():
            found |= {r["name"] for r in (e.get("configMapRef"), e.get("secretRef")) if r}
        for e in c.get("env") or ():
            ref = (e.get("valueFrom") or {}).get("configMapKeyRef") or (
                e.get("valueFrom") or {}
            ).get("secretKeyRef")
            if ref:
                found.add(ref["name"])
    return found


def copies_in(spec: dict[str, Any]) -> dict[str, str]:
    """source name -> copy name, for the references that point at copies."""
    out = {}
    for name in names_in(spec):
        m = COPY.match(name)
        if m and not name.startswith("default-token-"):
            out[m["source"]] = name
    return out


def get(kube: Kube, resource: str, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        return kube.get(path(resource, namespace, name))
    except NotFound:
        return None


def items(kube: Kube, resource: str, namespace: str) -> list[dict[str, Any]]:
    listed = kube.get(path(resource, namespace))
    kind = str(listed.get("kind", "")).removesuffix("List")
    return [{"kind": kind, **item} for item in listed.get("items") or ()]


def template_spec(obj: dict[str, Any]) -> dict[str, Any]:
    if obj["kind"] == "ControllerRevision":
        return dict(obj["data"]["spec"]["template"]["spec"])
    return dict(obj["spec"]["template"]["spec"])


def owned_by(kube: Kube, resource: str, namespace: str, owner: dict[str, Any]) -> list[Any]:
    uid = owner["metadata"]["uid"]
    return [
        o
        for o in items(kube, resource, namespace)
        if any(r["uid"] == uid for r in o["metadata"].get("ownerReferences") or ())
    ]


def revisions(kube: Kube, namespace: str, owner: dict[str, Any]) -> list[dict[str, Any]]:
    """The owner's ReplicaSets or ControllerRevisions, oldest first."""
    resource = "replicasets" if owner["kind"] == "Deployment" else "controllerrevisions"
    found = owned_by(kube, resource, namespace, owner)

    def number(o: dict[str, Any]) -> int:
        if o["kind"] == "ControllerRevision":
            return int(o["revision"])
        return int(o["metadata"]["annotations"]["deployment.kubernetes.io/revision"])

    return sorted(found, key=number)


def owner_uids(obj: dict[str, Any]) -> set[str]:
    return {r["uid"] for r in obj["metadata"].get("ownerReferences") or ()}


def wait_owned(kube: Kube, namespace: str, copy_name: str, owner: dict[str, Any]) -> None:
    resource = "secrets" if copy_name.startswith("app-secret-") else "configmaps"
    wait_for(
        lambda: (
            owner["metadata"]["uid"]
            in owner_uids(get(kube, resource, namespace, copy_name) or {"metadata": {}})
        ),
        what=f"{copy_name} owned by {owner['kind']}/{owner['metadata']['name']}",
    )


def create(kube: Kube, namespace: str, obj: dict[str, Any]) -> dict[str, Any]:
    return kube.create(path(RESOURCES[obj["kind"]], namespace), obj)


def reapply(kube: Kube, namespace: str, obj: dict[str, Any]) -> dict[str, Any]:
    """What `kubectl apply` of the original manifest amounts to: every field of the manifest
    set again on the live object, original names in the references included."""
    return kube.replace(path(RESOURCES[obj["kind"]], namespace, obj["metadata"]["name"]), obj)


def change_source(kube: Kube, namespace: str, value: str) -> None:
    kube.patch(path("configmaps", namespace, "app-config"), {"data": {"a": value}}, MERGE_PATCH)


def admission_sees(kube: Kube, namespace: str, value: str) -> None:
    """Wait until configpin's cache has the source's new content, as `kubectl apply` of a
    ConfigMap then of its workload gets only when the watch event came first (a dry-run
    admission tells, and creates nothing)."""
    wanted = {"a": value}

    def seen() -> bool:
        dry = kube.create(path("deployments", namespace), deployment("probe"), dryRun="All")
        name = copies_in(template_spec(dry))["app-config"]
        current = get(kube, "configmaps", namespace, name)
        # The copy of the new content may not exist yet: then the name is new, which is enough.
        return current is None or current.get("data") == wanted

    wait_for(seen, what="configpin to see the change")


def sources(kube: Kube, namespace: str) -> None:
    create(kube, namespace, configmap("app-config", {"a": "1"}))
    create(kube, namespace, secret("app-secret", {"token": "t0"}))


# --- tests


def test_deployment_points_at_immutable_labelled_copies(
    kube: Kube, namespace: str, configpin: Configpin
) -> None:
    sources(kube, namespace)
    created = configpin.metric("configpin_snapshots_created_total")
    dep = create(kube, namespace, deployment())
    assert configpin.metric("configpin_snapshots_created_total") == created + 2
    wait_for(
        lambda: configpin.metric("configpin_snapshots", namespace=namespace) == 2,
        what="the copies counted",
    )

    pinned = copies_in(template_spec(dep))
    assert set(pinned) == {"app-config", "app-secret"}
    assert json.loads(dep["spec"]["template"]["metadata"]["annotations"][SOURCES]).keys() == {
        "configmap/app-config",
        "secret/app-secret",
    }, "the annotations name the original sources"
    cm = kube.get(path("configmaps", namespace, pinned["app-config"]))
    sec = kube.get(path("secrets", namespace, pinned["app-secret"]))
    for obj, source in ((cm, "app-config"), (sec, "app-secret")):
        assert obj["immutable"] is True
        assert obj["metadata"]["labels"] == {
            "configpin.io/snapshot": "true",
            "configpin.io/source": source,
        }
        assert obj["metadata"]["annotations"]["configpin.io/source"] == source
        assert len(obj["metadata"]["annotations"]["configpin.io/signature"]) == 64
    assert cm["data"] == {"a": "1"}
    assert sec["type"] == "Opaque"
    with pytest.raises(Invalid, match="immutable"):
        kube.patch(
            path("configmaps", namespace, pinned["app-config"]), {"data": {"a": "9"}}, MERGE_PATCH
        )

    rs = wait_for(lambda: revisions(kube, namespace, dep), what="the ReplicaSet")[0]
    assert copies_in(template_spec(rs)) == pinned
    pod = wait_for(lambda: owned_by(kube, "pods", namespace, rs), what="a pod")[0]
    assert copies_in(pod["spec"]) == pinned
    for name in pinned.values():
        wait_owned(kube, namespace, name, rs)
    ref = next(
        r
        for r in kube.get(path("configmaps", namespace, pinned["app-config"]))["metadata"][
            "ownerReferences"
        ]
        if r["uid"] == rs["metadata"]["uid"]
    )
    assert ref == {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "name": rs["metadata"]["name"],
        "uid": rs["metadata"]["uid"],
        "controller": False,
        "blockOwnerDeletion": False,
    }


def test_a_change_gets_a_new_copy_and_a_rollback_gets_the_old_one_back(
    kube: Kube, namespace: str
) -> None:
    sources(kube, namespace)
    manifest = deployment()
    dep = create(kube, namespace, manifest)
    rs1 = wait_for(lambda: revisions(kube, namespace, dep), what="the first ReplicaSet")[0]
    old = copies_in(template_spec(rs1))["app-config"]

    change_source(kube, namespace, "2")
    admission_sees(kube, namespace, "2")
    dep = reapply(kube, namespace, manifest)
    new = copies_in(template_spec(dep))["app-config"]
    assert new != old
    assert kube.get(path("configmaps", namespace, new))["data"] == {"a": "2"}
    rs1, rs2 = wait_for(
        lambda: (r := revisions(kube, namespace, dep)) and len(r) == 2 and r,
        what="a second ReplicaSet",
    )
    assert copies_in(template_spec(rs2))["app-config"] == new
    assert copies_in(template_spec(rs1))["app-config"] == old, "the old revision keeps its copy"
    wait_owned(kube, namespace, old, rs1)
    wait_owned(kube, namespace, new, rs2)

    # `kubectl rollout undo`: the previous ReplicaSet's template, back on the Deployment.
    template = copy.deepcopy(rs1["spec"]["template"])
    del template["metadata"]["labels"]["pod-template-hash"]
    dep = kube.patch(
        path("deployments", namespace, "web"),
        [{"op": "replace", "path": "/spec/template", "value": template}],
        JSON_PATCH,
    )
    assert copies_in(template_spec(dep))["app-config"] == old, "the webhook keeps the rollback"
    pods = wait_for(
        lambda: [
            p
            for p in owned_by(kube, "pods", namespace, rs1)
            if not p["metadata"].get("deletionTimestamp")
        ],
        what="pods of the first ReplicaSet again",
    )
    assert copies_in(pods[0]["spec"])["app-config"] == old
    assert kube.get(path("configmaps", namespace, old))["data"] == {"a": "1"}
    assert len(revisions(kube, namespace, dep)) == 2, "no new ReplicaSet for a rollback"


def test_old_copies_go_with_their_replicasets(kube: Kube, namespace: str) -> None:
    sources(kube, namespace)
    manifest = deployment()
    dep = create(kube, namespace, manifest)
    rs1 = wait_for(lambda: revisions(kube, namespace, dep), what="the first ReplicaSet")[0]
    old = copies_in(template_spec(rs1))
    wait_owned(kube, namespace, old["app-config"], rs1)

    change_source(kube, namespace, "2")
    admission_sees(kube, namespace, "2")
    dep = reapply(kube, namespace, manifest)
    new = copies_in(template_spec(dep))
    assert old["app-secret"] == new["app-secret"], "an unchanged source keeps its copy"
    rs2 = wait_for(
        lambda: (r := revisions(kube, namespace, dep)) and len(r) == 2 and r[1],
        what="a second ReplicaSet",
    )
    wait_owned(kube, namespace, new["app-config"], rs2)
    wait_owned(kube, namespace, new["app-secret"], rs2)

    # The Deployment controller trims history once a rollout is complete; pods never get ready
    # here (no kubelet), so complete it by scaling to zero.
    kube.patch(
        path("deployments", namespace, "web"),
        {"spec": {"revisionHistoryLimit": 0, "replicas": 0}},
        MERGE_PATCH,
    )
    wait_for(
        lambda: get(kube, "replicasets", namespace, rs1["metadata"]["name"]) is None,
        what="the old ReplicaSet removed (revisionHistoryLimit 0)",
    )
    wait_for(
        lambda: get(kube, "configmaps", namespace, old["app-config"]) is None,
        what="the old copy removed by the garbage collector",
    )
    assert get(kube, "configmaps", namespace, new["app-config"]) is not None
    secret_copy = get(kube, "secrets", namespace, new["app-secret"])
    assert secret_copy is not None, "a copy the current ReplicaSet uses stays"
    # the garbage collector takes the old ReplicaSet's reference off a copy the new one still
    # owns on its own time, after (or before) it deletes the copy only the old one owned
    wait_for(
        lambda: (
            owner_uids(get(kube, "secrets", namespace, new["app-secret"]) or {"metadata": {}})
            == {rs2["metadata"]["uid"]}
        ),
        what="the shared copy owned by the current ReplicaSet alone",
    )


def test_reapplying_the_original_manifest_changes_nothing(kube: Kube, namespace: str) -> None:
    sources(kube, namespace)
    manifest = deployment()
    dep = create(kube, namespace, manifest)
    wait_for(lambda: revisions(kube, namespace, dep), what="the ReplicaSet")
    again = reapply(kube, namespace, manifest)
    assert again["spec"]["template"] == dep["spec"]["template"]
    # (A PUT drops the controller's revision annotation, which bumps the generation.)
    wait_for(
        lambda: (
            (d := kube.get(path("deployments", namespace, "web")))["status"].get(
                "observedGeneration"
            )
            == d["metadata"]["generation"]
        ),
        what="the Deployment controller to see the re-apply",
    )
    assert len(revisions(kube, namespace, again)) == 1, "no new ReplicaSet"


def test_dry_run_creates_no_copy(kube: Kube, namespace: str) -> None:
    sources(kube, namespace)
    dry = kube.create(path("deployments", namespace), deployment(), dryRun="All")
    pinned = copies_in(template_spec(dry))
    assert set(pinned) == {"app-config", "app-secret"}, "same answer as a real create"
    assert get(kube, "configmaps", namespace, pinned["app-config"]) is None
    assert get(kube, "secrets", namespace, pinned["app-secret"]) is None
    assert items(kube, "deployments", namespace) == []


def test_service_account_token_secret_is_refused(kube: Kube, namespace: str) -> None:
    create(kube, namespace, configmap("app-config", {"a": "1"}))
    # Up to 1.23 the token controller makes one for every account; from 1.24 a user asks for
    # one with a Secret of that type naming the account, and the controller fills it in.
    token = "default-token-manual"
    create(
        kube,
        namespace,
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": token,
                "annotations": {"kubernetes.io/service-account.name": "default"},
            },
            "type": "kubernetes.io/service-account-token",
        },
    )
    wait_for(
        lambda: (get(kube, "secrets", namespace, token) or {}).get("data", {}).get("token"),
        what="the token controller to fill in the token Secret",
    )
    resp = kube.open(
        "POST", path("deployments", namespace), body=deployment(spec=pod_spec(sec=token))
    )
    try:
        dep = json.loads(resp.read())
        warnings = " ".join(resp.headers.getlist("Warning"))
    finally:
        resp.release_conn()
    assert f"secret/{token} is a service-account token" in warnings
    assert "refused for snapshot" in warnings
    referenced = names_in(template_spec(dep))
    assert token in referenced, "the pod uses the token Secret itself"
    assert not [s for s in items(kube, "secrets", namespace) if s["metadata"].get("labels")]
    assert "app-config" in copies_in(template_spec(dep)), "the other source is still copied"


def test_bare_pod_owns_its_copies(kube: Kube, namespace: str) -> None:
    sources(kube, namespace)
    pod = create(
        kube,
        namespace,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "bare", "annotations": {"configpin.io/mode": "snapshot"}},
            "spec": pod_spec(),
        },
    )
    pinned = copies_in(pod["spec"])
    assert set(pinned) == {"app-config", "app-secret"}
    for name in pinned.values():
        wait_owned(kube, namespace, name, pod)
    kube.delete(path("pods", namespace, "bare"))
    wait_for(
        lambda: get(kube, "configmaps", namespace, pinned["app-config"]) is None,
        what="the copy removed with the pod",
    )


@pytest.mark.parametrize("kind", ["StatefulSet", "DaemonSet"])
def test_revisions_of_statefulsets_and_daemonsets_own_their_copies(
    kube: Kube, namespace: str, kind: str
) -> None:
    sources(kube, namespace)
    extra: dict[str, Any] = {}
    if kind == "StatefulSet":
        # Parallel: the StatefulSet controller replaces pods that never get ready (no kubelet).
        # revisionHistoryLimit cannot change later (1.20); the current revision is kept anyway
        # as long as some pod is not ready.
        extra = {"replicas": 1, "podManagementPolicy": "Parallel", "revisionHistoryLimit": 0}
    manifest = workload(kind, "db", pod_spec(), **extra)
    obj = create(kube, namespace, manifest)
    rev1 = wait_for(lambda: revisions(kube, namespace, obj), what="the first revision")[0]
    old = copies_in(template_spec(rev1))["app-config"]
    assert copies_in(template_spec(obj))["app-config"] == old
    wait_owned(kube, namespace, old, rev1)
    if kind == "StatefulSet":
        pod = wait_for(lambda: get(kube, "pods", namespace, "db-0"), what="pod db-0")
        assert copies_in(pod["spec"])["app-config"] == old

    change_source(kube, namespace, "2")
    admission_sees(kube, namespace, "2")
    obj = reapply(kube, namespace, manifest)
    new = copies_in(template_spec(obj))["app-config"]
    assert new != old
    rev1, rev2 = wait_for(
        lambda: (r := revisions(kube, namespace, obj)) and len(r) == 2 and r,
        what="a second revision",
    )
    assert copies_in(template_spec(rev1))["app-config"] == old
    assert copies_in(template_spec(rev2))["app-config"] == new
    wait_owned(kube, namespace, new, rev2)
    assert get(kube, "configmaps", namespace, old) is not None

    # Keep no history. A StatefulSet keeps its current revision until every pod is ready, so
    # scale it to zero: then the first revision is history, and goes.
    trim: dict[str, Any] = {"replicas": 0} if kind == "StatefulSet" else {"revisionHistoryLimit": 0}
    kube.patch(path(RESOURCES[kind], namespace, "db"), {"spec": trim}, MERGE_PATCH)
    wait_for(
        lambda: get(kube, "controllerrevisions", namespace, rev1["metadata"]["name"]) is None,
        what="the first revision removed",
    )
    wait_for(
        lambda: get(kube, "configmaps", namespace, old) is None,
        what="its copy removed by the garbage collector",
    )
    assert get(kube, "configmaps", namespace, new) is not None


def test_a_job_owns_its_copies(kube: Kube, namespace: str) -> None:
    sources(kube, namespace)
    spec = {**pod_spec(), "restartPolicy": "Never"}
    job = create(
        kube,
        namespace,
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "once", "annotations": {"configpin.io/mode": "snapshot"}},
            "spec": {"template": {"spec": spec}},
        },
    )
    pinned = copies_in(template_spec(job))
    assert set(pinned) == {"app-config", "app-secret"}
    for name in pinned.values():
        wait_owned(kube, namespace, name, job)
    kube.delete(
        path("jobs", namespace, "once"),
        {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"},
    )
    wait_for(
        lambda: get(kube, "secrets", namespace, pinned["app-secret"]) is None,
        what="the copy removed with the Job",
    )


def test_the_controller_points_a_changed_source_at_a_new_copy_and_keeps_a_rollback(
    kube: Kube, namespace: str
) -> None:
    sources(kube, namespace)
    dep = create(kube, namespace, deployment())
    rs1 = wait_for(lambda: revisions(kube, namespace, dep), what="the first ReplicaSet")[0]
    old = copies_in(template_spec(rs1))["app-config"]

    change_source(kube, namespace, "2")  # and nothing else: the controller rolls
    dep, rs2 = wait_for(
        lambda: (
            (d := kube.get(path("deployments", namespace, "web")))
            and copies_in(template_spec(d))["app-config"] != old
            and (r := revisions(kube, namespace, d))
            and len(r) == 2
            and (d, r[1])
        ),
        what="the controller to roll the Deployment onto a new copy",
    )
    new = copies_in(template_spec(dep))["app-config"]
    assert copies_in(template_spec(rs2))["app-config"] == new
    assert kube.get(path("configmaps", namespace, new))["data"] == {"a": "2"}
    wait_owned(kube, namespace, new, rs2)
    assert get(kube, "configmaps", namespace, old) is not None

    template = copy.deepcopy(rs1["spec"]["template"])
    del template["metadata"]["labels"]["pod-template-hash"]
    kube.patch(
        path("deployments", namespace, "web"),
        [{"op": "replace", "path": "/spec/template", "value": template}],
        JSON_PATCH,
    )
    # The controller leaves a rollback where it is until the source changes again; give it
    # more than its coalescing window (2 s by default) to show that it does.
    time.sleep(4)
    dep = kube.get(path("deployments", namespace, "web"))
    assert copies_in(template_spec(dep))["app-config"] == old
    assert len(revisions(kube, namespace, dep)) == 2


def test_a_source_with_a_100_character_name_is_pinned_to_a_copy(kube: Kube, namespace: str) -> None:
    """A ConfigMap name may be 253 characters, a label value only 63: the copy names its
    source in an annotation, labels it only when the name fits, and the workload is pinned."""
    long_cm, long_secret = "c" * 100, "s" * 240
    create(kube, namespace, configmap(long_cm, {"a": "1"}))
    create(kube, namespace, secret(long_secret, {"token": "t0"}))
    dep = create(kube, namespace, deployment(spec=pod_spec(long_cm, long_secret)))
    pinned = copies_in(template_spec(dep))
    assert set(pinned) == {long_cm, long_secret}, "both references point at copies"
    recorded = json.loads(dep["spec"]["template"]["metadata"]["annotations"][SOURCES])
    assert recorded.keys() == {f"configmap/{long_cm}", f"secret/{long_secret}"}
    for resource, source in (("configmaps", long_cm), ("secrets", long_secret)):
        made = kube.get(path(resource, namespace, pinned[source]))
        meta = made["metadata"]
        assert len(meta["name"]) <= 253 and made["immutable"] is True
        assert meta["labels"] == {"configpin.io/snapshot": "true"}  # no 100-char label value
        assert meta["annotations"]["configpin.io/source"] == source
    # Stable: admitting the output again changes nothing.
    again = copy.deepcopy(dep)
    again["metadata"] = {"name": "again", "annotations": dep["metadata"]["annotations"]}
    again.pop("status", None)
    dry = kube.create(path("deployments", namespace), again, dryRun="All")
    assert template_spec(dry) == template_spec(dep)


def _job_template_spec(obj: dict[str, Any]) -> dict[str, Any]:
    return dict(obj["spec"]["jobTemplate"]["spec"]["template"]["spec"])


def test_a_cronjob_keeps_its_copies_while_it_points_at_them(kube: Kube, namespace: str) -> None:
    """A CronJob's copy must outlive the Jobs it made (ttlSecondsAfterFinished, a history
    limit of 0 remove them) for as long as the CronJob points at it; once the controller
    points it at a new copy, the old one is the Jobs' alone."""
    sources(kube, namespace)
    prefix = served_prefix(kube, CRONJOB)
    assert prefix is not None
    spec = {**pod_spec(), "restartPolicy": "Never"}
    cronjob = kube.create(
        path("cronjobs", namespace, prefix=prefix),
        {
            "apiVersion": prefix.removeprefix("/apis/"),
            "kind": "CronJob",
            "metadata": {"name": "nightly", "annotations": {"configpin.io/mode": "snapshot"}},
            "spec": {
                "schedule": "0 3 * * *",
                "successfulJobsHistoryLimit": 0,
                "failedJobsHistoryLimit": 0,
                "jobTemplate": {"spec": {"template": {"spec": spec}}},
            },
        },
    )
    first = copies_in(_job_template_spec(cronjob))
    assert set(first) == {"app-config", "app-secret"}
    for name in first.values():
        wait_owned(kube, namespace, name, cronjob)

    # A Job as the CronJob controller makes it: the jobTemplate, controlled by the CronJob.
    job = create(
        kube,
        namespace,
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": "nightly-1",
                "ownerReferences": [
                    {
                        "apiVersion": cronjob["apiVersion"],
                        "kind": "CronJob",
                        "name": "nightly",
                        "uid": cronjob["metadata"]["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": copy.deepcopy(cronjob["spec"]["jobTemplate"]["spec"]),
        },
    )
    assert copies_in(template_spec(job)) == first
    wait_owned(kube, namespace, first["app-config"], job)
    kube.delete(
        path("jobs", namespace, "nightly-1"),
        {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"},
    )
    # The garbage collector deletes a dependent whose owners are all gone, and drops the
    # reference to a deleted owner from one that has a live owner left: wait for either.
    job_uid = job["metadata"]["uid"]

    def settled(resource: str, name: str) -> dict[str, Any] | bool:
        found = get(kube, resource, namespace, name)
        return True if found is None else (job_uid not in owner_uids(found) and found)

    for resource, source in (("configmaps", "app-config"), ("secrets", "app-secret")):
        after = wait_for(
            lambda r=resource, n=first[source]: settled(r, n),  # type: ignore[misc]
            what="the Job collected",
        )
        assert after is not True, f"{first[source]} went with the Job while the CronJob uses it"

    # The controller points the CronJob at a copy of the new content.
    change_source(kube, namespace, "2")
    cronjobs = path("cronjobs", namespace, "nightly", prefix=prefix)
    repointed = wait_for(
        lambda: (
            (c := kube.get(cronjobs))
            and copies_in(_job_template_spec(c))["app-config"] != first["app-config"]
            and c
        ),
        what="the CronJob re-pointed",
    )
    now = copies_in(_job_template_spec(repointed))
    assert now["app-secret"] == first["app-secret"]  # unchanged content, same copy
    wait_owned(kube, namespace, now["app-config"], cronjob)
    wait_for(
        lambda: (
            cronjob["metadata"]["uid"]
            not in owner_uids(kube.get(path("configmaps", namespace, first["app-config"])))
        ),
        what="the old copy let go by the CronJob",
    )
    assert cronjob["metadata"]["uid"] in owner_uids(
        kube.get(path("secrets", namespace, first["app-secret"]))
    )


# --- a staged release: a StatefulSet held at a partition


@contextlib.contextmanager
def kubelet_stand_in(kube: Kube, namespace: str) -> Iterator[None]:
    """There is no kubelet here: report every pod of the namespace Running and Ready through
    `pods/status`, as a kubelet would once its containers started, or the StatefulSet
    controller (OrderedReady, rolling updates) never goes on to the next pod."""
    stop = threading.Event()

    def ready(pod: dict[str, Any]) -> bool:
        conditions = (pod.get("status") or {}).get("conditions") or ()
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)

    def run() -> None:
        while not stop.wait(0.2):
            for pod in items(kube, "pods", namespace):
                if ready(pod) or pod["metadata"].get("deletionTimestamp"):
                    continue
                now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
                status = {
                    "phase": "Running",
                    "startTime": now,
                    "conditions": [
                        {"type": t, "status": "True", "lastTransitionTime": now}
                        for t in ("Initialized", "ContainersReady", "Ready")
                    ],
                }
                with contextlib.suppress(NotFound, Conflict):
                    kube.patch(
                        path("pods", namespace, pod["metadata"]["name"]) + "/status",
                        {"status": status},
                        MERGE_PATCH,
                    )

    thread = threading.Thread(target=run, name="kubelet-stand-in", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(10)


def test_a_statefulset_partition_releases_the_new_copy_to_the_pods_above_it_only(
    kube: Kube, namespace: str
) -> None:
    """After a consumed change, only pods at or above `rollingUpdate.partition` move to the new
    copy; a pod below it that is deleted (a node failure) comes back on its revision's old
    copy, which lives as long as that ControllerRevision."""
    sources(kube, namespace)
    sts = workload(
        "StatefulSet",
        "db",
        pod_spec(),
        replicas=3,
        updateStrategy={"type": "RollingUpdate", "rollingUpdate": {"partition": 2}},
    )
    statefulsets = path("statefulsets", namespace, "db")

    def pods() -> dict[str, dict[str, Any]]:
        found = items(kube, "pods", namespace)
        return {
            p["metadata"]["name"]: p for p in found if not p["metadata"].get("deletionTimestamp")
        }

    def copy_of(pod: dict[str, Any]) -> str:
        return copies_in(pod["spec"])["app-config"]

    with kubelet_stand_in(kube, namespace):
        created = create(kube, namespace, sts)
        old = copies_in(template_spec(created))["app-config"]
        wait_for(
            lambda: (kube.get(statefulsets).get("status") or {}).get("readyReplicas") == 3,
            timeout=60,
            what="three ready pods",
        )
        assert {n: copy_of(p) for n, p in pods().items()} == {f"db-{i}": old for i in range(3)}

        change_source(kube, namespace, "2")
        new = wait_for(
            lambda: (
                (c := copies_in(template_spec(kube.get(statefulsets)))["app-config"]) != old and c
            ),
            what="the controller to re-point the StatefulSet",
        )

        def released() -> dict[str, dict[str, Any]] | None:
            now = pods()
            sts_now = kube.get(statefulsets)
            status = sts_now.get("status") or {}
            db2 = now.get("db-2")
            if (
                # (a status of the generation before the re-point names the old revision as
                # the update revision, which db-2 is still on)
                status.get("observedGeneration") != sts_now["metadata"]["generation"]
                or db2 is None
                or db2["metadata"]["labels"].get("controller-revision-hash")
                != status.get("updateRevision")
                or status.get("readyReplicas") != 3
            ):
                return None
            return now

        now = wait_for(released, timeout=60, what="db-2 on the new revision, all ready")
        assert copy_of(now["db-2"]) == new
        assert copy_of(now["db-0"]) == old and copy_of(now["db-1"]) == old
        assert kube.get(path("configmaps", namespace, new))["data"] == {"a": "2"}

        # A node failure takes db-0: it comes back on its own revision, with the old copy.
        uid = now["db-0"]["metadata"]["uid"]
        kube.delete(path("pods", namespace, "db-0"))
        back = wait_for(
            lambda: (p := pods().get("db-0")) and p["metadata"]["uid"] != uid and p,
            timeout=60,
            what="db-0 recreated",
        )
        assert copy_of(back) == old
        status = kube.get(statefulsets)["status"]
        assert back["metadata"]["labels"]["controller-revision-hash"] == status["currentRevision"]

    revisions_now = {r["metadata"]["name"]: r for r in revisions(kube, namespace, created)}
    current = revisions_now[status["currentRevision"]]
    assert copies_in(template_spec(current))["app-config"] == old
    wait_owned(kube, namespace, old, current)
    wait_owned(kube, namespace, new, revisions_now[status["updateRevision"]])
