"""Signed records configpin's admission writes on a ConfigMap or Secret: who changed its
content (`configpin.io/changed-by`) and who approved it (`configpin.io/approved`), each for
that very source and content. Signed with the digest key over the source's namespace, kind
and name, so a record a tenant writes, or copies from another source, is not believed; and
bound to the content it was made for, so it says nothing once the content moved on.

A rollout is credited to whoever made the content that workload rolls to, the last write of a
key it reads, not to the last writer of the source: a record of who changed it says which keys
its write changed (`keys`) and, carried from the record before it (`after`), who last changed
each of the others (`earlier`), so that a write of key `b` leaves a rollout of key `a` to the
one who changed `a`. Bounded: what would not fit is left out, and a rollout of such a key is
credited to `unknown`, never to someone who did not make it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import orjson

from webhook.core.model import SourceId
from webhook.core.signed import opened, signed
from webhook.core.times import format_time

CHANGED: Final = b"configpin/changed-by/v1"
APPROVED: Final = b"configpin/approved/v1"
_RECORD_MAX: Final = 4096  # characters of a record believed
_SIG_SIZE: Final = len(',"sig":""') + 64


@dataclass(frozen=True)
class Earlier:
    """Who last changed some keys of a source's content before its latest write, and when."""

    user: str
    at: float
    keys: tuple[str, ...] | None  # None: every key not named by a later write

    def said(self) -> str:
        return f"{self.user} at {format_time(self.at)}"

    def _body(self) -> dict[str, Any]:
        return {"user": self.user, "at": self.at, "keys": _listed(self.keys)}


@dataclass(frozen=True)
class ChangedBy:
    """Who changed (or approved: `domain`) a source's content, and when (seconds since the
    epoch); for a change, which keys that write changed and who last changed the others; for
    an approval, whether it was `approve --now` (it rolls whatever its windows and budget
    say)."""

    user: str
    at: float
    content: str  # the content it was recorded for (`digest.content_id`)
    keys: tuple[str, ...] | None = None  # the keys the write changed (None: not said, all)
    earlier: tuple[Earlier, ...] = ()  # who last changed the others, the latest first
    now: bool = False  # (an approval) asked for with --now

    def said(self) -> str:
        return f"{self.user} at {format_time(self.at)}"

    def made(self, keys: frozenset[str] | None) -> str | None:
        """Who made what a reader of `keys` (None: every key) reads of this content: the
        last write that changed one of them, as `said` says it; None: no write configpin
        recorded (made while it did not admit writes, or left out of a full record)."""
        if keys is None or self.keys is None or not keys.isdisjoint(self.keys):
            return self.said()
        for hand in self.earlier:
            if hand.keys is None or not keys.isdisjoint(hand.keys):
                return hand.said()
        return None

    def after(self, user: str, at: float, content: str, changed: frozenset[str]) -> ChangedBy:
        """The record of a write by `user` that changed `changed` (the record of the content
        before it is this one): who last changed each other key is carried on."""
        kept: list[Earlier] = []
        for hand in (Earlier(self.user, self.at, self.keys), *self.earlier):
            keys = hand.keys
            if keys is not None:
                keys = tuple(k for k in keys if k not in changed)
                if not keys:
                    continue  # every key it made was changed since
            kept.append(Earlier(hand.user, hand.at, keys))
            if keys is None:
                break  # (every other key: nothing after it is reached)
        return ChangedBy.first(user, at, content, changed, tuple(kept))

    @classmethod
    def first(
        cls,
        user: str,
        at: float,
        content: str,
        changed: frozenset[str],
        earlier: tuple[Earlier, ...] = (),
    ) -> ChangedBy:
        """The record of a write by `user` that changed `changed`, with no record of who
        made the content before it (`earlier`: unless carried). What would make it longer
        than a record believed is left out: the oldest writers first (a rollout of their keys
        is then credited to `unknown`), then the keys of this write (it is credited with
        every key, as a record that names none)."""
        keys = tuple(sorted(changed))
        if _most(user, keys) + sum(_most(e.user, e.keys) for e in earlier) < _RECORD_MAX // 2:
            return cls(user, at, content, keys, earlier)  # (it fits, however it is escaped)
        record = cls(user, at, content, keys)
        size = record._size() + len(',"earlier":[]')
        if size > _RECORD_MAX:
            return cls(user, at, content)
        kept = 0
        for hand in earlier:
            size += len(orjson.dumps(hand._body())) + 1
            if size > _RECORD_MAX:
                break
            kept += 1
        return cls(user, at, content, keys, earlier[:kept])

    def _body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"user": self.user, "at": self.at, "content": self.content}
        if self.keys is not None:  # (a record that names none is the one it always was)
            body["keys"] = list(self.keys)
        if self.earlier:
            body["earlier"] = [e._body() for e in self.earlier]
        if self.now:  # (only when true: an ordinary approval signs the bytes it always did)
            body["now"] = True
        return body

    def _size(self) -> int:
        return len(orjson.dumps(self._body()).decode()) + _SIG_SIZE  # (characters)

    def encode(self, hkey: bytes, namespace: str, sid: SourceId, domain: bytes = CHANGED) -> str:
        return signed(hkey, domain, _subject(namespace, sid), self._body())

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
        body = opened(hkey, domain, _subject(namespace, sid), text, _RECORD_MAX)
        if body is None:
            return None
        user, at, recorded = body.get("user"), body.get("at"), body.get("content")
        if not isinstance(user, str) or not isinstance(at, int | float):
            return None
        if not isinstance(recorded, str) or (content is not None and recorded != content):
            return None
        now = body.get("now", False)
        if not isinstance(now, bool):
            return None
        try:
            keys = _keys(body.get("keys"))
            earlier = tuple(_earlier(e) for e in body.get("earlier") or ())
        except (TypeError, ValueError):
            return None
        return cls(user, float(at), recorded, keys, earlier, now)


def _most(user: str, keys: tuple[str, ...] | None) -> int:
    """The most characters one writer's part of a record can take (every character escaped
    as \\uXXXX, and room for the rest of its entry)."""
    return 6 * (len(user) + sum(len(k) + 3 for k in keys or ())) + 64


def _listed(keys: tuple[str, ...] | None) -> list[str] | None:
    return list(keys) if keys is not None else None


def _keys(value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(k, str) for k in value):
        raise TypeError("not a list of keys")
    return tuple(value)


def _earlier(value: Any) -> Earlier:
    if not isinstance(value, dict):
        raise TypeError("not a record")
    user, at = value.get("user"), value.get("at")
    if not isinstance(user, str) or not isinstance(at, int | float):
        raise TypeError("not a record")
    return Earlier(user, float(at), _keys(value.get("keys")))


def _subject(namespace: str, sid: SourceId) -> str:
    """What a source's record is signed over: `namespace/configmap/name`."""
    return f"{namespace}/{sid}"
