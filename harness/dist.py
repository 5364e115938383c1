"""The artifacts a release publishes, built into one folder (`make dist`, hack/dist.py), and what
proves each one by reading it back or installing from it.

- the wheel (pure Python: `py3-none-any`, for every platform) and the sdist, built from a copy
  of the checkout (harness/firstrun.py's build_wheel);
- the chart package `configpin-VERSION.tgz`, packaged by Helm's own library (helm-python-sdk's
  `package`, as `helm package --version --app-version` writes it, .helmignore honoured);
- the image archive `configpin-VERSION.oci.tar` (harness/images.py's, copied);
- a CycloneDX SBOM of what the image installs: configpin and every package of
  requirements.lock whose environment marker holds in the image (Linux, CPython 3.11);
- the krew plugin: an archive with a `kubectl-configpin` launcher, the wheel and the lock's
  versions, and its manifest `configpin.yaml`, whose sha256 is the archive's;
- SHA256SUMS over all of them, as `sha256sum` writes and `sha256sum -c` reads it.

The builders here are deterministic (the same inputs give the same bytes, but the wheel's and
the image's own), so tests/unit/project/test_dist.py checks them without the slow parts.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
import tomllib
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from packaging.markers import Marker
from packaging.utils import canonicalize_name

from harness.chart import CHART_DIR
from harness.firstrun import REPO

LOCK = REPO / "requirements.lock"
SUMS = "SHA256SUMS"
KREW_API = "krew.googlecontainertools.github.com/v1alpha2"
# Where a local build's manifest points when no repository is named (the release workflow names
# it: GITHUB_REPOSITORY): the project has no public address yet.
DEFAULT_REPOSITORY = "https://github.com/OWNER/configpin"
# The image's interpreter (Debian bookworm's python3 on amd64), for the lock's markers.
IMAGE_ENVIRONMENT = {
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "sys_platform": "linux",
    "os_name": "posix",
    "python_version": "3.11",
    "python_full_version": "3.11.2",
}


def project_version() -> str:
    with (REPO / "pyproject.toml").open("rb") as f:
        version: str = tomllib.load(f)["project"]["version"]
    return version


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def source_epoch() -> int:
    """The time stamped in what is built: SOURCE_DATE_EPOCH (reproducible builds), else the
    last commit's, else 0."""
    if "SOURCE_DATE_EPOCH" in os.environ:
        return int(os.environ["SOURCE_DATE_EPOCH"])
    found = subprocess.run(
        ["git", "log", "-1", "--format=%ct"], cwd=REPO, capture_output=True, text=True, check=False
    )
    return int(found.stdout.strip() or 0)


# ---- the checksums ----------------------------------------------------------------------------


def checksums(paths: Iterable[Path]) -> str:
    """SHA256SUMS as sha256sum writes it: `HEX  NAME`, one a line, by name."""
    return "".join(f"{sha256(p)}  {p.name}\n" for p in sorted(paths, key=lambda p: p.name))


def verify_checksums(folder: Path) -> list[str]:
    """Check SHA256SUMS in `folder` as `sha256sum -c` does, and that it covers every other file
    there; the names it lists."""
    listed: dict[str, str] = {}
    for line in (folder / SUMS).read_text().splitlines():
        match = re.fullmatch(r"([0-9a-f]{64})  ([^/\s]+)", line)
        if not match:
            raise ValueError(f"{SUMS}: not a sha256sum line: {line!r}")
        listed[match[2]] = match[1]
    present = {p.name for p in folder.iterdir() if p.is_file() and p.name != SUMS}
    if set(listed) != present:
        raise ValueError(f"{SUMS} lists {sorted(listed)}, the folder holds {sorted(present)}")
    for name, digest in listed.items():
        if sha256(folder / name) != digest:
            raise ValueError(f"{SUMS}: {name} does not match")
    return sorted(listed)


# ---- the lock and the SBOM --------------------------------------------------------------------


@dataclass(frozen=True)
class Locked:
    name: str
    version: str
    marker: str  # "" when it always applies


_LOCKED = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)\s*(?:;\s*([^\\]*?))?\s*\\?$")


def read_lock(text: str) -> list[Locked]:
    """Every pinned package of a `uv pip compile --generate-hashes` lock."""
    found: list[Locked] = []
    for line in text.splitlines():
        if match := _LOCKED.match(line):
            found.append(Locked(match[1], match[2], match[3] or ""))
    return found


