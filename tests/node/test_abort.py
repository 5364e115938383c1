"""`kubectl configpin abort` on a real node (issue 47, shared/SPEC.md "Acting on a change"),
judged by what the application containers read: in snapshot mode an abort takes every
container of a wave that completed back to the old content (its environment and its mounted
file), and a later wave never rolls to the aborted content; `retry` rolls it again.

Two Deployments read ConfigMap `settings` (snapshot mode, configpin as the chart installs it:
waves `1,10%,100%`): `front` (2 pods) is wave 1, `back` the next; `back`'s own wave list is
`approve`, so its rollout waits for an approval that nobody gives before the abort: the new
content keeps the reader Ready, so nothing but a person stops the change.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from harness import images
from harness.apps import reader_workload, seen_lines, wait_deployment, workload_pods
from harness.controlplane import service_account_kubeconfig, wait_for
from harness.node import Node
from harness.release import Release
from tests.node.rollouts import (
    all_ready_reading,
    deployment_annotations,
    events,
    rolled_out_reading,
    rollout_record,
    set_greeting,
    template_config,
    until,
)
from tests.timing import NODE_SETTLE
from webhook.core.constants import (
    ANN_HELD,
    ANN_MODE,
    ANN_REJECTED,
    ANN_ROLLOUT_WAVES,
    ANN_WAVE,
    MODE_SNAPSHOT,
)
from webhook.core.rollouts import GROUP, PLURAL, VERSION
from webhook.kube.errors import NotFound
from webhook.kube.raw import Kube, path

pytestmark = pytest.mark.usefixtures("pinned")

OLD = {"file:/config/greeting": "old", "env:GREETING": "old"}
NEW = {"file:/config/greeting": "new", "env:GREETING": "new"}
RBAC = "/apis/rbac.authorization.k8s.io/v1"
# The chart's --min-rollout-interval (30 s) spaces a workload's rollouts: the retry's waits
# for it after the abort's undo, on top of a rollout's own time.
ROLL = 150


def _editor(node: Node, k8s: client.ApiClient, ns: str, out: Path) -> Path:
    """A kubeconfig of ServiceAccount `editor` of `ns`, who may read and update its ConfigMaps
    and nothing else (what the verbs need: the right to update the source)."""
    admin = Kube(k8s)
    admin.create(path("serviceaccounts", ns), {"metadata": {"name": "editor"}})
    rule = {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "update", "patch"]}
    role = {"metadata": {"name": "editor"}, "rules": [rule]}
    admin.create(f"{RBAC}/namespaces/{ns}/roles", role)
    binding = {
        "metadata": {"name": "editor"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "editor"},
        "subjects": [{"kind": "ServiceAccount", "name": "editor", "namespace": ns}],
    }
    admin.create(f"{RBAC}/namespaces/{ns}/rolebindings", binding)
    return service_account_kubeconfig(node.plane, k8s, ns, "editor", out)


def _configpin(kubeconfig: Path, *argv: str) -> str:
    """`kubectl configpin ARGV` as the user of `kubeconfig`; what it said."""
    plugin = str(Path(sys.executable).parent / "kubectl-configpin")
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    done = subprocess.run(
        [plugin, *argv], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _said(k8s: client.ApiClient, ns: str) -> tuple[str, str] | None:
    """The ConfigRollout's condition that is True, once its status is about the ConfigMap as it
    stands: (type, reason)."""
    kube = Kube(k8s)
    try:
        cr = kube.get(path(PLURAL, ns, "configmap-settings", prefix=f"/apis/{GROUP}/{VERSION}"))
    except NotFound:
        return None
    stands = kube.get(path("configmaps", ns, "settings"))["metadata"]["resourceVersion"]
    status: dict[str, Any] = cr.get("status") or {}
    if (status.get("source") or {}).get("resourceVersion") != stands:
        return None
    true = [c for c in status.get("conditions") or () if c.get("status") == "True"]
    return (true[0]["type"], true[0].get("reason", "")) if true else None


def _reading(k8s: client.ApiClient, ns: str, name: str, content: dict[str, str]) -> bool:
    """`name` rolled out, every container of it reading `content` (its file and its env)."""
    return all(rolled_out_reading(k8s, ns, name, key, value) for key, value in content.items())


def _all_reading(k8s: client.ApiClient, ns: str, name: str, content: dict[str, str]) -> None:
    for key, value in content.items():
        all_ready_reading(k8s, ns, name, key, value)


def test_abort_takes_every_container_of_wave_1_back_and_wave_2_never_rolls_then_retry(
    node: Node, k8s: client.ApiClient, snapshots: Release, namespace: str, tmp_path: Path
) -> None:
    ns = namespace
    set_greeting(k8s, ns, "old", create=True)
    apps = client.AppsV1Api(k8s)
    for name, replicas, notes in (
        ("front", 2, {ANN_WAVE: "0"}),
        ("back", 1, {ANN_WAVE: "1", ANN_ROLLOUT_WAVES: "approve"}),
    ):
        body = reader_workload(
            "Deployment",
            name,
            images.SHELL.ref,
            configmap="settings",
            files=["greeting"],
            env={"GREETING": "greeting"},
            replicas=replicas,
            annotations={ANN_MODE: MODE_SNAPSHOT, **notes},
        )
        apps.create_namespaced_deployment(ns, body)
    for name in ("front", "back"):
        wait_deployment(k8s, ns, name)
        wait_for(lambda n=name: _reading(k8s, ns, n, OLD), timeout=60, what=f"{name} reading old")
    first = {name: template_config(k8s, ns, name) for name in ("front", "back")}
    back_pods = {p.metadata.name for p in workload_pods(k8s, ns, "back")}
    editor = _editor(node, k8s, ns, tmp_path / "editor.kubeconfig")
    user = f"system:serviceaccount:{ns}:editor"

    def back_rolled() -> str | None:
        """What says `back` rolled: its template re-pointed, or a pod other than its first."""
        if template_config(k8s, ns, "back") != first["back"]:
            return "back's template was re-stamped"
        pods = {p.metadata.name for p in workload_pods(k8s, ns, "back")}
        return f"back's pods changed: {sorted(pods)}" if pods != back_pods else None

    # The change, fine for the reader: wave 1 rolls and completes, both its pods on it.
    set_greeting(k8s, ns, "new")
    until(
        lambda: (
            rollout_record(k8s, ns, "front").get("state") == "complete"
            and _reading(k8s, ns, "front", NEW)
        ),
        never=back_rolled,
        timeout=120,
        interval=0.5,
        what="wave 1 (front) complete, every container reading the new content",
    )
    assert template_config(k8s, ns, "front") != first["front"]
    assert len(workload_pods(k8s, ns, "front")) == 2
    _all_reading(k8s, ns, "front", NEW)
    # Wave 2 is reached, and held for the approval.
    until(
        lambda: deployment_annotations(k8s, ns, "back").get(ANN_HELD, "").startswith("Awaiting"),
        never=back_rolled,
        timeout=60,
        interval=0.5,
        what="wave 2 (back) awaiting its approval",
    )

    said = _configpin(editor, "abort", "configmap/settings", "-n", ns)
    assert said.startswith(f"aborted configmap/settings in {ns}") and f"by {user}" in said, said

    # Every container of wave 1 reads the old content again: its pods are those of the old
    # copy, environment and file alike.
    until(
        lambda: rollout_record(k8s, ns, "front").get("state") == "failed",
        never=back_rolled,
        timeout=90,
        interval=0.5,
        what="front taken back",
    )
    record = rollout_record(k8s, ns, "front")
    assert record["action"] == "undo" and f"aborted by {user}" in record["signal"], record
    assert template_config(k8s, ns, "front") == first["front"]
    assert "configmap/settings" in deployment_annotations(k8s, ns, "front")[ANN_REJECTED]
    until(
        lambda: _reading(k8s, ns, "front", OLD),
        never=back_rolled,
        timeout=90,
        interval=0.5,
        what="every container of front reading the old content again",
    )
    assert len(workload_pods(k8s, ns, "front")) == 2
    _all_reading(k8s, ns, "front", OLD)
    until(
        lambda: _said(k8s, ns) == ("Stalled", "Aborted"),
        never=back_rolled,
        timeout=60,
        interval=0.5,
        what="the ConfigRollout Stalled/Aborted",
    )
    wait_for(
        lambda: deployment_annotations(k8s, ns, "back").get(ANN_HELD, "").startswith("Aborted"),
        timeout=30,
        what="back held: Aborted",
    )
    wait_for(lambda: events(k8s, ns, "ConfigRolloutAborted"), timeout=30, what="the Event")

    # It stays so: nothing rolls to the aborted content, and wave 2's container never read it.
    settle = time.monotonic() + NODE_SETTLE
    while time.monotonic() < settle:
        assert (rolled := back_rolled()) is None, rolled
        assert template_config(k8s, ns, "front") == first["front"]
        time.sleep(0.5)
    _all_reading(k8s, ns, "front", OLD)
    _all_reading(k8s, ns, "back", OLD)
    for pod in back_pods:
        lines = seen_lines(k8s, ns, pod)
        assert lines and all(s.values.get(k) == v for s in lines for k, v in OLD.items()), lines

    # retry rolls it again from wave 1; approved, wave 2 rolls too.
    said = _configpin(editor, "retry", "configmap/settings", "-n", ns)
    assert said.startswith(f"retried configmap/settings in {ns}"), said
    _configpin(editor, "approve", "configmap/settings", "-n", ns)
    for name in ("front", "back"):
        wait_for(
            lambda n=name: (
                rollout_record(k8s, ns, n).get("state") == "complete" and _reading(k8s, ns, n, NEW)
            ),
            timeout=ROLL,
            interval=1.0,
            what=f"{name} rolled again, every container reading the new content",
        )
        _all_reading(k8s, ns, name, NEW)
    wait_for(lambda: _said(k8s, ns) == ("Ready", "Delivered"), timeout=60, what="delivered")
