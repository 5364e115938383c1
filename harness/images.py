"""Container images as OCI archives, built from Debian's packages with no Docker daemon and no
registry: configpin's own image and the test node's two images.

    python -m harness.images {configpin,pause,shell,all} [--out DIR] [--refresh]

- ``configpin`` (``make image``): Debian bookworm's python3, the runtime dependencies from
  requirements.lock (``--require-hashes``) in a venv at /opt/configpin, configpin's wheel with
  its core compiled by mypyc (``CONFIGPIN_COMPILE=1``), bytecode compiled at install time; the
  user, entrypoint, environment, working directory and port of the Dockerfile's final stage. The
  wheel is built in a second Debian tree that has gcc and the Python headers, with the same
  package versions; only the venv leaves it, as in the Dockerfile's builder stage. Three layers:
  the Debian tree, the venv with the locked dependencies, configpin's own files (the first two
  are reused until the Debian base or the locks change). It needs root, as installing packages
  does (mmdebstrap's root mode and chroot).
- ``pause``: a static program (hack/images/pause.c) that sleeps until SIGTERM or SIGINT and
  reaps children: the node's sandbox image.
- ``shell``: Debian's busybox-static with its applet links (sh, cat, env, httpd, ...), for the
  tests' application pods.

The tools (docs/image.md says why these): mmdebstrap writes the Debian trees (dpkg and the
maintainer scripts run in a chroot, as in any Debian install), umoci writes the OCI layout
(layer blobs, manifest, config), and the layout is packed into one tar that
``ctr -n k8s.io images import`` takes; its index names the image ``Image.ref``
(``io.containerd.image.name``). Missing tools are installed with apt-get (harness/apt.py:
it waits for apt's locks).

Everything is cached under ~/.cache/configpin/images (``$CONFIGPIN_CACHE_DIR/images``): the
downloaded .debs, the two Debian trees (rebuilt when their package lists change, or with
``--refresh``, which also picks up Debian's updates), the wheels, and every archive by the hash
of its inputs. `ensure` rebuilds an image only when those inputs changed, and holds a file lock
while it works, so two processes asking at once build it once.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import io
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from harness import apt

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "build" / "images"
PAUSE_SOURCE = REPO / "hack" / "images" / "pause.c"

SUITE = "bookworm"
_MIRROR = os.environ.get("CONFIGPIN_DEBIAN_MIRROR", "http://deb.debian.org/debian")
_SECURITY = os.environ.get("CONFIGPIN_DEBIAN_SECURITY", "http://deb.debian.org/debian-security")
_KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
SOURCES = (
    f"deb [signed-by={_KEYRING}] {_MIRROR} {SUITE} main",
    f"deb [signed-by={_KEYRING}] {_MIRROR} {SUITE}-updates main",
    f"deb [signed-by={_KEYRING}] {_SECURITY} {SUITE}-security main",
)

# The OCI annotation containerd names an imported image by (a full reference, so that
# `ctr images import` needs no --base-name); the OCI one holds the tag alone, as `docker save`
# writes them.
ANNOTATION_CONTAINERD_NAME = "io.containerd.image.name"
ANNOTATION_REF_NAME = "org.opencontainers.image.ref.name"

# Debian's default PATH, as the base images set it.
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
VENV = "/opt/configpin"
USER_ID = 65532


def _log(message: str) -> None:
    print(f"images: {message}", file=sys.stderr, flush=True)


def cache_dir() -> Path:
    """Where downloads, Debian trees and built archives are kept (as the control plane's
    provisioning caches its build: ``$CONFIGPIN_CACHE_DIR``, else ~/.cache/configpin)."""
    root = os.environ.get("CONFIGPIN_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "configpin"
    )
    return Path(root) / "images"


def _project_version() -> str:
    with (REPO / "pyproject.toml").open("rb") as f:
        version: str = tomllib.load(f)["project"]["version"]
    return version


# --- what an image is ----------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    """The runtime part of an OCI image configuration (what a Dockerfile's USER, ENTRYPOINT,
    CMD, ENV, WORKDIR and EXPOSE set)."""

    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    env: tuple[str, ...] = (f"PATH={BASE_PATH}",)
    user: str = ""
    workdir: str = ""
    ports: tuple[str, ...] = ()
    labels: tuple[tuple[str, str], ...] = ()

    def as_oci(self) -> dict[str, Any]:
        """As the image config's ``config`` object."""
        found: dict[str, Any] = {"Env": list(self.env)}
        if self.user:
            found["User"] = self.user
        if self.entrypoint:
            found["Entrypoint"] = list(self.entrypoint)
        if self.cmd:
            found["Cmd"] = list(self.cmd)
        if self.workdir:
            found["WorkingDir"] = self.workdir
        if self.ports:
            found["ExposedPorts"] = {port: {} for port in self.ports}
        if self.labels:
            found["Labels"] = dict(self.labels)
        return found