def image_packages(locked: Iterable[Locked]) -> list[Locked]:
    """The locked packages pip installs in the image: those whose marker holds there."""
    return [p for p in locked if not p.marker or Marker(p.marker).evaluate(dict(IMAGE_ENVIRONMENT))]


def purl(name: str, version: str) -> str:
    return f"pkg:pypi/{canonicalize_name(name)}@{version}"


def sbom(version: str, lock_text: str, *, epoch: int = 0) -> str:
    """A CycloneDX 1.6 SBOM (JSON) of configpin's image: configpin, and every locked package
    the image installs, each with its purl (and its marker, where the lock gives one). The
    lock's hashes are left out: they are those of every file pip may choose, not of the one
    installed."""
    from cyclonedx.model import Property
    from cyclonedx.model.bom import Bom
    from cyclonedx.model.component import Component, ComponentType
    from cyclonedx.output.json import JsonV1Dot6
    from packageurl import PackageURL

    def component(name: str, version: str, kind: ComponentType) -> Component:
        return Component(
            type=kind,
            name=name,
            version=version,
            bom_ref=purl(name, version),
            purl=PackageURL.from_string(purl(name, version)),
        )

    root = component("configpin", version, ComponentType.APPLICATION)
    root.properties.add(Property(name="configpin:image", value=f"localhost/configpin:{version}"))
    bom = Bom(
        serial_number=uuid.uuid5(uuid.NAMESPACE_URL, f"configpin-{version}-{lock_text}"),
    )
    bom.metadata.component = root
    bom.metadata.timestamp = datetime.fromtimestamp(epoch, UTC)
    for p in image_packages(read_lock(lock_text)):
        c = component(p.name, p.version, ComponentType.LIBRARY)
        if p.marker:
            c.properties.add(Property(name="configpin:marker", value=p.marker))
        bom.components.add(c)
    bom.register_dependency(root, bom.components)
    text: str = JsonV1Dot6(bom).output_as_string(indent=2)
    return text + "\n"


def check_sbom(text: str, lock_text: str, version: str) -> list[str]:
    """The SBOM is valid CycloneDX 1.6 and names configpin `version` and every package the lock
    installs in the image at its version (nothing else); the names, canonical."""
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    error = JsonStrictValidator(SchemaVersion.V1_6).validate_str(text)
    if error is not None:
        raise ValueError(f"the SBOM is not valid CycloneDX 1.6: {error}")
    doc = json.loads(text)
    root = doc["metadata"]["component"]
    if (root["name"], root["version"], root["purl"]) != (
        "configpin",
        version,
        purl("configpin", version),
    ):
        raise ValueError(f"the SBOM's component is {root}")
    listed = {canonicalize_name(c["name"]): (c["version"], c["purl"]) for c in doc["components"]}
    wanted = {
        canonicalize_name(p.name): (p.version, purl(p.name, p.version))
        for p in image_packages(read_lock(lock_text))
    }
    if listed != wanted:
        missing = sorted(set(wanted.items()) - set(listed.items()))
        extra = sorted(set(listed.items()) - set(wanted.items()))
        raise ValueError(f"SBOM vs lock: missing {missing}, extra {extra}")
    return sorted(listed)


# ---- the chart --------------------------------------------------------------------------------


def package_chart(dest: Path, version: str) -> Path:
    """`helm package charts/configpin --version VERSION --app-version VERSION -d DEST`."""
    import helm_python as helm

    path = helm.package(CHART_DIR, destination=dest, version=version, app_version=version)
    return Path(path)


def chart_files(chart_dir: Path = CHART_DIR) -> list[str]:
    """The files `helm package` puts in the archive: the chart's, less what .helmignore names
    (its patterns as Helm reads them: a glob on the name or the path, `dir/` for folders)."""
    import fnmatch

    ignore = chart_dir / ".helmignore"
    patterns = [
        line.strip()
        for line in (ignore.read_text().splitlines() if ignore.is_file() else [])
        if line.strip() and not line.startswith("#")
    ]

    def ignored(rel: str, is_dir: bool) -> bool:
        for pattern in patterns:
            if pattern.endswith("/"):
                if is_dir and fnmatch.fnmatch(Path(rel).name, pattern[:-1]):
                    return True
            elif fnmatch.fnmatch(rel, pattern) or fnmatch.fnmatch(Path(rel).name, pattern):
                return True
        return False

    found: list[str] = []
    for root, dirs, files in os.walk(chart_dir):
        base = Path(root).relative_to(chart_dir)
        dirs[:] = sorted(d for d in dirs if not ignored((base / d).as_posix(), True))
        kept = (f for f in sorted(files) if not ignored((base / f).as_posix(), False))
        found.extend((base / f).as_posix() for f in kept)
    return sorted(found)


