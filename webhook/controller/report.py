"""What the controller says about what it did: metrics, log lines and Events on the workload
(`kubectl describe`, `kubectl events`), in a person's words. Events are best effort: the
recorder queues them without waiting (webhook.kube.events)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Final

from cachetools import FIFOCache

from webhook.controller.follow import Ended
from webhook.core.current import Lookup, WorkloadRef
from webhook.core.model import JSONObject, SourceId, SourceKind, SourceRecord
from webhook.core.owners import controller_of, owned_reason
from webhook.core.reasons import EventReason, SkipReason
from webhook.core.record import ACTION_WORDS, ROLLOUT_WORDS, Action, RolloutRecord, State, by_whom
from webhook.core.refresh import RollInstead
from webhook.core.reloader import Covered
from webhook.core.waves import Wait, WaitReason
from webhook.kube.events import EventRecorder, Regarding, copy_created_note
from webhook.process.metrics import Metrics

log = logging.getLogger(__name__)

_REPORTED_MAX: Final = 10_000
_GONE: Final = SourceRecord(SourceKind.CONFIGMAP, "", {})  # (a source gone meanwhile)


def _names(changed: Iterable[SourceId]) -> str:
    return ", ".join(sorted(map(str, changed))) or "recorded state"


class Reporter:
    def __init__(
        self, metrics: Metrics, events: EventRecorder | None, clock: Callable[[], float]
    ) -> None:
        self.metrics = metrics
        self.events = events
        self.clock = clock
        # What was said once, the oldest forgotten first: uids, and (workload, why). (Under
        # the lock: the workers and the watch thread say them.)
        self._owned: FIFOCache[str, None] = FIFOCache(maxsize=_REPORTED_MAX)
        self._waiting: FIFOCache[str, None] = FIFOCache(maxsize=_REPORTED_MAX)
        self._said_lock = threading.Lock()

    def _since(self, first_seen: float | None) -> float | None:
        return None if first_seen is None else max(0.0, self.clock() - first_seen)

    def rolled(
        self,
        ref: WorkloadRef,
        obj: JSONObject,
        changed: Iterable[SourceId],
        first_seen: float | None,
        by: str = "",
        *,
        left: bool = False,
    ) -> None:
        """`left`: it asks for no pods (zero replicas): nothing rolls, and its record was
        written `left` in the same write (one Event says both)."""
        self.metrics.rollouts.labels(ref.kind).inc()
        if (seconds := self._since(first_seen)) is not None:
            self.metrics.rollout_latency.observe(seconds)
        names = _names(changed)
        who = by_whom(by)
        if left:
            what = (
                "pod template re-stamped; it has no pods to roll (zero replicas), so "
                f"{ROLLOUT_WORDS[State.LEFT]} (recorded left)"
            )
        else:
            what = "pod template re-stamped, a rolling update starts"
        log.info("re-stamped %s: %s changed%s%s", ref, names, who, " (zero replicas)" * left)
        if self.events is not None:
            self.events.say(obj, EventReason.ROLLOUT_STARTED, f"{names} changed{who}: {what}")

    def rolled_instead(
        self, ref: WorkloadRef, obj: JSONObject, changed: Iterable[SourceId], why: RollInstead
    ) -> None:
        self.metrics.refresh_fallbacks.labels(why.reason.value).inc()
        log.info("%s: on-change is refresh, but rolled: %s", ref, why.why)
        note = f"{_names(changed)} changed; on-change is refresh, but {why.why}: rolled instead"
        if self.events is not None:  # (a Warning where a setting or a permission stood in the way)
            in_the_way = why.reason.in_the_way
            self.events.say(obj, EventReason.ROLLED_INSTEAD_OF_REFRESH, note, warning=in_the_way)

    def refreshed(
        self,
        ref: WorkloadRef,
        obj: JSONObject,
        changed: Iterable[SourceId],
        pods: int,
        first_seen: float | None,
    ) -> None:
        self.metrics.refreshes.labels(ref.kind).inc()
        if (seconds := self._since(first_seen)) is not None:
            self.metrics.refresh_latency.observe(seconds)
        names = _names(changed)
        log.info("refreshed %s: %s changed; %d running pods told to sync now", ref, names, pods)
        if self.events is not None:
            self.events.say(
                obj,
                EventReason.REFRESHED,
                f"{names} changed: {pods} running pods told to sync their mounted volumes "
                "now; no rollout (the pod template is unchanged)",
            )

    def recorded(self, obj: JSONObject) -> None:
        if self.events is not None:
            self.events.say(
                obj,
                EventReason.RECORDED,
                "recorded the digests of its sources on the workload without a rollout "
                "(a baseline, a required source that appeared, or a kept rollback)",
            )

    def copies_created(self, obj: JSONObject, copies: Sequence[JSONObject]) -> None:
        if self.events is not None:
            for copy in copies:
                self.events.say(
                    obj, EventReason.COPY_CREATED, copy_created_note(copy), related=copy
                )

    def deferred(self, regarding: Regarding, stale: Iterable[SourceId], until: str) -> None:
        if self.events is not None:
            self.events.say(
                regarding,
                EventReason.ROLLOUT_DEFERRED,
                f"{_names(stale)} changed; the minimum interval between rollouts defers this "
                f"one until {until}",
            )

    def retrying(self, ref: WorkloadRef, why: str, delay: float) -> None:
        self.metrics.skipped.labels(SkipReason.ERROR.label).inc()
        log.warning("%s: rollout failed (%s); retrying in %.0fs", ref, why, delay)

    def gave_up(self, regarding: Regarding, attempts: int, error: str) -> None:
        self.metrics.skipped.labels(SkipReason.ERROR.label).inc()
        log.error(
            "%s %s/%s: giving up after %d failures (%s)",
            regarding.kind,
            regarding.namespace,
            regarding.name,
            attempts,
            error,
        )
        if self.events is not None:
            self.events.say(
                regarding,
                EventReason.ROLLOUT_FAILED,
                f"gave up after {attempts} attempts: {error}; the next change or resync tries "
                "again",
            )

    # --- safe delivery
    def waiting(self, ref: WorkloadRef, obj: JSONObject, wait: Wait) -> None:
        """ConfigRolloutWaiting (ConfigRolloutAwaitingApproval, ConfigRolloutAwaitingWindow,
        ConfigRolloutFlapping, ConfigRolloutPaused), once per workload and reason."""
        key = f"{ref} {wait.why}"
        with self._said_lock:
            if key in self._waiting:
                return
            self._waiting[key] = None
        log.info("%s: not rolled yet: %s", ref, wait.why)
        note = f"not rolled yet: {wait.why}"
        if self.events is None:
            return
        if wait.reason is WaitReason.APPROVAL:
            self.events.say(obj, EventReason.CONFIG_ROLLOUT_AWAITING_APPROVAL, note)
        elif wait.reason is WaitReason.WINDOW:
            self.events.say(obj, EventReason.CONFIG_ROLLOUT_AWAITING_WINDOW, note)
        elif wait.reason is WaitReason.BUDGET:
            self.events.say(obj, EventReason.CONFIG_ROLLOUT_FLAPPING, note)
        elif wait.reason is WaitReason.PAUSED:
            self.events.say(obj, EventReason.CONFIG_ROLLOUT_PAUSED, note)
        elif wait.reason is WaitReason.ABORTED:
            self.events.say(obj, EventReason.CONFIG_ROLLOUT_ABORTED, note)
        else:
            self.events.say(obj, EventReason.CONFIG_ROLLOUT_WAITING, note)

    def rollout_complete(self, ref: WorkloadRef, obj: JSONObject) -> None:
        log.info("%s: its config rollout is complete", ref)
        if self.events is not None:
            note = ROLLOUT_WORDS[State.COMPLETE]
            self.events.say(obj, EventReason.CONFIG_ROLLOUT_COMPLETE, note)

    def rollout_left(self, ref: WorkloadRef, obj: JSONObject) -> None:
        log.info("%s: scaled to zero while its config rollout was in progress: it left", ref)
        if self.events is not None:
            self.events.say(
                obj,
                EventReason.CONFIG_ROLLOUT_LEFT,
                f"scaled to zero while rolling: {ROLLOUT_WORDS[State.LEFT]} (another workload "
                "vouches for it)",
            )

    @staticmethod
    def _changed(record: RolloutRecord, ended: Ended) -> str:
        what = []
        for key in record.changed_sources():
            keys = (ended.keys or {}).get(key)
            which = f" (keys {', '.join(keys)})" if keys else ""
            old, new = record.before.get(key, "none"), record.to[key]
            what.append(f"{key}{which} {old[:12]} -> {new[:12]}")
        return ("; ".join(what) or "its config") + by_whom(record.by)

    def rolled_back_by_person(self, ref: WorkloadRef, obj: JSONObject, ended: Ended) -> None:
        record = ended.record
        self.metrics.rollout_failures.labels(Action.PERSON.value).inc()
        note = (
            f"rolled back by a person while configpin was rolling {self._changed(record, ended)}: "
            f"{ACTION_WORDS[Action.PERSON].full}"
        )
        log.warning("%s: %s", ref, note)
        if self.events is not None:
            self.events.say(obj, EventReason.CONFIG_ROLLED_BACK_BY_PERSON, note)

    def rollout_failed(self, ref: WorkloadRef, obj: JSONObject, ended: Ended) -> None:
        record = ended.record
        action = record.action or Action.NONE
        self.metrics.rollout_failures.labels(action.value).inc()
        change = self._changed(record, ended)
        words = ACTION_WORDS[action]
        done = f"{words.short}: {words.full}"
        if action is Action.HOLD and ended.not_undone:
            done = f"not undone ({ended.not_undone}); {done}"
        if not record.healthy:
            done += "; it was not healthy before the change, so the change goes on elsewhere"
        note = f"{ROLLOUT_WORDS[State.FAILED]}: {record.signal}. Changed: {change}. {done}"
        log.warning("%s: %s", ref, note)
        if self.events is None:
            return
        if action is Action.UNDO:
            self.events.say(obj, EventReason.CONFIG_ROLLED_BACK, note)
        else:
            self.events.say(obj, EventReason.CONFIG_ROLLOUT_FAILED, note)

    def left_to_reloader(
        self, regarding: Regarding, left: Mapping[SourceId, Covered], peek: Lookup
    ) -> None:
        """LeftToReloader: once per workload and content of the sources left."""
        versions = [(str(sid), (peek(sid) or _GONE).resource_version) for sid in sorted(left)]
        key = f"{regarding.kind}/{regarding.namespace}/{regarding.name} {versions}"
        with self._said_lock:
            if key in self._waiting:
                return
            self._waiting[key] = None
        why = "; ".join(f"{sid} by {covered.words()}" for sid, covered in sorted(left.items()))
        note = (
            f"{_names(left)} changed: left to Stakater Reloader, which rolls it for that ({why}); "
            "configpin's admission stamps Reloader's restart. Remove Reloader's annotation to "
            "let configpin roll it"
        )
        log.info("%s %s/%s: %s", regarding.kind, regarding.namespace, regarding.name, note)
        if self.events is not None:
            self.events.say(regarding, EventReason.LEFT_TO_RELOADER, note)

    def owned(self, obj: JSONObject) -> None:
        """An operator's workload (a Deployment a controller owns) is left to its owner: said
        once per object (the API server does not even send it to the webhook where the
        chart's matchConditions apply)."""
        meta = obj.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        if self.events is None or not uid:
            return
        with self._said_lock:
            if uid in self._owned:
                return
            self._owned[uid] = None
        owner = controller_of(obj) or {}
        self.metrics.owned_skipped.inc()
        self.events.say(obj, EventReason.SKIPPED_OWNED, f"not pinned: {owned_reason(owner)}")
