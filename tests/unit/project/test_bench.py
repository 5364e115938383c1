"""bench/ cannot rot silently: every module imports, and every script answers `--help`.

The benchmarks themselves take minutes and most need a control plane; what is checked here is
that each one still imports (its own names, `bench.common`'s, `harness`'s and webhook's as it
uses them) and still parses its command line."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import bench

MODULES = sorted(m.name for m in pkgutil.iter_modules(bench.__path__))
REPO = Path(bench.__file__).resolve().parents[1]


def test_the_package_holds_the_scripts() -> None:
    assert {"common", "admission", "hotpath", "scale", "stale_count"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_each_module_imports_and_answers_help(
    name: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    module = importlib.import_module(f"bench.{name}")
    if name == "common":  # the shared module: no command of its own
        assert not hasattr(module, "main")
        return
    monkeypatch.setattr(sys, "argv", [f"bench.{name}", "--help"])
    with pytest.raises(SystemExit) as exit_:
        module.main()
    assert exit_.value.code == 0
    assert "usage:" in capsys.readouterr().out


def test_a_script_runs_as_a_module_from_the_checkout() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.stale_count", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout
