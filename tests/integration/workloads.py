"""What the integration tests read of a workload and its rollout, and the few writes they
all make: the template record, the rollout record, Events, `configpin status`, readiness; and
who makes them (a user impersonated, a namespace's editor, `kubectl configpin` as either) and
who the source says made them."""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kubernetes import client

from harness.configpin import Configpin
from harness.controlplane import ControlPlane, service_account_kubeconfig, wait_for
from harness.manifests import configmap, container, deployment, env_key_ref, pod_spec
from webhook.core.constants import ANN_CHANGED_BY, ANN_ROLLOUT, ANN_SOURCES
from webhook.kube.raw import MERGE_PATCH, Kube, path


def get(kube: Kube, ns: str, name: str, resource: str = "deployments") -> dict[str, Any]:
    return kube.get(path(resource, ns, name))


def annotation(obj: Mapping[str, Any], key: str) -> Any:
    text = (obj["metadata"].get("annotations") or {}).get(key)
    return json.loads(text) if text else None


def record(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The rollout record on the workload ({} when it has none)."""
    return annotation(obj, ANN_ROLLOUT) or {}


def state(obj: Mapping[str, Any]) -> str | None:
    return record(obj).get("state")


def sources(obj: Mapping[str, Any]) -> dict[str, str]:
    text = (obj["spec"]["template"]["metadata"].get("annotations") or {}).get(ANN_SOURCES)
    return json.loads(text) if text else {}


REVISION = "deployment.kubernetes.io/revision"  # the Deployment controller's count of templates


def revision(dep: Mapping[str, Any]) -> int:
    return int((dep["metadata"].get("annotations") or {})[REVISION])


def replicasets(kube: Kube, ns: str, app: str) -> int:
    """How many ReplicaSets Deployment `app` has (harness.manifests.deployment's pods are
    labelled app: NAME): one for each template it has had, as long as its history keeps them."""
    page = kube.get(path("replicasets", ns), labelSelector=f"app={app}")
    return len(page.get("items") or ())


def reader(
    name: str,
    *,
    keys: Sequence[str] = ("a",),
    replicas: int = 1,
    annotations: Mapping[str, str] | None = None,
    optional: bool = False,
    deadline: int = 600,
) -> dict[str, Any]:
    """Deployment `name` reading `keys` of ConfigMap `cfg` into its env; `deadline`: its
    progressDeadlineSeconds (a short one where a failure is wanted)."""
    env = [env_key_ref("configmap", "cfg", k, k.upper()) for k in keys]
    if optional:
        for e in env:
            e["valueFrom"]["configMapKeyRef"]["optional"] = True
    dep = deployment(
        name, pod_spec(container(env=env)), replicas=replicas, annotations=dict(annotations or {})
    )
    dep["spec"]["progressDeadlineSeconds"] = deadline
    return dep


def readers_of_cfg(kube: Kube, ns: str, names: Sequence[str], deadline: int = 600) -> None:
    """ConfigMap `cfg` (a: 1) and a `reader` Deployment of it per name, each stamped."""
    kube.create(path("configmaps", ns), configmap("cfg", {"a": "1"}))
    for name in names:
        kube.create(path("deployments", ns), reader(name, deadline=deadline))
    for name in names:
        stamped(kube, ns, name)


def stamped(kube: Kube, ns: str, name: str) -> dict[str, Any]:
    wait_for(lambda: sources(get(kube, ns, name)), what=f"{name} stamped")
    return get(kube, ns, name)


def quiet(kube: Kube, ns: str, before: Mapping[str, Mapping[str, str]], seconds: float) -> None:
    """Nothing of `before` ({name: template record}) is re-stamped for `seconds` (several
    resyncs)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        moved = [n for n, s in before.items() if sources(get(kube, ns, n)) != s]
        assert not moved, f"re-stamped: {moved}"
        time.sleep(0.3)


def set_cm(kube: Kube, ns: str, value: str, source: str = "cfg") -> None:
    kube.patch(path("configmaps", ns, source), {"data": {"a": value}}, content_type=MERGE_PATCH)


def changed_by(kube: Kube, ns: str, name: str = "cfg") -> dict[str, Any] | None:
    """The record of who changed ConfigMap `name` (configpin.io/changed-by), as stored."""
    found: dict[str, Any] | None = annotation(get(kube, ns, name, "configmaps"), ANN_CHANGED_BY)
    return found


def events(kube: Kube, ns: str, name: str) -> list[tuple[str, str]]:
    """(reason, type) of the Events about `name`."""
    found = kube.get(
        f"/apis/events.k8s.io/v1/namespaces/{ns}/events", fieldSelector=f"regarding.name={name}"
    )
    return [(e.get("reason"), e.get("type")) for e in found.get("items") or ()]


def wait_event(kube: Kube, ns: str, name: str, reason: str, type_: str) -> None:
    wait_for(
        lambda: (reason, type_) in events(kube, ns, name),
        what=f"a {type_} Event {reason} about {ns}/{name}",
    )


def notes(kube: Kube, ns: str, name: str, reason: str) -> list[str]:
    """The notes of Events `reason` about `name`."""
    found = kube.get(
        f"/apis/events.k8s.io/v1/namespaces/{ns}/events", fieldSelector=f"regarding.name={name}"
    )
    return [e.get("note") or "" for e in found.get("items") or () if e.get("reason") == reason]


def status(plane: ControlPlane, ns: str) -> dict[str, dict[str, Any]]:
    """`kubectl configpin status -n NS -o json`: each workload's row."""
    proc = kubectl_configpin(["status", "-n", ns, "-o", "json"], plane.kubeconfig)
    return {r["name"]: r for r in json.loads(proc.stdout)}


def healthy(dep: Mapping[str, Any]) -> bool:
    """Ready and available, not failing: a workload that can vouch for a change."""
    status = dep.get("status") or {}
    conditions = {c.get("type"): c for c in status.get("conditions") or ()}
    progressing = conditions.get("Progressing") or {}
    return (
        status.get("observedGeneration", 0) >= dep["metadata"]["generation"]
        and status.get("readyReplicas") == dep["spec"]["replicas"]
        and (conditions.get("Available") or {}).get("status") == "True"
        and progressing.get("status") != "False"
    )


def wait_healthy(kube: Kube, ns: str, names: Sequence[str]) -> None:
    wait_for(
        lambda: all(healthy(get(kube, ns, n)) for n in names),
        timeout=60,
        what=f"{', '.join(names)} in {ns} healthy",
    )


class Impersonating(Kube):
    """Requests made as `user`, of `group` besides (the admin token may impersonate)."""

    def __init__(self, api: Any, user: str, group: str | None = None) -> None:
        super().__init__(api)
        self.user = user
        self.group = group

    def _headers(self, content_type: str | None) -> dict[str, str]:
        headers = super()._headers(content_type)
        headers["Impersonate-User"] = self.user
        if self.group is not None:
            headers["Impersonate-Group"] = self.group
        return headers


def As(api: client.ApiClient, user: str) -> Impersonating:
    """Requests made as `user`, a cluster admin."""
    return Impersonating(api, user, "system:masters")


def namespace_editor(
    plane: ControlPlane,
    kube: Kube,
    ns: str,
    tmp: Path,
    verbs: Sequence[str] = ("get", "list", "update", "patch"),
    resource: str = "configmaps",
) -> Path:
    """A kubeconfig of ServiceAccount `editor` of `ns`, allowed `verbs` on that namespace's
    ConfigMaps (or `resource`: Secrets) and nothing else."""
    kube.create(path("serviceaccounts", ns), {"metadata": {"name": "editor"}})
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    kube.create(
        f"{rbac}/namespaces/{ns}/roles",
        {
            "metadata": {"name": "editor"},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": [resource],
                    "verbs": list(verbs),
                }
            ],
        },
    )
    kube.create(
        f"{rbac}/namespaces/{ns}/rolebindings",
        {
            "metadata": {"name": "editor"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "editor"},
            "subjects": [{"kind": "ServiceAccount", "name": "editor", "namespace": ns}],
        },
    )
    return service_account_kubeconfig(plane, kube.api, ns, "editor", tmp / "editor.kubeconfig")


