"""harness/apt.py: every apt-get the project runs waits for apt's locks instead of failing, and
says so (issue 38, item 8: a fresh Debian machine's unattended-upgrades holds them for minutes
after boot).

The waiting is shown with the real apt-get on a private apt state under tmp_path (its own
lists, archives and dpkg status, so its locks are files of the test's), whose locks another
process holds: the system's are left alone."""

from __future__ import annotations

import ast
import contextlib
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from harness import apt

# The checkout harness/ is in: the tests' own tree in a run of the compiled wheel
# (hack/compiled-tree.py) is a copy beside links to it, and no git repository.
REPO = Path(apt.__file__).resolve().parents[1]
APT_SCRIPT = REPO / "harness" / "apt.py"
# Run by docker in a fresh build container, where nothing else runs apt: no lock to wait for.
NOT_WAITING = {"Dockerfile"}
_HOLDER = """
import fcntl, sys
f = open(sys.argv[1], "w")
fcntl.lockf(f, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.read()  # until the test closes it
"""

needs_apt = pytest.mark.skipif(
    shutil.which("apt-get") is None or shutil.which("apt-config") is None,
    reason="not a Debian machine (no apt-get)",
)


# --- every call site ---------------------------------------------------------------------


def _tracked() -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files"], cwd=REPO, check=True, capture_output=True, text=True
    ).stdout
    return [REPO / line for line in out.splitlines() if line]


_SHELL_RUN = re.compile(r"(^|[\s;&|(`])apt-get(\s|$)")
_PY_RUN = re.compile(r"^(sudo\s+)?apt-get(\s|$)|[;&|]\s*(sudo\s+)?apt-get\s")


def _runs_apt_get(path: Path, root: Path = REPO) -> list[str]:
    """The places in `path` that run apt-get themselves: in Python, a string that is the
    program's name or a shell command line starting it; elsewhere (shell, Makefile), a line
    that is not a comment naming it as a command."""
    text = path.read_text(errors="replace")
    if "apt-get" not in text:
        return []
    found: list[tuple[int, str]] = []
    if path.suffix == ".py":
        tree = ast.parse(text)
        # docstrings (an expression that is a string alone) say things; they run nothing
        said = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Constant) or id(node) in said:
                continue
            value = node.value
            if isinstance(value, str) and (value == "apt-get" or _PY_RUN.search(value)):
                found.append((node.lineno, f"{path.relative_to(root)}:{node.lineno}: {value!r}"))
        return [place for _, place in sorted(found)]
    for number, line in enumerate(text.splitlines(), 1):
        code = line.strip()
        if code.startswith("#") or code.startswith("@#"):
            continue
        if _SHELL_RUN.search(code):
            found.append((number, f"{path.relative_to(root)}:{number}: {code}"))
    return [place for _, place in found]


def test_every_apt_get_the_project_runs_goes_through_harness_apt() -> None:
    """A new apt-get written anywhere but harness/apt.py (which adds the lock timeout and
    waits) fails here. Documentation and tests only mention it."""
    skipped = {APT_SCRIPT, *(REPO / name for name in NOT_WAITING)}
    places = [
        place
        for path in _tracked()
        if path not in skipped
        and path.is_file()
        and path.suffix not in (".md", ".txt")
        and not path.is_relative_to(REPO / "tests")
        and not path.is_relative_to(REPO / "docs")
        for place in _runs_apt_get(path)
    ]
    assert places == [], "apt-get run without harness/apt.py:\n" + "\n".join(places)
    # ... and the provisioning script's apt_get is it
    provision = (REPO / "hack" / "provision-control-plane.sh").read_text()
    assert 'apt_get=(python3 "$here/../harness/apt.py")' in provision


def test_the_check_finds_a_bare_apt_get(tmp_path: Path) -> None:
    """The check above can fail: an apt-get line of a script, a Python argv and a shell
    command line in Python are found; comments and messages are not."""
    script = tmp_path / "example.sh"
    script.write_text('# apt-get in a comment\nlog "see apt-get(8)"\nsudo apt-get install -y x\n')
    py = tmp_path / "example.py"
    py.write_text('A = ["apt-get", "update"]\nB = "apt-get install x"\nC = "(apt-get install x)"\n')
    assert _runs_apt_get(script, tmp_path) == ["example.sh:3: sudo apt-get install -y x"]
    assert _runs_apt_get(py, tmp_path) == [
        "example.py:1: 'apt-get'",
        "example.py:2: 'apt-get install x'",
    ]


def test_every_command_carries_the_lock_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(apt.TIMEOUT_ENV, raising=False)
    assert apt.command(["install", "-y", "x"]) == [
        "apt-get", "-o", "DPkg::Lock::Timeout=600", "install", "-y", "x"
    ]  # fmt: skip
    monkeypatch.setenv(apt.TIMEOUT_ENV, "30")
    assert apt.command(["update"])[:3] == ["apt-get", "-o", "DPkg::Lock::Timeout=30"]
    monkeypatch.setenv(apt.TIMEOUT_ENV, "soon")
    with pytest.raises(SystemExit, match="not a number of seconds"):
        apt.command(["update"])


# --- the locks, and the waiting -------------------------------------------------------------


