"""A client as the user at the keyboard: their kubeconfig and context, as kubectl reads them
(`configpin status`, `configpin plan`: only their own rights), and what kubectl's flags ask of
each request: `--as`/`--as-group` sent as kubectl sends them (Impersonate-User, one
Impersonate-Group line per group), `--request-timeout` applied to every request
(`webhook.kube.userflags`).

A `KUBECONFIG` list is merged as kubectl merges it: files that do not exist (or are empty) are
skipped, the first file to name a cluster, context or user wins, and so does the first to set
`current-context`. (The Kubernetes client's own merge lets the last file's `current-context`
win, and stops at an empty file.) `--kubeconfig` names one file, as kubectl's does."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.config.kube_config import KubeConfigLoader, KubeConfigMerger

from webhook.kube.client import Connection
from webhook.kube.userflags import UserFlags, kubeconfig_paths


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
    kubeconfig_file: Path | None, context: str | None, flags: UserFlags | None = None
) -> tuple[Connection, str]:
    """A connection with the user's own credentials (kubeconfig, or in-cluster), and the
    namespace their context names (default: default). `flags`: what kubectl's flags ask of
    every request (impersonation, --request-timeout); its kubeconfig and context are the
    arguments'."""
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
    conn = Connection.of_api_client(client.ApiClient(cfg))
    if flags is not None:
        conn.lines = flags.header_lines()
        conn.request_timeout = flags.request_timeout
    return conn, namespace


def connect_from_args(args: argparse.Namespace) -> tuple[Connection, str]:
    """`connect_as_user` as a command's flags ask (`webhook.kube.userflags`)."""
    flags = UserFlags.of(args)
    return connect_as_user(flags.kubeconfig, flags.context, flags)


def kubeconfig_names(args: argparse.Namespace) -> tuple[str, str]:
    """The user and context names the kubeconfig (and `--context`) give the connection
    `connect_from_args` makes (`--as`: that user), as the kubeconfig names them: nothing the
    API server said. ("", ""): in-cluster, or not read."""
    flags = UserFlags.of(args)
    try:
        loader = _loader(kubeconfig_paths(flags.kubeconfig), flags.context)
        active: Any = loader.current_context or {}
    except (config.ConfigException, OSError):
        return flags.as_user or "", ""
    user = str((active.get("context") or {}).get("user") or "")
    return flags.as_user or user, str(active.get("name") or "")
