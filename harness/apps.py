"""Application pods for a real node (harness/node.py): busybox shells that read their config
and say what they read, so that tests and benches assert what a container actually saw.

The reader loops (every 0.1 s, with shell builtins only: one fork per turn, for the sleep) over
the files and environment variables it is told to watch, and each time what it reads differs
from the turn before, logs one line:

    seen <uptime> file:/config/greeting=hello env:GREETING=hello

`<uptime>` is /proc/uptime's first field, the kernel's boot-time clock shared by every container
and the test process (`boottime()`), so a change's latency is read off the log. A watched file's
first line is what counts; values are single words (what the tests write). While anything it
read contains `invalid`, the reader removes /tmp/ready, which its readiness probe checks: the
pod's readiness depends on its config, as a real application's would.
"""

from __future__ import annotations

import copy
import json
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubernetes import client

from harness.controlplane import wait_for
from webhook.kube.raw import Kube

READER_SCRIPT = r"""
trap 'exit 0' TERM
last=
while :; do
  state=
  for f in $WATCH_FILES; do
    value=
    { IFS= read -r value < "$f"; } 2>/dev/null || :
    state="$state file:$f=$value"
  done
  for v in $WATCH_ENV; do
    eval "value=\${$v-}"
    state="$state env:$v=$value"
  done
  if [ "$state" != "$last" ]; then
    read -r up _ < /proc/uptime
    echo "seen $up$state"
    case "$state" in
      *invalid*) rm -f /tmp/ready ;;
      *) : > /tmp/ready ;;
    esac
    last=$state
  fi
  usleep 100000
done
"""

_SEEN = re.compile(r"^seen (\d+(?:\.\d+)?)((?: \S+)*)$")


def boottime() -> float:
    """The clock the readers stamp their lines with (/proc/uptime)."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


@dataclass(frozen=True)
class Seen:
    """One line of a reader's log: when, and what it read (``file:<path>`` and ``env:<name>``
    keys)."""

    at: float
    values: dict[str, str]

    def file(self, path: str) -> str:
        return self.values[f"file:{path}"]

    def env(self, name: str) -> str:
        return self.values[f"env:{name}"]


def parse_seen(log: str) -> list[Seen]:
    """Every `seen` line of a reader's log, in order."""
    found = []
    for line in log.splitlines():
        match = _SEEN.match(line.strip())
        if match is None:
            continue
        values = dict(item.split("=", 1) for item in match[2].split())
        found.append(Seen(float(match[1]), values))
    return found


def reader_container(
    image: str,
    *,
    files: Sequence[str] = (),
    env: Sequence[Mapping[str, Any]] = (),
    env_from: Sequence[Mapping[str, Any]] = (),
    watch_env: Sequence[str] = (),
    volume_mounts: Sequence[Mapping[str, Any]] = (),
    name: str = "app",
) -> dict[str, Any]:
    """A reader container watching `files` and the environment variables named in `watch_env`
    (besides those of `env`, which it always watches)."""
    names = [*(e["name"] for e in env), *watch_env]
    return {
        "name": name,
        "image": image,
        "imagePullPolicy": "Never",
        "command": ["sh", "-c", READER_SCRIPT],
        "env": [
            {"name": "WATCH_FILES", "value": " ".join(files)},
            {"name": "WATCH_ENV", "value": " ".join(names)},
            *(dict(e) for e in env),
        ],
        "envFrom": [dict(e) for e in env_from],
        "volumeMounts": [dict(m) for m in volume_mounts],
        "readinessProbe": {
            "exec": {"command": ["test", "-f", "/tmp/ready"]},
            "periodSeconds": 1,
            "failureThreshold": 1,
        },
        "resources": {"requests": {"cpu": "10m", "memory": "8Mi"}},
    }


def pod_log(api: client.ApiClient, namespace: str, pod: str, container: str | None = None) -> str:
    """The container's log, through the API server and the kubelet (pods/log)."""
    kwargs = {"container": container} if container else {}
    text: str | None = client.CoreV1Api(api).read_namespaced_pod_log(pod, namespace, **kwargs)
    return text or ""  # None for an empty log: a container that has not written yet


def seen_lines(api: client.ApiClient, namespace: str, pod: str) -> list[Seen]:
    """What the reader in `pod` has read so far; nothing while its container has not started
    (ContainerCreating) or the pod is gone."""
    try:
        return parse_seen(pod_log(api, namespace, pod))
    except client.ApiException as e:
        if e.status in (400, 404):
            return []
        raise


