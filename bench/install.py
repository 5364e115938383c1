"""What `pip install configpin` costs a user: the CLI and the kubectl plugin alone, against the
same wheel with the server's stack (`configpin[server]`) and against a baseline revision's wheel
(`--baseline`, default 0509260: before the split, when every install was the server's).

Each install is a fresh venv, the wheel built from its tree (pure Python, as `pip install .`
builds it) and its dependencies resolved by pip at the lock's versions (requirements.lock of
the tree measured). Printed per install: distributions installed, the size of site-packages,
and the wall time of `kubectl-configpin --help` (the median of --runs, interleaved so that
load drifts alike; the first run of each is dropped: the OS's file cache).

    .venv/bin/python -m bench.install [--runs 15] [--baseline REV]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

from harness.firstrun import REPO, build_wheel, fresh_venv, lock_constraints


def _tree(rev: str, out: Path) -> Path:
    """`rev`'s files (git archive) in `out`: what its wheel builds from."""
    out.mkdir()
    archive = out / "tree.tar"
    subprocess.run(["git", "-C", str(REPO), "archive", "-o", str(archive), rev], check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(out, filter="data")
    return out


def _wheel_of(tree: Path, out: Path) -> Path:
    """The wheel of a tree (build_wheel builds the checkout's: run it there)."""
    out.mkdir()
    subprocess.run(
        [
            "python3", "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(out),
            str(tree),
        ],
        check=True, env={k: v for k, v in os.environ.items() if k != "CONFIGPIN_COMPILE"},
    )  # fmt: skip
    (wheel,) = out.glob("configpin-*.whl")
    return wheel


def _constraints_of(tree: Path, out: Path) -> Path:
    lines = [
        line.split(" \\")[0].strip()
        for line in (tree / "requirements.lock").read_text().splitlines()
        if line[:1].isalnum() and "==" in line
    ]
    path = out / "constraints.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


def _size(bin_: Path) -> tuple[int, float]:
    """(distributions, MB of site-packages) of the venv whose bin folder is `bin_`."""
    (site,) = (bin_.parent / "lib").glob("python3*/site-packages")
    dists = [p for p in site.iterdir() if p.name.endswith(".dist-info")]
    total = sum(f.stat().st_size for f in site.rglob("*") if f.is_file())
    # (pip and setuptools come with every venv: not the user's cost)
    own = [d for d in dists if not d.name.startswith(("pip-", "setuptools-"))]
    return len(own), total / 1e6


def _help_time(bin_: Path, home: Path) -> float:
    start = time.perf_counter()
    subprocess.run(
        [str(bin_ / "kubectl-configpin"), "--help"],
        check=True, capture_output=True, cwd=home, env={"HOME": str(home)},
    )  # fmt: skip
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--baseline", default="0509260")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-install-") as tmp_text:
        tmp = Path(tmp_text)
        here = tmp / "here"
        here.mkdir()
        wheel = build_wheel(here)
        constraints = lock_constraints(here)
        base_tree = _tree(args.baseline, tmp / "base")
        base_wheel = _wheel_of(base_tree, tmp / "base-wheel")
        installs = {
            "configpin (CLI)": fresh_venv(tmp / "cli", str(wheel), constraints=constraints),
            "configpin[server]": fresh_venv(
                tmp / "server", f"{wheel}[server]", constraints=constraints
            ),
            f"{args.baseline} (every install)": fresh_venv(
                tmp / "old", str(base_wheel), constraints=_constraints_of(base_tree, tmp)
            ),
        }
        home = tmp / "home"
        home.mkdir()
        times: dict[str, list[float]] = {name: [] for name in installs}
        for i in range(args.runs + 1):
            for name, bin_ in installs.items():
                took = _help_time(bin_, home)
                if i:
                    times[name].append(took)
        base = f"{args.baseline} (every install)"
        base_n, base_mb = _size(installs[base])
        base_t = statistics.median(times[base])
        runs = f"`kubectl-configpin --help`, median of {args.runs}"
        print(f"| install | distributions | site-packages | {runs} |")
        print("|---|---|---|---|")
        for name, bin_ in installs.items():
            n, mb = _size(bin_)
            t = statistics.median(times[name])
            print(
                f"| {name} | {n} (x {n / base_n:.2f}) | {mb:.1f} MB (x {mb / base_mb:.2f}) "
                f"| {t * 1000:.0f} ms (x {t / base_t:.2f}) |"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
