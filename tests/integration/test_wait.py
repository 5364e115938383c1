"""`configpin wait` against the real API server (shared/SPEC.md "Changes as objects"), the CLI run
as a person runs it, with a kubeconfig. The test plays configpin's controller: it installs the
chart's ConfigRollout CRD and publishes each status through the `/status` subresource, built
with `rollout_status` as the controller builds it, in a namespace no configpin acts on.

- Ready about the ConfigMap as it stands: exit 0, also for `-f FILE`; Ready about the version
  before it (the ConfigMap updated since): still waiting, until Ready is said of the new one;
- Stalled (rolled back): exit 1 with the reason, the highest of several sources' codes;
- still rolling at `--timeout 3s`: exit 2 naming the source and what it last said;
- a ConfigMap that does not exist: exit 2;
- a user who may read the ConfigMap but not configrollouts: exit 2 naming the right.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from harness.controlplane import ControlPlane, service_account_kubeconfig, wait_for
from harness.manifests import configmap, container, deployment, env_key_ref, pod_spec
from webhook.core.model import SourceKind
from webhook.core.rollouts import (
    API_VERSION,
    KIND,
    ChangeView,
    MemberState,
    MemberView,
    RolloutReason,
    rollout_name,
    rollout_path,
    rollout_status,
)
from webhook.kube.errors import AlreadyExists, NotFound
from webhook.kube.raw import MERGE_PATCH, Kube, path

BIN = Path(sys.executable).parent
CRD_FILE = (
    Path(__file__).resolve().parents[2]
    / "charts"
    / "configpin"
    / "crds"
    / "configrollouts.configpin.io.yaml"
)
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
NOW = "2026-05-01T10:00:00Z"


@pytest.fixture(scope="module")
def configrollouts(kube: Kube) -> None:
    """The chart's ConfigRollout CRD, created unless another test (or the session) did, and
    served. Left installed: others may read it."""
    crd = yaml.safe_load(CRD_FILE.read_text())
    with contextlib.suppress(AlreadyExists):
        kube.create(CRDS, crd)

    def established() -> bool:
        conditions = (kube.get(f"{CRDS}/{crd['metadata']['name']}").get("status") or {}).get(
            "conditions"
        ) or []
        return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)

    def served() -> bool:
        try:
            kube.get(rollout_path("default"))
        except NotFound:
            return False
        return True

    wait_for(established, what="the ConfigRollout CRD established")
    wait_for(served, what="configrollouts served")


def _member(ns: str, state: MemberState, reason: RolloutReason | None = None) -> MemberView:
    message = {MemberState.ROLLING: "1 of 2 updated pods ready"}.get(state, "")
    if reason is RolloutReason.ROLLED_BACK:
        message = "its new pods crash (CrashLoopBackOff): undone"
    return MemberView(ns, "Deployment", "web", 1, state, reason, message)


def publish(
    kube: Kube,
    ns: str,
    kind: SourceKind,
    name: str,
    state: MemberState,
    *,
    about: str | None = None,
) -> None:
    """Publish the ConfigRollout of source `kind/name` as configpin's controller does: one
    member in one wave, in `state`, about the source as it stands (or at resourceVersion
    `about`), through the status subresource."""
    source = kube.get(path(kind.resource, ns, name))
    crname = rollout_name(kind, name)
    try:
        cr = kube.get(rollout_path(ns, crname))
    except NotFound:
        body = {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {"name": crname},
            "spec": {"source": {"kind": kind.api_kind, "name": name}},
        }
        cr = kube.create(rollout_path(ns), body)
    reason = RolloutReason.ROLLED_BACK if state is MemberState.FAILED else None
    status = rollout_status(
        source=f"{kind}/{name}",
        uid=source["metadata"]["uid"],
        resource_version=about or source["metadata"]["resourceVersion"],
        generation=cr["metadata"]["generation"],
        change=ChangeView(content="0123456789ab", keys=("level",)),
        waves=[[_member(ns, state, reason)]],
        consumers=1,
        now=NOW,
        previous=cr.get("status") or {},
    )
    kube.replace(rollout_path(ns, crname) + "/status", {**cr, "status": status})


def _argv(*args: str) -> list[str]:
    return [str(BIN / "configpin"), "wait", *args]


def _env(kubeconfig: Path) -> dict[str, str]:
    return {**os.environ, "KUBECONFIG": str(kubeconfig)}


def configpin_wait(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        _argv(*args), capture_output=True, text=True, env=_env(kubeconfig), timeout=60, check=False
    )


@contextlib.contextmanager
def waiting(kubeconfig: Path, *args: str) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        _argv(*args),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(kubeconfig),
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)


def _set(kube: Kube, ns: str, name: str, data: dict[str, str]) -> str:
    """The ConfigMap's data set; its new resourceVersion."""
    obj = kube.patch(path("configmaps", ns, name), {"data": data}, content_type=MERGE_PATCH)
    version: str = obj["metadata"]["resourceVersion"]
    return version


