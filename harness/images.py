"""Container images as OCI archives, built from Debian's packages with no Docker daemon and no
registry: configpin's own image and the test node's two images.

    python -m harness.images {configpin,pause,shell,all} [--out DIR] [--refresh]

- ``configpin`` (``make image``): Debian bookworm's python3, the runtime dependencies from
  requirements.lock (``--require-hashes``) in a venv at /opt/configpin, configpin's wheel with
  its core compiled by mypyc (``CONFIGPIN_COMPILE=1``), bytecode compiled at install time; the
  user, entrypoint, environment, working directory and port of the Dockerfile's final stage. The
  wheel is built in a second Debian tree that has gcc and the Python headers; only the venv
  leaves it, as in the Dockerfile's builder stage.
- ``pause``: a static program (hack/images/pause.c) that sleeps until SIGTERM or SIGINT and
  reaps children: the node's sandbox image.
- ``shell``: Debian's busybox-static with its applet links (sh, cat, env, httpd, ...), for the
  tests' application pods.

The tools: mmdebstrap writes the Debian trees (as root: chroot, maintainer scripts run as in
any Debian install), umoci writes the OCI layout (manifest, config, layer blobs), and the
layout is packed into one tar that ``ctr -n k8s.io images import`` takes; its index names the
image ``Image.ref`` (``io.containerd.image.name``). Missing tools are installed with apt-get.

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
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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


def _sudo(argv: list[str]) -> list[str]:
    return argv if os.geteuid() == 0 else ["sudo", *argv]


def _apt_install(packages: Iterable[str]) -> None:
    wanted = sorted(set(packages))
    if not wanted:
        return
    _log(f"installing {' '.join(wanted)} with apt-get")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    quiet = {"stdout": subprocess.DEVNULL}
    lock_wait = ["-o", "DPkg::Lock::Timeout=600"]
    _run(_sudo(["apt-get", "update", "-qq"]), env=env, **quiet)
    # Another build installing at the same moment holds dpkg's lock: wait for it.
    _run(
        _sudo(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *lock_wait, *wanted]),
        env=env,
        **quiet,
    )


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
        h.update(str(path.relative_to(root)).encode() + b"\0")
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


def _tar_tree(root: Path, out: Path, *, mtime: int | None = None, top: str = ".") -> Path:
    """A layer of the tree under root (every entry owned by root; file times kept unless mtime
    is given: the venv's bytecode is checked against its sources' times)."""
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
        parts = Path(top).parts
        # the parents of `top` as directories of their own, then `top` with everything in it
        for depth in range(1, len(parts)):
            tar.add(
                root.joinpath(*parts[:depth]),
                "/".join(parts[:depth]),
                recursive=False,
                filter=_normalize(mtime),
            )
        for child in sorted((root / top).iterdir()) if top == "." else [root / top]:
            tar.add(child, str(child.relative_to(root)), filter=_normalize(mtime))
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
    layer = _tar_tree(root, work / "layer.tar", mtime=0)
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


def _busybox_deb(*, refresh: bool) -> Path:
    """Debian's busybox-static .deb, downloaded once and kept (``refresh``: the newest)."""
    where = cache_dir() / "busybox"
    where.mkdir(parents=True, exist_ok=True)
    debs = sorted(where.glob("busybox-static_*.deb"), key=lambda p: p.stat().st_mtime)
    if debs and not refresh:
        return debs[-1]
    options = _apt_options(cache_dir() / "apt")
    _log("downloading busybox-static")
    _run(["apt-get", *options, "update", "-qq"], stdout=subprocess.DEVNULL)
    before = set(where.glob("*.deb"))
    _run(["apt-get", *options, "download", "-qq", "busybox-static"], cwd=where)
    new = set(where.glob("busybox-static_*.deb")) - before
    deb = max(new or where.glob("busybox-static_*.deb"), key=lambda p: p.stat().st_mtime)
    for old in where.glob("busybox-static_*.deb"):
        if old != deb:
            old.unlink()
    return deb


def _shell_inputs(deb: Path) -> str:
    h = hashlib.sha256(b"shell\0" + deb.name.encode() + b"\0")
    h.update(hashlib.sha256(deb.read_bytes()).digest())
    _digest_files(h, REPO, [Path(__file__).resolve()])
    return h.hexdigest()


_PASSWD = "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
_GROUP = "root:x:0:\nnogroup:x:65534:\n"


def _build_shell(work: Path, dest: Path, deb: Path) -> Path:
    _require({"dpkg-deb": "dpkg"})
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
    layer = _tar_tree(root, work / "layer.tar", mtime=0)
    return write_archive(SHELL, [Layer(layer, f"busybox-static {deb.name} --list-full")], dest)


# --- ensure --------------------------------------------------------------------------------


def _recipe(image: Image, *, refresh: bool) -> tuple[str, Callable[[Path, Path], Path]]:
    """The hash of the image's inputs, and how to build it (work dir, destination)."""
    if image == PAUSE:
        return _pause_inputs(), _build_pause
    if image == SHELL:
        deb = _busybox_deb(refresh=refresh)
        return _shell_inputs(deb), lambda work, dest: _build_shell(work, dest, deb)
    if image == CONFIGPIN:
        raise NotImplementedError("configpin's image is not built here yet")
    raise ValueError(f"unknown image {image!r}")


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
    stamp = out.with_name(out.name + ".inputs")
    with _locked(image.name):
        key, build = _recipe(image, refresh=refresh)
        if not refresh and out.is_file() and stamp.is_file() and stamp.read_text().strip() == key:
            return out
        built_dir = cache_dir() / "built"
        built = built_dir / f"{image.name}-{key[:20]}.oci.tar"
        if refresh or not built.is_file():
            _log(f"building {image.ref}")
            started = time.monotonic()
            built_dir.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(prefix=f"{image.name}-", dir=cache_dir()) as work:
                build(Path(work), built)
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
    chosen = [PAUSE, SHELL] if args.image == "all" else [IMAGES[args.image]]
    for image in chosen:
        path = ensure(image, args.out, refresh=args.refresh)
        print(f"{path}\t{image.ref}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
