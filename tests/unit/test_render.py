"""`configpin render`: offline mutation of manifests, with the same digests as the server."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import httpx
import jsonpatch
import pytest
import yaml

from tests.unit.conftest import (
    configmap,
    container,
    env_cm,
    envfrom_secret,
    pod_spec,
    recorded_checksum,
    recorded_sources,
    review,
    secret,
    spec_of,
    template_annotations,
    vol_cm,
    vol_secret,
    workload,
)
from webhook.cli import main
from webhook.core.constants import ANN_CHECKSUM, ANN_SOURCES, LABEL_SNAPSHOT, LABEL_SOURCE
from webhook.core.model import JSONObject
from webhook.digestkey import load_key_file
from webhook.metrics import Metrics
from webhook.server.app import create_app
from webhook.server.handler import Admitter
from webhook.server.lifecycle import Lifecycle
from webhook.sources import FileSources

KEY_TEXT = "3f1c0b6a9e2d4c5b8a7f6e5d4c3b2a19\n"  # read as the stripped bytes, like the server


def _deployment() -> JSONObject:
    return workload(
        "Deployment",
        pod_spec(
            container(
                env=[env_cm("app-config", "log.level")], env_from=[envfrom_secret("app-secret")]
            ),
            volumes=[vol_cm("app-config"), vol_secret("app-secret", items=["token"])],
        ),
        name="web",
        namespace="shop",
    )


SOURCES: list[JSONObject] = [
    configmap("app-config", {"log.level": "info", "app.properties": "a=1\n"}, namespace="shop"),
    secret("app-secret", string_data={"token": "t0k3n", "user": "svc"}, namespace="shop"),
]


@pytest.fixture
def manifests(tmp_path: Path) -> Path:
    folder = tmp_path / "manifests"
    folder.mkdir()
    (folder / "app.yaml").write_text(yaml.safe_dump_all([_deployment(), *SOURCES]))
    return folder


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "digest.key"
    path.write_text(KEY_TEXT)
    return path


def _render(
    capsys: pytest.CaptureFixture[str], *args: str | Path
) -> tuple[int, list[dict[str, Any]], str]:
    status = main(["render", *map(str, args)])
    captured = capsys.readouterr()
    return status, [d for d in yaml.safe_load_all(captured.out) if d is not None], captured.err


def _served(key_file: Path, manifests: Path, obj: JSONObject, mode: str) -> JSONObject:
    """What the HTTP server makes of `obj`, given the same key file and sources."""
    import asyncio

    hkey = load_key_file(key_file)
    metrics = Metrics()
    admitter = Admitter(
        hkey=hkey,
        sources=FileSources.from_paths(hkey, [manifests]),
        metrics=metrics,
        default_mode=mode,
    )
    app = create_app(admitter, Lifecycle(), metrics)

    async def post() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app)) as client:
            return await client.post("http://configpin.test/mutate", json=review(obj))

    resp = asyncio.run(post())
    assert resp.status_code == 200, resp.text
    patch = json.loads(base64.b64decode(resp.json()["response"]["patch"]))
    out: JSONObject = jsonpatch.apply_patch(obj, patch)
    return out


def test_render_checksum_mode(
    capsys: pytest.CaptureFixture[str], manifests: Path, key_file: Path
) -> None:
    status, docs, err = _render(capsys, "-f", manifests, "--digest-key-file", key_file)
    assert status == 0 and err == ""
    dep, *sources = docs  # every document comes out, in order
    assert sources == SOURCES
    assert dep["kind"] == "Deployment" and dep["metadata"]["name"] == "web"
    assert set(recorded_sources(dep)) == {"configmap/app-config", "secret/app-secret"}
    assert spec_of(dep) == spec_of(_deployment())  # references untouched
    served = _served(key_file, manifests, _deployment(), "checksum")
    assert template_annotations(dep) == template_annotations(served)
    assert recorded_checksum(dep) == recorded_checksum(served)
    assert dep == served


def test_render_snapshot_mode(
    capsys: pytest.CaptureFixture[str], manifests: Path, key_file: Path
) -> None:
    status, docs, _ = _render(
        capsys, "-f", manifests, "--digest-key-file", key_file, "--mode", "snapshot"
    )
    assert status == 0
    *snapshots, dep, cm, sec = docs  # the copies just before the first workload using them
    assert [cm, sec] == SOURCES  # the originals stay
    assert dep["kind"] == "Deployment"
    by_kind = {s["kind"]: s for s in snapshots}
    assert set(by_kind) == {"ConfigMap", "Secret"}
    for kind, source in (("ConfigMap", SOURCES[0]), ("Secret", SOURCES[1])):
        snap = by_kind[kind]
        name = source["metadata"]["name"]
        assert snap["immutable"] is True
        assert snap["metadata"]["labels"] == {LABEL_SNAPSHOT: "true", LABEL_SOURCE: name}
        assert snap["metadata"]["namespace"] == "shop"
        assert snap["metadata"]["name"].startswith(f"{name}-")
        assert len(snap["metadata"]["name"]) == len(name) + 11
    assert by_kind["ConfigMap"]["data"] == SOURCES[0]["data"]
    assert by_kind["Secret"]["type"] == "Opaque"
    assert by_kind["Secret"]["stringData"] == SOURCES[1]["stringData"]

    spec = spec_of(dep)
    cm_name = by_kind["ConfigMap"]["metadata"]["name"]
    secret_name = by_kind["Secret"]["metadata"]["name"]
    assert spec["containers"][0]["env"][0]["valueFrom"]["configMapKeyRef"]["name"] == cm_name
    assert spec["containers"][0]["envFrom"][0]["secretRef"]["name"] == secret_name
    assert spec["volumes"][0]["configMap"]["name"] == cm_name
    assert spec["volumes"][1]["secret"]["secretName"] == secret_name
    # the server, in snapshot mode with the same key, makes the same object
    assert dep == _served(key_file, manifests, _deployment(), "snapshot")


def test_render_is_stable_across_runs(
    capsys: pytest.CaptureFixture[str], manifests: Path, key_file: Path
) -> None:
    first = _render(capsys, "-f", manifests, "--digest-key-file", key_file, "--mode", "snapshot")
    second = _render(capsys, "-f", manifests, "--digest-key-file", key_file, "--mode", "snapshot")
    assert first == second


def test_render_of_its_own_output_changes_nothing(
    capsys: pytest.CaptureFixture[str], manifests: Path, key_file: Path, tmp_path: Path
) -> None:
    _, docs, _ = _render(
        capsys, "-f", manifests, "--digest-key-file", key_file, "--mode", "snapshot"
    )
    again = tmp_path / "again"
    again.mkdir()
    (again / "out.yaml").write_text(yaml.safe_dump_all(docs))
    _, docs2, _ = _render(capsys, "-f", again, "--digest-key-file", key_file, "--mode", "snapshot")
    assert docs2 == docs


def test_a_different_key_gives_different_digests(
    capsys: pytest.CaptureFixture[str], manifests: Path, key_file: Path, tmp_path: Path
) -> None:
    other = tmp_path / "other.key"
    other.write_text("another-key-of-enough-length-0000")
    _, (a, *_), _ = _render(capsys, "-f", manifests, "--digest-key-file", key_file)
    _, (b, *_), _ = _render(capsys, "-f", manifests, "--digest-key-file", other)
    assert template_annotations(a)[ANN_CHECKSUM] != template_annotations(b)[ANN_CHECKSUM]
    assert set(recorded_sources(a)) == set(recorded_sources(b))


def test_render_warns_about_a_missing_source_and_fails(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, key_file: Path
) -> None:
    dep = workload("Deployment", pod_spec(container(env=[env_cm("nowhere", "k")])), name="lonely")
    path = tmp_path / "dep.yaml"
    path.write_text(yaml.safe_dump(dep))
    status, (out,), err = _render(capsys, "-f", path, "--digest-key-file", key_file)
    assert status == 1
    assert "Deployment/" in err and "lonely" in err and "configmap/nowhere" in err
    assert out == dep  # unchanged


def test_render_several_files_lists_and_other_kinds(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, key_file: Path
) -> None:
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"}, "spec": {}}
    job = workload("Job", pod_spec(container(env=[env_cm("app-config", "log.level")])), name="j")
    del job["metadata"]["namespace"]  # takes --namespace
    (tmp_path / "sources.json").write_text(
        json.dumps({"apiVersion": "v1", "kind": "List", "items": SOURCES})
    )
    (tmp_path / "work.yaml").write_text(yaml.safe_dump_all([service, job]))
    status, docs, _ = _render(
        capsys,
        "-f",
        tmp_path / "sources.json",
        "-f",
        tmp_path / "work.yaml",
        "--digest-key-file",
        key_file,
        "--namespace",
        "shop",
    )
    assert status == 0
    sources_out, svc_out, job_out = docs
    assert sources_out == {
        "apiVersion": "v1",
        "kind": "List",
        "items": SOURCES,
    }  # a List stays a List
    assert svc_out == service
    assert set(recorded_sources(job_out)) == {"configmap/app-config"}
    assert ANN_SOURCES in template_annotations(job_out)
