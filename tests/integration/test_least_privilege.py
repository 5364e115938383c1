"""Least privilege, live: the chart's RBAC per mode, and (1.30+) its ValidatingAdmissionPolicy.

The chart is rendered for the capabilities of the running API server, as `helm install`
would, and its ServiceAccount, roles, bindings and policy are created there. Then the test
acts as that ServiceAccount (impersonation) and tries what configpin does and what it must
never be able to do.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from harness.chart import cluster_capabilities, render
from harness.configpin import INSTANCE_LABEL, running_configpin
from harness.controlplane import (
    ENABLED_LABEL,
    ControlPlane,
    default_service_account_ready,
    server_minor,
    service_account_kubeconfig,
    wait_for,
)
from harness.manifests import configmap, container, deployment, env_from, pod_spec
from tests.integration.crds import CLONESET, CLONESET_CRD, ROLLOUT_CRD, WIDGET_CRD, installed
from tests.integration.workloads import Impersonating
from webhook.kube.errors import Forbidden, Invalid, NotFound
from webhook.kube.raw import JSON_PATCH, MERGE_PATCH, Kube, path

KINDS = {
    "ServiceAccount": ("serviceaccounts", "/api/v1", True),
    "Role": ("roles", "/apis/rbac.authorization.k8s.io/v1", True),
    "RoleBinding": ("rolebindings", "/apis/rbac.authorization.k8s.io/v1", True),
    "ClusterRole": ("clusterroles", "/apis/rbac.authorization.k8s.io/v1", False),
    "ClusterRoleBinding": ("clusterrolebindings", "/apis/rbac.authorization.k8s.io/v1", False),
    "ValidatingAdmissionPolicy": (
        "validatingadmissionpolicies",
        "/apis/admissionregistration.k8s.io/v1",
        False,
    ),
    "ValidatingAdmissionPolicyBinding": (
        "validatingadmissionpolicybindings",
        "/apis/admissionregistration.k8s.io/v1",
        False,
    ),
}


@pytest.fixture
def admin(control_plane: ControlPlane) -> Iterator[Kube]:
    with control_plane.api_client() as api:
        yield Kube(api)


class Install:
    """The chart's access objects for one release, created on the API server."""

    def __init__(self, api: client.ApiClient, admin: Kube, values: dict[str, Any]) -> None:
        self.admin = admin
        self.release = f"lp-{secrets.token_hex(3)}"
        self.namespace = self.release
        self.created: list[str] = []
        admin.create(
            path("namespaces"),
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.namespace}},
        )
        version, api_versions = cluster_capabilities(api)
        objects = render(
            values, version, api_versions, release=self.release, namespace=self.namespace
        )
        self.kinds = {o["kind"] for o in objects}
        self.objects = {o["kind"]: o for o in objects}  # by kind (the last of a kind)
        for obj in objects:
            if obj["kind"] not in KINDS:
                continue
            resource, prefix, namespaced = KINDS[obj["kind"]]
            ns = self.namespace if namespaced else None
            admin.create(path(resource, ns, prefix=prefix), obj)
            if not namespaced:
                self.created.append(path(resource, name=obj["metadata"]["name"], prefix=prefix))
        [sa] = [o for o in objects if o["kind"] == "ServiceAccount"]
        self.user = f"system:serviceaccount:{self.namespace}:{sa['metadata']['name']}"
        self.kube = Impersonating(api, self.user)

    @property
    def args(self) -> list[str]:
        """configpin's arguments in the chart's Deployment."""
        args: list[str] = self.objects["Deployment"]["spec"]["template"]["spec"]["containers"][0][
            "args"
        ]
        return args

    @property
    def flags(self) -> dict[str, str]:
        """The chart's `--flag=value` arguments to configpin, by flag."""
        return dict(a.split("=", 1) for a in self.args if a.startswith("--") and "=" in a)

    def kubeconfig(self, plane: ControlPlane, api: client.ApiClient, out: Path) -> Path:
        """A kubeconfig of the chart's ServiceAccount (configpin's own identity), at `out`."""
        sa = self.objects["ServiceAccount"]["metadata"]["name"]
        return service_account_kubeconfig(plane, api, self.namespace, sa, out)

    def app_namespace(self) -> str:
        """Namespace `RELEASE-app`, created in this release's scope (enabled, its instance)."""
        ns = f"{self.release}-app"
        labels = {ENABLED_LABEL: "true", INSTANCE_LABEL: self.release}
        self.admin.create(
            path("namespaces"),
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": labels}},
        )
        return ns

    def remove(self) -> None:
        for api_path in self.created:
            with contextlib.suppress(NotFound):
                self.admin.delete(api_path)
        self.admin.delete(path("namespaces", name=self.namespace))


