"""`configpin migrate` (also `kubectl configpin migrate`): what configpin does with a cluster's
Stakater Reloader annotations, read with the user's own rights; it changes nothing.

For every workload that carries Reloader's annotations (on its metadata or its pod template)
and every ConfigMap or Secret annotated `reloader.stakater.com/match` or `/ignore`, it says for
each annotation whether configpin does the same (and by which of its annotations or defaults,
with the `kubectl annotate` command where one is needed), does it differently (how), or not at
all (why); what happens while both run (which changes configpin leaves to Reloader: the rules
of webhook.core.reloader, the controller's own); and the `kubectl label namespace` commands for
the namespaces involved that are not opted in. Secrets are read as metadata only.

Exit status: 0 the report is whole; 2 a usage or connection error, or a read the user's rights
refused (the report says what it could read, and stderr what it could not).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Final

import yaml
from kubernetes import config

from webhook.core.constants import (
    ANN_EXTRA_SOURCES,
    ANN_IGNORE,
    ANN_MODE,
    LABEL_ENABLED,
    MODE_SNAPSHOT,
)
from webhook.core.extra import extra_sources
from webhook.core.kinds import ARGO_ROLLOUT, builtin, template_paths, use_custom_kinds
from webhook.core.model import SourceId, SourceKind
from webhook.core.names import is_dns1123_subdomain
from webhook.core.owners import controller_of, left_to_owner, operator_owned, owned_reason
from webhook.core.refs import consumption, find_sites, get_path
from webhook.core.reloader import (
    AUTO,
    EXCLUDE,
    IGNORE,
    MATCH,
    RELOAD,
    SEARCH,
    TYPED_AUTO,
    WORKLOAD_ANNOTATIONS,
    covers,
    pattern_matches,
    readable,
    reloader_asks,
    source_mark,
)
from webhook.kube.errors import KubeError, NotFound
from webhook.kube.meta import list_metadata
from webhook.kube.raw import Kube, path
from webhook.kube.user import connect_from_args
from webhook.kube.userflags import add_user_arguments

SAME: Final = "same"
DIFFERENTLY: Final = "differently"
NOT: Final = "not"
# Reloader's annotations beyond those it decides by: what they ask, and configpin's answer
PAUSE: Final = "deployment.reloader.stakater.com/pause-period"
STRATEGY: Final = "reloader.stakater.com/rollout-strategy"
# Reloader publishes the options it runs with in this ConfigMap (pkg/common/metainfo.go)
META_INFO_SELECTOR: Final = "reloader.stakater.com/meta-info=reloader"
_KINDS: Final = ("Deployment", "DaemonSet", "StatefulSet", "CronJob", "Job")
_KUBECTL: Final = {
    "Deployment": "deployment",
    "DaemonSet": "daemonset",
    "StatefulSet": "statefulset",
    "CronJob": "cronjob",
    "Job": "job",
    "Rollout": "rollout.argoproj.io",
    **{k.facts.api_kind: k.value for k in SourceKind},  # (as kubectl names them: configmap)
}


@dataclass
class Finding:
    """One Reloader annotation, and what configpin does with it."""

    annotation: str  # as found: `key: "value"`
    verdict: str  # same, differently, not
    how: str
    commands: list[str] = field(default_factory=list)


@dataclass
class Subject:
    """A workload or a source that carries Reloader's annotations."""

    kind: str
    namespace: str
    name: str
    findings: list[Finding] = field(default_factory=list)
    both_run: str = ""  # what happens to it while Reloader and configpin both run
    remove: list[str] = field(default_factory=list)  # then: Reloader's annotations taken off


@dataclass
class Report:
    subjects: list[Subject] = field(default_factory=list)
    opt_in: list[str] = field(default_factory=list)  # `kubectl label namespace ...`
    notes: list[str] = field(default_factory=list)  # Reloader's own options, where published
    problems: list[str] = field(default_factory=list)  # what could not be read

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _annotations(meta: Any) -> dict[str, str]:
    found = meta.get("annotations") if isinstance(meta, dict) else None
    if not isinstance(found, dict):
        return {}
    return {k: v for k, v in found.items() if isinstance(k, str) and isinstance(v, str)}


def _said(key: str, value: str) -> str:
    return f"{key}: {json.dumps(value)}"


def _target(kind: str, namespace: str, name: str) -> str:
    return f"-n {shlex.quote(namespace)} {_KUBECTL.get(kind, kind.lower())}/{shlex.quote(name)}"


