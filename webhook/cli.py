"""`configpin`: serve, render, certs, keygen, version."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import jsonpatch
import yaml
from pydantic import ValidationError

from webhook import __version__, status
from webhook.certs import generate, write_bundle
from webhook.config import Settings, default_text, env_name, flag_name
from webhook.core.constants import MODES
from webhook.core.digest import copy_signature
from webhook.core.model import JSONObject, SourceId
from webhook.core.plan import plan_object
from webhook.core.snapshot import snapshot_object
from webhook.digestkey import ensure_key_file, load_key_file, new_key_text
from webhook.kube.client import connect
from webhook.kube.raw import Kube
from webhook.kube.webhookconfig import set_ca_bundle
from webhook.logs import setup_logging
from webhook.serve import serve
from webhook.sources import EMBEDDED_MANIFESTS, FileSources, iter_manifests

log = logging.getLogger("configpin")


def _serve_parser(sub: Any) -> None:
    p = sub.add_parser(
        "serve",
        help="run the admission webhook (and, with a cluster, the controller)",
        description="Serve the admission webhook; with a cluster, also run the controller. "
        "Every flag is also an environment variable; a flag wins over the environment.",
    )
    add_settings_flags(p)


def add_settings_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per Settings field, its help made from the field: description, default and
    environment variable. Values are handed to Settings as given, so a wrong one is refused
    with the same rule whether it came from a flag or from the environment."""
    for field, info in Settings.model_fields.items():
        kwargs: dict[str, Any] = {
            "dest": field,
            "help": f"{info.description} [default: {default_text(field)}; env {env_name(field)}]",
        }
        annotation = info.annotation
        if annotation is bool:
            kwargs.update(action=argparse.BooleanOptionalAction, default=None)
        elif get_origin(annotation) is list:
            kwargs.update(action="append", metavar=field.upper().removesuffix("S"))
        elif get_origin(annotation) is Literal:
            kwargs.update(choices=get_args(annotation))
        else:
            kwargs.update(metavar=field.upper())
        parser.add_argument(flag_name(field), **kwargs)


