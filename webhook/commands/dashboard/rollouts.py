"""A change's ConfigRollouts as the dashboard's pages read them: what configpin published of
it (webhook.core.rollouts builds the status; this reads it back). Which source one is of, and
whether it describes the content that source holds now; its members not done yet; its waves'
sizes; its verdict (kstatus, through `webhook.core.rollouts.verdict`); and, where none
describes a change, what the page cannot tell and why.

Pure: what the feeds hold in, plain values out. Nothing is decided from a ConfigRollout."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Final

from webhook.commands.dashboard.feeds import FeedState
from webhook.core.model import JSONObject, SourceId, source_kind
from webhook.core.reasons import Status
from webhook.core.rollouts import (
    KIND,
    REASONS,
    ConditionType,
    RolloutReason,
    key_digests_of,
    verdict,
)

# The reason a waiting workload's `configpin status` state stands for (the core's table read
# backwards; Status.WAITING is both Waiting's and a stopped member's Failed: Waiting, the first).
BY_STATUS: Final[Mapping[str, RolloutReason]] = {
    said.status.value: reason
    for reason, said in reversed(list(REASONS.items()))
    if said.status is not None
}
_VERDICTS: Final = (ConditionType.STALLED, ConditionType.RECONCILING, ConditionType.READY)


def count(value: Any) -> int:
    """A count as published (0: none, or not a count)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def reason_of(text: Any) -> RolloutReason | None:
    try:
        return RolloutReason(str(text))
    except ValueError:
        return None


def status(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    found = obj.get("status")
    return found if isinstance(found, Mapping) else {}


def source_of(obj: Mapping[str, Any]) -> tuple[str, SourceId] | None:
    """The namespace and source a ConfigRollout is of (its spec, as configpin writes it)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    said = spec.get("source") if isinstance(spec, Mapping) else None
    if not isinstance(said, Mapping) or not isinstance(said.get("name"), str):
        return None
    kind = source_kind(str(said.get("kind")))
    if kind is None:
        return None
    return str(meta.get("namespace") or ""), SourceId(kind, said["name"])


def content_of(obj: Mapping[str, Any]) -> str | None:
    """The content of the change it describes (its short form)."""
    change = status(obj).get("change")
    content = change.get("content") if isinstance(change, Mapping) else None
    return content if isinstance(content, str) and content else None


def about_now(
    obj: Mapping[str, Any], resource_version: str | None, holds: str | None, content: str
) -> bool:
    """It describes the change its source holds now: the source as read (`resource_version`;
    None: the source is not read here, and it is taken as it says), or the content that the
    source's record of who changed it names (`holds`)."""
    if resource_version is None:
        return True
    described = status(obj).get("source")
    if isinstance(described, Mapping) and described.get("resourceVersion") == resource_version:
        return True
    return holds == content


def key_digests(obj: Mapping[str, Any]) -> list[dict[str, str | None]] | None:
    """The changed keys' old and new keyed digests its change says (hex: never a value; None
    for an added key's old, a removed one's new), as the page shows them; None: it says none
    (a controller that did not see the change)."""
    said = key_digests_of(status(obj).get("change"))
    if said is None:
        return None
    return [{"key": k, "old": old, "new": new} for k, old, new in said]


def members(obj: Mapping[str, Any]) -> Iterator[tuple[tuple[str, str, str], Mapping[str, Any]]]:
    """Its members not done yet, as it lists them: (kind, namespace, name), the entry."""
    namespace = str((obj.get("metadata") or {}).get("namespace") or "")
    for member in status(obj).get("members") or ():
        if isinstance(member, Mapping):
            ns = str(member.get("namespace") or namespace)
            yield (str(member.get("kind")), ns, str(member.get("name"))), member


def record_wave(record: Mapping[str, Any]) -> tuple[int, int] | None:
    """The wave a workload's rollout record says the rollout started in, of how many (None:
    it says none: a record made outside waves, or before records named one)."""
    said = record.get("wave")
    if not isinstance(said, list) or len(said) != 2:
        return None
    n, m = (count(v) for v in said)
    return (n, m) if 1 <= n <= m else None


def wave_sizes(rollouts: Iterable[JSONObject]) -> list[int]:
    """The members of each wave, from the first, as the ConfigRollouts count them (one per
    namespace of a shared change, each counting its own members: added up)."""
    sizes: dict[int, int] = {}
    for obj in rollouts:
        for wave in status(obj).get("waves") or ():
            if isinstance(wave, Mapping) and (n := count(wave.get("wave"))):
                sizes[n] = sizes.get(n, 0) + count(wave.get("members"))
    return [sizes.get(n, 0) for n in range(1, max(sizes, default=0) + 1)]


def verdict_of(rollouts: Sequence[JSONObject]) -> dict[str, Any] | None:
    """What the ConfigRollouts say of the change (the condition that is True, its reason and
    message); of several (a shared change), the one that says least done: Stalled before
    Reconciling before Ready. None: none says one about its generation."""
    known = [v for v in map(verdict, rollouts) if v.condition is not None]
    if not known:
        return None
    worst = min(known, key=lambda v: _VERDICTS.index(v.condition) if v.condition else 3)
    assert worst.condition is not None
    return {"condition": worst.condition.value, "reason": worst.reason, "message": worst.message}


def outcome(rollouts: Iterable[JSONObject], content: str) -> str:
    """How a change before the one they describe ended, as their history says ("": not said)."""
    for obj in rollouts:
        for h in status(obj).get("history") or ():
            if isinstance(h, Mapping) and h.get("content") == content and h.get("outcome"):
                return str(h["outcome"])
    return ""


def cannot_tell(
    others: Sequence[JSONObject],
    feed: FeedState | None,
    name: str,
    where: Sequence[str],
    *,
    current: bool,
    content: str,
) -> str:
    """What the page says of a change no ConfigRollout describes: why, and what it cannot
    tell. `others`: the source's ConfigRollouts (`name`, in the namespaces `where`) that
    describe other content; `feed`: how the feed of ConfigRollouts stands."""
    if not current:
        ended = outcome(others, content)
        tail = f" It ended {ended}, as its ConfigRollout's history says." if ended else ""
        return (
            "A newer change of its source superseded this one: its ConfigRollout describes "
            "that one. Its rollouts are shown as the workloads' records say them, with the "
            f"wave each record names.{tail}"
        )
    if others:
        why = (
            f"its ConfigRollout {name} describes content {content_of(others[0])} yet, not this "
            "change: configpin has not published this one (it does within seconds where it runs)"
        )
    elif feed is None or not feed.served:
        why = (
            f"this cluster serves no {KIND}s (configpin.io/v1alpha1): a configpin older than "
            "them, or one installed without its CRD"
        )
    elif feed.forbidden:
        why = f"you may not list {KIND}s here: {feed.forbidden}"
    elif feed.error:
        why = f"{KIND}s could not be read: {feed.error}"
    elif not feed.listed:
        why = f"{KIND}s are not read yet"
    else:
        why = (
            f"there is no {KIND} {name} in {', '.join(where) or 'its namespace'}: a configpin "
            "older than them, or one that has not published it"
        )
    return (
        f"No {KIND} describes this change ({why}). This page cannot tell its waves, what each "
        "waiting workload waits for, or its verdict: it shows the rollouts the workloads "
        "record (with the wave each record names) and the stale workloads as `configpin "
        "status` finds them."
    )


def status_reason(state: str) -> RolloutReason | None:
    """The reason a `configpin status` state of a waiting workload stands for."""
    return BY_STATUS.get(state) if state != Status.STALE else None