def _annotate(kind: str, namespace: str, name: str, key: str, value: str, *, over: bool) -> str:
    tail = " --overwrite" if over else ""
    return (
        f"kubectl annotate {_target(kind, namespace, name)} {shlex.quote(f'{key}={value}')}{tail}"
    )


def _template(obj: Mapping[str, Any]) -> tuple[dict[str, str], Any]:
    """The pod template's annotations and the pod spec of a workload of any kind."""
    paths = template_paths(str(obj.get("kind", "")))
    if paths is None:
        return {}, None
    return _annotations(get_path(obj, paths[0])), get_path(obj, paths[1])


def _names(sids: Iterable[SourceId]) -> str:
    return ", ".join(sorted(map(str, sids))) or "none"


class _Workload:
    """One workload, as the mapping reads it."""

    def __init__(self, obj: Mapping[str, Any], marks: Mapping[SourceId, str | None]) -> None:
        meta = obj.get("metadata") or {}
        self.obj = obj
        self.kind = str(obj.get("kind", ""))
        self.namespace, self.name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        self.own = _annotations(meta)
        self.theirs, self.spec = _template(obj)
        self.marks = marks  # what each source of its namespace says to Reloader
        sites = find_sites(self.spec) if isinstance(self.spec, dict) else []
        self.referenced = set(consumption(sites))
        self.extra = extra_sources(obj)[0]
        self.snapshot = self.own.get(ANN_MODE) == MODE_SNAPSHOT

    def annotations(self) -> Iterable[tuple[str, str, bool]]:
        """Reloader's annotations on it: (key, value, on its pod template)."""
        for key, value in sorted(self.own.items()):
            if key in WORKLOAD_ANNOTATIONS or key in (PAUSE, STRATEGY):
                yield key, value, False
        for key, value in sorted(self.theirs.items()):
            if key in WORKLOAD_ANNOTATIONS:
                yield key, value, True

    def extra_command(self, add: Iterable[SourceId]) -> str:
        named = [*map(str, self.extra), *(str(s) for s in add if s not in self.extra)]
        return _annotate(
            self.kind,
            self.namespace,
            self.name,
            ANN_EXTRA_SOURCES,
            ",".join(named),
            over=bool(self.extra),
        )


def _reload_list(w: _Workload, kind: SourceKind, value: str) -> Finding:
    said = _said(RELOAD[kind], value)
    entries = [p.strip() for p in value.split(",") if p.strip()]
    plain = [p for p in entries if is_dns1123_subdomain(p)]  # (a name: it matches itself)
    unread = [p for p in entries if not readable(p)]
    patterns = [p for p in entries if p not in plain and p not in unread]
    existing = [sid for sid in w.marks if sid.kind is kind]
    named = {SourceId(kind, p) for p in plain}
    named |= {sid for p in patterns for sid in existing if pattern_matches(p, sid.name)}
    outside = sorted(s for s in named if s not in w.referenced and s not in w.extra)
    if not outside and not patterns and not unread:
        return Finding(
            said,
            SAME,
            "configpin's default: its pod spec references each (or "
            f"{ANN_EXTRA_SOURCES} names it), and configpin rolls it for their changes",
        )
    how, commands = [], []
    if outside:
        how.append(
            f"{_names(outside)}: not referenced by its pod spec; configpin rolls it for "
            f"them once {ANN_EXTRA_SOURCES} names them (every key counts, as with Reloader)"
        )
        commands.append(w.extra_command(outside))
    if patterns:
        how.append(
            f"patterns {', '.join(patterns)}: {ANN_EXTRA_SOURCES} names sources, not "
            f"patterns; the sources they match now are named above ({_names(named)}); "
            "one created later is not"
        )
    if unread:
        how.append(
            f"{', '.join(unread)}: a pattern configpin does not read; while both run "
            "configpin rolls for those too (name them instead)"
        )
    verdict = SAME if not patterns and not unread else DIFFERENTLY
    return Finding(said, verdict, "; ".join(how), commands)


