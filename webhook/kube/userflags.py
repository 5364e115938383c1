"""kubectl's flags for acting as the user at the keyboard (client-go's `ConfigFlags`), shared by
every command that does (status, plan, approve, wait, dashboard, version): `--kubeconfig`,
`--context`, `--as`, `--as-group` and `--request-timeout`, read as kubectl reads them.

Standard library and the core only: the parser is built before any command runs, and a command
that never reaches the cluster (`render`, a `--help`) must not pay for the Kubernetes client."""

from __future__ import annotations

import argparse
import os
import re
from dataclasses import dataclass
from pathlib import Path

from webhook.core.durations import SECOND, DurationError, parse_duration

IMPERSONATE_USER = "Impersonate-User"
IMPERSONATE_GROUP = "Impersonate-Group"

_TIMEOUT_HELP = (
    "a single integer in seconds, or an integer followed by a corresponding time unit "
    "(e.g. 1s | 2m | 3h)"
)


def parse_request_timeout(text: str) -> float:
    """Seconds of `--request-timeout`, as client-go's `ParseTimeout` reads it: a bare integer is
    seconds, anything else a Go duration (`30s`, `1m`, `1h30m`); 0: no timeout."""
    text = text.strip()
    if re.fullmatch(r"\+?[0-9]+", text):
        return float(int(text))
    try:
        nanoseconds = parse_duration(text)
    except DurationError:
        raise argparse.ArgumentTypeError(
            f"invalid timeout value {text!r}: {_TIMEOUT_HELP}"
        ) from None
    if nanoseconds < 0:
        raise argparse.ArgumentTypeError(f"invalid timeout value {text!r}: 0 or more")
    return nanoseconds / SECOND


def _header_value(text: str) -> str:
    """A user or group name, sent as a header value: one line of latin-1 (what HTTP carries)."""
    if not text or any(c in text for c in "\r\n\0") or not text.isprintable():
        raise argparse.ArgumentTypeError(f"{text!r}: a user or group name on one line")
    try:
        text.encode("latin-1")
    except UnicodeEncodeError:
        raise argparse.ArgumentTypeError(f"{text!r}: not sendable in an HTTP header") from None
    return text


def add_user_arguments(p: argparse.ArgumentParser) -> None:
    """The connection flags, each with kubectl's name and meaning."""
    p.add_argument("--kubeconfig", type=Path, help="kubeconfig file (default: KUBECONFIG)")
    p.add_argument("--context", help="kubeconfig context")
    p.add_argument(
        "--as",
        dest="as_user",
        metavar="USER",
        type=_header_value,
        help="act as this user or service account (system:serviceaccount:NS:NAME), as kubectl "
        "--as: your own rights must allow impersonating it",
    )
    p.add_argument(
        "--as-group",
        dest="as_groups",
        metavar="GROUP",
        action="append",
        default=[],
        type=_header_value,
        help="with --as: act as a member of this group too (repeatable)",
    )
    p.add_argument(
        "--request-timeout",
        metavar="DURATION",
        type=parse_request_timeout,
        default=None,
        help="how long each request to the API server may take before it is given up, as "
        "kubectl's: 30s, 1m, 2h, or whole seconds; 0: no timeout (default: the command's own)",
    )


def kubeconfig_paths(kubeconfig_file: Path | None) -> list[str]:
    """The files kubectl would read, in order: `--kubeconfig`, else each of `KUBECONFIG`'s
    list that holds something, else ~/.kube/config."""
    if kubeconfig_file is not None:
        return [str(kubeconfig_file)]
    listed = os.environ.get("KUBECONFIG", "")
    if listed:
        found = [
            str(Path(p).expanduser())
            for p in listed.split(os.pathsep)
            if p and Path(p).expanduser().is_file() and Path(p).expanduser().stat().st_size
        ]
        if found:
            return found
    return [str(Path.home() / ".kube" / "config")]


@dataclass(frozen=True, slots=True)
class UserFlags:
    """What the flags ask for. `request_timeout`: None when not given (each command's own
    limit), 0 for none, else seconds."""

    kubeconfig: Path | None = None
    context: str | None = None
    as_user: str | None = None
    as_groups: tuple[str, ...] = ()
    request_timeout: float | None = None

    @classmethod
    def of(cls, args: argparse.Namespace) -> UserFlags:
        return cls(
            kubeconfig=getattr(args, "kubeconfig", None),
            context=getattr(args, "context", None),
            as_user=getattr(args, "as_user", None),
            as_groups=tuple(getattr(args, "as_groups", None) or ()),
            request_timeout=getattr(args, "request_timeout", None),
        )

    def problem(self) -> str | None:
        """What kubectl refuses too: groups without a user to impersonate."""
        if self.as_groups and not self.as_user:
            return "--as-group needs --as USER: a group is impersonated with a user"
        return None

    def header_lines(self) -> tuple[tuple[str, str], ...]:
        """The impersonation headers kubectl sends: one Impersonate-Group line per group (the
        API server reads each line as one group, never splitting on commas)."""
        if not self.as_user:
            return ()
        groups = ((IMPERSONATE_GROUP, g) for g in self.as_groups)
        return ((IMPERSONATE_USER, self.as_user), *groups)


__all__ = ["UserFlags", "add_user_arguments", "kubeconfig_paths", "parse_request_timeout"]
