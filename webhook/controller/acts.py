"""What a person's `abort` or `retry` (webhook.core.verbs, recorded on the source) asks of each
workload, beside the waves the gate holds back (webhook.controller.waves: no rollout of aborted
content starts):

- abort, snapshot mode: a workload configpin rolled to the aborted content (rolling or
  complete) goes back to the copies of the last content that completed there, as a failure's
  undo does (webhook.controller.follow): its record ends failed with the abort as its signal,
  and the content is rejected there. Where it cannot go back (its template changed since
  configpin's write) it is held. Checksum mode cannot bring content back: those keep it, and
  one rolling is followed to the end.
- retry: a workload where the retried content failed before the retry was said (its record
  failed; the content rejected there) becomes a plain stale member of the change again: its
  rejection is taken away, its failed record replaced by a newer one of no change, and the
  digest it recorded goes back to what it ran before, so that the gate rolls it in its wave,
  from the first. Where its template
  already holds that content (a failure held there) that rollout restarts it
  (`kubectl.kubernetes.io/restartedAt`, as `kubectl rollout restart` writes it).

Memory says whether a workload must be looked at (`wants`); the object read decides.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection
from typing import Final

from webhook.controller.follow import Ended, Follower
from webhook.controller.wavecut import WaveCut
from webhook.core import digest
from webhook.core.constants import ANN_OBSERVED, ANN_REJECTED, ANN_ROLLOUT, MODE_SNAPSHOT
from webhook.core.current import WorkloadEntry, WorkloadRef
from webhook.core.kinds import WorkloadKind
from webhook.core.model import JSONObject, PatchOp, SourceId
from webhook.core.names import pointer
from webhook.core.record import (
    Action,
    Change,
    RolloutRecord,
    State,
    record_ops,
    rejected,
    rollout_record,
)
from webhook.core.refs import get_path
from webhook.core.times import format_time

RESTARTED_AT: Final = "kubectl.kubernetes.io/restartedAt"
_TAKEN_BACK: Final = (State.ROLLING, State.COMPLETE)  # the records an abort takes back
_SEEN_MAX: Final = 10_000  # (workload, change) pairs found to need nothing, remembered


class Acts:
    def __init__(
        self, hkey: bytes, cut: WaveCut, follower: Follower, wall: Callable[[], float]
    ) -> None:
        self.hkey = hkey
        self.cut = cut
        self.follower = follower
        self.wall = wall
        self._lock = threading.Lock()
        # Looked at, and nothing to do (checksum mode's abort; a failure since the retry):
        # not read again for the same verb at every resync.
        self._seen: dict[tuple[WorkloadRef, Change, str], None] = {}

    # --- memory only (RolloutController.check, on watch threads)
    def wants(self, entry: WorkloadEntry) -> bool:
        """An abort or a retry may ask something of this workload: read and decide it."""
        brief = entry.rollout
        for change, verb in self._asked(entry):
            with self._lock:
                if (entry.ref, change, verb) in self._seen:
                    continue
            if verb == "abort" and brief is not None and brief.state in _TAKEN_BACK:
                return True
            if verb == "retry":
                return True
        return False

    def _asked(self, entry: WorkloadEntry) -> list[tuple[Change, str]]:
        ns = entry.ref.namespace
        out: list[tuple[Change, str]] = []
        brief = entry.rollout
        if brief is not None:
            for change in brief.changes:
                if self.cut.aborted(ns, change) is not None:
                    out.append((change, "abort"))
                elif brief.state is State.FAILED and self.cut.retried(ns, change) is not None:
                    out.append((change, "retry"))
        for key in entry.rejected:
            try:
                sid = SourceId.parse(key)
            except ValueError:
                continue
            now = self.cut.change(ns, sid)
            if now is not None and self.cut.retried(ns, now) is not None:
                out.append((now, "retry"))
        return out

    def _nothing(self, ref: WorkloadRef, change: Change, verb: str) -> None:
        with self._lock:
            if len(self._seen) >= _SEEN_MAX:
                self._seen.clear()
            self._seen[(ref, change, verb)] = None

    # --- on the object read (the restamper's decision)
    def abort(
        self,
        ref: WorkloadRef,
        obj: JSONObject,
        kind: WorkloadKind,
        record: RolloutRecord | None,
        mode: str,
    ) -> tuple[list[PatchOp], Ended] | None:
        """Its rollout (rolling or complete) rolled content a person aborted since: in
        snapshot mode, the ops that take it back and how its rollout ended; None otherwise."""
        if record is None or record.state not in _TAKEN_BACK:
            return None
        for change in record.changes:
            who = self.cut.aborted(ref.namespace, change)
            if who is None:
                continue
            if mode != MODE_SNAPSHOT:
                self._nothing(ref, change, "abort")  # (nothing to take back: it keeps it)
                return None
            signal = f"{change} was aborted by {who}"
            return self.follower.failed(ref, obj, kind, record, mode, signal, policy=Action.UNDO)
        return None

    def retry(
        self, ref: WorkloadRef, obj: JSONObject, entry: WorkloadEntry
    ) -> tuple[list[PatchOp], dict[str, str], str] | None:
        """Content that failed here before a person's retry of it: the ops that make the
        workload a plain stale member of its change again, the digests it records then, and
        who retried; None: nothing to retry here."""
        ns = ref.namespace
        record = rollout_record(self.hkey, obj)
        values: dict[str, str | None] = {}
        observed = dict(entry.recorded)
        who = ""
        if record is not None and record.state is State.FAILED:
            for change in record.changes:
                retried = self.cut.retried(ns, change)
                if retried is None:
                    continue
                if record.since >= retried[0]:
                    self._nothing(ref, change, "retry")  # (it failed again since the retry)
                    continue
                who = retried[1]
                # A newer record of no change (admission keeps a record a write drops: it is
                # configpin's account, which no write rewinds): it proves nothing, holds no
                # place in any wave, and the rollout the gate starts in its wave replaces it.
                fresh = RolloutRecord(State.LEFT, {}, {}, self.wall(), signal=f"retried by {who}")
                values[ANN_ROLLOUT] = self.follower.record_text(obj, fresh)
                for key in record.changed_sources():
                    if observed.get(key) == record.to.get(key):
                        observed[key] = record.before.get(key, "")
        kept = rejected(obj)
        lifted = [key for key in kept if self._lifted(ns, key, kept[key], entry, record)]
        if lifted:
            who = who or self._who(ns, lifted[0])
            left = {k: v for k, v in kept.items() if k not in lifted}
            values[ANN_REJECTED] = digest.canonical_mapping(left) if left else None
        if not values:
            for change, verb in self._asked(entry):  # (its content rejected here is older)
                if verb == "retry":
                    self._nothing(ref, change, verb)
            return None
        if observed != entry.recorded:
            values[ANN_OBSERVED] = digest.canonical_mapping(observed)
        return record_ops(obj, values), observed, who

    def _lifted(
        self,
        ns: str,
        key: str,
        value: str,
        entry: WorkloadEntry,
        record: RolloutRecord | None,
    ) -> bool:
        """The content rejected for `key` here is what its source holds now, retried since
        the rejection (no rollout of this workload started after the retry)."""
        try:
            sid = SourceId.parse(key)
        except ValueError:
            return False
        change = self.cut.change(ns, sid)
        retried = self.cut.retried(ns, change) if change is not None else None
        if change is None or retried is None:
            return False
        if record is not None and record.since >= retried[0]:
            return False
        source = self.cut.peek(ns, sid)
        if source is None:
            return False
        keys = next((c.keys for c in entry.consumes if c.source == sid), None)
        return value == digest.source_digest(digest.namespace_key(self.hkey, ns), source, keys)

    def _who(self, ns: str, key: str) -> str:
        change = self.cut.change(ns, SourceId.parse(key))
        retried = self.cut.retried(ns, change) if change is not None else None
        return retried[1] if retried is not None else ""

    def restart_ops(
        self,
        ref: WorkloadRef,
        obj: JSONObject,
        kind: WorkloadKind,
        stale: Collection[SourceId],
    ) -> list[PatchOp]:
        """A rollout of retried content whose template holds that content already (a failure
        held there): the op that restarts its pods, as `kubectl rollout restart` does."""
        ns = ref.namespace
        if not any(
            (c := self.cut.change(ns, sid)) is not None and self.cut.retried(ns, c) is not None
            for sid in stale
        ):
            return []
        meta = get_path(obj, kind.meta_path)
        annotations = meta.get("annotations") if isinstance(meta, dict) else None
        if not isinstance(annotations, dict):
            return []  # (configpin's stamp is there: a template it rolled has annotations)
        when = format_time(self.wall())
        op = "replace" if RESTARTED_AT in annotations else "add"
        path = pointer((*kind.meta_path, "annotations", RESTARTED_AT))
        return [{"op": op, "path": path, "value": when}]


__all__ = ["RESTARTED_AT", "Acts"]
