"""What the dashboard reads, with the user's own rights: one list, then a watch from it, per
resource type in the namespace asked for (or every namespace), by the controller's own
informer (`webhook.kube.informer`), kept in memory trimmed to what the pages need.

- Workloads of every kind `configpin status` reports on, whole (the status of one is asked of
  the API server with a dry run of it), less their managed fields.
- ConfigMaps: their key names and configpin's annotations; values are dropped as read.
- Secrets: metadata only (`PartialObjectMetadata`): their data is never asked for in a list or
  a watch. Their key names are read one Secret at a time, when a page asks who uses which key
  of it (`secret_keys`: a GET, which needs `get` on it; the values are dropped as read).
- Events that configpin's controller writes (its reasons), as short notes.
- ConfigRollouts (configpin.io/v1alpha1): what the controller publishes of each change, its
  waves and what each member waits for (the pages read them; they decide nothing).

Where the user may list but not watch, the list is read again every second; where they may
not list, the feed says so (the API server's answer) and the rest works; where the API server
cannot be reached, each feed says so and keeps what it last read, trying again with backoff;
a kind the cluster does not serve (a CRD not installed) is looked for again every minute.
"""

from __future__ import annotations

import datetime
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from webhook.core.constants import DOMAIN, LABEL_SNAPSHOT
from webhook.core.kinds import WorkloadKind
from webhook.core.model import JSONObject, SourceKind
from webhook.core.owners import left_to_owner, operator_owned
from webhook.core.reasons import EventReason
from webhook.core.record import digest_mapping_any
from webhook.core.rollouts import GROUP, KIND, PLURAL, VERSION
from webhook.kube.errors import Forbidden, KubeError, NotFound
from webhook.kube.informer import Informer
from webhook.kube.raw import Kube, path

log = logging.getLogger(__name__)

POLL: Final = 1.0  # seconds between lists where the user may not watch
RETRY_MAX: Final = 10.0  # seconds between tries at most, where the API server does not answer
NOT_SERVED_AGAIN: Final = 60.0  # seconds between looks for a kind the cluster does not serve
EVENTS_MAX: Final = 20_000
WATCH_SECONDS: Final = 240
META_LIST: Final = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
META_ONE: Final = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"

# The Events configpin's controller writes about rollouts (webhook.core.reasons.EventReason):
# the rest are not kept.
R = EventReason
REASONS: Final = frozenset(
    {
        R.ROLLOUT_STARTED,
        R.REFRESHED,
        R.ROLLED_INSTEAD_OF_REFRESH,
        R.ROLLOUT_DEFERRED,
        R.ROLLOUT_FAILED,
        R.CONFIG_ROLLOUT_WAITING,
        R.CONFIG_ROLLOUT_AWAITING_APPROVAL,
        R.CONFIG_ROLLOUT_COMPLETE,
        R.CONFIG_ROLLOUT_LEFT,
        R.CONFIG_ROLLOUT_FAILED,
        R.CONFIG_ROLLED_BACK,
        R.CONFIG_ROLLED_BACK_BY_PERSON,
    }
)
_LAST_APPLIED: Final = "kubectl.kubernetes.io/last-applied-configuration"


class MetadataKube(Kube):
    """Lists and watches answered as object metadata only (meta.k8s.io/v1), with no fallback
    to whole objects: a Secret's data never leaves the API server for a list or a watch. One
    feed's (one thread's): the Accept header follows the request being made."""

    def __init__(self, api: Any) -> None:
        super().__init__(api)
        self._accept = META_LIST

    def open(self, method: str, api_path: str, **kwargs: Any) -> Any:
        query = kwargs.get("query") or {}
        self._accept = META_ONE if query.get("watch") else META_LIST
        return super().open(method, api_path, **kwargs)

    def _headers(self, content_type: str | None) -> dict[str, str]:
        headers = super()._headers(content_type)
        headers["Accept"] = self._accept
        return headers