@dataclass(frozen=True)
class Image:
    """One image: the name containerd knows it by once imported, and its archive."""

    name: str
    ref: str
    config: Config = field(compare=False)

    @property
    def filename(self) -> str:
        return f"{self.name}.oci.tar"

    @property
    def archive(self) -> Path:
        """Where ``make image`` / ``make test-images`` write it (``ensure`` without out_dir)."""
        return DEFAULT_OUT / self.filename

    @property
    def tag(self) -> str:
        return self.ref.rpartition(":")[2]


CONFIGPIN = Image(
    "configpin",
    f"localhost/configpin:{_project_version()}",
    Config(
        entrypoint=("configpin",),
        cmd=("serve",),
        env=(
            f"PATH={VENV}/bin:{BASE_PATH}",
            "PYTHONDONTWRITEBYTECODE=1",
            "PYTHONUNBUFFERED=1",
            "HOME=/tmp",
            "CONFIGPIN_HOST=0.0.0.0",
            # as the python base image of the Dockerfile sets it
            "LANG=C.UTF-8",
        ),
        user=f"{USER_ID}:{USER_ID}",
        workdir="/tmp",
        ports=("8443/tcp",),
        labels=(
            ("org.opencontainers.image.title", "configpin"),
            ("org.opencontainers.image.version", _project_version()),
        ),
    ),
)
PAUSE = Image(
    "pause",
    "localhost/configpin-test/pause:1",
    # Kubernetes' own pause image runs as 65535 too.
    Config(entrypoint=("/pause",), user="65535:65535"),
)
SHELL = Image("shell", "localhost/configpin-test/shell:1", Config(cmd=("sh",)))
IMAGES = {image.name: image for image in (CONFIGPIN, PAUSE, SHELL)}


# --- helpers: commands, locks, tools -------------------------------------------------------


