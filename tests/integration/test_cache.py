"""The cluster source cache against a real API server: digests only, watch-driven, read-through."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from kubernetes import client

from tests.integration.controlplane import ControlPlane, wait_for
from tests.integration.manifests import configmap, secret
from webhook.core.digest import record_from_object
from webhook.core.model import SourceId, SourceKind
from webhook.kube.cache import SourceCache
from webhook.kube.digestkey import ensure_digest_key
from webhook.kube.raw import Kube, path
from webhook.metrics import Metrics
from webhook.sources import Miss

HKEY = b"integration-test-key-0123456789abcdef"


@pytest.fixture
def kube(control_plane: ControlPlane) -> Iterator[Kube]:
    with control_plane.api_client() as api:
        yield Kube(api)


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
