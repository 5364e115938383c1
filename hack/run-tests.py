#!/usr/bin/env python3
"""Run the whole test suite: the images of the node suite first (configpin's among them, whose
archive the unit suite then checks), the unit tests twice (the pure-Python package as installed for
development, then the wheel with its core compiled by mypyc), the integration suite on every
control plane, and once more on the newest one from the compiled wheel (what the image runs),
and the dashboard's browser suite (tests/browser: Debian's chromium driven by Playwright) on
every control plane, these five side by side, then the node suite (tests/node: a real node runs
pods, docs/real-nodes.md) on every control plane, side by side too.

    make test                                  # what CI runs
    .venv/bin/python hack/run-tests.py [PYTEST_ARGS...]

Control planes: 1.20.2 (built from Debian's packages by hack/provision-control-plane.sh) and
1.36.2 (unpacked from shared/k8s beside the checkout, or from $CONFIGPIN_SHARED_K8S). With
``KUBEBUILDER_ASSETS`` set, the integration suite runs on that folder's binaries only.
``CONFIGPIN_K8S_VERSIONS=1.36.2`` picks versions. The integration suites run side by side
(each mostly waits on its control plane); ``CONFIGPIN_SERIAL_INTEGRATION=1`` runs them one
after another.

The browser suites need Debian's chromium: ``python -m harness.browser`` installs it with
apt-get (harness/apt.py) when it is missing, before they start. ``CONFIGPIN_BROWSER_TESTS=0``
leaves them out, and the summary says so.

A version that cannot be provided is named in the closing summary and fails the run, unless
``CONFIGPIN_ALLOW_MISSING_VERSIONS=1`` (a laptop without shared/); a pytest run that collects
no test (exit 5) fails it too. The last line counts every run: ``total: N passed, N failed``.

The node suite needs root (namespaces, cgroups, mounts): ``hack/provision-control-plane.sh
--node`` adds kubelet, kube-scheduler and kube-proxy to each version's folder and installs
containerd, runc and the CNI plugins. ``CONFIGPIN_NODE_TESTS=0`` leaves it out, and the summary
says so; ``CONFIGPIN_SERIAL_NODES=1`` runs the versions' node suites one after another.

The compiled run builds the wheel with ``CONFIGPIN_COMPILE=1`` (hack/compiled-tree.py: a C
compiler and Python's headers are needed); ``CONFIGPIN_TEST_COMPILED=0`` leaves it out, and the
summary says so.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROVISION = REPO / "hack" / "provision-control-plane.sh"
VERSIONS = ("1.20.2", "1.36.2")


@dataclass
class Run:
    name: str
    exit_code: int | None = None  # None: never started
    why: str = ""
    seconds: float = 0.0
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.counts.get("passed", 0) > 0


def _counts(junit: Path) -> dict[str, int]:
    """passed / failed / errors / skipped from pytest's junit XML."""
    if not junit.exists():
        return {}
    root = ET.parse(junit).getroot()  # noqa: S314 - our own pytest's file
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    total = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for suite in suites:
        for k in total:
            total[k] += int(suite.get(k, "0"))
    return {
        "passed": total["tests"] - total["failures"] - total["errors"] - total["skipped"],
        "failed": total["failures"],
        "errors": total["errors"],
        "skipped": total["skipped"],
    }


def _files(run: Run, out: Path) -> tuple[Path, Path]:
    """Where a run's junit XML and (side by side) its output go."""
    # (not with_suffix: "integration-1.36.2" and "integration-1.36.2-compiled" would both
    # lose their last dot's part and share one file, the second run's counts and output
    # replacing the first's)
    stem = run.name.replace(",", "").replace(" ", "-")
    return out / f"{stem}.xml", out / f"{stem}.log"


def _argv(junit: Path, paths: list[str], extra: list[str]) -> list[str]:
    return [
        sys.executable, "-m", "pytest", "-p", "no:cacheprovider", f"--junitxml={junit}",
        *paths, *extra,
    ]  # fmt: skip


def _ended(run: Run, exit_code: int, seconds: float, junit: Path) -> None:
    run.exit_code = exit_code
    run.seconds = seconds
    run.counts = _counts(junit)
    if run.exit_code == 5:
        run.why = "pytest collected no test"
    elif run.exit_code != 0:
        run.why = f"pytest exit code {run.exit_code}"


def _pytest(
    run: Run,
    paths: list[str],
    extra: list[str],
    env: dict[str, str],
    out: Path,
    cwd: Path = REPO,
) -> None:
    junit, _ = _files(run, out)
    print(f"\n==== {run.name} ====", flush=True)
    started = time.monotonic()
    exit_code = subprocess.call(_argv(junit, paths, extra), cwd=cwd, env=env)
    _ended(run, exit_code, time.monotonic() - started, junit)


