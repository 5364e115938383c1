"""Custom-resource workloads (Argo Rollouts, configured kinds) and operator-owned workloads:
parsing the settings, planning, indexing, and what a tenant cannot make configpin do."""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from tests.unit.conftest import (
    Store,
    admitted,
    apply,
    configmap,
    plan,
    pod_spec,
    reading,
    recorded_sources,
    vol_cm,
)
from webhook.commands.cli import main
from webhook.core.constants import ANN_OWNED, ANN_SOURCES
from webhook.core.current import entry_from_object
from webhook.core.kinds import (
    ARGO_ROLLOUT,
    CopyOwner,
    custom_kinds,
    parse_custom_kinds,
    template_paths,
    use_custom_kinds,
    workload_ref,
)
from webhook.core.model import JSONObject, SourceKind
from webhook.core.owners import (
    left_to_owner,
    operator_owned,
    parse_owner_kinds,
    use_owner_kinds,
)
from webhook.core.reasons import SkipReason
from webhook.core.shape import ShapeError, check_object
from webhook.kube.copies import Copy
from webhook.process.config import Settings
from webhook.process.digestkey import new_key_text

CLONESET = "apps.kruise.io/v1alpha1/clonesets/CloneSet=spec.template"


@pytest.fixture(autouse=True)
def kinds() -> Iterator[None]:
    use_custom_kinds((ARGO_ROLLOUT, *parse_custom_kinds(CLONESET)))
    use_owner_kinds(())
    yield
    use_custom_kinds(())
    use_owner_kinds(())


def custom(
    kind: str,
    spec: JSONObject,
    *,
    api_version: str | None = None,
    annotations: dict[str, str] | None = None,
    owner: dict[str, Any] | None = None,
) -> JSONObject:
    versions = {"Rollout": "argoproj.io/v1alpha1", "CloneSet": "apps.kruise.io/v1alpha1"}
    meta: JSONObject = {"name": "app", "namespace": "team"}
    if annotations:
        meta["annotations"] = annotations
    if owner:
        meta["ownerReferences"] = [owner]
    return {
        "apiVersion": api_version or versions.get(kind, "apps/v1"),
        "kind": kind,
        "metadata": meta,
        "spec": {"replicas": 2, "template": {"metadata": {"labels": {"a": "b"}}, "spec": spec}},
    }


def store() -> Store:
    return Store([configmap("cfg", {"k": "v"}, namespace="team")])


SPEC = reading("cfg", "k")


# --- the setting ---------------------------------------------------------------------------


