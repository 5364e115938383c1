"""Keyed digests: pinned golden values, an unambiguous encoding, and what a digest covers."""

from __future__ import annotations

import base64
import copy
import hashlib
import hmac

import pytest

from tests.unit.conftest import HKEY, OTHER_KEY, b64, configmap, record, secret
from webhook.core import digest
from webhook.core.constants import (
    ANN_IGNORE,
    ANN_SIGNATURE,
    ANN_SOURCE,
    LABEL_SNAPSHOT,
    LABEL_SOURCE,
)
from webhook.core.model import JSONObject, SourceKind
from webhook.core.names import snapshot_name
from webhook.core.snapshot import snapshot_object

GOLDEN_CM = configmap(
    "app-config",
    {"app.properties": "greeting=hello\nlog.level=info\n", "feature-flags": "new-ui=false"},
    binary={"logo.png": b"\x89PNG\r\n\x1a\n"},
)
GOLDEN_SECRET = secret("app-secret", {"username": "admin", "password": "s3cr3t!"})


def _source_digest(obj: JSONObject, keys: list[str] | None = None, hkey: bytes = HKEY) -> str:
    return digest.source_digest(hkey, record(obj, hkey), keys)


# ---- golden values: a change here changes every digest in every cluster, and rolls everything ----


def test_golden_key_digests() -> None:
    assert {k: v.hex() for k, v in record(GOLDEN_CM).key_digests.items()} == {
        "app.properties": "47d22a2403e4926e1e0b2601510fb18b",
        "feature-flags": "7f5e17ed0e1c8db3929b069470c59b2f",
        "logo.png": "e896c44773bf049b83d34e761b39d610",
    }
    assert {k: v.hex() for k, v in record(GOLDEN_SECRET).key_digests.items()} == {
        "username": "25556c32b12cefa4fad5cc929c75ff4f",
        "password": "d553ec49a707c679aa8cb9709ed52875",
    }


def test_golden_source_digests() -> None:
    assert _source_digest(GOLDEN_CM) == (
        "992e74c9e27e227f64796e5e3053e0b163ac22eaab0b49a8a3d8efd0b94d31e7"
    )
    assert _source_digest(GOLDEN_CM, ["app.properties"]) == (
        "b85c8e197d20905c1f007310ce870151faee343f67ca7b9bf180196304eddd84"
    )
    assert _source_digest(GOLDEN_SECRET) == (
        "9fff33044e02b3bcfbfaa42df93ad7b309bee695632b11e4006b46237cac4f78"
    )
    assert _source_digest(GOLDEN_SECRET, ["password"]) == (
        "da608ccb02f5b2f1221c19b09e7cb6cf69121f1426dda16ef7ef5fc6cbe85d3d"
    )
    assert _source_digest(configmap("empty")) == (
        "eaac7c443bc488060d8ca6d4361277d944d835c632ec05e6111b56b16a4f6d38"
    )


def test_golden_namespace_key() -> None:
    msg = b"configpin/namespace/v1" + (6).to_bytes(8, "big") + b"team-a"
    assert digest.namespace_key(HKEY, "team-a") == hmac.digest(HKEY, msg, "sha256")
    assert digest.namespace_key(HKEY, "team-a").hex() == (
        "fc0a2edc743c244a882428c45ad905903075e42a3cb1762a50e1bf231dcc0ac1"
    )


def test_golden_digests_as_written_in_a_namespace() -> None:
    """What admission writes into `configpin.io/sources` and `configpin.io/checksum` for a
    workload in namespace team-a."""
    nskey = digest.namespace_key(HKEY, "team-a")
    sources = {
        "configmap/app-config": digest.source_digest(nskey, record(GOLDEN_CM)),
        "secret/app-secret": digest.source_digest(nskey, record(GOLDEN_SECRET)),
    }
    assert sources == {
        "configmap/app-config": "b839b376730093a39a04426738fafe2e9013ce34858ced15f2c1c77152a478a5",
        "secret/app-secret": "9b6208426e953caeeda9239a2012c255d381aa71162fc964ac698a6c246b8d16",
    }
    assert digest.checksum(nskey, sources) == (
        "b59a6aa5598128fe841dbc862795b4659979524349a41b13bde6e230aec00bbb"
    )


