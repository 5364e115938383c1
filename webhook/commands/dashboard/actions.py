"""The buttons of a change's page: which of a person's verbs apply to the change in each
namespace its source is in, and whether the user's rights allow them (`webhook.commands.
dashboard.rights`, asked by the caller).

- Approve: where waves wait for an approval of this content (the page's `approval`).
- Pause: where its ConfigRollout says it rolls or waits (Reconciling) and it is not paused.
- Resume: where its ConfigRollout says it is paused (Stalled, reason Paused).
- Abort: where it rolls, waits or is paused (not delivered, not aborted already).
- Retry: where its ConfigRollout says it failed, was rolled back, is held or aborted.
Where no ConfigRollout of that namespace describes the content, the change's page decides as
its rows say (rolling, waiting, pending: Pause; paused: Resume). A superseded change has none.

Each verb is the CLI's (`POST /api/VERB`: `kubectl configpin VERB`). Pure: plain values in and
out."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from webhook.commands.dashboard import rollouts as cr
from webhook.core.model import JSONObject, SourceKind
from webhook.core.rollouts import ConditionType, RolloutReason, rollout_name, verdict

# The verbs a button says, in the order they are shown.
VERBS: Final = ("approve", "pause", "resume", "abort", "retry")
NAMESPACES_MOST: Final = 50  # namespaces of a shared change given buttons (each reviewed)
_GOING: Final = frozenset({"rolling", "waiting", "pending", "checking"})
_STOPPED: Final = frozenset(
    r.value for r in (RolloutReason.FAILED, RolloutReason.ROLLED_BACK, RolloutReason.HELD)
)


def _state(rollouts: Sequence[JSONObject], doc: Mapping[str, Any]) -> str:
    """ "paused", "going", "aborted", "failed" or "" (delivered), as the namespace's
    ConfigRollout says, else the page."""
    for obj in rollouts:
        said = verdict(obj)
        if said.condition is ConditionType.STALLED:
            if said.reason == RolloutReason.PAUSED.value:
                return "paused"
            if said.reason == RolloutReason.ABORTED.value:
                return "aborted"
            return "failed" if said.reason in _STOPPED else ""
        if said.condition is ConditionType.RECONCILING:
            return "going"
        if said.condition is ConditionType.READY:
            return ""
    moment = doc.get("moment") or {}
    if moment.get("reason") == RolloutReason.PAUSED.value:
        return "paused"
    if moment.get("reason") == RolloutReason.ABORTED.value:
        return "aborted"
    if moment:
        return "failed" if moment.get("reason") in _STOPPED else ""
    return "going" if any((doc.get("counts") or {}).get(s) for s in _GOING) else ""


def buttons(
    doc: Mapping[str, Any],
    rollouts: Sequence[JSONObject],
    may: Callable[[SourceKind, str, str], Mapping[str, Any]],
) -> list[dict[str, Any]]:
    """Per namespace: the verbs that apply ({namespace, verbs, may}); `doc`: the change's page
    (`changes.change`); `rollouts`: every ConfigRollout read; `may(kind, namespace, name)`:
    whether the user may update the source ({allowed, why})."""
    if not doc.get("current"):
        return []
    kind, name = SourceKind(doc["source"]["kind"]), str(doc["source"]["name"])
    namespaces = list(doc.get("namespaces") or ()) or [str(doc.get("namespace") or "")]
    asked = set((doc.get("approval") or {}).get("namespaces") or ())
    wanted = rollout_name(kind, name)
    out = []
    for ns in namespaces[:NAMESPACES_MOST]:
        its = [
            o
            for o in rollouts
            if (o.get("metadata") or {}).get("name") == wanted
            and (o.get("metadata") or {}).get("namespace") == ns
            and cr.content_of(o) == doc.get("content")
        ]
        verbs = ["approve"] if ns in asked else []
        state = _state(its, doc)
        if state == "paused":
            verbs += ["resume", "abort"]
        elif state == "going":
            verbs += ["pause", "abort"]
        elif state in ("failed", "aborted"):
            verbs.append("retry")
        if verbs:
            out.append({"namespace": ns, "verbs": verbs, "may": dict(may(kind, ns, name))})
    return out