def epoch(stamp: Any) -> float:
    """Seconds since the epoch of an API server time stamp (0: none)."""
    if not isinstance(stamp, str) or not stamp:
        return 0.0
    try:
        return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def configpin_annotations(meta: Mapping[str, Any]) -> dict[str, str]:
    annotations = meta.get("annotations")
    if not isinstance(annotations, dict):
        return {}
    return {
        str(k): str(v)
        for k, v in annotations.items()
        if isinstance(k, str) and k.startswith(DOMAIN + "/")
    }


@dataclass(frozen=True)
class Source:
    """A ConfigMap or Secret as the pages need it: names, never values."""

    kind: str  # "configmap" or "secret"
    namespace: str
    name: str
    resource_version: str
    annotations: Mapping[str, str]  # configpin's own (configpin.io/...)
    keys: tuple[str, ...] | None  # None: not read (a Secret's, from a list)
    copy: bool = False  # one of configpin's snapshot copies
    created: float = 0.0


@dataclass(frozen=True)
class Note:
    """An Event configpin wrote about a workload."""

    namespace: str
    kind: str
    name: str
    reason: str
    note: str
    type: str
    at: float  # its last occurrence
    count: int = 1


def key_names(kind: SourceKind, obj: JSONObject) -> tuple[str, ...]:
    """The key names of a source as read (its content fields'), never a value."""
    found: set[str] = set()
    for content in kind.facts.content:
        value = obj.get(content.name)
        if isinstance(value, dict):
            found |= {str(k) for k in value}
    return tuple(sorted(found))


def _source(kind: SourceKind, obj: JSONObject, *, with_keys: bool) -> Source:
    meta = obj.get("metadata") or {}
    keys = key_names(kind, obj) if with_keys else None
    labels = meta.get("labels") or {}
    return Source(
        kind.value,
        str(meta.get("namespace") or ""),
        str(meta.get("name") or ""),
        str(meta.get("resourceVersion") or ""),
        configpin_annotations(meta),
        keys,
        isinstance(labels, dict) and labels.get(LABEL_SNAPSHOT) == "true",
        epoch(meta.get("creationTimestamp")),
    )


def _note(obj: JSONObject) -> Note | None:
    reason = str(obj.get("reason") or "")
    if reason not in REASONS:
        return None
    about = obj.get("involvedObject") or obj.get("regarding") or {}
    series = obj.get("series") or {}
    at = max(
        epoch(obj.get("lastTimestamp")),
        epoch(obj.get("eventTime")),
        epoch(series.get("lastObservedTime")),
        epoch(obj.get("firstTimestamp")),
        epoch((obj.get("metadata") or {}).get("creationTimestamp")),
    )
    count = obj.get("count") or series.get("count") or 1
    return Note(
        str(about.get("namespace") or (obj.get("metadata") or {}).get("namespace") or ""),
        str(about.get("kind") or ""),
        str(about.get("name") or ""),
        reason,
        str(obj.get("message") or obj.get("note") or "")[:2000],
        str(obj.get("type") or ""),
        at,
        count if isinstance(count, int) else 1,
    )


def _workload(kind: WorkloadKind, api_version: str) -> Callable[[JSONObject], JSONObject | None]:
    """The workloads `configpin status` reports on: not those whose owner's template decides
    (a Deployment's ReplicaSets, a CronJob's Jobs), nor configpin's copies."""

    def trim(obj: JSONObject) -> JSONObject | None:
        obj.setdefault("kind", kind.kind)
        obj.setdefault("apiVersion", api_version)
        meta = obj.get("metadata") or {}
        if (meta.get("labels") or {}).get(LABEL_SNAPSHOT):
            return None
        if left_to_owner(obj) is not None and not operator_owned(obj):
            return None
        meta.pop("managedFields", None)
        annotations = meta.get("annotations")
        if isinstance(annotations, dict):
            annotations.pop(_LAST_APPLIED, None)
        return obj

    return trim