Suite = tuple[Run, dict[str, str], Path, list[str]]  # a run, its environment, folder and paths


def _side_by_side(suites: list[Suite], extra: list[str], out: Path) -> None:
    """`_pytest` of every suite at once, each one's output to a file of its own, printed
    whole as each ends."""
    started = time.monotonic()
    pending = []
    for run, env, cwd, paths in suites:
        junit, log_path = _files(run, out)
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                _argv(junit, paths, extra), cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT
            )
        pending.append((run, proc, junit, log_path))
    names = ", ".join(run.name for run, *_ in pending)
    print(f"\n==== side by side: {names} ====", flush=True)
    while pending:
        for item in list(pending):
            run, proc, junit, log_path = item
            exit_code = proc.poll()
            if exit_code is None:
                continue
            pending.remove(item)
            _ended(run, exit_code, time.monotonic() - started, junit)
            print(f"\n==== {run.name} (ended after {run.seconds:.0f}s) ====", flush=True)
            sys.stdout.write(log_path.read_text(errors="replace"))
            sys.stdout.flush()
        if pending:
            time.sleep(1)


def _provision(version: str, *, node: bool = False) -> tuple[Path | None, str]:
    argv = ["bash", str(PROVISION), *(["--node"] if node else []), version]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        last = [line for line in proc.stderr.splitlines() if line.strip()][-3:]
        return None, "; ".join(last) or f"exit code {proc.returncode}"
    return Path(proc.stdout.strip().splitlines()[-1]), ""


