"""Canonical, keyed digests of ConfigMap and Secret content.

Every digest is an HMAC-SHA256 under a server-held key over a length-prefixed encoding, so
no two different contents share an encoding (no `k=v;` joining that a value can forge) and
nobody who reads a Deployment can test guesses of a Secret offline.

Layers:
- key digest: one key of one object (field, key name, value bytes); 16 bytes. A cache keeps
  only these, never values.
- source digest: one object as a workload consumes it: kind, Secret type and the consumed
  keys (a consumed key that is missing is encoded as absent); hex.
- checksum: over the whole `configpin.io/sources` mapping, as its canonical JSON text; hex.

Source digests and checksums are taken under a key derived from the digest key and the
namespace (`namespace_key`), so equal content in two namespaces gives unrelated digests: a
tenant who can write a Secret in one namespace and read annotations in another learns
nothing by comparing them. Copies live in their source's namespace, so a copy and its source
still digest alike.

A snapshot copy proves it is configpin's by a signature (`copy_signature`): an HMAC under
the digest key over its namespace, name and content digest, which only the holder of the key
can make. The label alone proves nothing (`proven_source`).
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
from collections.abc import Iterable, Mapping
from typing import Any, Final

import orjson

from webhook.core.audit import APPROVED, ChangedBy
from webhook.core.constants import (
    ANN_ACTED,
    ANN_APPROVED,
    ANN_IGNORE,
    ANN_SHARED,
    ANN_SIGNATURE,
    ANN_SOURCE,
    LABEL_SNAPSHOT,
    LABEL_SOURCE,
)
from webhook.core.model import SourceId, SourceKind, SourceRecord
from webhook.core.names import snapshot_name
from webhook.core.reloader import source_mark
from webhook.core.verbs import Verb, acted_on, said_by

KEY_DIGEST_SIZE: Final = 16
CONTENT_ID_LEN: Final = 20  # hex digits of a content's short form (`content_id`)
ABSENT: Final = "absent"  # the sources annotation value of an optional source that does not exist

_KEY_DOMAIN: Final = b"configpin/key/v1"
_SOURCE_DOMAIN: Final = b"configpin/source/v1"
_CHECKSUM_DOMAIN: Final = b"configpin/checksum/v1"
_NAMESPACE_DOMAIN: Final = b"configpin/namespace/v1"
_COPY_DOMAIN: Final = b"configpin/copy/v1"


# HMACs of recent messages. The same sources are digested on every admission that uses
# them, and the HMAC is most of that cost. The messages hold key names and keyed key
# digests, never values; the bound keeps a flood of distinct selections from growing it.
# The core's caches are plain dicts, emptied whole when full, not cachetools caches: admission
# threads and the controller's share them, and a dict's get, set and clear need no lock (the
# core may not take one), where a cachetools cache's look-ups would, and cost Python calls: with
# them (and still no lock) a compiled Deployment admission took 511k instructions, not 399k.
_MEMO_MAX: Final = 2048
_memo: dict[tuple[bytes, bytes], str] = {}


def _hmac_hex(hkey: bytes, msg: bytes) -> str:
    memo_key = (hkey, msg)
    value = _memo.get(memo_key)
    if value is None:
        if len(_memo) >= _MEMO_MAX:
            _memo.clear()
        value = _memo[memo_key] = hmac.digest(hkey, msg, "sha256").hex()
    return value


@functools.lru_cache(maxsize=4096)
def namespace_key(hkey: bytes, namespace: str) -> bytes:
    """The key source digests and checksums of `namespace` are taken under.

    Derived (HMAC of the namespace under the digest key), so one secret covers every
    namespace, and a digest from one namespace says nothing about content in another.
    Least-recently-used entries are evicted one at a time: never all at once."""
    return hmac.digest(hkey, _NAMESPACE_DOMAIN + _lp(namespace.encode()), "sha256")


def copy_signature(hkey: bytes, namespace: str, name: str, content_digest: str) -> str:
    """The signature a snapshot copy carries (annotation `configpin.io/signature`): an HMAC
    under the digest key over its namespace, its name and its content digest."""
    msg = _COPY_DOMAIN + _lp(namespace.encode()) + _lp(name.encode()) + _lp(content_digest.encode())
    return hmac.digest(hkey, msg, "sha256").hex()


def copy_source_name(obj: Mapping[str, Any]) -> str | None:
    """The source a labelled object claims to copy (annotation, else the short label)."""
    meta = obj.get("metadata") or {}
    if ((meta.get("labels") or {}).get(LABEL_SNAPSHOT)) != "true":
        return None
    claimed = (meta.get("annotations") or {}).get(ANN_SOURCE)
    if not isinstance(claimed, str) or not claimed:
        claimed = (meta.get("labels") or {}).get(LABEL_SOURCE)
    return claimed if isinstance(claimed, str) and claimed else None


def proven_source(
    hkey: bytes, kind: SourceKind, obj: Mapping[str, Any], key_digests: Mapping[str, bytes]
) -> str | None:
    """The source of a snapshot copy that proves it is configpin's, else None.

    Proven: labelled, immutable, its name is the name configpin gives that content of that
    source, and it carries the signature over namespace, name and content digest. An object
    that only carries the label (anyone with write access to a namespace can add one) is
    never deleted, adopted or reused as a copy."""
    source = copy_source_name(obj)
    if source is None or obj.get("immutable") is not True:
        return None
    meta = obj.get("metadata") or {}
    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    signature = (meta.get("annotations") or {}).get(ANN_SIGNATURE)
    if not namespace:
        return None
    secret_type = _secret_type(kind, obj)
    probe = SourceRecord(kind=kind, name=name, key_digests=key_digests, secret_type=secret_type)
    if signature is None:
        # Made by a version before signatures: its name carries 40 bits of an HMAC under the
        # digest key over its content, which nobody without the key can make match. Such
        # copies stay proven until the revisions that own them are gone.
        legacy = source_digest(hkey, probe)
        return source if snapshot_name(source, legacy) == name else None
    if not isinstance(signature, str):
        return None
    content = source_digest(namespace_key(hkey, namespace), probe)
    if snapshot_name(source, content) != name:
        return None
    expected = copy_signature(hkey, namespace, name, content)
    if not hmac.compare_digest(signature.encode(), expected.encode()):  # (as signed.opened)
        return None
    return source


class BadSource(ValueError):
    """An object whose content cannot be decoded (a `binaryData` value that is not base64)."""


def _lp(data: bytes) -> bytes:
    """Length-prefixed field: 8-byte big-endian length, then the bytes."""
    return len(data).to_bytes(8, "big") + data


def key_digest(hkey: bytes, field: str, name: str, value: bytes) -> bytes:
    msg = _KEY_DOMAIN + _lp(field.encode()) + _lp(name.encode()) + _lp(value)
    return hmac.new(hkey, msg, hashlib.sha256).digest()[:KEY_DIGEST_SIZE]


def _b64(value: Any, where: str) -> bytes:
    """Base64 as the API server decodes it (Go's StdEncoding): padding required, line breaks
    anywhere ignored (a value wrapped over several lines is valid), anything else refused.
    A null value is stored as empty."""
    if value is None:
        return b""
    if not isinstance(value, str):
        raise BadSource(f"{where} is not a base64 string")
    if "\n" in value or "\r" in value:
        value = value.replace("\n", "").replace("\r", "")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as e:
        raise BadSource(f"{where} is not valid base64") from e


def _text(value: Any, where: str) -> bytes:
    if value is None:  # JSON null into a Go map of strings: stored as ""
        return b""
    if not isinstance(value, str):
        raise BadSource(f"{where} is not a string")
    return value.encode()


def _fields(obj: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    value = obj.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BadSource(f"{name} is not a mapping")
    for key in value:
        if not isinstance(key, str):
            raise BadSource(f"{name} has a key that is not a string: {key!r}")
    return value


def key_digests(hkey: bytes, kind: SourceKind, obj: Mapping[str, Any]) -> dict[str, bytes]:
    """Per-key digests of a ConfigMap or Secret as the API server stores it.

    Secrets: `data` values are base64 and `stringData` (only in manifests; the API server
    merges it into `data`, overriding) is plain text; both are hashed as the decoded bytes
    under field `data`, so a manifest and the stored object digest alike.
    """
    out: dict[str, bytes] = {}
    for field, base64_values, digested_as in kind.facts.content:
        decode = _b64 if base64_values else _text
        for name, value in _fields(obj, field).items():
            out[name] = key_digest(hkey, digested_as, name, decode(value, f"{field}[{name}]"))
    return out


def _secret_type(kind: SourceKind, obj: Mapping[str, Any]) -> str | None:
    """A Secret's type as the API server stores it (None for a kind that has none)."""
    default = kind.facts.default_type
    return None if default is None else (obj.get("type") or default)


def record_from_object(hkey: bytes, kind: SourceKind, obj: Mapping[str, Any]) -> SourceRecord:
    """The record (digests and the little metadata admission needs) of a ConfigMap/Secret.

    `snapshot_of` is set only for a proven copy (`proven_source`); an object that merely
    carries the snapshot label is recorded as the ordinary object it is. `approved` only for
    an approval configpin recorded for this source and the content it holds; `approved_now`
    too when that approval was `approve --now`; `paused_by`, `aborted_by` and `retried` only
    for that verb, recorded by configpin for this source and the content it holds."""
    meta = obj.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    digests = key_digests(hkey, kind, obj)
    record = SourceRecord(
        kind=kind,
        name=meta.get("name", ""),
        key_digests=digests,
        secret_type=_secret_type(kind, obj),
        ignored=annotations.get(ANN_IGNORE) == "true",
        snapshot_of=proven_source(hkey, kind, obj, digests),
        uid=meta.get("uid"),
        resource_version=meta.get("resourceVersion"),
        shared=annotations.get(ANN_SHARED) == "true",
        reloader=source_mark(annotations),
    )
    text, acted = annotations.get(ANN_APPROVED), annotations.get(ANN_ACTED)
    if text is None and acted is None:
        return record
    content = content_id(source_digest(hkey, record))
    sid = SourceId(kind, record.name)
    namespace = str(meta.get("namespace") or "")
    approval = None
    if text is not None:
        approval = ChangedBy.decode(hkey, namespace, sid, text, content, domain=APPROVED)
    verb = None if acted is None else acted_on(hkey, namespace, sid, acted, content)
    if approval is None and verb is None:
        return record
    retried = (verb.at, verb.said()) if verb is not None and verb.verb is Verb.RETRY else None
    return SourceRecord(
        record.kind,
        record.name,
        digests,
        record.secret_type,
        record.ignored,
        record.snapshot_of,
        record.uid,
        record.resource_version,
        record.shared,
        content if approval is not None else None,
        content if approval is not None and approval.now else None,
        record.reloader,
        said_by(verb, Verb.PAUSE),
        said_by(verb, Verb.ABORT),
        retried,
    )


def source_digest(hkey: bytes, record: SourceRecord, keys: Iterable[str] | None = None) -> str:
    """Digest of a source as consumed: all keys (None) or only `keys`, missing ones as absent.

    The source's name is not part of it: a snapshot and its source digest alike, which is
    what lets a template that points at a snapshot be compared with the live source.
    """
    consumed = None if keys is None else keys if isinstance(keys, frozenset) else frozenset(keys)
    memo_key = (hkey, consumed)
    known = record.memo.get(memo_key)
    if known is not None:
        return known
    # Once per record and key set: the length prefixes are inlined (see `_lp`).
    key_digests = record.key_digests
    chosen = sorted(key_digests) if consumed is None else sorted(consumed)
    kind = record.kind.value.encode()
    secret_type = (record.secret_type or "").encode()
    parts = [
        _SOURCE_DOMAIN,
        len(kind).to_bytes(8, "big"),
        kind,
        len(secret_type).to_bytes(8, "big"),
        secret_type,
        len(chosen).to_bytes(8, "big"),
    ]
    append = parts.append
    for name in chosen:
        raw = name.encode()
        kd = key_digests.get(name)
        append(len(raw).to_bytes(8, "big"))
        append(raw)
        append(b"\x01" + kd if kd is not None else b"\x00")
    value = _hmac_hex(hkey, b"".join(parts))
    if len(record.memo) < 64:
        record.memo[memo_key] = value
    return value


def content_id(whole: str) -> str:
    """A content's short form, as a change, a changed-by record and an approval name it: the
    first CONTENT_ID_LEN hex digits of `whole`, its `source_digest` of all keys under the
    digest key itself (not a namespace's: equal content anywhere is alike)."""
    return whole[:CONTENT_ID_LEN]


def canonical_mapping(mapping: Mapping[str, str]) -> str:
    """The canonical text of a sources/observed mapping: JSON, sorted keys, no spaces.

    JSON string escaping makes it unambiguous (no value can forge a key boundary), so the
    checksum is taken over this very text, which the sources annotation shows."""
    return orjson.dumps(mapping, option=orjson.OPT_SORT_KEYS).decode()


def checksum_of_text(hkey: bytes, canonical_text: str) -> str:
    """The checksum of a mapping given as its `canonical_mapping` text."""
    return _hmac_hex(hkey, _CHECKSUM_DOMAIN + canonical_text.encode())


def checksum(hkey: bytes, sources: Mapping[str, str]) -> str:
    """One digest over the whole sources mapping."""
    return checksum_of_text(hkey, canonical_mapping(sources))