def test_equal_content_in_two_namespaces_gives_unrelated_digests() -> None:
    rec = record(GOLDEN_SECRET)
    a = digest.source_digest(digest.namespace_key(HKEY, "team-a"), rec)
    b = digest.source_digest(digest.namespace_key(HKEY, "team-b"), rec)
    assert a != b
    # no namespace pair can be made to collide by moving bytes between name boundaries
    assert digest.namespace_key(HKEY, "ab") != digest.namespace_key(HKEY, "a") + b"b"


def test_golden_checksum() -> None:
    sources = {
        "configmap/app-config": _source_digest(GOLDEN_CM),
        "secret/app-secret": _source_digest(GOLDEN_SECRET),
    }
    assert digest.checksum(HKEY, sources) == (
        "a2f6bb622a5b82e6e0d034de0426f4c19af58dc4087fe2acdd3c397a5ad0a6be"
    )


def test_key_digest_is_the_documented_length_prefixed_hmac() -> None:
    def lp(b: bytes) -> bytes:
        return len(b).to_bytes(8, "big") + b

    msg = b"configpin/key/v1" + lp(b"data") + lp(b"k") + lp(b"v")
    expected = hmac.new(HKEY, msg, hashlib.sha256).digest()[:16]
    assert digest.key_digest(HKEY, "data", "k", b"v") == expected
    assert expected.hex() == "9ac022760f6662ff8c0a98053b2949ba"


def test_digests_are_hex_sha256() -> None:
    value = _source_digest(GOLDEN_CM)
    assert len(value) == 64 and int(value, 16) >= 0
    assert len(digest.checksum(HKEY, {})) == 64


# ---- keyed: without the key nobody can test guesses ----


def test_a_different_key_gives_different_digests() -> None:
    assert _source_digest(GOLDEN_SECRET) != _source_digest(GOLDEN_SECRET, hkey=OTHER_KEY)
    assert record(GOLDEN_SECRET).key_digests != record(GOLDEN_SECRET, OTHER_KEY).key_digests
    sources = {"secret/app-secret": "x"}
    assert digest.checksum(HKEY, sources) != digest.checksum(OTHER_KEY, sources)


def test_no_digest_is_a_plain_hash_of_the_value() -> None:
    plain = hashlib.sha256(b"s3cr3t!").hexdigest()
    rec = record(secret("s", {"password": "s3cr3t!"}))
    assert plain[:32] != rec.key_digests["password"].hex()
    assert plain != digest.source_digest(HKEY, rec)


# ---- canonical, unambiguous encoding (Reloader joins k=v with `;`: never collide like it) ----


@pytest.mark.parametrize(
    ("a", "b"),
    [
        # a value that forges another key under `k=v;` joining
        ({"k1": "v;k2=v"}, {"k1": "v", "k2": "v"}),
        ({"k1": "v\nk2=v"}, {"k1": "v", "k2": "v"}),
        # the same characters split differently between key and value
        ({"ab": "c"}, {"a": "bc"}),
        ({"a=b": "c"}, {"a": "b=c"}),
        ({"a": ""}, {"a\x00": ""}),
        # across keys
        ({"a": "xy", "b": ""}, {"a": "x", "b": "y"}),
        # empty vs absent
        ({"a": ""}, {}),
        ({"a": "", "b": ""}, {"a": ""}),
    ],
)
def test_different_contents_never_share_a_digest(a: dict[str, str], b: dict[str, str]) -> None:
    assert _source_digest(configmap("c", a)) != _source_digest(configmap("c", b))
    assert _source_digest(secret("s", a)) != _source_digest(secret("s", b))


def test_data_and_binary_data_of_the_same_bytes_differ() -> None:
    as_text = configmap("c", {"k": "hello"})
    as_binary = configmap("c", binary={"k": b"hello"})
    assert _source_digest(as_text) != _source_digest(as_binary)


def test_configmap_and_secret_of_the_same_data_differ() -> None:
    assert _source_digest(configmap("x", {"k": "v"})) != _source_digest(secret("x", {"k": "v"}))


def test_secret_type_is_part_of_the_digest() -> None:
    opaque = secret("s", {"tls.crt": "c", "tls.key": "k"})
    tls = secret("s", {"tls.crt": "c", "tls.key": "k"}, type_="kubernetes.io/tls")
    assert _source_digest(opaque) != _source_digest(tls)