@pytest.fixture
def install(k8s: client.ApiClient, admin: Kube) -> Iterator[Any]:
    made: list[Install] = []

    def make(values: dict[str, Any]) -> Install:
        made.append(Install(k8s, admin, values))
        return made[-1]

    yield make
    for inst in made:
        inst.remove()


def copy_like(name: str, *, signed: bool = True) -> dict[str, Any]:
    obj = configmap(
        name,
        {"a": "1"},
        labels={"configpin.io/snapshot": "true"},
        annotations={"configpin.io/source": "app-config"}
        | ({"configpin.io/signature": "0" * 64} if signed else {}),
    )
    obj["immutable"] = True
    return obj


def denied(fn: Any) -> bool:
    try:
        fn()
    except (Forbidden, Invalid):
        return True
    return False


def test_checksum_mode_grants_no_write_on_configmaps_or_secrets(
    install: Any, admin: Kube, plain_namespace: str
) -> None:
    inst = install({})  # mode: checksum, snapshots not enabled
    assert "create" not in str(
        [
            r
            for r in admin.get(
                path(
                    "clusterroles",
                    name=f"{inst.release}-configpin",
                    prefix="/apis/rbac.authorization.k8s.io/v1",
                )
            )["rules"]
            if "configmaps" in r["resources"] and "get" not in r["verbs"]
        ]
    )
    as_configpin = inst.kube
    # what it needs: read sources (wait for RBAC's informer to see the new bindings)
    wait_for(
        lambda: not denied(lambda: as_configpin.get(path("configmaps", plain_namespace))),
        what="RBAC to grant the read",
    )
    # what it must not be able to do in checksum mode: write any ConfigMap or Secret
    with pytest.raises(Forbidden):
        as_configpin.create(path("configmaps", plain_namespace), copy_like("x-0123456789"))
    admin.create(path("configmaps", plain_namespace), configmap("users", {"a": "1"}))
    with pytest.raises(Forbidden):
        as_configpin.delete(path("configmaps", plain_namespace, "users"))
    with pytest.raises(Forbidden):
        as_configpin.create(
            path("secrets", plain_namespace), copy_like("y-0123456789") | {"kind": "Secret"}
        )


