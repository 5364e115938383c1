#!/usr/bin/env python3
"""Build the artifacts a release publishes into dist/, then prove each one by installing from it
or reading it back in a fresh place (`make dist`; docs/development.md#releasing).

    .venv/bin/python hack/dist.py [--out dist] [--repository URL]

Built (harness/dist.py): the wheel (pure Python) and the sdist, the chart package, the image
archive (`make image`'s, which must be current), a CycloneDX SBOM of the image's packages, the
krew plugin's archive and manifest, and SHA256SUMS. Proved, one line each with its size:

- the wheel in a fresh venv without extras: `configpin --help`, `kubectl-configpin --help` and
  `version --client`, the embedded sources readable, no fastapi or uvicorn importable;
- the sdist built and installed with `[server]` in another: `configpin serve --help`;
- the chart loaded, rendered and linted (strict) from its .tgz by Helm's library;
- the image archive read as an OCI layout: every blob against its digest, the entrypoint, and
  configpin's wheel in its layers;
- the SBOM valid CycloneDX naming every locked package at its version, and exactly the
  distributions the image's venv holds;
- the krew archive unpacked and its launcher run through a link, as krew links it;
- SHA256SUMS checked by `sha256sum -c` and covering every file.

`--repository` (default: GITHUB_SERVER_URL/GITHUB_REPOSITORY, as the release workflow has them)
is where the krew manifest's uri points: REPOSITORY/releases/download/vVERSION/ARCHIVE.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import helm_python as helm  # noqa: E402
import yaml  # noqa: E402
from packaging.utils import canonicalize_name  # noqa: E402

from harness import dist, images  # noqa: E402
from harness.firstrun import build_wheel, fresh_venv, lock_constraints  # noqa: E402

SERVER_ONLY = ("fastapi", "uvicorn", "starlette")


def _size(path: Path) -> str:
    n = path.stat().st_size
    return f"{n / 1048576:.1f} MiB" if n >= 1048576 else f"{n / 1024:.1f} KiB"


def _env(home: Path, **more: str) -> dict[str, str]:
    """A fresh shell's: a HOME of its own, no cluster, nothing of this venv or checkout."""
    home.mkdir(parents=True, exist_ok=True)
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "TMPDIR")}
    return {**keep, "HOME": str(home), **more}


def _absent(python: Path, modules: tuple[str, ...], env: dict[str, str], cwd: Path) -> None:
    probe = "import importlib.util as u, sys; print([m for m in sys.argv[1:] if u.find_spec(m)])"
    found = dist.run([str(python), "-c", probe, *modules], env=env, cwd=cwd).strip()
    if found != "[]":
        raise AssertionError(f"importable where they must not be: {found}")


def _contains(output: str, *wanted: str) -> str:
    for text in wanted:
        if text not in output:
            raise AssertionError(f"expected {text!r} in:\n{output}")
    return output


# ---- build ------------------------------------------------------------------------------------


def build(out: Path, work: Path, repository: str | None) -> dict[str, Path]:
    version = dist.project_version()
    epoch = dist.source_epoch()
    built: dict[str, Path] = {}
    print(f"dist: building configpin {version} into {out.name}/", flush=True)
    (work / "wheel").mkdir(parents=True)
    wheel = build_wheel(work / "wheel", compile="0")
    built["wheel"] = dist.copy_file(wheel, out / wheel.name)
    src = work / "wheel" / "src"
    sdist_code = (
        "import sys; from setuptools import build_meta as b; print(b.build_sdist(sys.argv[1]))"
    )
    name = subprocess.run(
        [sys.executable, "-c", sdist_code, str(out)],
        cwd=src, check=True, capture_output=True, text=True,
        env={**os.environ, "SOURCE_DATE_EPOCH": str(epoch)},
    ).stdout.strip().splitlines()[-1]  # fmt: skip
    built["sdist"] = out / name
    built["chart"] = dist.package_chart(out, version)
    if not images.is_current(images.CONFIGPIN):
        raise SystemExit(f"dist: {images.CONFIGPIN.archive} is not current: run `make image`")
    built["image"] = dist.copy_file(images.CONFIGPIN.archive, out / f"configpin-{version}.oci.tar")
    sbom = out / f"configpin-{version}.cdx.json"
    sbom.write_text(dist.sbom(version, dist.LOCK.read_text(), epoch=epoch))
    built["sbom"] = sbom
    constraints = lock_constraints(work)
    archive = dist.krew_archive(out, wheel, constraints, version, epoch=epoch)
    built["krew archive"] = archive
    manifest = dist.krew_manifest(version, archive, dist.release_url(version, repository))
    built["krew manifest"] = dist.write_yaml(out / "configpin.yaml", manifest)
    sums = out / dist.SUMS
    sums.write_text(dist.checksums(built.values()))
    built["checksums"] = sums
    return built


