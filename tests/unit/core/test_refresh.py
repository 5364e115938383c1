"""on-change: refresh, planned: which changes a running pod can take without a restart (only
through whole-volume mounts), the policy as honoured (unknown values, snapshot mode), and
the workload's refresh record (kept by updates that leave the template, dropped by a
template change). The controller and the pods are tested live (tests/integration)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.unit.conftest import (
    ALL,
    Store,
    admitted,
    apply,
    configmap,
    container,
    env_cm,
    envfrom_cm,
    envfrom_secret,
    plan,
    pod_spec,
    proj_cm,
    proj_secret,
    secret,
    vol_cm,
    vol_projected,
    vol_secret,
    workload,
)
from webhook.core.constants import (
    ANN_OBSERVED,
    ANN_ON_CHANGE,
    ANN_REFRESHED,
)
from webhook.core.kept import dumps_mapping, refreshed_ops
from webhook.core.model import JSONObject, Plan, SourceId, SourceKind
from webhook.core.modes import on_change_policy
from webhook.core.refresh import roll_instead
from webhook.core.refs import unrefreshable
from webhook.kube.pods import controller_uid, selector_text

CFG = SourceId(SourceKind.CONFIGMAP, "cfg")
CREDS = SourceId(SourceKind.SECRET, "creds")
REFRESH = {ANN_ON_CHANGE: "refresh"}


def _mount(volume: str, *, sub_path: str | None = None, expr: bool = False) -> JSONObject:
    m: JSONObject = {"name": volume, "mountPath": f"/etc/{volume}"}
    if sub_path is not None:
        m["subPathExpr" if expr else "subPath"] = sub_path
    return m


def _mounting(*mounts: JSONObject, name: str = "app") -> JSONObject:
    c = container(name)
    c["volumeMounts"] = list(mounts)
    return c


def _store() -> Store:
    return Store([configmap("cfg", {"a": "1", "b": "2"}), secret("creds", {"user": "u"})])


# --- which changes reach a running process


@pytest.mark.parametrize(
    ("volume", "sources"),
    [
        (vol_cm("cfg", volume="v"), [CFG]),
        # items: still a directory the kubelet updates
        (vol_cm("cfg", items=["a"], volume="v"), [CFG]),
        (vol_projected(proj_cm("cfg"), proj_secret("creds"), volume="v"), [CFG, CREDS]),
    ],
)
def test_a_whole_volume_mount_can_be_refreshed(volume: JSONObject, sources: list[Any]) -> None:
    spec = pod_spec(_mounting(_mount("v")), volumes=[volume])
    assert unrefreshable(spec, sources) == {}
    # one the pod spec does not reference (configpin.io/extra-sources names it) cannot be
    unreferenced = unrefreshable(pod_spec(_mounting(_mount("v")), volumes=[]), sources)
    assert {sid: why.how for sid, why in unreferenced.items()} == dict.fromkeys(sources, "extra")


def test_a_volume_no_container_mounts_can_be_refreshed() -> None:
    assert unrefreshable(pod_spec(volumes=[vol_cm("cfg", volume="v")]), [CFG]) == {}


@pytest.mark.parametrize("expr", [False, True])
def test_a_subpath_mount_cannot_be_refreshed(expr: bool) -> None:
    # mounted twice, once whole and once through subPath (by a sidecar): the sidecar's copy
    # never changes in place, so it needs a restart
    spec = pod_spec(
        _mounting(_mount("v")),
        _mounting(_mount("v", sub_path="a", expr=expr), name="sidecar"),
        volumes=[vol_cm("cfg", volume="v")],
    )
    why = unrefreshable(spec, [CFG])
    assert list(why) == [CFG]
    assert (why[CFG].how, why[CFG].container, why[CFG].volume) == ("subPath", "sidecar", "v")
    assert str(why[CFG]) == "volume v is mounted with subPath in container sidecar"


def test_env_and_env_from_cannot_be_refreshed_in_any_container_list() -> None:
    spec = pod_spec(
        container("app", env_from=[envfrom_secret("creds")]),
        init=[container("init", env=[env_cm("cfg", "a")])],
        volumes=[vol_cm("cfg", volume="v"), vol_secret("creds", volume="s")],
    )
    why = unrefreshable(spec, [CFG, CREDS])
    assert (why[CFG].how, why[CFG].container) == ("env", "init")
    assert (why[CREDS].how, why[CREDS].container) == ("envFrom", "app")
    assert str(why[CFG]) == "it reaches container init through an env var"


def test_only_the_sources_asked_about_are_judged() -> None:
    # per-source precision: an env consumer of another source does not stop this one
    spec = pod_spec(
        container("app", env_from=[envfrom_cm("other")]), volumes=[vol_cm("cfg", volume="v")]
    )
    assert unrefreshable(spec, [CFG]) == {}
    assert list(unrefreshable(spec, [SourceId(SourceKind.CONFIGMAP, "other")])) == [
        SourceId(SourceKind.CONFIGMAP, "other")
    ]


def test_hostile_pod_specs_are_judged_without_error() -> None:
    spec: JSONObject = {
        "containers": [
            "x",
            {"name": 3, "volumeMounts": ["y", {"name": 5}, {"name": "v", "subPath": "k"}]},
        ],
        "volumes": [
            None,
            {"configMap": {"name": "cfg"}},
            {"name": "v", "configMap": {"name": "cfg"}},
        ],
    }
    why = unrefreshable(spec, [CFG])
    assert why[CFG].how == "subPath"


# --- the policy, as honoured


@pytest.mark.parametrize(
    ("value", "mode", "policy", "warns"),
    [
        (None, "checksum", "roll", False),
        ("roll", "checksum", "roll", False),
        ("refresh", "checksum", "refresh", False),
        ("refresh", "snapshot", "roll", True),
        ("Refresh", "checksum", "roll", True),
        ("", "checksum", "roll", True),
    ],
)
def test_the_policy_defaults_to_roll_and_refuses_what_it_cannot_do(
    value: str | None, mode: str, policy: str, warns: bool
) -> None:
    annotations = {} if value is None else {ANN_ON_CHANGE: value}
    obj = workload("Deployment", pod_spec(), annotations=annotations)
    got, warning = on_change_policy(obj, mode)
    assert got == policy
    assert (warning is not None) is warns
    if warning:
        assert warning.startswith(ANN_ON_CHANGE) and warning.endswith("it rolls")


def test_admission_warns_on_refresh_in_snapshot_mode_and_on_unknown_policies() -> None:
    store = _store()
    spec = pod_spec(volumes=[vol_cm("cfg")])
    snap = plan(workload("Deployment", spec, annotations=REFRESH), store, mode="snapshot")
    assert snap.on_change == "roll"
    assert any("refused in snapshot mode" in w for w in snap.warnings)
    odd = workload("Deployment", spec, annotations={ANN_ON_CHANGE: "x" * 500})
    unknown = plan(odd, store)
    assert unknown.on_change == "roll"
    assert any("unknown policy" in w and len(w) < 200 for w in unknown.warnings)
    good = plan(workload("Deployment", spec, annotations=REFRESH), store)
    assert good.on_change == "refresh" and good.warnings == []
    # a Pod or a Job is never rolled nor refreshed: nothing to say
    pod = plan(workload("Pod", spec, annotations={ANN_ON_CHANGE: "bogus"}), store)
    assert pod.warnings == [] and pod.on_change == "roll"


# --- the workload's record


def test_an_update_that_leaves_the_template_keeps_the_refresh_record() -> None:
    store = _store()
    created = admitted(
        workload("Deployment", pod_spec(volumes=[vol_cm("cfg")]), annotations=REFRESH), store
    )
    record = dumps_mapping({"configmap/cfg": "new-digest"})
    ops = refreshed_ops(created, record)
    assert {op["path"] for op in ops} == {
        "/metadata/annotations/configpin.io~1observed",
        "/metadata/annotations/configpin.io~1refreshed",
    }
    refreshed = apply(created, Plan(patch=ops))
    assert refreshed["metadata"]["annotations"][ANN_REFRESHED] == record
    # a scale, a label: the record stays, and admission says nothing of a rollback
    scaled = json.loads(json.dumps(refreshed))
    scaled["spec"]["replicas"] = 5
    kept = plan(scaled, store, operation="UPDATE", old=refreshed)
    assert kept.kept and kept.patch == [] and kept.on_change == "refresh"
    # a client that replaced the object whole, dropping configpin's annotations: restored
    replaced = json.loads(json.dumps(scaled))
    del replaced["metadata"]["annotations"][ANN_REFRESHED]
    del replaced["metadata"]["annotations"][ANN_OBSERVED]
    restored = admitted(replaced, store, operation="UPDATE", old=refreshed)
    assert restored["metadata"]["annotations"][ANN_REFRESHED] == record
    assert restored["metadata"]["annotations"][ANN_OBSERVED] == record


def test_a_template_change_drops_the_refresh_record() -> None:
    # new pods start from the template, whose record is current again
    store = _store()
    obj = workload("Deployment", pod_spec(volumes=[vol_cm("cfg")]), annotations=REFRESH)
    created = admitted(obj, store)
    record = dumps_mapping({"configmap/cfg": "older"})
    created["metadata"]["annotations"].update({ANN_REFRESHED: record, ANN_OBSERVED: record})
    changed = json.loads(json.dumps(created))
    changed["spec"]["template"]["spec"]["containers"][0]["image"] = "registry.example/app:2.0"
    after = admitted(changed, store, operation="UPDATE", old=created)
    assert ANN_REFRESHED not in after["metadata"]["annotations"]
    assert ANN_OBSERVED not in after["metadata"]["annotations"]
    # and so does the controller's own re-stamp (a roll of a workload that asks for refresh)
    rolled = admitted(created, store, refresh=ALL)
    assert ANN_REFRESHED not in rolled["metadata"]["annotations"]


# --- refresh or roll, as the controller decides it


def _controller_plan(spec: JSONObject, *, mode: str = "checksum") -> tuple[JSONObject, Plan]:
    store = _store()
    obj = workload("Deployment", spec, annotations=REFRESH)
    stamped = admitted(obj, store, mode=mode)
    store.put(configmap("cfg", {"a": "changed", "b": "2"}))
    return stamped, plan(stamped, store, mode=mode, refresh=ALL)


def test_a_change_through_volumes_only_is_refreshed() -> None:
    spec = pod_spec(_mounting(_mount("v")), volumes=[vol_cm("cfg", volume="v")])
    obj, p = _controller_plan(spec)
    assert roll_instead(obj, p, [CFG]) is None


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        (pod_spec(container(env=[env_cm("cfg", "a")]), volumes=[vol_cm("cfg")]), "env"),
        (pod_spec(container(env_from=[envfrom_cm("cfg")])), "env"),
        (
            pod_spec(_mounting(_mount("v", sub_path="a")), volumes=[vol_cm("cfg", volume="v")]),
            "subpath",
        ),
    ],
)
def test_a_change_that_reaches_env_or_subpath_rolls(spec: JSONObject, reason: str) -> None:
    obj, p = _controller_plan(spec)
    why = roll_instead(obj, p, [CFG])
    assert why is not None and why.reason == reason and not why.reason.in_the_way
    assert "configmap/cfg" in why.why


def test_snapshot_mode_rolls() -> None:
    obj, p = _controller_plan(pod_spec(volumes=[vol_cm("cfg")]), mode="snapshot")
    why = roll_instead(obj, p, [CFG])
    assert why is not None and why.reason == "snapshot-mode"


def test_a_template_pointing_at_copies_rolls_to_point_back() -> None:
    # stamped in snapshot mode, then the server (or the workload) went back to checksum mode:
    # the references must be rewritten, which is a rollout
    store = _store()
    obj = workload("Deployment", pod_spec(volumes=[vol_cm("cfg")]), annotations=REFRESH)
    first = plan(obj, store, mode="snapshot")
    pinned = apply(obj, first)
    store.create_snapshots(first)
    store.put(configmap("cfg", {"a": "changed", "b": "2"}))
    p = plan(pinned, store, refresh=ALL)
    why = roll_instead(pinned, p, [CFG])
    assert why is not None and why.reason == "references"
    assert {
        "op": "replace",
        "path": "/spec/template/spec/volumes/0/configMap/name",
        "value": "cfg",
    } in p.patch


# --- finding a workload's pods


@pytest.mark.parametrize(
    ("selector", "text"),
    [
        ({"matchLabels": {"app": "web", "tier": "a"}}, "app=web,tier=a"),
        (
            {
                "matchLabels": {"app": "web"},
                "matchExpressions": [
                    {"key": "x", "operator": "In", "values": ["1", "2"]},
                    {"key": "y", "operator": "NotIn", "values": ["3"]},
                    {"key": "z", "operator": "Exists"},
                    {"key": "w", "operator": "DoesNotExist"},
                ],
            },
            "app=web,x in (1,2),y notin (3),z,!w",
        ),
        ({"app": "rc"}, "app=rc"),  # a ReplicationController's plain map
        ({}, None),  # selects everything: never
        ({"matchLabels": {}}, None),
        ({"matchExpressions": [{"key": "x", "operator": "Gt"}]}, None),
        ({"matchExpressions": [{"operator": "In", "values": ["a"]}]}, None),
        ("app=web", None),
        (None, None),
    ],
)
def test_selector_text(selector: object, text: str | None) -> None:
    assert selector_text(selector) == text


def test_only_the_controlling_owner_counts() -> None:
    refs = [
        {"uid": "a", "controller": False},
        {"uid": "b", "controller": True},
    ]
    assert controller_uid({"metadata": {"ownerReferences": refs}}) == "b"
    assert controller_uid({"metadata": {"ownerReferences": [{"uid": "a"}]}}) is None
    assert controller_uid({"metadata": {"ownerReferences": ["junk"]}}) is None