def test_parse_round_trips_and_names_paths() -> None:
    [kind] = parse_custom_kinds(f" {CLONESET} ,")
    assert (kind.group, kind.versions, kind.resource, kind.kind, kind.template) == (
        "apps.kruise.io",
        ("v1alpha1",),
        "clonesets",
        "CloneSet",
        ("spec", "template"),
    )
    # pinned and re-stamped as a Deployment is; rolls instead of refreshing (its pods are its
    # controller's business); owns the copies its template points at while it does
    assert kind.custom and kind.admitted and kind.rolls and not kind.refreshable
    assert kind.copies is CopyOwner.WHILE_POINTING
    assert str(kind) == CLONESET
    assert kind.prefix() == "/apis/apps.kruise.io/v1alpha1"
    assert pickle.loads(pickle.dumps(kind)) == kind  # (handed to the large-review worker)
    assert template_paths("CloneSet") == (
        ("spec", "template", "metadata"),
        ("spec", "template", "spec"),
    )
    [deep] = parse_custom_kinds("example.com/v1beta2/widgets/Widget=spec.pod.template")
    assert deep.template == ("spec", "pod", "template")


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("apps.kruise.io/v1alpha1/CloneSet=spec.template", "group/version/resource/Kind=path"),
        ("apps.kruise.io/v1alpha1/clonesets/CloneSet", "group/version/resource/Kind=path"),
        ("kruise/v1alpha1/clonesets/CloneSet=spec.template", "DNS subdomain with a dot"),
        ("apps.k8s.io/v1/clonesets/CloneSet=spec.template", "Kubernetes' own"),
        ("apps.kruise.io/1/clonesets/CloneSet=spec.template", "version"),
        ("apps.kruise.io/v1/CloneSets/CloneSet=spec.template", "resource"),
        ("apps.kruise.io/v1/clonesets/cloneSet=spec.template", "CamelCase"),
        ("apps.kruise.io/v1/deployments/Deployment=spec.template", "built-in"),
        ("apps.kruise.io/v1/clonesets/CloneSet=spec.containers[0]", "template path"),
        ("apps.kruise.io/v1/clonesets/CloneSet=", "template path"),
        (f"{CLONESET},{CLONESET}", "configured twice"),
    ],
)
def test_a_wrong_kind_is_refused_at_start_saying_why(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_custom_kinds(text)
    with pytest.raises(ValidationError, match="workload_kinds"):
        Settings(workload_kinds=text)


def test_settings_argo_first_and_switchable() -> None:
    assert Settings().workloads.custom_kinds == (ARGO_ROLLOUT,)
    assert Settings(argo_rollouts=False).workloads.custom_kinds == ()
    both = Settings(workload_kinds=CLONESET).workloads.custom_kinds
    assert [k.kind for k in both] == ["Rollout", "CloneSet"]
    # an entry for Rollout itself (another version, say) replaces the built-in one
    mine = Settings(workload_kinds="argoproj.io/v1beta1/rollouts/Rollout=spec.template")
    assert [str(k) for k in mine.workloads.custom_kinds] == [
        "argoproj.io/v1beta1/rollouts/Rollout=spec.template"
    ]


def test_owner_kinds_setting() -> None:
    assert parse_owner_kinds("Foo.example.com, Bar") == {("example.com", "Foo"), ("", "Bar")}
    for bad, says in (
        ("foo.example.com", "Kind.group"),
        ("Deployment.apps", "configpin's own"),
        ("Job.batch", "configpin's own"),
        ("Foo.Example.com", "Kind.group"),
    ):
        with pytest.raises(ValueError, match=says):
            parse_owner_kinds(bad)
    with pytest.raises(ValidationError, match="pin_owned_by"):
        Settings(pin_owned_by="Deployment.apps")


# --- admission -----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["Rollout", "CloneSet"])
def test_custom_kind_pinned_like_a_deployment(kind: str) -> None:
    obj = custom(kind, SPEC)
    p = plan(obj, store())
    assert p.skipped is None
    out = apply(obj, p)
    assert list(recorded_sources(out)) == ["configmap/cfg"]
    # the same digests as a Deployment with that template: one rule for every kind
    deployment = admitted(custom("Deployment", SPEC), store())
    assert recorded_sources(out) == recorded_sources(deployment)
    assert plan(out, store(), operation="UPDATE", old=out).patch == []


@pytest.mark.parametrize("kind", ["Rollout", "CloneSet"])
def test_custom_kind_snapshot_mode_points_at_copies(kind: str) -> None:
    obj = custom(kind, pod_spec(volumes=[vol_cm("cfg")]))
    p = plan(obj, store(), mode="snapshot")
    [request] = p.snapshots
    out = apply(obj, p)
    assert (
        out["spec"]["template"]["spec"]["volumes"][0]["configMap"]["name"] == request.snapshot_name
    )


def test_unconfigured_or_foreign_group_kinds_are_not_handled() -> None:
    use_custom_kinds(())
    assert plan(custom("CloneSet", SPEC), store()).skipped is SkipReason.NOT_HANDLED
    use_custom_kinds(parse_custom_kinds(CLONESET))
    # same Kind name, another group: not the configured kind (whatever a request says)
    other = custom("CloneSet", SPEC, api_version="evil.example.com/v1")
    assert plan(other, store()).skipped is SkipReason.OTHER_GROUP
    fake = custom("Deployment", SPEC, api_version="evil.example.com/v1")
    assert plan(fake, store()).skipped is not None


def test_custom_template_shape_is_checked() -> None:
    obj = custom("CloneSet", SPEC)
    obj["spec"]["template"]["metadata"]["annotations"] = ["not", "a", "map"]
    with pytest.raises(ShapeError):
        check_object(obj)
    obj = custom("CloneSet", SPEC)
    obj["spec"]["template"]["spec"]["volumes"] = {"not": "a list"}
    with pytest.raises(ShapeError):
        check_object(obj)


def test_a_workloadref_rollout_is_never_stamped() -> None:
    """Argo refuses a workloadRef Rollout whose template has labels or annotations: the pod
    template is the Deployment's, pinned there."""
    obj = custom("Rollout", SPEC)
    obj["spec"]["workloadRef"] = {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"}
    assert workload_ref(obj) == ("apps/v1", "Deployment", "web")
    p = plan(obj, store())
    assert p.skipped is SkipReason.WORKLOAD_REF
    assert p.patch == []
    assert entry_from_object(obj, "checksum") is SkipReason.WORKLOAD_REF
    # a namespace written into it is not Argo's and never read
    obj["spec"]["workloadRef"]["namespace"] = "other-team"
    assert workload_ref(obj) == ("apps/v1", "Deployment", "web")
    # only a Rollout has one
    obj["kind"], obj["apiVersion"] = "CloneSet", "apps.kruise.io/v1alpha1"
    assert workload_ref(obj) is None


def test_custom_kinds_are_indexed_for_the_controller() -> None:
    obj = admitted(custom("CloneSet", SPEC), store())
    obj.pop("apiVersion")  # as a list item carries it
    entry = entry_from_object(obj, "checksum")
    assert entry.ref.kind == "CloneSet"
    assert set(entry.recorded) == {"configmap/cfg"}


def test_copies_are_held_by_custom_owners_only_while_pointing() -> None:
    meta = {
        "name": "cfg-0123456789",
        "namespace": "team",
        "uid": "c",
        "ownerReferences": [
            {"apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout", "name": "r", "uid": "1"},
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "r-1", "uid": "2"},
            {"apiVersion": "evil.example.com/v1", "kind": "Rollout", "name": "x", "uid": "3"},
            {"apiVersion": "batch/v1", "kind": "CronJob", "name": "c", "uid": "4"},
        ],
    }
    copy = Copy.from_object(SourceKind.CONFIGMAP, configmap_like(meta))
    assert copy.cronjobs == {"1", "4"}


def configmap_like(meta: dict[str, Any]) -> JSONObject:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"k": "v"}}


