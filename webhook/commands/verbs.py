"""`configpin pause|resume|abort|retry configmap/NAME` (also `kubectl configpin`, and
`secret/NAME`): a person's verb on the change the source holds now (SPEC,
"Acting on a change"), asked of configpin's admission as approvals are: the request
(`configpin.io/act`) set on the source with the user's own rights (their right to update it is
what is checked), which admission turns into the signed record of who said it, when, and of
which content (`configpin.io/acted`, webhook.core.verbs). While a pause stands, no further
rollout of that content starts; those started are followed to the end; `resume` goes on from
there. An abort starts none either and, in snapshot mode, takes the workloads rolled to it back
(webhook.controller.acts); `retry` rolls failed, rolled-back or aborted content again.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from typing import Any

from webhook.commands.changes import ask_admission, source_target
from webhook.core.constants import ANN_ACT, ANN_ACTED
from webhook.core.model import SourceId, SourceKind
from webhook.core.verbs import Verb
from webhook.kube.errors import KubeError
from webhook.kube.raw import MERGE_PATCH, Kube, path
from webhook.kube.userflags import add_user_arguments

# What each verb does, said once the record is there.
_DONE = {
    Verb.PAUSE: "no further rollout of it starts; those started are followed to the end "
    "(kubectl configpin resume goes on)",
    Verb.RESUME: "its rollouts go on from where they stopped",
    Verb.ABORT: "no further rollout of it starts; in snapshot mode the workloads rolled to it "
    "go back to the last content that completed (kubectl configpin retry rolls it again)",
    Verb.RETRY: "the workloads where it failed, was rolled back or aborted roll it again, in "
    "its waves from the first",
}
# What a verb said is, as its answer says it (the command's and the dashboard's).
PAST = {Verb.PAUSE: "paused", Verb.RESUME: "resumed", Verb.ABORT: "aborted", Verb.RETRY: "retried"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", help="configmap/NAME or secret/NAME")
    p.add_argument("-n", "--namespace", help="namespace (default: the context's)")
    add_user_arguments(p)


def act(
    kube: Kube, kind: SourceKind, namespace: str, name: str, verb: Verb
) -> dict[str, Any] | None:
    """Ask admission to record, as the user of `kube`, `verb` of the content the source holds
    now: the record configpin wrote ({verb, user, at, content}), or None when configpin did not
    answer (the request is taken back) or recorded no such verb. Raises KubeError with the API
    server's answer (a refusal: the user may not update the source)."""
    api_path = path(kind.resource, namespace, name)
    result = ask_admission(kube, api_path, verb.value, ANN_ACT)
    annotations = (result.get("metadata") or {}).get("annotations") or {}
    if ANN_ACT in annotations:  # configpin's admission did not answer: take it back
        undo = {"metadata": {"annotations": {ANN_ACT: None}}}
        with contextlib.suppress(KubeError):
            kube.patch(api_path, undo, content_type=MERGE_PATCH)
        return None
    try:
        record = json.loads(annotations.get(ANN_ACTED) or "{}")
    except ValueError:
        return None
    if not isinstance(record, dict) or record.get("verb") != verb.value:
        return None
    return record


def run(args: argparse.Namespace) -> int:
    verb = Verb(args.command)
    said = f"configpin {verb.value}"
    target = source_target(args, said)
    if isinstance(target, int):
        return target
    api, kind, namespace, name = target
    sid = SourceId(kind, name)
    with api:
        try:
            record = act(Kube(api), kind, namespace, name, verb)
        except KubeError as e:
            print(f"{said}: {sid}: {e}", file=sys.stderr)
            return 2
    if record is None:
        print(
            f"{said}: configpin did not record the {verb.value} of {sid} in {namespace} (is it "
            "installed for this namespace, running, and as new as this command?)",
            file=sys.stderr,
        )
        return 1
    print(
        f"{PAST[verb]} {sid} in {namespace}: its content now ({record.get('content', '?')}) "
        f"by {record.get('user', '?')}; {_DONE[verb]}"
    )
    return 0
