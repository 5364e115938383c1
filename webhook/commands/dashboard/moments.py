"""The moments that matter of a change, as the dashboard shows them: a change that failed, was
rolled back, is held, paused or aborted, said as such (its ConfigRollout's verdict), with the
signal (the members that failed and what each said, who paused or aborted it and when) and what
a person can do (the commands, as text).

The words of a decision are the core's (`webhook.core.rollouts.REASONS` and the ConfigRollout's
message): nothing is worded again here but the commands. Pure: plain values in and out."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from webhook.commands.dashboard import rollouts as cr
from webhook.core.model import JSONObject
from webhook.core.rollouts import REASONS, RolloutReason

R = RolloutReason
STOPPED: Final = (R.FAILED, R.ROLLED_BACK, R.HELD, R.PAUSED, R.ABORTED)


def slug(reason: str) -> str:
    """A reason's name as a class and a badge's state: RolledBack -> rolled-back."""
    return re.sub(r"(?<!^)(?=[A-Z])", "-", reason).lower()


def title(reason: str) -> str:
    """A reason's name in words: RolledBack -> Rolled back."""
    return slug(reason).replace("-", " ").capitalize()


def ended(reason: str) -> dict[str, str] | None:
    """How an earlier change ended (its ConfigRollout's history), as a badge: None if unsaid."""
    return {"state": slug(reason), "title": title(reason)} if reason else None


def _do(
    reason: RolloutReason, source: str, namespaces: Sequence[str], failed: Iterable[Any]
) -> list[str]:
    ns = [f" -n {n}" if n else "" for n in namespaces] or [""]
    if reason is R.PAUSED:
        return [f"kubectl configpin resume {source}{n}" for n in ns]
    if reason is R.ABORTED:
        return [f"kubectl configpin retry {source}{n}" for n in ns] + [
            f"kubectl apply -f FILE (a fixed {source}: a newer change rolls from wave 1)"
        ]
    out = []
    for kind, namespace, name in failed:
        where = f" -n {namespace}" if namespace else ""
        out.append(f"kubectl describe {kind.lower()}/{name}{where}")
        if reason is R.HELD:
            out.append(f"kubectl rollout undo {kind.lower()}/{name}{where}")
    out += [f"kubectl configpin retry {source}{n} (rolls it again from wave 1)" for n in ns]
    out.append(f"kubectl apply -f FILE (a fixed {source}: a newer change rolls from wave 1)")
    return out


def moment(
    rollouts: Sequence[JSONObject],
    rows: Iterable[Mapping[str, Any]],
    source: str,
    namespaces: Sequence[str],
) -> dict[str, Any] | None:
    """The change's moment when its ConfigRollouts say it stopped (Stalled: failed, rolled
    back, held or paused; of several, the one that says least done), else None. `rows`: its
    timeline's rows (`Row.as_dict`); `source`: "configmap/NAME"."""
    said = cr.verdict_of(rollouts)
    reason = cr.reason_of(said["reason"]) if said else None
    if said is None or reason not in STOPPED:
        return None
    assert reason is not None
    failed = [r for r in rows if r.get("state") == "failed"]
    signal = [f"{r['kind']} {r['name']}: {r['detail']}" for r in failed if r.get("detail")]
    out: dict[str, Any] = {
        "reason": reason.value,
        "state": slug(reason.value),
        "title": title(reason.value),
        "words": REASONS[reason].words,
        "message": said["message"],
        "signal": signal,
        "do": _do(
            reason, source, namespaces, ((r["kind"], r["namespace"], r["name"]) for r in failed)
        ),
    }
    verb = {R.PAUSED: "paused", R.ABORTED: "aborted"}.get(reason)
    for obj in rollouts if verb else ():
        change = cr.status(obj).get("change") or {}
        if change.get(f"{verb}By"):
            out[f"{verb}_by"] = str(change[f"{verb}By"])
            out[f"{verb}_at"] = str(change.get(f"{verb}At") or "")
            break
    return out
