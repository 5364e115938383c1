"""`configpin pause` and `configpin resume` (issue 47, shared/SPEC.md "Acting on a change"): the
record. Admission turns the request (`configpin.io/act`) into the signed record of the verb, the
requesting user, the time and the content (`configpin.io/acted`, webhook/server/writes.py,
webhook/core/verbs.py); the source's record reads it back as `paused_by` (webhook/core/digest.py)
only for the content it was said of, and only when configpin made it. The command:
tests/unit/commands/test_verbs.py; the gate and what is shown:
tests/unit/controller/test_pause.py; against the API server: tests/integration/test_pause.py."""

from __future__ import annotations

import copy
import json
import pickle
from typing import Any

from tests.unit.conftest import HKEY, configmap
from tests.unit.controller.test_preview import _review, _written
from webhook.core import digest
from webhook.core.constants import ANN_ACT, ANN_ACTED, ANN_APPROVED
from webhook.core.model import JSONObject, SourceId, SourceKind, SourceRecord
from webhook.core.preview import source_write
from webhook.core.signed import signed
from webhook.core.times import format_time
from webhook.core.verbs import ACTED, Acted, Verb
from webhook.kube.cache import SourceCache
from webhook.process.metrics import Metrics
from webhook.server.writes import SourceWrites

NS = "shop"
CFG = SourceId(SourceKind.CONFIGMAP, "web-config")
NOW = 1_800_000_000.0


def _cm(data: dict[str, str], **kw: Any) -> JSONObject:
    return configmap("web-config", data, namespace=NS, **kw)


def _content(obj: JSONObject) -> str:
    return digest.content_id(
        digest.source_digest(HKEY, digest.record_from_object(HKEY, CFG.kind, obj))
    )


def _act(old: JSONObject, asked: str, *, user: str, at: float = NOW) -> JSONObject:
    """The source as stored after `old` is written with configpin.io/act: `asked` by `user`."""
    new = copy.deepcopy(old)
    new["metadata"].setdefault("annotations", {})[ANN_ACT] = asked
    writes = SourceWrites(HKEY, None, clock=lambda: at)
    out, _ = writes.review(
        _review(old, new, user=user), source_write(HKEY, CFG.kind, "UPDATE", old, new)
    )
    return _written(new, out)


def _paused(obj: JSONObject) -> str | None:
    return digest.record_from_object(HKEY, CFG.kind, obj).paused_by


def test_admission_records_a_pause_signed_with_the_user_the_time_and_the_content() -> None:
    stored = _act(_cm({"a": "1"}), "pause", user="alice@example.com")
    notes = stored["metadata"]["annotations"]
    assert ANN_ACT not in notes  # the request, never stored
    assert stored["data"] == {"a": "1"}
    body = json.loads(notes[ANN_ACTED])
    content = _content(stored)
    assert (body["verb"], body["user"], body["at"], body["content"]) == (
        "pause", "alice@example.com", NOW, content,
    )  # fmt: skip
    assert Acted.decode(HKEY, NS, CFG, notes[ANN_ACTED]) == Acted(
        Verb.PAUSE, "alice@example.com", NOW, content
    )
    assert _paused(stored) == f"alice@example.com at {format_time(NOW)}"
    assert ANN_APPROVED not in notes  # (a pause approves nothing)


def test_resume_replaces_the_pause_and_the_content_is_no_longer_paused() -> None:
    paused = _act(_cm({"a": "1"}), "pause", user="alice")
    resumed = _act(paused, "resume", user="bob", at=NOW + 60)
    body = json.loads(resumed["metadata"]["annotations"][ANN_ACTED])
    assert (body["verb"], body["user"]) == ("resume", "bob")
    assert _paused(resumed) is None
    again = _act(resumed, "pause", user="carol", at=NOW + 120)
    assert _paused(again) == f"carol at {format_time(NOW + 120)}"


