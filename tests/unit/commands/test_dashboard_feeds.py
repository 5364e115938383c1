"""webhook/commands/dashboard/feeds: what the dashboard reads, by the controller's informer
(webhook/kube/informer), with a person's rights, against `ListWatch`, an API server in memory:
every feed of the namespace listed then watched, ConfigRollouts among them (into the
snapshot, trimmed); Secrets asked of the metadata-only client alone; a feed the user may list
but not watch listed again every POLL s; one they may not list said forbidden and emptied;
an API server that does not answer said so, then no more once it answers; ConfigRollouts not
served (no CRD) said as such, the rest ready."""

from __future__ import annotations

import io
import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import urllib3

from tests.unit.kube.listwatch import ListWatch
from webhook.commands.dashboard import feeds
from webhook.commands.dashboard.app import problems
from webhook.commands.dashboard.feeds import META_LIST, META_ONE, MetadataKube, Store
from webhook.core.kinds import workload_kind
from webhook.kube.client import Connection
from webhook.kube.errors import Forbidden, Gone, KubeError, NotFound

NS = "shop"
DEPLOYMENTS = f"/apis/apps/v1/namespaces/{NS}/deployments"
CONFIGMAPS = f"/api/v1/namespaces/{NS}/configmaps"
SECRETS = f"/api/v1/namespaces/{NS}/secrets"
EVENTS = f"/api/v1/namespaces/{NS}/events"
ROLLOUTS = f"/apis/configpin.io/v1alpha1/namespaces/{NS}/configrollouts"


def _meta(name: str, **more: Any) -> dict[str, Any]:
    return {"namespace": NS, "name": name, "resourceVersion": "1", "uid": f"u-{name}", **more}


def _rollout(content: str) -> dict[str, Any]:
    return {
        "metadata": _meta("configmap-cfg", generation=1, managedFields=[{"manager": "x"}]),
        "spec": {"source": {"kind": "ConfigMap", "name": "cfg"}},
        "status": {"observedGeneration": 1, "change": {"content": content}},
    }


def _api() -> ListWatch:
    api = ListWatch()
    api.lists[DEPLOYMENTS] = [[{"metadata": _meta("web"), "spec": {}}]]
    api.lists[CONFIGMAPS] = [[{"metadata": _meta("cfg"), "data": {"a": "value"}}]]
    api.lists[EVENTS] = [[]]
    api.lists[ROLLOUTS] = [[_rollout("c1")]]
    return api


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[ListWatch, ListWatch], Store]]:
    monkeypatch.setattr(feeds, "POLL", 0.05)
    made: list[Store] = []

    def start(api: ListWatch, secrets: ListWatch) -> Store:
        kind = workload_kind("Deployment")
        assert kind is not None
        s = Store(api, NS, [(kind, "/apis/apps/v1")], secrets_kube=secrets)  # type: ignore[arg-type]
        made.append(s)
        s.start()
        return s

    yield start
    for s in made:
        s.stop()


