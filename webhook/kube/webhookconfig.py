"""Keeping the MutatingWebhookConfiguration's caBundle current."""

from __future__ import annotations

import base64
from typing import Any

from kubernetes import client

from webhook.kube.errors import translate


def set_ca_bundle(api: client.ApiClient, name: str, ca_pem: bytes) -> bool:
    """Put `ca_pem` into every webhook of the configuration; False if it was already there."""
    adm = client.AdmissionregistrationV1Api(api)
    bundle = base64.b64encode(ca_pem).decode()
    with translate(f"MutatingWebhookConfiguration {name}"):
        current: Any = adm.read_mutating_webhook_configuration(name)
    hooks = current.webhooks or []
    if all(h.client_config.ca_bundle == bundle for h in hooks):
        return False
    patch = [
        {
            "op": "replace" if h.client_config.ca_bundle else "add",
            "path": f"/webhooks/{i}/clientConfig/caBundle",
            "value": bundle,
        }
        for i, h in enumerate(hooks)
    ]
    patch.insert(
        0,
        {
            "op": "test",
            "path": "/metadata/resourceVersion",
            "value": current.metadata.resource_version,
        },
    )
    with translate(f"MutatingWebhookConfiguration {name}"):
        adm.patch_mutating_webhook_configuration(name, patch)
    return True
