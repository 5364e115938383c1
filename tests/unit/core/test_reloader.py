"""Which (workload, source) pairs Stakater Reloader rolls, read from the annotations as its
ShouldReload and getContainerUsingResource read them (webhook.core.reloader)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.conftest import (
    HKEY,
    configmap,
    container,
    env_cm,
    envfrom_cm,
    pod_spec,
    vol_cm,
    vol_projected,
    vol_secret,
    workload,
)
from webhook.core import digest
from webhook.core.current import entry_from_object
from webhook.core.model import JSONObject, SourceId, SourceKind, SourceRecord
from webhook.core.reloader import (
    AUTO,
    Covered,
    ReloaderAsks,
    covers,
    env_var,
    left_to_reloader,
    pattern_matches,
    readable,
    referenced,
    reloader_asks,
    source_mark,
)

CM = SourceKind.CONFIGMAP
SECRET = SourceKind.SECRET
ENV_A = pod_spec(container(env=[env_cm("a", "k")]))  # reads configmap/a


def _cm(name: str) -> SourceId:
    return SourceId(CM, name)


def _asks(
    spec: JSONObject = ENV_A,
    kind: str = "Deployment",
    annotations: dict[str, str] | None = None,
    template: dict[str, str] | None = None,
) -> ReloaderAsks | None:
    obj = workload(kind, spec, annotations=annotations, template_annotations=template)
    return reloader_asks(kind, obj, spec)


def _covers(
    sid: SourceId,
    mark: str | None = None,
    spec: JSONObject = ENV_A,
    **kw: Any,
) -> Covered | None:
    asks = _asks(spec, **kw)
    return None if asks is None else covers(asks, sid, mark)


# --- the workload's side


def test_a_workload_without_reloaders_annotations_asks_nothing() -> None:
    assert _asks() is None
    assert _asks(annotations={"reloader.stakater.com/last-reloaded-from": "{}"}) is None
    assert _asks(annotations={AUTO: "false"}) is None  # (only --auto-reload-all: not seen)


@pytest.mark.parametrize("value", ["true", "True", "TRUE", "t", "T", "1"])
def test_auto_true_as_go_parses_it_covers_what_a_container_reads(value: str) -> None:
    found = _covers(_cm("a"), annotations={AUTO: value})
    assert found == Covered(AUTO)
    assert found.words() == "reloader.stakater.com/auto on the workload"


@pytest.mark.parametrize("value", ["yes", "on", "", "false", "0"])
def test_auto_that_go_does_not_read_as_true_covers_nothing(value: str) -> None:
    assert _covers(_cm("a"), annotations={AUTO: value}) is None


def test_auto_covers_only_sources_a_container_references() -> None:
    # (Reloader finds no container to patch for an unreferenced one: NoContainerFound)
    assert _covers(_cm("other"), annotations={AUTO: "true"}) is None
    assert _covers(SourceId(SECRET, "a"), annotations={AUTO: "true"}) is None


def test_the_typed_auto_covers_its_own_kind_only() -> None:
    spec = pod_spec(container(env=[env_cm("a", "k")]), volumes=[vol_secret("s", volume="s")])
    spec["containers"][0]["volumeMounts"] = [{"name": "s", "mountPath": "/s"}]
    typed = {"configmap.reloader.stakater.com/auto": "true"}
    assert _covers(_cm("a"), spec=spec, annotations=typed) == Covered(
        "configmap.reloader.stakater.com/auto"
    )
    assert _covers(SourceId(SECRET, "s"), spec=spec, annotations=typed) is None
    other = {"secret.reloader.stakater.com/auto": "true"}
    assert _covers(SourceId(SECRET, "s"), spec=spec, annotations=other) is not None
    assert _covers(_cm("a"), spec=spec, annotations=other) is None


def test_a_reload_list_covers_the_named_sources_referenced_or_not() -> None:
    annotations = {"configmap.reloader.stakater.com/reload": "a, settings"}
    assert _covers(_cm("settings"), annotations=annotations) == Covered(
        "configmap.reloader.stakater.com/reload"
    )
    assert _covers(_cm("a"), annotations=annotations) is not None
    assert _covers(_cm("other"), annotations=annotations) is None
    assert _covers(SourceId(SECRET, "settings"), annotations=annotations) is None
    secrets = {"secret.reloader.stakater.com/reload": "token"}
    assert _covers(SourceId(SECRET, "token"), annotations=secrets) is not None


def test_a_reload_list_entry_is_a_pattern_of_the_whole_name() -> None:
    annotations = {"configmap.reloader.stakater.com/reload": "app-.*,db\\.conf"}
    assert _covers(_cm("app-settings"), annotations=annotations) is not None
    assert _covers(_cm("my-app-settings"), annotations=annotations) is None  # (^...$)
    assert _covers(_cm("db.conf"), annotations=annotations) is not None
    assert _covers(_cm("dbxconf"), annotations=annotations) is None


def test_search_covers_a_referenced_source_marked_match() -> None:
    annotations = {"reloader.stakater.com/search": "true"}
    found = _covers(_cm("a"), "match", annotations=annotations)
    assert found == Covered("reloader.stakater.com/search", match=True)
    assert "reloader.stakater.com/match on the source" in found.words()
    assert _covers(_cm("a"), None, annotations=annotations) is None  # not marked
    assert _covers(_cm("other"), "match", annotations=annotations) is None  # not referenced
    assert _covers(_cm("a"), "match", annotations={"reloader.stakater.com/search": "True"}) is None


def test_ignore_on_the_source_wins_over_everything() -> None:
    for workload_annotations in (
        {AUTO: "true"},
        {"configmap.reloader.stakater.com/reload": "a"},
        {"reloader.stakater.com/search": "true"},
    ):
        assert _covers(_cm("a"), "ignore", annotations=workload_annotations) is None


def test_the_exclude_list_on_the_metadata_leaves_a_source_out() -> None:
    annotations = {AUTO: "true", "configmaps.exclude.reloader.stakater.com/reload": "b, a"}
    assert _covers(_cm("a"), annotations=annotations) is None
    template = {"configmaps.exclude.reloader.stakater.com/reload": "a"}
    # (read from the workload's metadata only, as Reloader reads it)
    assert _covers(_cm("a"), annotations={AUTO: "true"}, template=template) is not None


def test_the_template_is_read_only_when_the_metadata_says_nothing_of_that_kind() -> None:
    on_template = _covers(_cm("a"), template={AUTO: "true"})
    assert on_template == Covered(AUTO, on_template=True)
    assert on_template.words() == "reloader.stakater.com/auto on its pod template"
    # a ConfigMap annotation on the metadata hides the template's for ConfigMaps ...
    own = {"configmap.reloader.stakater.com/reload": "x"}
    assert _covers(_cm("a"), annotations=own, template={AUTO: "true"}) is None
    # ... but not a Secret one
    own = {"secret.reloader.stakater.com/reload": "x"}
    assert _covers(_cm("a"), annotations=own, template={AUTO: "true"}) is not None


@pytest.mark.parametrize("kind", ["CronJob", "ReplicaSet", "ReplicationController", "Job"])
def test_kinds_reloader_does_not_patch_in_place_are_configpins(kind: str) -> None:
    assert _asks(kind=kind, annotations={AUTO: "true"}) is None


@pytest.mark.parametrize("kind", ["Deployment", "DaemonSet", "StatefulSet"])
def test_kinds_reloader_patches_in_place(kind: str) -> None:
    assert _asks(kind=kind, annotations={AUTO: "true"}) is not None


def test_what_reloader_finds_in_the_containers() -> None:
    spec = pod_spec(
        container(env_from=[envfrom_cm("e")]),
        init=[container("init", env=[env_cm("i", "k")])],
        ephemeral=[container("debug", env=[env_cm("eph", "k")])],
        volumes=[
            vol_cm("mounted", volume="m"),
            vol_cm("unmounted", volume="u"),
            vol_projected({"configMap": {"name": "p"}}, volume="proj"),
        ],
    )
    spec["containers"][0]["volumeMounts"] = [
        {"name": "m", "mountPath": "/m"},
        {"name": "proj", "mountPath": "/p"},
    ]
    assert referenced(spec) == {_cm("e"), _cm("i"), _cm("mounted"), _cm("p")}


def test_only_the_first_volume_of_a_source_is_looked_at() -> None:
    spec = pod_spec(volumes=[vol_cm("c", volume="first"), vol_cm("c", volume="second")])
    spec["containers"][0]["volumeMounts"] = [{"name": "second", "mountPath": "/c"}]
    assert referenced(spec) == set()


# --- the source's side, and a change


def test_a_sources_mark() -> None:
    assert source_mark({}) is None
    assert source_mark({"reloader.stakater.com/match": "true"}) == "match"
    assert source_mark({"reloader.stakater.com/ignore": "true"}) == "ignore"
    both = {"reloader.stakater.com/ignore": "true", "reloader.stakater.com/match": "true"}
    assert source_mark(both) == "ignore"
    assert source_mark({"reloader.stakater.com/ignore": "yes"}) is None


def test_the_record_carries_the_mark() -> None:
    obj = configmap("a", {"k": "1"}, annotations={"reloader.stakater.com/ignore": "true"})
    assert digest.record_from_object(HKEY, CM, obj).reloader == "ignore"


def _record(name: str, mark: str | None = None) -> SourceRecord:
    return SourceRecord(CM, name, {"k": b"0" * 16}, reloader=mark)


def test_only_an_update_of_a_recorded_source_is_left() -> None:
    asks = _asks(annotations={"configmap.reloader.stakater.com/reload": "a,b,c,d"})
    records = {_cm("a"): _record("a"), _cm("b"): _record("b"), _cm("c"): _record("c", "ignore")}
    recorded = {"configmap/a": "1" * 64, "configmap/b": digest.ABSENT, "configmap/c": "2" * 64}
    stale = [_cm("a"), _cm("b"), _cm("c"), _cm("d")]
    left = left_to_reloader(asks, stale, records.get, recorded.get)
    # b appeared (Reloader rolls on create only with --reload-on-create), c is ignored, d gone
    assert left == {_cm("a"): Covered("configmap.reloader.stakater.com/reload")}
    assert left_to_reloader(None, stale, records.get, recorded.get) == {}


def test_the_index_entry_carries_what_it_asks_in_checksum_mode_only() -> None:
    annotations = {AUTO: "true"}
    obj = workload("Deployment", ENV_A, annotations=annotations)
    entry = entry_from_object(obj, "checksum")
    assert not isinstance(entry, Exception) and not isinstance(entry, str)
    assert entry.reloader is not None and _cm("a") in entry.reloader.referenced
    snap = entry_from_object(obj, "snapshot")
    assert not isinstance(snap, str) and snap.reloader is None
    plain = entry_from_object(workload("Deployment", ENV_A), "checksum")
    assert not isinstance(plain, str) and plain.reloader is None
    assert plain != entry  # (taking the annotation off is a change the watch hands on)


# --- a pattern, matched in linear time


@pytest.mark.parametrize(
    ("pattern", "name", "matches"),
    [
        ("app", "app", True),
        ("app", "app2", False),
        ("app.*", "app", True),
        ("app.*", "app-x", True),
        ("app.+", "app", False),
        ("app.+", "app-x", True),
        ("apps?", "app", True),
        ("apps?", "apps", True),
        ("a.c", "abc", True),
        ("a\\.c", "abc", False),
        (".*-config", "web-config", True),
        (".*", "anything", True),
        ("a-*b", "ab", True),
        ("a-*b", "a--b", True),
    ],
)
def test_a_pattern_matches_as_go_regexp_anchored(pattern: str, name: str, matches: bool) -> None:
    assert pattern_matches(pattern, name) is matches


@pytest.mark.parametrize("pattern", ["(a|b)", "[a-z]+", "a{2}", "^a", "a$", "a**", ".*?", "*a"])
def test_a_pattern_outside_the_subset_is_not_read(pattern: str) -> None:
    assert not readable(pattern)
    assert not pattern_matches(pattern, "a")


def test_a_hostile_pattern_costs_linear_time() -> None:
    name = "a" * 253
    assert not pattern_matches(".*" * 200 + "b", name)
    assert pattern_matches(".*" * 200, name)


def test_the_env_var_reloader_sets() -> None:
    assert env_var(_cm("web-config")) == "STAKATER_WEB_CONFIG_CONFIGMAP"
    assert env_var(SourceId(SECRET, "db.token")) == "STAKATER_DB_TOKEN_SECRET"
    assert env_var(_cm("-a--b")) == "STAKATER_A_B_CONFIGMAP"