def _until(what: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_every_feed_is_listed_then_watched_with_configrollouts_in_the_snapshot(
    store: Callable[[ListWatch, ListWatch], Store],
) -> None:
    api, secrets = _api(), ListWatch()
    secrets.lists[SECRETS] = [[{"metadata": _meta("db")}]]
    api.watches[ROLLOUTS] = [[{"type": "MODIFIED", "object": _rollout("c2")}], []]
    s = store(api, secrets)

    def content() -> Any:
        return [r["status"]["change"]["content"] for r in s.snapshot().rollouts]

    _until(lambda: s.ready() and content() == ["c2"])  # (the watch's MODIFIED)
    snap = s.snapshot()
    [rollout] = snap.rollouts
    assert rollout["metadata"] == {
        "name": "configmap-cfg",
        "namespace": NS,
        "uid": "u-configmap-cfg",
        "resourceVersion": "1",
        "generation": 1,
    }  # (no managed fields)
    assert snap.rollouts_feed is not None and snap.rollouts_feed.listed
    assert {(x.kind, x.name, x.keys) for x in snap.sources} == {
        ("configmap", "cfg", ("a",)),
        ("secret", "db", None),
    }
    assert "value" not in repr(snap.sources)
    assert [w["metadata"]["name"] for w in snap.workloads] == ["web"]
    assert ("list", SECRETS) in secrets.calls and ("list", SECRETS) not in api.calls
    _until(lambda: all(f.watching for f in s.snapshot().feeds))
    assert not problems(s.snapshot().feeds, f"namespace {NS}")


def test_a_feed_the_user_may_list_but_not_watch_is_listed_again_every_poll(
    store: Callable[[ListWatch, ListWatch], Store],
) -> None:
    api = _api()
    api.lists[CONFIGMAPS] = [[], [{"metadata": _meta("cfg"), "data": {"a": "1"}}]]
    api.watches[CONFIGMAPS] = [Forbidden("GET", 403, "Forbidden: watch")]
    s = store(api, ListWatch())
    _until(lambda: any(x.name == "cfg" for x in s.snapshot().sources))
    _until(lambda: api.count("list", CONFIGMAPS) >= 4)
    assert api.count("watch", CONFIGMAPS) == 1
    state = next(f for f in s.snapshot().feeds if f.what.startswith("ConfigMaps"))
    assert state.listed and not state.watching and not state.error


def test_a_feed_the_user_may_not_list_is_said_forbidden_and_shows_nothing(
    store: Callable[[ListWatch, ListWatch], Store],
) -> None:
    secrets = ListWatch()
    secrets.lists[SECRETS] = [[{"metadata": _meta("db")}], Forbidden("GET", 403, "Forbidden: no")]
    secrets.watches[SECRETS] = [Gone("GET", 410, "Expired")]  # (listed again: refused now)
    s = store(_api(), secrets)
    _until(lambda: any(f.forbidden for f in s.snapshot().feeds))
    snap = s.snapshot()
    assert not [x for x in snap.sources if x.kind == "secret"]
    [said] = problems(snap.feeds, f"namespace {NS}")
    assert said.startswith("you may not list Secrets (namespace shop)") and "Forbidden: no" in said


def test_an_api_server_that_does_not_answer_is_said_until_it_answers(
    store: Callable[[ListWatch, ListWatch], Store],
) -> None:
    api = _api()
    down = KubeError("GET", None, "NewConnectionError")
    api.lists[EVENTS] = [down, []]
    s = store(api, ListWatch())
    _until(lambda: any("cannot reach the API server" in f.error for f in s.snapshot().feeds))
    _until(lambda: all(not f.error for f in s.snapshot().feeds) and s.ready(), timeout=10)


def test_configrollouts_not_served_are_said_so_and_the_rest_is_ready(
    store: Callable[[ListWatch, ListWatch], Store],
) -> None:
    api = _api()
    api.lists[ROLLOUTS] = [NotFound("GET", 404, "NotFound")]
    s = store(api, ListWatch())
    _until(s.ready)
    snap = s.snapshot()
    assert snap.rollouts == [] and snap.rollouts_feed is not None
    assert not snap.rollouts_feed.served
    assert not [f for f in snap.feeds if f.what.startswith("ConfigRollouts")]
    assert not problems(snap.feeds, f"namespace {NS}")


class _Pool:
    """The metadata-only client's urllib3 pool: it answers a list of one Secret's metadata
    and a watch of it, and keeps each request's Accept header."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def request(self, method: str, url: str, **kwargs: Any) -> urllib3.HTTPResponse:
        watch = "watch=true" in url
        with self.lock:
            self.asked.append(("watch" if watch else "list", kwargs["headers"]["Accept"]))
        meta = _meta("db")
        if watch:
            time.sleep(0.05)  # (a watch the server ends at once: watched again)
            body = json.dumps({"type": "MODIFIED", "object": {"metadata": meta}}) + "\n"
        else:
            body = json.dumps({"metadata": {"resourceVersion": "5"}, "items": [{"metadata": meta}]})
        return urllib3.HTTPResponse(
            body=io.BytesIO(body.encode()), status=200, preload_content=False
        )


def test_secrets_are_listed_and_watched_as_metadata_only(
    store: Callable[[ListWatch, Any], Store],
) -> None:
    """The Secrets' informer asks through the metadata-only client: every list and every
    watch it makes accepts PartialObjectMetadata alone (no fallback to whole objects)."""
    pool = _Pool()
    s = store(_api(), MetadataKube(Connection("https://api.example", pool, dict)))  # type: ignore[arg-type]
    _until(lambda: ("watch", META_ONE) in pool.asked)
    with pool.lock:
        asked = set(pool.asked)
    assert asked == {("list", META_LIST), ("watch", META_ONE)}
    assert [x.name for x in s.snapshot().sources if x.kind == "secret"] == ["db"]
