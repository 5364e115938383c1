"""`configpin`: serve, render, certs, keygen, version."""

from __future__ import annotations

import argparse
import gc
import importlib.util
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal, get_args, get_origin

from webhook import __version__
from webhook.core.constants import MODES
from webhook.core.kinds import ARGO_ROLLOUT, parse_custom_kinds, use_custom_kinds
from webhook.core.owners import parse_owner_kinds, use_owner_kinds
from webhook.core.verbs import HELP as VERB_HELP
from webhook.kube.userflags import UserFlags
from webhook.process.digestkey import BadDigestKey, load_key_file, new_key_text
from webhook.process.logs import setup_logging

if TYPE_CHECKING:
    from pydantic import ValidationError

    from webhook.process.config import Settings

# The cluster client, the server, `status`, the settings model and the certificate code take
# over a second to import: the commands that use them import them, so `render` (a pipeline
# step) starts fast. The other way round, `render`'s YAML and JSON-patch code stay out of a
# server's memory.

log = logging.getLogger("configpin")


def _serve_parser(sub: Any, *, flags: bool = True) -> None:
    p = sub.add_parser(
        "serve",
        help="run the admission webhook (and, with a cluster, the controller)",
        description="Serve the admission webhook; with a cluster, also run the controller. "
        "It acts on a cluster only when one is named with --kubeconfig, or in a pod (in-cluster "
        "config): KUBECONFIG and ~/.kube/config are not read, so on a laptop it serves the "
        "embedded default sources (or --manifests) on 127.0.0.1 and changes nothing anywhere. "
        "Every flag is also an environment variable; a flag wins over the environment.",
    )
    if flags:
        add_settings_flags(p)


def add_settings_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per setting, under its group's heading, its help made from the field:
    description, default and environment variable. Values are handed to Settings as given,
    so a wrong one is refused with the same rule whether it came from a flag or from the
    environment."""
    from webhook.process.config import GROUPS, default_text, env_name, flag_name, flags_of

    for group in GROUPS.values():
        section = parser.add_argument_group(group.title)
        for field, info in flags_of(group).items():
            text = f"{info.description} [default: {default_text(field)}; env {env_name(field)}]"
            # argparse formats help with %: a literal one is doubled
            kwargs: dict[str, Any] = {"dest": field, "help": text.replace("%", "%%")}
            annotation = info.annotation
            if annotation is bool:
                kwargs.update(action=argparse.BooleanOptionalAction, default=None)
            elif get_origin(annotation) is list:
                kwargs.update(action="append", metavar=field.upper().removesuffix("S"))
            elif get_origin(annotation) is Literal:
                kwargs.update(choices=get_args(annotation))
            else:
                kwargs.update(metavar=field.upper())
            section.add_argument(flag_name(field), **kwargs)


def _settings_error(command: str, error: ValidationError) -> str:
    """`configpin serve: --port (CONFIGPIN_PORT): Input should be ... (got '70000')`."""
    from webhook.process.config import env_name, flag_name, flag_of

    lines = []
    for problem in error.errors():
        loc = problem.get("loc") or ("?",)
        field = flag_of(loc)
        name = f"{flag_name(field)} ({env_name(field)})" if field else str(loc[0])
        got = problem.get("input")
        shown = "" if isinstance(got, dict) else f" (got {got!r})"
        lines.append(f"configpin {command}: {name}: {problem['msg']}{shown}")
    return "\n".join(lines)


def program(argv0: str, default: str = "configpin") -> str:
    """The name help and usage give: `kubectl configpin` when kubectl runs us as its plugin (an
    executable `kubectl-configpin`, as kubectl names a plugin), else `configpin`."""
    name = os.path.basename(argv0)
    if name.startswith("kubectl-"):
        return "kubectl " + name.removeprefix("kubectl-").replace("_", "-")
    return default


def build_parser(
    argv: Sequence[str] | None = None, prog: str = "configpin"
) -> argparse.ArgumentParser:
    """The whole parser; given the command line, `status` gets its flags only when it is the
    command (they come with the cluster client, which other commands do without)."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Pin pods to the exact ConfigMap and Secret content they were created with.",
        epilog="Every `serve` flag is also an environment variable: CONFIGPIN_<FLAG>.",
    )
    parser.add_argument("--version", action="version", version=f"configpin {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub, flags=argv is None or "serve" in argv)

    _render_parser(sub)
    _certs_parser(sub)
    _cluster_parsers(sub, argv)
    sub.add_parser(
        "keygen", help="print a new random digest key (for --digest-key-file or the Secret)"
    )
    _client_parsers(sub, argv)
    return parser


def _client_parsers(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], argv: Sequence[str] | None
) -> None:
    """`version` and `completion`."""
    v = sub.add_parser(
        "version",
        help="print the client's version and the cluster's: configpin's and Kubernetes'",
        description="Print this client's version and, where it can read them, the version of "
        "the configpin running in the cluster (its Deployment) and of the Kubernetes API "
        "server, as kubectl version does. What it cannot read it says; it exits 0 anyway.",
    )
    if argv is None or "version" in argv:
        from webhook.commands import version

        version.add_arguments(v)
    c = sub.add_parser(
        "completion",
        help="print a bash or zsh completion script (source <(configpin completion bash))",
        description="Print a script that completes commands, flags and their values in bash "
        "or zsh. As the kubectl plugin, kubectl (1.26 and newer) completes `kubectl configpin` "
        "itself through kubectl_complete-configpin: the script loads kubectl's completion.",
    )
    c.add_argument("shell", choices=("bash", "zsh"))


