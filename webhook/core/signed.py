"""configpin's signed records, in one place: the JSON objects it writes on objects (the rollout
record on a workload, who changed or approved a source), whose `sig` field signs the rest.

The signature is an HMAC-SHA256 under the digest key over the record's domain (which record
it is), its subject (the object it was made for, length-prefixed) and its body as canonical
JSON, so a record copied onto another object, or made for another purpose, is not believed.
These bytes are a contract with every record already written in a cluster: a change of them
makes every record there unreadable after an upgrade (tests/unit/core/test_signed.py pins them).
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from typing import Any

import orjson


def signed(hkey: bytes, domain: bytes, subject: str, body: Mapping[str, Any]) -> str:
    """The text of a record: `body` and its signature (`sig`), as canonical JSON."""
    out = dict(body)
    out["sig"] = _signature(hkey, domain, subject, body)
    return orjson.dumps(out, option=orjson.OPT_SORT_KEYS).decode()


def opened(hkey: bytes, domain: bytes, subject: str, text: Any, most: int) -> dict[str, Any] | None:
    """The body of a record (without `sig`) signed for `domain` and `subject`; None for
    anything else: not a JSON object of at most `most` characters, no signature, or one that
    is not configpin's for this very subject."""
    if not isinstance(text, str) or len(text) > most:
        return None
    try:
        body = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(body, dict):
        return None
    sig = body.pop("sig", None)
    if not isinstance(sig, str):
        return None
    # (as bytes: compare_digest refuses a str with a character beyond ASCII, which a forged
    # record may well carry)
    if not hmac.compare_digest(sig.encode(), _signature(hkey, domain, subject, body).encode()):
        return None
    return body


def _signature(hkey: bytes, domain: bytes, subject: str, body: Mapping[str, Any]) -> str:
    who = subject.encode()
    msg = domain + len(who).to_bytes(4, "big") + who
    msg += orjson.dumps(dict(body), option=orjson.OPT_SORT_KEYS)
    return hmac.digest(hkey, msg, "sha256").hex()