def _rollout(obj: JSONObject) -> JSONObject:
    """A ConfigRollout as the pages read it: what it says (spec, status) and which object and
    generation it is; nothing else (its managed fields)."""
    meta = obj.get("metadata") or {}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {
            k: meta[k]
            for k in ("name", "namespace", "uid", "resourceVersion", "generation")
            if k in meta
        },
        "spec": obj.get("spec") or {},
        "status": obj.get("status") or {},
    }


@dataclass
class FeedState:
    """How one feed stands, for the page to say."""

    what: str  # "Deployments in shop"
    listed: bool = False
    watching: bool = False
    served: bool = True  # (a custom kind whose CRD is not installed: nothing to say)
    error: str = ""
    since: float = 0.0  # when it last read the cluster
    forbidden: str = ""  # the API server's answer, where the user may not list it

    def as_dict(self) -> dict[str, Any]:
        return {
            "what": self.what,
            "listed": self.listed,
            "watching": self.watching,
            "error": self.error,
            "since": self.since,
            "forbidden": bool(self.forbidden),
        }


class Feed:
    """One resource type in the scope, kept in `table` (key -> trimmed) by the controller's
    own list+watch (`webhook.kube.informer.Informer`: list, watch from there, relist on 410),
    with the user's rights: where they may list but not watch, it lists again every `POLL`
    s; each failure is said on the feed's state (`FeedState`) for the page."""

    def __init__(
        self,
        store: Store,
        what: str,
        kube: Kube,
        resource: str,
        prefix: str | None,
        trim: Callable[[JSONObject], Any],
        key: Callable[[JSONObject], Any],
        *,
        optional: bool = False,
    ) -> None:
        self.store = store
        self.trim = trim
        self.key = key
        self.optional = optional  # a 404 means "not served here", said by nothing
        self.table: dict[Any, Any] = {}
        self.state = FeedState(what)
        self.informer = Informer(
            kube,
            resource,
            self,
            None,  # (its restarts are said on the page, not counted)
            prefix=prefix,
            namespace=store.namespace,
            watch_timeout=WATCH_SECONDS,
            on_error=self._failed,
            on_watch=self._watching,
            backoff_max=RETRY_MAX,
        )

    @property
    def may_watch(self) -> bool:
        return self.informer.poll is None

    def start(self) -> None:
        self.informer.start()

    def stop(self) -> None:
        self.informer.stop()

    def _kept(self, obj: JSONObject) -> tuple[Any, Any] | None:
        value = self.trim(obj)
        return None if value is None else (self.key(obj), value)

    # --- InformerHandler (the informer's thread)
    def relisted(self, items: Iterable[JSONObject]) -> None:
        fresh: dict[Any, Any] = {}
        for item in items:
            kept = self._kept(item)
            if kept is not None:
                fresh[kept[0]] = kept[1]
        with self.store.lock:
            changed = fresh != self.table
            self.table = fresh
            self.state.listed = True
            self.state.served = True
            self.state.error = ""
            self.state.forbidden = ""
            self.state.since = time.time()
        if changed:
            self.store.changed(self, fresh.values())

    def event(self, kind: str, obj: JSONObject) -> None:
        if self.store.stopped.is_set():
            return
        kept = self._kept(obj)
        with self.store.lock:
            if kind == "DELETED" or kept is None:
                self.table.pop(self.key(obj), None)
            else:
                self.table[kept[0]] = kept[1]
            self.state.since = time.time()
        self.store.changed(self, [obj] if kept is not None else ())

    def _watching(self) -> None:
        with self.store.lock:
            self.state.watching = True
            self.state.error = ""  # (it answers again)

    def _failed(self, doing: str, error: Exception) -> float | None:
        """What the page says of a failed list or watch; how long until the next try (None:
        the informer's backoff)."""
        if isinstance(error, NotFound) and self.optional and doing == "list":
            with self.store.lock:
                self.state.served = False  # (a CRD not installed: looked for again later)
                self.table = {}
            self.store.changed(self)
            return NOT_SERVED_AGAIN
        if isinstance(error, Forbidden) and doing == "watch":
            self.informer.poll = POLL  # it may list: list again every POLL s instead
            with self.store.lock:
                self.state.watching = False
            return 0.0
        if isinstance(error, Forbidden):
            why = f"you may not {doing} {self.state.what}: {error.reason}"
        elif isinstance(error, KubeError) and error.status is None:
            why = f"cannot reach the API server ({error.reason}); showing what was read before"
        elif doing == "watch" and not isinstance(error, KubeError):
            log.info("watch of %s ended: %s", self.state.what, error)
            with self.store.lock:
                self.state.watching = False
            return None  # (a stream cut short: watched again)
        else:
            why = f"cannot {doing} {self.state.what}: {error}"
        with self.store.lock:
            self.state.error = why
            self.state.watching = False
            self.state.forbidden = error.reason if isinstance(error, Forbidden) else ""
            if isinstance(error, Forbidden) and doing == "list":
                self.table = {}  # (nothing may be shown that the user may not read)
        self.store.changed(self)
        return None


