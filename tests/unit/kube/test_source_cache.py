"""The source cache's compact entries: one bytes object per cached object, its layout shared.

Fed through the informer handler as a watch would feed it (no API server: the watch itself
is tested in tests/integration/test_cache.py)."""

from __future__ import annotations

from kubernetes import client

from tests.unit.conftest import HKEY, configmap, secret
from webhook.core import digest
from webhook.core.audit import APPROVED, ChangedBy
from webhook.core.constants import ANN_APPROVED, ANN_IGNORE
from webhook.core.model import JSONObject, SourceId, SourceKind, SourceRecord
from webhook.core.rollouts import KEY_DIGESTS_SHOWN
from webhook.kube.cache import SourceCache
from webhook.kube.raw import Kube
from webhook.process.metrics import Metrics

NS = "team-a"


def _cache() -> SourceCache:
    return SourceCache(Kube(client.ApiClient(client.Configuration())), HKEY, Metrics())


def _kind(obj: JSONObject) -> SourceKind:
    return SourceKind.CONFIGMAP if obj["kind"] == "ConfigMap" else SourceKind.SECRET


def _same(a: SourceRecord, b: SourceRecord) -> bool:
    return (a.kind, a.name, dict(a.key_digests), a.secret_type, a.ignored, a.snapshot_of) == (
        b.kind,
        b.name,
        dict(b.key_digests),
        b.secret_type,
        b.ignored,
        b.snapshot_of,
    )


OBJECTS = [
    configmap("plain", {"a": "1", "b": "2"}, namespace=NS),
    configmap("same-keys", {"a": "3", "b": "4"}, namespace=NS),
    configmap("binary", {"a": "1"}, binary={"blob": b"\x00\x01"}, namespace=NS),
    configmap("ignored", {"a": "1"}, namespace=NS, annotations={ANN_IGNORE: "true"}),
    configmap("empty", namespace=NS),
    secret("opaque", {"p": "x"}, namespace=NS),
    secret("untyped", {"p": "x"}, namespace=NS, type_=None),
    secret("tls", {"tls.crt": "c", "tls.key": "k"}, namespace=NS, type_="kubernetes.io/tls"),
]


def test_records_from_compact_entries_are_what_the_core_computes() -> None:
    cache = _cache()
    for kind in SourceKind:
        cache.indexes[kind].relisted(o for o in OBJECTS if _kind(o) is kind)
    for obj in OBJECTS:
        kind, name = _kind(obj), obj["metadata"]["name"]
        found = cache.peek(NS, SourceId(kind, name))
        assert isinstance(found, SourceRecord)
        assert _same(found, digest.record_from_object(HKEY, kind, obj)), name
    # One layout per distinct (keys, extras): plain and same-keys share theirs, and so do
    # opaque and untyped (a Secret without a type is Opaque).
    entries = cache.indexes[SourceKind.CONFIGMAP].by_ns[NS]
    assert entries["plain"][:4] == entries["same-keys"][:4]
    assert len(cache._layouts) == len(OBJECTS) - 2


def test_a_change_is_a_new_entry_and_metadata_alone_is_not() -> None:
    cache = _cache()
    index = cache.indexes[SourceKind.CONFIGMAP]
    changed: list[SourceId] = []
    cache.listeners.append(lambda ns, sid: changed.append(sid))
    obj = configmap("c", {"a": "1"}, namespace=NS)
    index.event("ADDED", obj)
    first = cache.peek(NS, SourceId(SourceKind.CONFIGMAP, "c"))
    assert first is cache.peek(NS, SourceId(SourceKind.CONFIGMAP, "c"))  # handed out once
    index.event("MODIFIED", {**obj, "metadata": {**obj["metadata"], "labels": {"x": "y"}}})
    index.event("MODIFIED", configmap("c", {"a": "2"}, namespace=NS))
    second = cache.peek(NS, SourceId(SourceKind.CONFIGMAP, "c"))
    assert isinstance(first, SourceRecord) and isinstance(second, SourceRecord)
    assert first.key_digests != second.key_digests
    index.event("DELETED", configmap("c", {"a": "2"}, namespace=NS))
    assert changed == [SourceId(SourceKind.CONFIGMAP, "c")] * 3


