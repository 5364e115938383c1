"""Signed records configpin's admission writes on a ConfigMap or Secret: who changed its
content (`configpin.io/changed-by`) and who approved it (`configpin.io/approved`), each for
that very source and content. Signed with the digest key over the source's namespace, kind
and name, so a record a tenant writes, or copies from another source, is not believed; and
bound to the content it was made for, so it says nothing once the content moved on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from webhook.core.model import SourceId
from webhook.core.signed import opened, signed
from webhook.core.times import format_time

CHANGED: Final = b"configpin/changed-by/v1"
APPROVED: Final = b"configpin/approved/v1"


@dataclass(frozen=True)
class ChangedBy:
    """Who changed (or approved: `domain`) a source's content, and when (seconds since the
    epoch)."""

    user: str
    at: float
    content: str  # the content it was recorded for (`digest.content_id`)

    def said(self) -> str:
        return f"{self.user} at {format_time(self.at)}"

    def encode(self, hkey: bytes, namespace: str, sid: SourceId, domain: bytes = CHANGED) -> str:
        body = {"user": self.user, "at": self.at, "content": self.content}
        return signed(hkey, domain, _subject(namespace, sid), body)

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
        body = opened(hkey, domain, _subject(namespace, sid), text, 4096)
        if body is None:
            return None
        user, at, recorded = body.get("user"), body.get("at"), body.get("content")
        if not isinstance(user, str) or not isinstance(at, int | float):
            return None
        if not isinstance(recorded, str) or (content is not None and recorded != content):
            return None
        return cls(user, float(at), recorded)


def _subject(namespace: str, sid: SourceId) -> str:
    """What a source's record is signed over: `namespace/configmap/name`."""
    return f"{namespace}/{sid}"
