"""A newcomer's first minute: the README's two commands, as the README writes them, and the
package as a user installs it.

- The README opens with two commands; CI (`.ci/run`) runs the second, the whole suite.
- The first, run as written in a shell with no cluster configured (no KUBECONFIG, a HOME
  without ~/.kube), serves the embedded default on loopback only and answers a review of a
  Deployment that consumes it with the patch `configpin render` makes with the same key.
- With KUBECONFIG and ~/.kube/config naming a cluster, it still serves the embedded default:
  it never dials the cluster (tests/integration/test_first_command.py proves, against a real
  API server, that nothing there changes).
- The wheel, built from the checkout and installed into a fresh venv with the lock's
  dependencies, serves the embedded default too: its package data ships where the code reads
  it (importlib.resources), not only in the source tree.

These run from the checkout (the pure-Python run of the unit suite): the compiled run's tree
has no Makefile, and builds nothing of its own.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.firstrun import (
    EMBEDDED_CONSUMER_SOURCES,
    build_wheel,
    create_review,
    embedded_consumer,
    listening_addresses,
    patched,
    post_review,
    readme_commands,
    serving,
)
from webhook.core.constants import ANN_CHECKSUM, ANN_SOURCES
from webhook.process.digestkey import KEY_FILE_NAME

REPO = Path(__file__).resolve().parents[3]
README = REPO / "README.md"

pytestmark = pytest.mark.skipif(
    os.environ.get("CONFIGPIN_EXPECT_COMPILED") == "1",
    reason="the README's commands and the wheel's install run from the checkout (pure run)",
)


def _template_annotations(obj: dict[str, Any]) -> dict[str, str]:
    annotations: dict[str, str] = obj["spec"]["template"]["metadata"].get("annotations") or {}
    return annotations


def _rendered(obj: dict[str, Any], key_file: Path, tmp: Path) -> dict[str, str]:
    """The template annotations `configpin render` gives `obj` over the embedded sources."""
    manifest = tmp / "app.yaml"
    manifest.write_text(yaml.safe_dump(obj))
    done = subprocess.run(
        [
            sys.executable, "-m", "webhook", "render",
            "-f", str(REPO / "webhook" / "embedded" / "sources.yaml"), "-f", str(manifest),
            "--digest-key-file", str(key_file), "--namespace", "default",
        ],
        capture_output=True, text=True, check=True, cwd=tmp,
    )  # fmt: skip
    [rendered] = [d for d in yaml.safe_load_all(done.stdout) if d and d["kind"] == "Deployment"]
    return _template_annotations(rendered)


def _assert_pinned_to_the_embedded_sources(answer: dict[str, Any], obj: dict[str, Any]) -> None:
    annotations = _template_annotations(patched(answer, obj))
    recorded = yaml.safe_load(annotations[ANN_SOURCES])
    assert sorted(recorded) == sorted(EMBEDDED_CONSUMER_SOURCES)
    assert all(len(d) == 64 and int(d, 16) >= 0 for d in recorded.values()), recorded
    assert len(annotations[ANN_CHECKSUM]) == 64
    assert not answer["response"].get("warnings"), answer["response"]["warnings"]


def test_the_readme_opens_with_the_two_commands_and_ci_runs_the_second() -> None:
    commands = readme_commands(README)
    assert len(commands) == 2, commands
    assert commands[0].split()[:2] == ["make", "run"], commands
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    [runs] = [line.removeprefix("exec ").strip() for line in ci if line.startswith("exec ")]
    assert runs == commands[1], f".ci/run runs {runs!r}, the README says {commands[1]!r}"


def test_the_first_command_as_written_serves_the_embedded_default_on_loopback(
    tmp_path: Path,
) -> None:
    run = readme_commands(README)[0]
    obj = embedded_consumer()
    with serving(run, cwd=REPO, workdir=tmp_path) as served:
        assert listening_addresses(served.port) == {"127.0.0.1"}
        answer = post_review(served, create_review(obj))
        _assert_pinned_to_the_embedded_sources(answer, obj)
        expected = _rendered(obj, served.certs / KEY_FILE_NAME, tmp_path)
        assert _template_annotations(patched(answer, obj)) == expected
        assert "embedded default" in served.output()
    assert "Traceback" not in served.output(), served.output()


def test_the_first_command_acts_on_no_cluster_that_kubeconfig_names(tmp_path: Path) -> None:
    """KUBECONFIG, and ~/.kube/config, name a cluster that would refuse every connection: the
    server serves the embedded default all the same, and says it did not use them."""
    cluster = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "prod", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "me", "user": {"token": "not-a-token"}}],
        "contexts": [{"name": "prod", "context": {"cluster": "prod", "user": "me"}}],
        "current-context": "prod",
    }
    kubeconfig = tmp_path / "prod.kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(cluster))
    (tmp_path / "home" / ".kube").mkdir(parents=True)
    shutil.copy(kubeconfig, tmp_path / "home" / ".kube" / "config")
    obj = embedded_consumer()
    run = readme_commands(README)[0]
    with serving(run, cwd=REPO, workdir=tmp_path, env={"KUBECONFIG": str(kubeconfig)}) as served:
        assert listening_addresses(served.port) == {"127.0.0.1"}
        _assert_pinned_to_the_embedded_sources(post_review(served, create_review(obj)), obj)
        log = served.output()
    assert "KUBECONFIG is set and not used" in log
    assert "127.0.0.1:1" not in log


def test_the_wheel_in_a_fresh_venv_serves_the_embedded_default(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path)
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    pip = [str(env_dir / "bin" / "python"), "-m", "pip", "--disable-pip-version-check"]
    # the lock's exact versions and hashes, as the image installs them; then the wheel alone
    lock = ["install", "--quiet", "--require-hashes", "--no-deps", "--only-binary=:all:"]
    subprocess.run([*pip, *lock, "-r", str(REPO / "requirements.lock")], check=True)
    subprocess.run([*pip, "install", "--quiet", "--no-deps", str(wheel)], check=True)
    subprocess.run([*pip, "check"], check=True)
    where = tmp_path / "elsewhere"  # neither the checkout nor anything beside it
    where.mkdir()
    probe = [str(env_dir / "bin" / "python"), "-c", "import webhook; print(webhook.__file__)"]
    imported = subprocess.run(probe, cwd=where, capture_output=True, text=True, check=True)
    assert Path(imported.stdout.strip()).is_relative_to(env_dir), imported.stdout
    obj = embedded_consumer()
    with serving([str(env_dir / "bin" / "configpin"), "serve"], cwd=where, workdir=where) as served:
        _assert_pinned_to_the_embedded_sources(post_review(served, create_review(obj)), obj)
        assert "embedded default" in served.output()
