"""`configpin dashboard` (`kubectl configpin dashboard`): serve the page on the user's machine
until stopped (Ctrl-C).

Exit status: 0 stopped; 2 usage, connection or bind error.
"""

from __future__ import annotations

import argparse
import ipaddress
import secrets
import sys
from typing import TYPE_CHECKING, Final

from webhook.core.kinds import BUILTIN_KINDS, WorkloadKind, custom_kinds
from webhook.kube.userflags import add_user_arguments

if TYPE_CHECKING:
    from webhook.kube.raw import Kube

DEFAULT_PORT: Final = 3100
DEFAULT_ADDRESS: Final = "127.0.0.1"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        help=f"port to serve on (default {DEFAULT_PORT}; 0: any free one, printed)",
    )
    p.add_argument(
        "--address",
        default=DEFAULT_ADDRESS,
        help="address to serve on (default: loopback only; anyone who can reach another "
        "address acts with your credentials)",
    )
    p.add_argument("-n", "--namespace", help="namespace (default: the context's)")
    p.add_argument("-A", "--all-namespaces", action="store_true", help="every namespace")
    # Seconds the page keeps the API server's answer on the user's rights (webhook.commands.
    # dashboard.rights.TTL); not shown: the browser tests lengthen it to press a button whose
    # right was taken away after the page asked, whatever the machine's speed.
    p.add_argument("--rights-ttl", type=float, default=None, help=argparse.SUPPRESS)
    add_user_arguments(p)


def _kinds(kube: Kube) -> list[tuple[WorkloadKind, str]]:
    """Each workload kind `configpin status` reports on, with where the cluster serves it."""
    from webhook.kube.workloads import served_prefix

    out: list[tuple[WorkloadKind, str]] = []
    for kind in [*(k for k in BUILTIN_KINDS if k.admitted and k.template), *custom_kinds()]:
        try:
            prefix = served_prefix(kube, kind)
        except Exception:  # discovery refused or unreachable: the preferred version
            prefix = kind.prefix()
        if prefix is not None:
            out.append((kind, prefix))
    return out


def url_of(address: str, port: int) -> str:
    """The page's address as printed: localhost for the default loopback address."""
    ip = ipaddress.ip_address(address)
    if str(ip) == DEFAULT_ADDRESS:
        return f"http://localhost:{port}/"
    host = f"[{ip}]" if ip.version == 6 else str(ip)
    return f"http://{host}:{port}/"


def run(args: argparse.Namespace) -> int:
    try:
        ip = ipaddress.ip_address(args.address)
    except ValueError:
        print(
            f"configpin dashboard: --address {args.address!r}: an IP address (default "
            f"{DEFAULT_ADDRESS})",
            file=sys.stderr,
        )
        return 2
    if not 0 <= args.port <= 65535:
        print("configpin dashboard: --port: 0 to 65535", file=sys.stderr)
        return 2

    from kubernetes import config

    from webhook.commands.dashboard.app import App
    from webhook.commands.dashboard.feeds import MetadataKube, Store
    from webhook.commands.dashboard.guard import Fence
    from webhook.commands.dashboard.http import Server
    from webhook.commands.dashboard.rights import TTL, Rights
    from webhook.commands.dashboard.statuses import StatusBook
    from webhook.commands.status import StatusReader
    from webhook.kube.raw import Kube
    from webhook.kube.user import connect_from_args, kubeconfig_names

    try:
        api, default_ns = connect_from_args(args)
    except (config.ConfigException, OSError) as e:
        print(f"configpin dashboard: no cluster: {e}", file=sys.stderr)
        return 2
    namespace = None if args.all_namespaces else (args.namespace or default_ns)
    with api:
        kube = Kube(api)
        try:
            server = Server((str(ip), args.port))
        except OSError as e:
            print(
                f"configpin dashboard: cannot serve on {args.address} port {args.port}: {e}",
                file=sys.stderr,
            )
            return 2
        port = server.server_port
        store = Store(kube, namespace, _kinds(kube), secrets_kube=MetadataKube(api))
        book = StatusBook(StatusReader(Kube(api)), store.bump)
        fence = Fence(str(ip), port, secrets.token_urlsafe(32))
        scope = f"namespace {namespace}" if namespace else "every namespace"
        user, context = kubeconfig_names(args)
        ttl = getattr(args, "rights_ttl", None)
        rights = Rights(kube, user, context, ttl=TTL if ttl is None else ttl)
        server.app = App(
            fence, store, book, kube, scope=scope, context=args.context or "", rights=rights
        )
        server.store = store
        store.start()
        if not ip.is_loopback:
            print(
                f"configpin dashboard: serving on {ip}, not loopback: anyone who can reach it "
                "acts with your credentials",
                file=sys.stderr,
            )
        print(f"configpin dashboard: {url_of(str(ip), port)} (Ctrl-C to stop)", flush=True)
        try:
            server.serve_forever(poll_interval=0.5)
        except KeyboardInterrupt:
            pass
        finally:
            store.stop()
            book.close()
            server.server_close()
    return 0
