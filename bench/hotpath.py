"""Admission work in process, without HTTP: parse + plan + respond, per review.

What `/mutate` does between the body and the bytes it answers (`parse_review`,
`Admitter.review` over `FileSources` with the sources of `admission.py`, `orjson.dumps` of
the answer), in a hot loop inside one event loop, for the same two payloads as
`admission.py` (a 10-reference Deployment, a 20 KiB Pod with 4 references).

    .venv/bin/python -m bench.hotpath [--iterations 10000] [--repeats 7]
    .venv/bin/python -m bench.hotpath --instructions [--iterations 1000] [--only deployment]
        [--baseline REV] [--compiled]

Wall time on a shared machine moves with its load; `--instructions` runs the loop under
`valgrind --tool=callgrind`, counting only inside the measured loop, and prints instructions
per admission: a count that repeats to within a fraction of a percent whatever
else runs, which is what to compare before and after a change (`--baseline REV` measures
another revision's tree the same way, extracted with `git archive`, and prints the ratio;
`--compiled` also measures this tree as its wheel installs it, with `webhook/core` compiled by
mypyc: hack/compiled-tree.py). Without `--instructions`, `PYTHONPATH=<compiled tree>` times
the compiled build. The measured loop runs in a child process either way, which imports
`webhook` from the tree measured."""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import (
    DIGEST_KEY,
    REPO,
    admission_review,
    baseline_tree,
    big_pod,
    child_env,
    deployment,
    source_manifests,
)


def setup(tmp: Path) -> tuple[Any, dict[str, bytes]]:
    """An Admitter as `admission.py` serves it, and the two reviews."""
    import yaml

    from webhook.inputs.sources import FileSources
    from webhook.process.digestkey import load_key_file
    from webhook.process.metrics import Metrics
    from webhook.server.handler import Admitter

    (tmp / "sources.yaml").write_text(yaml.safe_dump_all(source_manifests()))
    (tmp / "digest.key").write_text(DIGEST_KEY)
    hkey = load_key_file(tmp / "digest.key")
    sources = FileSources.from_paths(hkey, [tmp / "sources.yaml"])
    admitter = Admitter(hkey=hkey, sources=sources, metrics=Metrics())
    reviews = {
        "deployment": admission_review(deployment(), "d-1"),
        "pod20k": admission_review(big_pod(), "p-1"),
    }
    return admitter, reviews


async def _loop(admitter: Any, body: bytes, n: int) -> None:
    import orjson

    from webhook.server.admission import parse_review

    review = admitter.review
    for _ in range(n):
        out = await review(parse_review(body))
        orjson.dumps(out)


def run_loop(admitter: Any, body: bytes, n: int) -> float:
    """Seconds for `n` admissions of `body`."""
    start = time.perf_counter()
    asyncio.run(_loop(admitter, body, n))
    return time.perf_counter() - start


def _child(args: argparse.Namespace) -> None:
    """The measured process (under callgrind): warm up, then `--iterations` of one payload.
    It runs in the tree measured, with that tree first on PYTHONPATH."""
    import webhook.server.handler

    if not Path(webhook.server.handler.__file__).is_relative_to(args.tree):
        raise SystemExit(f"measuring {webhook.server.handler.__file__}, not {args.tree}")
    with tempfile.TemporaryDirectory() as tmp:
        admitter, reviews = setup(Path(tmp))
        body = reviews[args.payload]
        run_loop(admitter, body, 200)  # memo and caches filled, as in a running server
        # Counted: only what runs inside this eval (callgrind --toggle-collect=builtin_eval)
        eval("measured()", {"measured": lambda: run_loop(admitter, body, args.iterations)})
        admitter.close()


