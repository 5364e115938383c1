"""configpin's signed records (webhook.core.signed): the bytes signed are a contract with every
record already written in users' clusters. The literals below were encoded by configpin
before the two signers became one (b6f071e: `record._sign`, `audit._sig`); they must still
open, and encoding the same record must give them again to the byte."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from webhook.core.audit import APPROVED, CHANGED, ChangedBy
from webhook.core.model import SourceId, SourceKind
from webhook.core.record import Action, Change, RolloutRecord, State, identity
from webhook.core.signed import opened, signed

HKEY = b"golden-digest-key-0123456789abcdef"
CFG = SourceId(SourceKind.CONFIGMAP, "app-config")
DB = SourceId(SourceKind.SECRET, "db")
WEB = identity("Deployment", "shop", "web")

ROLLOUT = (
    '{"action":"undo","before":{"configmap/app-config":"' + "b" * 64 + '"},'
    '"by":"alice at 2026-01-01T00:00:00Z","changes":["shop/configmap/app-config@'
    + "c" * 20
    + '","secret/db@'
    + "d" * 20
    + '"],"healthy":true,"refs":{"configmap/app-config-0123456789":'
    '"configmap/app-config-9876543210"},'
    '"sig":"6867c254788d0ff3085be9034bed5ac58fa89c68deca6317f641d276ed434536",'
    '"signal":"progress deadline exceeded","since":1767225600.5,"state":"failed",'
    '"template":"' + "e" * 32 + '","to":{"configmap/app-config":"' + "a" * 64 + '"}}'
)
# A record of before `healthy` and `by` (StatefulSet shop/db), as an older configpin wrote it.
ROLLOUT_OLDER = (
    '{"action":"","before":{},"changes":["shop/secret/db@' + "f" * 20 + '"],"refs":{},'
    '"sig":"b60558a1c243da0ec55271db9358a45a6cb2027343b504c21857249ae4586d77","signal":"",'
    '"since":1700000000,"state":"rolling","template":"","to":{"secret/db":"' + "f" * 64 + '"}}'
)
CHANGED_BY = (
    '{"at":1767225600.0,"content":"' + "c" * 20 + '",'
    '"sig":"85f91c64f14056e86becbd62e8492236f514608f7b71060eaeba5700b334b720","user":"alice"}'
)
APPROVED_BY = (
    '{"at":1767225601.25,"content":"' + "d" * 20 + '",'
    '"sig":"4eb3531bb6f9d72a013dc8011c57e62013950f12a5885eea080892dc79c332e1",'
    '"user":"bob@example.com"}'
)

# An approval asked for with `approve --now` (issue 40): the ordinary record's fields and
# `now`, which an ordinary approval never carries (its bytes, APPROVED_BY, are as they were).
APPROVED_NOW_BY = (
    '{"at":1767225602.5,"content":"' + "d" * 20 + '","now":true,'
    '"sig":"5fef109b0e858ccc6e745a823e339e066c44e191d6cccdca0187d9263e9cd435",'
    '"user":"carol@example.com"}'
)


def _rollout() -> RolloutRecord:
    return RolloutRecord(
        State.FAILED,
        to={"configmap/app-config": "a" * 64},
        before={"configmap/app-config": "b" * 64},
        since=1767225600.5,
        changes=(Change("shop", CFG, "c" * 20), Change("", DB, "d" * 20)),
        refs={"configmap/app-config-0123456789": "configmap/app-config-9876543210"},
        template="e" * 32,
        signal="progress deadline exceeded",
        action=Action.UNDO,
        healthy=True,
        by="alice at 2026-01-01T00:00:00Z",
    )


def test_a_rollout_record_written_before_still_opens_and_encodes_the_same() -> None:
    assert RolloutRecord.decode(HKEY, WEB, ROLLOUT) == _rollout()
    assert _rollout().encode(HKEY, WEB) == ROLLOUT


def test_an_older_rollout_record_still_opens() -> None:
    record = RolloutRecord.decode(HKEY, identity("StatefulSet", "shop", "db"), ROLLOUT_OLDER)
    assert record is not None
    assert record.state is State.ROLLING and record.healthy and record.by == ""
    assert record.changes == (Change("shop", DB, "f" * 20),)


def test_a_rollout_records_wave_opens_as_written_and_a_forged_one_opens_nothing() -> None:
    """The wave a rollout started in (wave 2 of 3) is signed with the rest; a record without
    one (written before it) reads as outside the waves."""
    placed = replace(_rollout(), wave=(2, 3))
    text = placed.encode(HKEY, WEB)
    assert RolloutRecord.decode(HKEY, WEB, text) == placed
    before = RolloutRecord.decode(HKEY, WEB, ROLLOUT)
    assert text != ROLLOUT and before is not None and before.wave is None
    envelope = json.loads(text)
    envelope["wave"] = [1, 3]  # (edited: no longer what configpin signed)
    assert RolloutRecord.decode(HKEY, WEB, json.dumps(envelope)) is None


def test_source_records_written_before_still_open_and_encode_the_same() -> None:
    alice = ChangedBy("alice", 1767225600.0, "c" * 20)
    bob = ChangedBy("bob@example.com", 1767225601.25, "d" * 20)
    assert ChangedBy.decode(HKEY, "shop", CFG, CHANGED_BY, "c" * 20) == alice
    assert ChangedBy.decode(HKEY, "shop", DB, APPROVED_BY, "d" * 20, domain=APPROVED) == bob
    assert alice.encode(HKEY, "shop", CFG) == CHANGED_BY
    assert bob.encode(HKEY, "shop", DB, domain=APPROVED) == APPROVED_BY


def test_an_approval_now_encodes_and_opens_as_pinned_and_says_now_only_when_asked() -> None:
    carol = ChangedBy("carol@example.com", 1767225602.5, "d" * 20, now=True)
    assert carol.encode(HKEY, "shop", DB, domain=APPROVED) == APPROVED_NOW_BY
    assert ChangedBy.decode(HKEY, "shop", DB, APPROVED_NOW_BY, "d" * 20, domain=APPROVED) == carol
    bob = ChangedBy("bob@example.com", 1767225601.25, "d" * 20, now=False)
    assert bob.encode(HKEY, "shop", DB, domain=APPROVED) == APPROVED_BY
    said = ChangedBy.decode(HKEY, "shop", DB, APPROVED_BY, "d" * 20, domain=APPROVED)
    assert said is not None and said.now is False


@pytest.mark.parametrize(
    ("domain", "subject", "text"),
    [
        (b"configpin/rollout/v1", WEB, ROLLOUT),
        (CHANGED, f"shop/{CFG}", CHANGED_BY),
        (APPROVED, f"shop/{DB}", APPROVED_BY),
        (APPROVED, f"shop/{DB}", APPROVED_NOW_BY),
    ],
)
def test_one_signer_opens_every_record_for_its_own_domain_and_subject_only(
    domain: bytes, subject: str, text: str
) -> None:
    body = opened(HKEY, domain, subject, text, 64 * 1024)
    assert body is not None and "sig" not in body
    assert signed(HKEY, domain, subject, body) == text
    assert opened(HKEY, domain + b"x", subject, text, 64 * 1024) is None
    assert opened(HKEY, domain, subject + "x", text, 64 * 1024) is None
    assert opened(HKEY + b"x", domain, subject, text, 64 * 1024) is None
    assert opened(HKEY, domain, subject, text, len(text) - 1) is None  # the size bound


@pytest.mark.parametrize(
    "text",
    [None, 7, "", "[]", "{", '{"user":"x"}', '{"sig":7}', '{"sig":"\u00e9t\u00e9"}', '"x"'],
)
def test_anything_else_is_no_record(text: object) -> None:
    """A forged signature with characters beyond ASCII is no record, not an error (it made
    hmac.compare_digest raise TypeError, which a tenant could put on a workload or a source)."""
    assert opened(HKEY, CHANGED, f"shop/{CFG}", text, 4096) is None
    assert RolloutRecord.decode(HKEY, WEB, text) is None
    assert ChangedBy.decode(HKEY, "shop", CFG, text, None) is None
