"""Keeping the MutatingWebhookConfiguration's caBundle current."""

from __future__ import annotations

import base64

from webhook.kube.raw import Kube, path


def set_ca_bundle(kube: Kube, name: str, ca_pem: bytes) -> bool:
    """Put `ca_pem` into every webhook of the configuration; False if it was already there.

    The patch is guarded by the resourceVersion read (a `test` op), so a concurrent writer
    makes it fail rather than be overwritten."""
    api_path = path("mutatingwebhookconfigurations", name=name)
    current = kube.get(api_path)
    bundle = base64.b64encode(ca_pem).decode()
    hooks = current.get("webhooks") or []
    if all((h.get("clientConfig") or {}).get("caBundle") == bundle for h in hooks):
        return False
    patch: list[dict[str, object]] = [
        {
            "op": "test",
            "path": "/metadata/resourceVersion",
            "value": current["metadata"]["resourceVersion"],
        }
    ]
    patch += [
        {"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": bundle}
        for i in range(len(hooks))
    ]
    kube.patch(api_path, patch)
    return True