@dataclass(frozen=True)
class Snapshot:
    """What the feeds hold at one moment (shallow copies: the values are not changed after)."""

    version: int
    now: float
    workloads: list[JSONObject]
    sources: list[Source]
    notes: list[Note]
    feeds: list[FeedState]
    ends: Mapping[tuple[str, str, str, float], float] = field(default_factory=dict)
    rollouts: list[JSONObject] = field(default_factory=list)  # ConfigRollouts, as trimmed
    # how the feed of ConfigRollouts stands (None: there is none)
    rollouts_feed: FeedState | None = None


def _workload_key(obj: JSONObject) -> tuple[str, str, str]:
    meta = obj.get("metadata") or {}
    return (str(obj.get("kind")), str(meta.get("namespace")), str(meta.get("name")))


def _meta_key(obj: JSONObject) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return (str(meta.get("namespace")), str(meta.get("name")))


def _uid(obj: JSONObject) -> str:
    meta = obj.get("metadata") or {}
    return str(meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}")


class Store:
    """Every feed of the dashboard's scope, and a version that moves whenever one changes
    (the page is told, and reads again)."""

    def __init__(
        self,
        kube: Kube,
        namespace: str | None,
        kinds: Iterable[tuple[WorkloadKind, str]],
        *,
        secrets_kube: Kube,
    ) -> None:
        """`kinds`: each workload kind with the API prefix the cluster serves it at;
        `secrets_kube`: the user's client asking for metadata only."""
        self.kube = kube
        self.namespace = namespace
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self.stopped = threading.Event()
        self.version = 0
        self._rolling: dict[tuple[str, str, str, float], None] = {}
        self._ends: dict[tuple[str, str, str, float], float] = {}
        self._keys: dict[tuple[str, str], tuple[str, tuple[str, ...] | None, str]] = {}
        where = f"in {namespace}" if namespace else "in every namespace"
        self.workload_feeds: list[Feed] = []
        for kind, prefix in kinds:
            api_version = prefix.removeprefix("/apis/").removeprefix("/api/")
            self.workload_feeds.append(
                Feed(
                    self,
                    f"{kind.kind}s {where}",
                    kube,
                    kind.resource,
                    prefix,
                    _workload(kind, api_version),
                    _workload_key,
                    optional=kind.custom,
                )
            )
        cm, secret = SourceKind.CONFIGMAP, SourceKind.SECRET
        self.configmaps = Feed(
            self,
            f"{cm.api_kind}s {where}",
            kube,
            cm.resource,
            None,
            lambda o: _source(cm, o, with_keys=True),
            _meta_key,
        )
        self.secrets = Feed(
            self,
            f"{secret.api_kind}s {where}",
            secrets_kube,
            secret.resource,
            None,
            lambda o: _source(secret, o, with_keys=False),
            _meta_key,
        )
        self.events = Feed(self, f"Events {where}", kube, "events", "/api/v1", _note, _uid)
        self.rollouts = Feed(
            self,
            f"{KIND}s {where}",
            kube,
            PLURAL,
            f"/apis/{GROUP}/{VERSION}",
            _rollout,
            _meta_key,
            optional=True,  # (a configpin before ConfigRollouts: its CRD is not installed)
        )
        self.feeds = [
            *self.workload_feeds,
            self.configmaps,
            self.secrets,
            self.events,
            self.rollouts,
        ]

    def start(self) -> None:
        for feed in self.feeds:
            feed.start()

    def stop(self) -> None:
        self.stopped.set()
        for feed in self.feeds:
            feed.stop()
        with self.cond:
            self.cond.notify_all()

    def changed(self, feed: Feed, objects: Iterable[Any] = ()) -> None:
        """`feed` changed; `objects`: those it read anew (to see rollouts end)."""
        with self.cond:
            if feed is self.events and len(feed.table) > EVENTS_MAX:
                oldest = sorted(feed.table.items(), key=lambda kv: kv[1].at)
                for key, _ in oldest[: len(feed.table) - EVENTS_MAX]:
                    del feed.table[key]
            if feed in self.workload_feeds:
                self._saw_rollouts(objects)
            self.version += 1
            self.cond.notify_all()

    def bump(self) -> None:
        """Something the pages show changed outside the feeds (a workload's status)."""
        with self.cond:
            self.version += 1
            self.cond.notify_all()

    def wait_newer(self, version: int, timeout: float) -> int:
        """The version, once it is newer than `version` (or after `timeout` s)."""
        with self.cond:
            self.cond.wait_for(
                lambda: self.version != version or self.stopped.is_set(), timeout=timeout
            )
            return self.version

    def _saw_rollouts(self, workloads: Iterable[JSONObject]) -> None:
        """When a rollout seen in progress was first seen ended: its end, where no Event
        says (Events expire after an hour)."""
        now = time.time()
        for obj in workloads:
            meta = obj.get("metadata") or {}
            record = digest_mapping_any((meta.get("annotations") or {}).get(DOMAIN + "/rollout"))
            since = record.get("since")
            if not isinstance(since, int | float):
                continue
            key = (*_workload_key(obj), float(since))
            if record.get("state") == "rolling":
                self._rolling[key] = None
            elif key in self._rolling and key not in self._ends:
                self._ends[key] = now

    def snapshot(self) -> Snapshot:
        with self.lock:
            workloads = [o for f in self.workload_feeds for o in f.table.values()]
            sources = [*self.configmaps.table.values(), *self.secrets.table.values()]
            notes = list(self.events.table.values())
            feeds = [
                FeedState(**vars(f.state))
                for f in self.feeds
                if f.state.served and (f.state.listed or f.state.error)
            ]
            return Snapshot(
                self.version,
                time.time(),
                workloads,
                sources,
                notes,
                feeds,
                dict(self._ends),
                list(self.rollouts.table.values()),
                FeedState(**vars(self.rollouts.state)),
            )

    def ready(self) -> bool:
        """Every feed has been read once (or said why not)."""
        with self.lock:
            return all(f.state.listed or f.state.error or not f.state.served for f in self.feeds)

    def secret_keys(self, namespace: str, name: str) -> tuple[tuple[str, ...] | None, str]:
        """The key names of Secret `name` (a GET: `get` on it is needed; the values are
        dropped as read), kept while its resourceVersion stays; (None, why) when not read."""
        with self.lock:
            listed = self.secrets.table.get((namespace, name))
            known = self._keys.get((namespace, name))
        rv = listed.resource_version if listed is not None else ""
        if known is not None and known[0] == rv and rv:
            return known[1], known[2]
        try:
            obj = self.kube.get(path(SourceKind.SECRET.resource, namespace, name))
        except Forbidden as e:
            keys, why = None, f"its key names need `get` on the Secret: {e.reason}"
        except KubeError as e:
            keys, why = None, f"its key names could not be read: {e}"
        else:
            keys, why = key_names(SourceKind.SECRET, obj), ""
            rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
            del obj
        with self.lock:
            self._keys[(namespace, name)] = (rv, keys, why)
        return keys, why
