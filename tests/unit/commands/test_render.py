"""`configpin render`: offline mutation of manifests, with the same digests as the server."""

from __future__ import annotations

import base64
import io
import json
import sys
import textwrap
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
    reading,
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
from webhook.commands.cli import main
from webhook.core import digest
from webhook.core.constants import ANN_CHECKSUM, ANN_SOURCES, LABEL_SNAPSHOT, LABEL_SOURCE
from webhook.core.model import JSONObject, SourceKind
from webhook.inputs.sources import FileSources
from webhook.process.config import Settings
from webhook.process.digestkey import load_key_file
from webhook.process.metrics import Metrics
from webhook.server.app import create_app
from webhook.server.handler import Admitter
from webhook.server.lifecycle import Lifecycle


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
        settings=Settings(mode=mode),
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
    # The server would take each copy as its own: signed for its namespace, name and content.
    hkey = load_key_file(key_file)
    for kind, snap in by_kind.items():
        source_kind = SourceKind.CONFIGMAP if kind == "ConfigMap" else SourceKind.SECRET
        key_digests = digest.key_digests(hkey, source_kind, snap)
        assert (
            digest.proven_source(hkey, source_kind, snap, key_digests)
            == (snap["metadata"]["labels"][LABEL_SOURCE])
        )

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
    dep = workload("Deployment", reading("nowhere", "k"), name="lonely")
    path = tmp_path / "dep.yaml"
    path.write_text(yaml.safe_dump(dep))
    status, (out,), err = _render(capsys, "-f", path, "--digest-key-file", key_file)
    assert status == 1
    assert "Deployment/" in err and "lonely" in err and "configmap/nowhere" in err
    # nothing pinned: the empty record only
    assert out["spec"]["template"]["metadata"]["annotations"]["configpin.io/sources"] == "{}"
    del out["spec"]["template"]["metadata"]["annotations"]
    assert out == dep


def test_render_several_files_lists_and_other_kinds(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, key_file: Path
) -> None:
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"}, "spec": {}}
    job = workload("Job", reading("app-config", "log.level"), name="j")
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


# ---- documents, structure, errors, keys (issue 15) ----


def _write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


def test_a_shared_yaml_node_is_changed_only_where_admission_changes_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, key_file: Path
) -> None:
    path = _write(
        tmp_path / "alias.yaml",
        """\
        apiVersion: apps/v1
        kind: Deployment
        metadata:
          name: web
          annotations: &shared {team: shop}
        spec:
          template:
            metadata:
              annotations: *shared
            spec:
              containers:
                - name: app
                  envFrom: [{configMapRef: {name: cfg, optional: true}}]
        """,
    )
    status, (dep,), _ = _render(capsys, "-f", path, "--digest-key-file", key_file)
    assert status == 0
    assert dep["metadata"]["annotations"] == {"team": "shop"}
    assert set(template_annotations(dep)) == {"team", ANN_CHECKSUM, ANN_SOURCES}


def test_snapshot_copies_go_into_the_list_before_the_item_that_uses_them(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, key_file: Path
) -> None:
    items = [
        SOURCES[0],
        _deployment(),
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}},
    ]
    path = tmp_path / "list.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": items}))
    status, (lst,), err = _render(
        capsys, "-f", path, "--digest-key-file", key_file, "--mode", "snapshot",
        "--allow-missing", "secret/app-*",
    )  # fmt: skip
    assert status == 0, err
    kinds = [(i["kind"], i["metadata"]["name"]) for i in lst["items"]]
    assert kinds[0] == ("ConfigMap", "app-config")
    assert kinds[1][0] == "ConfigMap" and kinds[1][1].startswith("app-config-")
    assert kinds[2:] == [("Deployment", "web"), ("Service", "s")]


def test_allow_missing_takes_names_and_globs(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, key_file: Path
) -> None:
    dep = workload(
        "Deployment",
        pod_spec(container(env=[env_cm("cfg", "k")], env_from=[envfrom_secret("db-password")])),
        name="web",
    )
    path = tmp_path / "dep.yaml"
    path.write_text(yaml.safe_dump(dep))
    base = ["-f", path, "--digest-key-file", key_file]
    status, _, err = _render(capsys, *base)
    assert status == 1 and "configmap/cfg" in err and "secret/db-password" in err
    status, _, err = _render(capsys, *base, "--allow-missing", "Secret/db-*")
    assert status == 1 and "configmap/cfg" in err and "db-password" not in err
    status, (out,), err = _render(
        capsys, *base, "--allow-missing", "secret/db-*", "--allow-missing", "cm/cfg"
    )
    assert status == 0 and err == ""
    assert template_annotations(out)[ANN_SOURCES] == "{}"  # nothing there to pin: empty
    assert main(["render", *map(str, base), "--allow-missing", "db-password"]) == 2
    assert "expected KIND/NAME" in capsys.readouterr().err


