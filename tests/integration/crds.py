"""CustomResourceDefinitions of workload kinds configpin pins, for the test API server.

Trimmed from the projects' own CRDs (argoproj/argo-rollouts manifests/crds/rollout-crd.yaml,
openkruise/kruise config/crd/bases/apps.kruise.io_clonesets.yaml), keeping what decides how
the API server stores what configpin writes: Argo's typed pod template (metadata with string
maps; `volumes` with `x-kubernetes-preserve-unknown-fields`, as Argo has it; containers with
the env fields configpin rewrites), its `workloadRef`; Kruise's template kept whole by
`x-kubernetes-preserve-unknown-fields`. Fields that are pruned here are pruned there too.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from kubernetes import client

from harness.controlplane import wait_for
from webhook.kube.errors import NotFound
from webhook.kube.raw import Kube

_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_PRESERVE = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
_NAME_KEY_REF = {
    "type": "object",
    "properties": {
        "key": {"type": "string"},
        "name": {"type": "string", "default": ""},
        "optional": {"type": "boolean"},
    },
    "required": ["key"],
    "x-kubernetes-map-type": "atomic",
}
_NAME_REF = {
    "type": "object",
    "properties": {"name": {"type": "string", "default": ""}, "optional": {"type": "boolean"}},
    "x-kubernetes-map-type": "atomic",
}
_CONTAINER = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "image": {"type": "string"},
        "command": {"type": "array", "items": {"type": "string"}},
        "args": {"type": "array", "items": {"type": "string"}},
        "securityContext": _PRESERVE,
        "env": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "value": {"type": "string"},
                    "valueFrom": {
                        "type": "object",
                        "properties": {
                            "configMapKeyRef": _NAME_KEY_REF,
                            "secretKeyRef": _NAME_KEY_REF,
                            "fieldRef": _PRESERVE,
                            "resourceFieldRef": _PRESERVE,
                        },
                    },
                },
                "required": ["name"],
            },
            "x-kubernetes-list-map-keys": ["name"],
            "x-kubernetes-list-type": "map",
        },
        "envFrom": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "configMapRef": _NAME_REF,
                    "prefix": {"type": "string"},
                    "secretRef": _NAME_REF,
                },
            },
            "x-kubernetes-list-type": "atomic",
        },
        "volumeMounts": {"type": "array", "items": _PRESERVE},
    },
    "required": ["name"],
}


def _schema(spec: dict[str, Any], *, required: list[str] | None = None) -> dict[str, Any]:
    """A workload resource's schema: its spec has replicas, a selector and `spec`'s fields."""
    spec_schema: dict[str, Any] = {
        "type": "object",
        "properties": {
            "replicas": {"type": "integer", "format": "int32"},
            "selector": _PRESERVE,
            **spec,
        },
    }
    if required is not None:
        spec_schema["required"] = required
    return {
        "type": "object",
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec_schema,
            "status": _PRESERVE,
        },
    }


_ROLLOUT_SCHEMA = _schema(
    {
        "strategy": _PRESERVE,
        "template": {
            "description": "Template describes the pods that will be created.",
            "type": "object",
            "properties": {
                "metadata": {
                    "type": "object",
                    "properties": {"annotations": _STRING_MAP, "labels": _STRING_MAP},
                },
                "spec": {
                    "type": "object",
                    "properties": {
                        "containers": {"type": "array", "items": _CONTAINER},
                        "initContainers": {"type": "array", "items": _CONTAINER},
                        "hostIPC": {"type": "boolean"},
                        "hostNetwork": {"type": "boolean"},
                        "hostPID": {"type": "boolean"},
                        "nodeName": {"type": "string"},
                        "securityContext": _PRESERVE,
                        "serviceAccountName": {"type": "string"},
                        "volumes": {"x-kubernetes-preserve-unknown-fields": True},
                    },
                    "required": ["containers"],
                },
            },
        },
        "workloadRef": {
            "description": "WorkloadRef holds a references to a workload that "
            "provides Pod template",
            "type": "object",
            "properties": {
                "apiVersion": {"type": "string"},
                "kind": {"type": "string"},
                "name": {"type": "string"},
                "scaleDown": {"type": "string"},
            },
        },
    }
)
_CLONESET_SCHEMA = _schema(
    {
        "template": {
            "description": "Template describes the pods that will be created.",
            "x-kubernetes-preserve-unknown-fields": True,
        },
        "updateStrategy": _PRESERVE,
    },
    required=["selector", "template"],
)


def _crd(
    group: str, plural: str, kind: str, version: str, schema: dict[str, Any]
) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": version,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": schema},
                    "subresources": {"status": {}},
                }
            ],
        },
    }


ROLLOUT_CRD = _crd("argoproj.io", "rollouts", "Rollout", "v1alpha1", _ROLLOUT_SCHEMA)
CLONESET_CRD = _crd("apps.kruise.io", "clonesets", "CloneSet", "v1alpha1", _CLONESET_SCHEMA)
CLONESET = "apps.kruise.io/v1alpha1/clonesets/CloneSet=spec.template"
# Any other kind with a pod template, whose schema keeps the template whole.
WIDGET_CRD = _crd("widgets.example.com", "widgets", "Widget", "v1", _CLONESET_SCHEMA)
WIDGET = "widgets.example.com/v1/widgets/Widget=spec.template"


def _served(kube: Kube, group_version: str, plural: str) -> bool:
    try:
        doc = kube.get(f"/apis/{group_version}")
    except NotFound:
        return False
    return any(r.get("name") == plural for r in doc.get("resources") or ())


@contextlib.contextmanager
def installed(api: client.ApiClient, *crds: dict[str, Any]) -> Iterator[None]:
    """The CRDs created and served (discovery lists them); deleted on the way out."""
    kube = Kube(api)
    base = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    for crd in crds:
        kube.create(base, crd)
    try:
        for crd in crds:
            spec = crd["spec"]
            version = f"{spec['group']}/{spec['versions'][0]['name']}"
            wait_for(
                lambda v=version, p=spec["names"]["plural"]: _served(kube, v, p),
                what=f"{crd['metadata']['name']} served",
            )
        yield
    finally:
        for crd in crds:
            with contextlib.suppress(NotFound):
                kube.delete(f"{base}/{crd['metadata']['name']}")
        # deletion waits for the custom resources to go: the next install must not meet it
        for crd in crds:
            wait_for(
                lambda name=crd["metadata"]["name"]: _gone(kube, f"{base}/{name}"),
                timeout=120,
                what=f"{crd['metadata']['name']} deleted",
            )


def _gone(kube: Kube, api_path: str) -> bool:
    try:
        kube.get(api_path)
    except NotFound:
        return True
    return False