def _render_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`configpin render`: offline, from files."""
    r = sub.add_parser(
        "render",
        help="offline: print manifests as admission would make them",
        description=(
            "Read workloads and their ConfigMaps/Secrets from files (or standard input) and "
            "print every document, with the pod templates as admission would make them. "
            "Exit status: 0 all pinned; 1 findings (a required source missing, a source the "
            "API server would refuse), output still printed; 2 unusable input, nothing printed."
        ),
    )
    r.add_argument(
        "-f",
        "--filename",
        action="append",
        help="file or folder (*.yaml, *.yml, *.json, recursively); '-' or none: standard input",
    )
    r.add_argument("--mode", choices=MODES, default="checksum")
    _kind_arguments(r)
    keys = r.add_mutually_exclusive_group()
    keys.add_argument("--digest-key-file", type=Path, help="the key file the server uses")
    keys.add_argument(
        "--digest-key-secret",
        metavar="[NAMESPACE/]NAME",
        help="read the cluster's key from this Secret (read-only; default namespace configpin)",
    )
    r.add_argument(
        "--kubeconfig",
        type=Path,
        help="for --digest-key-secret (default: KUBECONFIG, ~/.kube/config)",
    )
    r.add_argument(
        "--namespace",
        default="default",
        help="namespace of objects that name none, as kubectl -n would (default: default)",
    )
    r.add_argument(
        "--allow-missing",
        action="append",
        default=[],
        metavar="KIND/NAME",
        help="a source made elsewhere: no finding when missing (glob: 'secret/db-*'); repeatable",
    )
    r.add_argument(
        "--skip-invalid",
        action="store_true",
        help="leave out what cannot be read or is not an object (said on stderr) instead of exit 2",
    )


def _certs_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`configpin certs generate`."""
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


