"""`configpin version` (`kubectl configpin version`): this client's version and, as `kubectl
version` prints the API server's beside its own, what runs in the cluster: the configpin the chart
installed (its Deployment's `app.kubernetes.io/version` label and image) and the Kubernetes API
server's version (`GET /version`, which every user may read).

What cannot be read (no cluster configured, no right to list Deployments, a server that does not
answer) is said in place of the version, and the command still exits 0: it is asked in bug
reports and by scripts that must not stop there. `--client`: the client alone, no cluster.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from typing import Any, Final, TextIO

import yaml

from webhook import __version__
from webhook.kube.errors import Forbidden, KubeError
from webhook.kube.raw import Kube, path
from webhook.kube.user import connect_from_args
from webhook.kube.userflags import add_user_arguments

# The chart's Deployment: its labels (charts/configpin/templates/_helpers.tpl, configpin.labels).
SELECTOR: Final = (
    "app.kubernetes.io/part-of=configpin,app.kubernetes.io/component=admission-webhook"
)
LABEL_VERSION: Final = "app.kubernetes.io/version"  # the chart's appVersion
CONTAINER: Final = "configpin"  # the chart's container of the webhook
DEFAULT_NAMESPACE: Final = "configpin"  # where the README installs it


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--client", action="store_true", help="this client's version only")
    p.add_argument("-o", "--output", choices=("json", "yaml"), help="output format")
    p.add_argument(
        "-n",
        "--namespace",
        help="where configpin runs (default: every namespace, else "
        f"{DEFAULT_NAMESPACE} for a user who may not list Deployments in all)",
    )
    add_user_arguments(p)


def installs(deployments: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each configpin Deployment as the version command shows it: where, which version (its
    label, else its image's tag), its image, and how many of its replicas are ready."""
    out = []
    for dep in deployments:
        meta = dep.get("metadata") or {}
        containers = ((dep.get("spec") or {}).get("template") or {}).get("spec", {})
        containers = containers.get("containers") or []
        image = next(
            (c.get("image") for c in containers if c.get("name") == CONTAINER),
            containers[0].get("image") if containers else None,
        )
        tag = None
        if isinstance(image, str) and "@" not in image:
            name, _, tag = image.rpartition(":")
            tag = tag if name and "/" not in tag else None
        status = dep.get("status") or {}
        out.append(
            {
                "namespace": meta.get("namespace"),
                "name": meta.get("name"),
                "version": (meta.get("labels") or {}).get(LABEL_VERSION) or tag,
                "image": image,
                "replicas": int((dep.get("spec") or {}).get("replicas", 1) or 0),
                "readyReplicas": int(status.get("readyReplicas") or 0),
            }
        )
    return sorted(out, key=lambda i: (str(i["namespace"]), str(i["name"])))


def _deployments(kube: Kube, namespace: str | None) -> list[Mapping[str, Any]]:
    """The configpin Deployments in `namespace`, else in every namespace, else (that refused)
    in the default one."""
    where = [namespace] if namespace else [None, DEFAULT_NAMESPACE]
    for i, ns in enumerate(where):
        try:
            doc = kube.get(path("deployments", ns), labelSelector=SELECTOR)
        except Forbidden:
            if i + 1 < len(where):
                continue
            raise
        return list(doc.get("items") or [])
    return []


def server_versions(kube: Kube, namespace: str | None) -> dict[str, Any]:
    """What the cluster says, each part on its own: a part that cannot be read is None, and
    why is under its name in `problems`."""
    found: dict[str, Any] = {"serverVersion": None, "kubernetesVersion": None}
    problems: dict[str, str] = {}
    try:
        found["kubernetesVersion"] = kube.get("/version")
    except KubeError as e:
        problems["kubernetesVersion"] = str(e)
        if e.status is None:  # the server did not answer: it will not answer the list either
            problems["serverVersion"] = str(e)
            return {**found, "problems": problems}
    try:
        found["serverVersion"] = installs(_deployments(kube, namespace))
    except KubeError as e:
        problems["serverVersion"] = f"cannot list its Deployments: {e}"
    return {**found, "problems": problems} if problems else found


def _said(install: Mapping[str, Any]) -> str:
    return (
        f"{install['version'] or 'unknown'} (Deployment {install['namespace']}/"
        f"{install['name']}, image {install['image']}, {install['readyReplicas']}/"
        f"{install['replicas']} ready)"
    )


def text(doc: Mapping[str, Any], *, client_only: bool) -> str:
    lines = [f"Client Version: {doc['clientVersion']['version']}"]
    if client_only:
        return lines[0] + "\n"
    problems: Mapping[str, str] = doc.get("problems") or {}
    servers = doc.get("serverVersion")
    if servers is None:
        lines.append(f"Server Version: unknown ({problems.get('serverVersion', 'not read')})")
    elif not servers:
        lines.append(f"Server Version: none installed (no Deployment labelled {SELECTOR})")
    else:
        lines += [f"Server Version: {_said(s)}" for s in servers]
    kubernetes = doc.get("kubernetesVersion")
    if kubernetes is None:
        why = problems.get("kubernetesVersion", "not read")
        lines.append(f"Kubernetes Version: unknown ({why})")
    else:
        lines.append(f"Kubernetes Version: {kubernetes.get('gitVersion', '?')}")
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    doc: dict[str, Any] = {
        "clientVersion": {"version": __version__, "python": sys.version.split()[0]}
    }
    if not args.client:
        try:
            api, _ = connect_from_args(args)
        except Exception as e:  # kubeconfig, credentials: said, not a failure of this command
            problem = f"no cluster: {e}"
            doc.update(
                serverVersion=None,
                kubernetesVersion=None,
                problems={"serverVersion": problem, "kubernetesVersion": problem},
            )
        else:
            with api:
                doc.update(server_versions(Kube(api, timeout=10.0), args.namespace))
    if args.output == "json":
        print(json.dumps(doc, indent=2), file=out)
    elif args.output == "yaml":
        print(yaml.safe_dump(doc, sort_keys=False), end="", file=out)
    else:
        print(text(doc, client_only=args.client), end="", file=out)
    return 0


__all__ = ["add_arguments", "installs", "run", "server_versions", "text"]