def last_seen(api: client.ApiClient, namespace: str, pod: str) -> Seen | None:
    lines = seen_lines(api, namespace, pod)
    return lines[-1] if lines else None


def pods(api: client.ApiClient, namespace: str, selector: str) -> list[Any]:
    """The pods matching a label selector that are not being deleted."""
    items = client.CoreV1Api(api).list_namespaced_pod(namespace, label_selector=selector).items
    return [p for p in items if p.metadata.deletion_timestamp is None]


def is_ready(pod: Any) -> bool:
    return pod.status.phase == "Running" and any(
        c.type == "Ready" and c.status == "True" for c in pod.status.conditions or ()
    )


def wait_ready(api: client.ApiClient, namespace: str, name: str, timeout: float = 60) -> Any:
    """Wait for pod `name` to be Running and Ready; return it."""

    def ready() -> Any:
        try:
            pod = client.CoreV1Api(api).read_namespaced_pod(name, namespace)
        except client.ApiException as e:
            if e.status == 404:
                return None
            raise
        return pod if is_ready(pod) else None

    return wait_for(ready, timeout=timeout, interval=0.2, what=f"pod {namespace}/{name} Ready")


def wait_seen(
    api: client.ApiClient,
    namespace: str,
    pod: str,
    expected: Mapping[str, str],
    timeout: float = 60,
    interval: float = 0.2,
) -> Seen:
    """Wait until the reader in `pod` has read `expected` (``file:...``/``env:...`` keys); the
    first line that matched."""

    def matched() -> Seen | None:
        lines = seen_lines(api, namespace, pod)
        return next(
            (s for s in lines if all(s.values.get(k) == v for k, v in expected.items())), None
        )

    return wait_for(matched, timeout=timeout, interval=interval, what=f"{pod} reading {expected}")


# --- workloads of readers -------------------------------------------------------------------

CONFIG_DIR = "/config"