def _cluster_parsers(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], argv: Sequence[str] | None
) -> None:
    """The commands that read the cluster with the user's own rights (status, plan, approve,
    wait, dashboard): each one's flags only when it is the command, or for the whole parser."""
    st = sub.add_parser(
        "status",
        help="is each workload pinned, to what, and is it stale? (also `kubectl configpin status`)",
        description="Compare what each workload's pod template records with what admission "
        "would record now (asked by a server-side dry run: no digest key, only your own "
        "rights). Exit 0: every workload known to be current (or not pinned); 1: a change "
        "not delivered yet (stale, waiting, rolling, held) or one that failed, a required source "
        "missing; 2: a workload it could not judge (your rights refuse the dry run: it needs "
        "'create' on the kind), or a usage or connection error.",
    )
    if argv is None or "status" in argv:
        from webhook.commands import status

        status.add_arguments(st)
        _kind_arguments(st)

    pl = sub.add_parser(
        "plan",
        help="what applying a ConfigMap or Secret would do, workload by workload (also "
        "`kubectl configpin plan`)",
        description="A server-side dry run of applying each ConfigMap and Secret of the files, "
        "with your own rights: configpin's admission answers with which workloads consume the "
        "changed keys and what each will do (roll, in which wave; refresh; nothing; hold). "
        "Changes nothing. Exit 0: planned; 2: usage or connection error.",
    )
    if argv is None or "plan" in argv:
        from webhook.commands import changes

        changes.add_arguments(pl)

    ap = sub.add_parser(
        "approve",
        help="approve the content a ConfigMap or Secret holds now, for the waves after an "
        "`approve` step; --now: roll it now, whatever windows and budget say (also `kubectl "
        "configpin approve`)",
        description="Records your approval of the source's current content (an update of the "
        "source: your right to update it is what is checked); a newer change needs its own. "
        "With --now, an emergency's override: its consumers roll it now, whatever their "
        "rollout windows and rollout budget say, and the record names you. "
        "Exit 0: approved; 1: configpin did not record it; 2: usage or connection error.",
    )
    if argv is None or "approve" in argv:
        from webhook.commands import changes

        changes.add_approve_arguments(ap)
    for verb, (short, long) in VERB_HELP.items():
        vp = sub.add_parser(verb.value, help=short, description=long)
        if argv is None or verb.value in argv:
            from webhook.commands import verbs

            verbs.add_arguments(vp)

    wt = sub.add_parser(
        "wait",
        help="wait until the change a ConfigMap or Secret holds now is delivered (also "
        "`kubectl configpin wait`)",
        description="Wait until configpin has delivered the change each ConfigMap or Secret "
        "holds now (its ConfigRollout says Ready about the source as it stands: never an "
        "earlier change's verdict), or it has failed, or --timeout has passed. Only your own "
        "rights: 'get' on the sources and on configrollouts.configpin.io. Exit 0: every change "
        "delivered; 1: one failed, was rolled back, held or paused; 2: usage or connection "
        "error, a source missing or not readable, or the timeout.",
    )
    if argv is None or "wait" in argv:
        from webhook.commands import wait

        wait.add_arguments(wt)

    db = sub.add_parser(
        "dashboard",
        help="a local web page of changes, waves, consumers and approvals, over your own "
        "kubeconfig and rights (also `kubectl configpin dashboard`)",
        description="Serve a web page on this machine (loopback by default) that shows recent "
        "changes of ConfigMaps and Secrets with their waves as a live timeline, who uses which "
        "key, each workload's status, and a preview of a manifest; with an Approve button. It "
        "acts only with your own rights and installs nothing in the cluster. Exit 0: stopped; "
        "2: usage, connection or bind error.",
    )
    if argv is None or "dashboard" in argv:
        from webhook.commands.dashboard import command

        command.add_arguments(db)
        _kind_arguments(db)

    mg = sub.add_parser(
        "migrate",
        help="what configpin does with the cluster's Stakater Reloader annotations, and the "
        "commands to move over; changes nothing (also `kubectl configpin migrate`)",
        description="Read every workload with Reloader's annotations and every ConfigMap or "
        "Secret annotated reloader.stakater.com/match or /ignore (your own rights; Secrets as "
        "metadata), and print for each what configpin does the same (with the annotation or "
        "default that does it, and the kubectl command where one is needed), differently, or "
        "not at all, what happens while both run, and the commands that opt the namespaces "
        "in. Exit 0: the report is whole; 2: usage or connection error, or a read refused.",
    )
    if argv is None or "migrate" in argv:
        from webhook.commands import migrate

        migrate.add_arguments(mg)


def _kind_arguments(p: argparse.ArgumentParser) -> None:
    """The workload kinds beyond the built-in ones, as `configpin serve` takes them."""
    p.add_argument(
        "--workload-kinds",
        default="",
        metavar="G/V/RESOURCE/KIND=PATH,...",
        help="custom kinds with a pod template, as configpin serve's --workload-kinds",
    )
    p.add_argument(
        "--argo-rollouts",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="Argo Rollouts' Rollout as a workload kind (default: on)",
    )
    p.add_argument(
        "--pin-owned-by",
        default="",
        metavar="KIND.GROUP,...",
        help="owner kinds whose workloads are pinned, as configpin serve's --pin-owned-by",
    )


