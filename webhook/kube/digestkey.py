"""The digest key in a Secret of configpin's own namespace: the first replica creates it,
concurrent starters converge on the same key (create, and on AlreadyExists read it back)."""

from __future__ import annotations

import base64
import logging

from webhook.kube.errors import AlreadyExists, NotFound
from webhook.kube.raw import Kube, path
from webhook.process.digestkey import new_key_text, parse_key

log = logging.getLogger(__name__)
DATA_KEY = "key"


def read_digest_key(kube: Kube, namespace: str, name: str) -> bytes:
    """The key in an existing Secret (one GET; nothing is created)."""
    secret = kube.get(path("secrets", namespace, name))
    raw = (secret.get("data") or {}).get(DATA_KEY)
    if not isinstance(raw, str):
        raise ValueError(f"Secret {namespace}/{name} has no data key {DATA_KEY!r}")
    return parse_key(base64.b64decode(raw), f"Secret {namespace}/{name}")


def ensure_digest_key(kube: Kube, namespace: str, name: str) -> bytes:
    try:
        return read_digest_key(kube, namespace, name)
    except NotFound:
        pass
    body = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {
                "app.kubernetes.io/name": "configpin",
                "app.kubernetes.io/component": "digest-key",
            },
        },
        "type": "Opaque",
        "data": {DATA_KEY: base64.b64encode(new_key_text()).decode()},
    }
    try:
        kube.create(path("secrets", namespace), body)
        log.info("created the digest key Secret %s/%s", namespace, name)
    except AlreadyExists:
        log.info("another replica created the digest key Secret first; using it")
    return read_digest_key(kube, namespace, name)
