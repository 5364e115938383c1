"""Connection to the cluster: in-cluster config, else --kubeconfig / KUBECONFIG, else none."""

from __future__ import annotations

import os
from pathlib import Path

from kubernetes import client, config


def connect(kubeconfig: Path | None = None, *, qps_hint: int = 50) -> client.ApiClient | None:
    """An ApiClient of its own (never the library's global default), or None with no cluster.

    The official client has no client-side rate limiter; `connection_pool_maxsize` bounds
    how many requests run at once instead.
    """
    cfg = client.Configuration()
    if kubeconfig is not None:
        config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
    elif os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(client_configuration=cfg)
    elif os.environ.get("KUBECONFIG"):
        config.load_kube_config(
            config_file=os.environ["KUBECONFIG"].split(os.pathsep)[0], client_configuration=cfg
        )
    else:
        return None
    cfg.connection_pool_maxsize = max(cfg.connection_pool_maxsize or 4, qps_hint // 5)
    return client.ApiClient(cfg)
