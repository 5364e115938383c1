"""Stakater Reloader's annotations, read as Reloader reads them: which (workload, source) pairs
Reloader rolls, so that configpin's controller leaves those to it while both run (one restart
for one change, not two), and `configpin migrate` says what configpin does with each.

Reloader (internal/pkg/handler, pkg/common.ShouldReload) rolls a Deployment, DaemonSet or
StatefulSet for an update of a ConfigMap's or Secret's data when:

- the source is not annotated `reloader.stakater.com/ignore: "true"`, and its name is not in
  the workload's `configmaps.exclude.reloader.stakater.com/reload` (or `secrets.exclude...`);
- and one of these is on the workload's metadata, or, when none of them is there, on its pod
  template (for that kind of source): `configmap.reloader.stakater.com/reload` (a comma list of
  names, each a regular expression of the whole name: named ones, referenced or not),
  `reloader.stakater.com/auto` or `configmap.reloader.stakater.com/auto` true (as Go's
  strconv.ParseBool reads it), or `reloader.stakater.com/search: "true"` with
  `reloader.stakater.com/match: "true"` on the source. The last two only roll it for a source a
  container mounts (its first volume of that source) or reads in env/envFrom (containers,
  initContainers): it finds no container to patch otherwise.

What configpin cannot see from the objects it leaves to configpin, and so never counts as
covered (configpin rolls, never a missed change): a source created or deleted (Reloader reacts
to those only with --reload-on-create/--reload-on-delete), Argo Rollouts (only with
--is-Argo-Rollouts), CronJobs and Jobs (Reloader makes a new Job; configpin re-stamps the
CronJob's template, which restarts nothing), workloads in snapshot mode (their templates name
copies: Reloader's restart would keep the old ones), --auto-reload-all, and a `reload` entry
that is not a plain name or a simple pattern of one (`.`, `.*`, `.+`, `?`, `\\.`; matched here
in linear time, never by a backtracking engine).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from webhook.core.model import SourceId, SourceKind, SourceRecord

DOMAIN: Final = "reloader.stakater.com"
AUTO: Final = "reloader.stakater.com/auto"
SEARCH: Final = "reloader.stakater.com/search"
MATCH: Final = "reloader.stakater.com/match"  # on a source
IGNORE: Final = "reloader.stakater.com/ignore"  # on a source
LAST_RELOADED_FROM: Final = "reloader.stakater.com/last-reloaded-from"  # written by Reloader
ENV_PREFIX: Final = "STAKATER_"
# Per source kind: its `reload` list, its own `auto`, its exclude list, the env var's suffix.
RELOAD: Final[Mapping[SourceKind, str]] = {
    SourceKind.CONFIGMAP: "configmap.reloader.stakater.com/reload",
    SourceKind.SECRET: "secret.reloader.stakater.com/reload",
}
TYPED_AUTO: Final[Mapping[SourceKind, str]] = {
    SourceKind.CONFIGMAP: "configmap.reloader.stakater.com/auto",
    SourceKind.SECRET: "secret.reloader.stakater.com/auto",
}
EXCLUDE: Final[Mapping[SourceKind, str]] = {
    SourceKind.CONFIGMAP: "configmaps.exclude.reloader.stakater.com/reload",
    SourceKind.SECRET: "secrets.exclude.reloader.stakater.com/reload",
}
ENV_SUFFIX: Final[Mapping[SourceKind, str]] = {
    SourceKind.CONFIGMAP: "CONFIGMAP",
    SourceKind.SECRET: "SECRET",
}
# The kinds whose pod template Reloader patches in place (a restart configpin would double).
ROLLED_IN_PLACE: Final = frozenset({"Deployment", "DaemonSet", "StatefulSet"})
# Every workload annotation Reloader reads to decide (the last-reloaded-from record is not one).
WORKLOAD_ANNOTATIONS: Final = frozenset(
    {AUTO, SEARCH, *RELOAD.values(), *TYPED_AUTO.values(), *EXCLUDE.values()}
)
_TRUE: Final = frozenset({"1", "t", "T", "TRUE", "true", "True"})  # Go's strconv.ParseBool
_ABSENT: Final = "absent"  # webhook.core.digest.ABSENT (which imports this module)
_MAX_PATTERN: Final = 512
_MAX_ENTRIES: Final = 256


@dataclass(frozen=True, slots=True)
class Covered:
    """Why Reloader rolls a workload for a source: the annotation, and where it is."""

    annotation: str
    on_template: bool = False  # on the pod template, not the workload's metadata
    match: bool = False  # `search` on the workload, with `match` on the source

    def words(self) -> str:
        where = "its pod template" if self.on_template else "the workload"
        said = f"{self.annotation} on {where}"
        return f"{said}, {MATCH} on the source" if self.match else said


@dataclass(frozen=True, slots=True)
class KindAsks:
    """What a workload's Reloader annotations say of one kind of source."""

    reload: tuple[str, ...]  # the entries of its `reload` list
    auto: str | None  # the `auto` annotation that is true for this kind (None: neither)
    search: bool
    excluded: frozenset[str]
    on_template: bool  # read on the pod template (none of them on the metadata)


