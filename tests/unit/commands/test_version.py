"""`configpin version` prints, as `kubectl version` prints the server's beside its own, the
configpin the chart runs in the cluster (its Deployment's version label, image, ready replicas)
and the API server's version; what it cannot read (no cluster, no right to list Deployments
everywhere, a server that does not answer) it says, and it exits 0 all the same. Before, it
printed the client's version alone."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.kube.fakeapi import FakeAPI, serve
from webhook import __version__
from webhook.commands.cli import main

SELECTOR = "app.kubernetes.io/part-of=configpin,app.kubernetes.io/component=admission-webhook"
KUBERNETES = {"major": "1", "minor": "36", "gitVersion": "v1.36.2", "platform": "linux/amd64"}


def _deployment(namespace: str, name: str, image: str, **labels: str) -> dict[str, Any]:
    return {
        "metadata": {"namespace": namespace, "name": name, "labels": labels},
        "spec": {
            "replicas": 2,
            "template": {"spec": {"containers": [{"name": "configpin", "image": image}]}},
        },
        "status": {"readyReplicas": 1},
    }


FORBIDDEN = {"kind": "Status", "reason": "Forbidden", "message": "deployments.apps is forbidden"}


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeAPI]:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBECONFIG", raising=False)
    yield from serve(FakeAPI())


def _version(fake: FakeAPI, tmp_path: Path, *args: str) -> list[str]:
    return ["version", "--kubeconfig", str(fake.kubeconfig(tmp_path)), *args]


def test_version_says_the_clusters_configpin_and_kubernetes(
    fake: FakeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake.answers["/version"] = (200, KUBERNETES)
    dep = _deployment(
        "configpin",
        "configpin",
        "ghcr.io/example/configpin:0.1.1",
        **{"app.kubernetes.io/version": "0.1.0"},
    )
    fake.answers["/apis/apps/v1/deployments"] = (200, {"items": [dep]})
    assert main(_version(fake, tmp_path)) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"Client Version: {__version__}",
        "Server Version: 0.1.0 (Deployment configpin/configpin, image "
        "ghcr.io/example/configpin:0.1.1, 1/2 ready)",
        "Kubernetes Version: v1.36.2",
    ]
    [listed] = [s for s in fake.seen if s.path == "/apis/apps/v1/deployments"]
    assert listed.query["labelSelector"] == [SELECTOR]  # the chart's labels


def test_version_as_json_and_yaml(
    fake: FakeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake.answers["/version"] = (200, KUBERNETES)
    dep = _deployment("ops", "cp", "registry.local:5000/configpin:0.2.0")  # no version label
    fake.answers["/apis/apps/v1/deployments"] = (200, {"items": [dep]})
    assert main(_version(fake, tmp_path, "-o", "json")) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["clientVersion"]["version"] == __version__
    assert doc["kubernetesVersion"] == KUBERNETES
    assert doc["serverVersion"] == [
        {
            "namespace": "ops",
            "name": "cp",
            "version": "0.2.0",  # the image's tag (a registry's port is not one)
            "image": "registry.local:5000/configpin:0.2.0",
            "replicas": 2,
            "readyReplicas": 1,
        }
    ]
    assert "problems" not in doc
    assert main(_version(fake, tmp_path, "-o", "yaml")) == 0
    assert yaml.safe_load(capsys.readouterr().out) == doc


def test_a_user_who_may_not_list_everywhere_is_answered_from_configpins_namespace(
    fake: FakeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake.answers["/version"] = (200, KUBERNETES)
    fake.answers["/apis/apps/v1/deployments"] = (403, FORBIDDEN)
    assert main(_version(fake, tmp_path)) == 0
    out = capsys.readouterr().out
    assert "Server Version: none installed (no Deployment labelled" in out
    assert "/apis/apps/v1/namespaces/configpin/deployments" in fake.paths()


def test_what_cannot_be_read_is_said_and_the_exit_is_0(
    fake: FakeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake.answers["/version"] = (200, KUBERNETES)
    fake.answers["/apis/apps/v1/namespaces/shop/deployments"] = (403, FORBIDDEN)
    assert main(_version(fake, tmp_path, "-n", "shop")) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith("Server Version: unknown (cannot list its Deployments: GET ")
    assert "403 Forbidden" in out[1]
    assert out[2] == "Kubernetes Version: v1.36.2"


def test_no_cluster_or_a_server_that_does_not_answer_is_said_and_the_exit_is_0(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    monkeypatch.setenv("HOME", str(tmp_path))
    assert main(["version", "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["serverVersion"] is None and doc["kubernetesVersion"] is None
    assert doc["problems"]["serverVersion"].startswith("no cluster: ")

    fake = FakeAPI()
    for _ in serve(fake):
        kubeconfig = fake.kubeconfig(tmp_path)
    # the server is gone: connection refused, said once for each part
    assert main(["version", "--kubeconfig", str(kubeconfig)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith("Server Version: unknown (GET /version: ")
    assert out[2].startswith("Kubernetes Version: unknown (GET /version: ")


def test_version_client_reads_no_cluster(
    fake: FakeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_version(fake, tmp_path, "--client")) == 0
    assert capsys.readouterr().out == f"Client Version: {__version__}\n"
    assert fake.seen == []