def _finding(w: _Workload, key: str, value: str) -> Finding:
    said = _said(key, value)
    kinds = {v: k for k, v in RELOAD.items()}
    if key in kinds:
        return _reload_list(w, kinds[key], value)
    if key in (AUTO, *TYPED_AUTO.values()):
        if value not in ("1", "t", "T", "TRUE", "true", "True"):
            return Finding(said, NOT, "Reloader does nothing for it (without --auto-reload-all)")
        how = (
            "configpin's default: it pins and rolls for every ConfigMap and Secret its pod "
            "spec references; only the keys it consumes count (items, key), and a change "
            "rolls in waves, followed and undone or held when it fails"
        )
        if key != AUTO:
            how += (
                "; for both kinds of source (to leave one out for every workload: "
                f"{ANN_IGNORE} on that source)"
            )
        return Finding(said, SAME if key == AUTO else DIFFERENTLY, how)
    if key == SEARCH:
        matched = sorted(s for s, mark in w.marks.items() if mark == "match")
        return Finding(
            said,
            DIFFERENTLY,
            "configpin needs no mark: it rolls for every source its pod spec "
            f"references, marked {MATCH} or not (marked here: {_names(matched)})",
        )
    if key in EXCLUDE.values():
        return Finding(
            said,
            DIFFERENTLY,
            "configpin has no exclusion per workload: a source annotated "
            f'{ANN_IGNORE}: "true" is left out for every workload',
        )
    if key == PAUSE:
        return Finding(
            said,
            DIFFERENTLY,
            "configpin does not pause the Deployment; its rollouts are paced by "
            "waves, --min-rollout-interval, rollout windows and budgets",
        )
    return Finding(
        said, NOT, "configpin re-stamps an Argo Rollout's template; it has no restart strategy"
    )


def _by_kind(w: _Workload, finding: Finding) -> Finding:
    """A Job's or CronJob's finding: Reloader starts a Job there, configpin never does."""
    if w.kind == "Job" and finding.verdict != NOT:
        return Finding(
            finding.annotation,
            NOT,
            "configpin never rolls a Job: its template "
            "cannot change once it is created (Reloader deletes and re-creates it)",
        )
    if w.kind == "CronJob" and finding.verdict == SAME:
        how = f"{finding.how}; the change reaches its next Job (Reloader starts one at once)"
        return Finding(finding.annotation, DIFFERENTLY, how, finding.commands)
    return finding


def _both_run(w: _Workload) -> str:
    """What happens to its changes while Reloader and configpin both run."""
    if w.kind == "CronJob":
        return (
            "Reloader creates a Job at once; configpin re-stamps the CronJob's template, "
            "which restarts nothing (its next Job runs the new content)"
        )
    if w.kind == "Job":
        return "Reloader re-creates the Job; configpin never changes a Job's template"
    if w.kind == "Rollout":
        return (
            "configpin rolls it; Reloader does too if it runs with --is-Argo-Rollouts=true: "
            "remove Reloader's annotations first then"
        )
    owner = left_to_owner(w.obj)
    if owner is not None:
        return (
            f"configpin does not pin it ({owned_reason(owner)}): Reloader's annotations "
            "are all that rolls it"
        )
    if w.snapshot:
        return (
            "configpin rolls it (snapshot mode re-points it at copies), and so may Reloader: "
            "remove Reloader's annotations first"
        )
    asks = reloader_asks(w.kind, w.obj, w.spec)
    if asks is None:
        return "configpin rolls it for every change; Reloader does nothing for it"
    sources = w.referenced | set(w.extra)
    sources |= {s for s in w.marks if covers(asks, s, w.marks[s]) is not None}
    left = {s for s in sources if covers(asks, s, w.marks.get(s)) is not None}
    mine = sources - left
    text = f"an update of {_names(left)} is left to Reloader (one restart)"
    if mine:
        text += f"; configpin rolls it for {_names(mine)}"
    return text


def _remove(w: _Workload) -> list[str]:
    keys = [k for k, _v, on in w.annotations() if not on]
    commands = []
    if keys:
        drop = " ".join(shlex.quote(f"{k}-") for k in keys)
        commands.append(f"kubectl annotate {_target(w.kind, w.namespace, w.name)} {drop}")
    if any(on for _k, _v, on in w.annotations()):
        commands.append("(its pod template's Reloader annotations: remove them from its manifest)")
    return commands