def kubectl_configpin(argv: Sequence[str], kubeconfig: Path) -> subprocess.CompletedProcess[str]:
    """`kubectl configpin ARGV` with `kubeconfig`."""
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    plugin = str(Path(sys.executable).parent / "kubectl-configpin")
    return subprocess.run(
        [plugin, *argv], capture_output=True, text=True, env=env, timeout=60, check=False
    )


def source_review(old: Mapping[str, Any], new: Mapping[str, Any], *, user: str) -> dict[str, Any]:
    """The AdmissionReview the API server sends configpin for a dry-run update of `old` to
    `new` (a ConfigMap)."""
    ns = old["metadata"]["namespace"]
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": "", "version": "v1", "kind": "ConfigMap"},
            "resource": {"group": "", "version": "v1", "resource": "configmaps"},
            "requestKind": {"group": "", "version": "v1", "kind": "ConfigMap"},
            "requestResource": {"group": "", "version": "v1", "resource": "configmaps"},
            "name": old["metadata"]["name"],
            "namespace": ns,
            "operation": "UPDATE",
            "userInfo": {"username": user, "groups": ["system:authenticated"]},
            "object": dict(new),
            "oldObject": dict(old),
            "dryRun": True,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "UpdateOptions"},
        },
    }


def ask_replica(cp: Configpin, review: Mapping[str, Any]) -> dict[str, Any]:
    """POST a review to one replica's sources webhook, as the API server does; its
    response."""
    ctx = ssl.create_default_context(cafile=str(cp.ca_file))
    req = urllib.request.Request(
        cp.url + "/sources",
        data=json.dumps(review).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
        answer: dict[str, Any] = json.loads(r.read())["response"]
    return answer


def approve(kubeconfig: Path, ns: str, source: str = "cfg") -> str:
    """`kubectl configpin approve configmap/SOURCE -n NS` with `kubeconfig`, which must
    succeed: what it said."""
    done = kubectl_configpin(["approve", f"configmap/{source}", "-n", ns], kubeconfig)
    assert done.returncode == 0, done.stderr + done.stdout
    return done.stdout
