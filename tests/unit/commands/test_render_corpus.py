"""`configpin render` over real-world-shaped manifests (tests/corpus) and over the project's own
chart as Helm's library renders it, piped through `configpin render -f -` as a Helm
post-renderer would.

Each check compares render's output with an independent reading of the input: documents read
with PyYAML (told to take `=` and dates as text, as kubectl does) and JSON, references found by
a generic walk of the pod spec that knows the reference field names but not where they sit.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness import chart as _chart
from webhook.commands.cli import main

CORPUS = Path(__file__).resolve().parents[2] / "corpus"
REPO = Path(__file__).resolve().parents[3]
SOURCES = "configpin.io/sources"
CHECKSUM = "configpin.io/checksum"
WORKLOADS = {
    "Pod",
    "Deployment",
    "StatefulSet",
    "DaemonSet",
    "ReplicaSet",
    "ReplicationController",
    "Job",
    "CronJob",
}
# Storage credentials the kubelet uses at mount time: not consumed by the application.
NOT_PINNED = {"azureFile", "cephfs", "rbd", "iscsi", "flexVolume", "csi", "scaleIO", "storageos"}


class _KubectlLike(yaml.SafeLoader):
    """PyYAML, with the tags it has and go-yaml lacks read as text."""


for _tag in ("value", "timestamp"):
    _KubectlLike.add_constructor(
        f"tag:yaml.org,2002:{_tag}", lambda loader, node: loader.construct_scalar(node)
    )


def independent_documents(path: Path) -> list[Any]:
    text = path.read_text()
    if text.lstrip().startswith("{"):
        decoder, pos, out = json.JSONDecoder(), 0, []
        while pos < len(text.rstrip()):
            while text[pos].isspace():
                pos += 1
            obj, pos = decoder.raw_decode(text, pos)
            out.append(obj)
        return out
    return [d for d in yaml.load_all(text, Loader=_KubectlLike) if d is not None]


def corpus_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.suffix in (".yaml", ".yml", ".json"))


def walk_refs(node: Any, under: str | None = None) -> Iterator[str]:
    """`kind/name` of every reference anywhere below `node` (a pod spec), by field name."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in NOT_PINNED:
                continue
            if isinstance(value, dict):
                if key in ("configMapKeyRef", "configMapRef", "configMap") and value.get("name"):
                    yield f"configmap/{value['name']}"
                if key in ("secretKeyRef", "secretRef") and value.get("name"):
                    yield f"secret/{value['name']}"
                if key == "secret" and (value.get("secretName") or value.get("name")):
                    yield f"secret/{value.get('secretName') or value.get('name')}"
            yield from walk_refs(value, key)
    elif isinstance(node, list):
        for item in node:
            yield from walk_refs(item, under)


def pod_spec(obj: dict[str, Any]) -> Any:
    if obj["kind"] == "Pod":
        return obj.get("spec")
    if obj["kind"] == "CronJob":
        return obj["spec"]["jobTemplate"]["spec"]["template"].get("spec")
    return obj["spec"]["template"].get("spec")


def template_meta(obj: dict[str, Any]) -> dict[str, Any]:
    if obj["kind"] == "Pod":
        meta: dict[str, Any] = obj["metadata"]
    elif obj["kind"] == "CronJob":
        meta = obj["spec"]["jobTemplate"]["spec"]["template"].setdefault("metadata", {})
    else:
        meta = obj["spec"]["template"].setdefault("metadata", {})
    return meta


def without_stamp(obj: Any) -> Any:
    """The object with configpin's two template annotations taken out (a copy)."""
    if not isinstance(obj, dict) or obj.get("kind") not in WORKLOADS:
        return obj
    copy = json.loads(json.dumps(obj))
    meta = template_meta(copy)
    annotations = meta.get("annotations") or {}
    annotations.pop(SOURCES, None)
    annotations.pop(CHECKSUM, None)
    if "annotations" in meta and not annotations:
        del meta["annotations"]
    if not meta and copy["kind"] != "Pod":  # a template that had no metadata before
        template = copy["spec"]
        if copy["kind"] == "CronJob":
            template = template["jobTemplate"]["spec"]
        del template["template"]["metadata"]
    return copy


def _objects(docs: list[Any]) -> Iterator[dict[str, Any]]:
    for doc in docs:
        if str(doc.get("kind", "")).endswith("List") and "items" in doc:
            yield from doc["items"]
        else:
            yield doc


def _render(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[Any], str]:
    status = main(["render", *args])
    out = capsys.readouterr()
    docs = [d for d in yaml.load_all(out.out, Loader=_KubectlLike) if d is not None]
    return status, docs, out.err