def _source(kind: SourceKind, meta: Mapping[str, Any]) -> Subject | None:
    annotations = _annotations(meta)
    namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
    api_kind = kind.facts.api_kind
    subject = Subject(api_kind, namespace, name)
    if IGNORE in annotations:
        if annotations[IGNORE] == "true":
            over = ANN_IGNORE in annotations
            done = annotations.get(ANN_IGNORE) == "true"
            command = (
                []
                if done
                else [_annotate(api_kind, namespace, name, ANN_IGNORE, "true", over=over)]
            )
            subject.findings.append(
                Finding(
                    _said(IGNORE, annotations[IGNORE]),
                    SAME,
                    f'{ANN_IGNORE}: "true": configpin never hashes it nor rolls anything for it. '
                    "Until then configpin rolls its consumers for it (Reloader leaves it)",
                    command,
                )
            )
        else:
            subject.findings.append(
                Finding(_said(IGNORE, annotations[IGNORE]), NOT, 'Reloader reads only "true"')
            )
    if MATCH in annotations:
        subject.findings.append(
            Finding(
                _said(MATCH, annotations[MATCH]),
                DIFFERENTLY,
                "configpin needs no mark: every workload whose pod spec references it rolls",
            )
        )
    if not subject.findings:
        return None
    keys = " ".join(shlex.quote(f"{k}-") for k in (IGNORE, MATCH) if k in annotations)
    subject.remove = [f"kubectl annotate {_target(api_kind, namespace, name)} {keys}"]
    return subject


def plan_migration(
    workloads: Iterable[Mapping[str, Any]],
    sources: Mapping[str, Mapping[SourceId, Mapping[str, Any]]],
    enabled: Callable[[str], bool | None],
    options: Mapping[str, Any] | None = None,
) -> Report:
    """The report: `sources` each namespace's ConfigMaps and Secrets (their metadata),
    `enabled(ns)` whether a namespace is opted in (None: could not be read), `options` what
    Reloader publishes of its own (its reloader-meta-info ConfigMap)."""
    report = Report()
    involved: set[str] = set()
    for obj in workloads:
        marks = {
            sid: source_mark(_annotations(meta))
            for sid, meta in sources.get(
                str((obj.get("metadata") or {}).get("namespace")), {}
            ).items()
        }
        w = _Workload(obj, marks)
        found = list(w.annotations())
        if not found:
            continue
        subject = Subject(w.kind, w.namespace, w.name)
        for key, value, on in found:
            finding = _by_kind(w, _finding(w, key, value))
            if on:
                finding.annotation += " (on its pod template)"
            subject.findings.append(finding)
        subject.both_run, subject.remove = _both_run(w), _remove(w)
        report.subjects.append(subject)
        involved.add(w.namespace)
    for namespace, named in sorted(sources.items()):
        for sid, meta in sorted(named.items()):
            found_source = _source(sid.kind, meta)
            if found_source is not None:
                report.subjects.append(found_source)
                involved.add(namespace)
    for namespace in sorted(involved):
        opted = enabled(namespace)
        if opted is False:
            report.opt_in.append(
                f"kubectl label namespace {shlex.quote(namespace)} {LABEL_ENABLED}=true"
            )
        elif opted is None:
            report.problems.append(f"namespace {namespace}: could not read whether it is opted in")
    report.notes = _notes(options or {})
    return report


def _notes(options: Mapping[str, Any]) -> list[str]:
    """What Reloader's published options change in the report."""
    notes = []
    if options.get("autoReloadAll"):
        notes.append(
            "Reloader runs with --auto-reload-all: it rolls workloads without "
            "annotations too, and configpin rolls those as well (two restarts): turn "
            "it off before opting their namespaces in"
        )
    if options.get("isArgoRollouts"):
        notes.append(
            "Reloader runs with --is-Argo-Rollouts: annotated Rollouts restart twice "
            "while both run; remove Reloader's annotations from them first"
        )
    for key, what in (("reloadOnCreate", "creation"), ("reloadOnDelete", "deletion")):
        if options.get(key):
            notes.append(
                f"Reloader rolls on a source's {what} too; configpin also does (for a "
                "source a workload references optionally): two restarts then"
            )
    for key in ("namespacesToIgnore", "namespaceSelectors", "resourceSelectors"):
        if options.get(key):
            notes.append(
                f"Reloader's {key} is {options[key]}: configpin leaves to Reloader only "
                "what its annotations ask; where Reloader does not look, nothing rolls "
                "until those annotations are removed (`configpin status`: "
                "left-to-reloader)"
            )
    return notes


# --- reading the cluster ----------------------------------------------------------------------