def test_unusable_input_exits_2_with_file_and_line_unless_skipped(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, key_file: Path
) -> None:
    folder = tmp_path / "mixed"
    folder.mkdir()
    (folder / "a-good.yaml").write_text(yaml.safe_dump_all([*SOURCES, _deployment()]))
    _write(
        folder / "b-template.yaml",
        """\
        apiVersion: v1
        kind: ConfigMap
        metadata:
          name: {{ .Release.Name }}-config
        """,
    )
    _write(folder / "c-meta.yaml", "apiVersion: v1\nkind: Service\nmetadata: web\n")
    _write(folder / "d-values.yaml", "replicaCount: 2\nimage: {tag: v1}\n")
    status, docs, err = _render(capsys, "-f", folder, "--digest-key-file", key_file)
    assert status == 2 and docs == []
    lines = err.splitlines()
    assert any(line.startswith(f"{folder}/b-template.yaml:4: ") for line in lines), err
    assert f"{folder}/c-meta.yaml:1: metadata is a str, not a mapping" in lines
    assert f"{folder}/d-values.yaml:1: not a Kubernetes object: no kind" in lines
    assert "Traceback" not in err

    status, docs, err = _render(
        capsys, "-f", folder, "--digest-key-file", key_file, "--skip-invalid"
    )
    assert status == 0
    assert [d["kind"] for d in docs] == ["ConfigMap", "Secret", "Deployment"]
    assert err.count("(skipped)") == 3


def test_without_a_key_render_says_so_and_writes_nothing(
    capsys: pytest.CaptureFixture[str],
    manifests: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    status, docs, err = _render(capsys, "-f", manifests)
    assert status == 0 and len(docs) == 3
    (note,) = err.splitlines()
    assert "one-off key" in note and "match no cluster" in note
    assert list(work.iterdir()) == []  # no certs/digest.key any more
    _, docs2, _ = _render(capsys, "-f", manifests)
    assert recorded_checksum(docs2[0]) != recorded_checksum(docs[0])  # a new key each time


def test_digest_key_secret_without_a_cluster_is_unusable(
    capsys: pytest.CaptureFixture[str],
    manifests: Path,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    status = main(["render", "-f", str(manifests), "--digest-key-secret", "configpin/key"])
    err = capsys.readouterr().err
    assert status == 2 and "configpin/key" in err and "no cluster" in err


def test_render_reads_standard_input(
    capsys: pytest.CaptureFixture[str], key_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stream = yaml.safe_dump_all([_deployment(), *SOURCES]).encode()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stream)))
    status, docs, err = _render(capsys, "-f", "-", "--digest-key-file", key_file)
    assert status == 0, err
    assert [d["kind"] for d in docs] == ["Deployment", "ConfigMap", "Secret"]
    assert set(recorded_sources(docs[0])) == {"configmap/app-config", "secret/app-secret"}


def test_volume_credentials_are_not_pinned(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, key_file: Path
) -> None:
    volumes = [
        {"name": "a", "azureFile": {"secretName": "az", "shareName": "s"}},
        {"name": "c", "cephfs": {"monitors": ["m"], "secretRef": {"name": "ceph"}}},
        {"name": "r", "rbd": {"monitors": ["m"], "image": "i", "secretRef": {"name": "ceph"}}},
        {
            "name": "i",
            "iscsi": {"targetPortal": "t", "iqn": "q", "lun": 0, "secretRef": {"name": "chap"}},
        },
        {"name": "f", "flexVolume": {"driver": "d", "secretRef": {"name": "flex"}}},
        {"name": "s", "csi": {"driver": "d", "nodePublishSecretRef": {"name": "csi"}}},
    ]
    dep = workload("Deployment", pod_spec(container(), volumes=volumes), name="storage")
    path = tmp_path / "dep.yaml"
    path.write_text(yaml.safe_dump(dep))
    status, (out,), err = _render(capsys, "-f", path, "--digest-key-file", key_file)
    assert status == 0 and err == ""
    assert out == dep
