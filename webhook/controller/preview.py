"""What a write of a ConfigMap or Secret will do, worked out from what this replica already
holds (the workload index and the source cache): no API call on the write's path, and the same
on every replica, leader or not.

For each workload the index says consumes the source (by its own name, or through a snapshot
copy of it), one row (webhook.core.preview.Row): it rolls, in which wave (the change's waves,
cut over the workloads that would roll as the gate cuts them); it refreshes its pods in place;
nothing happens to it (it consumes other keys); it holds (that content was rejected there).
A deletion says who consumes the source and what breaks.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from webhook.config import Settings
from webhook.controller.index import WorkloadIndex
from webhook.core import digest
from webhook.core.current import Consumed, WorkloadEntry
from webhook.core.model import SourceId, SourceRecord
from webhook.core.preview import Effect, Row
from webhook.core.progress import Standing
from webhook.core.waves import Member, approval_from, cut_waves, wave_order
from webhook.kube.cache import SourceCache
from webhook.sources import Miss


@dataclass(frozen=True, slots=True)
class _Consumer:
    """A workload that consumes the source, and how (its keys; None: all of them), with what
    its entry says of its delivery (read once per version of the index, not per write)."""

    namespace: str
    kind: str
    name: str
    keys: frozenset[str] | None
    required: bool
    healthy: bool  # it vouches for a change: cut into the waves, not joining the last
    rejected: tuple[tuple[str, str], ...]
    refreshes: frozenset[str]
    approve: bool


def _consumer(entry: WorkloadEntry, consumed: Consumed) -> _Consumer:
    ref, delivery = entry.ref, entry.delivery
    return _Consumer(
        ref.namespace,
        ref.kind,
        ref.name,
        consumed.keys,
        consumed.required,
        entry.standing is Standing.HEALTHY,
        (delivery.rejected or ()) if delivery is not None else (),
        (delivery.refreshes or frozenset()) if delivery is not None else frozenset(),
        delivery is not None and delivery.approve,
    )


_LISTS_MAX: Final = 256  # (namespace, source) lists kept, the most recently asked


class Previewer:
    def __init__(
        self,
        index: WorkloadIndex,
        cache: SourceCache,
        hkey: bytes,
        settings: Settings,
        *,
        ready: Callable[[], bool],
    ) -> None:
        """`ready()`: the index holds every workload (the controller has synced)."""
        self.index = index
        self.cache = cache
        self.hkey = hkey
        self.steps = settings.waves()
        self.approval = approval_from(self.steps)
        self.ready = ready
        self._lock = threading.Lock()
        # (namespace, source) -> (the index's version, its consumers in wave order)
        self._lists: OrderedDict[tuple[str, str], tuple[int, list[_Consumer]]] = OrderedDict()

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

    def consumers(self, namespace: str, sid: SourceId) -> list[_Consumer]:
        """The workloads that consume `sid` in `namespace`, in the order a change of it rolls
        them (`wave_order`): worked out again only once the index moved, so that a write
        costs a pass over its consumers, not their ordering."""
        key = (namespace, str(sid))
        version = self.index.version(namespace)
        with self._lock:
            found = self._lists.get(key)
            if found is not None and found[0] == version:
                self._lists.move_to_end(key)
                return found[1]
        by_member: dict[Member, _Consumer] = {}
        for entry in self.index.consumers(namespace, sid):
            consumed = self._consumed(entry, namespace, sid)
            if consumed is not None:
                ref = entry.ref
                member = Member(entry.wave, ref.namespace, ref.kind, ref.name)
                by_member[member] = _consumer(entry, consumed)
        ordered = [by_member[m] for m in wave_order(by_member)]
        with self._lock:
            self._lists[key] = (version, ordered)
            self._lists.move_to_end(key)
            while len(self._lists) > _LISTS_MAX:
                self._lists.popitem(last=False)
        return ordered

    def rows(
        self,
        namespace: str,
        sid: SourceId,
        changed: frozenset[str],
        new: SourceRecord | None,
    ) -> list[Row] | None:
        """One row per workload consuming `sid` (`new` None: it is being deleted); None when
        this replica cannot tell yet (its index is still filling)."""
        if not self.ready():
            return None
        consumers = self.consumers(namespace, sid)
        if new is None:
            return [
                Row(c.namespace, c.kind, c.name, Effect.BREAKS if c.required else Effect.ABSENT)
                for c in consumers
            ]
        nskey = digest.namespace_key(self.hkey, namespace)
        key = str(sid)
        rows: list[Row] = []
        rolling: list[tuple[_Consumer, tuple[str, ...]]] = []
        after: dict[frozenset[str] | None, str] = {}  # the new content's digest, per key set
        for c in consumers:
            mine = changed if c.keys is None else changed & c.keys
            if not mine:
                rows.append(Row(c.namespace, c.kind, c.name, Effect.NOTHING))
                continue
            keys = tuple(sorted(mine))
            if c.rejected:
                content = after.get(c.keys)
                if content is None:
                    content = after[c.keys] = digest.source_digest(nskey, new, c.keys)
                if (key, content) in c.rejected:
                    rows.append(Row(c.namespace, c.kind, c.name, Effect.HOLD, keys, 0, "rejected"))
                    continue
            if key in c.refreshes:
                rows.append(Row(c.namespace, c.kind, c.name, Effect.REFRESH, keys))
                continue
            rolling.append((c, keys))
        plan = cut_waves(rolling, _vouches, self.steps)
        for i, wave in enumerate(plan, 1):
            gated = self.approval is not None and i > self.approval
            for c, keys in wave:
                effect = Effect.AWAIT if gated or c.approve else Effect.ROLL
                rows.append(Row(c.namespace, c.kind, c.name, effect, keys, i))
        return rows


def _vouches(rolling: tuple[_Consumer, tuple[str, ...]]) -> bool:
    return rolling[0].healthy
