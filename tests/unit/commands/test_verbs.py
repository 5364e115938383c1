"""`configpin pause` and `configpin resume` (webhook/commands/verbs.py): what they ask
configpin's admission for, with the user's own rights, and what they make of its answer. What
admission records: tests/unit/server/test_verbs.py; against the API server:
tests/integration/test_pause.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

from webhook.commands import verbs
from webhook.commands.cli import build_parser
from webhook.core.constants import ANN_ACT, ANN_ACTED
from webhook.core.model import SourceKind
from webhook.core.verbs import Verb
from webhook.kube.errors import Forbidden, KubeError

NS = "shop"


class _Kube:
    """The API server, answering as configpin's admission would (`answer`: the record the
    stored source then carries; None with `unanswered`: the request stays, as when configpin
    does not answer), or refusing a user who may not update the source."""

    def __init__(
        self, answer: dict[str, Any] | None, *, unanswered: bool = False, refused: bool = False
    ) -> None:
        self.answer, self.unanswered, self.refused = answer, unanswered, refused
        self.sent: list[Any] = []

    def patch(self, api_path: str, body: Any, **_: Any) -> dict[str, Any]:
        if self.refused:
            raise Forbidden(f"PATCH {api_path}", 403, "forbidden")
        self.sent.append(body)
        notes = {} if self.answer is None else {ANN_ACTED: json.dumps(self.answer)}
        if self.unanswered:
            notes[ANN_ACT] = body["metadata"]["annotations"][ANN_ACT] or ""
        return {"metadata": {"annotations": notes}}

    def get(self, api_path: str, **_: Any) -> dict[str, Any]:
        raise Forbidden(f"GET {api_path}", 403, "forbidden")


@pytest.mark.parametrize("verb", list(Verb))
def test_each_verb_asks_for_itself_and_returns_the_record(verb: Verb) -> None:
    args = build_parser([verb.value]).parse_args([verb.value, "configmap/web-config", "-n", NS])
    assert (args.command, args.source, args.namespace) == (verb.value, "configmap/web-config", NS)
    record = {"verb": verb.value, "user": "alice", "at": 1.0, "content": "c" * 20}
    kube = _Kube(record)
    assert verbs.act(kube, SourceKind.CONFIGMAP, NS, "web-config", verb) == record  # type: ignore[arg-type]
    [sent] = kube.sent
    assert sent == {"metadata": {"annotations": {ANN_ACT: verb.value}}}


def test_no_answer_from_configpin_takes_the_request_back() -> None:
    kube = _Kube(None, unanswered=True)
    assert verbs.act(kube, SourceKind.SECRET, NS, "creds", Verb.PAUSE) is None  # type: ignore[arg-type]
    assert kube.sent[-1] == {"metadata": {"annotations": {ANN_ACT: None}}}


def test_a_record_of_another_verb_is_not_said_to_be_done() -> None:
    """A configpin older than the verb drops the request: the record the source carried
    before (a resume) is no pause."""
    earlier = {"verb": "resume", "user": "bob", "at": 1.0, "content": "c" * 20}
    assert verbs.act(_Kube(earlier), SourceKind.CONFIGMAP, NS, "x", Verb.PAUSE) is None  # type: ignore[arg-type]


def test_a_refusal_is_the_api_servers_answer() -> None:
    with pytest.raises(KubeError):
        verbs.act(_Kube(None, refused=True), SourceKind.CONFIGMAP, NS, "x", Verb.PAUSE)  # type: ignore[arg-type]


def test_a_source_that_is_no_configmap_or_secret_is_a_usage_error(capsys: Any) -> None:
    args = build_parser(["pause"]).parse_args(["pause", "deployment/web"])
    assert verbs.run(args) == 2
    assert "configmap/NAME or secret/NAME" in capsys.readouterr().err
