"""The dashboard's buttons (webhook/commands/dashboard/actions.py, rights.py, app.py): which
verbs apply to a change in each namespace (Approve where waves wait for an approval, Pause while
its ConfigRollout says it rolls or waits, Resume while it says Paused); whether the user may
press them, as SelfSubjectAccessReviews of patch and update of the source say, kept briefly per
source; whose rights the page names (a SelfSubjectReview where served, else the kubeconfig's
names); a press is the CLI's verb, and a refusal greys the source's buttons with the API
server's answer.

The browser tests (tests/browser/test_buttons.py) press them against the API server."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import pytest

from tests.unit.commands.test_dashboard import (
    CHANGE,
    FENCE,
    HOST,
    JSON,
    WHO,
    _cfg,
    _member,
    _reader,
    _rollout,
    _snapshot,
    _Store,
)
from webhook.commands.cli import build_parser
from webhook.commands.dashboard import actions
from webhook.commands.dashboard.app import App, Request
from webhook.commands.dashboard.guard import TOKEN_HEADER
from webhook.commands.dashboard.rights import ACCESS_REVIEW, TTL, Rights
from webhook.core.constants import ANN_ACT, ANN_ACTED, ANN_CHANGED_BY
from webhook.core.model import SourceKind
from webhook.kube.errors import Forbidden, KubeError, NotFound

CM = SourceKind.CONFIGMAP
REVIEW_V1 = "/apis/authentication.k8s.io/v1/selfsubjectreviews"
REVIEW_BETA = "/apis/authentication.k8s.io/v1beta1/selfsubjectreviews"
TOKEN = {TOKEN_HEADER.lower(): FENCE.token}


class _Kube:
    """The API server as the dashboard's user meets it: `allowed` verbs of SSARs, the
    SelfSubjectReview paths served (`served`, answering `user`), and writes that configpin's
    admission answers with the record of the verb (or refuses with 403, `refuse`)."""

    def __init__(
        self,
        allowed: tuple[str, ...] = (),
        served: tuple[str, ...] = (),
        user: str = "alice",
        refuse: bool = False,
    ) -> None:
        self.allowed, self.served, self.user, self.refuse = allowed, served, user, refuse
        self.calls: list[tuple[str, str, Any]] = []
        self.down = False

    def create(self, api_path: str, body: Any, **_q: Any) -> dict[str, Any]:
        self.calls.append(("POST", api_path, body))
        if self.down:
            raise KubeError(f"POST {api_path}", None, "MaxRetryError")
        if api_path == ACCESS_REVIEW:
            verb = body["spec"]["resourceAttributes"]["verb"]
            if verb in self.allowed:
                return {"status": {"allowed": True}}
            return {"status": {"allowed": False}}
        if api_path in self.served:
            return {"status": {"userInfo": {"username": self.user, "groups": ["devs"]}}}
        raise NotFound(f"POST {api_path}", 404, "the server could not find the requested resource")

    def patch(self, api_path: str, body: Any, **_q: Any) -> dict[str, Any]:
        self.calls.append(("PATCH", api_path, body))
        if self.refuse:
            raise Forbidden(f"PATCH {api_path}", 403, f'User "{self.user}" cannot patch')
        verb = body["metadata"]["annotations"][ANN_ACT]
        record = {"verb": verb, "user": self.user, "at": 1.0, "content": "c0ffee"}
        return {"metadata": {"annotations": {ANN_ACTED: json.dumps(record)}}}

    def get(self, api_path: str, **_q: Any) -> dict[str, Any]:
        self.calls.append(("GET", api_path, None))
        return {"metadata": {"name": "cfg", "annotations": {}}}

    def replace(self, api_path: str, body: Any) -> dict[str, Any]:
        self.calls.append(("PUT", api_path, body))
        raise Forbidden(f"PUT {api_path}", 403, f'User "{self.user}" cannot update')


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _reviews(kube: _Kube) -> list[str]:
    return [b["spec"]["resourceAttributes"]["verb"] for m, p, b in kube.calls if p == ACCESS_REVIEW]


# --- whose rights -------------------------------------------------------------------------------


def test_the_user_is_who_the_servers_self_subject_review_says_of_the_newest_version_served() -> (
    None
):
    kube = _Kube(served=(REVIEW_BETA,), user="system:serviceaccount:shop:viewer")
    who = Rights(kube, "admin", "ctx").who()  # type: ignore[arg-type]
    assert (who.user, who.groups, who.reviewed) == (
        "system:serviceaccount:shop:viewer",
        ("devs",),
        True,
    )
    assert [p for _, p, _ in kube.calls] == [REVIEW_V1, REVIEW_BETA]
    assert "SelfSubjectReview" in who.as_dict()["said"]


def test_without_a_self_subject_review_the_kubeconfigs_names_are_said_as_such() -> None:
    kube = _Kube()
    rights = Rights(kube, "admin", "kind-dev")  # type: ignore[arg-type]
    said = rights.who().as_dict()
    assert said["user"] == "admin" and said["reviewed"] is False
    assert "kubeconfig" in said["said"] and "context kind-dev" in said["said"]
    asked = len(kube.calls)
    assert asked == 3  # v1, v1beta1, v1alpha1
    rights.who()
    assert len(kube.calls) == asked  # (known: not asked again)
    why = rights.may_update(CM, "shop", "cfg").why
    assert (
        why
        == "your rights (user admin of your kubeconfig) do not allow updating ConfigMap shop/cfg"
    )


def test_an_unreachable_server_is_asked_again_for_who() -> None:
    kube = _Kube(served=(REVIEW_V1,))
    kube.down = True
    rights = Rights(kube, "admin")  # type: ignore[arg-type]
    assert rights.who().reviewed is False
    kube.down = False
    assert rights.who().user == "alice"


# --- may the user press -------------------------------------------------------------------------


def test_a_user_without_patch_or_update_may_not_and_the_reason_names_them_and_the_source() -> None:
    kube = _Kube(served=(REVIEW_V1,), user="bob")
    clock = _Clock()
    rights = Rights(kube, clock=clock)  # type: ignore[arg-type]
    may = rights.may_update(CM, "shop", "cfg")
    assert may.allowed is False
    assert may.why == "your rights (bob) do not allow updating ConfigMap shop/cfg"
    assert _reviews(kube) == ["patch", "update"]
    spec = next(b for _, p, b in kube.calls if p == ACCESS_REVIEW)["spec"]["resourceAttributes"]
    assert spec == {"namespace": "shop", "verb": "patch", "resource": "configmaps", "name": "cfg"}
    # kept: the page drawn again asks nothing; after TTL it asks again
    rights.may_update(CM, "shop", "cfg")
    assert len(_reviews(kube)) == 2
    clock.now += TTL + 1
    rights.may_update(CM, "shop", "cfg")
    assert len(_reviews(kube)) == 4


def test_the_time_an_answer_is_kept_is_the_dashboards_hidden_rights_ttl(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """(The browser tests keep answers an hour, to press a button whose right was taken away.)"""
    args = build_parser(["dashboard"]).parse_args(["dashboard", "--rights-ttl", "3600"])
    assert args.rights_ttl == 3600.0
    with pytest.raises(SystemExit):
        build_parser(["dashboard"]).parse_args(["dashboard", "--help"])
    shown = capsys.readouterr().out
    assert "--port" in shown and "--rights-ttl" not in shown
    kube, clock = _Kube(), _Clock()
    rights = Rights(kube, clock=clock, ttl=args.rights_ttl)  # type: ignore[arg-type]
    rights.may_update(CM, "shop", "cfg")
    clock.now += TTL + 1
    rights.may_update(CM, "shop", "cfg")
    assert len(_reviews(kube)) == 2  # (kept: asked once)


def test_patch_or_update_allowed_is_enough() -> None:
    assert Rights(_Kube(allowed=("patch",))).may_update(CM, "s", "c").allowed is True  # type: ignore[arg-type]
    kube = _Kube(allowed=("update",))
    assert Rights(kube).may_update(CM, "s", "c").allowed is True  # type: ignore[arg-type]
    assert _reviews(kube) == ["patch", "update"]


def test_a_review_that_fails_leaves_the_button_to_the_api_server_and_is_not_kept() -> None:
    kube = _Kube()
    kube.down = True
    rights = Rights(kube)  # type: ignore[arg-type]
    may = rights.may_update(SourceKind.SECRET, "shop", "db")
    assert may.allowed is None and "could not ask" in may.why and "Secret shop/db" in may.why
    kube.down = False
    assert rights.may_update(SourceKind.SECRET, "shop", "db").allowed is False


# --- which buttons ------------------------------------------------------------------------------


def _cr(condition: str, reason: str, ns: str = "shop", content: str = "c0ffee") -> dict[str, Any]:
    return {
        "metadata": {"name": "configmap-cfg", "namespace": ns, "generation": 1},
        "status": {
            "observedGeneration": 1,
            "change": {"content": content},
            "conditions": [{"type": condition, "status": "True", "reason": reason}],
        },
    }


def _doc(**more: Any) -> dict[str, Any]:
    return {
        "current": True,
        "source": {"kind": "configmap", "name": "cfg"},
        "namespace": "shop",
        "namespaces": ["shop"],
        "content": "c0ffee",
        "counts": {},
        "moment": None,
        "approval": {"namespaces": []},
        **more,
    }


def _allowed(kind: SourceKind, ns: str, name: str) -> dict[str, Any]:
    return {"allowed": True, "why": ""}


def _verbs(doc: dict[str, Any], rollouts: list[dict[str, Any]]) -> dict[str, list[str]]:
    return {b["namespace"]: b["verbs"] for b in actions.buttons(doc, rollouts, _allowed)}


def test_pause_while_it_rolls_or_waits_resume_while_paused_approve_where_asked() -> None:
    assert _verbs(_doc(), [_cr("Reconciling", "Rolling")]) == {"shop": ["pause", "abort"]}
    asked = _doc(approval={"namespaces": ["shop"]})
    assert _verbs(asked, [_cr("Reconciling", "AwaitingApproval")]) == {
        "shop": ["approve", "pause", "abort"]
    }
    assert _verbs(_doc(), [_cr("Stalled", "Paused")]) == {"shop": ["resume", "abort"]}
    for stopped in ("Failed", "RolledBack", "Held", "Aborted"):  # (retry rolls it again)
        assert _verbs(_doc(), [_cr("Stalled", stopped)]) == {"shop": ["retry"]}, stopped
    assert _verbs(_doc(), [_cr("Ready", "Delivered")]) == {}
    assert _verbs(_doc(current=False), [_cr("Reconciling", "Rolling")]) == {}
    # a ConfigRollout of other content, or none: as the page's rows say
    assert _verbs(_doc(counts={"rolling": 1}), [_cr("Ready", "Delivered", content="0ld")]) == {
        "shop": ["pause", "abort"]
    }
    assert _verbs(_doc(counts={"complete": 3}), []) == {}


def test_a_shared_change_has_the_buttons_of_each_namespace_as_its_own_rollout_says() -> None:
    doc = _doc(namespace="", namespaces=["a", "b"])
    rollouts = [_cr("Stalled", "Paused", "a"), _cr("Reconciling", "Rolling", "b")]
    assert _verbs(doc, rollouts) == {"a": ["resume", "abort"], "b": ["pause", "abort"]}


# --- pressing -----------------------------------------------------------------------------------


def _app(kube: _Kube) -> App:
    rights = Rights(kube, "admin")  # type: ignore[arg-type]
    return App(FENCE, _Store(_snapshot()), None, kube, scope="namespace shop", context="",  # type: ignore[arg-type]
               rights=rights)  # fmt: skip


def _press(app: App, verb: str) -> tuple[int, dict[str, Any]]:
    body = json.dumps({"kind": "configmap", "namespace": "shop", "name": "cfg"}).encode()
    got = app.handle(Request("POST", "/api/" + verb, headers={**HOST, **JSON, **TOKEN}, body=body))
    return got.status, json.loads(got.body)


def test_pause_resume_abort_and_retry_are_the_cli_verbs_with_the_users_own_rights() -> None:
    kube = _Kube(allowed=("patch",), user="alice")
    app = _app(kube)
    done = {"pause": "paused", "resume": "resumed", "abort": "aborted", "retry": "retried"}
    for verb, said in done.items():
        status, doc = _press(app, verb)
        assert status == 200, doc
        assert doc["message"] == f"{said} configmap/cfg in shop by alice"
        patch = [b for m, _, b in kube.calls if m == "PATCH"][-1]
        assert patch == {"metadata": {"annotations": {ANN_ACT: verb}}}
    # without the token, nothing is asked of the API server
    before = len(kube.calls)
    body = json.dumps({"kind": "configmap", "namespace": "shop", "name": "cfg"}).encode()
    refused = app.handle(Request("POST", "/api/pause", headers={**HOST, **JSON}, body=body))
    assert refused.status == 403 and len(kube.calls) == before


def test_a_refusal_is_the_api_servers_answer_and_greys_the_sources_buttons_with_it() -> None:
    kube = _Kube(allowed=("patch", "update"), user="carol", refuse=True)
    app = _app(kube)
    assert app.rights is not None
    assert app.rights.may_update(CM, "shop", "cfg").allowed is True
    status, doc = _press(app, "pause")
    assert status == 403 and doc["refused"] is True
    assert 'User "carol" cannot' in doc["error"] and "403" in doc["error"]
    may = app.rights.may_update(CM, "shop", "cfg")
    assert may.allowed is False and may.why == doc["error"]


def test_the_overview_says_whose_rights_the_page_acts_with() -> None:
    app = _app(_Kube(served=(REVIEW_V1,), user="alice@example.com"))
    doc = json.loads(app.handle(Request("GET", "/api/overview", headers=HOST)).body)
    assert doc["who"]["user"] == "alice@example.com" and doc["who"]["reviewed"] is True


def test_the_change_page_carries_its_buttons_and_whether_the_user_may_press_them() -> None:
    """Waves 1,approve,100%: w1 waits for an approval; a view-only user (no patch, no update)."""
    kube = _Kube(served=(REVIEW_V1,), user="system:serviceaccount:shop:viewer")
    rollout = _rollout(
        [{"wave": 1, "members": 1}, {"wave": 2, "members": 1}],
        [_member("w1", 2, "waiting", "AwaitingApproval", message="waits for an approval")],
        reason="AwaitingApproval",
    )
    snap = _snapshot([_reader("w1")], [_cfg(**{ANN_CHANGED_BY: WHO})], rollouts=[rollout])
    app = App(FENCE, _Store(snap), None, kube, scope="namespace shop", context="",  # type: ignore[arg-type]
              rights=Rights(kube))  # type: ignore[arg-type]  # fmt: skip
    query = "id=" + quote(CHANGE, safe="")
    got = app.handle(Request("GET", "/api/change", query, headers=HOST))
    assert got.status == 200, got.body
    buttons = json.loads(got.body)["buttons"]
    assert buttons == [
        {
            "namespace": "shop",
            "verbs": ["approve", "pause", "abort"],
            "may": {
                "allowed": False,
                "why": "your rights (system:serviceaccount:shop:viewer) do not allow updating "
                "ConfigMap shop/cfg",
            },
        }
    ]
