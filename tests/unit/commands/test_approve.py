"""`configpin approve` (webhook/commands/changes.py): what it asks configpin's admission for,
with the user's own rights; `--now` (issue 40) asks for the override of an emergency. What the
API server and configpin make of it: tests/unit/server/test_approve_now.py and
tests/integration/test_approve_now.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

from webhook.commands import changes
from webhook.commands.cli import build_parser
from webhook.core.constants import ANN_APPROVE, ANN_APPROVED
from webhook.core.model import SourceId, SourceKind
from webhook.kube.errors import Forbidden

NS = "shop"
CFG = SourceId(SourceKind.CONFIGMAP, "web-config")
NOW = 1_800_000_000.0


class _Kube:
    """What `configpin approve` sends the API server, answered as configpin's admission
    would answer it (`answer`: the approval record the stored source then carries), or refused
    as a user who may not patch the source is (`patch_refused`)."""

    def __init__(self, answer: dict[str, Any] | None, *, patch_refused: bool = False) -> None:
        self.answer = answer
        self.patch_refused = patch_refused
        self.sent: list[Any] = []

    def _stored(self) -> dict[str, Any]:
        notes = {} if self.answer is None else {ANN_APPROVED: json.dumps(self.answer)}
        return {"metadata": {"name": "web-config", "annotations": notes}}

    def patch(self, api_path: str, body: Any, **_: Any) -> dict[str, Any]:
        if self.patch_refused:
            raise Forbidden(f"PATCH {api_path}", 403, "forbidden")
        self.sent.append(body)
        return self._stored()

    def get(self, api_path: str, **_: Any) -> dict[str, Any]:
        return {"metadata": {"name": "web-config"}}

    def replace(self, api_path: str, body: Any, **_: Any) -> dict[str, Any]:
        self.sent.append(body)
        return self._stored()


@pytest.mark.parametrize("patch_refused", [False, True], ids=["patch", "get-and-update"])
def test_approve_now_asks_for_now_and_a_plain_approve_asks_as_it_always_did(
    patch_refused: bool,
) -> None:
    args = build_parser(["approve", "--now", "configmap/web-config"]).parse_args(
        ["approve", "--now", "configmap/web-config", "-n", NS]
    )
    assert args.now is True
    plain = build_parser(["approve"]).parse_args(["approve", "configmap/web-config"])
    assert plain.now is False

    record = {"user": "oncall", "at": NOW, "content": "c" * 20, "now": True}
    kube = _Kube(record, patch_refused=patch_refused)
    got = changes.approval(kube, CFG.kind, NS, CFG.name, now=True)  # type: ignore[arg-type]
    assert got == record
    [sent] = kube.sent
    assert sent["metadata"]["annotations"][ANN_APPROVE] == "now"

    kube = _Kube({"user": "rm", "at": NOW, "content": "c" * 20}, patch_refused=patch_refused)
    assert changes.approval(kube, CFG.kind, NS, CFG.name) is not None  # type: ignore[arg-type]
    [sent] = kube.sent
    assert sent["metadata"]["annotations"][ANN_APPROVE] == "request"


def test_approve_now_answered_with_no_record_of_now_is_not_said_to_be_done() -> None:
    """A configpin older than --now drops a request it does not know and records nothing:
    whatever approval the source carried before (an ordinary one) is not the override."""
    earlier = {"user": "rm", "at": NOW, "content": "c" * 20}
    got = changes.approval(_Kube(earlier), CFG.kind, NS, CFG.name, now=True)  # type: ignore[arg-type]
    assert got is None
