"""What memory says of a person's abort or retry (webhook/controller/acts.py `Acts.wants`): a
workload is read and decided when a verb may ask something of it, and not again at every
resync once it was found to need nothing (checksum mode's abort; rejected content older than
what the source holds; a failure after the retry). The writes themselves are tested against
the API server: tests/integration/test_abort_retry.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from webhook.controller.acts import Acts
from webhook.controller.follow import Follower
from webhook.core.current import RolloutBrief, WorkloadRef
from webhook.core.model import SourceId, SourceKind
from webhook.core.record import Change, RolloutRecord, State

HKEY = b"k" * 32
NS = "shop"
CFG = SourceId(SourceKind.CONFIGMAP, "cfg")
C = Change(NS, CFG, "c" * 20)
REF = WorkloadRef("Deployment", NS, "web")


class _Cut:
    def __init__(self) -> None:
        self.abort: str | None = None
        self.retry: tuple[float, str] | None = None

    def aborted(self, _ns: str, change: Change) -> str | None:
        return self.abort if change == C else None

    def retried(self, _ns: str, change: Change) -> tuple[float, str] | None:
        return self.retry if change == C else None

    def change(self, _ns: str, sid: SourceId) -> Change | None:
        return C if sid == CFG else None

    def peek(self, _ns: str, _sid: SourceId) -> None:
        return None  # (its record: not what the rejected digest was made of)


@dataclass
class _Entry:
    rollout: RolloutBrief | None
    rejected: dict[str, str] = field(default_factory=dict)
    ref: WorkloadRef = REF
    recorded: dict[str, str] = field(default_factory=dict)
    consumes: tuple[Any, ...] = ()


def _acts(cut: _Cut) -> Acts:
    follower = Follower(HKEY, is_copy=lambda *_: False, changed_keys=lambda *_: None)
    return Acts(HKEY, cut, follower, lambda: 1.0)  # type: ignore[arg-type]


def _brief(state: State) -> RolloutBrief:
    return RolloutBrief(state, (C,), True)


def test_an_abort_asks_for_a_look_at_a_workload_rolled_to_it_and_no_other() -> None:
    cut = _Cut()
    acts = _acts(cut)
    entry = _Entry(_brief(State.COMPLETE))
    assert not acts.wants(entry)  # (no verb said)
    cut.abort = "alice at T"
    assert acts.wants(entry)  # complete: taken back in snapshot mode
    assert acts.wants(_Entry(_brief(State.ROLLING)))
    assert not acts.wants(_Entry(_brief(State.FAILED)))  # (already failed: nothing to take)
    assert not acts.wants(_Entry(_brief(State.LEFT)))  # (at zero: nothing runs it)
    assert not acts.wants(_Entry(None))


def test_checksum_modes_abort_is_looked_at_once() -> None:
    cut = _Cut()
    cut.abort = "alice at T"
    acts = _acts(cut)
    entry = _Entry(_brief(State.COMPLETE))
    obj = {"kind": "Deployment", "metadata": {"name": "web", "namespace": NS}}
    record = RolloutRecord(State.COMPLETE, {}, {}, 0.0, (C,))
    assert acts.abort(REF, obj, None, record, "checksum") is None  # type: ignore[arg-type]
    assert not acts.wants(entry)  # (nothing to take back: not read again)


def test_a_retry_asks_for_a_look_at_a_failure_or_a_rejection_of_its_content() -> None:
    cut = _Cut()
    acts = _acts(cut)
    failed = _Entry(_brief(State.FAILED))
    rejected = _Entry(_brief(State.COMPLETE), rejected={str(CFG): "d" * 64})
    assert not acts.wants(failed) and not acts.wants(rejected)
    cut.retry = (100.0, "bob at T")
    assert acts.wants(failed) and acts.wants(rejected)
    assert not acts.wants(_Entry(_brief(State.COMPLETE)))  # (nothing failed there)


def test_a_retry_that_finds_nothing_to_lift_is_not_looked_at_again() -> None:
    """Content rejected there that is not what the source holds now: the retry lifts nothing,
    and the workload is not read again at every resync while the retry stands."""
    cut = _Cut()
    cut.retry = (100.0, "bob at T")
    acts = _acts(cut)
    entry = _Entry(None, rejected={str(CFG): "d" * 64})
    obj = {"kind": "Deployment", "metadata": {"name": "web", "namespace": NS, "annotations": {}}}
    assert acts.wants(entry)
    assert acts.retry(REF, obj, entry) is None  # type: ignore[arg-type]
    assert not acts.wants(entry)