def test_snapshot_mode_grants_writes_and_the_policy_confines_them(
    install: Any, admin: Kube, k8s: client.ApiClient, plain_namespace: str
) -> None:
    inst = install({"snapshots": {"enabled": True}})
    as_configpin = inst.kube
    ns = plain_namespace
    admin.create(path("configmaps", ns), configmap("users", {"a": "1"}))
    spec = pod_spec(container(env_from=[env_from("configmap", "users")]))
    admin.create(path("deployments", ns), deployment("web", spec))

    # A signed copy may be created and deleted (RBAC grants it; the policy lets it through).
    wait_for(
        lambda: (
            not denied(
                lambda: as_configpin.create(
                    path("configmaps", ns), copy_like("probe-0123456789"), dryRun="All"
                )
            )
        ),
        what="RBAC to grant the copy's creation",
    )
    as_configpin.create(path("configmaps", ns), copy_like("users-0123456789"))
    annotate = [
        {
            "op": "add",
            "path": "/spec/template/metadata/annotations",
            "value": {"configpin.io/checksum": "x"},
        }
    ]
    as_configpin.patch(path("deployments", ns, "web"), annotate, JSON_PATCH)
    repoint = [
        {
            "op": "replace",
            "path": "/spec/template/spec/containers/0/envFrom/0/configMapRef/name",
            "value": "users-0123456789",
        }
    ]
    as_configpin.patch(path("deployments", ns, "web"), repoint, JSON_PATCH, dryRun="All")

    image = [
        {
            "op": "replace",
            "path": "/spec/template/spec/containers/0/image",
            "value": "registry.invalid/evil:1",
        }
    ]
    host = [
        {
            "op": "add",
            "path": "/spec/template/spec/volumes",
            "value": [{"name": "root", "hostPath": {"path": "/"}}],
        }
    ]
    replicas = [{"op": "replace", "path": "/spec/replicas", "value": 50}]

    def forbidden_writes() -> dict[str, bool]:
        return {
            "unlabelled ConfigMap": denied(
                lambda: as_configpin.create(
                    path("configmaps", ns), configmap("plain", {"a": "1"}), dryRun="All"
                )
            ),
            "unsigned look-alike": denied(
                lambda: as_configpin.create(
                    path("configmaps", ns), copy_like("u-0123456789", signed=False), dryRun="All"
                )
            ),
            "delete a user's ConfigMap": denied(
                lambda: as_configpin.delete(path("configmaps", ns, "users") + "?dryRun=All")
            ),
            "change an image": denied(
                lambda: as_configpin.patch(
                    path("deployments", ns, "web"), image, JSON_PATCH, dryRun="All"
                )
            ),
            "mount the host": denied(
                lambda: as_configpin.patch(
                    path("deployments", ns, "web"), host, JSON_PATCH, dryRun="All"
                )
            ),
            "scale": denied(
                lambda: as_configpin.patch(
                    path("deployments", ns, "web"), replicas, JSON_PATCH, dryRun="All"
                )
            ),
        }

    if server_minor(k8s) >= 30:
        assert {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} <= inst.kinds
        wait_for(
            lambda: all(forbidden_writes().values()),
            timeout=30,
            what="the policy to deny every forbidden write",
        )
        # and still allows what configpin does
        as_configpin.patch(path("deployments", ns, "web"), repoint, JSON_PATCH, dryRun="All")
        as_configpin.delete(path("configmaps", ns, "users-0123456789"))
        assert admin.get(path("configmaps", ns, "users"))  # untouched
    else:
        # No ValidatingAdmissionPolicy API before 1.30: RBAC alone, as the chart says.
        assert "ValidatingAdmissionPolicy" not in inst.kinds
        assert not forbidden_writes()["unlabelled ConfigMap"]


def test_checksum_mode_policy_forbids_any_pod_spec_change(
    install: Any, admin: Kube, k8s: client.ApiClient, plain_namespace: str
) -> None:
    if server_minor(k8s) < 30:
        pytest.skip("ValidatingAdmissionPolicy (admissionregistration.k8s.io/v1) is 1.30+")
    inst = install({})
    as_configpin = inst.kube
    ns = plain_namespace
    spec = pod_spec(container(env_from=[env_from("configmap", "users")]))
    admin.create(path("deployments", ns), deployment("web", spec))
    repoint = [
        {
            "op": "replace",
            "path": "/spec/template/spec/containers/0/envFrom/0/configMapRef/name",
            "value": "other",
        }
    ]
    annotate = [
        {
            "op": "add",
            "path": "/spec/template/metadata/annotations",
            "value": {"configpin.io/checksum": "x"},
        }
    ]
    wait_for(
        lambda: denied(
            lambda: as_configpin.patch(
                path("deployments", ns, "web"), repoint, JSON_PATCH, dryRun="All"
            )
        ),
        timeout=30,
        what="the policy to deny a reference change in checksum mode",
    )
    as_configpin.patch(path("deployments", ns, "web"), annotate, JSON_PATCH)


