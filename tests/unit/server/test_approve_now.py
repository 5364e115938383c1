"""`configpin approve --now` (issue 40, shared/SPEC.md "Windows and budgets"): the override of an
emergency. Admission turns the request for `now` into the signed approval record with `now`
and the requesting user (webhook/server/writes.py, webhook/core/audit.py); the source's record
reads it back as `approved_now` (webhook/core/digest.py), which only configpin can make: a
record a tenant writes by hand, or copies from another source, is not believed. The command:
tests/unit/commands/test_approve.py; the API server's side, and a configpin cache over it:
tests/integration/test_approve_now.py."""

from __future__ import annotations

import copy
import json
import pickle
from typing import Any

from tests.unit.conftest import HKEY, configmap
from tests.unit.controller.test_preview import _review, _written
from webhook.core import digest
from webhook.core.audit import APPROVED, ChangedBy
from webhook.core.constants import ANN_APPROVE, ANN_APPROVED
from webhook.core.model import JSONObject, SourceId, SourceKind, SourceRecord
from webhook.core.preview import source_write
from webhook.core.signed import signed
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


def _approve(old: JSONObject, asked: str, *, user: str, at: float = NOW) -> JSONObject:
    """The source as stored after `old` is written with configpin.io/approve: `asked` by
    `user` (a merge of the request onto what it holds, as `configpin approve` patches it)."""
    new = copy.deepcopy(old)
    new["metadata"].setdefault("annotations", {})[ANN_APPROVE] = asked
    writes = SourceWrites(HKEY, None, clock=lambda: at)
    out, _ = writes.review(
        _review(old, new, user=user), source_write(HKEY, CFG.kind, "UPDATE", old, new)
    )
    return _written(new, out)


# --- admission ------------------------------------------------------------------------------


def test_admission_records_approve_now_signed_with_the_requesting_user() -> None:
    old = _cm({"a": "1"})
    stored = _approve(old, "now", user="oncall@example.com")
    notes = stored["metadata"]["annotations"]
    assert ANN_APPROVE not in notes  # never stored as asked
    body = json.loads(notes[ANN_APPROVED])
    assert body["now"] is True and body["user"] == "oncall@example.com"
    content = _content(stored)
    assert body["content"] == content
    said = ChangedBy.decode(HKEY, NS, CFG, notes[ANN_APPROVED], content, domain=APPROVED)
    assert said == ChangedBy("oncall@example.com", NOW, content, now=True)
    record = digest.record_from_object(HKEY, CFG.kind, stored)
    assert record.approved == content  # an approval too: the waves after `approve` go on
    assert record.approved_now == content


def test_an_ordinary_approval_is_signed_as_it_always_was_and_is_no_override() -> None:
    stored = _approve(_cm({"a": "1"}), "request", user="rm")
    text = stored["metadata"]["annotations"][ANN_APPROVED]
    content = _content(stored)
    assert "now" not in json.loads(text)
    assert text == ChangedBy("rm", NOW, content).encode(HKEY, NS, CFG, domain=APPROVED)
    assert ChangedBy("rm", NOW, content, now=False).encode(HKEY, NS, CFG, domain=APPROVED) == text
    record = digest.record_from_object(HKEY, CFG.kind, stored)
    assert record.approved == content and record.approved_now is None


def test_a_now_record_a_tenant_writes_or_copies_is_not_believed() -> None:
    """Made by hand (an ordinary record with `now` added, or a `now` record re-signed with
    another key), or copied from the same-named source of another namespace or from another
    source of this one, for the very content this source holds: no override, no approval."""
    old = _cm({"a": "1"})
    ordinary = _approve(old, "request", user="rm")["metadata"]["annotations"][ANN_APPROVED]
    content = _content(old)
    added = json.dumps({**json.loads(ordinary), "now": True})
    other_key = ChangedBy("me", NOW, content, now=True).encode(
        b"not-" + HKEY, NS, CFG, domain=APPROVED
    )
    elsewhere = ChangedBy("me", NOW, content, now=True).encode(HKEY, "dev", CFG, domain=APPROVED)
    sibling = SourceId(SourceKind.CONFIGMAP, "other")
    beside = ChangedBy("me", NOW, content, now=True).encode(HKEY, NS, sibling, domain=APPROVED)
    as_change = ChangedBy("me", NOW, content, now=True).encode(HKEY, NS, CFG)  # (changed-by)
    for text in (added, other_key, elsewhere, beside, as_change):
        held = _cm({"a": "1"}, annotations={ANN_APPROVED: text})
        record = digest.record_from_object(HKEY, CFG.kind, held)
        assert (record.approved, record.approved_now) == (None, None), text
    for bad in ("yes", 1, None):  # (`now` of another type, signed: no record at all)
        body = {"user": "me", "at": NOW, "content": content, "now": bad}
        text = signed(HKEY, APPROVED, f"{NS}/{CFG}", body)
        assert ChangedBy.decode(HKEY, NS, CFG, text, content, domain=APPROVED) is None
    # the genuine one, for comparison
    genuine = _approve(old, "now", user="oncall")
    assert digest.record_from_object(HKEY, CFG.kind, genuine).approved_now == content


def test_approve_now_then_a_plain_approval_and_then_a_change_that_is_not_approved_now() -> None:
    """A plain approval of content approved --now already keeps the override and its name
    (it does not take it back); the next content is no override until approved --now itself:
    a plain approval of it is a plain approval."""
    first = _approve(_cm({"a": "1"}), "now", user="oncall")
    kept = _approve(first, "request", user="rm", at=NOW + 60)
    assert (
        kept["metadata"]["annotations"][ANN_APPROVED]
        == (first["metadata"]["annotations"][ANN_APPROVED])
    )
    assert digest.record_from_object(HKEY, CFG.kind, kept).approved_now == _content(first)

    moved = copy.deepcopy(kept)
    moved["data"] = {"a": "2"}
    record = digest.record_from_object(HKEY, CFG.kind, moved)
    assert (record.approved, record.approved_now) == (None, None)
    plain = _approve(moved, "request", user="rm", at=NOW + 120)
    record = digest.record_from_object(HKEY, CFG.kind, plain)
    assert record.approved == _content(moved) and record.approved_now is None
    body = json.loads(plain["metadata"]["annotations"][ANN_APPROVED])
    assert body["user"] == "rm" and "now" not in body


def test_a_record_keeps_approved_now_across_the_large_review_worker() -> None:
    """The record goes to the worker process pickled, by its fields."""
    record = digest.record_from_object(HKEY, CFG.kind, _approve(_cm({"a": "1"}), "now", user="x"))
    assert record.approved_now is not None
    back = pickle.loads(pickle.dumps(record))
    assert isinstance(back, SourceRecord) and back.approved_now == record.approved_now