# ---- prove ------------------------------------------------------------------------------------


def prove_wheel(wheel: Path, work: Path, version: str) -> str:
    if not wheel.name.endswith("-py3-none-any.whl"):
        raise AssertionError(f"{wheel.name}: not a pure-Python wheel")
    bin_ = fresh_venv(work / "venv", str(wheel), constraints=lock_constraints(work))
    env, cwd = _env(work / "home"), work
    _contains(dist.run([str(bin_ / "configpin"), "--help"], env=env, cwd=cwd), "usage: configpin")
    _contains(
        dist.run([str(bin_ / "kubectl-configpin"), "--help"], env=env, cwd=cwd),
        "usage: kubectl configpin",
    )
    said = dist.run([str(bin_ / "kubectl-configpin"), "version", "--client"], env=env, cwd=cwd)
    _contains(said, version)
    read = (
        "from importlib.resources import files as f; print(f('webhook.embedded') / 'sources.yaml')"
    )
    if not Path(dist.run([str(bin_ / "python"), "-c", read], env=env, cwd=cwd).strip()).is_file():
        raise AssertionError("the wheel's embedded sources are not installed")
    _absent(bin_ / "python", SERVER_ONLY, env, cwd)
    return "fresh venv, no extras: both commands' --help, version --client; no fastapi"


def prove_sdist(sdist: Path, work: Path, version: str) -> str:
    with tarfile.open(sdist) as tar:
        names = set(tar.getnames())
    top = f"configpin-{version}"
    for needed in ("PKG-INFO", "pyproject.toml", "setup.py", "webhook/embedded/sources.yaml"):
        if f"{top}/{needed}" not in names:
            raise AssertionError(f"{sdist.name} has no {top}/{needed}")
    requirement = f"configpin[server] @ {sdist.resolve().as_uri()}"
    bin_ = fresh_venv(work / "venv", requirement, constraints=lock_constraints(work))
    env, cwd = _env(work / "home"), work
    _contains(
        dist.run([str(bin_ / "configpin"), "serve", "--help"], env=env, cwd=cwd),
        "usage: configpin serve",
    )
    probe = (
        "import fastapi, uvicorn, importlib.metadata as m, pathlib, webhook.core as c; "
        "print(m.version('configpin'), any(pathlib.Path(c.__file__).parent.glob('*.so')))"
    )
    found, compiled = dist.run([str(bin_ / "python"), "-c", probe], env=env, cwd=cwd).split()
    if found != version:
        raise AssertionError(f"the sdist installed configpin {found}")
    core = "its core compiled by mypyc" if compiled == "True" else "pure Python (no compiler)"
    return f"built, installed with [server] in a fresh venv ({core}): configpin serve --help"


def prove_chart(tgz: Path, version: str) -> str:
    files = dist.check_chart_archive(tgz, version)
    with helm.Chart.load(tgz) as chart:
        rendered = chart.render({}, name="configpin", namespace="configpin-system")
    texts = [text for path, text in rendered.items() if not path.endswith("NOTES.txt")]
    objects = [d for text in texts for d in yaml.safe_load_all(text) if d]
    (deployment,) = [o for o in objects if o.get("kind") == "Deployment"]
    image = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
    if not image.endswith(f":{version}"):
        raise AssertionError(f"the chart's Deployment runs {image}")
    report = helm.lint(str(tgz), strict=True)
    serious = [m for m in report["messages"] if m["severity"] >= 2] + report["errors"]
    if serious:
        raise AssertionError(f"helm lint --strict of {tgz.name}: {serious}")
    return (
        f"{len(files)} files in configpin/, (app)version {version}; rendered, lint --strict clean"
    )


