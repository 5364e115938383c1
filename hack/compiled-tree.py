#!/usr/bin/env python3
"""Lay out the checkout with its decision core compiled, as the wheel installs it, to test or
measure that build beside the editable (pure-Python) one.

    .venv/bin/python hack/compiled-tree.py DEST

Builds configpin's wheel with `CONFIGPIN_COMPILE=1` (setup.py: mypyc; from a copy of the
checkout, so that no build output lands in it), unpacks it into DEST, and puts beside it what
the tests read from the checkout: a copy of tests/ and links to the rest. Then (the first
command in DEST, with the checkout's venv):

    CONFIGPIN_EXPECT_COMPILED=1 .venv/bin/python -m pytest tests/unit   # as `make test` does
    PYTHONPATH=DEST .venv/bin/python -m bench.admission                # the compiled server

pytest puts DEST (the folder above its tests/ package) first on sys.path, so `webhook` is
the unpacked wheel there, not the editable install; tests/unit/project/test_compiled.py checks it.
The build runs without isolation, with the venv's setuptools and mypy (the dev extras).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# What the build reads: pyproject.toml names README.md as the long description.
BUILD_INPUTS = ("pyproject.toml", "setup.py", "README.md", "webhook")
# Read by tests, never imported as a package: linked.
LINKED = (
    "pyproject.toml",
    "README.md",
    "docs",
    "Dockerfile",
    "requirements.lock",
    "requirements-build.lock",
    ".dockerignore",
    "setup.py",
    "charts",
    "examples",
    "bench",
    "harness",
    "hack",
    "certs",
)


def build(dest: Path) -> Path:
    with tempfile.TemporaryDirectory(prefix="configpin-build-") as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        for name in BUILD_INPUTS:
            path = REPO / name
            if path.is_dir():
                shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy2(path, src / name)
        wheels = Path(tmp) / "wheels"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--quiet",
                "--no-deps",
                "--no-build-isolation",
                "--wheel-dir",
                str(wheels),
                str(src),
            ],
            env={**os.environ, "CONFIGPIN_COMPILE": "1"},
            check=True,
        )
        (wheel,) = wheels.glob("configpin-*.whl")
        if dest.exists():
            shutil.rmtree(dest)
        dest.mkdir(parents=True)
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(dest)
        return dest / wheel.name


def lay_out(dest: Path) -> None:
    shutil.copytree(
        REPO / "tests", dest / "tests", ignore=shutil.ignore_patterns("__pycache__", ".hypothesis")
    )
    for name in LINKED:
        if (REPO / name).exists() and not (dest / name).exists():
            (dest / name).symlink_to(REPO / name)


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    dest = Path(sys.argv[1]).resolve()
    if dest == REPO or (REPO / "webhook") in (dest, *dest.parents):
        raise SystemExit(f"{dest}: never the checkout or its package (it is replaced whole)")
    wheel = build(dest)
    lay_out(dest)
    compiled = sorted(p.name for p in (dest / "webhook" / "core").glob("*.so"))
    print(f"{wheel.name}: {len(compiled)} compiled modules of webhook/core in {dest}")
    return 0 if compiled else 1


if __name__ == "__main__":
    sys.exit(main())