def test_an_older_verb_never_pauses_a_newer_change() -> None:
    """A pause recorded for content A says nothing of content B stored after it (the record
    stays on the source, but names A)."""
    paused = _act(_cm({"a": "1"}), "pause", user="alice")
    assert _paused(paused) is not None
    moved = copy.deepcopy(paused)
    moved["data"] = {"a": "2"}
    assert ANN_ACTED in moved["metadata"]["annotations"]
    assert _paused(moved) is None


def _write(old: JSONObject, new: JSONObject) -> JSONObject:
    """`new` as stored after admission of its write over `old`."""
    out, _ = SourceWrites(HKEY, None, clock=lambda: NOW).review(
        _review(old, new), source_write(HKEY, CFG.kind, "UPDATE", old, new)
    )
    return _written(new, out)


def test_a_change_of_content_takes_the_verb_away_so_a_then_b_then_a_is_not_paused() -> None:
    """A pause of A, then B stored, then A again: the last A is a newer change, which the old
    pause must not hold. Admission takes the record away with the write that changes the
    content (B), and keeps it through writes that change none (a label)."""
    paused = _act(_cm({"a": "1"}), "pause", user="alice")
    labelled = copy.deepcopy(paused)
    labelled["metadata"]["labels"] = {"team": "web"}
    kept = _write(paused, labelled)
    assert ANN_ACTED in kept["metadata"]["annotations"] and _paused(kept) is not None
    changed = copy.deepcopy(kept)
    changed["data"] = {"a": "2"}  # (a client that sends the record back, as apply does)
    b = _write(kept, changed)
    assert ANN_ACTED not in b["metadata"]["annotations"]
    back = copy.deepcopy(b)
    back["data"] = {"a": "1"}
    again = _write(b, back)
    assert _paused(again) is None and ANN_ACTED not in again["metadata"]["annotations"]
    # a change and a verb in one write: the verb, of the new content
    both = copy.deepcopy(kept)
    both["data"] = {"a": "3"}
    both["metadata"]["annotations"][ANN_ACT] = "pause"
    stored = _write(kept, both)
    said = Acted.decode(HKEY, NS, CFG, stored["metadata"]["annotations"][ANN_ACTED])
    assert said == Acted(Verb.PAUSE, "alice", NOW, _content(stored))
    assert _paused(stored) is not None


def test_a_pause_record_a_tenant_writes_or_copies_is_not_believed() -> None:
    """By hand, signed with another key, made for the same-named source of another namespace
    or for another source of this one, or another record's signature (an approval's): for
    the very content the source holds, none pauses it."""
    old = _cm({"a": "1"})
    content = _content(old)
    genuine = Acted(Verb.PAUSE, "me", NOW, content)
    by_hand = json.dumps({"verb": "pause", "user": "me", "at": NOW, "content": content})
    resumed = _act(old, "resume", user="me")["metadata"]["annotations"][ANN_ACTED]
    edited = json.dumps({**json.loads(resumed), "verb": "pause"})
    other_key = genuine.encode(b"not-" + HKEY, NS, CFG)
    elsewhere = genuine.encode(HKEY, "dev", CFG)
    beside = genuine.encode(HKEY, NS, SourceId(SourceKind.CONFIGMAP, "other"))
    as_secret = genuine.encode(HKEY, NS, SourceId(SourceKind.SECRET, CFG.name))
    body = {"verb": "pause", "user": "me", "at": NOW, "content": content}
    other_domain = signed(HKEY, b"configpin/approved/v1", f"{NS}/{CFG}", body)
    no_verb = signed(HKEY, ACTED, f"{NS}/{CFG}", {**body, "verb": "stop"})
    for text in (by_hand, edited, other_key, elsewhere, beside, as_secret, other_domain, no_verb):
        held = _cm({"a": "1"}, annotations={ANN_ACTED: text})
        assert _paused(held) is None, text
    held = _cm({"a": "1"}, annotations={ANN_ACTED: genuine.encode(HKEY, NS, CFG)})
    assert _paused(held) == f"me at {format_time(NOW)}"  # (the genuine one, for comparison)