def test_refresh_pods_grants_one_annotation_of_a_pod(
    install: Any, admin: Kube, k8s: client.ApiClient, plain_namespace: str
) -> None:
    """controller.refreshPods (on by default): configpin may patch pods, and on 1.30+ the
    policy narrows that to the configpin.io/refreshed annotation; off, no pod write at all."""
    inst = install({})
    as_configpin = inst.kube
    ns = plain_namespace
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "labels": {"app": "p"}, "annotations": {"team": "a"}},
        "spec": {"containers": [container()]},
    }
    admin.create(path("pods", ns), pod)
    pod_path = path("pods", ns, "p")

    def merge(meta: dict[str, Any], *, as_: Kube = as_configpin) -> Any:
        return lambda: as_.patch(pod_path, {"metadata": meta}, MERGE_PATCH, dryRun="All")

    refreshed = {"annotations": {"configpin.io/refreshed": '{"configmap/c":"d"}'}}
    wait_for(lambda: not denied(merge(refreshed)), what="RBAC to grant the pod patch")
    as_configpin.patch(pod_path, {"metadata": refreshed}, MERGE_PATCH)
    if server_minor(k8s) >= 30:
        others = {
            "a label": {"labels": {"app": "q"}},
            "another annotation": {"annotations": {"team": "b"}},
            "an annotation removed": {"annotations": {"team": None}},
            "a finalizer": {"finalizers": ["example.com/hold"]},
        }
        wait_for(
            lambda: all(denied(merge(m)) for m in others.values()),
            timeout=30,
            what="the policy to deny every other pod change",
        )
        assert not denied(merge({"annotations": {"configpin.io/refreshed": "{}"}}))
    else:
        assert "ValidatingAdmissionPolicy" not in inst.kinds
    off = install({"controller": {"refreshPods": False}})
    wait_for(lambda: not denied(lambda: off.kube.get(path("pods", ns))), what="RBAC for the second")
    assert denied(merge(refreshed, as_=off.kube))


def test_configpin_does_its_work_under_the_charts_rbac_and_policy(
    install: Any,
    admin: Kube,
    k8s: client.ApiClient,
    control_plane: ControlPlane,
    tmp_path: Path,
) -> None:
    """configpin itself, running as the chart's ServiceAccount with only the chart's RBAC (and,
    on 1.30+, under its ValidatingAdmissionPolicy), in snapshot mode: it makes copies, points
    workloads at them, re-points them when the source changes, adopts and sweeps copies."""
    inst = install({"snapshots": {"enabled": True}})
    given = inst.flags
    kubeconfig = inst.kubeconfig(control_plane, k8s, tmp_path / "sa.kubeconfig")
    instance = inst.release
    ns = inst.app_namespace()
    wait_for(lambda: default_service_account_ready(k8s, ns), what="the default ServiceAccount")
    if server_minor(k8s) >= 30:
        # the policy is live before configpin writes anything
        wait_for(
            lambda: denied(
                lambda: inst.kube.create(
                    path("configmaps", ns), configmap("plain", {"a": "1"}), dryRun="All"
                )
            ),
            timeout=30,
            what="the policy in force",
        )
    try:
        with running_configpin(
            control_plane,
            tmp_path / "cp",
            instance=instance,
            webhook_name=f"{inst.release}-webhook",
            args=_as_the_chart(
                kubeconfig, inst, given, "--snapshots", "--snapshot-grace-period", "2"
            ),
        ) as cp:
            wait_for(lambda: cp.metric("configpin_leader") == 1, what="configpin leading")
            admin.create(path("configmaps", ns), configmap("app-config", {"a": "1"}))
            spec = pod_spec(container(env_from=[env_from("configmap", "app-config")]))
            dep = admin.create(
                path("deployments", ns),
                deployment("web", spec, replicas=1, annotations={"configpin.io/mode": "snapshot"}),
            )
            first = dep["spec"]["template"]["spec"]["containers"][0]["envFrom"][0]["configMapRef"][
                "name"
            ]
            assert first.startswith("app-config-"), "pointed at a copy made by configpin's SA"
            copy_obj = admin.get(path("configmaps", ns, first))
            assert copy_obj["metadata"]["annotations"]["configpin.io/signature"]
            # adoption: the ReplicaSet becomes the copy's owner (a patch under the policy)
            wait_for(
                lambda: admin.get(path("configmaps", ns, first))["metadata"].get("ownerReferences"),
                what="the copy adopted by its ReplicaSet",
            )
            # a change: the controller makes a new copy and re-points the template
            admin.patch(
                path("configmaps", ns, "app-config"),
                {"data": {"a": "2"}},
                "application/merge-patch+json",
            )

            def repointed() -> str | None:
                d = admin.get(path("deployments", ns, "web"))
                name = d["spec"]["template"]["spec"]["containers"][0]["envFrom"][0]["configMapRef"][
                    "name"
                ]
                return name if name != first else None

            second = wait_for(repointed, timeout=30, what="the template re-pointed")
            assert second.startswith("app-config-")
            # the sweep: a copy nothing uses is marked, then deleted (under the policy)
            admin.create(path("configmaps", ns), configmap("orphan-src", {"o": "1"}))
            orphan_spec = pod_spec(container(env_from=[env_from("configmap", "orphan-src")]))
            bad = deployment("bad", orphan_spec, annotations={"configpin.io/mode": "snapshot"})
            bad["spec"]["selector"] = {"matchLabels": {"app": "other"}}
            with pytest.raises(Invalid):
                admin.create(path("deployments", ns), bad)
            before = cp.metric("configpin_snapshots_swept_total")
            wait_for(
                lambda: cp.metric("configpin_snapshots_swept_total") > before,
                timeout=60,
                what="an unused copy swept",
            )
            assert "Forbidden" not in cp.log() and "forbidden" not in cp.log()
    finally:
        admin.delete(path("namespaces", name=ns))


