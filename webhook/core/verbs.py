"""A person's verb on a change (SPEC, "Acting on a change"): `configpin pause`, `resume`,
`abort` and `retry`, recorded by configpin's admission on the source (`configpin.io/acted`) as
who said which verb, when, and for which content, signed with the digest key over the source
(webhook.core.signed), so a record a tenant writes, or copies from another source, is not
believed; and bound to the content it was said of, so an older verb never holds a newer change.

The source carries the latest verb only: `resume` replaces a `pause`, `retry` an `abort`. A
write that changes the source's content takes a pause, resume or retry away (a verb is said of
the content it was said to); an abort stays, so that the aborted content, stored again later, is
still rejected.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

from webhook.core.model import SourceId
from webhook.core.signed import opened, signed
from webhook.core.times import format_time

ACTED: Final = b"configpin/acted/v1"
_RECORD_MAX: Final = 2048  # characters of a record believed


class Verb(StrEnum):
    """A verb a person says of the change a source holds (the request's value too)."""

    PAUSE = "pause"  # no further rollout of this content starts; started ones are followed
    RESUME = "resume"  # it goes on from where it stopped
    ABORT = "abort"  # no further rollout starts; rolled workloads go back (snapshot mode)
    RETRY = "retry"  # content that failed, was rolled back or aborted rolls again

    @property
    def stays(self) -> bool:
        """The record outlives a change of the source's content (an abort rejects content)."""
        return self is Verb.ABORT


# Each verb's command: its help and its description (`configpin pause|resume --help`).
HELP: Final = {
    Verb.PAUSE: (
        "pause the change a ConfigMap or Secret holds now: no further wave of it starts (also "
        "`kubectl configpin pause`)",
        "Records, as you, that the source's current content is paused: no further rollout of "
        "it starts, those started are followed to the end; a newer change of the source is not "
        "paused. An update of the source: your right to update it is what is checked. Exit 0: "
        "recorded; 1: configpin did not record it; 2: usage or connection error, or a refusal.",
    ),
    Verb.RESUME: (
        "resume a paused change: its waves go on from where they stopped (also `kubectl "
        "configpin resume`)",
        "Records, as you, that the source's current content goes on rolling. An update of the "
        "source: your right to update it is what is checked. Exit 0: recorded; 1: configpin did "
        "not record it; 2: usage or connection error, or a refusal.",
    ),
    Verb.ABORT: (
        "abort the change a ConfigMap or Secret holds now: no further wave of it starts, and in "
        "snapshot mode the workloads it rolled go back (also `kubectl configpin abort`)",
        "Records, as you, that the source's current content is aborted: no further rollout of "
        "it starts; in snapshot mode the workloads already rolled to it (rolling or complete) "
        "go back to the copies of the last content that completed there, and the content is "
        "rejected there (checksum mode cannot bring content back: those keep it). Stored again "
        "later, the content is still aborted; a newer change of the source is not. An update "
        "of the source: your right to update it is what is checked. Exit 0: recorded; 1: "
        "configpin did not record it; 2: usage or connection error, or a refusal.",
    ),
    Verb.RETRY: (
        "retry the change a ConfigMap or Secret holds now: content that failed, was rolled back "
        "or aborted rolls again from its first wave (also `kubectl configpin retry`)",
        "Records, as you, that the source's current content rolls again: an abort of it is "
        "lifted, and the workloads where it failed (rejected, rolled back, held) roll it again "
        "in its waves, from the first. An update of the source: your right to update it is "
        "what is checked. Exit 0: recorded; 1: configpin did not record it; 2: usage or "
        "connection error, or a refusal.",
    ),
}


@dataclass(frozen=True)
class Acted:
    """Who said `verb` of the source's content `content` (`digest.content_id`), and when
    (seconds since the epoch)."""

    verb: Verb
    user: str
    at: float
    content: str

    def said(self) -> str:
        return f"{self.user} at {format_time(self.at)}"

    def encode(self, hkey: bytes, namespace: str, sid: SourceId) -> str:
        body = {"verb": self.verb.value, "user": self.user, "at": self.at, "content": self.content}
        return signed(hkey, ACTED, _subject(namespace, sid), body)

    @classmethod
    def decode(cls, hkey: bytes, namespace: str, sid: SourceId, text: Any) -> Acted | None:
        """The verb a source's record says, when configpin made it for this very source;
        None for anything else."""
        body = opened(hkey, ACTED, _subject(namespace, sid), text, _RECORD_MAX)
        if body is None:
            return None
        verb, user, at, content = (body.get(k) for k in ("verb", "user", "at", "content"))
        if not isinstance(user, str) or not isinstance(content, str):
            return None
        if not isinstance(at, int | float) or isinstance(at, bool):
            return None
        try:
            return cls(Verb(str(verb)), user, float(at), content)
        except ValueError:
            return None


def acted_on(hkey: bytes, namespace: str, sid: SourceId, text: Any, content: str) -> Acted | None:
    """The verb said of the content `content` of the source, from its record; None: no record
    configpin made, or a verb said of other content (an older verb never acts on a newer
    change)."""
    acted = Acted.decode(hkey, namespace, sid, text)
    return acted if acted is not None and acted.content == content else None


def said_by(acted: Acted | None, verb: Verb) -> str | None:
    """Who said `verb`, and when ("USER at TIME"), when that is the verb recorded."""
    return acted.said() if acted is not None and acted.verb is verb else None


def paused_by(hkey: bytes, namespace: str, sid: SourceId, text: Any, content: str) -> str | None:
    """Who paused the content `content` of the source, and when ("USER at TIME"), from its
    record; None when it is not paused: no record configpin made, a `resume`, or a pause of
    other content (an older verb never holds a newer change)."""
    return said_by(acted_on(hkey, namespace, sid, text, content), Verb.PAUSE)


def _subject(namespace: str, sid: SourceId) -> str:
    """What a source's record is signed over: `namespace/configmap/name` (as webhook.core.audit)."""
    return f"{namespace}/{sid}"
