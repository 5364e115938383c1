"""Who made a change: the user admission recorded on the source (`configpin.io/changed-by`,
webhook.core.preview.ChangedBy), for the rollout record, the rollout Events and `configpin
status`. Read once per change (one GET of the source, within the controller's rate limit;
the workers that ask for the same change meanwhile wait for that answer), then remembered; a
source written while configpin was down, or whose record is not configpin's for that
content, was changed by someone unknown."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Final

from webhook.core import digest
from webhook.core.preview import changed_by_of
from webhook.core.record import Change
from webhook.kube.errors import KubeError
from webhook.kube.ratelimit import LimitedKube
from webhook.kube.raw import Kube, path

UNKNOWN: Final = "unknown"
_REMEMBERED: Final = 4096
_WAIT: Final = 10.0  # seconds a worker waits for another's read of the same change at most


class Editors:
    def __init__(self, kube: Kube | LimitedKube, hkey: bytes) -> None:
        self.kube = kube
        self.hkey = hkey
        self._lock = threading.Lock()
        self._said: OrderedDict[tuple[str, Change], str] = OrderedDict()
        self._asking: dict[tuple[str, Change], threading.Event] = {}

    def said(self, namespace: str, change: Change) -> str:
        """ "alice at 2026-11-26T17:06:02Z", or "unknown"."""
        key = (namespace, change)
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
            return self._ask(namespace, change)
        finally:
            with self._lock:
                self._asking.pop(key).set()

    def _ask(self, namespace: str, change: Change) -> str:
        key = (namespace, change)
        sid = change.source
        try:
            obj = self.kube.get(path(sid.kind.resource, namespace, sid.name))
            record = digest.record_from_object(self.hkey, sid.kind, obj)
        except (KubeError, digest.BadSource):
            return UNKNOWN  # not remembered: asked again next time
        content = digest.source_digest(self.hkey, record)
        if digest.content_id(content) != change.content:
            return UNKNOWN  # it moved on since: this change's record is gone with it
        who = changed_by_of(self.hkey, namespace, sid, obj, content)
        text = who.said() if who is not None else UNKNOWN
        with self._lock:
            self._said[key] = text
            while len(self._said) > _REMEMBERED:
                self._said.popitem(last=False)
        return text

    def of(self, namespace: str, changes: tuple[Change, ...]) -> str:
        """Who made these changes (one rollout may roll several): each once."""
        seen: list[str] = []
        for change in changes:
            who = self.said(namespace, change)
            if who not in seen:
                seen.append(who)
        return "; ".join(seen)
