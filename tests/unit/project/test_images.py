"""The image builder (harness/images.py): configpin's image against the Dockerfile's final
stage, so that the two cannot drift, and what the archives hold and are named.

The pause image (a static C program, about a second) is built here every run, in a cache of
the test's own. configpin's image takes a minute or more from a cold cache (two Debian trees,
mypyc): its archive is read from build/images when `make image` built it from the current
sources, and built by the test with CONFIGPIN_TEST_IMAGE=1; otherwise that test is skipped and
says so. Whether the images run under containerd is the node suite's business.
"""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

from harness import images
from harness.images import CONFIGPIN, PAUSE, Archive, dockerfile_stages, read_archive

REPO = images.REPO


def dockerfile_runtime() -> list[tuple[str, str]]:
    return dockerfile_stages()[-1]


def dockerfile_config() -> dict[str, Any]:
    """The image config the Dockerfile's final stage sets, ``$PATH`` being the base's."""
    runtime = dockerfile_runtime()
    env: dict[str, str] = {}
    for instruction, args in runtime:
        if instruction == "ENV":
            for word in shlex.split(args):
                name, _, value = word.partition("=")
                env[name] = value.replace("$PATH", images.BASE_PATH)
    (user,) = [a for i, a in runtime if i == "USER"]
    (workdir,) = [a for i, a in runtime if i == "WORKDIR"]
    (entrypoint,) = [json.loads(a) for i, a in runtime if i == "ENTRYPOINT"]
    (cmd,) = [json.loads(a) for i, a in runtime if i == "CMD"]
    ports = {
        f"{p}/tcp" if "/" not in p else p for i, a in runtime if i == "EXPOSE" for p in a.split()
    }
    return {
        "User": user,
        "Env": env,
        "Entrypoint": entrypoint,
        "Cmd": cmd,
        "WorkingDir": workdir,
        "ExposedPorts": ports,
    }


def as_comparable(config: dict[str, Any]) -> dict[str, Any]:
    return {
        "User": config.get("User"),
        "Env": dict(e.split("=", 1) for e in config.get("Env", [])),
        "Entrypoint": config.get("Entrypoint"),
        "Cmd": config.get("Cmd"),
        "WorkingDir": config.get("WorkingDir"),
        "ExposedPorts": set(config.get("ExposedPorts", {})),
    }


# --- configpin's image and the Dockerfile --------------------------------------------------


def test_configpin_image_config_is_the_dockerfiles() -> None:
    ours = as_comparable(CONFIGPIN.config.as_oci())
    theirs = dockerfile_config()
    # LANG: set by the Dockerfile's python base image, not by the Dockerfile
    assert ours["Env"].pop("LANG") == "C.UTF-8"
    assert ours == theirs


def test_configpin_image_user_and_venv_are_the_dockerfiles() -> None:
    runtime = dockerfile_runtime()
    (run,) = [a for i, a in runtime if i == "RUN" and "useradd" in a]
    commands = [shlex.split(c) for c in run.split("&&")]
    (groupadd,) = [c for c in commands if c[0] == "groupadd"]
    (useradd,) = [c for c in commands if c[0] == "useradd"]
    words = iter(useradd[1:-1])
    opts = {w: next(words) for w in words if w in ("--uid", "--gid", "--home-dir", "--shell")}
    name, _, uid, gid, _, home, shell = images.PASSWD_ENTRY.split(":")
    assert useradd[-1] == name == "configpin"
    assert (opts["--uid"], opts["--gid"], opts["--home-dir"], opts["--shell"]) == (
        uid,
        gid,
        home,
        shell,
    )
    assert groupadd[1:] == ["--gid", gid, name]
    assert f"{name}:x:{gid}:" == images.GROUP_ENTRY
    copies = [a for i, a in runtime if i == "COPY"]
    assert copies == [f"--from=builder {images.VENV} {images.VENV}"]


