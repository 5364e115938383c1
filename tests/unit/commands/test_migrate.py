"""`configpin migrate`'s report: every Reloader annotation, what configpin does with it, and the
commands to move over (webhook.commands.migrate.plan_migration)."""

from __future__ import annotations

from typing import Any

from tests.unit.conftest import container, env_cm, pod_spec, vol_cm, workload
from webhook.commands.migrate import (
    DIFFERENTLY,
    NOT,
    SAME,
    Finding,
    Report,
    Subject,
    plan_migration,
)
from webhook.core.model import SourceId, SourceKind

NS = "team-a"
SPEC = pod_spec(container(env=[env_cm("cfg", "a")]))


def _meta(name: str, **annotations: str) -> dict[str, Any]:
    return {"name": name, "namespace": NS, "annotations": annotations}


def _report(
    *workloads: dict[str, Any],
    sources: dict[SourceId, dict[str, Any]] | None = None,
    opted: bool | None = False,
    options: dict[str, Any] | None = None,
) -> Report:
    return plan_migration(workloads, {NS: sources or {}}, lambda _ns: opted, options)


def _subject(report: Report, name: str) -> Subject:
    return next(s for s in report.subjects if s.name == name)


def _finding(subject: Subject, key: str) -> Finding:
    return next(f for f in subject.findings if f.annotation.startswith(key))


def _cm(name: str) -> SourceId:
    return SourceId(SourceKind.CONFIGMAP, name)


def test_a_cluster_without_reloaders_annotations_has_nothing_to_say() -> None:
    report = _report(workload("Deployment", SPEC), sources={_cm("cfg"): _meta("cfg")})
    assert report.subjects == [] and report.opt_in == []


def test_auto_is_configpins_default() -> None:
    report = _report(
        workload("Deployment", SPEC, annotations={"reloader.stakater.com/auto": "true"})
    )
    subject = _subject(report, "app")
    finding = _finding(subject, "reloader.stakater.com/auto")
    assert finding.verdict == SAME and "default" in finding.how and not finding.commands
    assert "configmap/cfg is left to Reloader" in subject.both_run
    assert subject.remove == [
        "kubectl annotate -n team-a deployment/app reloader.stakater.com/auto-"
    ]
    assert report.opt_in == ["kubectl label namespace team-a configpin.io/enabled=true"]


def test_an_opted_in_namespace_needs_no_command() -> None:
    obj = workload("Deployment", SPEC, annotations={"reloader.stakater.com/auto": "true"})
    assert _report(obj, opted=True).opt_in == []
    assert _report(obj, opted=None).problems  # (not readable: said)


def test_a_reload_list_of_unreferenced_sources_maps_to_extra_sources() -> None:
    obj = workload(
        "Deployment",
        SPEC,
        annotations={"configmap.reloader.stakater.com/reload": "cfg,settings,flags"},
    )
    finding = _finding(_subject(_report(obj), "app"), "configmap.reloader.stakater.com/reload")
    assert finding.verdict == SAME
    assert "configmap/flags, configmap/settings: not referenced" in finding.how
    assert finding.commands == [
        "kubectl annotate -n team-a deployment/app "
        "configpin.io/extra-sources=configmap/flags,configmap/settings"
    ]


def test_extra_sources_already_there_are_kept_in_the_command() -> None:
    obj = workload(
        "StatefulSet",
        SPEC,
        annotations={
            "secret.reloader.stakater.com/reload": "token,cfg",
            "configpin.io/extra-sources": "secret/token",
        },
    )
    finding = _finding(_subject(_report(obj), "app"), "secret.reloader.stakater.com/reload")
    assert finding.commands == [
        "kubectl annotate -n team-a statefulset/app "
        "configpin.io/extra-sources=secret/token,secret/cfg --overwrite"
    ]


def test_a_pattern_is_mapped_to_the_sources_it_matches_now() -> None:
    obj = workload(
        "Deployment", SPEC, annotations={"configmap.reloader.stakater.com/reload": "feature-.*"}
    )
    sources = {_cm("feature-a"): _meta("feature-a"), _cm("other"): _meta("other")}
    finding = _finding(_subject(_report(obj, sources=sources), "app"), "configmap.reloader")
    assert finding.verdict == DIFFERENTLY
    assert "one created later is not" in finding.how
    assert finding.commands == [
        "kubectl annotate -n team-a deployment/app configpin.io/extra-sources=configmap/feature-a"
    ]


