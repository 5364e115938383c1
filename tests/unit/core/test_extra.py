"""`configpin.io/extra-sources` (webhook/core/extra.py): sources a workload's application reads
itself, pinned and rolled for as though its pod spec referenced them whole."""

from __future__ import annotations

import pytest

from tests.unit.conftest import (
    NSKEY,
    Store,
    apply,
    configmap,
    container,
    env_cm,
    plan,
    pod_spec,
    record,
    recorded_sources,
    secret,
    vol_cm,
    workload,
)
from webhook.core import digest
from webhook.core.constants import ANN_EXTRA_SOURCES, ANN_MODE
from webhook.core.current import WorkloadEntry, entry_from_object
from webhook.core.extra import MAX_EXTRA, extra_sources
from webhook.core.model import JSONObject, SourceId, SourceKind
from webhook.core.refs import unrefreshable

CM, SECRET = SourceKind.CONFIGMAP, SourceKind.SECRET


def _named(value: str) -> tuple[list[SourceId], list[str]]:
    return extra_sources({"metadata": {"annotations": {ANN_EXTRA_SOURCES: value}}})


def _store() -> Store:
    return Store(
        [
            configmap("cfg", {"a": "1", "b": "2"}),
            configmap("app-settings", {"x": "1", "y": "2"}),
            secret("api-token", {"token": "t0"}),
        ]
    )


def _deploy(value: str, spec: JSONObject | None = None, **ann: str) -> JSONObject:
    return workload(
        "Deployment",
        spec or pod_spec(container(env=[env_cm("cfg", "a")])),
        annotations={ANN_EXTRA_SOURCES: value, **ann},
    )


def test_the_annotation_names_configmaps_and_secrets_of_the_workloads_namespace() -> None:
    assert _named("configmap/app-settings, secret/api-token") == (
        [SourceId(CM, "app-settings"), SourceId(SECRET, "api-token")],
        [],
    )
    assert _named(" ConfigMap/a ,,configmap/a,") == ([SourceId(CM, "a")], [])  # (repeats once)
    assert _named("") == ([], [])
    assert extra_sources({"metadata": {"annotations": {ANN_EXTRA_SOURCES: 7}}}) == ([], [])


@pytest.mark.parametrize(
    "entry",
    [
        "app-settings",  # no kind
        "deployment/web",  # not a source kind
        "configmap/",  # no name
        "configmap/Upper",  # not a legal name
        "other-ns/configmap/x",  # another namespace: never
        "configmap/a/b",
        "configmap/" + "a" * 254,
    ],
)
def test_an_entry_that_names_no_source_of_its_namespace_is_left_out_and_said(entry: str) -> None:
    found, warnings = _named(f"configmap/ok,{entry}")
    assert found == [SourceId(CM, "ok")]
    [warning] = warnings
    assert ANN_EXTRA_SOURCES in warning and entry[:80] in warning


def test_a_hostile_value_costs_a_bounded_read() -> None:
    """A megabyte of entries: at most MAX_EXTRA are read, and one warning says what was not."""
    found, warnings = _named(",".join(f"configmap/c{i}" for i in range(100_000)))
    assert len(found) == MAX_EXTRA
    found, warnings = _named("x," * 100_000)
    assert found == [] and len(warnings) == 1 and len(warnings[0]) < 400


def test_a_named_source_is_pinned_whole_beside_the_pod_specs_references() -> None:
    store = _store()
    p = plan(_deploy("configmap/app-settings,secret/api-token"), store)
    assert not p.warnings
    assert p.sources == {
        "configmap/cfg": digest.source_digest(
            NSKEY, record(store.objects[SourceId(CM, "cfg")]), {"a"}
        ),
        "configmap/app-settings": digest.source_digest(
            NSKEY, record(store.objects[SourceId(CM, "app-settings")])
        ),
        "secret/api-token": digest.source_digest(
            NSKEY, record(store.objects[SourceId(SECRET, "api-token")])
        ),
    }
    stored = apply(_deploy("configmap/app-settings,secret/api-token"), p)
    assert recorded_sources(stored) == p.sources
    # every key counts: a change of any of them changes the digest
    store.put(configmap("app-settings", {"x": "1", "y": "changed"}))
    again = plan(_deploy("configmap/app-settings,secret/api-token"), store)
    assert again.sources["configmap/app-settings"] != p.sources["configmap/app-settings"]
    assert again.sources["configmap/cfg"] == p.sources["configmap/cfg"]


def test_a_source_the_pod_spec_reads_one_key_of_counts_whole_when_named_too() -> None:
    store = _store()
    p = plan(_deploy("configmap/cfg"), store)
    assert p.sources["configmap/cfg"] == digest.source_digest(
        NSKEY, record(store.objects[SourceId(CM, "cfg")])
    )


def test_a_named_source_that_does_not_exist_is_recorded_absent() -> None:
    """The app may read it once it exists: its creation is then a change."""
    p = plan(_deploy("configmap/later"), _store())
    assert p.sources["configmap/later"] == digest.ABSENT and not p.warnings


def test_a_bad_entry_is_said_at_admission_and_the_rest_pinned() -> None:
    p = plan(_deploy("configmap/app-settings,secrets/typo"), _store())
    assert "configmap/app-settings" in p.sources
    assert any("'secrets/typo'" in w for w in p.warnings)


def test_snapshot_mode_makes_no_copy_of_a_named_source_nor_points_at_one() -> None:
    """The app reads it by its name: a copy would be read by nobody."""
    store = _store()
    obj = _deploy(
        "configmap/app-settings",
        pod_spec(container(), volumes=[vol_cm("cfg")]),
        **{ANN_MODE: "snapshot"},
    )
    p = plan(obj, store, mode="snapshot")
    assert [s.source for s in p.snapshots] == [SourceId(CM, "cfg")]
    assert "configmap/app-settings" in p.sources
    spec_ops = [op for op in p.patch if op["path"].startswith("/spec/template/spec/")]
    assert spec_ops and all("app-settings" not in str(op.get("value")) for op in spec_ops)


def test_the_controllers_index_knows_the_workload_consumes_it() -> None:
    store = _store()
    stored = apply(
        _deploy("configmap/app-settings"), plan(_deploy("configmap/app-settings"), store)
    )
    entry = entry_from_object(stored, "checksum")
    assert isinstance(entry, WorkloadEntry)
    assert {c.source for c in entry.consumes} == {
        SourceId(CM, "cfg"),
        SourceId(CM, "app-settings"),
    }
    # a workload that references nothing but names a source is still one of its consumers
    only = _deploy("configmap/app-settings", pod_spec(container()))
    entry = entry_from_object(apply(only, plan(only, store)), "checksum")
    assert isinstance(entry, WorkloadEntry)
    assert [c.source for c in entry.consumes] == [SourceId(CM, "app-settings")]


def test_a_change_of_a_named_source_cannot_be_refreshed_in_place() -> None:
    spec = pod_spec(container(), volumes=[vol_cm("cfg")])
    blocked = unrefreshable(spec, [SourceId(CM, "cfg"), SourceId(CM, "app-settings")])
    assert list(blocked) == [SourceId(CM, "app-settings")]
    assert "extra-sources" in str(blocked[SourceId(CM, "app-settings")])
