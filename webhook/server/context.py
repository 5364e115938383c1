"""What configpin's two webhooks share: where configpin acts (the scope), the few threads
that read past the cache, the worker process for large reviews, the policy for trouble, and
the counts of what was answered."""

from __future__ import annotations

import asyncio
import multiprocessing
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Final, Protocol, TypeVar

from webhook.core.kinds import admitted_kinds, custom_kinds
from webhook.core.model import SOURCE_API_KINDS, JSONObject
from webhook.core.owners import pinned_owners
from webhook.process.config import Settings
from webhook.process.metrics import AdmissionResult, Metrics, Tally
from webhook.server import large
from webhook.server.admission import BadReview, Review
from webhook.server.policy import Trouble

_T = TypeVar("_T")

# Metric label values come from these sets only: a request's fields are whatever its sender
# wrote, and every distinct label value is a time series kept for the life of the process.
_OPERATIONS: Final = frozenset({"CREATE", "UPDATE", "DELETE", "CONNECT"})


def _label(value: str, allowed: frozenset[str]) -> str:
    return value if value in allowed else "other"


class Scope(Protocol):
    """The namespaces configpin acts in (webhook.kube.namespaces.NamespaceSet): the selection
    the webhook configuration makes, enforced here whatever a request claims."""

    def __contains__(self, namespace: object) -> bool:
        """From memory."""
        ...

    def confirm(self, namespace: str, timeout: float) -> bool:
        """Asked (blocking, on the reader threads) when memory says no, for a namespace
        selected a moment ago."""
        ...


class Excluding:
    """Every namespace but these (no cluster: nothing to select by)."""

    def __init__(self, excluded: frozenset[str] = frozenset()) -> None:
        self.excluded = excluded

    def __contains__(self, namespace: object) -> bool:
        return namespace not in self.excluded

    def confirm(self, namespace: str, timeout: float) -> bool:
        return False


class Busy(Exception):
    """Every reader thread is taken and the queue is full: answered at once instead."""


class Admission:
    def __init__(
        self,
        *,
        hkey: bytes,
        metrics: Metrics,
        settings: Settings,
        scope: Scope | None = None,
    ) -> None:
        """`settings`: `configpin serve`'s (strict, read deadline and workers); `scope`:
        where configpin acts (default: everywhere)."""
        self.hkey = hkey
        self.metrics = metrics
        self.trouble = Trouble(settings.admission.strict)
        self.scope: Scope = scope if scope is not None else Excluding()
        read_workers = settings.admission.read_workers
        # Reads past the cache run on their own few threads, never the loop's default
        # executor, and within a deadline below the webhook's timeout: the answer (unchanged,
        # with a warning) reaches the API server while it still waits for one, and a slow API
        # server or a review naming many missing sources holds at most these threads, each
        # of which gives up at the deadline. Beyond a short queue, a review is answered at
        # once instead of waiting for a thread.
        self.read_deadline = settings.admission.read_deadline
        self._reader = ThreadPoolExecutor(max_workers=read_workers, thread_name_prefix="read")
        self.read_slots = read_workers * 4
        self._reads_pending = 0
        self._out_of_scope = metrics.out_of_scope
        # Labelled metric children, looked up once: `labels()` costs more than the count.
        self._counts: dict[tuple[str, str, str], Tally] = {}
        # metric labels: the workload kinds, and the sources whose writes it previews
        self._kinds = frozenset(k.kind for k in admitted_kinds()) | SOURCE_API_KINDS
        # Large reviews are decided in a worker process (large.py), one at a time: it holds
        # the one review in progress, whichever webhook it came to.
        self._worker: ProcessPoolExecutor | None = None
        self.large_reviews = asyncio.Lock()

    def close(self) -> None:
        self._reader.shutdown(wait=False, cancel_futures=True)
        if self._worker is not None:
            self._worker.shutdown(wait=False, cancel_futures=True)
            self._worker = None

    def count(self, review: Review, result: AdmissionResult) -> None:
        """One answer, counted (configpin_admissions_total)."""
        key = (_label(review.kind, self._kinds), _label(review.operation, _OPERATIONS), result)
        counter = self._counts.get(key)
        if counter is None:
            counter = self._counts[key] = self.metrics.loop_counts.tally(
                self.metrics.admissions.labels(*key)
            )
        counter.inc()

    # -- reads past the cache

    async def read(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        """`fn` on the reader threads, within the read deadline. Raises Busy (no thread to
        be had soon) or TimeoutError (a queued call then never runs; a running one gives up
        at the deadline it was handed)."""
        if self._reads_pending >= self.read_slots:
            raise Busy
        self._reads_pending += 1
        try:
            future = self._reader.submit(fn, *args, **kwargs)
            try:
                return await asyncio.wait_for(asyncio.wrap_future(future), self.read_deadline)
            except TimeoutError:
                future.cancel()
                raise
        finally:
            self._reads_pending -= 1

    async def in_scope(self, review: Review, obj: JSONObject) -> bool:
        """Whether configpin acts on `review`, whose object (or old object) is `obj`; if not,
        counted (nothing is looked up, written or said)."""
        namespace = review.namespace
        claimed = (obj.get("metadata") or {}).get("namespace")
        if (
            not namespace
            or (claimed and claimed != namespace)
            or not (namespace in self.scope or await self._confirmed_in_scope(namespace))
        ):
            # Not a namespace configpin acts in (or a request that contradicts itself, which
            # the API server never sends).
            self._out_of_scope.inc()
            return False
        return True

    async def _confirmed_in_scope(self, namespace: str) -> bool:
        try:
            return await self.read(self.scope.confirm, namespace, self.read_deadline)
        except (Busy, TimeoutError):
            return False

    # -- the worker process for large reviews

    def start_worker(self) -> None:
        """Start the worker process for large reviews now rather than at the first one."""
        if self._worker is None:
            self._worker = ProcessPoolExecutor(
                max_workers=1,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=large.configure,
                initargs=(custom_kinds(), pinned_owners()),
            )
            self._worker.submit(large.warm)

    async def in_worker(self, fn: Callable[..., _T], *args: Any) -> _T:
        self.start_worker()
        assert self._worker is not None
        try:
            return await asyncio.get_running_loop().run_in_executor(self._worker, fn, *args)
        except BrokenProcessPool:
            self._worker = None  # killed (out of memory?): the next large review starts another
            raise

    async def prepare_large(self, body: bytes) -> large.Prepared:
        """Parse and check a large review, and take it in (server/intake.py), in the worker.
        Raises BadReview (answer 400). Hold `large_reviews` from here until its answer."""
        prepared = await self.in_worker(large.prepare, body, self.hkey)
        if prepared.outcome == "bad":
            raise BadReview(prepared.message)
        return prepared
