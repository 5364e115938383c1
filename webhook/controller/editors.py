"""Who made what a rollout rolls to: the user admission recorded on the source
(`configpin.io/changed-by`, webhook.core.audit.ChangedBy) as the last writer of a key the
workload reads, for the rollout record, the rollout Events and `configpin status`; never the
last writer of the source when that write changed only keys the workload does not read. Read
once per change and key set (one GET of the source, within the controller's rate limit; the
workers that ask for the same meanwhile wait for that answer), then remembered. A source
written while configpin was down, or whose record is not configpin's for that content, or
that moved on since in what the workload reads, was changed by someone unknown."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Final

from cachetools import LRUCache

from webhook.core import digest
from webhook.core.preview import changed_by_of
from webhook.core.record import Change
from webhook.kube.errors import KubeError
from webhook.kube.ratelimit import LimitedKube
from webhook.kube.raw import Kube, path

UNKNOWN: Final = "unknown"
_REMEMBERED: Final = 4096  # answers kept, the most recently asked
_WAIT: Final = 10.0  # seconds a worker waits for another's read of the same change at most


@dataclass(frozen=True, slots=True)
class Rolled:
    """What a rollout rolls to of one change: the keys the workload reads of its source
    (None: all of them) and their digest (under the namespace's key, as its record says)."""

    change: Change
    keys: frozenset[str] | None
    to: str


class Editors:
    def __init__(self, kube: Kube | LimitedKube, hkey: bytes) -> None:
        self.kube = kube
        self.hkey = hkey
        self._lock = threading.Lock()
        self._said: LRUCache[tuple[str, Rolled], str] = LRUCache(maxsize=_REMEMBERED)
        self._asking: dict[tuple[str, Rolled], threading.Event] = {}

    def said(self, namespace: str, rolled: Rolled) -> str:
        """ "alice at 2026-11-26T17:06:02Z", or "unknown"."""
        key = (namespace, rolled)
        with self._lock:
            found = self._said.get(key)
            asked = self._asking.get(key) if found is None else None
            if found is None and asked is None:
                self._asking[key] = threading.Event()
        if found is not None:
            return found
        if asked is not None:  # another worker reads it: its answer, once it has one
            asked.wait(_WAIT)
            with self._lock:
                return self._said.get(key, UNKNOWN)
        try:
            return self._ask(namespace, rolled)
        finally:
            with self._lock:
                self._asking.pop(key).set()

    def _ask(self, namespace: str, rolled: Rolled) -> str:
        key = (namespace, rolled)
        sid = rolled.change.source
        try:
            obj = self.kube.get(path(sid.kind.resource, namespace, sid.name))
            record = digest.record_from_object(self.hkey, sid.kind, obj)
        except (KubeError, digest.BadSource):
            return UNKNOWN  # not remembered: asked again next time
        nskey = digest.namespace_key(self.hkey, namespace)
        if digest.source_digest(nskey, record, rolled.keys) != rolled.to:
            # it moved on since in what the workload reads: the record of who made that is
            # gone with it (a move in other keys leaves it: the record carries it on)
            return UNKNOWN
        content = digest.source_digest(self.hkey, record)
        who = changed_by_of(self.hkey, namespace, sid, obj, content)
        made = who.made(rolled.keys) if who is not None else None
        text = made if made is not None else UNKNOWN
        with self._lock:
            self._said[key] = text
        return text

    def of(self, namespace: str, rolled: tuple[Rolled, ...]) -> str:
        """Who made what a rollout rolls to (it may roll several changes): each once."""
        seen: list[str] = []
        for each in rolled:
            who = self.said(namespace, each)
            if who not in seen:
                seen.append(who)
        return "; ".join(seen)