@dataclass(frozen=True, slots=True)
class ReloaderAsks:
    """What a workload asks of Reloader: per kind of source, and which sources Reloader finds
    in its containers (what `auto` and `search` roll it for)."""

    configmap: KindAsks | None
    secret: KindAsks | None
    referenced: frozenset[SourceId]

    def of(self, kind: SourceKind) -> KindAsks | None:
        return self.configmap if kind is SourceKind.CONFIGMAP else self.secret


def _strs(value: Any) -> Mapping[str, str]:
    if not isinstance(value, dict):
        return {}
    return {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, str)}


def carries(annotations: Mapping[str, Any]) -> bool:
    """Whether these annotations (a workload's or its template's) hold one Reloader reads."""
    return any(k in WORKLOAD_ANNOTATIONS for k in annotations)


def _entries(value: str) -> tuple[str, ...]:
    parts = (p.strip() for p in value.split(",", _MAX_ENTRIES)[:_MAX_ENTRIES])
    return tuple(p for p in parts if p)


def kind_asks(
    kind: SourceKind, own: Mapping[str, str], template: Mapping[str, str]
) -> KindAsks | None:
    """As ShouldReload reads them for a source of `kind`: from the metadata when it holds any
    of this kind's `reload`, `auto`, its typed `auto` or `search`, else from the template; the
    exclude list from the metadata only."""
    keys = (RELOAD[kind], AUTO, TYPED_AUTO[kind], SEARCH)
    on_template = not any(k in own for k in keys)
    read = template if on_template else own
    auto = next((k for k in (AUTO, TYPED_AUTO[kind]) if read.get(k, "") in _TRUE), None)
    search = read.get(SEARCH) == "true"
    reload = _entries(read.get(RELOAD[kind], ""))
    excluded = frozenset(_entries(own.get(EXCLUDE[kind], "")))
    if not reload and auto is None and not search:
        return None
    return KindAsks(reload, auto, search, excluded, on_template)


def _list(value: Any) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _named(ref: Any, field: str = "name") -> str | None:
    value = ref.get(field) if isinstance(ref, dict) else None
    return value if isinstance(value, str) else None


def _volume_source(volume: dict[str, Any]) -> Iterable[SourceId]:
    """The sources a volume names (a Secret's by `secretName`; a projected one's by `name`)."""
    for kind in SourceKind:
        facts = kind.facts
        if (name := _named(volume.get(facts.volume), facts.volume_name)) is not None:
            yield SourceId(kind, name)
    projected = volume.get("projected")
    for part in _list(projected.get("sources") if isinstance(projected, dict) else None):
        for kind in SourceKind:
            if (name := _named(part.get(kind.facts.volume))) is not None:
                yield SourceId(kind, name)


def _env_sources(container: dict[str, Any]) -> Iterable[SourceId]:
    for env in _list(container.get("env")):
        source = env.get("valueFrom")
        if not isinstance(source, dict):
            continue
        for kind in SourceKind:
            if (name := _named(source.get(kind.facts.key_ref))) is not None:
                yield SourceId(kind, name)
    for env_from in _list(container.get("envFrom")):
        for kind in SourceKind:
            if (name := _named(env_from.get(kind.facts.env_from))) is not None:
                yield SourceId(kind, name)


def referenced(pod_spec: Mapping[str, Any]) -> frozenset[SourceId]:
    """The sources Reloader finds a container for (getContainerUsingResource): the first volume
    of each that a container or init container mounts, and env/envFrom references in them
    (ephemeral containers are not looked at)."""
    containers = _list(pod_spec.get("containers")) + _list(pod_spec.get("initContainers"))
    if not _list(pod_spec.get("containers")):
        return frozenset()
    mounted = {
        m.get("name") for c in containers for m in _list(c.get("volumeMounts")) if m.get("name")
    }
    first: dict[SourceId, object] = {}
    for volume in _list(pod_spec.get("volumes")):
        for sid in _volume_source(volume):
            first.setdefault(sid, volume.get("name"))
    found = {sid for sid, name in first.items() if name in mounted}
    for container in containers:
        found.update(_env_sources(container))
    return frozenset(found)


def reloader_asks(kind: str, obj: Mapping[str, Any], pod_spec: Any) -> ReloaderAsks | None:
    """What a workload of `kind` asks of Reloader; None when it asks nothing, or is of a kind
    Reloader does not roll in place. (The mode is the caller's: snapshot mode is never left.)"""
    if kind not in ROLLED_IN_PLACE or not isinstance(pod_spec, dict):
        return None
    meta = obj.get("metadata")
    own = _strs(meta.get("annotations") if isinstance(meta, dict) else None)
    spec = obj.get("spec")
    template = spec.get("template") if isinstance(spec, dict) else None
    tmeta = template.get("metadata") if isinstance(template, dict) else None
    theirs = _strs(tmeta.get("annotations") if isinstance(tmeta, dict) else None)
    if not carries(own) and not carries(theirs):
        return None
    cm = kind_asks(SourceKind.CONFIGMAP, own, theirs)
    secret = kind_asks(SourceKind.SECRET, own, theirs)
    if cm is None and secret is None:
        return None
    return ReloaderAsks(cm, secret, referenced(pod_spec))