def test_a_request_that_is_no_verb_is_taken_away_and_records_nothing() -> None:
    stored = _act(_cm({"a": "1"}), "stop", user="alice")
    notes = stored["metadata"].get("annotations") or {}
    assert ANN_ACT not in notes and ANN_ACTED not in notes


def test_a_deletion_carrying_a_request_records_nothing() -> None:
    old = _cm({"a": "1"}, annotations={ANN_ACT: "pause"})
    out, _ = SourceWrites(HKEY, None, clock=lambda: NOW).review(
        _review(old, None), source_write(HKEY, CFG.kind, "DELETE", old, None)
    )
    assert "patch" not in out["response"]


def test_paused_by_survives_the_worker_and_the_cache() -> None:
    """The record goes to the worker process pickled, by its fields; the cache packs it into
    an entry and reads it back (its extras)."""
    record = digest.record_from_object(HKEY, CFG.kind, _act(_cm({"a": "1"}), "pause", user="x"))
    assert record.paused_by is not None
    back = pickle.loads(pickle.dumps(record))
    assert isinstance(back, SourceRecord) and back.paused_by == record.paused_by
    cache = SourceCache(None, HKEY, Metrics())  # type: ignore[arg-type]  # (no watch: packing)
    from webhook.kube.cache import _record

    unpacked = _record(cache._layouts, cache.pack(record), CFG.kind, CFG.name)
    assert unpacked.paused_by == record.paused_by
    assert unpacked.key_digests == record.key_digests


def test_an_abort_stays_through_a_change_so_its_content_stored_again_is_still_aborted() -> None:
    """abort of A, then B, then A again: the record stays (it names A alone), B is not
    aborted, the last A is; retry replaces it, and a change of content takes a retry away."""
    aborted = _act(_cm({"a": "1"}), "abort", user="alice")
    record = digest.record_from_object(HKEY, CFG.kind, aborted)
    assert record.aborted_by == f"alice at {format_time(NOW)}" and record.paused_by is None
    changed = copy.deepcopy(aborted)
    changed["data"] = {"a": "2"}
    b = _write(aborted, changed)
    assert ANN_ACTED in b["metadata"]["annotations"]
    assert digest.record_from_object(HKEY, CFG.kind, b).aborted_by is None  # (B: newer)
    back = copy.deepcopy(b)
    back["data"] = {"a": "1"}
    again = _write(b, back)
    assert digest.record_from_object(HKEY, CFG.kind, again).aborted_by is not None
    retried = _act(again, "retry", user="bob", at=NOW + 60)
    record = digest.record_from_object(HKEY, CFG.kind, retried)
    assert record.aborted_by is None
    assert record.retried == (NOW + 60, f"bob at {format_time(NOW + 60)}")
    moved = copy.deepcopy(retried)
    moved["data"] = {"a": "3"}
    assert ANN_ACTED not in _write(retried, moved)["metadata"]["annotations"]


def test_aborted_by_and_retried_survive_the_worker_and_the_cache() -> None:
    from webhook.kube.cache import _record

    cache = SourceCache(None, HKEY, Metrics())  # type: ignore[arg-type]  # (no watch: packing)
    for verb in ("abort", "retry"):
        record = digest.record_from_object(HKEY, CFG.kind, _act(_cm({"a": "1"}), verb, user="x"))
        assert (record.aborted_by, record.retried) != (None, None)
        back = pickle.loads(pickle.dumps(record))
        assert (back.aborted_by, back.retried) == (record.aborted_by, record.retried)
        unpacked = _record(cache._layouts, cache.pack(record), CFG.kind, CFG.name)
        assert (unpacked.aborted_by, unpacked.retried) == (record.aborted_by, record.retried)
