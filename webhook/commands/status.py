"""`configpin status` (also `kubectl configpin status`): is this workload pinned, to what, and
is it stale?

It needs no digest key and no more rights than the user has. For each workload it reads what
the pod template records (`configpin.io/sources`, and `configpin.io/observed` where a rollback is
kept) and asks the API server what admission would record for the same workload now: a
server-side dry-run create of a copy under a generated name, which runs configpin's webhook
exactly as a real create would and persists nothing (the webhook has no side effects on dry
runs). The two are compared digest by digest; digests are keyed, so nothing secret is shown.
The user needs `get`/`list` on the workloads and `create` on their kind, as for `kubectl apply
--dry-run=server`.

Exit status (the highest of its workloads', `reasons.STATUS_EXIT`): 0 only when every
workload is known to be current (or not pinned); 1 a change not delivered yet (stale, waiting,
rolling, held) or one that failed, a required source missing; 2 usage or connection errors, or
a workload it could not judge (`unknown`: the user's rights refuse the dry run).
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import re
import sys
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, Final

import yaml
from kubernetes import config

from webhook.commands.waits import Waits
from webhook.core.constants import (
    ANN_MODE,
    ANN_OBSERVED,
    ANN_REJECTED,
    ANN_ROLLED_AT,
    ANN_ROLLOUT,
    ANN_SOURCES,
    LABEL_SNAPSHOT,
)
from webhook.core.kept import parse_mapping
from webhook.core.kinds import (
    BUILTIN_KINDS,
    custom_kind,
    custom_kinds,
    fixed_template,
    template_paths,
    workload_kind,
    workload_ref,
)
from webhook.core.model import SourceId
from webhook.core.names import SUFFIX_LEN, snapshot_name
from webhook.core.owners import left_to_owner, operator_owned, owned_reason
from webhook.core.reasons import SourceState, Status
from webhook.core.record import (
    ACTION_WORDS,
    ROLLOUT_WORDS,
    State,
    by_whom,
    digest_mapping_any,
    rejected,
)
from webhook.core.refs import RefSite, find_sites, get_path
from webhook.core.reloader import covers, reloader_asks, source_mark
from webhook.kube.errors import Forbidden, KubeError, NotFound
from webhook.kube.meta import get_metadata
from webhook.kube.raw import Kube, path
from webhook.kube.user import connect_from_args
from webhook.kube.userflags import add_user_arguments
from webhook.kube.workloads import served_prefix

# What status reports on: every workload kind with a pod template of its own (not bare Pods)
_KINDS: Final = {k.kind: k for k in BUILTIN_KINDS if k.admitted and k.template}
_ALIASES: Final = {
    **{k.lower(): k for k in _KINDS},
    **{e.resource: k for k, e in _KINDS.items()},
    **{short: k for k, e in _KINDS.items() for short in e.short_names},
}
_HEX: Final = re.compile(r"[0-9a-f]+")
_ACTIONS: Final = {a.value: w.short for a, w in ACTION_WORDS.items()}  # (the record as read)


@dataclass
class SourceStatus:
    source: str
    recorded: str | None
    current: str | None
    rejected: str | None = None  # content a rollout of it failed with (never rolled to again)

    @property
    def state(self) -> SourceState:
        if self.recorded == self.current:
            return SourceState.CURRENT
        if self.current is None:
            return SourceState.GONE
        if self.current == self.rejected:
            return SourceState.REJECTED
        if self.recorded is None:
            return SourceState.NEW
        return SourceState.STALE


@dataclass
class WorkloadStatus:
    namespace: str
    kind: str
    name: str
    mode: str = ""
    pinned: bool = False
    state: Status = Status.CURRENT
    reason: str = ""
    sources: list[SourceStatus] = field(default_factory=list)
    copies: list[str] = field(default_factory=list)
    rolled_at: str = ""
    warnings: list[str] = field(default_factory=list)

    rollout: dict[str, Any] = field(default_factory=dict)  # configpin's rollout record

    @property
    def failing(self) -> bool:
        return self.state.failing

    def as_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["state"] = self.state.value  # (a plain str for YAML)
        doc["sources"] = [{**asdict(s), "state": s.state.value} for s in self.sources]
        return doc


def _annotations(meta: Any) -> dict[str, Any]:
    annotations = meta.get("annotations") if isinstance(meta, dict) else None
    return annotations if isinstance(annotations, dict) else {}


def _dry_run_copy(obj: dict[str, Any], sources: Iterable[str] = ()) -> dict[str, Any]:
    """The workload as a new object under a generated name, its configpin record removed, so
    that admission decides afresh what it would record now. References to snapshot copies of
    `sources` (recorded "configmap/<name>" keys) are put back to the sources' own names:
    admission keeps a template that points at existing copies as it is (a rollback is
    respected), so only the names of the sources make it look at their current content."""
    body = copy.deepcopy(obj)
    body.pop("status", None)
    meta = body.setdefault("metadata", {})
    for key in (
        "uid",
        "resourceVersion",
        "creationTimestamp",
        "generation",
        "managedFields",
        "selfLink",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "finalizers",
    ):
        meta.pop(key, None)
    meta["generateName"] = str(meta.pop("name", "workload"))[:40] + "-status-"
    spec = _pod_spec(body)
    if spec is not None:
        for site, source in _copy_sites(spec, sources):
            parent = get_path(spec, site.path[:-1])
            if isinstance(parent, dict):
                parent[site.path[-1]] = source
    return body


def _template_meta(obj: dict[str, Any]) -> dict[str, Any]:
    paths = template_paths(str(obj.get("kind", "")))
    meta = get_path(obj, paths[0]) if paths else None
    return meta if isinstance(meta, dict) else {}


def _pod_spec(obj: dict[str, Any]) -> dict[str, Any] | None:
    paths = template_paths(str(obj.get("kind", "")))
    spec = get_path(obj, paths[1]) if paths else None
    return spec if isinstance(spec, dict) else None


_SUFFIX: Final = SUFFIX_LEN + 1  # "-" and the hex of the content digest


def copy_of(name: str, sources: Iterable[str]) -> str | None:
    """Of `sources` (names), the one whose snapshot copy `name` is by its form
    (webhook.core.names.snapshot_name: the source's name, cut and tagged when long, then
    "-" and 10 hex of the content digest)."""
    tail = name[-_SUFFIX:]
    if len(name) <= _SUFFIX or tail[0] != "-" or not _HEX.fullmatch(tail[1:]):
        return None
    for source in sources:
        if source != name and snapshot_name(source, "0" * SUFFIX_LEN)[:-_SUFFIX] == name[:-_SUFFIX]:
            return source
    return None


def _copy_sites(spec: dict[str, Any], sources: Iterable[str]) -> Iterator[tuple[RefSite, str]]:
    """The references to snapshot copies of `sources` ("configmap/<name>" keys), each with the
    name of its source."""
    by_kind: dict[str, list[str]] = {}
    for key in sources:
        kind, _, name = key.partition("/")
        by_kind.setdefault(kind, []).append(name)
    for site in find_sites(spec):
        source = copy_of(site.source.name, by_kind.get(site.source.kind.value, ()))
        if source is not None:
            yield site, source


def _stale(st: WorkloadStatus) -> list[str]:
    """The sources (`configmap/NAME`) a workload is stale for: changed since it recorded them."""
    return [s.source for s in st.sources if s.state is SourceState.STALE]


def _copies(obj: dict[str, Any], recorded: dict[str, str]) -> list[str]:
    """The snapshot copies the pod template points at."""
    spec = _pod_spec(obj)
    if spec is None:
        return []
    return sorted(
        {f"{site.source.kind}/{site.source.name}" for site, _ in _copy_sites(spec, recorded)}
    )


class StatusReader:
    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self.waits = Waits(kube)
        self._prefixes: dict[str, str | None] = {}

    def prefix(self, kind: str) -> str | None:
        entry = workload_kind(kind)
        if entry is None:
            return None
        if len(entry.versions) == 1:
            return entry.prefix()
        if kind not in self._prefixes:  # asked once (CronJobs: batch/v1 or v1beta1)
            self._prefixes[kind] = served_prefix(self.kube, entry)
        return self._prefixes[kind]

    def _path(self, kind: str, namespace: str | None, name: str | None = None) -> str | None:
        prefix = self.prefix(kind)
        entry = workload_kind(kind)
        if prefix is None or entry is None:
            return None
        return path(entry.resource, namespace, name, prefix=prefix)

    def workloads(
        self, namespace: str | None, kinds: Iterable[str], selector: str | None
    ) -> Iterator[dict[str, Any]]:
        for kind in kinds:
            path = self._path(kind, namespace)
            if path is None:
                continue
            pages = self.kube.list_pages(path, labelSelector=selector)
            if custom_kind(kind) is not None:
                pages = _unless_unserved(pages)  # a CRD that is not installed: nothing to list
            for page in pages:
                for item in page.get("items") or ():
                    item.setdefault("kind", kind)
                    item.setdefault("apiVersion", self.api_version(kind))
                    meta = item.get("metadata") or {}
                    # owned objects (a Deployment's ReplicaSets, a CronJob's Jobs) follow
                    # their owner's template; configpin's copies are not workloads
                    if (meta.get("labels") or {}).get(LABEL_SNAPSHOT):
                        continue
                    if left_to_owner(item) is not None and not operator_owned(item):
                        continue
                    yield item

    def one(self, namespace: str, kind: str, name: str) -> dict[str, Any]:
        path = self._path(kind, namespace, name)
        if path is None:
            raise NotFound(f"{kind} {name}", 404, f"{kind} is not served")
        obj = self.kube.get(path)
        obj.setdefault("kind", kind)
        obj.setdefault("apiVersion", self.api_version(kind))
        return obj

    def api_version(self, kind: str) -> str:
        prefix = self.prefix(kind) or ""
        return prefix.removeprefix("/apis/").removeprefix("/api/")

    def status(self, obj: dict[str, Any]) -> WorkloadStatus:
        meta = obj.get("metadata") or {}
        kind = str(obj.get("kind"))
        st = WorkloadStatus(str(meta.get("namespace") or ""), kind, str(meta.get("name") or ""))
        own = _annotations(meta)
        st.mode = str(own.get(ANN_MODE) or "default")
        st.rolled_at = str(own.get(ANN_ROLLED_AT) or "")
        recorded = parse_mapping(_annotations(_template_meta(obj)).get(ANN_SOURCES)) or {}
        observed = parse_mapping(own.get(ANN_OBSERVED))
        st.pinned = bool(recorded)
        st.copies = _copies(obj, recorded)
        if st.mode == "off":
            st.state, st.reason = Status.NOT_PINNED, "mode off (configpin.io/mode)"
            return st
        owner = left_to_owner(obj)
        if owner is not None:
            st.state, st.reason = Status.NOT_PINNED, owned_reason(owner)
            return st
        ref = workload_ref(obj)
        if ref is not None:
            st.state = Status.NOT_PINNED
            st.reason = f"workloadRef: its pod template is {ref[1]} {ref[2]}'s, pinned there"
            return st
        if fixed_template(kind):
            st.sources = [SourceStatus(k, v, v) for k, v in sorted(recorded.items())]
            st.state = Status.CURRENT if recorded else Status.NOT_PINNED
            st.reason = f"a {kind}'s pod template cannot change: it runs what it recorded"
            return st
        try:
            now, warnings = self._admit_now(obj)
        except Forbidden as e:
            st.state = Status.UNKNOWN
            st.reason = f"cannot judge: {self.needs(obj)}; the API server refused it: {e.reason}"
            return st
        except KubeError as e:
            st.state, st.reason = Status.UNKNOWN, f"cannot judge: the dry run failed: {e}"
            return st
        st.warnings = warnings
        current = parse_mapping(_annotations(_template_meta(now)).get(ANN_SOURCES)) or {}
        # a kept rollback: the workload's own record says what it was brought up to date with
        mine = observed if observed is not None else recorded
        rejected_content = rejected(obj)
        st.sources = [
            SourceStatus(key, mine.get(key), current.get(key), rejected_content.get(key))
            for key in sorted(set(mine) | set(current))
        ]
        missing = [w for w in warnings if "not found" in w or "could not be read" in w]
        if missing:
            st.state, st.reason = Status.MISSING, "; ".join(missing)[:300]
        elif any(s.state is not SourceState.CURRENT for s in st.sources):
            st.state = Status.STALE
            st.reason = ", ".join(
                f"{s.source} {s.state}" for s in st.sources if s.state is not SourceState.CURRENT
            )
        elif not recorded and not current:
            st.state = Status.NOT_PINNED
            st.reason = "; ".join(warnings)[:300] or (
                "no ConfigMap or Secret referenced, or its namespace is not opted in"
            )
        if observed is not None and observed != recorded and "rollback" not in st.reason:
            st.reason = (st.reason + "; " if st.reason else "") + "rollback kept"
        self._delivery(obj, st)
        if st.state is Status.STALE:
            self._reloader(obj, st)
        return st

    def _reloader(self, obj: dict[str, Any], st: WorkloadStatus) -> None:
        """Stale only for updates that Stakater Reloader's annotations leave to Reloader (as
        the controller decides them, webhook.core.reloader): said, and what lets configpin roll.
        What each source says to Reloader is read as its metadata (never a Secret's data)."""
        asks = reloader_asks(st.kind, obj, _pod_spec(obj))
        stale = [s for s in st.sources if s.state is not SourceState.CURRENT]
        if asks is None or st.copies or any(s.state is not SourceState.STALE for s in stale):
            return
        said = []
        for s in stale:
            sid = SourceId.parse(s.source)
            said_there = self.source_annotations(st.namespace, sid)
            if said_there is None:
                return  # (what it says to Reloader is not known: stale, as it is)
            covered = covers(asks, sid, source_mark(said_there))
            if covered is None:
                return
            said.append(f"{s.source} by {covered.words()}")
        st.state = Status.LEFT_TO_RELOADER
        st.reason = (
            f"left to Stakater Reloader ({'; '.join(said)}): its restart brings the change; "
            "remove Reloader's annotation to let configpin roll it"
        )

    def _delivery(self, obj: dict[str, Any], st: WorkloadStatus) -> None:
        """Safe delivery's part: the rollout configpin follows or followed (its record, read
        as it stands: this command holds no key to check its signature), content rejected,
        and why a stale workload waits (the controller's ConfigRolloutWaiting Event)."""
        record = digest_mapping_any(_annotations(obj.get("metadata")).get(ANN_ROLLOUT))
        if record:
            st.rollout = {k: record.get(k) for k in ("state", "since", "signal", "action", "by")}
        state = record.get("state") if record else None
        kept_out = (SourceState.CURRENT, SourceState.REJECTED)
        if st.state is Status.STALE and all(s.state in kept_out for s in st.sources):
            st.state = Status.REJECTED
            st.reason = f"content a failed rollout brought is kept out ({ANN_REJECTED})"
        by = by_whom(str(record.get("by") or "")) if record else ""
        if st.state is Status.STALE and state == State.ROLLING:
            # its rollout in flight was superseded by a newer change, which its windows or
            # budget hold, or a person paused: that is what a person must know
            waits, note = self._waiting(obj, _stale(st))
            if waits in (Status.AWAITING_WINDOW, Status.FLAPPING, Status.PAUSED, Status.ABORTED):
                st.state, st.reason = waits, note
                return
        if state == State.ROLLING and st.state in (Status.CURRENT, Status.STALE):
            st.state = Status.ROLLING
            st.reason = f"{ROLLOUT_WORDS[State.ROLLING]}{by}"
        elif state == State.FAILED and st.state in (Status.CURRENT, Status.REJECTED):
            st.state = Status.FAILED
            done = _ACTIONS.get(str(record.get("action")), "?")
            st.reason = f"{ROLLOUT_WORDS[State.FAILED]}: {record.get('signal')} ({done}){by}"
        elif state == State.LEFT and st.state is Status.CURRENT:
            st.reason = f"at zero replicas: {ROLLOUT_WORDS[State.LEFT]}"
        if st.state is Status.STALE:
            waits, note = self._waiting(obj, _stale(st))
            if waits is not None:
                st.state, st.reason = waits, note

    def source_annotations(self, namespace: str, sid: SourceId) -> dict[str, Any] | None:
        """A source's annotations, read as its metadata; None: it cannot be read."""
        try:
            meta = get_metadata(self.kube, path(sid.kind.resource, namespace, sid.name))
        except KubeError:
            return None
        return _annotations(meta.get("metadata"))

    def _waiting(self, obj: dict[str, Any], stale: Sequence[str] = ()) -> tuple[Status | None, str]:
        return self.waits.of(obj, stale)

    def needs(self, obj: dict[str, Any]) -> str:
        """The right the dry run asks for, as RBAC names it: what a user who was refused lacks."""
        kind = str(obj.get("kind"))
        entry = workload_kind(kind)
        namespace = str((obj.get("metadata") or {}).get("namespace") or "")
        resource = kind if entry is None else entry.resource
        if entry is not None and entry.group:
            resource = f"{resource}.{entry.group}"
        return (
            f"status needs 'create' on {resource} in namespace {namespace} "
            "(a server-side dry run, which persists nothing)"
        )

    def _admit_now(self, obj: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
        kind = str(obj.get("kind"))
        namespace = str((obj.get("metadata") or {}).get("namespace") or "")
        path = self._path(kind, namespace)
        assert path is not None
        own = _annotations(obj.get("metadata") or {})
        sources = {
            **(parse_mapping(_annotations(_template_meta(obj)).get(ANN_SOURCES)) or {}),
            **(parse_mapping(own.get(ANN_OBSERVED)) or {}),
        }
        body = _dry_run_copy(obj, sources)
        resp = self.kube.open("POST", path, query={"dryRun": "All"}, body=body)
        try:
            warnings = [_warning_text(w) for w in resp.headers.getlist("Warning")]
            data = resp.read()
        finally:
            resp.release_conn()
        return json.loads(data), warnings


def _unless_unserved(pages: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    try:
        yield from pages
    except NotFound:
        return


def _warning_text(header: str) -> str:
    # RFC 7234: 299 - "text"
    text = header.split(" ", 2)[-1] if header.startswith("299") else header
    return text.strip().strip('"')


# -- command line ------------------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", nargs="?", help="KIND/NAME or NAME (any kind) to show one workload")
    p.add_argument("-n", "--namespace", help="namespace (default: the context's)")
    p.add_argument("-A", "--all-namespaces", action="store_true", help="every namespace")
    p.add_argument("-l", "--selector", help="label selector of the workloads")
    p.add_argument("-o", "--output", choices=("wide", "json", "yaml"), help="output format")
    add_user_arguments(p)
    p.add_argument("--workers", type=int, default=8, help="dry runs at once (default 8)")


def _age(stamp: str) -> str:
    try:
        then = datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return stamp
    seconds = int((datetime.datetime.now(datetime.UTC) - then).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit} ago"
    return f"{max(seconds, 0)}s ago"


def _table(rows: Sequence[WorkloadStatus], wide: bool, all_ns: bool) -> str:
    head = ["KIND", "NAME", "MODE", "STATE", "SOURCES", "LAST ROLLOUT", "WHY"]
    if all_ns:
        head.insert(0, "NAMESPACE")
    lines = [head]
    for st in rows:
        line = [
            st.kind,
            st.name,
            st.mode,
            st.state.upper() if st.failing else st.state,
            str(len(st.sources)),
            _age(st.rolled_at) if st.rolled_at else "-",
            st.reason or "-",
        ]
        if all_ns:
            line.insert(0, st.namespace)
        lines.append(line)
        if wide:
            for s in st.sources:
                detail = (
                    f"{s.state}: recorded {(s.recorded or '-')[:12]} now {(s.current or '-')[:12]}"
                )
                lines.append(
                    ["", "  " + s.source, "", "", "", "", detail] + ([""] if all_ns else [])
                )
            for c in st.copies:
                lines.append(["", "  copy " + c, "", "", "", "", ""] + ([""] if all_ns else []))
    widths = [max(len(r[i]) for r in lines) for i in range(len(head))]
    return (
        "\n".join(
            "   ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip()
            for r in lines
        )
        + "\n"
    )


def _kinds() -> list[str]:
    return [*_KINDS, *(k.kind for k in custom_kinds())]


def _custom_alias(text: str) -> str | None:
    name = text.lower().split(".")[0]
    for custom in custom_kinds():
        if name in (custom.kind.lower(), custom.resource):
            return custom.kind
    return None


def run(args: argparse.Namespace) -> int:
    try:
        api, default_ns = connect_from_args(args)
    except (config.ConfigException, OSError) as e:
        print(f"configpin status: no cluster: {e}", file=sys.stderr)
        return 2
    with api:
        reader = StatusReader(Kube(api))
        namespace = None if args.all_namespaces else (args.namespace or default_ns)
        try:
            if args.target:
                kind_text, _, name = args.target.rpartition("/")
                if kind_text:
                    kind = _ALIASES.get(kind_text.lower().split(".")[0]) or _custom_alias(kind_text)
                    if kind is None:
                        print(f"configpin status: unknown kind {kind_text!r}", file=sys.stderr)
                        return 2
                    objects = [reader.one(namespace or default_ns, kind, name)]
                else:
                    objects = [
                        o
                        for o in reader.workloads(namespace, _kinds(), None)
                        if o["metadata"]["name"] == name
                    ]
                    if not objects:
                        raise NotFound(name, 404, "no workload of that name")
            else:
                objects = list(reader.workloads(namespace, _kinds(), args.selector))
        except KubeError as e:
            print(f"configpin status: {e}", file=sys.stderr)
            return 2
        with ThreadPoolExecutor(max(1, args.workers)) as pool:
            rows = list(pool.map(reader.status, objects))
    rows.sort(key=lambda s: (s.namespace, s.kind, s.name))
    if args.output == "json":
        print(json.dumps([r.as_dict() for r in rows], indent=2))
    elif args.output == "yaml":
        print(yaml.safe_dump([r.as_dict() for r in rows], sort_keys=False), end="")
    elif rows:
        print(_table(rows, args.output == "wide", namespace is None), end="")
    else:
        print("No workloads found.", file=sys.stderr)
    unknown = [r for r in rows if r.state is Status.UNKNOWN]
    if unknown:
        print(
            f"configpin status: {len(unknown)} workload(s) could not be judged, so they are "
            f"not known to be current: {unknown[0].reason}",
            file=sys.stderr,
        )
    return max((r.state.exit_code for r in rows), default=0)


__all__ = ["StatusReader", "WorkloadStatus", "add_arguments", "run"]
