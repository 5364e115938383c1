"""`configpin wait configmap/NAME` (also `secret/NAME`, `-f FILE`; `kubectl configpin wait`):
wait until the change a ConfigMap or Secret holds now is delivered, or has failed, or the time
is up. A pipeline's step after `kubectl apply`, a Kargo verification or an Argo CD PostSync
hook runs it as it is (docs/wait.md).

It reads what configpin publishes, the source's `ConfigRollout` (`webhook.core.rollouts`),
and takes its verdict only from a status that says it is about the source as it stands now:
that object (uid) at that resourceVersion (`rollouts.about`). Started the instant after an
apply, it finds the status of the change before, about an older resourceVersion, and goes on
waiting: it never reports an earlier change's verdict. The source is read again at every look,
so a newer change made while it waits is the one it waits for.

Only the user's own rights: `get` on the sources and on configrollouts.configpin.io in their
namespaces (the chart's aggregated view role grants the second).

Exit status (the highest of its sources'): 0 every change delivered (Ready); 1 one failed,
was rolled back, held or paused (Stalled: it will not go on by itself); 2 a usage or connection
error, a source missing or not readable with the user's rights, or the timeout.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO, Final, Protocol, TextIO

from webhook.commands.render import read_inputs
from webhook.core.durations import SECOND, DurationError, format_duration, parse_duration
from webhook.core.kinds import admitted_kinds, template_paths
from webhook.core.model import (
    SOURCE_API_KINDS,
    SourceId,
    SourceKind,
    source_kind,
    typed_source_kind,
)
from webhook.core.refs import find_sites, get_path
from webhook.core.rollouts import (
    API_VERSION,
    GROUP,
    PLURAL,
    about,
    rollout_name,
    rollout_path,
    verdict,
)
from webhook.kube.errors import Forbidden, KubeError, NotFound
from webhook.kube.raw import Kube, path
from webhook.kube.user import connect_from_args
from webhook.kube.userflags import add_user_arguments

EXIT_DELIVERED: Final = 0
EXIT_FAILED: Final = 1
EXIT_ERROR: Final = 2
EXIT_INTERRUPTED: Final = 130  # (as a shell reports SIGINT)

DEFAULT_TIMEOUT: Final = "5m"
POLL: Final = 1.0  # seconds between two looks at a source
HINT_AFTER: Final = 10.0  # seconds with no ConfigRollout before saying what may be wrong
REQUEST_TIMEOUT: Final = 10.0  # seconds, at most, for one request


class UsageError(ValueError):
    """What the command line or the files ask for cannot be done; the message says why."""


def parse_timeout(text: str) -> float:
    """Seconds of `--timeout`: a duration as kubectl takes one (Go's: `30s`, `5m`, `1h30m`),
    or plain seconds (`90`, `1.5`). `0`: look once."""
    try:
        seconds = float(text)
    except ValueError:
        try:
            seconds = parse_duration(text) / SECOND
        except DurationError as e:
            raise UsageError(f"--timeout: {e}") from None
    if not math.isfinite(seconds) or seconds < 0:
        raise UsageError(f"--timeout: {text!r}: a duration of 0 or more expected (30s, 5m, 1h)")
    return seconds


@dataclass(frozen=True, slots=True)
class Target:
    """A source to wait for, in its namespace."""

    kind: SourceKind
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.kind}/{self.name}"


def parse_target(text: str) -> tuple[SourceKind, str]:
    """`configmap/NAME` or `secret/NAME` (any name kubectl takes for the kind: `cm/NAME`)."""
    kind_text, _, name = text.partition("/")
    kind = typed_source_kind(kind_text)
    if kind is None or not name or "/" in name:
        raise UsageError(f"{text!r}: configmap/NAME or secret/NAME expected")
    return kind, name


def _objects(obj: Any) -> Iterator[Any]:
    """The object, or a List's items."""
    kind = obj.get("kind") if isinstance(obj, dict) else None
    if isinstance(kind, str) and kind.endswith("List") and isinstance(obj.get("items"), list):
        yield from obj["items"]
    else:
        yield obj


def sources_in_files(
    paths: Sequence[str], stdin: BinaryIO | None = None
) -> list[tuple[SourceKind, str | None, str]]:
    """The ConfigMaps and Secrets of files and folders (`-` for standard input), as kind,
    namespace (None: the manifest names none) and name; their other objects are left out."""
    docs, errors = read_inputs(paths, stdin)
    if errors:
        raise UsageError(str(errors[0]))
    found: list[tuple[SourceKind, str | None, str]] = []
    for doc in docs:
        for obj in _objects(doc.obj):
            if not isinstance(obj, dict) or obj.get("apiVersion") != "v1":
                continue
            kind = source_kind(str(obj.get("kind")))
            meta = obj.get("metadata")
            if kind is None or not isinstance(meta, dict):
                continue
            name = meta.get("name")
            if not isinstance(name, str) or not name:
                raise UsageError(f"{doc.where()}: a {kind.api_kind} with no metadata.name")
            namespace = meta.get("namespace")
            found.append(
                (kind, namespace if isinstance(namespace, str) and namespace else None, name)
            )
    return found


def combine(codes: Iterable[int]) -> int:
    """The command's exit status from its sources': the highest (0 for none)."""
    return max(codes, default=EXIT_DELIVERED)


# -- one look ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Look:
    """What one look at a source and its ConfigRollout says: done with an exit code, or not
    yet (`code` None), in a person's words."""

    code: int | None
    said: str
    absent: bool = False  # no ConfigRollout at all


def _summary(status: Mapping[str, Any]) -> str:
    summary = status.get("summary")
    if not isinstance(summary, Mapping):
        return ""
    parts = [
        f"{key} {summary[key]}"
        for key in ("wave", "ready")
        if isinstance(summary.get(key), str) and summary[key] != "-"
    ]
    return f" ({', '.join(parts)})" if parts else ""


def judge(source: Mapping[str, Any], rollout: Mapping[str, Any] | None) -> Look:
    """What the ConfigRollout says of the change the source holds: a verdict only from a
    status about the source as it stands (its uid, its resourceVersion)."""
    meta = source.get("metadata") or {}
    uid = str(meta.get("uid") or "")
    version = str(meta.get("resourceVersion") or "")
    if rollout is None:
        return Look(None, "no ConfigRollout yet", absent=True)
    if not about(rollout, uid, version):
        status = rollout.get("status") or {}
        described = status.get("source") if isinstance(status, Mapping) else None
        if not isinstance(described, Mapping):
            return Look(None, f"waiting for configpin to describe resourceVersion {version}")
        if described.get("uid") != uid:
            return Look(None, "its ConfigRollout is about an earlier object of that name")
        return Look(
            None,
            f"its ConfigRollout is about resourceVersion {described.get('resourceVersion')}, "
            f"not {version} (the source as it stands): waiting for configpin to describe that",
        )
    said = verdict(rollout)
    if said.condition is None:
        return Look(None, said.message)
    words = f"{said.condition.value} {said.reason}: {said.message}"
    if said.ready:
        return Look(EXIT_DELIVERED, f"{said.condition.value}: {said.message}")
    if said.stalled:
        return Look(EXIT_FAILED, words)
    status = rollout.get("status") or {}
    return Look(None, words + (_summary(status) if isinstance(status, Mapping) else ""))


# -- the cluster, as the loop sees it ----------------------------------------------------------


class Reader(Protocol):
    """What the waiting loop reads: a source, its ConfigRollout (None: there is none), and
    whether the cluster serves ConfigRollouts at all. Raises webhook.kube.errors' errors."""

    def source(self, target: Target) -> Mapping[str, Any]: ...

    def rollout(self, target: Target) -> Mapping[str, Any] | None: ...

    def served(self) -> bool: ...

    def consumed(self, target: Target) -> bool | None:
        """Whether a workload of its namespace consumes the source (None: cannot tell)."""
        ...


class KubeReader:
    """A `Reader` over the API server, with the user's own credentials."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube

    def source(self, target: Target) -> Mapping[str, Any]:
        return self.kube.get(path(target.kind.resource, target.namespace, target.name))

    def rollout(self, target: Target) -> Mapping[str, Any] | None:
        name = rollout_name(target.kind, target.name)
        try:
            return self.kube.get(rollout_path(target.namespace, name))
        except NotFound:
            return None

    def served(self) -> bool:
        try:
            found = self.kube.get(f"/apis/{API_VERSION}")
        except NotFound:
            return False
        return any(r.get("name") == PLURAL for r in found.get("resources") or ())

    def consumed(self, target: Target) -> bool | None:
        """A workload of a kind configpin pins (a Pod, or a template's pod spec) in the
        source's namespace references it (volumes, env, envFrom); None where the user may not
        list one of those kinds."""
        sid = SourceId(target.kind, target.name)
        for kind in admitted_kinds():
            paths = template_paths(kind.kind)
            if paths is None:
                continue
            prefix = f"/apis/{kind.group}/{kind.versions[0]}" if kind.group else "/api/v1"
            try:
                found = self.kube.get(path(kind.resource, target.namespace, prefix=prefix))
            except NotFound:
                continue  # (not served here)
            except KubeError:
                return None
            for item in found.get("items") or ():
                spec = get_path(item, paths[1])
                if isinstance(spec, dict) and any(s.source == sid for s in find_sites(spec)):
                    return True
        return False


# -- the loop ----------------------------------------------------------------------------------


class _Failed(Exception):
    """A source that cannot be waited for: the wait ends (exit 2) with this message."""


@dataclass
class _Waiting:
    target: Target
    code: int | None = None
    said: str = ""
    read: bool = False  # read once at least (a later connection error is waited out)
    absent_since: float | None = None
    hinted: bool = False


def _needs(target: Target, resource: str) -> str:
    return f"wait needs 'get' on {resource} in namespace {target.namespace}"


def _said(error: KubeError) -> str:
    status = f"{error.status} " if error.status else ""
    return f"{error.what}: {status}{error.reason}".rstrip()


def _transient(error: KubeError) -> bool:
    """A fault of the connection or the server, not an answer about the object."""
    return error.status is None or error.status == 429 or error.status >= 500


def _look(reader: Reader, w: _Waiting) -> Look:
    target = w.target
    where = f"{target} in namespace {target.namespace}"
    try:
        source = reader.source(target)
    except NotFound:
        raise _Failed(f"{where} not found") from None
    except Forbidden as e:
        raise _Failed(f"{where}: {_needs(target, target.kind.resource)}: {e.reason}") from None
    try:
        rollout = reader.rollout(target)
    except Forbidden as e:
        raise _Failed(f"{where}: {_needs(target, f'{PLURAL}.{GROUP}')}: {e.reason}") from None
    return judge(source, rollout)


def _unconsumed(reader: Reader, target: Target) -> bool:
    """No ConfigRollout, and no workload there consumes the source: nothing to deliver (a
    consumer applied with it is there to be listed the instant after the apply)."""
    try:
        return reader.consumed(target) is False
    except KubeError:
        return False


def _hint(reader: Reader, w: _Waiting, after: float) -> str:
    target = w.target
    head = (
        f"configpin wait: {target}: no ConfigRollout {rollout_name(target.kind, target.name)} "
        f"in namespace {target.namespace} after {after:g}s"
    )
    try:
        served = reader.served()
    except KubeError:
        served = True
    if not served:
        return (
            f"{head}: this cluster does not serve {PLURAL}.{GROUP} (is configpin's chart "
            "installed, and as new as this command?)"
        )
    return (
        f"{head}: configpin publishes one for a ConfigMap or Secret that a workload consumes in a "
        f"namespace opted in: is {target.namespace} labelled configpin.io/enabled=true, and does "
        "a workload there consume it?"
    )


def wait_for(
    reader: Reader,
    targets: Sequence[Target],
    timeout: float,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    out: TextIO | None = None,
    err: TextIO | None = None,
    poll: float = POLL,
    hint_after: float = HINT_AFTER,
) -> int:
    """Look at every source about every `poll` seconds until each is done or `timeout`
    seconds have passed: a line on `out` for each source when it is done, on `err` what each
    says while it is not (when that changes); the exit status. A source missing or refused
    ends the wait at once (nothing after it could make the outcome better than 2)."""
    out = out or sys.stdout
    err = err or sys.stderr
    several = len({t.namespace for t in targets}) > 1
    waiting = [_Waiting(t) for t in targets]
    start = clock()
    deadline = start + timeout

    def label(target: Target) -> str:
        return f"{target} in {target.namespace}" if several else str(target)

    while True:
        for w in (w for w in waiting if w.code is None):
            try:
                look = _look(reader, w)
            except _Failed as e:
                print(f"configpin wait: {e}", file=err)
                _not_done(waiting, err, label)
                return EXIT_ERROR
            except KubeError as e:
                if not w.read or not _transient(e):
                    print(f"configpin wait: {label(w.target)}: {_said(e)}", file=err)
                    _not_done(waiting, err, label)
                    return EXIT_ERROR
                look = Look(None, f"cannot read it now: {_said(e)}")
            else:
                w.read = True
            now = clock()
            if look.absent and _unconsumed(reader, w.target):
                look = Look(EXIT_DELIVERED, "no workload consumes it: nothing to deliver")
            if look.absent:
                w.absent_since = now if w.absent_since is None else w.absent_since
                if not w.hinted and now - w.absent_since >= hint_after:
                    print(_hint(reader, w, hint_after), file=err)
                    w.hinted = True
            else:
                w.absent_since = None
            if look.code is not None:
                w.code = look.code
                done = "delivered" if look.code == EXIT_DELIVERED else "failed"
                print(f"{label(w.target)} {done} ({look.said})", file=out, flush=True)
            elif look.said != w.said and not look.absent:
                print(f"{label(w.target)}: {look.said}", file=err, flush=True)
            w.said = look.said
        if all(w.code is not None for w in waiting):
            return combine(w.code for w in waiting if w.code is not None)
        now = clock()
        if now >= deadline:
            seconds = round(timeout * SECOND)
            print(f"configpin wait: timed out after {format_duration(seconds)}", file=err)
            _not_done(waiting, err, label)
            return EXIT_ERROR
        sleep(min(poll, deadline - now))


def _not_done(waiting: Sequence[_Waiting], err: TextIO, label: Callable[[Target], str]) -> None:
    for w in waiting:
        if w.code is None:
            said = w.said or "not looked at yet"
            print(f"configpin wait: {label(w.target)} not done: {said}", file=err)


# -- command line ------------------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "sources", nargs="*", metavar="KIND/NAME", help="configmap/NAME or secret/NAME (may repeat)"
    )
    p.add_argument(
        "-f", "--filename", action="append", default=[],
        help="wait for every ConfigMap and Secret of this file or folder (*.yaml, *.yml, "
        "*.json, recursively; '-': standard input); may repeat",
    )  # fmt: skip
    p.add_argument(
        "-n", "--namespace", help="namespace of sources that name none (default: the context's)"
    )
    p.add_argument(
        "--timeout", default=DEFAULT_TIMEOUT,
        help="how long to wait in all: 30s, 5m, 1h30m, or seconds; 0: look once (default 5m)",
    )  # fmt: skip
    add_user_arguments(p)


def _targets(
    named: Sequence[tuple[SourceKind, str]],
    from_files: Sequence[tuple[SourceKind, str | None, str]],
    namespace: str,
) -> list[Target]:
    found = [Target(kind, namespace, name) for kind, name in named]
    found += [Target(kind, ns or namespace, name) for kind, ns, name in from_files]
    return list(dict.fromkeys(found))


def run(args: argparse.Namespace) -> int:
    try:
        timeout = parse_timeout(args.timeout)
        named = [parse_target(text) for text in args.sources]
        from_files = sources_in_files(args.filename, sys.stdin.buffer) if args.filename else []
        if not named and not from_files:
            kinds = " or ".join(sorted(SOURCE_API_KINDS))
            raise UsageError(
                f"no {kinds} in the files given"
                if args.filename
                else "configmap/NAME, secret/NAME or -f FILE expected"
            )
    except UsageError as e:
        print(f"configpin wait: {e}", file=sys.stderr)
        return EXIT_ERROR
    try:
        api, default_ns = connect_from_args(args)
    except Exception as e:  # kubeconfig, credentials: say what and stop
        print(f"configpin wait: no cluster: {e}", file=sys.stderr)
        return EXIT_ERROR
    targets = _targets(named, from_files, args.namespace or default_ns)
    with api:
        kube = Kube(api, timeout=min(REQUEST_TIMEOUT, max(timeout, 1.0)))
        try:
            return wait_for(KubeReader(kube), targets, timeout)
        except KeyboardInterrupt:  # not 1, which says a change failed
            print("configpin wait: interrupted", file=sys.stderr)
            return EXIT_INTERRUPTED


__all__ = [
    "EXIT_DELIVERED",
    "EXIT_ERROR",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "KubeReader",
    "Look",
    "Reader",
    "Target",
    "UsageError",
    "add_arguments",
    "combine",
    "judge",
    "parse_target",
    "parse_timeout",
    "run",
    "sources_in_files",
    "wait_for",
]
