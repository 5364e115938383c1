"""`configpin render` against the real API server: the same digests as admission.

The odd sources users write (a Secret whose base64 is wrapped over lines, null values, values
that PyYAML and go-yaml read differently) are created in the API server as kubectl sends them:
the JSON that sigs.k8s.io/yaml makes of the YAML, written out here by hand. A Deployment that
consumes them is admitted by the session's configpin. `render` reads the YAML text a user
would have written, with the cluster's digest key (`--digest-key-secret`, read-only), and
must record exactly what admission recorded.
"""

from __future__ import annotations

import base64
import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from harness.configpin import CONFIGPIN_NAMESPACE, Configpin
from harness.controlplane import ControlPlane
from webhook.commands.cli import main
from webhook.kube.raw import Kube, path

CHECKSUM = "configpin.io/checksum"
SOURCES = "configpin.io/sources"

CERT = bytes(range(256)) * 2  # 512 bytes: 684 base64 characters, wrapped at 76
_B64 = base64.b64encode(CERT).decode()
WRAPPED = "".join(_B64[i : i + 76] + "\n" for i in range(0, len(_B64), 76))

# What the user writes.
SOURCES_YAML = textwrap.dedent(
    """\
        apiVersion: v1
        kind: Secret
        metadata:
          name: wrapped
        type: Opaque
        data:
          # `base64 file` wraps at 76 columns; the block keeps the line breaks
          tls.crt: |
        {cert}
          empty: null
        ---
        apiVersion: v1
        kind: ConfigMap
        metadata:
          name: odd
        data:
          nothing: null
          blank:
          date: 2001-12-14
          eq: =
          clock: 1:20
          version: 1.10.0
        """
).replace("{cert}", textwrap.indent(WRAPPED.rstrip("\n"), "    "))

# What kubectl sends for it (sigs.k8s.io/yaml: go-yaml v2 values, then JSON).
SECRET_JSON: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Secret",
    "metadata": {"name": "wrapped"},
    "type": "Opaque",
    "data": {"tls.crt": WRAPPED, "empty": None},
}
CONFIGMAP_JSON: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "ConfigMap",
    "metadata": {"name": "odd"},
    "data": {
        "nothing": None,
        "blank": None,
        "date": "2001-12-14",
        "eq": "=",
        "clock": "1:20",
        "version": "1.10.0",
    },
}

DEPLOYMENT_YAML = textwrap.dedent(
    """\
    apiVersion: apps/v1
    kind: Deployment
    metadata:
      name: odd-sources
    spec:
      replicas: 0
      selector:
        matchLabels: {app: odd-sources}
      template:
        metadata:
          labels: {app: odd-sources}
        spec:
          containers:
            - name: app
              image: registry.invalid/app:1
              envFrom:
                - configMapRef: {name: odd}
              volumeMounts:
                - {name: tls, mountPath: /tls}
          volumes:
            - name: tls
              secret:
                secretName: wrapped
                items:
                  - {key: tls.crt, path: tls.crt}
                  - {key: empty, path: empty}
    """
)


def _template_annotations(obj: dict[str, Any]) -> dict[str, str]:
    annotations: dict[str, str] = obj["spec"]["template"]["metadata"].get("annotations") or {}
    return annotations


def test_render_records_what_admission_records_for_odd_sources(
    control_plane: ControlPlane,
    k8s: client.ApiClient,
    configpin: Configpin,
    namespace: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    kube = Kube(k8s)
    kube.create(path("secrets", namespace), SECRET_JSON)
    kube.create(path("configmaps", namespace), CONFIGMAP_JSON)

    # What the API server stored: the decoded bytes, and "" for null.
    stored_secret = kube.get(path("secrets", namespace, "wrapped"))
    assert base64.b64decode(stored_secret["data"]["tls.crt"]) == CERT
    assert base64.b64decode(stored_secret["data"].get("empty") or "") == b""
    stored_cm = kube.get(path("configmaps", namespace, "odd"))
    assert stored_cm["data"]["nothing"] == "" and stored_cm["data"]["blank"] == ""
    assert stored_cm["data"]["date"] == "2001-12-14" and stored_cm["data"]["clock"] == "1:20"

    body = yaml.safe_load(DEPLOYMENT_YAML)  # plain YAML: PyYAML and go-yaml agree on it
    kube.create(path("deployments", namespace), body)
    admitted = kube.get(path("deployments", namespace, "odd-sources"))
    recorded = _template_annotations(admitted)
    assert set(json.loads(recorded[SOURCES])) == {"configmap/odd", "secret/wrapped"}

    manifest = tmp_path / "app.yaml"
    manifest.write_text(SOURCES_YAML + "---\n" + DEPLOYMENT_YAML)
    status = main(
        [
            "render",
            "-f",
            str(manifest),
            "--namespace",
            namespace,
            "--digest-key-secret",
            f"{CONFIGPIN_NAMESPACE}/configpin-digest-key",
            "--kubeconfig",
            str(control_plane.kubeconfig),
        ]
    )
    out = capsys.readouterr()
    assert status == 0, out.err
    assert out.err == ""  # the cluster's key: no note about a one-off key
    docs = [d for d in yaml.load_all(out.out, Loader=_GoLikeLoader) if d]
    assert [d["kind"] for d in docs] == ["Secret", "ConfigMap", "Deployment"]
    rendered = _template_annotations(docs[2])
    assert json.loads(rendered[SOURCES]) == json.loads(recorded[SOURCES])
    assert rendered[CHECKSUM] == recorded[CHECKSUM]

    # The sources come out as written: the Secret still wrapped, the ConfigMap's nulls kept.
    assert docs[0]["data"]["tls.crt"] == WRAPPED.rstrip("\n") + "\n"
    assert docs[1]["data"]["nothing"] is None


class _GoLikeLoader(yaml.SafeLoader):
    """PyYAML with `=` read as text, as kubectl does (the output keeps the user's text)."""


_GoLikeLoader.add_constructor(
    "tag:yaml.org,2002:value", lambda loader, node: loader.construct_scalar(node)
)
_GoLikeLoader.add_constructor(
    "tag:yaml.org,2002:timestamp", lambda loader, node: loader.construct_scalar(node)
)
