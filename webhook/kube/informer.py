"""One list+watch per resource type: list, watch from that resourceVersion, re-watch when
the server ends the stream, relist on 410 Gone (kopf `watching.py`, client-go reflector)."""

from __future__ import annotations

import logging
import queue
import random
import threading
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import TYPE_CHECKING, Final, Protocol, TypeVar

from webhook.core.model import JSONObject
from webhook.kube.errors import Gone, KubeError
from webhook.kube.raw import Kube, path
from webhook.process.allocator import release

if TYPE_CHECKING:  # (the server's: a client of the CLI counts nothing, and needs no
    # prometheus_client, which only `configpin[server]` installs)
    from webhook.process.metrics import Metrics

log = logging.getLogger(__name__)

FIRST_PAGE: Final = 100  # objects in the first page of a list, before their size is known
PAGE_BYTES: Final = 256 * 1024  # JSON per list page after that, about


T = TypeVar("T")
_END: Final = object()


def read_ahead(source: Iterator[T], *, name: str = "read-ahead") -> Generator[T, None, None]:
    """The items of `source`, the next one fetched on a thread of its own while the caller
    works on this one: a list page is asked for (and the API server encodes it) while the
    last one is digested, instead of each waiting on the other. One item is fetched ahead,
    never more (two pages in memory at most). An error of `source` is raised to the caller
    in its place; closing the generator stops the thread."""
    handoff: queue.SimpleQueue[tuple[object, BaseException | None]] = queue.SimpleQueue()
    ask = threading.Semaphore(0)  # one release per item the caller is ready for
    stop = threading.Event()

    def produce() -> None:
        try:
            while True:
                while not ask.acquire(timeout=0.5):
                    if stop.is_set():
                        return
                if stop.is_set():
                    return
                handoff.put((next(source, _END), None))
        except BaseException as e:  # handed to the caller, raised there
            handoff.put((_END, e))

    thread = threading.Thread(target=produce, name=name, daemon=True)
    thread.start()
    ask.release()
    try:
        while True:
            item, error = handoff.get()
            if error is not None:
                raise error
            if item is _END:
                return
            ask.release()  # the next one, while the caller works on this one
            yield item  # type: ignore[misc]
    finally:
        stop.set()


class InformerHandler(Protocol):
    def relisted(self, items: Iterable[JSONObject]) -> None:
        """The full current set (streamed page by page): replace what was known."""
        ...

    def event(self, kind: str, obj: JSONObject) -> None:
        """ADDED, MODIFIED or DELETED."""
        ...


class Informer:
    """`handler` kept up to date with one resource type (all namespaces, or `namespace`).

    The controller runs it as it is. A reader with a person's rights (the dashboard) needs to
    say how each feed stands, and may be allowed to list but not to watch; for it:
    `on_error(doing, error)` is called for every failure of a list or a watch (`doing`:
    "list" or "watch") and returns how long to wait before trying again (None: the
    informer's backoff, doubled up to `backoff_max`), and the informer then logs the
    failure at debug only, the caller saying it; `on_watch()` is called when a watch is
    open (the cluster answers again); `poll` set (seconds), it lists again every `poll` s
    instead of watching."""

    def __init__(
        self,
        kube: Kube,
        resource: str,
        handler: InformerHandler,
        metrics: Metrics | None,
        *,
        prefix: str | None = None,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        watch_timeout: int = 300,
        # Pages bounded by size, not by count (see Kube.list_pages): the transient parse of
        # whole objects stays small whatever they weigh, and small objects come in few round
        # trips. PAGE_BYTES is measured in bench/README.md (cache_memory.py).
        page_size: int = FIRST_PAGE,
        page_bytes: int = PAGE_BYTES,
        on_error: Callable[[str, Exception], float | None] | None = None,
        on_watch: Callable[[], None] | None = None,
        poll: float | None = None,
        backoff_max: float = 30.0,
    ) -> None:
        self.kube = kube
        self.resource = resource
        self.handler = handler
        self.metrics = metrics
        self.api_path = path(resource, namespace, prefix=prefix)
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.watch_timeout = watch_timeout
        self.page_size = page_size
        self.page_bytes = page_bytes
        self.on_error = on_error
        self.on_watch = on_watch
        self.poll = poll
        self.backoff_max = backoff_max
        self.synced = threading.Event()
        self.relists = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.resource_version = ""

    def _restarted(self, how: str) -> None:
        """Count a restart of the watch (`ended`, `gone`, `error`), where metrics are kept."""
        if self.metrics is not None:
            self.metrics.watch_restarts.labels(self.resource, how).inc()

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._run, name=f"informer-{self.resource}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def _list(self) -> None:
        pages = read_ahead(
            self.kube.list_pages(
                self.api_path,
                page_size=self.page_size,
                page_bytes=self.page_bytes,
                labelSelector=self.label_selector,
                fieldSelector=self.field_selector,
            ),
            name=f"list-{self.resource}",
        )
        last: dict[str, str] = {}

        def items() -> Iterator[JSONObject]:
            for page in pages:
                last["rv"] = str((page.get("metadata") or {}).get("resourceVersion") or "")
                yield from page.get("items") or ()

        try:
            self.handler.relisted(items())
        finally:
            pages.close()
        release()  # the pages' memory, parsed whole to keep a few digests of each
        self.resource_version = last.get("rv", "")
        self.relists += 1
        self.synced.set()

    def _watch(self) -> None:
        with self.kube.watch(
            self.api_path,
            self.resource_version,
            timeout_seconds=self.watch_timeout,
            labelSelector=self.label_selector,
            fieldSelector=self.field_selector,
        ) as events:
            if self.on_watch is not None:
                self.on_watch()
            for event in events:
                if self._stop.is_set():
                    return
                kind = event.get("type")
                obj = event.get("object") or {}
                if kind == "ERROR":
                    code = obj.get("code")
                    raise (
                        Gone(self.api_path, 410, "watch expired")
                        if code == 410
                        else KubeError(self.api_path, code, str(obj.get("reason") or "watch error"))
                    )
                rv = (obj.get("metadata") or {}).get("resourceVersion")
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    self.handler.event(kind, obj)
                if rv:
                    self.resource_version = str(rv)  # bookmarks only move this forward

    def _run(self) -> None:
        backoff = 0.5
        need_list = True
        while not self._stop.is_set():
            doing = "list"
            try:
                if need_list or self.poll is not None:
                    self._list()
                    need_list = False
                if self.poll is not None:  # (listed: the next list after `poll` s)
                    backoff = 0.5
                    self._stop.wait(self.poll)
                    continue
                doing = "watch"
                self._watch()
                backoff = 0.5  # the server ended the stream normally: watch again from where we are
                self._restarted("ended")
            except Gone:
                log.info("watch of %s expired (410): relisting", self.resource)
                self._restarted("gone")
                need_list = True
            except Exception as e:
                self._restarted("error")
                wait = None
                if self.on_error is None:
                    log.warning(
                        "watch of %s failed (%s); retrying in %.1fs", self.resource, e, backoff
                    )
                else:
                    log.debug("%s of %s failed: %s", doing, self.api_path, e)
                    wait = self.on_error(doing, e)
                if wait is not None:
                    self._stop.wait(wait)
                    continue
                self._stop.wait(backoff * (1 + random.random() / 2))  # noqa: S311 (jitter)
                backoff = min(backoff * 2, self.backoff_max)