def reader_workload(
    kind: str,
    name: str,
    image: str,
    *,
    configmap: str,
    files: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    whole_volume: bool = True,
    replicas: int = 2,
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A Deployment or StatefulSet (`kind`) of readers of ConfigMap `configmap`: its keys
    `files` as files under /config (the whole ConfigMap mounted, or only those keys as the
    volume's `items`: then the others are not consumed), and `env` (variable -> key) from
    configMapKeyRef. The workload's own `annotations` (configpin.io/mode, on-change...)."""
    env = env or {}
    container = reader_container(
        image,
        files=[f"{CONFIG_DIR}/{key}" for key in files],
        env=[
            {"name": var, "valueFrom": {"configMapKeyRef": {"name": configmap, "key": key}}}
            for var, key in env.items()
        ],
        volume_mounts=[{"name": "config", "mountPath": CONFIG_DIR}] if files else [],
    )
    volume: dict[str, Any] = {"name": configmap}
    if not whole_volume:
        volume["items"] = [{"key": key, "path": key} for key in files]
    pod_spec: dict[str, Any] = {
        "containers": [container],
        "terminationGracePeriodSeconds": 2,
        "volumes": [{"name": "config", "configMap": volume}] if files else [],
    }
    labels = {"app": name}
    spec: dict[str, Any] = {
        "replicas": replicas,
        "selector": {"matchLabels": labels},
        "template": {"metadata": {"labels": labels}, "spec": pod_spec},
    }
    if kind == "StatefulSet":
        spec["serviceName"] = name
        spec["podManagementPolicy"] = "Parallel"
    return {
        "apiVersion": "apps/v1",
        "kind": kind,
        "metadata": {"name": name, "annotations": dict(annotations or {})},
        "spec": spec,
    }


def workload_pods(api: client.ApiClient, namespace: str, name: str) -> list[Any]:
    """The pods of a reader workload (label app=<name>) that are not being deleted."""
    return pods(api, namespace, f"app={name}")


def replica_sets(api: client.ApiClient, namespace: str, deployment: str) -> list[Any]:
    """The ReplicaSets a Deployment owns, oldest revision first."""
    items = client.AppsV1Api(api).list_namespaced_replica_set(namespace).items
    owned = [
        rs
        for rs in items
        for o in rs.metadata.owner_references or ()
        if o.kind == "Deployment" and o.name == deployment
    ]
    return sorted(owned, key=_revision)


def _revision(rs: Any) -> int:
    return int((rs.metadata.annotations or {}).get("deployment.kubernetes.io/revision", "0"))


def deployment_rolled_out(api: client.ApiClient, namespace: str, name: str) -> Any:
    """The Deployment once its rollout is complete: the controller saw the latest spec, every
    replica is updated, Ready and available, and no pod of an older revision is left."""
    d = client.AppsV1Api(api).read_namespaced_deployment(name, namespace)
    st = d.status
    want = d.spec.replicas
    done = (
        (st.observed_generation or 0) >= d.metadata.generation
        and (st.updated_replicas or 0) == want
        and (st.ready_replicas or 0) == want
        and (st.available_replicas or 0) == want
        and (st.replicas or 0) == want
        and len(workload_pods(api, namespace, name)) == want
    )
    return d if done else None


def wait_deployment(api: client.ApiClient, namespace: str, name: str, timeout: float = 120) -> Any:
    return wait_for(
        lambda: deployment_rolled_out(api, namespace, name),
        timeout=timeout,
        interval=0.3,
        what=f"Deployment {namespace}/{name} rolled out",
    )


def wait_all_read(
    api: client.ApiClient,
    namespace: str,
    name: str,
    expected: Mapping[str, str],
    timeout: float = 60,
) -> dict[str, Seen]:
    """Every pod of workload `name` has read `expected`; {pod name: the line that says so}."""
    return {
        p.metadata.name: wait_seen(api, namespace, p.metadata.name, expected, timeout=timeout)
        for p in workload_pods(api, namespace, name)
    }


# Annotations `kubectl rollout undo` keeps from the Deployment rather than taking from the
# ReplicaSet (kubectl's annotationsToSkip).
_UNDO_SKIPPED = {
    "kubectl.kubernetes.io/last-applied-configuration",
    "deployment.kubernetes.io/revision",
    "deployment.kubernetes.io/revision-history",
    "deployment.kubernetes.io/desired-replicas",
    "deployment.kubernetes.io/max-replicas",
    "deprecated.deployment.rollback.to",
}


def rollout_undo(api: client.ApiClient, namespace: str, name: str) -> int:
    """What `kubectl rollout undo deployment/<name>` does: the pod template of the ReplicaSet
    of the previous revision (less its pod-template-hash label) and that ReplicaSet's
    annotations put back on the Deployment, in one JSON patch. Returns the revision undone to.

    The revisions are read once the Deployment controller has seen the Deployment's current
    template (its status's observedGeneration): before, the revision the Deployment names is
    the one before its last write, whose ReplicaSet does not exist yet."""
    apps = client.AppsV1Api(api)

    def observed() -> Any:
        d = apps.read_namespaced_deployment(name, namespace)
        seen = (d.status.observed_generation if d.status else None) or 0
        return d if seen >= (d.metadata.generation or 0) else None

    deployment = wait_for(
        observed,
        timeout=60,
        interval=0.2,
        what=f"{namespace}/{name}'s template seen by its controller",
    )
    current = int(deployment.metadata.annotations["deployment.kubernetes.io/revision"])
    previous = [rs for rs in replica_sets(api, namespace, name) if _revision(rs) < current]
    if not previous:
        raise AssertionError(f"{namespace}/{name} has no revision before {current}")
    target = previous[-1]
    raw = api.sanitize_for_serialization(target)
    template = copy.deepcopy(raw["spec"]["template"])
    template["metadata"].get("labels", {}).pop("pod-template-hash", None)
    annotations = {
        k: v for k, v in (deployment.metadata.annotations or {}).items() if k in _UNDO_SKIPPED
    }
    annotations |= {
        k: v for k, v in (target.metadata.annotations or {}).items() if k not in _UNDO_SKIPPED
    }
    patch = [
        {"op": "replace", "path": "/spec/template", "value": template},
        {"op": "replace", "path": "/metadata/annotations", "value": annotations},
    ]
    apps.patch_namespaced_deployment(name, namespace, patch)
    return _revision(target)


def write_warned(
    kube: Kube,
    method: str,
    api_path: str,
    body: Any = None,
    *,
    content_type: str | None = None,
    dry_run: bool = False,
) -> tuple[dict[str, Any], list[str]]:
    """A write's result and the admission warnings the API server sent with it, as kubectl
    receives and prints them (one `Warning: 299 - "text"` header each; the texts)."""
    resp = kube.open(
        method,
        api_path,
        query={"dryRun": "All"} if dry_run else None,
        body=body,
        content_type=content_type,
    )
    try:
        data = resp.read()
        headers = resp.headers.getlist("Warning")
    finally:
        resp.release_conn()
    said = [h.split('"', 1)[1].rsplit('"', 1)[0] if '"' in h else h for h in headers]
    return (json.loads(data) if data else {}), said
