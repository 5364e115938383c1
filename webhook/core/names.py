"""Names legal by construction: snapshot names and JSON-Pointer paths."""

from __future__ import annotations

import hashlib
import re
from typing import Final

MAX_NAME: Final = 253  # DNS-1123 subdomain, the limit for ConfigMap and Secret names
SUFFIX_LEN: Final = 10
_DNS1123_SUBDOMAIN: Final = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)


def is_dns1123_subdomain(name: str) -> bool:
    return len(name) <= MAX_NAME and bool(_DNS1123_SUBDOMAIN.match(name))


def snapshot_name(source_name: str, content_digest: str) -> str:
    """`<source-name>-<suffix>`, at most 253 characters, the suffix from the content digest.

    The content digest is already keyed (HMAC), so the suffix reveals nothing of a Secret's
    value. A source name too long to take the suffix is cut, and the cut is made unique with
    a hash of the full name so two long names sharing a prefix cannot collide.
    """
    suffix = content_digest[:SUFFIX_LEN]
    room = MAX_NAME - SUFFIX_LEN - 1
    base = source_name
    if len(base) > room:
        tag = hashlib.sha256(source_name.encode()).hexdigest()[:8]
        base = base[: room - len(tag) - 1].rstrip("-.") + "-" + tag
    return f"{base}-{suffix}"


def escape_pointer(token: str) -> str:
    """RFC 6901: `~` becomes `~0`, `/` becomes `~1` (in that order)."""
    return token.replace("~", "~0").replace("/", "~1")


def pointer(path: tuple[str | int, ...]) -> str:
    tokens = [p if isinstance(p, str) else str(p) for p in path]
    if not tokens:
        return ""
    # Nearly every token is plain; only an annotation key carries a `/`.
    return "/" + "/".join(escape_pointer(t) if "/" in t or "~" in t else t for t in tokens)