@pytest.mark.parametrize("folder", sorted(p.name for p in CORPUS.iterdir() if p.is_dir()))
def test_corpus_renders_with_every_document_kept(
    folder: str, key_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = CORPUS / folder
    expected = [doc for f in corpus_files(path) for doc in independent_documents(f)]
    status, docs, err = _render(capsys, "-f", str(path), "--digest-key-file", str(key_file))
    assert "Traceback" not in err
    assert len(docs) == len(expected), err
    for got, want in zip(docs, expected, strict=True):
        assert got.get("kind") == want.get("kind")
        if str(want.get("kind")).endswith("List"):
            assert [without_stamp(i) for i in got["items"]] == want["items"]
        else:
            assert without_stamp(got) == want  # only configpin's annotations added

    # Every reference the independent scan finds is recorded when its source is in the input,
    # and reported on stderr (exit 1) when it is not; nothing else is recorded.
    present = {
        f"{o['kind'].lower()}/{o['metadata']['name']}"
        for o in _objects(expected)
        if o.get("kind") in ("ConfigMap", "Secret")
    }
    missing_reported = False
    for obj in _objects(docs):
        if obj.get("kind") not in WORKLOADS:
            continue
        refs = set(walk_refs(pod_spec(obj)))
        annotations = template_meta(obj).get("annotations") or {}
        recorded = set(json.loads(annotations.get(SOURCES, "{}")))
        optional_missing = {r for r in refs - present if _optional(obj, r)}
        assert recorded == (refs & present) | optional_missing, obj["metadata"]["name"]
        for ref in refs - present - optional_missing:
            assert ref in err
            missing_reported = True
    assert status == (1 if missing_reported else 0), err


def _optional(obj: dict[str, Any], ref: str) -> bool:
    _, _, name = ref.partition("/")
    text = json.dumps(pod_spec(obj))
    return '"optional": true' in text and f'"name": "{name}"' in text


def test_corpus_renders_the_same_twice_and_its_own_output_again(
    key_file: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    args = ["-f", str(CORPUS), "--digest-key-file", str(key_file), "--allow-missing", "*/*"]
    first = _render(capsys, *args)
    assert first[0] == 0, first[2]
    assert _render(capsys, *args) == first
    again = tmp_path / "again.yaml"
    main(["render", *args])
    again.write_text(capsys.readouterr().out)
    second = _render(
        capsys, "-f", str(again), "--digest-key-file", str(key_file), "--allow-missing", "*/*"
    )
    assert second[1] == first[1]


def test_corpus_in_snapshot_mode_keeps_the_originals_and_adds_copies(
    key_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = CORPUS / "kube-prometheus"
    expected = [doc for f in corpus_files(path) for doc in independent_documents(f)]
    status, docs, err = _render(
        capsys, "-f", str(path), "--digest-key-file", str(key_file), "--mode", "snapshot"
    )
    assert status == 0, err
    copies = [
        d
        for d in docs
        if (d.get("metadata") or {}).get("labels", {}).get("configpin.io/snapshot") == "true"
    ]
    originals = [d for d in docs if d not in copies]
    assert len(originals) == len(expected)
    names = [(d["kind"], d["metadata"]["name"]) for d in copies]
    assert len(names) == len(set(names)) == 6  # grafana: 2 Secrets, 3 ConfigMaps; blackbox: 1
    grafana = next(
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "grafana"
    )
    assert docs.index(grafana) > max(docs.index(c) for c in copies[:5])  # copies come first


def _helm_stream(values: dict[str, Any] | None = None) -> str:
    """The chart as Helm hands it to a post-renderer: every template, `# Source:` first."""
    files = _chart.render_files(values or {}, namespace=_chart.RELEASE_NAMESPACE)
    parts = []
    for name in sorted(files):
        text = files[name]
        if name.endswith("NOTES.txt") or not text.strip():
            continue
        parts.append(f"---\n# Source: {name}\n{text.strip()}\n")
    return "".join(parts)


@pytest.mark.parametrize("cert_manager", [False, True], ids=["default", "cert-manager"])
def test_helm_chart_passes_through_render_as_a_post_renderer(
    key_file: Path, cert_manager: bool
) -> None:
    stream = _helm_stream({"certManager": {"enabled": True}} if cert_manager else None)
    expected = [d for d in yaml.load_all(stream, Loader=_KubectlLike) if d is not None]
    assert len(expected) > 5
    deployment = next(d for d in expected if d["kind"] == "Deployment")
    mounted = set(walk_refs(pod_spec(deployment)))
    if cert_manager:
        # The certificate Secret cert-manager will issue, given here as another document of
        # the stream would be: the chart's Deployment is then stamped with its digest.
        (tls,) = mounted
        tls_secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": tls.partition("/")[2]},
            "type": "kubernetes.io/tls",
            "data": {"tls.crt": "Y2VydA==", "tls.key": "a2V5", "ca.crt": "Y2E="},
        }
        stream += "---\n" + yaml.safe_dump(tls_secret)
        expected.append(tls_secret)
    done = subprocess.run(
        [
            sys.executable, "-m", "webhook", "render", "-f", "-",
            "--digest-key-file", str(key_file),
            "--namespace", _chart.RELEASE_NAMESPACE,
            # made by configpin itself at start (or by cert-manager): not in the chart
            "--allow-missing", "secret/*-tls",
        ],
        input=stream.encode(),
        capture_output=True,
        cwd=REPO,
        check=False,
    )  # fmt: skip
    err = done.stderr.decode()
    assert done.returncode == 0, err
    assert err == ""
    out = done.stdout.decode()
    assert "# Source: configpin/templates/" in out  # Helm's comments are kept
    docs = [d for d in yaml.load_all(out, Loader=_KubectlLike) if d is not None]
    assert [without_stamp(d) for d in docs] == expected
    stamped = next(d for d in docs if d["kind"] == "Deployment")
    recorded = json.loads((template_meta(stamped).get("annotations") or {}).get(SOURCES, "{}"))
    assert set(recorded) == (mounted if cert_manager else set())
