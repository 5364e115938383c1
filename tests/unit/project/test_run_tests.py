"""hack/run-tests.py, the runner `make test` is: every run keeps files of its own.

Two runs of one control plane ("integration 1.36.2" and "integration 1.36.2, compiled") once
shared one junit file and one log (Path.with_suffix took ".2" and ".2-compiled" for suffixes):
the summary counted the compiled run twice and the pure run's output was never printed."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[3]


def _runner() -> ModuleType:
    spec = importlib.util.spec_from_file_location("run_tests", REPO / "hack" / "run-tests.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (its dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


def test_every_run_has_files_of_its_own(tmp_path: Path) -> None:
    runner = _runner()
    names = [
        f"{suite} {version}{extra}"
        for suite in ("integration", "browser", "node")
        for version in runner.VERSIONS
        for extra in ("", ", compiled")
    ] + ["unit", "unit, compiled core"]
    files = [runner._files(runner.Run(name), tmp_path) for name in names]
    junits = [junit for junit, _ in files]
    logs = [log for _, log in files]
    assert len(set(junits)) == len(names) and len(set(logs)) == len(names), files
    assert all(j.suffix == ".xml" and log.suffix == ".log" for j, log in files)