def test_an_approval_and_an_approval_now_are_kept_and_each_is_a_change() -> None:
    """The cache reads back what `configpin approve` (and `--now`) recorded: `approved` for
    both, `approved_now` for the override only; turning one into the other is a change its
    listeners hear of (the controller's gate reads it)."""
    cache = _cache()
    index = cache.indexes[SourceKind.CONFIGMAP]
    heard: list[SourceId] = []
    cache.listeners.append(lambda ns, sid: heard.append(sid))
    cfg = SourceId(SourceKind.CONFIGMAP, "c")
    plain = configmap("c", {"a": "1"}, namespace=NS)
    content = digest.content_id(
        digest.source_digest(HKEY, digest.record_from_object(HKEY, cfg.kind, plain))
    )

    def approved(now: bool) -> JSONObject:
        text = ChangedBy("u", 0.0, content, now=now).encode(HKEY, NS, cfg, domain=APPROVED)
        return configmap("c", {"a": "1"}, namespace=NS, annotations={ANN_APPROVED: text})

    seen = []
    for obj in (plain, approved(False), approved(True), approved(False)):
        index.event("MODIFIED", obj)
        found = cache.peek(NS, cfg)
        assert isinstance(found, SourceRecord)
        assert found == digest.record_from_object(HKEY, cfg.kind, obj)
        seen.append((found.approved, found.approved_now))
    assert seen == [(None, None), (content, None), (content, content), (content, None)]
    assert heard == [cfg] * 4


def test_a_change_keeps_its_keys_old_and_new_digests_short_and_bounded() -> None:
    """The cache keeps, per source, the keys its last change changed and their old and new
    keyed digests (the first 16 hex digits: never a value), a key added without an old one
    and one removed without a new one; at most KEY_DIGESTS_SHOWN keys' digests (all names);
    a write that changes no content keeps the change before it; none seen: None."""
    cache = _cache()
    index = cache.indexes[SourceKind.CONFIGMAP]
    cfg = SourceId(SourceKind.CONFIGMAP, "c")
    assert cache.changed_digests(NS, cfg) is None and cache.changed_keys(NS, cfg) is None
    before = configmap("c", {"a": "1", "b": "2", "gone": "x"}, namespace=NS)
    after = configmap("c", {"a": "9", "b": "2", "new": "y"}, namespace=NS)
    index.event("ADDED", before)
    assert cache.changed_digests(NS, cfg) is None  # (a creation: no change of a content)
    index.event("MODIFIED", after)
    old = digest.key_digests(HKEY, cfg.kind, before)
    new = digest.key_digests(HKEY, cfg.kind, after)
    assert cache.changed_keys(NS, cfg) == {"a", "gone", "new"}
    assert cache.changed_digests(NS, cfg) == (
        ("a", old["a"].hex()[:16], new["a"].hex()[:16]),
        ("gone", old["gone"].hex()[:16], None),
        ("new", None, new["new"].hex()[:16]),
    )
    labelled = {**after, "metadata": {**after["metadata"], "labels": {"x": "y"}}}
    index.event("MODIFIED", labelled)
    assert cache.changed_keys(NS, cfg) == {"a", "gone", "new"}
    wide = configmap("c", {f"k{i:03}": "1" for i in range(KEY_DIGESTS_SHOWN + 6)}, namespace=NS)
    index.event("MODIFIED", wide)
    keys = cache.changed_keys(NS, cfg) or set()
    assert len(keys) == KEY_DIGESTS_SHOWN + 6 + 3
    kept = cache.changed_digests(NS, cfg) or ()
    assert len(kept) == KEY_DIGESTS_SHOWN
    assert [k for k, _, _ in kept] == sorted(keys)[:KEY_DIGESTS_SHOWN]
