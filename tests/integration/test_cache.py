"""The cluster source cache against a real API server: digests only, watch-driven, read-through."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator

import pytest
from kubernetes import client

from harness.controlplane import ControlPlane, wait_for
from harness.manifests import configmap, secret
from webhook.core.digest import record_from_object
from webhook.core.model import JSONObject, SourceId, SourceKind
from webhook.inputs.sources import Miss
from webhook.kube.cache import SourceCache
from webhook.kube.digestkey import ensure_digest_key
from webhook.kube.informer import Informer
from webhook.kube.raw import Kube, path
from webhook.process.metrics import Metrics

HKEY = b"integration-test-key-0123456789abcdef"


@pytest.fixture
def cache(kube: Kube) -> Iterator[SourceCache]:
    c = SourceCache(kube, HKEY, Metrics())
    c.start()
    assert c.wait_synced(30), "the cache did not sync"
    yield c
    c.stop()


def test_cache_holds_the_digests_the_core_computes(
    kube: Kube, cache: SourceCache, namespace: str
) -> None:
    created = kube.create(path("configmaps", namespace), configmap("c1", {"a": "1", "b": "2"}))
    sid = SourceId(SourceKind.CONFIGMAP, "c1")
    wait_for(lambda: not isinstance(cache.peek(namespace, sid), Miss), what="the watch event")
    record = cache.peek(namespace, sid)
    assert not isinstance(record, Miss) and record is not None
    assert dict(record.key_digests) == dict(
        record_from_object(HKEY, SourceKind.CONFIGMAP, created).key_digests
    )


def test_changes_are_reported_and_metadata_changes_are_not(
    kube: Kube, cache: SourceCache, namespace: str
) -> None:
    seen: list[tuple[str, SourceId]] = []
    lock = threading.Lock()

    sid = SourceId(SourceKind.CONFIGMAP, "c2")

    def listener(ns: str, changed: SourceId) -> None:
        # only c2: the control plane publishes kube-root-ca.crt into every new namespace
        if ns == namespace and changed == sid:
            with lock:
                seen.append((ns, changed))

    cache.listeners.append(listener)
    kube.create(path("configmaps", namespace), configmap("c2", {"a": "1"}))
    wait_for(lambda: len(seen) == 1, what="the creation reported")
    kube.patch(
        path("configmaps", namespace, "c2"),
        {"metadata": {"labels": {"x": "y"}}},
        "application/merge-patch+json",
    )
    kube.patch(
        path("configmaps", namespace, "c2"), {"data": {"a": "2"}}, "application/merge-patch+json"
    )
    wait_for(lambda: len(seen) == 2, what="the data change reported")
    kube.delete(path("configmaps", namespace, "c2"))
    wait_for(lambda: len(seen) == 3, what="the deletion reported")
    assert seen == [(namespace, sid)] * 3  # the label change in between was not a change


def test_a_miss_reads_through_once_and_is_then_remembered(
    kube: Kube, cache: SourceCache, namespace: str
) -> None:
    sid = SourceId(SourceKind.SECRET, "not-there")
    assert isinstance(cache.peek(namespace, sid), Miss)
    before = kube.calls
    assert cache.get(namespace, sid) is None
    assert cache.get(namespace, sid) is None
    assert kube.calls == before + 1  # the second answer came from memory
    # Creating it is seen at once through the watch, not after the negative answer expires.
    kube.create(path("secrets", namespace), secret("not-there", {"k": "v"}))
    wait_for(lambda: cache.peek(namespace, sid) is not None, what="the created Secret")


def test_admission_answers_from_the_cache_without_api_calls(
    kube: Kube, cache: SourceCache, namespace: str
) -> None:
    kube.create(path("configmaps", namespace), configmap("c3", {"a": "1"}))
    sid = SourceId(SourceKind.CONFIGMAP, "c3")
    wait_for(lambda: not isinstance(cache.peek(namespace, sid), Miss), what="the watch event")
    before = kube.calls
    for _ in range(100):
        assert cache.get(namespace, sid) is not None
    assert kube.calls == before


def test_concurrent_starters_converge_on_one_digest_key(kube: Kube, k8s: client.ApiClient) -> None:
    ns = "configpin-keytest"
    try:
        client.CoreV1Api(k8s).create_namespace(
            client.V1Namespace.model_validate({"metadata": {"name": ns}})
        )
    except client.ApiException as e:
        assert e.status == 409
    keys: list[bytes] = []
    barrier = threading.Barrier(8)

    def start() -> None:
        barrier.wait()
        keys.append(ensure_digest_key(kube, ns, "configpin-digest-key"))

    threads = [threading.Thread(target=start) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(keys) == 8 and len(set(keys)) == 1
    assert (
        ensure_digest_key(kube, ns, "configpin-digest-key") == keys[0]
    )  # and a restart reads it back


def _names(items: Iterable[JSONObject]) -> set[str]:
    return {str(o["metadata"]["name"]) for o in items}


def test_list_pages_are_bounded_by_size(kube: Kube, namespace: str) -> None:
    """After the first page, each asks for as many objects as fit the byte bound: large
    objects come a few at a time, small ones many at a time, and none is missed."""
    for i in range(12):
        kube.create(path("configmaps", namespace), configmap(f"big-{i}", {"v": "x" * 8000}))
    for i in range(60):
        kube.create(path("configmaps", namespace), configmap(f"small-{i}", {"v": str(i)}))
    api_path = path("configmaps", namespace)
    expected = _names(kube.get(api_path)["items"])
    seen: list[set[str]] = []
    before = kube.calls
    for page in kube.list_pages(api_path, page_size=4, page_bytes=20_000):
        seen.append(_names(page.get("items") or ()))
    assert set().union(*seen) == expected
    assert sum(map(len, seen)) == len(expected)  # each once
    # big-* come first (by name): 4, then 20,000 bytes / ~8 KB = 2 per page ...
    assert len(seen[0]) == 4
    assert all(len(p) <= 3 for p in seen[1:4])
    # ... and once the small ones lower the average, pages grow again.
    assert max(map(len, seen[4:])) > 4
    assert kube.calls - before == len(seen)
    # Without a byte bound: the count alone.
    counts = [len(p.get("items") or ()) for p in kube.list_pages(api_path, page_size=10)]
    assert counts[:-1] == [10] * (len(counts) - 1)


class _Relists:
    def __init__(self) -> None:
        self.lists: list[set[str]] = []

    def relisted(self, items: Iterable[JSONObject]) -> None:
        self.lists.append(_names(items))

    def event(self, kind: str, obj: JSONObject) -> None:
        pass


def _event(namespace: str, name: str) -> JSONObject:
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name},
        "involvedObject": {"kind": "ConfigMap", "name": "x", "namespace": namespace},
        "reason": "Test",
        "message": "m" * 2000,
        "type": "Normal",
    }


def test_a_relist_after_410_finds_every_object(
    kube: Kube, namespace: str, control_plane: ControlPlane
) -> None:
    """A watch from a resourceVersion etcd has compacted away ends in 410 Gone; the informer
    lists again, page by page (bounded by size), and every object is in it. (Events: the API
    server keeps no watch cache of them, so their watches are etcd's, as a watch of any
    resource is once the watch cache no longer holds its resourceVersion.)"""
    api_path = f"/api/v1/namespaces/{namespace}/events"
    stale = str(kube.get(api_path)["metadata"]["resourceVersion"])
    for i in range(30):
        kube.create(api_path, _event(namespace, f"e-{i}"))
    control_plane.compact_etcd()  # as the API server does every few minutes

    class ExpiredOnce(Informer):
        """Its first watch starts from before the compaction (a watch that was down while
        etcd compacted); the API server answers 410."""

        forced = False

        def _watch(self) -> None:
            if not self.forced:
                self.forced = True
                self.resource_version = stale
            super()._watch()

    metrics = Metrics()
    handler = _Relists()
    informer = ExpiredOnce(
        kube,
        "events",
        handler,
        metrics,
        prefix="/api/v1",
        field_selector=f"metadata.namespace={namespace}",
        page_size=3,
        page_bytes=8000,
    )
    informer.start()
    try:
        gone = metrics.watch_restarts.labels("events", "gone")
        wait_for(
            lambda: gone._value.get() == 1 and len(handler.lists) == 2,
            timeout=60,
            what="a 410 and a relist",
        )
        rv = informer.resource_version
        kube.create(api_path, _event(namespace, "after"))  # watched from the relist on
        wait_for(lambda: informer.resource_version != rv, timeout=30, what="the watch event")
    finally:
        informer.stop()
    expected = _names(kube.get(api_path)["items"])
    assert {f"e-{i}" for i in range(30)} | {"after"} <= expected
    assert handler.lists[0] == handler.lists[1] == expected - {"after"}
    assert informer.relists == 2