def _run(argv: Sequence[str | Path], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """Run a command; what it prints goes to stderr unless asked for (stdout is the CLI's
    answer)."""
    kwargs.setdefault("stdout", 2)
    return subprocess.run([str(a) for a in argv], check=True, text=True, **kwargs)


def _output(argv: Sequence[str | Path], **kwargs: Any) -> str:
    return _run(argv, stdout=subprocess.PIPE, **kwargs).stdout


@contextlib.contextmanager
def _locked(name: str) -> Iterator[None]:
    """An exclusive lock on ``<cache>/locks/<name>`` for as long as the block runs."""
    locks = cache_dir() / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    with (locks / f"{name}.lock").open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _apt_install(packages: Iterable[str]) -> None:
    wanted = sorted(set(packages))
    if not wanted:
        return
    _log(f"installing {' '.join(wanted)} with apt-get")
    # harness/apt: waits while unattended-upgrades (or another build) holds apt's locks
    noninteractive = {"DEBIAN_FRONTEND": "noninteractive"}
    quiet = {"stdout": subprocess.DEVNULL, "say": _log}
    apt.run(["update", "-qq"], sudo=True, env=noninteractive, **quiet)
    install = ["install", "-y", "-qq", "--no-install-recommends", *wanted]
    apt.run(install, sudo=True, env=noninteractive, **quiet)


def _require(commands: dict[str, str], *, static_libc: bool = False) -> None:
    """Install the Debian package of each missing command ({command: package})."""
    missing = {pkg for cmd, pkg in commands.items() if shutil.which(cmd) is None}
    if static_libc and (
        shutil.which("gcc") is None
        or _output(["gcc", "-print-file-name=libc.a"]).strip() == "libc.a"
    ):
        missing |= {"gcc", "libc6-dev"}
    _apt_install(missing)


def _digest_files(h: Any, root: Path, paths: Iterable[Path]) -> None:
    for path in sorted(paths):
        h.update(str(path.relative_to(root) if path.is_relative_to(root) else path).encode())
        h.update(b"\0")
        h.update(hashlib.sha256(path.read_bytes()).digest())


def _tree_files(path: Path) -> list[Path]:
    """The files of a source tree, less what the Dockerfile's context leaves out."""
    if path.is_file():
        return [path]
    return [
        p
        for p in path.rglob("*")
        if p.is_file()
        and "__pycache__" not in p.parts
        and not any(part.endswith(".egg-info") for part in p.parts)
        and p.suffix not in (".pyc", ".so")
    ]


# --- the Dockerfile, which the configpin image matches ------------------------------------


def dockerfile_instructions(path: Path = REPO / "Dockerfile") -> Iterator[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined."""
    logical = re.sub(r"\\\n", " ", path.read_text())
    for line in logical.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            instruction, _, rest = stripped.partition(" ")
            yield instruction.upper(), rest.strip()


def dockerfile_stages(path: Path = REPO / "Dockerfile") -> list[list[tuple[str, str]]]:
    """The Dockerfile's stages, each its instructions from its FROM on."""
    found: list[list[tuple[str, str]]] = []
    for instruction, args in dockerfile_instructions(path):
        if instruction == "FROM":
            found.append([])
        if found:
            found[-1].append((instruction, args))
    return found


# --- the OCI archive -----------------------------------------------------------------------


@dataclass(frozen=True)
class Layer:
    """An uncompressed layer tar, and what made it (the image's history)."""

    tar: Path
    created_by: str


def _normalize(mtime: int | None) -> Callable[[tarfile.TarInfo], tarfile.TarInfo]:
    def reset(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        if mtime is not None:
            info.mtime = mtime
        return info

    return reset


def _walk(root: Path, top: str = ".") -> list[str]:
    """Every path under root/top (directories, files, links; links not followed), relative
    to root, POSIX-style."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root / top):
        for name in [*dirnames, *filenames]:
            found.append(Path(dirpath, name).relative_to(root).as_posix())
    return found


def _tar_paths(root: Path, out: Path, paths: Iterable[str], *, mtime: int | None = None) -> Path:
    """A layer of the given paths under root, each with the directories above it; every entry
    owned by root, file times kept unless mtime is given (the venv's bytecode is checked
    against its sources' times)."""
    entries: set[str] = set()
    for path in paths:
        parts = PurePosixPath(path).parts
        entries.update("/".join(parts[:depth]) for depth in range(1, len(parts) + 1))
    entries.discard(".")
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
        # sorted: every directory comes before what is in it
        for name in sorted(entries):
            tar.add(root / name, name, recursive=False, filter=_normalize(mtime))
    return out


def write_archive(image: Image, layers: Sequence[Layer], dest: Path) -> Path:
    """Write an OCI image archive of the layers with the image's config (umoci), named
    ``image.ref`` for containerd."""
    _require({"umoci": "umoci"})
    with tempfile.TemporaryDirectory(prefix=f"{image.name}-oci-", dir=cache_dir()) as tmp:
        layout = Path(tmp) / "layout"
        target = f"{layout}:{image.tag}"
        _run(["umoci", "init", "--layout", layout])
        _run(["umoci", "new", "--image", target])
        for layer in layers:
            history = ("--history.created_by", layer.created_by)
            _run([*("umoci", "raw", "add-layer", "--image", target), *history, layer.tar])
        c = image.config
        argv: list[str | Path] = ["umoci", "config", "--image", target, "--os", "linux"]
        argv += ["--history.created_by", f"configpin images: {image.ref}"]
        for flag, values in (
            ("--config.entrypoint", c.entrypoint),
            ("--config.cmd", c.cmd),
            ("--config.env", c.env),
            ("--config.exposedports", c.ports),
            ("--config.label", [f"{k}={v}" for k, v in c.labels]),
        ):
            for value in values:
                argv += [flag, value]
        if c.user:
            argv += ["--config.user", c.user]
        if c.workdir:
            argv += ["--config.workingdir", c.workdir]
        _run(argv)
        _run(["umoci", "gc", "--layout", layout])
        index_path = layout / "index.json"
        index = json.loads(index_path.read_text())
        (manifest,) = index["manifests"]
        manifest["annotations"] = {
            ANNOTATION_CONTAINERD_NAME: image.ref,
            ANNOTATION_REF_NAME: image.tag,
        }
        index_path.write_text(json.dumps(index, separators=(",", ":")))
        dest.parent.mkdir(parents=True, exist_ok=True)
        partial = dest.with_name(f".{dest.name}.{os.getpid()}.partial")
        with tarfile.open(partial, "w", format=tarfile.PAX_FORMAT) as tar:
            for name in ("oci-layout", "index.json", "blobs"):
                tar.add(layout / name, name, filter=_layout_entry)
        partial.replace(dest)
    return dest


def _layout_entry(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    info.mode = 0o755 if info.isdir() else 0o644
    return info


@dataclass(frozen=True)
class Archive:
    """What an archive holds: its index, the one manifest, the image config, and a reader of
    each layer's members."""

    path: Path
    index: dict[str, Any]
    manifest: dict[str, Any]
    config: dict[str, Any]

    @property
    def name(self) -> str:
        annotations: dict[str, str] = self.index["manifests"][0].get("annotations", {})
        return annotations.get(ANNOTATION_CONTAINERD_NAME, "")

    def layer_members(self) -> Iterator[tuple[int, tarfile.TarInfo]]:
        """(layer number, member) of every layer, in order."""
        with tarfile.open(self.path) as outer:
            for n, layer in enumerate(self.manifest["layers"]):
                blob = outer.extractfile(_blob_name(layer["digest"]))
                assert blob is not None
                with tarfile.open(fileobj=blob, mode="r|*") as tar:
                    for member in tar:
                        yield n, member

    def layer_bytes(self) -> int:
        return sum(int(layer["size"]) for layer in self.manifest["layers"])


def _blob_name(digest: str) -> str:
    algorithm, _, hexdigest = digest.partition(":")
    return f"blobs/{algorithm}/{hexdigest}"


def read_archive(path: Path) -> Archive:
    """Open an OCI archive and check every blob it refers to against its digest."""
    with tarfile.open(path) as tar:

        def blob(descriptor: dict[str, Any]) -> bytes:
            f = tar.extractfile(_blob_name(descriptor["digest"]))
            assert f is not None
            data = f.read()
            found = "sha256:" + hashlib.sha256(data).hexdigest()
            if found != descriptor["digest"] or len(data) != descriptor["size"]:
                raise ValueError(f"{path}: blob {descriptor['digest']} does not match")
            return data

        index_file = tar.extractfile("index.json")
        assert index_file is not None
        index = json.loads(index_file.read())
        manifest = json.loads(blob(index["manifests"][0]))
        config = json.loads(blob(manifest["config"]))
        for layer in manifest["layers"]:
            blob(layer)
    return Archive(path, index, manifest, config)


# --- the test images -----------------------------------------------------------------------


def _pause_inputs() -> str:
    h = hashlib.sha256(b"pause\0")
    _digest_files(h, REPO, [PAUSE_SOURCE, Path(__file__).resolve()])
    return h.hexdigest()


def _build_pause(work: Path, dest: Path) -> Path:
    _require({"gcc": "gcc"}, static_libc=True)
    root = work / "root"
    root.mkdir()
    flags = ("-static", "-Os", "-s", "-Wall", "-Wextra", "-Werror")
    _run(["gcc", *flags, "-o", root / "pause", PAUSE_SOURCE])
    layer = _tar_paths(root, work / "layer.tar", _walk(root), mtime=0)
    created_by = "gcc -static -Os -s hack/images/pause.c -o /pause"
    return write_archive(PAUSE, [Layer(layer, created_by)], dest)


def _apt_options(state: Path) -> list[str]:
    """apt-get options for a private apt state (our own sources and lists; the system's are
    left alone), as hack/provision-control-plane.sh does."""
    sources = state / "sources.list"
    (state / "lists" / "partial").mkdir(parents=True, exist_ok=True)
    (state / "archives" / "partial").mkdir(parents=True, exist_ok=True)
    sources.write_text("\n".join(SOURCES) + "\n")
    return [
        "-o", f"Dir::Etc::SourceList={sources}",
        "-o", "Dir::Etc::SourceParts=/dev/null",
        "-o", f"Dir::State::Lists={state / 'lists'}",
        "-o", f"Dir::Cache::Archives={state / 'archives'}",
        "-o", "APT::Get::List-Cleanup=0",
        "-o", "Debug::NoLocking=1",
        "-o", "APT::Sandbox::User=root",
    ]  # fmt: skip


def _cached_busybox() -> Path | None:
    debs = sorted((cache_dir() / "busybox").glob("busybox-static_*.deb"))
    return debs[-1] if debs else None


def _busybox_deb(*, refresh: bool) -> Path:
    """Debian's busybox-static .deb, downloaded once and kept (``refresh``: the newest)."""
    cached = _cached_busybox()
    if cached is not None and not refresh:
        return cached
    where = cache_dir() / "busybox"
    where.mkdir(parents=True, exist_ok=True)
    options = _apt_options(cache_dir() / "apt")
    _log("downloading busybox-static")
    apt.run([*options, "update", "-qq"], stdout=subprocess.DEVNULL, say=_log)
    with tempfile.TemporaryDirectory(dir=where) as tmp:
        apt.run([*options, "download", "-qq", "busybox-static"], cwd=tmp, stdout=2, say=_log)
        (downloaded,) = Path(tmp).glob("busybox-static_*.deb")
        for old in where.glob("busybox-static_*.deb"):
            old.unlink()
        deb = downloaded.rename(where / downloaded.name)
    return deb


def _shell_inputs(deb: Path) -> str:
    h = hashlib.sha256(b"shell\0" + deb.name.encode() + b"\0")
    h.update(hashlib.sha256(deb.read_bytes()).digest())
    _digest_files(h, REPO, [Path(__file__).resolve()])
    return h.hexdigest()


_PASSWD = "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
_GROUP = "root:x:0:\nnogroup:x:65534:\n"


def _build_shell(work: Path, dest: Path) -> Path:
    _require({"dpkg-deb": "dpkg"})
    deb = _cached_busybox()
    assert deb is not None
    unpacked = work / "deb"
    _run(["dpkg-deb", "-x", deb, unpacked])
    busybox = unpacked / "bin" / "busybox"
    root = work / "root"
    (root / "bin").mkdir(parents=True)
    shutil.copy2(busybox, root / "bin" / "busybox")
    # One link per applet where busybox would install it (bin/sh, usr/bin/env, ...).
    for applet in _output([busybox, "--list-full"]).split():
        link = root / applet
        if link.name in ("busybox", "linuxrc") or link.exists():
            continue
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(root / "bin" / "busybox", link.parent))
    (root / "etc").mkdir()
    (root / "etc" / "passwd").write_text(_PASSWD)
    (root / "etc" / "group").write_text(_GROUP)
    for directory, mode in (("tmp", 0o1777), ("root", 0o700), ("var/www", 0o755)):
        (root / directory).mkdir(parents=True, exist_ok=True)
        (root / directory).chmod(mode)
    layer = _tar_paths(root, work / "layer.tar", _walk(root), mtime=0)
    return write_archive(SHELL, [Layer(layer, f"busybox-static {deb.name} --list-full")], dest)


# --- configpin's image ---------------------------------------------------------------------

# What the runtime tree holds: python3 and what dpkg needs to configure it (the maintainer
# scripts compile the standard library's bytecode) -- no apt, perl, bash or PAM.
RUNTIME_PACKAGES = (
    "base-files",
    "base-passwd",
    "coreutils",
    "dash",
    "diffutils",
    "dpkg",
    "findutils",
    "grep",
    "libc-bin",
    "sed",
    "python3",
)
# The builder's extras, as in the Dockerfile's builder stage: a C compiler and Python's headers
# for mypyc, and venv (ensurepip) for the build tools' pip.
BUILD_PACKAGES = ("gcc", "libc6-dev", "python3-dev", "python3-venv")
# Neither documentation nor translations reach the image; the copyright files stay.
DPKG_OPTIONS = (
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/locale/*",
    "path-exclude=/usr/share/lintian/*",
)
# Dropped from the runtime layer: apt's and dpkg's working files (the package list,
# /var/lib/dpkg/status, stays for image scanners), logs, caches.
_RUNTIME_DROPPED = re.compile(
    r"\./(etc/apt|var/lib/apt|var/cache/apt|var/log/apt)(/.*)?"
    r"|\./var/lib/dpkg/(info/.+|[^/]+-old)"
    r"|\./var/cache/(debconf/[^/]+-old|ldconfig/aux-cache)"
    r"|\./var/log/.+"
)
# The build inputs of configpin's wheel and venv, as the Dockerfile copies them.
CONFIGPIN_INPUTS = (
    "pyproject.toml",
    "setup.py",
    "README.md",
    "requirements.lock",
    "requirements-build.lock",
    "webhook",
)
PASSWD_ENTRY = f"configpin:x:{USER_ID}:{USER_ID}::/tmp:/usr/sbin/nologin"
GROUP_ENTRY = f"configpin:x:{USER_ID}:"

_WHEELHOUSE = "/var/cache/configpin-wheels"
_CHROOT_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


def _base_key() -> str:
    recipe = {
        "suite": SUITE,
        "sources": SOURCES,
        "runtime": RUNTIME_PACKAGES,
        "build": BUILD_PACKAGES,
        "dpkg": DPKG_OPTIONS,
        "user": [PASSWD_ENTRY, GROUP_ENTRY],
        "dropped": _RUNTIME_DROPPED.pattern,
    }
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()


def _configpin_inputs(base: Path) -> str:
    """configpin's sources and locks, and the exact Debian packages of its base."""
    h = hashlib.sha256(b"configpin\0" + (base / "packages.txt").read_bytes() + b"\0")
    files = [f for name in CONFIGPIN_INPUTS for f in _tree_files(REPO / name)]
    _digest_files(h, REPO, [*files, Path(__file__).resolve()])
    return h.hexdigest()


def _mmdebstrap(variant: str, include: Iterable[str], target: Path, *hooks: str) -> None:
    """One mmdebstrap run (root mode: chroot and maintainer scripts, as any Debian install),
    with the downloaded .debs kept in the cache between runs (mmdebstrap's own recipe)."""
    debs = cache_dir() / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    argv = ["mmdebstrap", "--mode=root", f"--variant={variant}", "--skip=essential/unlink"]
    argv += ["--skip=output/dev", "--include=" + ",".join(include)]
    argv += [f"--dpkgopt={option}" for option in DPKG_OPTIONS]
    argv += [
        '--setup-hook=mkdir -p "$1"/var/cache/apt/archives/',
        f"--setup-hook=sync-in {debs} /var/cache/apt/archives/",
        f"--customize-hook=sync-out /var/cache/apt/archives {debs}",
    ]
    argv += [f"--customize-hook={hook}" for hook in hooks]
    log = target.with_name(target.name + ".log")
    with log.open("w") as f:
        try:
            _run([*argv, SUITE, target, *SOURCES], stdout=f, stderr=subprocess.STDOUT)
        except subprocess.CalledProcessError:
            tail = log.read_text().splitlines()[-15:]
            _log(f"mmdebstrap failed ({log}):\n" + "\n".join(tail))
            raise


def _installed(status: str) -> list[str]:
    """name=version of every installed package of a dpkg status file."""
    found = []
    for stanza in status.split("\n\n"):
        fields = dict(re.findall(r"^([A-Za-z-]+): (.*)$", stanza, flags=re.MULTILINE))
        if fields.get("Status", "").endswith(" installed"):
            found.append(f"{fields['Package']}={fields['Version']}")
    return sorted(found)


def _strip_runtime(raw: Path, layer: Path) -> list[str]:
    """The runtime layer: mmdebstrap's tarball less apt's and dpkg's working files; returns
    the installed packages."""
    status = ""
    with tarfile.open(raw) as src, tarfile.open(layer, "w", format=tarfile.PAX_FORMAT) as out:
        for member in src:
            if _RUNTIME_DROPPED.fullmatch(member.name.rstrip("/")):
                continue
            data = src.extractfile(member) if member.isreg() else None
            if member.name == "./var/lib/dpkg/status" and data is not None:
                content = data.read()
                status = content.decode()
                data = io.BytesIO(content)
            out.addfile(member, data)
    return _installed(status)


def _base_dir() -> Path:
    return cache_dir() / "base" / _base_key()[:20]


def _need_root() -> None:
    if os.geteuid() != 0:
        raise PermissionError("building configpin's image needs root (mmdebstrap, chroot)")


def _base(*, refresh: bool) -> Path:
    """The two Debian trees, built together from the same package versions: the runtime
    layer (runtime.tar) and the builder (build/, a directory to chroot into)."""
    base = _base_dir()
    bases, key = base.parent, base.name
    if (base / "complete").exists() and not refresh:
        return base
    _need_root()
    # umoci too, which writes the archive later: one apt-get run
    _require({"mmdebstrap": "mmdebstrap", "chroot": "coreutils", "umoci": "umoci"})
    bases.mkdir(parents=True, exist_ok=True)
    partial = bases / f".{key}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    started = time.monotonic()
    _log(f"building the Debian {SUITE} runtime tree (python3)")
    raw = partial / "runtime-raw.tar"
    user = f"echo '{PASSWD_ENTRY}' >> \"$1/etc/passwd\"; echo '{GROUP_ENTRY}' >> \"$1/etc/group\""
    _mmdebstrap("custom", RUNTIME_PACKAGES, raw, user)
    packages = _strip_runtime(raw, partial / "runtime.tar")
    raw.unlink()
    (partial / "packages.txt").write_text("\n".join(packages) + "\n")
    # The builder pins every runtime package to the version just installed: the venv's
    # interpreter is a link to /usr/bin/python3, which must be the same on both sides.
    _log(f"building the Debian {SUITE} builder tree (gcc, Python headers)")
    _mmdebstrap("essential", [*packages, *BUILD_PACKAGES], partial / "build")
    (partial / "complete").write_text(f"{time.monotonic() - started:.0f}s\n")
    old = bases / f".{key}.old"
    shutil.rmtree(old, ignore_errors=True)
    if base.exists():
        base.rename(old)
    partial.rename(base)
    for stale in bases.iterdir():
        if stale != base:
            shutil.rmtree(stale, ignore_errors=True)
    return base


def _chroot(tree: Path, argv: Sequence[str], env: dict[str, str] | None = None) -> None:
    clean = {"PATH": _CHROOT_PATH, "HOME": "/root", "LANG": "C.UTF-8"}
    clean |= {
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PIP_NO_INPUT": "1",
        "PIP_NO_CACHE_DIR": "1",
        "PIP_ROOT_USER_ACTION": "ignore",
    }
    clean |= env or {}
    _run(["chroot", tree, "/usr/bin/env", "-i", *(f"{k}={v}" for k, v in clean.items()), *argv])


def _sync(src: Path, dest: Path) -> None:
    """Copy the files of src that dest lacks (hard links where they can be)."""
    src.mkdir(parents=True, exist_ok=True)
    dest.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and not (dest / f.name).exists():
            try:
                os.link(f, dest / f.name)
            except OSError:
                shutil.copy2(f, dest / f.name)


def _network_env(tree: Path) -> dict[str, str]:
    """What pip inside the builder needs to reach the package index the host reaches: name
    resolution, the host's CA bundle, its proxy and index settings."""
    shutil.copy2("/etc/resolv.conf", tree / "etc" / "resolv.conf")
    env = {
        k: v
        for k, v in os.environ.items()
        if k.lower() in ("http_proxy", "https_proxy", "no_proxy", "all_proxy")
        or k in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_TRUSTED_HOST")
    }
    bundle = next(
        (
            Path(p)
            for p in (os.environ.get("PIP_CERT"), "/etc/ssl/certs/ca-certificates.crt")
            if p and Path(p).is_file()
        ),
        None,
    )
    if bundle is not None:
        shutil.copy2(bundle, tree / "etc" / "configpin-build-ca.pem")
        env["PIP_CERT"] = "/etc/configpin-build-ca.pem"
    return env


def _signatures(root: Path) -> dict[str, tuple[int, int, int, str]]:
    """(mode, size, mtime, link target) of every file and link under root, by relative path."""
    found = {}
    for path in _walk(root):
        st = (root / path).lstat()
        if not stat.S_ISDIR(st.st_mode):
            target = os.readlink(root / path) if stat.S_ISLNK(st.st_mode) else ""
            found[path] = (st.st_mode, st.st_size, st.st_mtime_ns, target)
    return found


def _copy_sources(src: Path) -> None:
    src.mkdir()
    for name in CONFIGPIN_INPUTS:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(
                path,
                src / name,
                ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.so", "*.egg-info"),
            )
        else:
            shutil.copy2(path, src / name)


def _fetch_wheels(tree: Path, lock_key: str) -> None:
    """The wheels of both locks in the builder's wheelhouse: downloaded once per lock (by the
    builder's own pip, which picks the files for the builder's Python), kept in the cache."""
    wheels = cache_dir() / "wheels"
    wheelhouse = tree / _WHEELHOUSE[1:]
    _sync(wheels, wheelhouse)
    got = wheels / f"complete-{lock_key}"
    if got.exists():
        return
    _log("downloading the locked wheels")
    env = _network_env(tree)
    download = ["/opt/build/bin/pip", "download", "--quiet", "--require-hashes", "--no-deps"]
    download += ["--only-binary=:all:", "--dest", _WHEELHOUSE]
    try:
        for lock in ("requirements-build.lock", "requirements.lock"):
            _chroot(tree, [*download, "-r", f"/src/{lock}"], env)
    finally:
        for f in ("etc/resolv.conf", "etc/configpin-build-ca.pem"):
            (tree / f).unlink(missing_ok=True)
    _sync(wheelhouse, wheels)
    got.touch()


def _build_configpin(work: Path, dest: Path) -> Path:
    """The Dockerfile's builder stage in the builder tree, then the image: the runtime tree,
    the venv with the locked dependencies, configpin's own files (three layers; the first two
    are reused until the Debian base or the locks change)."""
    _need_root()
    base = _base_dir()
    tree = base / "build"
    venv = tree / VENV[1:]
    for leftover in ("opt/configpin", "src", "wheels"):
        shutil.rmtree(tree / leftover, ignore_errors=True)
    _copy_sources(tree / "src")

    locks = hashlib.sha256()
    _digest_files(locks, REPO, [REPO / "requirements.lock", REPO / "requirements-build.lock"])
    h = hashlib.sha256((base / "packages.txt").read_bytes() + locks.digest())
    _digest_files(h, REPO, [Path(__file__).resolve()])
    deps_key = h.hexdigest()[:20]
    deps_layer = base / f"deps-{deps_key}.tar"
    deps_venv = tree / "opt" / f".configpin-deps-{deps_key}"
    pip = ["/opt/build/bin/pip"]
    into_venv = [*pip, "--python", f"{VENV}/bin/python", "install", "--quiet"]
    if deps_layer.is_file() and deps_venv.is_dir():
        shutil.copytree(deps_venv, venv, symlinks=True)
    else:
        for stale in [*base.glob("deps-*.tar"), *tree.glob("opt/.configpin-deps-*")]:
            if stale.is_dir():
                shutil.rmtree(stale)
            else:
                stale.unlink()
        for leftover in ("opt/build", _WHEELHOUSE[1:]):
            shutil.rmtree(tree / leftover, ignore_errors=True)
        # The build backend in a venv of its own (setuptools, mypy for mypyc), and the
        # runtime venv without pip: the build venv's pip installs into it.
        _chroot(tree, ["python3", "-m", "venv", "/opt/build"])
        _fetch_wheels(tree, locks.hexdigest()[:20])
        offline = ["--no-index", "--find-links", _WHEELHOUSE, "--require-hashes", "--no-deps"]
        offline += ["--only-binary=:all:"]
        _log("installing the locked dependencies")
        _chroot(tree, [*pip, "install", "--quiet", *offline, "-r", "/src/requirements-build.lock"])
        _chroot(tree, ["python3", "-m", "venv", "--without-pip", VENV])
        _chroot(tree, [*into_venv, *offline, "-r", "/src/requirements.lock"])
        _tar_paths(tree, deps_layer.with_suffix(".partial"), _walk(tree, VENV[1:]))
        shutil.copytree(venv, deps_venv, symlinks=True)
        deps_layer.with_suffix(".partial").rename(deps_layer)

    # Then configpin itself, as a wheel with its core compiled (CONFIGPIN_COMPILE=1: compiled
    # or no image), installed without resolving anything.
    _log("compiling configpin's wheel")
    before = _signatures(venv)
    wheel_argv = [*pip, "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--no-index"]
    wheel_argv += ["--wheel-dir", "/wheels", "/src"]
    _chroot(tree, wheel_argv, {"CONFIGPIN_COMPILE": "1"})
    (wheel,) = (tree / "wheels").glob("configpin-*.whl")
    _chroot(tree, [*into_venv, "--no-deps", "--no-index", f"/wheels/{wheel.name}"])
    _chroot(tree, [*pip, "--python", f"{VENV}/bin/python", "check"])
    if not list(venv.glob("lib/python3*/site-packages/webhook/core/*.so")):
        raise RuntimeError(f"{wheel.name} has no compiled module in webhook/core")
    after = _signatures(venv)
    added = [f"{VENV[1:]}/{p}" for p, sig in after.items() if before.get(p) != sig]
    if set(before) - set(after):
        raise RuntimeError(f"installing {wheel.name} removed files of the dependencies' layer")
    app = _tar_paths(tree, work / "configpin.tar", added)

    layers = [
        Layer(base / "runtime.tar", f"mmdebstrap --variant=custom {SUITE}: python3"),
        Layer(deps_layer, f"{VENV}: requirements.lock"),
        Layer(app, f"{VENV}: {wheel.name}"),
    ]
    return write_archive(CONFIGPIN, layers, dest)


# --- ensure --------------------------------------------------------------------------------


_BUILDERS: dict[str, Callable[[Path, Path], Path]] = {
    PAUSE.name: _build_pause,
    SHELL.name: _build_shell,
    CONFIGPIN.name: _build_configpin,
}


def inputs_key(image: Image) -> str | None:
    """The hash of everything the image is built from, as the cache holds it now (None while
    a download it needs, busybox's .deb or the Debian base, is not there)."""
    if image == PAUSE:
        return _pause_inputs()
    if image == SHELL:
        deb = _cached_busybox()
        return None if deb is None else _shell_inputs(deb)
    if image == CONFIGPIN:
        base = _base_dir()
        return _configpin_inputs(base) if (base / "complete").exists() else None
    raise ValueError(f"unknown image {image!r}")


def _stamp(archive: Path) -> Path:
    return archive.with_name(archive.name + ".inputs")


def is_current(image: Image, out_dir: Path | None = None) -> bool:
    """Whether the archive in out_dir was built from the inputs there are now."""
    out = (out_dir or DEFAULT_OUT) / image.filename
    stamp = _stamp(out)
    key = inputs_key(image)
    return (
        key is not None and out.is_file() and stamp.is_file() and stamp.read_text().strip() == key
    )


def _place(built: Path, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f".{out.name}.{os.getpid()}.partial")
    partial.unlink(missing_ok=True)
    try:
        os.link(built, partial)
    except OSError:
        shutil.copy2(built, partial)
    partial.replace(out)


def ensure(image: Image, out_dir: Path | None = None, *, refresh: bool = False) -> Path:
    """The image's archive in out_dir (default build/images), built if it is missing or its
    inputs changed; ``refresh`` rebuilds it and its Debian base from the newest packages.

    Safe to call from several processes at once: one builds, the others wait and reuse it.
    """
    out = (out_dir or DEFAULT_OUT) / image.filename
    stamp = _stamp(out)
    with _locked(image.name):
        if image == SHELL:
            _busybox_deb(refresh=refresh)
        elif image == CONFIGPIN:
            _base(refresh=refresh)
        if not refresh and is_current(image, out_dir):
            return out
        key = inputs_key(image)
        assert key is not None
        built_dir = cache_dir() / "built"
        built = built_dir / f"{image.name}-{key[:20]}.oci.tar"
        if refresh or not built.is_file():
            _log(f"building {image.ref}")
            started = time.monotonic()
            built_dir.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(prefix=f"{image.name}-", dir=cache_dir()) as work:
                _BUILDERS[image.name](Path(work), built)
            # Keep the newest two archives of each image.
            others = sorted(
                (p for p in built_dir.glob(f"{image.name}-*.oci.tar") if p != built),
                key=lambda p: p.stat().st_mtime,
            )
            for old in others[:-1]:
                old.unlink()
            size = built.stat().st_size / 2**20
            _log(f"{image.ref}: {size:.1f} MiB in {time.monotonic() - started:.0f} s")
        stamp.unlink(missing_ok=True)
        _place(built, out)
        stamp.write_text(key + "\n")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m harness.images",
        description="Build OCI image archives from Debian's packages (no Docker, no registry).",
    )
    parser.add_argument("image", choices=[*IMAGES, "all"])
    parser.add_argument("--out", type=Path, default=None, help=f"default: {DEFAULT_OUT}")
    parser.add_argument(
        "--refresh",
        action="store_true",
        help="rebuild from the newest Debian packages (the Debian trees are otherwise cached)",
    )
    args = parser.parse_args(argv)
    chosen = list(IMAGES.values()) if args.image == "all" else [IMAGES[args.image]]
    for image in chosen:
        path = ensure(image, args.out, refresh=args.refresh)
        print(f"{path}\t{image.ref}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
