"""Planning a mutation: which objects change, the annotations and the patch, snapshot mode."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable

import jsonpatch
import pytest

from tests.unit.conftest import (
    ALL,
    HKEY,
    MUTABLE_TEMPLATE_KINDS,
    NSKEY,
    WORKLOAD_KINDS,
    Store,
    admitted,
    apply,
    b64,
    configmap,
    container,
    env_cm,
    env_secret,
    envfrom_cm,
    envfrom_secret,
    plan,
    pod_spec,
    proj_cm,
    proj_secret,
    reading,
    record,
    recorded_checksum,
    recorded_sources,
    secret,
    spec_of,
    template_annotations,
    template_meta_of,
    vol_cm,
    vol_projected,
    vol_secret,
    workload,
)
from webhook.core import digest
from webhook.core.constants import (
    ANN_CHECKSUM,
    ANN_IGNORE,
    ANN_MODE,
    ANN_OBSERVED,
    ANN_SOURCES,
    LABEL_SNAPSHOT,
    LABEL_SOURCE,
    SERVICE_ACCOUNT_TOKEN_TYPE,
)
from webhook.core.kept import dumps_mapping, parse_mapping
from webhook.core.model import JSONObject, SourceId, SourceKind
from webhook.core.names import (
    MAX_NAME,
    SUFFIX_LEN,
    escape_pointer,
    is_dns1123_subdomain,
    pointer,
    snapshot_name,
)
from webhook.core.plan import plan_object
from webhook.core.reasons import SkipReason
from webhook.core.refs import CONTAINER_LISTS, get_path
from webhook.core.snapshot import snapshot_object

CM = SourceKind.CONFIGMAP
SECRET = SourceKind.SECRET


def _digest(obj: JSONObject, keys: list[str] | None = None) -> str:
    return digest.source_digest(NSKEY, record(obj), keys)


def _store() -> Store:
    return Store(
        [
            configmap("cfg", {"a": "1", "b": "2"}),
            secret("creds", {"user": "admin", "pass": "pw"}),
        ]
    )


def _deploy(*entries: JSONObject, volumes: list[JSONObject] | None = None) -> JSONObject:
    return workload("Deployment", pod_spec(container(env=entries), volumes=volumes or []))


# ---- every workload kind ----


@pytest.mark.parametrize("kind", WORKLOAD_KINDS)
def test_every_workload_kind_is_stamped(kind: str) -> None:
    store = _store()
    obj = workload(
        kind,
        pod_spec(container(env_from=[envfrom_cm("cfg")]), volumes=[vol_secret("creds")]),
    )
    p = plan(obj, store)
    out = apply(obj, p)
    expected = {
        "configmap/cfg": _digest(store.objects[SourceId(CM, "cfg")]),
        "secret/creds": _digest(store.objects[SourceId(SECRET, "creds")]),
    }
    assert p.sources == expected
    assert recorded_sources(out) == expected
    assert recorded_checksum(out) == digest.checksum(NSKEY, expected)
    # the sources annotation is canonical JSON
    assert template_annotations(out)[ANN_SOURCES] == json.dumps(
        expected, sort_keys=True, separators=(",", ":")
    )
    # No record of its own on the workload: it is current, the template's sources say it all.
    assert p.observed == expected
    assert (out["metadata"].get("annotations") or {}).get(ANN_OBSERVED) is None
    assert p.mode == "checksum" and p.skipped is None and not p.warnings


@pytest.mark.parametrize("kind", WORKLOAD_KINDS)
def test_every_workload_kind_replanned_gives_no_patch(kind: str) -> None:
    store = _store()
    obj = workload(kind, reading("cfg", "a"))
    out = admitted(obj, store)
    assert plan(out, store).patch == []


@pytest.mark.parametrize("kind", MUTABLE_TEMPLATE_KINDS)
def test_update_of_a_template_is_planned(kind: str) -> None:
    store = _store()
    old = workload(kind, reading("cfg", "a"))
    old = admitted(old, store)
    new = copy.deepcopy(old)
    spec_of(new)["containers"][0]["env"].append(env_secret("creds", "pass"))
    p = plan(new, store, operation="UPDATE", old=old)
    assert set(recorded_sources(apply(new, p))) == {"configmap/cfg", "secret/creds"}


@pytest.mark.parametrize("kind", ["Pod", "Job"])
def test_pods_and_jobs_on_update_are_untouched(kind: str) -> None:
    # Their pod template cannot change after creation: a patch would be refused.
    store = _store()
    obj = workload(kind, reading("cfg", "a"))
    p = plan(obj, store, operation="UPDATE", old=obj)
    assert p.patch == [] and p.skipped is SkipReason.FIXED_TEMPLATE
    assert store.lookups == []


@pytest.mark.parametrize("kind", ["Service", "ConfigMap", "Namespace", "PodTemplate"])
def test_other_kinds_are_skipped(kind: str) -> None:
    p = plan_object({"kind": kind, "metadata": {"name": "x"}}, hkey=HKEY, lookup=_store().lookup)
    assert p.patch == [] and p.skipped is SkipReason.NOT_HANDLED


def test_a_workload_without_a_pod_spec_is_skipped() -> None:
    p = plan({"kind": "Deployment", "metadata": {"name": "d"}, "spec": {}}, _store())
    assert p.patch == [] and p.skipped is SkipReason.NO_POD_SPEC


# ---- every reference kind, in every container list ----


@pytest.mark.parametrize("clist", CONTAINER_LISTS)
@pytest.mark.parametrize(
    ("entry", "sid", "keys"),
    [
        (env_cm("cfg", "a"), "configmap/cfg", ["a"]),
        (env_secret("creds", "pass"), "secret/creds", ["pass"]),
    ],
    ids=["configMapKeyRef", "secretKeyRef"],
)
def test_env_value_from_references(
    clist: str, entry: JSONObject, sid: str, keys: list[str]
) -> None:
    store = _store()
    c = container("c", env=[entry])
    spec = {
        "containers": pod_spec(c)["containers"],
        "initContainers": pod_spec(container("main"), init=[c])["initContainers"],
        "ephemeralContainers": pod_spec(container("main"), ephemeral=[c])["ephemeralContainers"],
    }
    pod = {"containers": [container("main")], clist: spec[clist]}
    p = plan(workload("Pod", pod), store)
    src = store.objects[SourceId.parse(sid)]
    assert p.sources == {sid: _digest(src, keys)}


@pytest.mark.parametrize("clist", CONTAINER_LISTS)
@pytest.mark.parametrize(
    ("entry", "sid"),
    [(envfrom_cm("cfg"), "configmap/cfg"), (envfrom_secret("creds"), "secret/creds")],
    ids=["configMapRef", "secretRef"],
)
def test_env_from_references(clist: str, entry: JSONObject, sid: str) -> None:
    store = _store()
    pod = {"containers": [container("main")]}
    pod.setdefault(clist, []).append(container("c", env_from=[entry]))
    p = plan(workload("Pod", pod), store)
    assert p.sources == {sid: _digest(store.objects[SourceId.parse(sid)])}


@pytest.mark.parametrize(
    ("volume", "sid"),
    [
        (vol_cm("cfg"), "configmap/cfg"),
        (vol_secret("creds"), "secret/creds"),
        (vol_projected(proj_cm("cfg")), "configmap/cfg"),
        (vol_projected(proj_secret("creds")), "secret/creds"),
    ],
    ids=["configMap", "secret", "projected-configMap", "projected-secret"],
)
def test_volume_references(volume: JSONObject, sid: str) -> None:
    store = _store()
    p = plan(workload("Pod", pod_spec(volumes=[volume])), store)
    assert p.sources == {sid: _digest(store.objects[SourceId.parse(sid)])}


# ---- per-key precision ----


@pytest.mark.parametrize(
    "consume",
    [
        lambda: reading("cfg", "a"),
        lambda: pod_spec(volumes=[vol_cm("cfg", items=["a"])]),
        lambda: pod_spec(volumes=[vol_projected(proj_cm("cfg", items=["a"]))]),
    ],
    ids=["valueFrom", "items", "projected-items"],
)
def test_a_change_to_another_key_changes_no_digest(consume: Callable[[], JSONObject]) -> None:
    store = _store()
    obj = workload("Deployment", consume())
    out = admitted(obj, store)
    store.put(configmap("cfg", {"a": "1", "b": "changed", "c": "new"}))
    assert plan(out, store).patch == []  # nothing rolls
    store.put(configmap("cfg", {"a": "changed", "b": "2"}))
    changed = plan(out, store)
    assert changed.patch != []
    assert (
        recorded_sources(apply(out, changed))["configmap/cfg"]
        != recorded_sources(out)["configmap/cfg"]
    )


def test_secret_key_precision() -> None:
    store = _store()
    obj = _deploy(env_secret("creds", "pass"))
    out = admitted(obj, store)
    store.put(secret("creds", {"user": "root", "pass": "pw"}))
    assert plan(out, store).patch == []
    store.put(secret("creds", {"user": "admin", "pass": "new"}))
    assert plan(out, store).patch != []


def test_a_whole_object_consumer_sees_every_key() -> None:
    store = _store()
    obj = _deploy(env_cm("cfg", "a"), volumes=[vol_cm("cfg")])
    out = admitted(obj, store)
    store.put(configmap("cfg", {"a": "1", "b": "changed"}))
    assert plan(out, store).patch != []


def test_a_required_key_missing_warns() -> None:
    p = plan(_deploy(env_cm("cfg", "nope")), _store())
    assert any("configmap/cfg" in w and "'nope'" in w for w in p.warnings)
    assert "configmap/cfg" in p.sources
    assert not p.problems


def test_an_optional_key_missing_is_quiet() -> None:
    p = plan(_deploy(env_cm("cfg", "nope", optional=True)), _store())
    assert p.warnings == []
    assert "configmap/cfg" in p.sources


# ---- optional and missing sources ----


def test_optional_missing_source_is_recorded_absent() -> None:
    store = _store()
    obj = _deploy(env_cm("later", "k", optional=True))
    p = plan(obj, store)
    assert p.sources == {"configmap/later": "absent"}
    assert p.warnings == [] and p.problems == []
    out = apply(obj, p)
    assert recorded_sources(out) == {"configmap/later": digest.ABSENT}
    assert plan(out, store).patch == []
    # creating it later is a change
    store.put(configmap("later", {"k": "v"}))
    again = plan(out, store)
    assert again.sources["configmap/later"] == _digest(store.objects[SourceId(CM, "later")], ["k"])
    assert recorded_checksum(apply(out, again)) != recorded_checksum(out)


@pytest.mark.parametrize(
    "ref",
    [
        vol_secret("gone", optional=True),
        vol_projected(proj_secret("gone", optional=True)),
    ],
)
def test_optional_missing_volume_sources(ref: JSONObject) -> None:
    p = plan(workload("Pod", pod_spec(volumes=[ref])), _store())
    assert p.sources == {"secret/gone": "absent"}


def test_required_missing_source_warns_and_records_nothing() -> None:
    store = _store()
    obj = _deploy(env_cm("cfg", "a"), env_secret("missing-secret", "k"))
    p = plan(obj, store)
    assert p.sources == {"configmap/cfg": _digest(store.objects[SourceId(CM, "cfg")], ["a"])}
    assert len(p.warnings) == 1 and "secret/missing-secret" in p.warnings[0]
    assert p.problems == p.warnings
    assert "secret/missing-secret" not in recorded_sources(apply(obj, p))


def test_required_and_optional_sites_of_one_missing_source_are_required() -> None:
    obj = _deploy(env_cm("x", "k", optional=True), env_cm("x", "j"))
    p = plan(obj, _store())
    assert p.sources == {} and p.problems


def test_only_missing_sources_give_an_empty_record() -> None:
    # Admitted by configpin although no pod of it can start yet: the empty record says so
    # (the controller completes it, without a rollout, when the source appears).
    obj = _deploy(env_cm("missing", "k"))
    p = plan(obj, _store())
    assert p.problems and p.sources == {}
    out = apply(obj, p)
    assert template_annotations(out)[ANN_SOURCES] == "{}"
    assert spec_of(out) == spec_of(obj)
    assert plan(out, _store()).patch == []


def test_an_unreadable_source_warns_and_keeps_what_was_recorded() -> None:
    store = _store()
    obj = _deploy(env_cm("cfg", "a"), env_secret("creds", "pass"))
    out = admitted(obj, store)
    store.unreadable.add(SourceId(SECRET, "creds"))
    p = plan(out, store, refresh=ALL)
    assert any("secret/creds" in w and "could not be read" in w for w in p.warnings)
    assert p.problems
    assert p.patch == []  # the recorded digest stays; nothing rolls
    fresh = plan(obj, store)
    assert "secret/creds" not in fresh.sources and "configmap/cfg" in fresh.sources


@pytest.mark.parametrize(
    ("unreadable", "mode", "named"),
    [
        ("source", "checksum", "configmap/cfg"),  # pointing back needs the source
        ("snapshot", "checksum", "configmap/cfg-"),
        ("snapshot", "snapshot", "configmap/cfg-"),
    ],
)
def test_an_unreadable_source_of_a_snapshot_reference_changes_nothing(
    unreadable: str, mode: str, named: str
) -> None:
    # A read error must not strip the recorded mapping: that would change the template
    # (a rollout for nothing) and hide the workload from the controller.
    store = _snapshot_store()
    obj = _deploy(env_cm("cfg", "a"))
    first = plan(obj, store, mode="snapshot")
    out = apply(obj, first)
    store.create_snapshots(first)
    (snap,) = (r.snapshot_name for r in first.snapshots)
    store.unreadable.add(SourceId(CM, "cfg" if unreadable == "source" else snap))
    p = plan(out, store, mode=mode, refresh=ALL)
    assert p.patch == []
    (warning,) = p.warnings
    assert warning.startswith(named) and "could not be read" in warning
    assert p.sources == first.sources


def test_undecodable_source_content_warns_naming_it() -> None:
    store = _store()
    store.put({"kind": "ConfigMap", "metadata": {"name": "bin"}, "binaryData": {"k": "!!"}})
    p = plan(_deploy(volumes=[vol_cm("bin")]), store)
    assert p.sources == {}
    assert any("configmap/bin" in w for w in p.problems)


# ---- opting out ----


def test_ignored_sources_are_not_hashed() -> None:
    store = _store()
    store.put(configmap("noisy", {"k": "v"}, annotations={ANN_IGNORE: "true"}))
    obj = _deploy(env_cm("cfg", "a"), env_cm("noisy", "k"))
    p = plan(obj, store)
    assert set(p.sources) == {"configmap/cfg"}
    out = apply(obj, p)
    store.put(configmap("noisy", {"k": "changed"}, annotations={ANN_IGNORE: "true"}))
    assert plan(out, store).patch == []


def test_only_ignored_sources_give_no_patch() -> None:
    store = Store([secret("s", {"k": "v"}, annotations={ANN_IGNORE: "true"})])
    p = plan(_deploy(env_secret("s", "k")), store)
    assert p.patch == [] and p.sources == {}


@pytest.mark.parametrize("owner", ["ReplicaSet", "StatefulSet", "DaemonSet", "Job"])
def test_pods_owned_by_a_controller_are_left_alone(owner: str) -> None:
    obj = workload("Pod", reading("cfg", "a"), owner=owner)
    p = plan(obj, _store())
    assert p.patch == [] and p.skipped is SkipReason.OWNED


def test_replicasets_owned_by_a_deployment_are_left_alone() -> None:
    obj = workload("ReplicaSet", reading("cfg", "a"), owner="Deployment")
    p = plan(obj, _store(), operation="UPDATE", old=obj)
    assert p.patch == [] and p.skipped is SkipReason.OWNED


def test_jobs_owned_by_a_cronjob_are_left_alone() -> None:
    obj = workload("Job", reading("cfg", "a"), owner="CronJob")
    assert plan(obj, _store()).patch == []


def test_an_owner_that_is_not_the_controller_does_not_count() -> None:
    obj = workload("Pod", reading("cfg", "a"), owner="ReplicaSet")
    obj["metadata"]["ownerReferences"][0]["controller"] = False
    assert plan(obj, _store()).patch != []


def test_mode_off_on_the_workload_is_honoured() -> None:
    obj = workload(
        "Deployment",
        reading("cfg", "a"),
        annotations={ANN_MODE: "off"},
    )
    p = plan(obj, _store(), mode="snapshot")
    assert p.patch == [] and p.mode == "off" and p.warnings == []


def test_mode_on_the_pod_template_is_not_the_workload_mode() -> None:
    obj = workload(
        "Deployment",
        reading("cfg", "a"),
        template_annotations={ANN_MODE: "off"},
    )
    assert plan(obj, _store()).patch != []


def test_default_mode_off() -> None:
    assert plan(_deploy(env_cm("cfg", "a")), _store(), mode="off").patch == []


def test_workload_mode_overrides_the_default() -> None:
    obj = workload(
        "Deployment",
        reading("cfg", "a"),
        annotations={ANN_MODE: "snapshot"},
    )
    p = plan(obj, _store(), mode="checksum")
    assert p.mode == "snapshot" and p.snapshots


def test_unknown_mode_warns_and_uses_the_default() -> None:
    obj = workload(
        "Deployment",
        reading("cfg", "a"),
        annotations={ANN_MODE: "sometimes"},
    )
    p = plan(obj, _store())
    assert p.mode == "checksum"
    assert len(p.warnings) == 1
    assert ANN_MODE in p.warnings[0] and "'sometimes'" in p.warnings[0]
    assert p.patch != [] and p.problems == []


def test_configpins_own_objects_are_never_mutated() -> None:
    obj = workload("Pod", reading("cfg", "a"))
    obj["metadata"]["labels"][LABEL_SNAPSHOT] = "true"
    assert plan(obj, _store()).patch == []


# ---- the patch ----


def test_annotation_keys_are_escaped_in_the_patch_paths() -> None:
    store = _store()
    obj = workload(
        "Deployment",
        reading("cfg", "a"),
        annotations={"team": "a"},
        template_annotations={"prometheus.io/scrape": "true"},
    )
    p = plan(obj, store)
    paths = {op["path"] for op in p.patch}
    assert paths == {
        "/spec/template/metadata/annotations/configpin.io~1checksum",
        "/spec/template/metadata/annotations/configpin.io~1sources",
    }
    assert all(op["op"] == "add" for op in p.patch)
    out = jsonpatch.apply_patch(obj, p.patch)
    expected = copy.deepcopy(obj)
    expected["spec"]["template"]["metadata"]["annotations"].update(
        {ANN_CHECKSUM: digest.checksum(NSKEY, p.sources), ANN_SOURCES: dumps_mapping(p.sources)}
    )
    assert out == expected


def test_annotations_added_when_template_metadata_is_absent() -> None:
    obj = workload("StatefulSet", reading("cfg", "a"), template_meta=False)
    assert "metadata" not in obj["spec"]["template"]
    p = plan(obj, _store())
    assert p.patch[0]["op"] == "add" and p.patch[0]["path"] == "/spec/template/metadata"
    out = apply(obj, p)
    assert set(template_annotations(out)) == {ANN_CHECKSUM, ANN_SOURCES}


def test_annotations_added_when_annotations_are_absent() -> None:
    obj = workload("Pod", reading("cfg", "a"))
    assert "annotations" not in obj["metadata"]
    p = plan(obj, _store())
    assert [op["path"] for op in p.patch] == ["/metadata/annotations"]
    assert set(apply(obj, p)["metadata"]["annotations"]) == {ANN_CHECKSUM, ANN_SOURCES}


def test_annotations_null_is_replaced() -> None:
    obj = workload("Pod", reading("cfg", "a"))
    obj["metadata"]["annotations"] = None
    out = admitted(obj, _store())
    assert set(out["metadata"]["annotations"]) == {ANN_CHECKSUM, ANN_SOURCES}


def test_other_annotations_are_kept() -> None:
    obj = workload(
        "Pod",
        reading("cfg", "a"),
        template_annotations={"a/b": "1", "c~d": "2"},
    )
    out = admitted(obj, _store())
    assert out["metadata"]["annotations"]["a/b"] == "1"
    assert out["metadata"]["annotations"]["c~d"] == "2"


def test_only_annotations_change_in_checksum_mode() -> None:
    obj = workload("CronJob", reading("cfg", "a"))
    out = admitted(obj, _store())
    assert spec_of(out) == spec_of(obj)
    for o in (obj, out):
        o["metadata"].pop("annotations", None)
        template_meta_of(o).pop("annotations", None)
    assert out == obj


def test_changed_content_replaces_only_what_differs() -> None:
    store = _store()
    obj = _deploy(env_cm("cfg", "a"))
    out = admitted(obj, store)
    store.put(configmap("cfg", {"a": "2"}))
    p = plan(out, store, refresh=ALL)
    assert sorted(op["path"] for op in p.patch) == [
        "/spec/template/metadata/annotations/configpin.io~1checksum",
        "/spec/template/metadata/annotations/configpin.io~1sources",
    ]
    assert recorded_sources(apply(out, p)) == {
        "configmap/cfg": _digest(store.objects[SourceId(CM, "cfg")], ["a"])
    }


def test_stale_annotations_are_removed_when_the_references_go_away() -> None:
    store = _store()
    obj = workload(
        "Deployment",
        reading("cfg", "a"),
        template_annotations={"keep": "me"},
    )
    before = admitted(obj, store)
    out = copy.deepcopy(before)
    spec_of(out)["containers"][0].pop("env")
    p = plan(out, store, operation="UPDATE", old=before)
    assert {op["op"] for op in p.patch} == {"remove"}
    cleaned = apply(out, p)
    assert template_annotations(cleaned) == {"keep": "me"}
    assert ANN_OBSERVED not in cleaned["metadata"].get("annotations", {})
    assert plan(cleaned, store).patch == []


def test_a_removed_reference_drops_its_entry() -> None:
    store = _store()
    obj = _deploy(env_cm("cfg", "a"), env_secret("creds", "pass"))
    before = admitted(obj, store)
    out = copy.deepcopy(before)
    spec_of(out)["containers"][0]["env"].pop()
    out2 = admitted(out, store, operation="UPDATE", old=before)
    assert set(recorded_sources(out2)) == {"configmap/cfg"}


def test_no_change_no_patch() -> None:
    obj = workload("Deployment", pod_spec(container()))
    p = plan(obj, _store())
    assert p.patch == [] and not p.changed and p.sources == {}


def test_the_plan_does_not_modify_its_input() -> None:
    store = _store()
    obj = _deploy(env_cm("cfg", "a"), volumes=[vol_secret("creds")])
    before = copy.deepcopy(obj)
    plan(obj, store, mode="snapshot")
    assert obj == before


def test_a_kept_rollback_is_recorded_and_survives_a_client_that_drops_it() -> None:
    # Snapshot mode: the template is rolled back to the copy of older content. The workload
    # records that it had seen the newer content (so the controller leaves it alone), and a
    # client that replaces the object whole (`kubectl replace`) does not lose that record.
    store = _snapshot_store()
    obj = _deploy(env_cm("cfg", "a"))
    first = plan(obj, store, mode="snapshot")
    store.create_snapshots(first)
    v1 = apply(obj, first)
    store.put(configmap("cfg", {"a": "2", "b": "2"}))
    second = plan(obj, store, mode="snapshot")
    store.create_snapshots(second)
    v2 = apply(obj, second)
    assert ANN_OBSERVED not in (v2["metadata"].get("annotations") or {})

    undone = copy.deepcopy(v2)
    undone["spec"]["template"] = copy.deepcopy(v1["spec"]["template"])
    p = plan(undone, store, mode="snapshot", operation="UPDATE", old=v2)
    assert p.sources == first.sources and p.observed == second.sources
    rolled_back = apply(undone, p)
    assert json.loads(rolled_back["metadata"]["annotations"][ANN_OBSERVED]) == second.sources

    replaced = copy.deepcopy(rolled_back)
    del replaced["metadata"]["annotations"][ANN_OBSERVED]
    again = plan(replaced, store, mode="snapshot", operation="UPDATE", old=rolled_back)
    assert again.observed == second.sources
    assert json.loads(apply(replaced, again)["metadata"]["annotations"][ANN_OBSERVED]) == (
        second.sources
    )


# ---- snapshot names and JSON pointers ----


def test_snapshot_name_is_source_dash_ten_hex() -> None:
    content = "0123456789abcdef" * 4
    assert snapshot_name("app-config", content) == "app-config-0123456789"
    assert SUFFIX_LEN == 10


@pytest.mark.parametrize("length", [1, 63, 241, 242, 243, 252, 253])
def test_long_snapshot_names_are_cut_and_stay_legal(length: int) -> None:
    source = ("a" * 30 + "." + "b" * 30 + "-")[: length - 1].ljust(length - 1, "c") + "z"
    assert len(source) == length and is_dns1123_subdomain(source)
    name = snapshot_name(source, "f" * 64)
    assert len(name) <= MAX_NAME
    assert is_dns1123_subdomain(name), name
    assert name.endswith("-ffffffffff")
    if length <= MAX_NAME - SUFFIX_LEN - 1:
        assert name == f"{source}-ffffffffff"


def test_long_names_sharing_a_prefix_do_not_collide() -> None:
    a = "x" * 250 + "aaa"
    b = "x" * 250 + "bbb"
    assert snapshot_name(a, "0" * 64) != snapshot_name(b, "0" * 64)


@pytest.mark.parametrize("sep", [".", "-"])
def test_long_name_cut_at_a_separator_stays_legal(sep: str) -> None:
    # the cut falls around position 233: put a separator on each side of it
    for k in range(225, 245):
        source = "a" * k + sep + "b" * (252 - k)
        assert is_dns1123_subdomain(source)
        name = snapshot_name(source, "1" * 64)
        assert len(name) == MAX_NAME or len(name) == MAX_NAME - 1
        assert is_dns1123_subdomain(name), name


@pytest.mark.parametrize(
    ("token", "escaped"),
    [
        ("configpin.io/checksum", "configpin.io~1checksum"),
        ("a~b", "a~0b"),
        ("~/", "~0~1"),
        ("~1", "~01"),
        ("plain", "plain"),
    ],
)
def test_json_pointer_escaping(token: str, escaped: str) -> None:
    assert escape_pointer(token) == escaped
    # and jsonpatch reads it back to the same key
    doc = jsonpatch.apply_patch({}, [{"op": "add", "path": pointer((token,)), "value": 1}])
    assert doc == {token: 1}


def test_pointer() -> None:
    assert pointer(("spec", "containers", 0, "a/b")) == "/spec/containers/0/a~1b"
    assert pointer(()) == ""


# ---- snapshot mode ----


def _snapshot_store() -> Store:
    return Store(
        [
            configmap("cfg", {"a": "1", "b": "2"}),
            secret("creds", {"user": "admin", "pass": "pw"}, type_="kubernetes.io/basic-auth"),
        ]
    )


def _every_site_spec() -> JSONObject:
    return pod_spec(
        container(env=[env_cm("cfg", "a")], env_from=[envfrom_secret("creds")]),
        init=[container("init", env_from=[envfrom_cm("cfg")])],
        ephemeral=[container("debug", env=[env_secret("creds", "pass")])],
        volumes=[
            vol_cm("cfg", items=["b"]),
            vol_secret("creds"),
            vol_projected(proj_cm("cfg"), proj_secret("creds")),
        ],
    )


def test_snapshot_mode_rewrites_every_reference() -> None:
    store = _snapshot_store()
    obj = workload("Deployment", _every_site_spec())
    p = plan(obj, store, mode="snapshot")
    cfg_snap = snapshot_name("cfg", _digest(store.objects[SourceId(CM, "cfg")]))
    creds_snap = snapshot_name("creds", _digest(store.objects[SourceId(SECRET, "creds")]))
    assert {(r.source, r.snapshot_name) for r in p.snapshots} == {
        (SourceId(CM, "cfg"), cfg_snap),
        (SourceId(SECRET, "creds"), creds_snap),
    }
    spec = spec_of(apply(obj, p))
    assert spec["containers"][0]["env"][0]["valueFrom"]["configMapKeyRef"]["name"] == cfg_snap
    assert spec["containers"][0]["envFrom"][0]["secretRef"]["name"] == creds_snap
    assert spec["initContainers"][0]["envFrom"][0]["configMapRef"]["name"] == cfg_snap
    assert (
        spec["ephemeralContainers"][0]["env"][0]["valueFrom"]["secretKeyRef"]["name"] == creds_snap
    )
    assert spec["volumes"][0]["configMap"]["name"] == cfg_snap
    assert spec["volumes"][1]["secret"] == {"secretName": creds_snap}  # secretName, not name
    assert spec["volumes"][2]["projected"]["sources"][0]["configMap"]["name"] == cfg_snap
    assert spec["volumes"][2]["projected"]["sources"][1]["secret"]["name"] == creds_snap
    # the recorded mapping names the sources, not the copies
    assert set(recorded_sources(apply(obj, p))) == {"configmap/cfg", "secret/creds"}


def test_snapshot_requests_carry_the_content_digest() -> None:
    store = _snapshot_store()
    p = plan(_deploy(env_cm("cfg", "a")), store, mode="snapshot")
    (req,) = p.snapshots
    whole = _digest(store.objects[SourceId(CM, "cfg")])
    assert req.content_digest == whole
    assert req.snapshot_name == f"cfg-{whole[:10]}"
    # the consumed digest (one key) differs from the content digest the name comes from
    assert p.sources["configmap/cfg"] == _digest(store.objects[SourceId(CM, "cfg")], ["a"])


def test_same_content_same_snapshot_name() -> None:
    a = plan(_deploy(env_cm("cfg", "a")), _snapshot_store(), mode="snapshot")
    b = plan(
        workload("DaemonSet", pod_spec(volumes=[vol_cm("cfg")])), _snapshot_store(), mode="snapshot"
    )
    assert a.snapshots[0].snapshot_name == b.snapshots[0].snapshot_name
    store = _snapshot_store()
    store.put(configmap("cfg", {"a": "1", "b": "changed"}))
    c = plan(_deploy(env_cm("cfg", "a")), store, mode="snapshot")
    assert c.snapshots[0].snapshot_name != a.snapshots[0].snapshot_name


def test_snapshot_of_a_long_source_name() -> None:
    long_name = "config-" + "x" * 240 + "-end"
    assert len(long_name) <= MAX_NAME
    store = Store([configmap(long_name, {"k": "v"})])
    obj = _deploy(env_cm(long_name, "k"))
    p = plan(obj, store, mode="snapshot")
    (req,) = p.snapshots
    assert len(req.snapshot_name) <= MAX_NAME and is_dns1123_subdomain(req.snapshot_name)
    store.create_snapshots(p)
    assert plan(apply(obj, p), store, mode="snapshot").patch == []


@pytest.mark.parametrize("kind", WORKLOAD_KINDS)
def test_replanning_snapshot_output_gives_no_patch(kind: str) -> None:
    store = _snapshot_store()
    obj = workload(kind, _every_site_spec())
    p = plan(obj, store, mode="snapshot")
    out = apply(obj, p)
    made = store.create_snapshots(p)
    assert len(made) == 2
    again = plan(out, store, mode="snapshot", operation="CREATE")
    assert again.patch == []
    assert again.sources == p.sources
    # The template points at copies that exist; they are still requested (same names, same
    # content) so that the writer un-marks one the sweep has marked before it is reused.
    assert sorted(again.snapshots, key=lambda r: r.snapshot_name) == sorted(
        p.snapshots, key=lambda r: r.snapshot_name
    )


def test_snapshot_mode_keeps_a_rolled_back_template() -> None:
    store = _snapshot_store()
    obj = _deploy(env_cm("cfg", "a"))
    first = plan(obj, store, mode="snapshot")
    v1 = apply(obj, first)
    store.create_snapshots(first)
    store.put(configmap("cfg", {"a": "2", "b": "2"}))
    # the template still points at the v1 copy: admission keeps it
    p = plan(v1, store, mode="snapshot", operation="UPDATE", old=v1)
    assert p.patch == []


def test_snapshot_whose_source_is_gone_is_kept() -> None:
    store = _snapshot_store()
    obj = _deploy(env_cm("cfg", "a"))
    first = plan(obj, store, mode="snapshot")
    out = apply(obj, first)
    store.create_snapshots(first)
    store.delete(SourceId(CM, "cfg"))
    assert plan(out, store, mode="snapshot").patch == []
    p = plan(out, store, mode="checksum")
    assert p.patch == []
    assert any("configmap/cfg not found" in w for w in p.warnings)


def test_checksum_mode_points_a_snapshot_reference_back_at_its_source() -> None:
    store = _snapshot_store()
    obj = workload("Deployment", _every_site_spec())
    first = plan(obj, store, mode="snapshot")
    snapped = apply(obj, first)
    store.create_snapshots(first)
    p = plan(snapped, store, mode="checksum", refresh=ALL)
    back = apply(snapped, p)
    assert spec_of(back) == spec_of(obj)
    assert p.snapshots == []
    assert recorded_sources(back) == recorded_sources(snapped)
    assert plan(back, store).patch == []


def test_service_account_token_secrets_are_not_copied() -> None:
    store = Store([secret("sa-token", {"token": "t"}, type_=SERVICE_ACCOUNT_TOKEN_TYPE)])
    obj = workload("Deployment", pod_spec(volumes=[vol_secret("sa-token")]))
    p = plan(obj, store, mode="snapshot")
    assert p.snapshots == []
    assert len(p.warnings) == 1 and "secret/sa-token" in p.warnings[0]
    assert "service-account token" in p.warnings[0]
    out = apply(obj, p)
    assert spec_of(out)["volumes"][0]["secret"]["secretName"] == "sa-token"
    assert "secret/sa-token" in recorded_sources(out)  # still hashed, used live
    assert plan(out, store, mode="snapshot").patch == []


def test_snapshot_mode_skips_ignored_and_absent_sources() -> None:
    store = Store([configmap("noisy", {"k": "v"}, annotations={ANN_IGNORE: "true"})])
    obj = _deploy(env_cm("noisy", "k"), env_cm("later", "k", optional=True))
    p = plan(obj, store, mode="snapshot")
    assert p.snapshots == []
    out = apply(obj, p)
    assert spec_of(out) == spec_of(obj)
    assert recorded_sources(out) == {"configmap/later": "absent"}


def test_dumps_and_parse_mapping() -> None:
    assert dumps_mapping({"b": "2", "a": "1"}) == '{"a":"1","b":"2"}'
    assert parse_mapping('{"a":"1"}') == {"a": "1"}
    for bad in (None, 3, "", "not json", "[]", '{"a": 1}'):
        assert parse_mapping(bad) is None


def test_a_broken_sources_annotation_is_rewritten() -> None:
    obj = workload(
        "Pod",
        reading("cfg", "a"),
        template_annotations={ANN_SOURCES: "{broken", ANN_CHECKSUM: "x"},
    )
    out = admitted(obj, _store())
    assert set(recorded_sources(out)) == {"configmap/cfg"}


# ---- the copy itself ----


def test_snapshot_object_of_a_configmap() -> None:
    src = configmap(
        "cfg",
        {"a": "1"},
        binary={"b": b"\x00"},
        namespace="team-a",
        annotations={"kubectl.kubernetes.io/last-applied-configuration": "{...}"},
        labels={"app": "x"},
    )
    src["metadata"]["ownerReferences"] = [{"kind": "X", "name": "y", "uid": "z"}]
    snap = snapshot_object(CM, src, "cfg-0123456789", signature="sig")
    assert snap == {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "cfg-0123456789",
            "namespace": "team-a",
            "labels": {LABEL_SNAPSHOT: "true", LABEL_SOURCE: "cfg"},
            "annotations": {"configpin.io/source": "cfg", "configpin.io/signature": "sig"},
        },
        "immutable": True,
        "data": {"a": "1"},
        "binaryData": {"b": b64(b"\x00")},
    }
    snap["data"]["a"] = "changed"
    assert src["data"]["a"] == "1"  # a copy, not a view


def test_snapshot_object_of_a_secret_keeps_its_type() -> None:
    src = secret("tls", {"tls.crt": "c"}, string_data={"tls.key": "k"}, type_="kubernetes.io/tls")
    snap = snapshot_object(SECRET, src, "tls-0123456789", signature="sig")
    assert snap["type"] == "kubernetes.io/tls"
    assert snap["immutable"] is True
    assert snap["data"] == src["data"] and snap["stringData"] == src["stringData"]
    assert "namespace" not in snap["metadata"]
    assert digest.copy_source_name(snap) == "tls"
    assert get_path(snap, ("metadata", "labels", LABEL_SOURCE)) == "tls"


def test_snapshot_mode_not_allowed_gives_checksum_mode_with_a_warning() -> None:
    store = _store()
    obj = workload(
        "Deployment",
        pod_spec(container(env_from=[envfrom_cm("cfg")])),
        annotations={ANN_MODE: "snapshot"},
    )
    p = plan_object(obj, hkey=HKEY, lookup=store.lookup, allow_snapshots=False)
    assert p.mode == "checksum" and p.snapshots == []
    assert any("snapshot mode is not enabled" in w for w in p.warnings)
    assert spec_of(apply(obj, p)) == spec_of(obj)  # no reference rewritten


def test_too_many_sources_are_admitted_unpinned_with_a_warning() -> None:
    env = [env_cm(f"cfg-{i}", "k", optional=True, var=f"V{i}") for i in range(4)]
    obj = workload("Deployment", pod_spec(container(env=env)))
    p = plan_object(obj, hkey=HKEY, lookup=_store().lookup, max_sources=3)
    assert p.patch == [] and p.skipped is SkipReason.TOO_MANY_SOURCES
    assert p.warnings == [
        "consumes 4 ConfigMaps/Secrets, more than configpin pins per object (3): "
        "admitted without pinning any"
    ]
    assert plan_object(obj, hkey=HKEY, lookup=_store().lookup, max_sources=4).patch