def instructions(tree: Path, payload: str, n: int) -> int:
    """Instructions callgrind counts per admission over `n` admissions: only inside the
    measured loop (collection is on within the `eval` that runs it), so start-up, imports
    and warm-up are left out."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        cmd = [
            "valgrind",
            "--tool=callgrind",
            "--collect-atstart=no",
            "--toggle-collect=builtin_eval",
            f"--callgrind-out-file={out}",
            sys.executable,
            "-m",
            "bench.hotpath",
            "--child",
            "--tree",
            str(tree),
            "--payload",
            payload,
            "--iterations",
            str(n),
        ]
        env = child_env(tree, PYTHONHASHSEED="0")
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tree, check=False)
        if done.returncode != 0:
            raise SystemExit(done.stderr[-2000:])
        m = re.search(r"Collected : (\d+)", done.stderr)
        if m is None:
            raise SystemExit(f"no instruction count in callgrind's output:\n{done.stderr}")
        return int(m.group(1)) // n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=7, help="timed repeats (median)")
    parser.add_argument("--instructions", action="store_true", help="count with callgrind")
    parser.add_argument("--baseline", help="also count this revision (with --instructions)")
    parser.add_argument(
        "--compiled",
        action="store_true",
        help="also count this tree's wheel with its core compiled (with --instructions)",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--timed", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tree", type=Path, default=REPO, help=argparse.SUPPRESS)
    parser.add_argument("--payload", default="deployment", help=argparse.SUPPRESS)
    parser.add_argument(
        "--only", choices=("deployment", "pod20k"), help="one payload (default: both)"
    )
    args = parser.parse_args()
    if args.child:
        _child(args)
        return
    if args.timed:
        timed(args)
        return
    payloads = (args.only,) if args.only else ("deployment", "pod20k")
    if args.instructions:
        if shutil.which("valgrind") is None:
            raise SystemExit("valgrind is not installed (apt-get install valgrind)")
        n = args.iterations or 1000
        trees = {"this tree": REPO}
        with tempfile.TemporaryDirectory(prefix="configpin-hotpath-") as tmp:
            if args.baseline:
                base = baseline_tree(args.baseline, Path(tmp) / "baseline")
                trees[f"baseline {args.baseline}"] = base
            if args.compiled:
                compiled = Path(tmp) / "compiled"
                built = subprocess.run(
                    [sys.executable, str(REPO / "hack" / "compiled-tree.py"), str(compiled)],
                    capture_output=True,
                    text=True,
                    check=False,
                )
                if built.returncode != 0:
                    raise SystemExit(f"the compiled build failed:\n{built.stderr[-3000:]}")
                trees["compiled"] = compiled
            counts = {
                (name, p): instructions(tree, p, n)
                for name, tree in trees.items()
                for p in payloads
            }
        for p in payloads:
            line = ", ".join(f"{name} {counts[name, p]:,}" for name in trees)
            if args.baseline:
                ratio = counts["this tree", p] / counts[f"baseline {args.baseline}", p]
                line += f" (ratio {ratio:.3f})"
            if args.compiled:
                ratio = counts["compiled", p] / counts["this tree", p]
                line += f" (compiled/this tree {ratio:.3f})"
            print(f"{p}: instructions per admission: {line}")
        return
    # Timed in a child in a folder of its own, so that `webhook` comes from PYTHONPATH
    # where it is set (the compiled tree), else from this checkout.
    cmd = [sys.executable, "-m", "bench.hotpath", "--timed", "--repeats", str(args.repeats)]
    if args.iterations:
        cmd += ["--iterations", str(args.iterations)]
    if args.only:
        cmd += ["--only", args.only]
    with tempfile.TemporaryDirectory(prefix="configpin-hotpath-") as tmp:
        done = subprocess.run(cmd, env=child_env(), cwd=tmp, check=False)
    if done.returncode:
        raise SystemExit(done.returncode)


def timed(args: argparse.Namespace) -> None:
    """The timed loops, in this process: `--repeats` times `--iterations` of each payload."""
    payloads = (args.only,) if args.only else ("deployment", "pod20k")
    n = args.iterations or 10000
    with tempfile.TemporaryDirectory() as tmp:
        admitter, reviews = setup(Path(tmp))
        import webhook.core.plan

        build = "pure Python" if webhook.core.plan.__file__.endswith(".py") else "compiled"
        print(
            f"python {sys.version.split()[0]}; core: {build}; load average {os.getloadavg()[0]:.2f}"
        )
        for p in payloads:
            run_loop(admitter, reviews[p], 500)
            times = [run_loop(admitter, reviews[p], n) / n * 1e6 for _ in range(args.repeats)]
            print(
                f"{p}: {statistics.median(times):.1f} us per admission (median of "
                f"{args.repeats} x {n}; min {min(times):.1f}, max {max(times):.1f})",
                flush=True,
            )
        admitter.close()


if __name__ == "__main__":
    main()