def _use_kinds(command: str, args: argparse.Namespace) -> str | None:
    """Handle the kinds the arguments name; the problem, if they are wrong."""
    try:
        custom = parse_custom_kinds(args.workload_kinds)
        owners = parse_owner_kinds(args.pin_owned_by)
    except ValueError as e:
        return f"configpin {command}: {e}"
    argo = (ARGO_ROLLOUT,) if args.argo_rollouts else ()
    use_custom_kinds((*(k for k in argo if all(c.kind != k.kind for c in custom)), *custom))
    use_owner_kinds(owners)
    return None


def _settings(args: argparse.Namespace) -> Settings:
    from webhook.process.config import Settings

    given = {k: v for k, v in vars(args).items() if k != "command" and v is not None}
    return Settings(**given)


def cmd_serve(settings: Settings) -> int:
    from webhook.commands.serve import serve
    from webhook.kube.client import ConfigError

    try:
        return serve(settings)
    except ConfigError as e:
        print(f"configpin serve: cannot connect to the cluster: {e}", file=sys.stderr)
        return 2


def _render_key(args: argparse.Namespace) -> bytes:
    """The digest key: a file, the cluster's Secret (one GET), else a one-off key, said so."""
    if args.digest_key_file is not None:
        return load_key_file(args.digest_key_file)
    if args.digest_key_secret:
        namespace, _, name = args.digest_key_secret.rpartition("/")
        namespace = namespace or "configpin"
        kubeconfig = args.kubeconfig
        default = Path.home() / ".kube" / "config"
        if kubeconfig is None and not os.environ.get("KUBECONFIG") and default.is_file():
            kubeconfig = default
        where = f"the digest key Secret {namespace}/{name}"
        from webhook.kube.client import connect
        from webhook.kube.digestkey import read_digest_key
        from webhook.kube.errors import KubeError
        from webhook.kube.raw import Kube

        try:
            api = connect(kubeconfig)
            if api is None:
                raise BadDigestKey(f"{where}: no cluster configured (--kubeconfig)")
            with api:
                return read_digest_key(Kube(api), namespace, name)
        except BadDigestKey:
            raise
        except KubeError as e:
            raise BadDigestKey(f"cannot read {where}: {e}") from e
        except Exception as e:  # kubeconfig, TLS, network: say what and stop
            raise BadDigestKey(f"cannot read {where}: {type(e).__name__}: {e}") from e
    print(
        "configpin render: no --digest-key-file or --digest-key-secret: digests use a one-off "
        "key and match no cluster",
        file=sys.stderr,
    )
    return new_key_text()


def cmd_render(args: argparse.Namespace) -> int:
    from webhook.commands.render import EXIT_UNUSABLE, check_allow_missing, stdin_is_terminal
    from webhook.inputs.manifests import STDIN

    for pattern in args.allow_missing:
        problem = check_allow_missing(pattern)
        if problem is not None:
            print(f"configpin render: {problem}", file=sys.stderr)
            return EXIT_UNUSABLE
    paths: list[str] = [str(p) for p in args.filename or [STDIN]]
    if STDIN in paths and stdin_is_terminal():
        print(
            "configpin render: no input: give -f FILE_OR_FOLDER, or pipe manifests in",
            file=sys.stderr,
        )
        return EXIT_UNUSABLE
    try:
        hkey = _render_key(args)
    except BadDigestKey as e:
        print(f"configpin render: {e}", file=sys.stderr)
        return EXIT_UNUSABLE
    # A run builds millions of objects that live until it ends and hold no cycles: the cycle
    # collector would only walk them again and again (5% of a 20 MB render). Back on after.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _render_and_print(paths, hkey, args)
    finally:
        if was_enabled:
            gc.enable()


