"""Each workload's status as `configpin status` reports it (a server-side dry run of it, with
the user's rights), worked out in the background for the workloads a page shows, and kept
until the workload, one of its sources or configpin's Events about it change.

A page of 1,000 workloads is shown at once from what the feeds hold; the states fill in as the
dry runs answer (a few workers, so that the API server is not flooded), and the page is told.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final

from webhook.commands.dashboard.workload import ref_of, uses
from webhook.commands.status import StatusReader
from webhook.core.model import JSONObject

WORKERS: Final = 4
KEPT_MAX: Final = 20_000


class StatusBook:
    def __init__(
        self,
        reader: StatusReader,
        on_done: Callable[[], None],
        *,
        workers: int = WORKERS,
    ) -> None:
        self.reader = reader
        self.on_done = on_done
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="dashboard-status")
        self._lock = threading.Lock()
        self._done: dict[tuple[str, str, str], tuple[Hashable, dict[str, Any]]] = {}
        self._asked: dict[tuple[str, str, str], Hashable] = {}

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    @staticmethod
    def version(
        obj: JSONObject, source_versions: Mapping[tuple[str, str, str], str], marker: float
    ) -> Hashable:
        """What the status depends on: the workload as read, its sources as read, and the
        latest Event configpin wrote about it (`marker`)."""
        _, ns, _ = ref_of(obj)
        rv = str((obj.get("metadata") or {}).get("resourceVersion") or "")
        sources = tuple(
            sorted(
                (key, source_versions.get((key.partition("/")[0], ns, key.partition("/")[2]), ""))
                for key in uses(obj)
            )
        )
        return (rv, sources, marker)

    def get(self, obj: JSONObject, version: Hashable) -> dict[str, Any] | None:
        """The status of the workload for `version` (None: not worked out yet, asked now);
        while a newer one is worked out, the last one."""
        ref = ref_of(obj)
        with self._lock:
            done = self._done.get(ref)
            if done is not None and done[0] == version:
                return done[1]
            if self._asked.get(ref) != version:
                self._asked[ref] = version
                self._pool.submit(self._work, ref, obj, version)
            return done[1] if done is not None else None

    def _work(self, ref: tuple[str, str, str], obj: JSONObject, version: Hashable) -> None:
        with self._lock:
            if self._asked.get(ref) != version:
                return  # a newer one was asked meanwhile
        try:
            found = self.reader.status(obj).as_dict()
        except Exception as e:  # a dry run that cannot be made: said on the row
            found = {"state": "unknown", "reason": f"status could not be worked out: {e}"}
        found.pop("warnings", None)
        found.pop("rollout", None)
        with self._lock:
            self._done[ref] = (version, found)
            while len(self._done) > KEPT_MAX:
                self._done.pop(next(iter(self._done)))
        self.on_done()