def test_custom_kinds_under_the_charts_rbac_and_policy(
    install: Any,
    admin: Kube,
    k8s: client.ApiClient,
    control_plane: ControlPlane,
    tmp_path: Path,
) -> None:
    """Argo Rollouts and a configured kind (CloneSet), with their CRDs served: configpin, as
    the chart's ServiceAccount, pins and re-points them in snapshot mode; as that account,
    what configpin never does to them is refused (RBAC: a kind not configured; 1.30+, the
    policy: anything but ConfigMap/Secret names in their pod spec)."""
    values = {"snapshots": {"enabled": True}, "workloadKinds": [CLONESET]}
    with installed(k8s, ROLLOUT_CRD, CLONESET_CRD, WIDGET_CRD):
        inst = install(values)
        given = inst.flags
        assert given["--workload-kinds"] == CLONESET
        inst.kubeconfig(control_plane, k8s, tmp_path / "sa.kubeconfig")
        ns = inst.app_namespace()
        try:
            _custom_kinds_as_configpin(inst, admin, k8s, control_plane, tmp_path, given, ns)
        finally:
            admin.delete(path("namespaces", name=ns))


def _custom(kind: str, name: str, group_version: str) -> dict[str, Any]:
    spec = pod_spec(container(env_from=[env_from("configmap", "app-config")]))
    return {
        "apiVersion": group_version,
        "kind": kind,
        "metadata": {"name": name, "annotations": {"configpin.io/mode": "snapshot"}},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": spec},
        },
    }


def _as_the_chart(
    kubeconfig: Path,
    inst: Any,
    given: dict[str, str],
    *extra: str,
    chart_flags: tuple[str, ...] = (),
) -> list[str]:
    """configpin's arguments as the chart's Deployment gives them (its Lease, its digest key,
    `chart_flags`), run out of cluster as the chart's ServiceAccount, rolling at once."""
    args = ["--kubeconfig", str(kubeconfig), "--namespace", inst.namespace]
    for flag in ("--lease-name", "--digest-key-secret", *chart_flags):
        args += [flag, given[flag]]
    return [*args, *extra, "--min-rollout-interval", "0", "--coalesce-window", "0"]