def test_a_pattern_configpin_does_not_read_is_said() -> None:
    obj = workload(
        "Deployment", SPEC, annotations={"configmap.reloader.stakater.com/reload": "(a|b)"}
    )
    finding = _finding(_subject(_report(obj), "app"), "configmap.reloader")
    assert finding.verdict == DIFFERENTLY and "does not read" in finding.how


def test_search_match_and_exclude_are_done_differently() -> None:
    obj = workload(
        "Deployment",
        pod_spec(container(env=[env_cm("cfg", "a"), env_cm("plain", "a")])),
        annotations={
            "reloader.stakater.com/search": "true",
            "configmaps.exclude.reloader.stakater.com/reload": "plain",
        },
    )
    sources = {
        _cm("cfg"): _meta("cfg", **{"reloader.stakater.com/match": "true"}),
        _cm("plain"): _meta("plain"),
    }
    report = _report(obj, sources=sources)
    app = _subject(report, "app")
    search = _finding(app, "reloader.stakater.com/search")
    assert search.verdict == DIFFERENTLY and "marked here: configmap/cfg" in search.how
    assert _finding(app, "configmaps.exclude").verdict == DIFFERENTLY
    assert "configmap/cfg is left to Reloader" in app.both_run
    assert "configpin rolls it for configmap/plain" in app.both_run
    cfg = _subject(report, "cfg")
    assert cfg.kind == "ConfigMap"
    assert _finding(cfg, "reloader.stakater.com/match").verdict == DIFFERENTLY


def test_a_source_reloader_ignores_maps_to_configpins_ignore() -> None:
    sources = {_cm("legacy"): _meta("legacy", **{"reloader.stakater.com/ignore": "true"})}
    subject = _subject(_report(sources=sources), "legacy")
    finding = _finding(subject, "reloader.stakater.com/ignore")
    assert finding.verdict == SAME
    assert finding.commands == [
        "kubectl annotate -n team-a configmap/legacy configpin.io/ignore=true"
    ]
    assert subject.remove == [
        "kubectl annotate -n team-a configmap/legacy reloader.stakater.com/ignore-"
    ]


def test_what_configpin_does_not_do() -> None:
    annotations = {
        "reloader.stakater.com/auto": "true",
        "deployment.reloader.stakater.com/pause-period": "5m",
    }
    report = _report(
        workload("Deployment", SPEC, annotations=annotations),
        workload(
            "CronJob", SPEC, name="nightly", annotations={"reloader.stakater.com/auto": "true"}
        ),
        workload("Job", SPEC, name="once", annotations={"reloader.stakater.com/auto": "yes"}),
    )
    pause = _finding(_subject(report, "app"), "deployment.reloader.stakater.com/pause-period")
    assert pause.verdict == DIFFERENTLY and "waves" in pause.how
    nightly = _subject(report, "nightly")
    assert "re-stamps the CronJob's template" in nightly.both_run
    assert _finding(nightly, "reloader.stakater.com/auto").verdict == DIFFERENTLY
    once = _subject(report, "once")
    assert _finding(once, "reloader.stakater.com/auto").verdict == NOT
    assert "never changes a Job" in once.both_run


def test_annotations_on_the_pod_template_are_found_too() -> None:
    obj = workload(
        "DaemonSet",
        pod_spec(container(), volumes=[vol_cm("cfg")]),
        template_annotations={"reloader.stakater.com/auto": "true"},
    )
    subject = _subject(_report(obj), "app")
    assert subject.findings[0].annotation.endswith("(on its pod template)")
    assert "remove them from its manifest" in subject.remove[-1]


def test_snapshot_mode_is_said_to_roll_twice_until_the_annotations_go() -> None:
    obj = workload(
        "Deployment",
        SPEC,
        annotations={"reloader.stakater.com/auto": "true", "configpin.io/mode": "snapshot"},
    )
    assert "remove Reloader's annotations first" in _subject(_report(obj), "app").both_run


def test_reloaders_published_options_are_noted() -> None:
    obj = workload("Deployment", SPEC, annotations={"reloader.stakater.com/auto": "true"})
    notes = _report(obj, options={"autoReloadAll": True, "reloadOnCreate": True}).notes
    assert any("--auto-reload-all" in n for n in notes)
    assert any("creation" in n for n in notes)


def test_an_operators_workload_is_said_to_be_left_to_its_owner() -> None:
    obj = workload(
        "Deployment", SPEC, annotations={"reloader.stakater.com/auto": "true"}, owner="Database"
    )
    both_run = _subject(_report(obj), "app").both_run
    assert "configpin does not pin it" in both_run and "configpin.io/owned" in both_run
