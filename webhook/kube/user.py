"""A client as the user at the keyboard: their kubeconfig and context, as kubectl reads them
(`configpin status`, `configpin plan`: only their own rights)."""

from __future__ import annotations

import os
from pathlib import Path

from kubernetes import client, config


def connect_as_user(
    kubeconfig_file: Path | None, context: str | None
) -> tuple[client.ApiClient, str]:
    """A client with the user's own credentials (kubeconfig, or in-cluster), and the
    namespace their context names (default: default)."""
    cfg = client.Configuration()
    kubeconfig = kubeconfig_file or (
        os.environ["KUBECONFIG"].split(os.pathsep)[0] if os.environ.get("KUBECONFIG") else None
    )
    namespace = "default"
    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(client_configuration=cfg)
        sa_ns = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
        namespace = sa_ns.read_text().strip() if sa_ns.exists() else namespace
    else:
        path = str(kubeconfig or Path.home() / ".kube" / "config")
        config.load_kube_config(config_file=path, context=context, client_configuration=cfg)
        _, active = config.list_kube_config_contexts(config_file=path)
        if context:
            contexts, _ = config.list_kube_config_contexts(config_file=path)
            active = next((c for c in contexts if c["name"] == context), active)
        namespace = (active or {}).get("context", {}).get("namespace") or namespace
    return client.ApiClient(cfg), namespace