def _read(
    kube: Kube, namespace: str | None, report_problems: list[str]
) -> tuple[list[dict[str, Any]], dict[str, dict[SourceId, dict[str, Any]]], dict[str, Any] | None]:
    workloads: list[dict[str, Any]] = []
    for kind in (*_KINDS, "Rollout"):
        entry = builtin(kind) or (ARGO_ROLLOUT if kind == "Rollout" else None)
        assert entry is not None
        prefixes = [entry.prefix(v) for v in entry.versions]
        for prefix in prefixes:
            try:
                for page in kube.list_pages(path(entry.resource, namespace, prefix=prefix)):
                    for item in page.get("items") or ():
                        item.setdefault("kind", kind)
                        if controller_of(item) is None or operator_owned(item):
                            workloads.append(item)  # (not a CronJob's Job: its owner says)
                break
            except NotFound:
                continue  # (not served: CronJobs at batch/v1beta1 before 1.21, no Argo CRD)
            except KubeError as e:
                report_problems.append(f"{entry.resource}: {e}")
                break
    sources: dict[str, dict[SourceId, dict[str, Any]]] = {}
    for kind in SourceKind:
        try:
            for meta_obj in list_metadata(kube, path(kind.resource, namespace)):
                meta = meta_obj.get("metadata") or {}
                ns = str(meta.get("namespace", ""))
                sources.setdefault(ns, {})[SourceId(kind, str(meta.get("name")))] = meta
        except KubeError as e:
            report_problems.append(f"{kind.resource}: {e}")
    options = None
    try:
        for meta_obj in kube.list_pages(
            path(SourceKind.CONFIGMAP.resource), labelSelector=META_INFO_SELECTOR
        ):
            for item in meta_obj.get("items") or ():
                text = (item.get("data") or {}).get("reloaderOptions")
                options = json.loads(text) if isinstance(text, str) else None
    except (KubeError, ValueError):
        options = None  # (not allowed to look cluster-wide, or not published: no notes)
    return workloads, sources, options


def _enabled(kube: Kube) -> Callable[[str], bool | None]:
    """Whether a namespace is opted in (None: the user may not read it)."""

    def enabled(namespace: str) -> bool | None:
        try:
            ns = kube.get(path("namespaces", None, namespace, prefix="/api/v1"))
        except KubeError:
            return None
        labels = (ns.get("metadata") or {}).get("labels") or {}
        return labels.get(LABEL_ENABLED) == "true"

    return enabled


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-n", "--namespace", help="namespace (default: the context's)")
    p.add_argument("-A", "--all-namespaces", action="store_true", help="every namespace")
    p.add_argument("-o", "--output", choices=("json", "yaml"), help="output format")
    add_user_arguments(p)


def _text(report: Report) -> str:
    lines: list[str] = []
    for s in report.subjects:
        lines.append(f"{s.kind} {s.namespace}/{s.name}")
        for f in s.findings:
            lines.append(f"  {f.annotation}")
            lines.append(f"    {f.verdict.upper() if f.verdict == NOT else f.verdict}: {f.how}")
            lines.extend(f"      {c}" for c in f.commands)
        if s.both_run:
            lines.append(f"  while both run: {s.both_run}")
        if s.remove:
            lines.append("  then remove Reloader's annotations:")
            lines.extend(f"      {c}" for c in s.remove)
        lines.append("")
    if report.opt_in:
        lines.append("Opt the namespaces in (configpin pins and rolls nothing elsewhere):")
        lines.extend(f"  {c}" for c in report.opt_in)
        lines.append("")
    if report.notes:
        lines.append("Reloader's own options (its reloader-meta-info ConfigMap):")
        lines.extend(f"  {n}" for n in report.notes)
    return "\n".join(lines).rstrip() + "\n"


def run(args: argparse.Namespace) -> int:
    try:
        api, default_ns = connect_from_args(args)
    except (config.ConfigException, OSError) as e:
        print(f"configpin migrate: no cluster: {e}", file=sys.stderr)
        return 2
    namespace = None if args.all_namespaces else (args.namespace or default_ns)
    problems: list[str] = []
    use_custom_kinds((ARGO_ROLLOUT,))  # (its template, where Reloader's annotations may be)
    with api:
        kube = Kube(api)
        workloads, sources, options = _read(kube, namespace, problems)
        report = plan_migration(workloads, sources, _enabled(kube), options)
    report.problems[:0] = problems
    if args.output == "json":
        print(json.dumps(report.as_dict(), indent=2))
    elif args.output == "yaml":
        print(yaml.safe_dump(report.as_dict(), sort_keys=False), end="")
    elif report.subjects:
        print(_text(report), end="")
    else:
        print("No Reloader annotations found.", file=sys.stderr)
    for problem in report.problems:
        print(f"configpin migrate: {problem}", file=sys.stderr)
    return 2 if report.problems else 0


__all__ = ["Report", "add_arguments", "plan_migration", "run"]
