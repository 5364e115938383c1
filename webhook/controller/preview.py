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

from collections.abc import Callable

from webhook.config import Settings
from webhook.controller.index import WorkloadIndex
from webhook.core import digest
from webhook.core.current import Consumed, WorkloadEntry
from webhook.core.delivery import Member, Standing, approval_from, cut_waves, wave_order
from webhook.core.model import SourceId, SourceRecord
from webhook.core.preview import Effect, Row
from webhook.kube.cache import SourceCache
from webhook.sources import Miss


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
        nskey = digest.namespace_key(self.hkey, namespace)
        key = str(sid)
        rows: list[Row] = []
        rolling: list[WorkloadEntry] = []
        keys_of: dict[str, tuple[str, ...]] = {}
        for entry in self.index.consumers(namespace, sid):
            consumed = self._consumed(entry, namespace, sid)
            if consumed is None:
                continue
            ref = entry.ref
            if new is None:
                effect = Effect.BREAKS if consumed.required else Effect.ABSENT
                rows.append(Row(ref.namespace, ref.kind, ref.name, effect))
                continue
            mine = changed if consumed.keys is None else changed & consumed.keys
            keys = tuple(sorted(mine))
            if not keys:
                rows.append(Row(ref.namespace, ref.kind, ref.name, Effect.NOTHING))
                continue
            after = digest.source_digest(nskey, new, consumed.keys)
            if entry.rejected.get(key) == after:
                rows.append(
                    Row(ref.namespace, ref.kind, ref.name, Effect.HOLD, keys, note="rejected")
                )
                continue
            refreshes = entry.delivery.refreshes if entry.delivery is not None else None
            if refreshes is not None and key in refreshes:
                rows.append(Row(ref.namespace, ref.kind, ref.name, Effect.REFRESH, keys))
                continue
            rolling.append(entry)
            keys_of[ref.name + "\0" + ref.kind] = keys
        if rolling:
            by_member = {
                Member(e.wave, e.ref.namespace, e.ref.kind, e.ref.name): e for e in rolling
            }
            order = wave_order(by_member)
            plan = cut_waves(order, lambda m: by_member[m].standing is Standing.HEALTHY, self.steps)
            for i, wave in enumerate(plan, 1):
                gated = self.approval is not None and i > self.approval
                for m in wave:
                    keys = keys_of[m.name + "\0" + m.kind]
                    delivery = by_member[m].delivery
                    waits = gated or (delivery is not None and delivery.approve)
                    effect = Effect.AWAIT if waits else Effect.ROLL
                    rows.append(Row(m.namespace, m.kind, m.name, effect, keys, wave=i))
        return rows
