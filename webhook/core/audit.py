"""Signed records configpin's admission writes on a ConfigMap or Secret: who changed its
content (`configpin.io/changed-by`) and who approved it (`configpin.io/approved`), each for
that very source and content. Signed with the digest key over the source's namespace, kind
and name, so a record a tenant writes, or copies from another source, is not believed; and
bound to the content it was made for, so it says nothing once the content moved on.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import orjson

from webhook.core.model import SourceId
from webhook.core.signed import opened
from webhook.core.times import format_time

CHANGED: Final = b"configpin/changed-by/v1"
APPROVED: Final = b"configpin/approved/v1"


@dataclass(frozen=True)
class ChangedBy:
    """Who changed (or approved: `domain`) a source's content, and when (seconds since the
    epoch)."""

    user: str
    at: float
    content: str  # the content it was recorded for (a prefix of its digest, as a Change's)

    def said(self) -> str:
        return f"{self.user} at {format_time(self.at)}"

    def encode(self, hkey: bytes, namespace: str, sid: SourceId, domain: bytes = CHANGED) -> str:
        body: dict[str, Any] = {"user": self.user, "at": self.at, "content": self.content}
        body["sig"] = _sig(hkey, domain, namespace, sid, body)
        return orjson.dumps(body, option=orjson.OPT_SORT_KEYS).decode()

    @classmethod
    def decode(
        cls,
        hkey: bytes,
        namespace: str,
        sid: SourceId,
        text: Any,
        content: str | None,
        domain: bytes = CHANGED,
    ) -> ChangedBy | None:
        """The record a source carries, when configpin made it for this very source and
        (`content`: None, any) the content it holds now; None for anything else."""
        found = opened(text, 4096)
        if found is None:
            return None
        body, sig = found
        if not hmac.compare_digest(sig, _sig(hkey, domain, namespace, sid, body)):
            return None
        user, at, recorded = body.get("user"), body.get("at"), body.get("content")
        if not isinstance(user, str) or not isinstance(at, int | float):
            return None
        if not isinstance(recorded, str) or (content is not None and recorded != content):
            return None
        return cls(user, float(at), recorded)


def _sig(hkey: bytes, domain: bytes, namespace: str, sid: SourceId, body: Mapping[str, Any]) -> str:
    who = f"{namespace}/{sid}".encode()
    msg = domain + len(who).to_bytes(4, "big") + who
    msg += orjson.dumps(dict(body), option=orjson.OPT_SORT_KEYS)
    return hmac.digest(hkey, msg, "sha256").hex()
