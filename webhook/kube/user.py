"""A client as the user at the keyboard: their kubeconfig and context, as kubectl reads them
(`configpin status`, `configpin plan`: only their own rights).

A `KUBECONFIG` list is merged as kubectl merges it: files that do not exist (or are empty) are
skipped, the first file to name a cluster, context or user wins, and so does the first to set
`current-context`. (The Kubernetes client's own merge lets the last file's `current-context`
win, and stops at an empty file.) `--kubeconfig` names one file, as kubectl's does."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.config.kube_config import KubeConfigLoader, KubeConfigMerger


def kubeconfig_paths(kubeconfig_file: Path | None) -> list[str]:
    """The files kubectl would read, in order: `--kubeconfig`, else each of `KUBECONFIG`'s
    list that holds something, else ~/.kube/config."""
    if kubeconfig_file is not None:
        return [str(kubeconfig_file)]
    listed = os.environ.get("KUBECONFIG", "")
    if listed:
        found = [
            str(Path(p).expanduser())
            for p in listed.split(os.pathsep)
            if p and Path(p).expanduser().is_file() and Path(p).expanduser().stat().st_size
        ]
        if found:
            return found
    return [str(Path.home() / ".kube" / "config")]


def _loader(paths: list[str], context: str | None) -> KubeConfigLoader:
    if len(paths) == 1:
        merged = KubeConfigMerger(paths[0])
    else:
        merged = KubeConfigMerger(os.pathsep.join(paths))
        first = next(
            (
                f["current-context"]
                for p in merged.paths
                if isinstance(f := merged.config_files.get(p), dict) and f.get("current-context")
            ),
            None,
        )
        if first is not None and merged.config is not None:
            merged.config.value["current-context"] = first
    if merged.config is None:
        raise config.ConfigException("no configuration found in " + ", ".join(paths))
    return KubeConfigLoader(config_dict=merged.config, active_context=context)


def connect_as_user(
    kubeconfig_file: Path | None, context: str | None
) -> tuple[client.ApiClient, str]:
    """A client with the user's own credentials (kubeconfig, or in-cluster), and the
    namespace their context names (default: default)."""
    cfg = client.Configuration()
    namespace = "default"
    in_cluster = (
        kubeconfig_file is None
        and not os.environ.get("KUBECONFIG")
        and os.environ.get("KUBERNETES_SERVICE_HOST")
    )
    if in_cluster:
        config.load_incluster_config(client_configuration=cfg)
        sa_ns = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
        namespace = sa_ns.read_text().strip() if sa_ns.exists() else namespace
    else:
        loader = _loader(kubeconfig_paths(kubeconfig_file), context)
        loader.load_and_set(cfg)
        active: Any = loader.current_context
        namespace = (active or {}).get("context", {}).get("namespace") or namespace
    return client.ApiClient(cfg), namespace