def test_a_secret_without_type_is_opaque() -> None:
    assert _source_digest(secret("s", {"k": "v"}, type_=None)) == _source_digest(
        secret("s", {"k": "v"})
    )


def test_checksum_is_unambiguous() -> None:
    assert digest.checksum(HKEY, {"configmap/ab": "c"}) != digest.checksum(
        HKEY, {"configmap/a": "bc"}
    )
    assert digest.checksum(HKEY, {"a": "x;b=y"}) != digest.checksum(HKEY, {"a": "x", "b": "y"})
    assert digest.checksum(HKEY, {}) != digest.checksum(HKEY, {"": ""})


def test_checksum_does_not_depend_on_mapping_order() -> None:
    forward = {"configmap/a": "1", "secret/b": "2", "configmap/c": "3"}
    backward = dict(reversed(forward.items()))
    assert list(forward) != list(backward)
    assert digest.checksum(HKEY, forward) == digest.checksum(HKEY, backward)


# ---- what a source digest covers ----


def test_same_content_same_digest_whatever_the_metadata() -> None:
    a = configmap("one", {"k": "v"}, namespace="a", annotations={"x": "1"}, labels={"l": "1"})
    b = configmap("two", {"k": "v"}, namespace="b")
    b["metadata"]["resourceVersion"] = "12345"
    assert _source_digest(a) == _source_digest(b)


def test_a_snapshot_digests_like_its_source() -> None:
    for kind, obj in ((SourceKind.CONFIGMAP, GOLDEN_CM), (SourceKind.SECRET, GOLDEN_SECRET)):
        snap = snapshot_object(kind, obj, "copy-0123456789", signature="s", namespace="ns")
        assert _source_digest(snap) == _source_digest(obj)


def test_per_key_digest_ignores_other_keys() -> None:
    before = configmap("c", {"used": "1", "other": "a"})
    after = configmap("c", {"used": "1", "other": "b", "added": "x"})
    assert _source_digest(before, ["used"]) == _source_digest(after, ["used"])
    assert _source_digest(before) != _source_digest(after)
    changed = configmap("c", {"used": "2", "other": "a"})
    assert _source_digest(before, ["used"]) != _source_digest(changed, ["used"])


def test_per_key_digest_of_a_missing_key_differs_from_an_empty_one() -> None:
    missing = configmap("c", {"other": "a"})
    empty = configmap("c", {"used": "", "other": "a"})
    assert _source_digest(missing, ["used"]) != _source_digest(empty, ["used"])
    # and the key appearing later changes it
    assert _source_digest(missing, ["used"]) != _source_digest(
        configmap("c", {"used": "1"}), ["used"]
    )


def test_key_order_of_the_selection_does_not_matter() -> None:
    rec = record(GOLDEN_CM)
    assert digest.source_digest(HKEY, rec, ["feature-flags", "logo.png"]) == digest.source_digest(
        HKEY, rec, ("logo.png", "feature-flags", "logo.png")
    )


def test_all_keys_equals_every_key_named() -> None:
    rec = record(GOLDEN_CM)
    assert digest.source_digest(HKEY, rec) == digest.source_digest(HKEY, rec, list(rec.key_digests))


# ---- Secrets: stringData in a manifest digests as the data the API server stores ----


def test_string_data_digests_like_base64_data() -> None:
    manifest = secret("s", string_data={"user": "admin", "pass": "p;w=d"})
    stored = secret("s", {"user": "admin", "pass": "p;w=d"})
    assert record(manifest).key_digests == record(stored).key_digests
    assert _source_digest(manifest) == _source_digest(stored)


def test_string_data_and_data_mixed() -> None:
    manifest = secret("s", {"user": "admin"}, string_data={"pass": "pw"})
    stored = secret("s", {"user": "admin", "pass": "pw"})
    assert _source_digest(manifest) == _source_digest(stored)


def test_string_data_overrides_data_like_the_api_server() -> None:
    manifest = secret("s", {"pass": "old"}, string_data={"pass": "new"})
    assert _source_digest(manifest) == _source_digest(secret("s", {"pass": "new"}))


def test_binary_secret_values() -> None:
    raw = bytes(range(256))
    assert record(secret("s", {"blob": raw})).key_digests["blob"] == digest.key_digest(
        HKEY, "data", "blob", raw
    )


