"""The reverse index of workloads (source -> workloads), as the informers keep it: entries
(webhook.core.current.WorkloadEntry) by workload, by the sources they consume, and the
rollouts in flight by namespace. What makes a workload current is decided in
webhook.core.current; this holds the entries, thread-safe.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from typing import TypeVar

from webhook.core.current import WorkloadEntry, WorkloadRef
from webhook.core.model import SourceId

_T = TypeVar("_T")


def _add(table: dict[str, _T | set[_T]], key: str, value: _T) -> None:
    """Adds `value` under `key` of a table that maps a key to its one value itself, and to a
    set only where it has several (a set costs about 200 bytes; most keys have one value)."""
    found = table.setdefault(key, value)
    if found is value or found == value:
        return
    if isinstance(found, set):
        found.add(value)
    else:
        table[key] = {found, value}


def _discard(table: dict[str, _T | set[_T]], key: str, value: _T) -> None:
    """Takes `value` from under `key` of such a table (see `_add`)."""
    found = table.get(key)
    if isinstance(found, set):
        found.discard(value)
        if len(found) == 1:
            table[key] = found.pop()
    elif found == value:
        del table[key]


class WorkloadIndex:
    """Entries by workload, and workloads by (namespace, source). Thread-safe: the
    informers write it from their threads, the controller reads it from its own.

    A source consumed by one workload (the common case) maps to that workload's ref
    itself, and a source name consumed in one namespace to that namespace: a set only where
    there are several (`_add`, `_discard`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[WorkloadRef, WorkloadEntry] = {}
        # namespace -> "configmap/<name>" -> the ref, or the refs, of its consumers
        self._by_source: dict[str, dict[str, WorkloadRef | set[WorkloadRef]]] = {}
        # "configmap/<name>" -> the namespace, or the namespaces, where something consumes a
        # source of that name
        self._namespaces: dict[str, str | set[str]] = {}
        # namespace -> the workloads there with a config rollout configpin follows
        # (safe delivery's --max-rolling counts these, less the paused and superseded)
        self._rolling: dict[str, set[WorkloadRef]] = {}
        # Moves whenever what safe delivery knows of a workload changes (its record, its
        # standing, its being there): what the wave gate worked out before is stale then.
        self.generation = 0
        # namespace -> a count that moves whenever an entry there changes, comes or goes (what
        # it consumes included): the preview's lists of a source's consumers there are stale
        self._versions: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, ref: WorkloadRef) -> WorkloadEntry | None:
        return self._entries.get(ref)

    def put(self, entry: WorkloadEntry) -> WorkloadEntry | None:
        """Insert or replace; returns the entry it replaced."""
        with self._lock:
            old = self._entries.get(entry.ref)
            if old == entry:
                self._entries[entry.ref] = entry  # the same, at a newer resourceVersion
                return old
            if old is None or old.delivery != entry.delivery:
                self.generation += 1
            self._moved(entry.ref.namespace)
            if old is not None:
                self._unlink(old)
            self._entries[entry.ref] = entry
            ref = entry.ref
            by_text = self._by_source.setdefault(ref.namespace, {})
            if entry.rolling:
                self._rolling.setdefault(ref.namespace, set()).add(ref)
            for text in entry.index_texts():
                _add(self._namespaces, text, ref.namespace)
                _add(by_text, text, ref)
            return old

    def remove(self, ref: WorkloadRef) -> WorkloadEntry | None:
        with self._lock:
            old = self._entries.pop(ref, None)
            if old is not None:
                self.generation += 1
                self._moved(ref.namespace)
                self._unlink(old)
            return old

    def _moved(self, namespace: str) -> None:
        self._versions[namespace] = self._versions.get(namespace, 0) + 1

    def version(self, namespace: str) -> int:
        """Moves whenever a workload of `namespace` changes, comes or goes."""
        return self._versions.get(namespace, 0)

    def _unlink(self, entry: WorkloadEntry) -> None:
        ref = entry.ref
        rolling = self._rolling.get(ref.namespace)
        if rolling is not None:
            rolling.discard(ref)
            if not rolling:
                del self._rolling[ref.namespace]
        by_text = self._by_source.get(ref.namespace)
        if by_text is None:
            return
        for text in entry.index_texts():
            _discard(by_text, text, ref)
            if text not in by_text:  # nothing else in its namespace consumes it
                _discard(self._namespaces, text, ref.namespace)
        if not by_text:
            del self._by_source[ref.namespace]

    def replace_kind(self, kind: str, entries: Iterable[WorkloadEntry]) -> set[WorkloadRef]:
        """After a relist: the entries of `kind` are exactly `entries`; returns the refs
        that disappeared."""
        fresh = {e.ref: e for e in entries}
        with self._lock:
            gone = {r for r in self._entries if r.kind == kind and r not in fresh}
        for ref in gone:
            self.remove(ref)
        for entry in fresh.values():
            self.put(entry)
        return gone

    def namespaces_of(self, sid: SourceId) -> list[str]:
        """The namespaces where something consumes a source of this kind and name."""
        with self._lock:
            found = self._namespaces.get(str(sid))
        if found is None:
            return []
        return [found] if isinstance(found, str) else sorted(found)

    def rolling(self, namespace: str) -> list[WorkloadEntry]:
        """The workloads of a namespace whose config rollout configpin follows."""
        with self._lock:
            refs = self._rolling.get(namespace, ())
            return [self._entries[r] for r in refs]

    def consumers(self, namespace: str, sid: SourceId) -> list[WorkloadEntry]:
        with self._lock:
            found = self._by_source.get(namespace, {}).get(str(sid))
            if found is None:
                return []
            if isinstance(found, set):
                return [self._entries[r] for r in found]
            return [self._entries[found]]

    def entries(
        self, *, kind: str | None = None, namespace: str | None = None
    ) -> Iterator[WorkloadEntry]:
        with self._lock:
            chosen = [
                e
                for e in self._entries.values()
                if (kind is None or e.ref.kind == kind)
                and (namespace is None or e.ref.namespace == namespace)
            ]
        return iter(chosen)
