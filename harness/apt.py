"""apt-get as the project runs it: waiting for the package manager's locks instead of failing,
and saying so.

    python3 harness/apt.py APT-GET-ARGUMENTS...     # what hack/provision-control-plane.sh runs

On a fresh Debian machine unattended-upgrades holds dpkg's locks for minutes after boot, and an
apt-get that finds one held fails at once ("Could not get lock /var/lib/dpkg/lock-frontend").
Every apt-get the project runs comes through here (hack/provision-control-plane.sh and
harness/images.py; tests/unit/project/test_apt.py fails on one that does not):

- It gets ``-o DPkg::Lock::Timeout=SECONDS``: apt-get itself waits that long for dpkg's
  frontend lock (apt 1.9.11 and later), the one unattended-upgrades holds longest.
- Before it starts, the locks its command takes are looked at (in /proc/locks, which needs no
  permission on the files): while one is held, a line on stderr says which, by whom and for how
  long at most this waits, and it waits, looking again every second. ``apt-get update`` needs
  this: apt waits for dpkg's lock only, and fails at once on its lists lock, which
  unattended-upgrades' own update holds.

The locks are where apt's configuration puts them, with the options given (``apt-config``), so
a private apt state (``-o Dir::State::Lists=...``) is waited for where it is, and
``-o Debug::NoLocking=1`` waits for nothing.

SECONDS: ``$CONFIGPIN_APT_LOCK_TIMEOUT``, default 600. Standard library only: the provisioning
script runs it with the machine's python3, before the project's virtualenv exists.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

TIMEOUT_ENV = "CONFIGPIN_APT_LOCK_TIMEOUT"
DEFAULT_TIMEOUT = 600
LOCK_TIMEOUT_OPTION = "DPkg::Lock::Timeout"
# apt-get's commands that take no lock (they write into the current folder)
_UNLOCKED = frozenset({"download", "source", "changelog", "check", "indextargets"})
_OPTIONS_WITH_VALUE = frozenset({"-o", "--option", "-c", "--config-file"})


def lock_timeout() -> int:
    """Seconds to wait for a lock: ``$CONFIGPIN_APT_LOCK_TIMEOUT``, default 600."""
    value = os.environ.get(TIMEOUT_ENV, "")
    try:
        seconds = int(value) if value else DEFAULT_TIMEOUT
    except ValueError:
        raise SystemExit(f"{TIMEOUT_ENV}={value!r}: not a number of seconds") from None
    return max(0, seconds)


def command(args: Sequence[str], timeout: int | None = None) -> list[str]:
    """The apt-get command line for `args`, with its lock timeout."""
    seconds = lock_timeout() if timeout is None else timeout
    return ["apt-get", "-o", f"{LOCK_TIMEOUT_OPTION}={seconds}", *args]


def _split(args: Sequence[str]) -> tuple[list[str], str | None]:
    """apt's configuration options among `args` (-o, -c, as apt-config takes them) and the
    apt-get command (the first word that is not an option)."""
    options: list[str] = []
    verb = None
    items = iter(args)
    for arg in items:
        if arg in _OPTIONS_WITH_VALUE:
            options += [arg, next(items, "")]
        elif arg.startswith(("-o", "-c", "--option=", "--config-file=")) and len(arg) > 2:
            options.append(arg)
        elif not arg.startswith("-") and verb is None:
            verb = arg
    return options, verb


def _config(options: Sequence[str]) -> dict[str, str]:
    """Where apt keeps its state with `options`: {status, lists, archives, nolocking}."""
    query = ["status", "Dir::State::status/f", "lists", "Dir::State::Lists/d"]
    query += ["archives", "Dir::Cache::Archives/d", "nolocking", "Debug::NoLocking/b"]
    out = subprocess.run(
        ["apt-config", *options, "shell", *query], check=True, capture_output=True, text=True
    ).stdout
    found = {}
    for line in out.splitlines():
        name, _, value = line.partition("=")
        found[name] = value.strip("'")
    return found


def lock_files(args: Sequence[str]) -> list[Path]:
    """The lock files apt-get takes for `args` (none with ``Debug::NoLocking``)."""
    options, verb = _split(args)
    if verb is None or verb in _UNLOCKED:
        return []
    where = _config(options)
    if where.get("nolocking") == "true":
        return []
    if verb == "update":
        return [Path(where["lists"]) / "lock"]
    admin = Path(where["status"]).parent
    return [admin / "lock-frontend", admin / "lock", Path(where["archives"]) / "lock"]


def holder(path: Path, locks: str | None = None) -> str | None:
    """Who holds a lock on `path` ("process 1234 (unattended-upgr)"), from /proc/locks (or
    `locks`, its text); None while no one does. apt and dpkg lock with fcntl: POSIX locks, and
    open file description locks, which conflict with them."""
    try:
        st = path.stat()
    except OSError:
        return None  # no lock file: nobody has locked it yet
    if locks is None:
        locks = Path("/proc/locks").read_text()
    inode = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in locks.splitlines():
        fields = line.split()
        if len(fields) < 6 or fields[1] == "->" or fields[1] not in ("POSIX", "OFDLCK"):
            continue  # a waiter, or a flock(2) lock, which apt's fcntl locks do not see
        if fields[5] != inode:
            continue
        pid = fields[4]
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            name = ""
        return f"process {pid} ({name})" if name else f"process {pid}"
    return None


def wait_for_locks(
    args: Sequence[str],
    timeout: int | None = None,
    *,
    say: Callable[[str], None] | None = None,
    interval: float = 1.0,
) -> None:
    """Wait until no other process holds a lock apt-get takes for `args`, `timeout` seconds at
    most (then apt-get runs and says what it found), saying so when it waits."""
    seconds = lock_timeout() if timeout is None else timeout
    say = say or _stderr
    deadline = time.monotonic() + seconds
    for path in lock_files(args):
        who = holder(path)
        if who is None:
            continue
        started = time.monotonic()
        say(f"apt-get: {path} is held by {who}: waiting up to {seconds} s for it")
        while who is not None and time.monotonic() < deadline:
            time.sleep(interval)
            who = holder(path)
        waited = time.monotonic() - started
        if who is None:
            say(f"apt-get: {path} free after {waited:.0f} s")
        else:
            say(f"apt-get: {path} still held by {who} after {waited:.0f} s")
            return


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def run(
    args: Sequence[str],
    *,
    sudo: bool = False,
    env: Mapping[str, str] | None = None,
    timeout: int | None = None,
    say: Callable[[str], None] | None = None,
    **kwargs: Any,
) -> subprocess.CompletedProcess[str]:
    """apt-get `args` once its locks are free (`wait_for_locks`), with its lock timeout;
    through sudo when `sudo` and not root already; `env`: variables set for apt-get alone."""
    seconds = lock_timeout() if timeout is None else timeout
    wait_for_locks(args, seconds, say=say)
    argv = command(args, seconds)
    if env:
        argv = ["env", *(f"{k}={v}" for k, v in env.items()), *argv]
    if sudo and os.geteuid() != 0:
        argv = ["sudo", *argv]
    return subprocess.run(argv, check=True, text=True, **kwargs)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    seconds = lock_timeout()
    wait_for_locks(args, seconds)
    cmd = command(args, seconds)
    os.execvp(cmd[0], cmd)
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())