def _env_from_name(obj: dict[str, Any]) -> str:
    return str(
        obj["spec"]["template"]["spec"]["containers"][0]["envFrom"][0]["configMapRef"]["name"]
    )


def _custom_kinds_as_configpin(
    inst: Any,
    admin: Kube,
    k8s: client.ApiClient,
    control_plane: ControlPlane,
    tmp_path: Path,
    given: dict[str, str],
    ns: str,
) -> None:
    kubeconfig = tmp_path / "sa.kubeconfig"
    kinds = {
        "Rollout": ("/apis/argoproj.io/v1alpha1", "rollouts", "argoproj.io/v1alpha1"),
        "CloneSet": ("/apis/apps.kruise.io/v1alpha1", "clonesets", "apps.kruise.io/v1alpha1"),
    }
    with running_configpin(
        control_plane,
        tmp_path / "cp",
        instance=inst.release,
        webhook_name=f"{inst.release}-webhook",
        chart_values={"workloadKinds": [CLONESET]},
        args=_as_the_chart(
            kubeconfig, inst, given, "--snapshots", chart_flags=("--workload-kinds",)
        ),
    ) as cp:
        wait_for(lambda: cp.metric("configpin_leader") == 1, what="configpin leading")
        admin.create(path("configmaps", ns), configmap("app-config", {"a": "1"}))
        first = {}
        for kind, (prefix, resource, group_version) in kinds.items():
            made = admin.create(
                path(resource, ns, prefix=prefix), _custom(kind, "web", group_version)
            )
            first[kind] = _env_from_name(made)
            assert first[kind].startswith("app-config-"), kind
        admin.patch(
            path("configmaps", ns, "app-config"),
            {"data": {"a": "2"}},
            "application/merge-patch+json",
        )
        for kind, (prefix, resource, _) in kinds.items():
            wait_for(
                lambda p=prefix, r=resource, k=kind: (
                    _env_from_name(admin.get(path(r, ns, "web", prefix=p))) != first[k]
                ),
                timeout=30,
                what=f"the {kind} re-pointed by configpin's ServiceAccount",
            )
            # and it owns its current copy (an ownerReference written under the policy)
            current = _env_from_name(admin.get(path(resource, ns, "web", prefix=prefix)))
            wait_for(
                lambda c=current, k=kind: (
                    k
                    in {
                        r["kind"]
                        for r in admin.get(path("configmaps", ns, c))["metadata"].get(
                            "ownerReferences"
                        )
                        or ()
                    }
                ),
                what=f"the copy owned by the {kind}",
            )
        assert "Forbidden" not in cp.log() and "forbidden" not in cp.log()

    as_configpin = inst.kube
    rollouts = path("rollouts", ns, "web", prefix="/apis/argoproj.io/v1alpha1")
    # RBAC: a custom resource that is not configured is out of reach
    admin.create(
        path("widgets", ns, prefix="/apis/widgets.example.com/v1"),
        _custom("Widget", "w", "widgets.example.com/v1"),
    )
    with pytest.raises(Forbidden):
        as_configpin.patch(
            path("widgets", ns, "w", prefix="/apis/widgets.example.com/v1"),
            [{"op": "add", "path": "/metadata/annotations/x", "value": "y"}],
            JSON_PATCH,
        )
    if server_minor(k8s) < 30:
        return
    # the policy (1.30+): on a custom kind too, only the names of ConfigMaps/Secrets change
    image = "/spec/template/spec/containers/0/image"
    with pytest.raises(Forbidden, match="only ConfigMap and Secret names"):
        as_configpin.patch(
            rollouts, [{"op": "replace", "path": image, "value": "evil:1"}], JSON_PATCH
        )
    with pytest.raises(Forbidden, match="only annotations"):
        as_configpin.patch(
            rollouts,
            [{"op": "add", "path": "/spec/template/metadata/labels/x", "value": "y"}],
            JSON_PATCH,
        )
