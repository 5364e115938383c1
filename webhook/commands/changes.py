"""`configpin plan -f FILE` (`kubectl configpin plan`): what applying a ConfigMap or Secret
would do, as a table, from a server-side dry run of the apply, changing nothing; and
`configpin approve configmap/NAME`: approve the content a source holds now, for the waves
after an `approve` step (`--now`: and roll it now, whatever its windows and rollout budget
say: the override of an emergency).

The dry run goes through admission as the real apply would, with the user's own credentials
and rights; configpin's webhook answers with the full plan (`configpin.io/plan` asked for in
the request, answered in the dry run's result, never stored): which workloads consume which
of the changed keys, and what each will do.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from webhook.core.constants import (
    ANN_APPROVE,
    ANN_APPROVED,
    ANN_PLAN,
    APPROVE_NOW,
    PLAN_REQUEST,
)
from webhook.core.model import (
    SOURCE_API_KINDS,
    SourceId,
    SourceKind,
    source_kind,
    typed_source_kind,
)
from webhook.inputs.manifests import decode, read_text
from webhook.kube.errors import Conflict, Forbidden, KubeError, NotFound
from webhook.kube.raw import MERGE_PATCH, Kube, path
from webhook.kube.user import connect_from_args
from webhook.kube.userflags import add_user_arguments

APPLY_PATCH = "application/apply-patch+yaml"
FIELD_MANAGER = "configpin-plan"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-f", "--filename", action="append", required=True, type=Path,
        help="a file of ConfigMaps and Secrets (YAML or JSON; may repeat)",
    )  # fmt: skip
    p.add_argument("-n", "--namespace", help="namespace of objects that name none")
    p.add_argument("-o", "--output", choices=("table", "json"), default="table")
    add_user_arguments(p)


def dry_run_plan(kube: Kube, namespace: str, obj: dict[str, Any]) -> dict[str, Any]:
    """The plan of applying `obj`: configpin's answer in the dry run's result (also the
    dashboard's preview)."""
    kind, name = source_kind(obj["kind"]), obj["metadata"]["name"]
    assert kind is not None  # (`_objects`: sources only)
    body = json.loads(json.dumps(obj))
    meta = body.setdefault("metadata", {})
    meta["namespace"] = namespace
    meta.setdefault("annotations", {})[ANN_PLAN] = PLAN_REQUEST
    api_path = path(kind.resource, namespace, name)
    try:
        kube.get(api_path)
    except NotFound:
        return {"new": True, "rows": [], "keys": []}
    result = kube.patch(
        api_path, body, content_type=APPLY_PATCH, dryRun="All", fieldManager=FIELD_MANAGER,
        force="true",
    )  # fmt: skip
    text = ((result.get("metadata") or {}).get("annotations") or {}).get(ANN_PLAN)
    if text in (None, PLAN_REQUEST):
        return {"unknown": "configpin did not answer (not installed for this namespace, or "
                "down: its webhook ignores failures)", "rows": [], "keys": []}  # fmt: skip
    if text == "not-ready":
        return {"unknown": "configpin is still reading the cluster's workloads", "rows": []}
    plan: dict[str, Any] = json.loads(text)
    return plan


def _objects(files: Sequence[Path]) -> list[dict[str, Any]]:
    out = []
    for file in files:
        out += sources_in(file.read_bytes(), str(file))
    return out


def sources_in(data: bytes, name: str) -> list[dict[str, Any]]:
    """The ConfigMaps and Secrets of a file's bytes (YAML or JSON); raises
    webhook.inputs.manifests.InputError for what cannot be read."""
    out = []
    for doc in read_text(decode(data, name), name):
        obj = doc.obj
        if (
            isinstance(obj, dict)
            and obj.get("kind") in SOURCE_API_KINDS
            and obj.get("apiVersion") == "v1"
        ):
            out.append(obj)
    return out


def _table(kind: str, namespace: str, name: str, plan: dict[str, Any]) -> list[str]:
    head = f"{kind} {namespace}/{name}"
    if plan.get("new"):
        return [f"{head}: new: created by the apply, nothing consumed it before"]
    if plan.get("unknown"):
        return [f"{head}: no plan: {plan['unknown']}"]
    keys = plan.get("keys") or []
    rows = plan.get("rows") or []
    if not keys:
        return [f"{head}: no key changes: nothing rolls"]
    lines = [f"{head}: keys {', '.join(keys)}"]
    width = max([len(f"{r['kind']}/{r['name']}") for r in rows] + [8])
    lines.append(f"  {'NAMESPACE':<20} {'WORKLOAD':<{width}} {'KEYS':<24} {'ACTION':<16} WAVE")
    for r in rows:
        lines.append(
            f"  {r['namespace']:<20} {r['kind'] + '/' + r['name']:<{width}} "
            f"{','.join(r['keys']) or '-':<24} {r['action']:<16} {r['wave'] or '-'}"
        )
    if plan.get("more"):
        lines.append(f"  ... and {plan['more']} more")
    if not rows:
        lines.append("  (no workload consumes it)")
    return lines


def run(args: argparse.Namespace) -> int:
    try:
        objects = _objects(args.filename)
    except (OSError, ValueError) as e:
        print(f"configpin plan: {e}", file=sys.stderr)
        return 2
    if not objects:
        print("configpin plan: no ConfigMap or Secret in the files given", file=sys.stderr)
        return 2
    try:
        api, default_ns = connect_from_args(args)
    except Exception as e:
        print(f"configpin plan: no cluster: {e}", file=sys.stderr)
        return 2
    results = []
    with api:
        kube = Kube(api)
        for obj in objects:
            namespace = obj["metadata"].get("namespace") or args.namespace or default_ns
            try:
                plan = dry_run_plan(kube, namespace, obj)
            except KubeError as e:
                print(
                    f"configpin plan: {obj['kind']} {obj['metadata']['name']}: {e}", file=sys.stderr
                )
                return 2
            results.append((obj["kind"], namespace, obj["metadata"]["name"], plan))
    if args.output == "json":
        doc = [{"kind": k, "namespace": ns, "name": n, **plan} for k, ns, n, plan in results]
        print(json.dumps(doc, indent=2))
    else:
        for kind, ns, name, plan in results:
            print("\n".join(_table(kind, ns, name, plan)))
    return 0


def add_approve_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", help="configmap/NAME or secret/NAME")
    p.add_argument("-n", "--namespace", help="namespace (default: the context's)")
    p.add_argument(
        "--now", action="store_true",
        help="an emergency: roll this content now, whatever the consumers' rollout windows "
        "and rollout budget say (recorded with your name)",
    )  # fmt: skip
    add_user_arguments(p)


def ask_admission(kube: Kube, api_path: str, asked: str, key: str = ANN_APPROVE) -> dict[str, Any]:
    """Set the request annotation `key` (configpin.io/approve: request, or now; the verbs'
    configpin.io/act) to `asked` on the source, as the user: a patch, or, for a user allowed
    to update but not to patch it, a read and a replace (retried on a conflict)."""
    body = {"metadata": {"annotations": {key: asked}}}
    try:
        return kube.patch(api_path, body, content_type=MERGE_PATCH)
    except Forbidden:
        pass
    for _ in range(5):
        obj = kube.get(api_path)
        obj.setdefault("metadata", {}).setdefault("annotations", {})[key] = asked
        try:
            return kube.replace(api_path, obj)
        except Conflict:
            continue
    raise Conflict(f"PUT {api_path}", 409, "the source kept changing")


def approval(
    kube: Kube, kind: SourceKind, namespace: str, name: str, *, now: bool = False
) -> dict[str, Any] | None:
    """Ask admission to record, as the user of `kube`, the approval of the content the source
    holds now (`now`: `approve --now`): the record configpin wrote ({user, at, content, and
    now: true for --now}), or None when configpin did not answer (the request is taken back)
    or, asked for --now, answered with no record of it (a configpin older than --now). Raises
    KubeError with the API server's answer (a refusal: the user may not update it)."""
    api_path = path(kind.resource, namespace, name)
    result = ask_admission(kube, api_path, APPROVE_NOW if now else PLAN_REQUEST)
    annotations = (result.get("metadata") or {}).get("annotations") or {}
    if ANN_APPROVE in annotations:  # configpin's admission did not answer: take it back
        undo = {"metadata": {"annotations": {ANN_APPROVE: None}}}
        with contextlib.suppress(KubeError):
            kube.patch(api_path, undo, content_type=MERGE_PATCH)
        return None
    record: dict[str, Any] = json.loads(annotations.get(ANN_APPROVED) or "{}")
    if now and record.get("now") is not True:
        return None
    return record


def source_target(args: argparse.Namespace, said: str) -> tuple[Any, SourceKind, str, str] | int:
    """The source a verb names (`configmap/NAME`, `secret/NAME`) and the cluster to ask, from
    the command's arguments: (api client, kind, namespace, name), or the exit code (2) after
    saying, as `said`, what is wrong."""
    kind_text, _, name = str(args.source).partition("/")
    kind = typed_source_kind(kind_text)
    if kind is None or not name:
        print(f"{said}: configmap/NAME or secret/NAME", file=sys.stderr)
        return 2
    try:
        api, default_ns = connect_from_args(args)
    except Exception as e:
        print(f"{said}: no cluster: {e}", file=sys.stderr)
        return 2
    return api, kind, args.namespace or default_ns, name


def approve(args: argparse.Namespace) -> int:
    """Ask admission to record, as you, the approval of the content the source holds now
    (--now: and that it rolls now, whatever its windows and rollout budget say): an update of
    the source (your right to update it is what is checked)."""
    target = source_target(args, "configpin approve")
    if isinstance(target, int):
        return target
    api, kind, namespace, name = target
    sid = SourceId(kind, name)
    with api:
        try:
            record = approval(Kube(api), kind, namespace, name, now=args.now)
        except KubeError as e:
            print(f"configpin approve: {sid}: {e}", file=sys.stderr)
            return 2
        if record is None:
            what = "approval --now" if args.now else "approval"
            newer = ", and as new as this command" if args.now else ""
            print(
                f"configpin approve: configpin did not record the {what} of {sid} in "
                f"{namespace} (is it installed for this namespace, and running{newer}?)",
                file=sys.stderr,
            )
            return 1
        if record.get("now") is True:  # (asked for, or approved so before: it stays)
            said, then = "approved --now", "it rolls now, whatever its windows and budget say"
        else:
            said, then = "approved", "the waves waiting for it roll"
        print(
            f"{said} {sid} in {namespace}: its content now ({record.get('content', '?')}) "
            f"by {record.get('user', '?')}; {then}"
        )
    return 0
