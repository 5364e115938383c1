"""`configpin.io/extra-sources` (shared/SPEC.md "Coming from Reloader"), end to end: a workload
rolls when a ConfigMap or Secret its application reads itself changes, although its pod spec
does not reference it, as Reloader's `configmap.reloader.stakater.com/reload` does.

Two configpin replicas of instance `extra` run as the chart runs them (one Lease, the webhook
registered from the chart's own entry, every controller write through admission). The fake
`Kubelet` marks every pod of the test's apps Ready, so each rollout completes.

- named at creation: a change of any key of a named source rolls the workload once (one
  ReplicaSet more); a change of a source nobody names rolls nothing;
- named later (`kubectl annotate`, as a team adopting it does): nothing restarts, the source is
  recorded, and its next change rolls; `kubectl configpin status` says current in between;
- an entry that names a source of another namespace is left out: a change there rolls nothing.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

from kubernetes import client

from harness.configpin import instance_namespace
from harness.controlplane import ControlPlane, wait_for
from harness.kubelet import Kubelet
from harness.manifests import configmap, container, deployment, env_key_ref, pod_spec, secret
from tests.integration.instances import Replicas, replicas_fixtures
from tests.integration.workloads import (
    get,
    quiet,
    replicasets,
    sources,
    stamped,
    status,
    wait_healthy,
)
from webhook.core.constants import ANN_EXTRA_SOURCES, ANN_OBSERVED
from webhook.kube.raw import MERGE_PATCH, Kube, path

RESYNC = 2.0
ARGS = [
    "--coalesce-window", "0.5",
    "--min-rollout-interval", "0",
    "--resync-period", str(RESYNC),
    "--lease-duration", "4",
]  # fmt: skip

replicas, ns = replicas_fixtures("extra", ARGS)


def _app(name: str, extra: str | None = None) -> dict[str, Any]:
    """Deployment `name` reading key `a` of ConfigMap `cfg` into its env; `extra`: its
    configpin.io/extra-sources."""
    env = [env_key_ref("configmap", "cfg", "a", "A")]
    annotations = {ANN_EXTRA_SOURCES: extra} if extra is not None else {}
    return deployment(name, pod_spec(container(env=env)), replicas=1, annotations=annotations)


def _sources_of(kube: Kube, ns: str) -> None:
    kube.create(path("configmaps", ns), configmap("cfg", {"a": "1"}))
    kube.create(path("configmaps", ns), configmap("settings", {"x": "1", "y": "1"}))
    kube.create(path("secrets", ns), secret("token", {"token": "t0"}))
    kube.create(path("configmaps", ns), configmap("unnamed", {"z": "1"}))


def _set(kube: Kube, ns: str, resource: str, name: str, data: dict[str, str]) -> None:
    body = {"stringData": data} if resource == "secrets" else {"data": data}
    kube.patch(path(resource, ns, name), body, content_type=MERGE_PATCH)


def _rolled_to(kube: Kube, ns: str, name: str, before: dict[str, str], sets: int) -> dict[str, str]:
    """`name`'s template record, once it moved on from `before`, with `sets` ReplicaSets and
    left so over several resyncs."""
    wait_for(lambda: sources(get(kube, ns, name)) != before, what=f"{name} re-stamped")
    now = sources(get(kube, ns, name))
    wait_healthy(kube, ns, [name])
    quiet(kube, ns, {name: now}, 3 * RESYNC)
    assert replicasets(kube, ns, name) == sets
    return now


def test_a_change_of_any_key_of_a_named_source_rolls_the_workload_once(kube: Kube, ns: str) -> None:
    _sources_of(kube, ns)
    with Kubelet(kube, ns) as kubelet:
        kubelet.allow("web")
        kube.create(path("deployments", ns), _app("web", "configmap/settings, secret/token"))
        first = sources(stamped(kube, ns, "web"))
        assert set(first) == {"configmap/cfg", "configmap/settings", "secret/token"}
        wait_healthy(kube, ns, ["web"])

        _set(kube, ns, "configmaps", "unnamed", {"z": "2"})  # nobody names it
        quiet(kube, ns, {"web": first}, 3 * RESYNC)
        assert replicasets(kube, ns, "web") == 1

        _set(kube, ns, "configmaps", "settings", {"y": "2"})  # a key nothing references
        second = _rolled_to(kube, ns, "web", first, 2)
        assert second["configmap/settings"] != first["configmap/settings"]
        assert second["configmap/cfg"] == first["configmap/cfg"]

        _set(kube, ns, "secrets", "token", {"token": "t1"})
        third = _rolled_to(kube, ns, "web", second, 3)
        assert third["secret/token"] != second["secret/token"]


def test_a_source_named_later_restarts_nothing_and_its_next_change_rolls(
    kube: Kube, control_plane: ControlPlane, ns: str
) -> None:
    _sources_of(kube, ns)
    with Kubelet(kube, ns) as kubelet:
        kubelet.allow("web")
        kube.create(path("deployments", ns), _app("web"))
        first = sources(stamped(kube, ns, "web"))
        wait_healthy(kube, ns, ["web"])
        assert set(first) == {"configmap/cfg"}

        done = subprocess.run(
            [
                "kubectl", "--kubeconfig", str(control_plane.kubeconfig), "-n", ns,
                "annotate", "deployment/web", f"{ANN_EXTRA_SOURCES}=configmap/settings",
            ],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr

        def recorded() -> dict[str, str]:
            text = (get(kube, ns, "web")["metadata"].get("annotations") or {}).get(ANN_OBSERVED)
            return dict(json.loads(text)) if text else {}

        wait_for(lambda: "configmap/settings" in recorded(), what="settings recorded")
        quiet(kube, ns, {"web": first}, 3 * RESYNC)  # the template as it was: no restart
        assert replicasets(kube, ns, "web") == 1
        assert status(control_plane, ns)["web"]["state"] == "current"

        _set(kube, ns, "configmaps", "settings", {"x": "2"})
        now = _rolled_to(kube, ns, "web", first, 2)
        assert set(now) == {"configmap/cfg", "configmap/settings"}
        assert now["configmap/settings"] != recorded().get("configmap/settings", "")


def test_a_source_of_another_namespace_is_never_named(
    kube: Kube, k8s: client.ApiClient, replicas: Replicas, ns: str
) -> None:
    """A tenant's annotation cannot make configpin read or roll for another namespace's
    source: the entry is left out (its admission says so) and a change there rolls nothing."""
    _sources_of(kube, ns)
    with instance_namespace(k8s, replicas.instance, "extra-other") as other:
        kube.create(path("configmaps", other), configmap("settings", {"x": "1"}))
        with Kubelet(kube, ns) as kubelet:
            kubelet.allow("web")
            kube.create(path("deployments", ns), _app("web", f"{other}/configmap/settings"))
            first = sources(stamped(kube, ns, "web"))
            assert set(first) == {"configmap/cfg"}
            _set(kube, other, "configmaps", "settings", {"x": "2"})
            quiet(kube, ns, {"web": first}, 3 * RESYNC)
            assert replicasets(kube, ns, "web") == 1