def source_mark(annotations: Mapping[str, Any]) -> str | None:
    """What a source says to Reloader: "ignore" (it never rolls anything for it, which wins),
    "match" (found by `search`), or None."""
    if annotations.get(IGNORE) == "true":
        return "ignore"
    if annotations.get(MATCH) == "true":
        return "match"
    return None


def covers(asks: ReloaderAsks, sid: SourceId, mark: str | None) -> Covered | None:
    """Why Reloader rolls the workload for an update of `sid` (whose mark is `mark`), or None
    when it does not (configpin rolls it)."""
    if mark == "ignore":
        return None
    wants = asks.of(sid.kind)
    if wants is None or sid.name in wants.excluded:
        return None
    on = wants.on_template
    if any(pattern_matches(p, sid.name) for p in wants.reload):
        return Covered(RELOAD[sid.kind], on)
    if sid not in asks.referenced:
        return None
    if wants.search and mark == "match":
        return Covered(SEARCH, on, match=True)
    if wants.auto is not None:
        return Covered(wants.auto, on)
    return None


def left_to_reloader(
    asks: ReloaderAsks | None,
    stale: Iterable[SourceId],
    lookup: Callable[[SourceId], SourceRecord | None],
    recorded_for: Callable[[str], str | None],
) -> dict[SourceId, Covered]:
    """Of a workload's `stale` sources, those whose change Reloader rolls it for, and why: an
    update of a source that it recorded content of and that exists now (as `lookup` holds it),
    which `covers` says Reloader rolls. A source that appeared or went away is configpin's."""
    if asks is None:
        return {}
    left: dict[SourceId, Covered] = {}
    for sid in stale:
        record = lookup(sid)
        if record is None or recorded_for(str(sid)) in (None, _ABSENT):
            continue
        found = covers(asks, sid, record.reloader)
        if found is not None:
            left[sid] = found
    return left


# --- a `reload` entry: a regular expression of the whole name, in the subset read here


def _tokens(pattern: str) -> list[tuple[str, str]] | None:
    """(what: a character or "" for any, how often: "1", "*", "+", "?"); None: outside the
    subset (a group, a class, an alternative, an anchor, a repeat count...)."""
    if len(pattern) > _MAX_PATTERN:
        return None
    out: list[tuple[str, str]] = []
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch in "*+?":
            if not out or out[-1][1] != "1":
                return None  # (nothing to repeat, `**`, a lazy `*?`)
            out[-1] = (out[-1][0], ch)
        elif ch == "\\":
            if pattern[i + 1 : i + 2] != ".":
                return None
            out.append((".", "1"))
            i += 1
        elif ch == ".":
            out.append(("", "1"))
        elif ch.isascii() and (ch.isalnum() or ch in "-_"):
            out.append((ch, "1"))
        else:
            return None
        i += 1
    return out


def readable(pattern: str) -> bool:
    """Whether a `reload` entry is in the subset configpin reads (see the module)."""
    return _tokens(pattern) is not None


def pattern_matches(pattern: str, name: str) -> bool:
    """Whether `^pattern$` matches `name` (False outside the subset): the positions a run of
    the tokens can reach, kept as a set, one character at a time (linear in both)."""
    tokens = _tokens(pattern)
    if tokens is None:
        return False

    def closure(states: set[int]) -> set[int]:
        todo = list(states)
        while todo:
            at = todo.pop()
            if at < len(tokens) and tokens[at][1] in "*?" and at + 1 not in states:
                states.add(at + 1)
                todo.append(at + 1)
        return states

    states = closure({0})
    for ch in name:
        nxt: set[int] = set()
        for at in states:
            if at == len(tokens):
                continue
            what, how = tokens[at]
            if what not in ("", ch):
                continue
            if how in "*+":
                nxt.add(at)  # (another of the same)
            nxt.add(at + 1)
        if not nxt:
            return False
        states = closure(nxt)
    return len(tokens) in states


def env_var(sid: SourceId) -> str:
    """The env var Reloader's env-vars strategy sets (util.ConvertToEnvVarName)."""
    out: list[str] = []
    valid = False
    for ch in sid.name.upper():
        if ch.isascii() and ch.isalnum():
            out.append(ch)
            valid = True
        else:
            if valid:
                out.append("_")
            valid = False
    return f"{ENV_PREFIX}{''.join(out)}_{ENV_SUFFIX[sid.kind]}"
