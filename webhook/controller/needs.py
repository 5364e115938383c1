"""What a re-stamp decision needs read from the API server, and what was read for it: a
decision (webhook.controller.restamp) reads the sources as this replica holds them in memory
and says what else it needs (`Need`); the reconciler's Prelude reads that once into the
`Inputs` and asks again."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

from webhook.controller.editors import Rolled
from webhook.core.model import JSONObject, SourceId, SourceRecord, SourceUnavailable
from webhook.inputs.sources import Miss

Held = Callable[[SourceId], SourceRecord | Miss | None]
"""The sources of the workload's namespace as this replica holds them in memory (MISS where
only a read would tell)."""


@dataclass(frozen=True)
class Need:
    """What a decision needs read from the API server before it can be made: the Prelude
    (webhook.controller.reconcile) reads it into the `Inputs` and asks again."""

    sources: frozenset[SourceId] = frozenset()  # sources memory does not hold
    pods: bool = False  # the live pods of the workload as read (a rollout it follows)
    editors: tuple[Rolled, ...] = ()  # who made what it rolls to (a rollout it starts)


def pods_key(obj: JSONObject) -> tuple[str, str]:
    """What a workload's pods are listed by: its uid and its selector (a workload read again
    after a conflict with the same two has the same pods to look at)."""
    meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
    return str(meta.get("uid") or ""), json.dumps(spec.get("selector"), sort_keys=True)


@dataclass
class Inputs:
    """What the API server answered for the decisions on one workload, read once per
    reconcile (however often a conflict makes it decide again)."""

    # a source memory did not hold: its record, None (it does not exist), or why it could
    # not be read
    sources: dict[SourceId, SourceRecord | SourceUnavailable | None] = field(default_factory=dict)
    pods: dict[tuple[str, str], list[JSONObject]] = field(default_factory=dict)  # by pods_key
    # who made what a rollout rolls to, by the keys it reads of each source and their
    # digest: a source that moves on in other keys while the reconcile goes on (a later
    # round's, a conflict's) is not asked about again
    editors: dict[tuple[_Read, ...], str] = field(default_factory=dict)

    def editors_of(self, rolled: tuple[Rolled, ...]) -> str | None:
        """Who made what a rollout rolls to ("" for nothing; None: not asked yet)."""
        return self.editors.get(reads_of(rolled)) if rolled else ""

    def source(self, sid: SourceId) -> SourceRecord | None:
        """As read (raises SourceUnavailable as the read did); KeyError: not read."""
        found = self.sources[sid]
        if isinstance(found, SourceUnavailable):
            raise SourceUnavailable(str(found))
        return found

    def pods_of(self, obj: JSONObject) -> list[JSONObject] | None:
        """The live pods of the workload as read (None: not listed yet)."""
        return self.pods.get(pods_key(obj))


_Read = tuple[SourceId, frozenset[str] | None, str]


def reads_of(rolled: tuple[Rolled, ...]) -> tuple[_Read, ...]:
    """What a rollout reads of the sources it rolls to: source, keys, their digest."""
    return tuple((r.change.source, r.keys, r.to) for r in rolled)


class Reads:
    """The sources as a decision reads them: memory first, then what was read for it; what
    neither holds is noted (the decision then asks for it, `Need`) and taken meanwhile as
    absent. `peek`: memory alone (what staleness is judged by)."""

    def __init__(self, held: Held, inputs: Inputs) -> None:
        self.held = held
        self.inputs = inputs
        self.missed: set[SourceId] = set()

    def peek(self, sid: SourceId) -> SourceRecord | None:
        found = self.held(sid)
        return None if isinstance(found, Miss) else found

    def __call__(self, sid: SourceId) -> SourceRecord | None:
        found = self.held(sid)
        if not isinstance(found, Miss):
            return found
        if sid in self.inputs.sources:
            return self.inputs.source(sid)
        self.missed.add(sid)
        return None

    def need(self) -> Need | None:
        return Need(sources=frozenset(self.missed)) if self.missed else None