# --- operator-owned workloads --------------------------------------------------------------

OPERATOR = {
    "apiVersion": "example.com/v1",
    "kind": "Database",
    "name": "db",
    "uid": "u",
    "controller": True,
}


def test_operator_owned_is_skipped_by_default_and_said_so() -> None:
    obj = custom("StatefulSet", SPEC, owner=OPERATOR)
    p = plan(obj, store())
    assert p.skipped is SkipReason.OWNED
    assert operator_owned(obj)
    assert entry_from_object(obj, "checksum") is SkipReason.OWNED


def test_operator_owned_pinned_by_annotation_or_owner_kind() -> None:
    obj = custom("StatefulSet", SPEC, owner=OPERATOR, annotations={ANN_OWNED: "pin"})
    assert left_to_owner(obj) is None
    assert ANN_SOURCES in admitted(obj, store())["spec"]["template"]["metadata"]["annotations"]
    entry_from_object(admitted(obj, store()), "checksum")
    plain = custom("StatefulSet", SPEC, owner=OPERATOR)
    use_owner_kinds(parse_owner_kinds("Database.example.com"))
    assert plan(plain, store()).skipped is None
    # the group counts: the same Kind of another group is not opted in
    other = custom("StatefulSet", SPEC, owner={**OPERATOR, "apiVersion": "evil.example.com/v1"})
    assert plan(other, store()).skipped is not None
    assert plan(
        custom("StatefulSet", SPEC, owner={**OPERATOR, "apiVersion": "v1"}), store()
    ).skipped