def test_configpin_image_is_built_from_what_the_dockerfile_copies() -> None:
    """The builder reads the Dockerfile's build context, less the tests and certificates;
    every input is in the hash that decides a rebuild."""
    build = dockerfile_stages()[0]
    copied = {
        word.rstrip("/")
        for i, a in build
        if i == "COPY"
        for word in a.split()[:-1]
        if not word.startswith("--")
    }
    assert copied == set(images.CONFIGPIN_INPUTS)


# --- the pause image, built here -----------------------------------------------------------


@pytest.fixture
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "cache"
    monkeypatch.setenv("CONFIGPIN_CACHE_DIR", str(cache))
    return cache


def members(archive: Archive) -> dict[str, tarfile.TarInfo]:
    return {m.name.removeprefix("./"): m for _, m in archive.layer_members()}


def test_pause_archive(own_cache: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    path = images.ensure(PAUSE, out)
    assert path == out / "pause.oci.tar"
    archive = read_archive(path)  # every blob checked against its digest
    assert archive.name == PAUSE.ref == "localhost/configpin-test/pause:1"
    (entry,) = archive.index["manifests"]
    assert entry["annotations"][images.ANNOTATION_REF_NAME] == "1"
    assert archive.config["os"] == "linux"
    assert archive.config["config"]["Entrypoint"] == ["/pause"]
    assert archive.config["config"]["User"] == "65535:65535"
    found = members(archive)
    assert set(found) == {"pause"}
    assert found["pause"].mode & 0o777 == 0o755
    assert (found["pause"].uid, found["pause"].gid) == (0, 0)

    # static: it runs with no loader and no library, as the only file of its image
    with tarfile.open(path) as outer:
        (layer,) = archive.manifest["layers"]
        blob = outer.extractfile("blobs/sha256/" + layer["digest"].split(":")[1])
        assert blob is not None
        with tarfile.open(fileobj=blob) as tar:
            binary = tar.extractfile("pause")
            assert binary is not None
            (tmp_path / "pause").write_bytes(binary.read())
    (tmp_path / "pause").chmod(0o755)
    assert b"/lib64/ld-linux" not in (tmp_path / "pause").read_bytes()
    done = subprocess.run([tmp_path / "pause", "-v"], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "configpin-test pause 1"

    # again: nothing is rebuilt or rewritten
    capfd.readouterr()
    before = path.stat()
    assert images.ensure(PAUSE, out) == path
    assert "building" not in capfd.readouterr().err
    assert (path.stat().st_ino, path.stat().st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert images.is_current(PAUSE, out)


def test_pause_stops_on_sigterm(tmp_path: Path) -> None:
    binary = tmp_path / "pause"
    subprocess.run(
        ["gcc", "-static", "-Os", "-o", binary, images.PAUSE_SOURCE], check=True, cwd=tmp_path
    )
    with subprocess.Popen([binary], stderr=subprocess.DEVNULL) as proc:
        try:
            with pytest.raises(subprocess.TimeoutExpired):
                proc.wait(timeout=0.3)
            proc.terminate()
            assert proc.wait(timeout=5) == 0
        finally:
            proc.kill()


def test_the_inputs_key_follows_content_not_times(
    own_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "pause.c"
    source.write_bytes(images.PAUSE_SOURCE.read_bytes())
    monkeypatch.setattr(images, "PAUSE_SOURCE", source)
    key = images.inputs_key(PAUSE)
    os.utime(source, (0, 0))
    assert images.inputs_key(PAUSE) == key
    source.write_bytes(source.read_bytes() + b"\n")
    assert images.inputs_key(PAUSE) != key


def test_two_builds_at_once_build_once(own_cache: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "harness.images", "pause", "--out", str(out)]
    procs = [
        subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    results = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], results
    assert {stdout for stdout, _ in results} == {f"{out / 'pause.oci.tar'}\t{PAUSE.ref}\n"}
    assert sum(stderr.count(f"building {PAUSE.ref}") for _, stderr in results) == 1
    read_archive(out / "pause.oci.tar")


# --- configpin's archive, when it is built -------------------------------------------------


@pytest.fixture(scope="module")
def configpin_archive() -> Archive:
    if os.environ.get("CONFIGPIN_TEST_IMAGE") == "1":
        return read_archive(images.ensure(CONFIGPIN))
    if not images.is_current(CONFIGPIN):
        pytest.skip(
            "no build/images/configpin.oci.tar from the current sources: `make image` "
            "(or CONFIGPIN_TEST_IMAGE=1) builds it"
        )
    return read_archive(CONFIGPIN.archive)


def test_configpin_archive_config(configpin_archive: Archive) -> None:
    assert configpin_archive.name == CONFIGPIN.ref
    config = configpin_archive.config["config"]
    assert config == CONFIGPIN.config.as_oci()
    comparable = as_comparable(config)
    comparable["Env"].pop("LANG")
    assert comparable == dockerfile_config()
    assert len(configpin_archive.manifest["layers"]) == 3  # Debian, dependencies, configpin


def test_configpin_archive_contents(configpin_archive: Archive) -> None:
    found = members(configpin_archive)
    site = f"{images.VENV[1:]}/lib/python3.11/site-packages"
    # Debian's interpreter, the venv's link to it, configpin's entry point
    assert found["usr/bin/python3.11"].isfile()
    assert found[f"{images.VENV[1:]}/bin/python3"].linkname == "/usr/bin/python3"
    assert found[f"{images.VENV[1:]}/bin/configpin"].mode & 0o111
    # the core compiled by mypyc
    assert any(n.startswith(f"{site}/webhook/core/") and n.endswith(".so") for n in found)
    # bytecode for every module, so that a read-only root needs no writing
    for name in found:
        if name.endswith(".py") and name.startswith((site, "usr/lib/python3.11/")):
            folder, _, file = name.rpartition("/")
            assert f"{folder}/__pycache__/{file[:-3]}.cpython-311.pyc" in found, name
    # nothing of the build, no package manager at run time, no documentation
    for absent in (
        "usr/bin/gcc",
        "usr/include/python3.11/Python.h",
        "usr/bin/apt-get",
        "usr/bin/perl",
        "opt/build",
        "src",
        f"{images.VENV[1:]}/bin/pip",
        f"{site}/pip",
        f"{site}/setuptools",
        f"{site}/mypy",
    ):
        assert absent not in found, absent
    assert not [n for n in found if n.startswith("var/lib/dpkg/info/") and found[n].isfile()]
    docs = [n for n in found if n.startswith("usr/share/doc/") and found[n].isfile()]
    assert docs and all(n.endswith("/copyright") for n in docs)
    assert not [n for n in found if n.startswith("usr/share/man/") and found[n].isfile()]
    # every file is root's: the user 65532 can change none of them
    assert {m.uid for m in found.values()} == {0}
    files = [m for m in found.values() if m.isfile()]
    assert {m.gid for m in files} == {0}
    assert not [m.name for m in files if m.mode & (stat.S_IWGRP | stat.S_IWOTH)]


def test_configpin_archive_user(configpin_archive: Archive) -> None:
    with tarfile.open(configpin_archive.path) as outer:
        for digest in (layer["digest"] for layer in configpin_archive.manifest["layers"]):
            blob = outer.extractfile("blobs/sha256/" + digest.split(":")[1])
            assert blob is not None
            with tarfile.open(fileobj=blob) as tar:
                names = tar.getnames()
                if "./etc/passwd" in names:
                    passwd = tar.extractfile("./etc/passwd")
                    group = tar.extractfile("./etc/group")
                    assert passwd is not None and group is not None
                    assert images.PASSWD_ENTRY in passwd.read().decode().splitlines()
                    assert images.GROUP_ENTRY in group.read().decode().splitlines()
                    return
    pytest.fail("no /etc/passwd in the image")