def check_chart_archive(tgz: Path, version: str) -> list[str]:
    """The archive is a gzipped tar of `configpin/` holding the chart's files (no more, no
    less), its Chart.yaml at `version` and appVersion `version`; the files, under configpin/."""
    with tarfile.open(tgz, "r:gz") as tar:
        members = [m for m in tar.getmembers() if m.isfile()]
        names = sorted(m.name for m in members)
        meta_file = tar.extractfile("configpin/Chart.yaml")
        assert meta_file is not None
        meta = yaml.safe_load(meta_file.read())
    expected = sorted(f"configpin/{f}" for f in chart_files())
    if names != expected:
        raise ValueError(
            f"{tgz.name}: extra {sorted(set(names) - set(expected))}, "
            f"missing {sorted(set(expected) - set(names))}"
        )
    if (meta["version"], str(meta["appVersion"])) != (version, version):
        raise ValueError(f"{tgz.name}: version {meta['version']}, appVersion {meta['appVersion']}")
    return names


# ---- the krew plugin --------------------------------------------------------------------------

LAUNCHER = r"""#!/bin/sh
# kubectl-configpin as krew installs it. configpin is Python: the first run installs the wheel
# beside this script, and its dependencies from PyPI at the versions this release was tested
# with (constraints.txt), into a venv of its own; every run then starts the plugin from there.
set -eu
version=@VERSION@
self=$0
while [ -L "$self" ]; do  # krew links its bin/ to the plugin's folder
  link=$(readlink "$self")
  case $link in /*) self=$link ;; *) self=$(dirname "$self")/$link ;; esac
done
here=$(cd "$(dirname "$self")" && pwd)
venv=${XDG_DATA_HOME:-$HOME/.local/share}/configpin/krew/$version
if [ ! -e "$venv/.installed" ]; then
  python=${CONFIGPIN_PYTHON:-python3}
  if ! "$python" -c 'import sys, venv; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "kubectl-configpin: needs Python 3.11 or newer with its venv module as $python" \
      "(or set CONFIGPIN_PYTHON)" >&2
    exit 1
  fi
  echo "kubectl-configpin: installing configpin $version into $venv (once)" >&2
  rm -rf "$venv"  # what an interrupted first run left
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    -c "$here/constraints.txt" "$here/@WHEEL@" >&2
  touch "$venv/.installed"
fi
exec "$venv/bin/kubectl-configpin" "$@"
"""


def krew_archive_name(version: str) -> str:
    return f"kubectl-configpin-{version}.tar.gz"


def _tar_file(tar: tarfile.TarFile, name: str, data: bytes, mode: int, mtime: int) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), mode, mtime
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    tar.addfile(info, io.BytesIO(data))


