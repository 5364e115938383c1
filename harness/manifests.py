"""Plain dict manifests that the integration tests and the benches create again and again.

Each builder returns a fresh dict (callers may change what they get). Keys are only present
when given: `configmap("c", {...})` has no labels, `container()` no env.

    deployment("web")  # 0 replicas; container `app` reads key `a` of ConfigMap app-config
    deployment("web", pod_spec(container(env_from=[env_from("configmap", "app-config")])))
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, TypeAlias

from webhook.core.model import JSONObject

SourceKind: TypeAlias = Literal["configmap", "secret"]

IMAGE = "registry.invalid/app:1"

_KEY_REF = {"configmap": "configMapKeyRef", "secret": "secretKeyRef"}
_FROM_REF = {"configmap": "configMapRef", "secret": "secretRef"}


def configmap(
    name: str,
    data: dict[str, str],
    *,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
) -> JSONObject:
    metadata: JSONObject = {"name": name}
    if labels is not None:
        metadata["labels"] = labels
    if annotations is not None:
        metadata["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": data}


def secret(name: str, string_data: dict[str, str], *, type_: str = "Opaque") -> JSONObject:
    """A Secret given in plain text (`stringData`); `type` is sent only when not the
    server's default, Opaque."""
    body: JSONObject = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}}
    if type_ != "Opaque":
        body["type"] = type_
    body["stringData"] = string_data
    return body


def env_key_ref(kind: SourceKind, name: str, key: str, var: str) -> JSONObject:
    """Environment variable `var` set from `key` of ConfigMap or Secret `name` (valueFrom)."""
    return {"name": var, "valueFrom": {_KEY_REF[kind]: {"name": name, "key": key}}}


def env_from(kind: SourceKind, name: str) -> JSONObject:
    """Every key of ConfigMap or Secret `name` as environment variables (an envFrom entry)."""
    return {_FROM_REF[kind]: {"name": name}}


def container(
    *,
    env: Sequence[JSONObject] = (),
    env_from: Sequence[JSONObject] = (),
    name: str = "app",
    image: str = IMAGE,
) -> JSONObject:
    c: JSONObject = {"name": name, "image": image}
    if env_from:
        c["envFrom"] = list(env_from)
    if env:
        c["env"] = list(env)
    return c


def pod_spec(*containers: JSONObject) -> JSONObject:
    """A pod spec of `containers`; of none given, the one container `app` that reads key `a`
    of ConfigMap `app-config` into variable `A`."""
    if not containers:
        containers = (container(env=[env_key_ref("configmap", "app-config", "a", "A")]),)
    return {"containers": list(containers)}


_default_pod_spec = pod_spec  # `deployment`'s parameter of the same name hides the function


def deployment(
    name: str,
    pod_spec: JSONObject | None = None,
    *,
    replicas: int = 0,
    annotations: dict[str, str] | None = None,
) -> JSONObject:
    """Deployment `name` (selector and template label `app: name`) around `pod_spec`, by
    default `pod_spec()`. No replicas unless asked: tests that need Pods ask for 1."""
    metadata: JSONObject = {"name": name}
    if annotations is not None:
        metadata["annotations"] = annotations
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata,
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": pod_spec if pod_spec is not None else _default_pod_spec(),
            },
        },
    }
