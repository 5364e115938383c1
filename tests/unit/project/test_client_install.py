"""`pip install configpin` is the CLI and the kubectl plugin alone; the server's stack comes with
`configpin[server]` (pyproject.toml).

The wheel, built from the checkout, is installed into a fresh venv without extras (pip resolves
its dependencies at the lock's versions): none of the server's packages is there, and every
command a user runs from a laptop works; `configpin serve` says what to install. (The wheel with
the whole lock, the server's stack included, serves: test_first_command.py.)

These run from the checkout (the pure-Python run of the unit suite): the compiled run's tree
builds nothing of its own.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from harness.firstrun import REPO, build_wheel, fresh_venv, lock_constraints

# The server's own packages (and what only they bring): none of them in a client's install.
SERVER_ONLY = (
    "fastapi",
    "starlette",
    "uvicorn",
    "httptools",
    "uvloop",
    "pybase64",
    "prometheus_client",
    "pydantic_settings",
)

pytestmark = pytest.mark.skipif(
    not (REPO / "Makefile").is_file(), reason="builds the wheel from the checkout"
)


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={"HOME": str(cwd)},
    )


def test_the_wheel_without_extras_is_the_cli_and_the_plugin_alone(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path)
    bin_ = fresh_venv(tmp_path / "venv", str(wheel), constraints=lock_constraints(tmp_path))
    where = tmp_path / "elsewhere"
    where.mkdir()
    python = str(bin_ / "python")
    found = _run(
        [
            python,
            "-c",
            f"import importlib.util as u; print([m for m in {SERVER_ONLY!r} if u.find_spec(m)])",
        ],
        where,
    )
    assert found.returncode == 0 and found.stdout.strip() == "[]", found

    for argv in (
        ["kubectl-configpin", "--help"],
        ["configpin", "status", "--help"],
        ["configpin", "plan", "--help"],
        ["configpin", "approve", "--help"],
        ["configpin", "wait", "--help"],
        ["configpin", "dashboard", "--help"],
        ["configpin", "version"],
    ):
        done = _run([str(bin_ / argv[0]), *argv[1:]], where)
        assert done.returncode == 0, (argv, done.stderr)
    # every command's code imports (the dashboard's page and feeds, wait, status, plan)
    modules = "webhook.commands.dashboard.app webhook.commands.wait webhook.commands.status"
    imported = _run(
        [
            python,
            "-c",
            f"import importlib; [importlib.import_module(m) for m in {modules.split()!r}]",
        ],
        where,
    )
    assert imported.returncode == 0, imported.stderr
    rendered = _run(
        [str(bin_ / "configpin"), "render", "-f", str(REPO / "examples" / "app.yaml")], where
    )
    assert rendered.returncode == 0 and "configpin.io/checksum" in rendered.stdout, rendered.stderr

    served = _run([str(bin_ / "configpin"), "serve"], where)
    assert served.returncode == 2
    assert "pip install 'configpin[server]'" in served.stderr, served.stderr