def krew_archive(dest: Path, wheel: Path, constraints: Path, version: str, *, epoch: int) -> Path:
    """The plugin's archive: the launcher, the wheel and the lock's versions, at the top (krew
    unpacks it into the plugin's folder). The same inputs give the same bytes."""
    launcher = LAUNCHER.replace("@VERSION@", version).replace("@WHEEL@", wheel.name)
    out = dest / krew_archive_name(version)
    with (
        out.open("wb") as raw,
        gzip.GzipFile(fileobj=raw, mode="wb", mtime=epoch) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        _tar_file(tar, "kubectl-configpin", launcher.encode(), 0o755, epoch)
        _tar_file(tar, wheel.name, wheel.read_bytes(), 0o644, epoch)
        _tar_file(tar, "constraints.txt", constraints.read_bytes(), 0o644, epoch)
    return out


def release_url(version: str, repository: str | None = None) -> str:
    """Where a release's files are downloaded: GitHub's release download URL for tag vVERSION
    of `repository` (GITHUB_SERVER_URL/GITHUB_REPOSITORY in the release workflow)."""
    if repository is None:
        env = os.environ
        named = env.get("GITHUB_REPOSITORY")
        repository = (
            f"{env.get('GITHUB_SERVER_URL', 'https://github.com')}/{named}"
            if named
            else DEFAULT_REPOSITORY
        )
    return f"{repository.rstrip('/')}/releases/download/v{version}"


def krew_manifest(version: str, archive: Path, download: str) -> dict[str, Any]:
    """krew's Plugin manifest (krew-index's plugins/configpin.yaml) for `archive`, downloaded
    from `download`/its name."""
    return {
        "apiVersion": KREW_API,
        "kind": "Plugin",
        "metadata": {"name": "configpin"},
        "spec": {
            "version": f"v{version}",
            "homepage": download.split("/releases/", 1)[0],
            "shortDescription": "Pin pods to their ConfigMap and Secret content",
            "description": (
                "The client of configpin, the admission webhook that pins pods to the exact\n"
                "ConfigMap and Secret content they were created with: status (each workload's\n"
                "record against the cluster), plan and approve (what a change to a ConfigMap or\n"
                "Secret will roll), wait, migrate (from Stakater Reloader), dashboard, render\n"
                "and version.\n"
            ),
            "caveats": (
                "This plugin is written in Python. It needs python3, 3.11 or newer, with its venv\n"
                "module, on PATH (or named by CONFIGPIN_PYTHON). Its first run installs the\n"
                "configpin wheel that the plugin's archive holds, and its dependencies from PyPI\n"
                "at the versions this release was tested with, into a venv of its own under\n"
                f"$XDG_DATA_HOME/configpin/krew/{version} (~/.local/share/...). That needs PyPI\n"
                "once; `kubectl krew uninstall configpin` leaves that venv: remove it by hand.\n"
                "The server is not included: install it with the Helm chart.\n"
            ),
            "platforms": [
                {
                    "selector": {
                        "matchExpressions": [
                            {"key": "os", "operator": "In", "values": ["darwin", "linux"]}
                        ]
                    },
                    "uri": f"{download}/{archive.name}",
                    "sha256": sha256(archive),
                    "files": [{"from": "*", "to": "."}],
                    "bin": "kubectl-configpin",
                }
            ],
        },
    }


class _Dumper(yaml.SafeDumper):
    """Multi-line strings as literal blocks (`|`), as manifests are written by hand."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def write_yaml(path: Path, doc: Mapping[str, Any]) -> Path:
    path.write_text(yaml.dump(dict(doc), Dumper=_Dumper, sort_keys=False, width=100))
    return path


def check_krew(manifest_path: Path, archive: Path, version: str) -> dict[str, Any]:
    """The manifest is krew's Plugin for `archive` (its sha256, its name at the end of the uri,
    a bin the archive holds as an executable at its top); the manifest."""
    doc: dict[str, Any] = yaml.safe_load(manifest_path.read_text())
    if (doc["apiVersion"], doc["kind"], doc["metadata"]["name"]) != (
        KREW_API,
        "Plugin",
        "configpin",
    ):
        raise ValueError(f"{manifest_path.name}: not krew's Plugin configpin")
    spec = doc["spec"]
    if spec["version"] != f"v{version}":
        raise ValueError(f"{manifest_path.name}: version {spec['version']}")
    with tarfile.open(archive, "r:gz") as tar:
        members = {m.name: m for m in tar.getmembers()}
    for platform in spec["platforms"]:
        if platform["sha256"] != sha256(archive):
            raise ValueError(f"{manifest_path.name}: sha256 is not {archive.name}'s")
        if not platform["uri"].startswith("https://") or not platform["uri"].endswith(
            f"/{archive.name}"
        ):
            raise ValueError(f"{manifest_path.name}: uri {platform['uri']}")
        launcher = members.get(platform["bin"])
        if launcher is None or not launcher.isfile() or not launcher.mode & 0o111:
            raise ValueError(f"{archive.name}: no executable {platform['bin']}")
    return doc


# ---- the image ---------------------------------------------------------------------------------


def image_distributions(archive: Any) -> dict[str, str]:
    """{canonical name: version} of every distribution installed in the image's venv (its
    *.dist-info folders), from a harness.images.Archive."""
    found: dict[str, str] = {}
    for _, member in archive.layer_members():
        match = re.search(r"/site-packages/([^/]+)-([^/-]+)\.dist-info/METADATA$", member.name)
        if match and member.isfile():
            found[canonicalize_name(match[1])] = match[2]
    return found


def copy_file(src: Path, dest: Path) -> Path:
    """A copy of `src` at `dest` (never a link: a later `make image` must not change dist/)."""
    dest.unlink(missing_ok=True)
    shutil.copy2(src, dest)
    return dest


def run(argv: list[str], *, env: Mapping[str, str] | None = None, cwd: Path | None = None) -> str:
    """Run a proof's command; its output, or an error with it."""
    done = subprocess.run(
        argv, capture_output=True, text=True, env=dict(env) if env else None, cwd=cwd, check=False
    )
    if done.returncode != 0:
        said = done.stdout + done.stderr
        raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}:\n{said}")
    return done.stdout + done.stderr