# ---- undecodable content ----


@pytest.mark.parametrize(
    ("obj", "where"),
    [
        ({"kind": "ConfigMap", "metadata": {"name": "c"}, "binaryData": {"k": "not base64!"}}, "k"),
        ({"kind": "ConfigMap", "metadata": {"name": "c"}, "binaryData": {"k": 12}}, "k"),
        ({"kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"k": 12}}, "k"),
        ({"kind": "Secret", "metadata": {"name": "s"}, "data": {"pw": "%%%"}}, "pw"),
        ({"kind": "Secret", "metadata": {"name": "s"}, "stringData": {"pw": ["x"]}}, "pw"),
        ({"kind": "Secret", "metadata": {"name": "s"}, "data": {"pw": "YQ"}}, "pw"),  # no padding
        ({"kind": "Secret", "metadata": {"name": "s"}, "data": {"pw": "YW Jj"}}, "pw"),  # a space
        ({"kind": "ConfigMap", "metadata": {"name": "c"}, "data": ["k"]}, "data"),
        ({"kind": "ConfigMap", "metadata": {"name": "c"}, "data": {1: "v"}}, "data"),
    ],
)
def test_undecodable_values_raise_bad_source(obj: JSONObject, where: str) -> None:
    with pytest.raises(digest.BadSource, match=where):
        record(obj)


def test_bad_source_never_quotes_the_value() -> None:
    obj = {"kind": "Secret", "metadata": {"name": "s"}, "data": {"pw": "hunter2-not-b64!"}}
    with pytest.raises(digest.BadSource) as err:
        record(obj)
    assert "hunter2" not in str(err.value)


# ---- the record ----


def test_record_metadata() -> None:
    obj = secret(
        "s",
        {"k": "v"},
        type_="kubernetes.io/tls",
        annotations={ANN_IGNORE: "true"},
    )
    obj["metadata"].update(uid="u-1", resourceVersion="42")
    rec = record(obj)
    assert rec.kind is SourceKind.SECRET
    assert rec.name == "s"
    assert rec.secret_type == "kubernetes.io/tls"
    assert rec.ignored is True
    assert rec.snapshot_of is None
    assert (rec.uid, rec.resource_version) == ("u-1", "42")


def test_record_of_a_configmap_has_no_secret_type() -> None:
    assert record(configmap("c", {"k": "v"})).secret_type is None


@pytest.mark.parametrize("value", ["false", "True", "yes", ""])
def test_only_the_string_true_ignores(value: str) -> None:
    assert record(configmap("c", annotations={ANN_IGNORE: value})).ignored is False


def _signed_copy(source: JSONObject, namespace: str = "team-a") -> JSONObject:
    kind = SourceKind.CONFIGMAP if source["kind"] == "ConfigMap" else SourceKind.SECRET
    content = digest.source_digest(digest.namespace_key(HKEY, namespace), record(source))
    name = snapshot_name(source["metadata"]["name"], content)
    signature = digest.copy_signature(HKEY, namespace, name, content)
    return snapshot_object(kind, source, name, signature=signature, namespace=namespace)


def test_a_signed_copy_records_its_source() -> None:
    assert record(_signed_copy(configmap("c", {"k": "v"}))).snapshot_of == "c"
    assert record(_signed_copy(secret("s", {"k": "v"}))).snapshot_of == "s"


def test_a_label_alone_proves_nothing() -> None:
    real = _signed_copy(configmap("c", {"k": "v"}))
    labels = {LABEL_SNAPSHOT: "true", LABEL_SOURCE: "c"}
    forged = configmap(real["metadata"]["name"], {"k": "v"}, namespace="team-a", labels=labels)
    forged["immutable"] = True
    assert record(forged).snapshot_of is None  # no signature
    mutable = copy.deepcopy(real)
    del mutable["immutable"]
    assert record(mutable).snapshot_of is None  # its content could change under its name
    other_content = copy.deepcopy(real)
    other_content["data"] = {"k": "evil"}
    assert record(other_content).snapshot_of is None  # the name does not match the content
    renamed = copy.deepcopy(real)
    renamed["metadata"]["name"] = "precious-0123456789"
    assert record(renamed).snapshot_of is None  # the signature covers the name
    moved = copy.deepcopy(real)
    moved["metadata"]["namespace"] = "team-b"
    assert record(moved).snapshot_of is None  # and the namespace
    other_key = _signed_copy(configmap("c", {"k": "v"}))
    assert digest.record_from_object(OTHER_KEY, SourceKind.CONFIGMAP, other_key).snapshot_of is None
    # the source label alone does not make a snapshot
    assert record(configmap("x", labels={LABEL_SOURCE: "c"})).snapshot_of is None
    # a forged signature beyond ASCII is no proof, not an error (hmac.compare_digest raised
    # TypeError on it: the source cache's watch read it)
    accented = copy.deepcopy(real)
    accented["metadata"]["annotations"][ANN_SIGNATURE] = "\u00e9t\u00e9"
    assert record(accented).snapshot_of is None


def test_a_copy_made_before_signatures_is_proven_by_its_keyed_name() -> None:
    source = configmap("c", {"k": "v"})
    legacy_name = snapshot_name("c", digest.source_digest(HKEY, record(source)))
    labels = {LABEL_SNAPSHOT: "true", LABEL_SOURCE: "c"}
    old = configmap(legacy_name, {"k": "v"}, namespace="team-a", labels=labels)
    old["immutable"] = True
    assert record(old).snapshot_of == "c"
    guessed = copy.deepcopy(old)
    guessed["metadata"]["name"] = "c-0123456789"  # a name the key did not make
    assert record(guessed).snapshot_of is None
    assert digest.record_from_object(OTHER_KEY, SourceKind.CONFIGMAP, old).snapshot_of is None


def test_a_long_source_name_is_in_the_annotation_not_the_label() -> None:
    long_name = "a" * 100
    snap = _signed_copy(configmap(long_name, {"k": "v"}))
    assert LABEL_SOURCE not in snap["metadata"]["labels"]
    assert snap["metadata"]["annotations"][ANN_SOURCE] == long_name
    assert len(snap["metadata"]["name"]) <= 253
    assert record(snap).snapshot_of == long_name


def test_record_holds_no_values() -> None:
    rec = record(secret("s", {"password": "s3cr3t!"}))
    assert all(isinstance(v, bytes) and len(v) == 16 for v in rec.key_digests.values())
    assert b"s3cr3t!" not in b"".join(rec.key_digests.values())
    assert b64("s3cr3t!") not in repr(rec)
    assert "s3cr3t!" not in repr(rec)


def test_the_memo_is_bounded_and_never_changes_a_digest() -> None:
    first = _source_digest(GOLDEN_CM)
    for i in range(digest._MEMO_MAX + 10):
        digest.checksum(HKEY, {"configmap/x": str(i)})
    assert len(digest._memo) <= digest._MEMO_MAX
    assert _source_digest(GOLDEN_CM) == first
    assert _source_digest(GOLDEN_CM, hkey=OTHER_KEY) != first  # the key is part of the memo key


# ---- what the API server stores (Go's decoding) ----


def test_base64_wrapped_over_lines_is_the_decoded_bytes() -> None:
    """Go's base64 decoder skips line breaks: a value wrapped by `base64` (76 columns) or
    written as a YAML block is stored as the bytes it encodes."""
    raw = bytes(range(200))
    text = base64.b64encode(raw).decode()
    wrapped = "\n".join(text[i : i + 76] for i in range(0, len(text), 76)) + "\n"
    crlf = wrapped.replace("\n", "\r\n")
    want = record(secret("s", {"blob": raw})).key_digests["blob"]
    for value in (wrapped, crlf):
        obj = {"kind": "Secret", "metadata": {"name": "s"}, "data": {"blob": value}}
        assert record(obj).key_digests["blob"] == want


def test_null_values_are_stored_as_empty() -> None:
    """JSON null into a Go map of strings (or bytes) is the empty value."""
    empty_cm = record(configmap("c", {"k": ""})).key_digests["k"]
    assert (
        record({"kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"k": None}}).key_digests[
            "k"
        ]
        == empty_cm
    )
    empty_secret = record(secret("s", {"k": b""})).key_digests["k"]
    for field in ("data", "stringData"):
        obj = {"kind": "Secret", "metadata": {"name": "s"}, field: {"k": None}}
        assert record(obj).key_digests["k"] == empty_secret