def main(extra: list[str]) -> int:
    env = dict(os.environ)
    out = Path(tempfile.mkdtemp(prefix="configpin-test-"))
    runs: list[Run] = []

    # The node's images (configpin's, the pause and shell images) are built first, once: the
    # unit suite checks configpin's archive (its user, layers, what it leaves out), and each
    # node version's time is its own.
    left_out = env.get("CONFIGPIN_NODE_TESTS") == "0"
    images_built = False
    if not left_out:
        print("\n==== building the node's images (harness/images.py) ====", flush=True)
        argv = [sys.executable, "-m", "harness.images", "all"]
        images_built = subprocess.call(argv, cwd=REPO) == 0

    unit = Run("unit")
    runs.append(unit)
    # With the images built, the archive's tests must run, not skip.
    _pytest(
        unit,
        ["tests/unit"],
        extra,
        {**env, "CONFIGPIN_TEST_IMAGE": "1"} if images_built else env,
        out,
    )

    compiled = Run("unit, compiled core")
    runs.append(compiled)
    if env.get("CONFIGPIN_TEST_COMPILED") == "0":
        compiled.why = "left out: CONFIGPIN_TEST_COMPILED=0"
    else:
        print("\n==== building the wheel with the compiled core ====", flush=True)
        tree = out / "compiled"
        built = subprocess.call(
            [sys.executable, str(REPO / "hack" / "compiled-tree.py"), str(tree)]
        )
        if built != 0:
            compiled.exit_code = built
            compiled.why = "the compiled wheel could not be built"
        else:
            compiled_env = {**env, "CONFIGPIN_EXPECT_COMPILED": "1"}
            _pytest(compiled, ["tests/unit"], extra, compiled_env, out, cwd=tree)

    planes: list[tuple[str, Path | None, str]] = []
    if env.get("KUBEBUILDER_ASSETS"):
        planes.append(("KUBEBUILDER_ASSETS", Path(env["KUBEBUILDER_ASSETS"]), ""))
    else:
        wanted = env.get("CONFIGPIN_K8S_VERSIONS", " ".join(VERSIONS)).replace(",", " ").split()
        for version in wanted:
            print(f"\n==== provisioning control plane {version} ====", flush=True)
            assets, why = _provision(version)
            planes.append((version, assets, why))

    # The integration suites side by side: each has its own control plane on 127.0.0.1 and
    # spends most of its time waiting on it (one suite keeps about a fifth of a core busy), so
    # together they take little more than the slowest alone. Their output is printed whole as
    # each ends. CONFIGPIN_SERIAL_INTEGRATION=1 runs them one after another instead.
    integration = ["tests/integration"]
    suites: list[Suite] = []
    for label, assets, why in planes:
        run = Run(f"integration {label}")
        runs.append(run)
        if assets is None:
            run.why = f"control plane not provided: {why}"
            continue
        suites.append((run, {**env, "KUBEBUILDER_ASSETS": str(assets)}, REPO, integration))

    # The build the image ships, through the whole production path once: the integration
    # suite from the compiled tree (its configpin processes run `python -m webhook` there) on
    # the newest control plane.
    if compiled.exit_code == 0 and planes:
        label, assets, _ = planes[-1]
        if assets is not None:
            run = Run(f"integration {label}, compiled")
            runs.append(run)
            compiled_env = {
                **env,
                "KUBEBUILDER_ASSETS": str(assets),
                "CONFIGPIN_EXPECT_COMPILED": "1",
            }
            suites.append((run, compiled_env, out / "compiled", integration))

    # The dashboard in a real browser, beside them: each suite has a control plane of its own
    # and mostly waits on it and on the browser.
    browsers_left_out = env.get("CONFIGPIN_BROWSER_TESTS") == "0"
    chromium = ""
    if not browsers_left_out and any(assets is not None for _, assets, _ in planes):
        print("\n==== chromium for the browser suites (harness/browser.py) ====", flush=True)
        if subprocess.call([sys.executable, "-m", "harness.browser"], cwd=REPO) != 0:
            chromium = "chromium could not be installed (python -m harness.browser)"
    for label, assets, why in planes:
        run = Run(f"browser {label}")
        runs.append(run)
        if browsers_left_out:
            run.why = "left out: CONFIGPIN_BROWSER_TESTS=0"
        elif assets is None:
            run.why = f"control plane not provided: {why}"
        elif chromium:
            run.exit_code, run.why = 1, chromium
        else:
            browser_env = {**env, "KUBEBUILDER_ASSETS": str(assets)}
            suites.append((run, browser_env, REPO, ["tests/browser"]))

    if env.get("CONFIGPIN_SERIAL_INTEGRATION") == "1":
        for run, suite_env, cwd, paths in suites:
            _pytest(run, paths, extra, suite_env, out, cwd=cwd)
    else:
        _side_by_side(suites, extra, out)

    # A real node per control plane: pods run, and the tests assert what they read. Its images
    # were built before the unit suite. The node suites run side by side too: each node lives
    # in namespaces, a cgroup and a /24 of its own (harness/node.py), and waits on its pods
    # most of the time (one keeps under half a core busy). CONFIGPIN_SERIAL_NODES=1 runs them
    # one after another.
    nodes: list[Suite] = []
    for label, assets, why in planes:
        run = Run(f"node {label}")
        runs.append(run)
        if left_out:
            run.why = "left out: CONFIGPIN_NODE_TESTS=0"
            continue
        if assets is None:
            run.why = f"control plane not provided: {why}"
            continue
        if not images_built:
            run.exit_code = 1
            run.why = "the images could not be built (python -m harness.images all)"
            continue
        if label in VERSIONS:
            print(f"\n==== provisioning node {label} ====", flush=True)
            node_assets, node_why = _provision(label, node=True)
            if node_assets is None:
                run.exit_code = 1
                run.why = f"node not provided: {node_why}"
                continue
        nodes.append((run, {**env, "KUBEBUILDER_ASSETS": str(assets)}, REPO, ["tests/node"]))
    if env.get("CONFIGPIN_SERIAL_NODES") == "1":
        for run, suite_env, cwd, paths in nodes:
            _pytest(run, paths, extra, suite_env, out, cwd=cwd)
    elif nodes:
        _side_by_side(nodes, extra, out)

    allow_missing = env.get("CONFIGPIN_ALLOW_MISSING_VERSIONS") == "1"
    print("\n==== summary ====")
    failed = False
    for run in runs:
        c = run.counts
        if run.exit_code is None:
            asked = run.why.startswith("left out")
            state = "NOT RUN" + (" (allowed)" if allow_missing or asked else "")
            failed = failed or not (allow_missing or asked)
        else:
            state = "ok" if run.ok else "FAILED"
            failed = failed or not run.ok
        figures = (
            f"{c.get('passed', 0)} passed, {c.get('failed', 0) + c.get('errors', 0)} failed, "
            f"{c.get('skipped', 0)} skipped in {run.seconds:.0f}s"
        )
        print(f"{run.name:<28} {state:<8} {figures if c else ''} {run.why}".rstrip())
    total = {k: sum(r.counts.get(k, 0) for r in runs) for k in ("passed", "failed", "errors")}
    skipped = sum(r.counts.get("skipped", 0) for r in runs)
    print(
        f"total: {total['passed']} passed, {total['failed'] + total['errors']} failed, "
        f"{skipped} skipped",
        flush=True,
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