def _render_and_print(paths: list[str], hkey: bytes, args: argparse.Namespace) -> int:
    from webhook.commands.render import Options as RenderOptions
    from webhook.commands.render import read_inputs, render

    docs, errors = read_inputs(paths, sys.stdin.buffer)
    options = RenderOptions(
        mode=args.mode,
        namespace=args.namespace,
        allow_missing=tuple(args.allow_missing),
        skip_invalid=args.skip_invalid,
    )
    outcome = render(hkey, docs, errors, options)
    for message in outcome.messages:
        print(message, file=sys.stderr)
    try:
        sys.stdout.flush()
        # As bytes: whatever the locale, the manifests go out as UTF-8.
        sys.stdout.buffer.write(outcome.output.encode("utf-8", "replace"))
        sys.stdout.buffer.flush()
    except BrokenPipeError:  # `configpin render ... | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return outcome.status


def cmd_certs(args: argparse.Namespace) -> int:
    from webhook.kube.client import connect
    from webhook.kube.raw import Kube
    from webhook.kube.webhookconfig import set_ca_bundle
    from webhook.tls.certgen import generate
    from webhook.tls.certs import write_bundle

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
    return main(sys.argv[1:], prog=program(sys.argv[0], "kubectl configpin"))


def kubectl_complete() -> int:
    """`kubectl_complete-configpin` on PATH: kubectl (1.26 and newer) runs it with the words
    after `kubectl configpin`, the last one being typed, to complete them."""
    from webhook.commands import completion

    words = sys.argv[1:]
    return completion.run(build_parser(words, "kubectl configpin"), words)


# What `configpin serve` needs beyond the CLI's own dependencies: `pip install configpin` is
# the CLI and the kubectl plugin alone, `configpin[server]` the server (pyproject.toml).
SERVER_MODULES: Final = ("fastapi", "uvicorn", "pydantic_settings", "prometheus_client", "pybase64")


def server_missing() -> str | None:
    """The first module of the server's dependencies that is not installed, if any."""
    return next((m for m in SERVER_MODULES if importlib.util.find_spec(m) is None), None)


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    prog = prog or program(sys.argv[0])
    if argv[:1] == ["__complete"]:  # what the completion scripts ask (webhook.commands.completion)
        from webhook.commands import completion

        return completion.run(build_parser(argv[1:], prog), argv[1:])
    first = next((a for a in argv if not a.startswith("-")), None)
    if first == "serve" and (missing := server_missing()) is not None:
        print(
            f"configpin serve: the server's dependencies are not installed (no module "
            f"{missing}): pip install 'configpin[server]'",
            file=sys.stderr,
        )
        return 2
    args = build_parser(argv, prog).parse_args(argv)
    if args.command == "serve":
        from pydantic import ValidationError

        try:
            settings = _settings(args)
        except ValidationError as e:
            print(_settings_error("serve", e), file=sys.stderr)
            return 2
        setup_logging(settings.logging.level, settings.logging.format)
        return cmd_serve(settings)
    setup_logging(os.environ.get("CONFIGPIN_LOG_LEVEL", "warning"))
    if (problem := UserFlags.of(args).problem()) is not None:  # as kubectl refuses it
        print(f"configpin {args.command}: {problem}", file=sys.stderr)
        return 2
    if args.command in ("render", "status", "dashboard"):
        problem = _use_kinds(args.command, args)
        if problem is not None:
            print(problem, file=sys.stderr)
            return 2
    if args.command == "render":
        return cmd_render(args)
    if args.command == "certs":
        return cmd_certs(args)
    if args.command == "status":
        from webhook.commands import status

        return status.run(args)
    if args.command == "plan":
        from webhook.commands import changes

        return changes.run(args)
    if args.command == "approve":
        from webhook.commands import changes

        return changes.approve(args)
    if args.command in ("pause", "resume", "abort", "retry"):
        from webhook.commands import verbs

        return verbs.run(args)
    if args.command == "wait":
        from webhook.commands import wait

        return wait.run(args)
    if args.command == "dashboard":
        from webhook.commands.dashboard import command

        return command.run(args)
    if args.command == "migrate":
        from webhook.commands import migrate

        return migrate.run(args)
    if args.command == "keygen":
        print(new_key_text().decode())
        return 0
    if args.command == "completion":
        from webhook.commands import completion

        print(completion.script(args.shell, prog), end="")
        return 0
    from webhook.commands import version

    return version.run(args)


__all__ = ["kubectl_complete", "kubectl_plugin", "main"]