def _private(tmp: Path) -> list[str]:
    """apt options for a state of its own under `tmp`: no sources, empty lists and status."""
    for folder in ("lists/partial", "archives/partial", "dpkg", "cache"):
        (tmp / folder).mkdir(parents=True, exist_ok=True)
    (tmp / "sources.list").write_text("")
    (tmp / "dpkg" / "status").write_text("")
    return [
        "-o", f"Dir::Etc::SourceList={tmp / 'sources.list'}",
        "-o", "Dir::Etc::SourceParts=/dev/null",
        "-o", f"Dir::State::Lists={tmp / 'lists'}",
        "-o", f"Dir::Cache::Archives={tmp / 'archives'}",
        "-o", f"Dir::Cache={tmp / 'cache'}",
        "-o", f"Dir::State::status={tmp / 'dpkg' / 'status'}",
    ]  # fmt: skip


@contextlib.contextmanager
def _held(path: Path) -> Iterator[tuple[int, Callable[[], None]]]:
    """An fcntl lock on `path`, as apt and dpkg take it, held by another process until the
    block ends or it is let go of: its pid, and how to let go."""
    with subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as holder:
        assert holder.stdin is not None and holder.stdout is not None
        stdin = holder.stdin

        def let_go() -> None:
            if not stdin.closed:
                stdin.close()
                holder.wait(timeout=30)

        try:
            assert holder.stdout.readline() == "held\n"
            yield holder.pid, let_go
        finally:
            let_go()


@needs_apt
def test_the_locks_are_where_apts_options_put_them(tmp_path: Path) -> None:
    options = _private(tmp_path)
    assert apt.lock_files([*options, "update", "-qq"]) == [tmp_path / "lists" / "lock"]
    assert apt.lock_files([*options, "install", "-y", "x"]) == [
        tmp_path / "dpkg" / "lock-frontend",
        tmp_path / "dpkg" / "lock",
        tmp_path / "archives" / "lock",
    ]
    assert apt.lock_files([*options, "download", "x"]) == []  # into the current folder
    assert apt.lock_files([*options, "-o", "Debug::NoLocking=1", "update"]) == []
    # the machine's own, with no option
    assert apt.lock_files(["install", "x"])[0] == Path("/var/lib/dpkg/lock-frontend")


def test_a_lock_holder_is_found_in_proc_locks(tmp_path: Path) -> None:
    lock = tmp_path / "lock-frontend"
    lock.touch()
    assert apt.holder(lock) is None
    with _held(lock) as (pid, _):
        assert (
            apt.holder(lock) == f"process {pid} ({Path(f'/proc/{pid}/comm').read_text().strip()})"
        )
    assert apt.holder(lock) is None
    assert apt.holder(tmp_path / "missing") is None


def _wait_line(proc: subprocess.Popen[str]) -> str:
    """The first line the wrapper says (stderr)."""
    assert proc.stderr is not None
    return proc.stderr.readline()


@needs_apt
@pytest.mark.parametrize(
    ("command", "lock"),
    [(["update", "-qq"], "lists/lock"), (["install", "-y", "-qq"], "dpkg/lock-frontend")],
    ids=["update-lists-lock", "install-dpkg-frontend-lock"],
)
def test_apt_get_waits_while_a_lock_is_held_says_so_and_then_runs(
    tmp_path: Path, command: list[str], lock: str
) -> None:
    """As hack/provision-control-plane.sh runs it (`python3 harness/apt.py ARGS`): while
    another process holds the lock, it says so and waits; once the lock is free, apt-get runs
    and succeeds."""
    options = _private(tmp_path)
    path = tmp_path / lock
    path.touch()
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", apt.TIMEOUT_ENV: "120", "LANG": "C"}
    with (
        _held(path) as (pid, let_go),
        subprocess.Popen(
            [sys.executable, str(APT_SCRIPT), *options, *command],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        ) as proc,
    ):
        said = _wait_line(proc)
        assert said.startswith(f"apt-get: {path} is held by process {pid} ("), said
        assert said.rstrip().endswith("waiting up to 120 s for it"), said
        assert proc.poll() is None  # still waiting: the lock is held until it is let go of
        let_go()
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, (out, err)
    assert re.match(rf"apt-get: {re.escape(str(path))} free after \d+ s\n", err), err


@needs_apt
def test_apt_get_alone_fails_at_once_on_a_held_lists_lock(tmp_path: Path) -> None:
    """Why `update` needs the wrapper's own wait: apt-get waits for dpkg's frontend lock
    (DPkg::Lock::Timeout) but not for its lists lock, which unattended-upgrades' update holds."""
    options = _private(tmp_path)
    lock = tmp_path / "lists" / "lock"
    lock.touch()
    with _held(lock):
        done = subprocess.run(
            apt.command([*options, "update", "-qq"], timeout=120), capture_output=True, text=True
        )
    assert done.returncode != 0
    assert f"Could not get lock {lock}" in done.stderr


@needs_apt
def test_run_gives_up_waiting_after_the_timeout_and_apt_get_says_why(tmp_path: Path) -> None:
    options = _private(tmp_path)
    lock = tmp_path / "lists" / "lock"
    lock.touch()
    said: list[str] = []
    with _held(lock), pytest.raises(subprocess.CalledProcessError):
        apt.run([*options, "update", "-qq"], timeout=1, say=said.append, capture_output=True)
    assert said[0].endswith("waiting up to 1 s for it")
    assert "still held by process" in said[1]