@pytest.mark.usefixtures("configrollouts")
def test_ready_about_the_configmap_as_it_stands_and_never_about_an_earlier_version(
    control_plane: ControlPlane, kube: Kube, plain_namespace: str, tmp_path: Path
) -> None:
    ns = plain_namespace
    kube.create(path("configmaps", ns), configmap("cfg", {"level": "info"}))
    publish(kube, ns, SourceKind.CONFIGMAP, "cfg", MemberState.COMPLETE)
    manifest = tmp_path / "cfg.yaml"
    manifest.write_text(yaml.safe_dump(configmap("cfg", {"level": "info"})))
    done = configpin_wait(control_plane.kubeconfig, "-f", str(manifest), "-n", ns)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("configmap/cfg delivered (Ready: delivered: 1 of 1 ")

    # The next change, as `kubectl apply` stores it: the status is still the one before it.
    before = kube.get(rollout_path(ns, "configmap-cfg"))["status"]["source"]["resourceVersion"]
    now = _set(kube, ns, "cfg", {"level": "debug"})
    assert now != before
    with waiting(control_plane.kubeconfig, "configmap/cfg", "-n", ns, "--timeout", "40s") as proc:
        time.sleep(3)
        assert proc.poll() is None, proc.communicate()
        publish(kube, ns, SourceKind.CONFIGMAP, "cfg", MemberState.ROLLING)
        time.sleep(2)
        assert proc.poll() is None, proc.communicate()
        publish(kube, ns, SourceKind.CONFIGMAP, "cfg", MemberState.COMPLETE)
        out, err = proc.communicate(timeout=15)
    assert proc.returncode == 0, out + err
    assert out.startswith("configmap/cfg delivered (Ready: ")
    assert f"about resourceVersion {before}, not {now}" in err
    assert "configmap/cfg: Reconciling Rolling: rolling: deployment/web: 1 of 2 updated" in err


@pytest.mark.usefixtures("configrollouts")
def test_stalled_exits_1_with_its_reason_the_highest_of_its_sources(
    control_plane: ControlPlane, kube: Kube, plain_namespace: str
) -> None:
    ns = plain_namespace
    kube.create(path("configmaps", ns), configmap("cfg", {"level": "info"}))
    secret = {"metadata": {"name": "db"}, "stringData": {"password": "s3cret"}}
    kube.create(path("secrets", ns), secret)
    publish(kube, ns, SourceKind.CONFIGMAP, "cfg", MemberState.COMPLETE)
    publish(kube, ns, SourceKind.SECRET, "db", MemberState.FAILED)
    done = configpin_wait(control_plane.kubeconfig, "configmap/cfg", "secret/db", "-n", ns)
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("configmap/cfg delivered (Ready: ")
    assert lines[1].startswith("secret/db failed (Stalled RolledBack: rolled back: deployment/web")
    assert "s3cret" not in done.stdout + done.stderr


@pytest.mark.usefixtures("configrollouts")
def test_the_timeout_exits_2_naming_the_source_and_what_it_last_said(
    control_plane: ControlPlane, kube: Kube, plain_namespace: str
) -> None:
    ns = plain_namespace
    kube.create(path("configmaps", ns), configmap("cfg", {"level": "info"}))
    publish(kube, ns, SourceKind.CONFIGMAP, "cfg", MemberState.ROLLING)
    start = time.monotonic()
    done = configpin_wait(control_plane.kubeconfig, "cm/cfg", "-n", ns, "--timeout", "3s")
    assert done.returncode == 2, done.stdout + done.stderr
    assert time.monotonic() - start >= 3
    assert done.stdout == ""
    assert "configpin wait: timed out after 3s" in done.stderr
    assert "configpin wait: configmap/cfg not done: Reconciling Rolling" in done.stderr


