"""What a write of a ConfigMap or Secret will do, worked out from what this replica already
holds (the workload index and the source cache): no API call on the write's path, and the same
on every replica, leader or not.

For each workload the index says consumes the source (by its own name, or through a snapshot
copy of it), one row (webhook.core.preview.Row): it rolls, in which wave; it refreshes its pods
in place; nothing happens to it (it consumes other keys); it holds (that content was rejected
there). A deletion says who consumes the source and what breaks.

The waves are the gate's own (webhook.controller.wavecut.WaveCut, one object both hold): the
members of the change the write makes are those of the written namespace the write leaves
stale (judged as `stale_sources` judges them, on the content as written) or whose record
names that change, and, for a source shared across namespaces (`configpin.io/shared`), the
members in every other namespace that holds the same content, each with a row of its own. So
the preview names what the gate will roll, in the wave it will roll it.
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from cachetools import LRUCache

from webhook.controller.limits import RolloutLimits
from webhook.controller.wavecut import Elsewhere, WaveCut, carried, member_of, vouches
from webhook.core import digest
from webhook.core.current import Consumed, RolloutBrief, WorkloadEntry
from webhook.core.model import SourceId, SourceKind, SourceRecord
from webhook.core.preview import Effect, Row
from webhook.core.progress import Standing
from webhook.core.record import Change
from webhook.core.reloader import ReloaderAsks, covers
from webhook.core.waves import Member, rolled_first, wave_order
from webhook.inputs.sources import Miss


@dataclass(frozen=True, slots=True)
class _Consumer:
    """A workload that consumes the source, and how (its keys; None: all of them), with what
    its entry says of its delivery (read once per version of the index, not per write)."""

    namespace: str
    kind: str
    name: str
    member: Member
    keys: frozenset[str] | None
    required: bool
    recorded: str | None  # the digest of the source it was last brought up to date with
    healthy: bool  # (its standing) it vouches for a change it has not rolled for
    standing: Standing
    brief: RolloutBrief | None  # (what its rollout record says)
    rejected: tuple[tuple[str, str], ...]
    in_place: bool  # a change of the source reaches its pods in place (on-change: refresh)
    approve: bool
    windows: str | None  # its own configpin.io/rollout-windows
    reloader: ReloaderAsks | None  # what it asks of Stakater Reloader


# A member of the change: the consumer here (or the member elsewhere), its keys of the change,
# whether it rolls now (not: it holds its place in the waves by its record alone), whether it
# vouches for the change, whether it rolled for it already (the gate puts those first).
_InWave = tuple[_Consumer | Elsewhere, tuple[str, ...], bool, bool, bool]
_vouches = operator.itemgetter(3)
_rolled = operator.itemgetter(4)


_LISTS_MAX: Final = 256  # (namespace, source) lists kept, the most recently asked
# (a change no record names and no namespace shares: where nothing asks which change it is)
_UNNAMED: Final = Change("-", SourceId(SourceKind.CONFIGMAP, ""), "")


def _left(c: _Consumer, sid: SourceId, new: SourceRecord) -> str | None:
    """Why Reloader restarts `c` for this write of `sid`, which configpin leaves to it (as the
    controller decides: an update of content it recorded); None: configpin's."""
    if c.reloader is None or c.recorded in (None, digest.ABSENT):
        return None
    covered = covers(c.reloader, sid, new.reloader)
    return None if covered is None else covered.words()