def _settings_error(command: str, error: ValidationError) -> str:
    """`configpin serve: --port (CONFIGPIN_PORT): Input should be ... (got '70000')`."""
    lines = []
    for problem in error.errors():
        loc = problem.get("loc") or ("?",)
        field = str(loc[0])
        name = (
            f"{flag_name(field)} ({env_name(field)})" if field in Settings.model_fields else field
        )
        got = problem.get("input")
        shown = "" if isinstance(got, dict) else f" (got {got!r})"
        lines.append(f"configpin {command}: {name}: {problem['msg']}{shown}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="configpin",
        description="Pin pods to the exact ConfigMap and Secret content they were created with.",
        epilog="Every `serve` flag is also an environment variable: CONFIGPIN_<FLAG>.",
    )
    parser.add_argument("--version", action="version", version=f"configpin {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub)

    r = sub.add_parser("render", help="offline: mutate workload manifests as admission would")
    r.add_argument(
        "-f",
        "--filename",
        type=Path,
        action="append",
        required=True,
        help="file or folder; repeatable",
    )
    r.add_argument("--mode", choices=MODES, default="checksum")
    r.add_argument(
        "--digest-key-file", type=Path, help="default: the dev key in certs/ (made if missing)"
    )
    r.add_argument("--certs-dir", type=Path, default=Path("certs"))
    r.add_argument("--namespace", default="default", help="namespace of objects that name none")

    c = sub.add_parser("certs", help="certificates for the webhook")
    csub = c.add_subparsers(dest="certs_command", required=True)
    g = csub.add_parser(
        "generate", help="write ca.crt, tls.crt and tls.key for the webhook's Service"
    )
    g.add_argument("--service", default="configpin")
    g.add_argument("--namespace", default="configpin")
    g.add_argument("--out", type=Path, default=Path("certs"))
    g.add_argument("--days", type=int, default=365)
    g.add_argument(
        "--webhook-config-name", help="also put ca.crt into this MutatingWebhookConfiguration"
    )
    g.add_argument("--kubeconfig", type=Path)

    st = sub.add_parser(
        "status",
        help="is each workload pinned, to what, and is it stale? (also `kubectl configpin status`)",
        description="Compare what each workload's pod template records with what admission "
        "would record now (asked by a server-side dry run: no digest key, only your own "
        "rights). Exit 0: all current; 1: something stale or a required source missing; "
        "2: usage or connection error.",
    )
    status.add_arguments(st)

    sub.add_parser(
        "keygen", help="print a new random digest key (for --digest-key-file or the Secret)"
    )
    sub.add_parser("version", help="print the version")
    return parser


def _settings(args: argparse.Namespace) -> Settings:
    given = {k: v for k, v in vars(args).items() if k != "command" and v is not None}
    return Settings(**given)


def cmd_serve(settings: Settings) -> int:
    return serve(settings)


def cmd_render(args: argparse.Namespace) -> int:
    key_file = args.digest_key_file or ensure_key_file(args.certs_dir)
    hkey = load_key_file(key_file)
    objects = list(iter_manifests(args.filename))
    sources = FileSources(hkey, [o for o in objects if o.get("kind") in ("ConfigMap", "Secret")])
    out: list[JSONObject] = []
    snapshots: dict[tuple[str, str], JSONObject] = {}
    status = 0
    for obj in objects:
        if obj.get("kind") in ("ConfigMap", "Secret"):
            continue
        namespace = str((obj.get("metadata") or {}).get("namespace") or args.namespace)

        def lookup(sid: SourceId, namespace: str = namespace) -> Any:
            return sources.get(namespace, sid)

        plan = plan_object(
            obj, hkey=hkey, lookup=lookup, default_mode=args.mode, namespace=namespace
        )
        name = f"{obj.get('kind')}/{(obj.get('metadata') or {}).get('name', '?')}"
        for warning in plan.warnings:
            print(f"Warning: {name}: {warning}", file=sys.stderr)
        if plan.problems:
            status = 1
        out.append(jsonpatch.apply_patch(obj, plan.patch) if plan.patch else obj)
        for req in plan.snapshots:
            source = sources.get_object(namespace, req.source)
            if source is not None:
                signature = copy_signature(hkey, namespace, req.snapshot_name, req.content_digest)
                snap = snapshot_object(
                    req.source.kind,
                    source,
                    req.snapshot_name,
                    signature=signature,
                    namespace=namespace,
                )
                snapshots[(namespace, req.snapshot_name)] = snap
    docs = [*snapshots.values(), *out]
    try:
        yaml.safe_dump_all(docs, sys.stdout, sort_keys=False)
        sys.stdout.flush()
    except BrokenPipeError:  # `configpin render ... | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return status


def cmd_certs(args: argparse.Namespace) -> int:
    bundle = generate(args.service, args.namespace, validity_days=args.days)
    write_bundle(bundle, args.out)
    print(
        f"wrote ca.crt, tls.crt, tls.key into {args.out}/ (valid until {bundle.not_after:%Y-%m-%d})"
    )
    if args.webhook_config_name:
        api = connect(args.kubeconfig)
        if api is None:
            print(
                "no cluster configured: the webhook configuration was not changed", file=sys.stderr
            )
            return 1
        set_ca_bundle(Kube(api), args.webhook_config_name, bundle.ca_cert_pem)
        print(f"put the CA bundle into MutatingWebhookConfiguration {args.webhook_config_name}")
    return 0


def kubectl_plugin() -> int:
    """`kubectl-configpin` on PATH: kubectl runs it for `kubectl configpin ...`."""
    return main(sys.argv[1:])


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        try:
            settings = _settings(args)
        except ValidationError as e:
            print(_settings_error("serve", e), file=sys.stderr)
            return 2
        setup_logging(settings.log_level, settings.log_format)
        return cmd_serve(settings)
    setup_logging(os.environ.get("CONFIGPIN_LOG_LEVEL", "warning"))
    if args.command == "render":
        return cmd_render(args)
    if args.command == "certs":
        return cmd_certs(args)
    if args.command == "status":
        return status.run(args)
    if args.command == "keygen":
        print(new_key_text().decode())
        return 0
    print(f"configpin {__version__}")
    return 0


__all__ = ["EMBEDDED_MANIFESTS", "kubectl_plugin", "main"]