@pytest.mark.usefixtures("configrollouts")
def test_a_kubeconfig_list_is_read_as_kubectl_reads_it(
    control_plane: ControlPlane, kube: Kube, plain_namespace: str, tmp_path: Path
) -> None:
    """KUBECONFIG lists a file that is not there, the user's own context (naming the
    namespace) and then the file with the cluster and credentials: they are merged, the first
    current-context wins, and the wait needs no -n."""
    ns = plain_namespace
    kube.create(path("configmaps", ns), configmap("cfg", {"level": "info"}))
    publish(kube, ns, SourceKind.CONFIGMAP, "cfg", MemberState.COMPLETE)
    real = yaml.safe_load(control_plane.kubeconfig.read_text())
    [context] = [c for c in real["contexts"] if c["name"] == real["current-context"]]
    mine = tmp_path / "mine"
    named = {"cluster": context["context"]["cluster"], "user": context["context"]["user"]}
    mine.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "contexts": [{"name": "mine", "context": {**named, "namespace": ns}}],
                "current-context": "mine",
            }
        )
    )
    listed = os.pathsep.join([str(tmp_path / "missing"), str(mine), str(control_plane.kubeconfig)])
    done = subprocess.run(
        _argv("configmap/cfg"),
        capture_output=True,
        text=True,
        env={**os.environ, "KUBECONFIG": listed},
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("configmap/cfg delivered (Ready: ")


@pytest.mark.usefixtures("configrollouts")
def test_a_missing_configmap_exits_2(control_plane: ControlPlane, plain_namespace: str) -> None:
    done = configpin_wait(control_plane.kubeconfig, "configmap/nowhere", "-n", plain_namespace)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"configmap/nowhere in namespace {plain_namespace} not found" in done.stderr


@pytest.mark.usefixtures("configrollouts")
def test_a_user_who_may_not_read_configrollouts_is_told_the_right_it_lacks(
    control_plane: ControlPlane,
    k8s: client.ApiClient,
    kube: Kube,
    plain_namespace: str,
    tmp_path: Path,
) -> None:
    ns = plain_namespace
    kube.create(path("configmaps", ns), configmap("cfg", {"level": "info"}))
    publish(kube, ns, SourceKind.CONFIGMAP, "cfg", MemberState.COMPLETE)
    kube.create(path("serviceaccounts", ns), {"metadata": {"name": "viewer"}})
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}"
    rule: dict[str, Any] = {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}
    kube.create(f"{rbac}/roles", {"metadata": {"name": "viewer"}, "rules": [rule]})
    kube.create(
        f"{rbac}/rolebindings",
        {
            "metadata": {"name": "viewer"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "viewer"},
            "subjects": [{"kind": "ServiceAccount", "name": "viewer", "namespace": ns}],
        },
    )
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": f"system:serviceaccount:{ns}:viewer",
            "resourceAttributes": {"namespace": ns, "verb": "get", "resource": "configmaps"},
        },
    }
    wait_for(  # (RBAC's authorizer reads the Role from its informer: shortly after)
        lambda: (
            kube.create("/apis/authorization.k8s.io/v1/subjectaccessreviews", review)
            .get("status", {})
            .get("allowed")
        ),
        what="the viewer may get configmaps",
    )
    viewer = service_account_kubeconfig(control_plane, k8s, ns, "viewer", tmp_path / "viewer")
    done = configpin_wait(viewer, "configmap/cfg", "-n", ns)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"wait needs 'get' on configrollouts.configpin.io in namespace {ns}" in done.stderr
    assert "forbidden" in done.stderr  # the API server's own answer


@pytest.mark.usefixtures("configrollouts")
def test_a_source_nothing_consumes_has_nothing_to_deliver_one_consumed_waits_for_its_object(
    control_plane: ControlPlane, kube: Kube, plain_namespace: str
) -> None:
    """`wait -f` over a folder that also holds a ConfigMap no workload reads: that one is done
    at once (exit 0, nothing to deliver); one a Deployment reads, with no ConfigRollout yet
    (configpin has not published it: here nobody does), is waited for until the timeout."""
    ns = plain_namespace
    kube.create(path("configmaps", ns), configmap("alone", {"a": "1"}))
    done = configpin_wait(control_plane.kubeconfig, "configmap/alone", "-n", ns)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "configmap/alone delivered (no workload consumes it: nothing to deliver)" in done.stdout
    kube.create(path("configmaps", ns), configmap("read", {"a": "1"}))
    reader = deployment(
        "app", pod_spec(container(env=[env_key_ref("configmap", "read", "a", "A")])), replicas=0
    )
    kube.create(path("deployments", ns), reader)
    done = configpin_wait(
        control_plane.kubeconfig, "configmap/read", "configmap/alone", "-n", ns, "--timeout", "3s"
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "configpin wait: configmap/read not done: no ConfigRollout yet" in done.stderr