class Previewer:
    def __init__(
        self, cut: WaveCut, *, ready: Callable[[], bool], limits: RolloutLimits | None = None
    ) -> None:
        """`cut`: the wave gate's own; `ready()`: the index holds every workload (the
        controller has synced); `limits`: the gate's rollout windows (a member they hold now
        waits for them)."""
        self.cut = cut
        self.limits = limits
        self.index = cut.index
        self.cache = cut.cache
        self.hkey = cut.hkey
        self.ready = ready
        self._lock = threading.Lock()
        # (namespace, source) -> (the index's version, its consumers in wave order, whether
        # any of them has a rollout record)
        self._lists: LRUCache[tuple[str, str], tuple[int, list[_Consumer], bool]] = LRUCache(
            maxsize=_LISTS_MAX
        )

    def _consumed(self, entry: WorkloadEntry, namespace: str, sid: SourceId) -> Consumed | None:
        """What `entry` consumes of `sid`: by its name, or through a copy of it."""
        for c in entry.consumes:
            if c.source == sid:
                return c
            if c.source.kind is sid.kind and c.source.name.startswith(sid.name + "-"):
                found = self.cache.peek(namespace, c.source)
                if not isinstance(found, Miss) and getattr(found, "snapshot_of", None) == sid.name:
                    return c
        return None

    def _consumer(self, entry: WorkloadEntry, consumed: Consumed, sid: SourceId) -> _Consumer:
        delivery, ref = entry.delivery, entry.ref
        return _Consumer(
            ref.namespace,
            ref.kind,
            ref.name,
            member_of(entry),
            consumed.keys,
            consumed.required,
            entry.recorded_for(str(sid)),
            entry.standing is Standing.HEALTHY,
            entry.standing,
            entry.rollout,
            (delivery.rejected or ()) if delivery is not None else (),
            self.cut.in_place(entry, sid),
            delivery is not None and delivery.approve,
            entry.limits.windows,
            entry.reloader,
        )

    def consumers(self, namespace: str, sid: SourceId) -> tuple[list[_Consumer], bool]:
        """The workloads that consume `sid` in `namespace`, in the order a change of it rolls
        them (`wave_order`), and whether any has a rollout record: worked out again only once
        the index moved, so that a write costs a pass over its consumers, not their
        ordering."""
        key = (namespace, str(sid))
        version = self.index.version(namespace)
        with self._lock:
            found = self._lists.get(key)
            if found is not None and found[0] == version:
                return found[1], found[2]
        by_member: dict[Member, _Consumer] = {}
        for entry in self.index.consumers(namespace, sid):
            consumed = self._consumed(entry, namespace, sid)
            if consumed is not None:
                consumer = self._consumer(entry, consumed, sid)
                by_member[consumer.member] = consumer
        ordered = [by_member[m] for m in wave_order(by_member)]
        briefs = any(c.brief is not None for c in ordered)
        with self._lock:
            self._lists[key] = (version, ordered, briefs)
        return ordered, briefs

    def rows(
        self,
        namespace: str,
        sid: SourceId,
        changed: frozenset[str],
        new: SourceRecord | None,
    ) -> list[Row] | None:
        """One row per workload consuming `sid` (`new` None: it is being deleted), and per
        member of its change elsewhere (a shared source); None when this replica cannot tell
        yet (its index is still filling)."""
        if not self.ready():
            return None
        consumers, briefs = self.consumers(namespace, sid)
        if new is None:
            return [
                Row(c.namespace, c.kind, c.name, Effect.BREAKS if c.required else Effect.ABSENT)
                for c in consumers
            ]
        # The change the write makes, where anything asks for it (a record that may name it,
        # members elsewhere): its digest of all the content is one more pass over it.
        change = self.cut.change_to(namespace, sid, new) if briefs or new.shared else _UNNAMED
        nskey = digest.namespace_key(self.hkey, namespace)
        key = str(sid)
        rows: list[Row] = []
        members: list[_InWave] = []  # the change's members here, in wave order
        rolled_any = False  # one of them rolled for the change already
        # per key set consumed: the new content's digest, and the keys of the write among them
        after: dict[frozenset[str] | None, tuple[str, tuple[str, ...]]] = {}
        for c in consumers:
            found = after.get(c.keys)
            if found is None:
                found = after[c.keys] = (
                    digest.source_digest(nskey, new, c.keys),
                    tuple(sorted(changed if c.keys is None else changed & c.keys)),
                )
            content, keys = found
            brief = c.brief
            # its rollout that stands for the change: its record names it, or an earlier
            # change of the source that brought it to what it reads of the new content
            rolled = None
            if brief is not None and (change in brief.changes or carried(brief, change, content)):
                rolled = brief
                rolled_any = True
            # (as `stale_sources` judges: it is current once written, or the content is one
            # rejected there; either way it is no member, unless that rollout stands for it)
            current = content == c.recorded
            if current and not keys:
                rows.append(Row(c.namespace, c.kind, c.name, Effect.NOTHING))
            elif c.rejected and (key, content) in c.rejected:
                rows.append(Row(c.namespace, c.kind, c.name, Effect.HOLD, keys, 0, "rejected"))
            elif current:  # (it has that content already: held on it, say)
                rows.append(Row(c.namespace, c.kind, c.name, Effect.NOTHING))
            elif c.in_place:
                rows.append(Row(c.namespace, c.kind, c.name, Effect.REFRESH, keys))
            elif (left := _left(c, sid, new)) is not None:
                rows.append(Row(c.namespace, c.kind, c.name, Effect.RELOADER, keys, 0, left))
            elif rolled is None:  # it rolls
                members.append((c, keys, True, c.healthy, False))
                continue
            else:  # it rolls again (a rollout for the change is on its record already)
                members.append((c, keys, True, vouches(rolled, c.standing), True))
                continue
            if rolled is not None:
                # it rolled for the change: it holds its place in the waves, rolling nothing
                members.append((c, keys, False, vouches(rolled, c.standing), True))
        rows += self._waves(change, namespace, members, rolled_any)
        return rows

    def _waves(
        self, change: Change, namespace: str, members: list[_InWave], rolled: bool
    ) -> list[Row]:
        """The rows of the change's members that roll (here, and elsewhere for a shared
        source), numbered by the waves the gate cuts them into (`rolled`: a member here rolled
        for it already)."""
        cut = self.cut
        elsewhere = cut.elsewhere(change, namespace)
        ordered = members  # (one namespace: its consumers are in wave order, a subset keeps it)
        if elsewhere:
            by_member: dict[Member, _InWave] = {m[0].member: m for m in members}
            by_member.update(
                (e.member, (e, (), True, e.vouches, e.state is not None)) for e in elsewhere
            )
            ordered = [by_member[m] for m in wave_order(by_member)]
        if rolled or (elsewhere and any(e.state is not None for e in elsewhere)):
            ordered = rolled_first(ordered, _rolled)  # (as the gate orders them)
        rows: list[Row] = []
        for i, wave in enumerate(cut.waves(ordered, _vouches), 1):
            gated = cut.after_approve(i - 1)
            for c, keys, rolls, _, _ in wave:
                if rolls:
                    effect = Effect.AWAIT if gated or c.approve else Effect.ROLL
                    note = "" if c.__class__ is _Consumer else _note(c)
                    if effect is Effect.ROLL and isinstance(c, _Consumer) and self.limits:
                        opens = self.limits.opening(c.namespace, c.windows)
                        if opens is not None:
                            effect, note = Effect.WINDOW, opens
                    rows.append(Row(c.namespace, c.kind, c.name, effect, keys, i, note))
        return rows


def _note(member: _Consumer | Elsewhere) -> str:
    """(a member elsewhere) that it rolled for the change already, and how that stands."""
    state = member.state if isinstance(member, Elsewhere) else None
    return f"rolled: {state}" if state is not None else ""
