"""The user's kubeconfig as kubectl reads it (webhook.kube.user): a `KUBECONFIG` list merged,
the first file to set each name and `current-context` winning, missing and empty files
skipped. Before, only the list's first file was read: a context kept in one file and its
cluster in another (as `kubectl config` tooling and cloud CLIs write them) did not connect."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import yaml

from webhook.kube.user import connect_as_user, kubeconfig_names


def _file(path: Path, **body: object) -> str:
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Config", **body}))
    return str(path)


def _cluster(name: str, server: str) -> dict[str, object]:
    return {"name": name, "cluster": {"server": server}}


def _context(name: str, cluster: str, namespace: str | None = None) -> dict[str, object]:
    ctx: dict[str, object] = {"cluster": cluster, "user": "me"}
    if namespace:
        ctx["namespace"] = namespace
    return {"name": name, "context": ctx}


USER = {"name": "me", "user": {"token": "not-a-secret"}}


@pytest.fixture
def listed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """KUBECONFIG: a missing file, an empty one, the user's own context, then the shared file
    with the clusters (and a current-context of its own, which loses to the first)."""
    (tmp_path / "empty").write_text("")
    mine = _file(
        tmp_path / "mine",
        contexts=[_context("mine", "prod", "team-a")],
        **{"current-context": "mine"},
    )
    shared = _file(
        tmp_path / "shared",
        clusters=[_cluster("prod", "https://127.0.0.1:6443"), _cluster("dev", "https://[::1]:1")],
        contexts=[_context("theirs", "dev"), _context("mine", "dev", "not-this")],
        users=[USER],
        **{"current-context": "theirs"},
    )
    later = _file(tmp_path / "later", clusters=[_cluster("prod", "https://127.0.0.2:1")])
    paths = [str(tmp_path / "missing"), str(tmp_path / "empty"), mine, shared, later]
    monkeypatch.setenv("KUBECONFIG", ":".join(paths))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    return tmp_path


def test_a_kubeconfig_list_is_merged_the_first_file_to_set_a_name_winning(listed: Path) -> None:
    api, namespace = connect_as_user(None, None)
    assert api.host == "https://127.0.0.1:6443"  # prod, as the shared file says
    assert namespace == "team-a"  # the first current-context, and the first "mine"
    assert api.headers()["authorization"] == "Bearer not-a-secret"  # the user: me


def test_a_context_asked_for_is_looked_up_in_the_merged_list(listed: Path) -> None:
    api, namespace = connect_as_user(None, "theirs")
    assert api.host == "https://[::1]:1"
    assert namespace == "default"


def test_kubeconfig_names_one_file_as_kubectls_does(listed: Path) -> None:
    api, _ = connect_as_user(listed / "shared", None)
    assert api.host == "https://[::1]:1"  # its own current-context: theirs


def test_the_user_and_context_the_kubeconfig_names_are_the_connections(listed: Path) -> None:
    """(The dashboard says them where the API server has no SelfSubjectReview.)"""
    assert kubeconfig_names(argparse.Namespace()) == ("me", "mine")
    assert kubeconfig_names(argparse.Namespace(context="theirs")) == ("me", "theirs")
    assert kubeconfig_names(argparse.Namespace(as_user="bob")) == ("bob", "mine")
    missing = argparse.Namespace(kubeconfig=listed / "nothing-here")
    assert kubeconfig_names(missing) == ("", "")