@pytest.mark.parametrize(
    ("owner", "kind"),
    [
        ({"apiVersion": "apps/v1", "kind": "Deployment"}, "ReplicaSet"),
        ({"apiVersion": "batch/v1", "kind": "CronJob"}, "Job"),
        ({"apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout"}, "ReplicaSet"),
        ({"apiVersion": "apps/v1", "kind": "ReplicaSet"}, "Pod"),
        ({"apiVersion": "example.com/v1", "kind": "Database"}, "Pod"),
    ],
)
def test_the_opt_in_never_reaches_what_a_known_owner_makes(
    owner: dict[str, Any], kind: str
) -> None:
    """A Deployment's annotations are copied onto its ReplicaSets: an opt-in written there
    must not make configpin stamp them (nor any owned Pod)."""
    use_owner_kinds(parse_owner_kinds("Database.example.com"))
    ref = {**owner, "name": "o", "uid": "u", "controller": True}
    obj = custom(kind, SPEC, owner=ref, annotations={ANN_OWNED: "pin"})
    if kind == "Pod":
        obj = {"apiVersion": "v1", "kind": "Pod", "metadata": obj["metadata"], "spec": SPEC}
    assert left_to_owner(obj) is not None
    assert not operator_owned(obj)
    assert plan(obj, store()).skipped is not None


def test_registry_is_what_was_set() -> None:
    assert [k.kind for k in custom_kinds()] == ["Rollout", "CloneSet"]
    use_custom_kinds(())
    assert custom_kinds() == ()
    assert template_paths("Rollout") is None


# --- configpin render ----------------------------------------------------------------------

RENDER_INPUT = """
apiVersion: v1
kind: ConfigMap
metadata: {name: app-config}
data: {a: "1"}
---
apiVersion: argoproj.io/v1alpha1
kind: Rollout
metadata: {name: web}
spec:
  template:
    spec:
      containers: [{name: app, image: x, envFrom: [{configMapRef: {name: app-config}}]}]
---
apiVersion: apps.kruise.io/v1alpha1
kind: CloneSet
metadata: {name: clones}
spec:
  template:
    spec:
      containers: [{name: app, image: x, envFrom: [{configMapRef: {name: app-config}}]}]
"""


def _rendered(tmp_path: Path, capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    source = tmp_path / "in.yaml"
    source.write_text(RENDER_INPUT)
    key = tmp_path / "key"
    key.write_bytes(new_key_text())
    assert main(["render", "-f", str(source), "--digest-key-file", str(key), *args]) == 0
    return {d["kind"]: d for d in yaml.safe_load_all(capsys.readouterr().out) if d}


def test_render_pins_rollouts_and_configured_kinds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = _rendered(tmp_path, capsys, "--workload-kinds", CLONESET, "--mode", "snapshot")
    for kind in ("Rollout", "CloneSet"):
        template = out[kind]["spec"]["template"]
        assert ANN_SOURCES in template["metadata"]["annotations"], kind
        name = template["spec"]["containers"][0]["envFrom"][0]["configMapRef"]["name"]
        assert name.startswith("app-config-"), kind
    # not configured, not known: left as it is
    out = _rendered(tmp_path, capsys, "--no-argo-rollouts")
    assert "metadata" not in out["Rollout"]["spec"]["template"]
    assert "metadata" not in out["CloneSet"]["spec"]["template"]


def test_render_refuses_a_wrong_kind(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["render", "-f", str(tmp_path), "--workload-kinds", "clonesets"]) == 2
    assert "group/version/resource/Kind=path" in capsys.readouterr().err