def prove_image(path: Path, version: str) -> str:
    with tarfile.open(path) as tar:
        names = set(tar.getnames())
    for needed in ("oci-layout", "index.json"):
        if needed not in names:
            raise AssertionError(f"{path.name} has no {needed}")
    archive = images.read_archive(path)  # every blob against its digest
    config = archive.config["config"]
    if (config.get("Entrypoint"), config.get("Cmd")) != (["configpin"], ["serve"]):
        raise AssertionError(f"entrypoint {config.get('Entrypoint')} {config.get('Cmd')}")
    installed = dist.image_distributions(archive)
    if installed.get("configpin") != version:
        raise AssertionError(f"the image's layers hold configpin {installed.get('configpin')}")
    return (
        f"OCI layout: blobs match digests, entrypoint configpin serve, configpin {version} inside"
    )


def prove_sbom(path: Path, image: Path, version: str) -> str:
    listed = dist.check_sbom(path.read_text(), dist.LOCK.read_text(), version)
    installed = dist.image_distributions(images.read_archive(image))
    installed.pop("configpin", None)
    doc = json.loads(path.read_text())
    versions = {canonicalize_name(c["name"]): c["version"] for c in doc["components"]}
    if installed != versions:
        differ = sorted(set(installed.items()) ^ set(versions.items()))
        raise AssertionError(f"the image's venv and the SBOM differ: {differ}")
    return f"valid CycloneDX 1.6: the {len(listed)} locked packages, the image's venv's"


def prove_krew(manifest: Path, archive: Path, work: Path, version: str) -> str:
    doc = dist.check_krew(manifest, archive, version)
    plugin, bin_ = work / "store", work / "bin"
    plugin.mkdir()
    bin_.mkdir()
    with tarfile.open(archive, "r:gz") as tar:
        tar.extractall(plugin, filter="data")
    (bin_ / "kubectl-configpin").symlink_to(plugin / doc["spec"]["platforms"][0]["bin"])
    env = _env(work / "home")
    first = dist.run([str(bin_ / "kubectl-configpin"), "version", "--client"], env=env, cwd=work)
    _contains(first, "installing configpin", version)
    started = time.monotonic()
    again = dist.run([str(bin_ / "kubectl-configpin"), "version", "--client"], env=env, cwd=work)
    if "installing" in again or version not in again:
        raise AssertionError(f"the second run:\n{again}")
    venv = work / "home" / ".local" / "share" / "configpin" / "krew" / version
    _absent(venv / "bin" / "python", SERVER_ONLY, env, work)
    again_s = time.monotonic() - started
    return f"sha256 and uri match; the launcher made its venv, then ran in {again_s:.1f} s"


def prove_sums(folder: Path) -> str:
    names = dist.verify_checksums(folder)
    if shutil.which("sha256sum"):
        dist.run(["sha256sum", "--check", "--strict", "--quiet", dist.SUMS], cwd=folder)
    return f"sha256sum --check passes over all {len(names)} other files"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "dist")
    parser.add_argument("--repository", default=None, help="default: GITHUB_REPOSITORY's URL")
    args = parser.parse_args(argv)
    version = dist.project_version()
    out: Path = args.out.resolve()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="configpin-dist-") as tmp:
        work = Path(tmp)
        built = build(out, work / "build", args.repository)
        print(f"dist: built in {time.monotonic() - started:.0f} s; proving each", flush=True)
        proofs: list[tuple[str, Callable[[Path], str]]] = [
            ("wheel", lambda w: prove_wheel(built["wheel"], w, version)),
            ("sdist", lambda w: prove_sdist(built["sdist"], w, version)),
            ("chart", lambda w: prove_chart(built["chart"], version)),
            ("image", lambda w: prove_image(built["image"], version)),
            ("sbom", lambda w: prove_sbom(built["sbom"], built["image"], version)),
            (
                "krew manifest",
                lambda w: prove_krew(built["krew manifest"], built["krew archive"], w, version),
            ),
            ("checksums", lambda w: prove_sums(out)),
        ]
        for key, prove in proofs:
            where = work / "prove" / key.replace(" ", "-")
            where.mkdir(parents=True)
            proved = prove(where)
            path = built[key]
            print(f"{path.name:<38} {_size(path):>10}  {proved}", flush=True)
            if key == "krew manifest":
                path = built["krew archive"]
                print(
                    f"{path.name:<38} {_size(path):>10}  the manifest's archive, proved above",
                    flush=True,
                )
    print(f"dist: {len(built)} artifacts built and proved in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
