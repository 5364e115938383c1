"""webhook/commands/dashboard: the fence of the local server (its own Host only, a token for every
change, same-origin only, the headers of every answer), on its own and through a real server
on loopback; and the pages' data from what the feeds hold (a change's waves and waits as its
ConfigRollout says them, each written out here as configpin publishes it; who uses which key,
names and never values).

The browser tests (tests/browser) drive the same against the API server in chromium."""

from __future__ import annotations

import contextlib
import http.client
import json
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from harness.manifests import configmap, container, deployment, env_from, env_key_ref, pod_spec
from webhook.commands.dashboard import changes, views
from webhook.commands.dashboard.app import App, Request
from webhook.commands.dashboard.feeds import FeedState, Note, Snapshot, Source, _source
from webhook.commands.dashboard.guard import CSP, TOKEN_HEADER, Fence
from webhook.commands.dashboard.http import Server
from webhook.core.constants import (
    ANN_APPROVED,
    ANN_CHANGED_BY,
    ANN_ROLLOUT,
    ANN_SOURCES,
)
from webhook.core.model import SourceKind
from webhook.core.rollouts import REASONS, RolloutReason

PORT = 3100
TOKEN = "t" * 43
FENCE = Fence("127.0.0.1", PORT, TOKEN)
HOST = {"host": f"localhost:{PORT}"}
JSON = {"content-type": "application/json"}


# --- the fence ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "host",
    [
        f"localhost:{PORT}",
        f"127.0.0.1:{PORT}",
        f"[::1]:{PORT}",
        f"LOCALHOST:{PORT}",
        f"127.0.0.2:{PORT}",
    ],
)
def test_its_own_addresses_are_answered(host: str) -> None:
    assert FENCE.host_allowed(host)


@pytest.mark.parametrize(
    "host",
    [
        f"evil.example:{PORT}",  # DNS rebinding: the attacker's name, resolving to 127.0.0.1
        f"localhost.evil.example:{PORT}",
        f"127.0.0.1.nip.io:{PORT}",
        "localhost",  # port 80: another server's
        f"localhost:{PORT + 1}",
        f"192.168.1.5:{PORT}",  # an address it does not listen on
        f"localhost:{PORT}@evil.example",
        f"[::1:{PORT}",
        "",
    ],
)
def test_any_other_host_is_refused(host: str) -> None:
    assert not FENCE.host_allowed(host)
    refusal = FENCE.refusal("GET", "/api/changes", {"host": host})
    assert refusal is not None and refusal.status == 421


def test_bound_to_every_address_it_answers_ip_addresses_but_never_a_name() -> None:
    fence = Fence("0.0.0.0", PORT, TOKEN)
    assert fence.host_allowed(f"192.168.1.5:{PORT}")
    assert fence.host_allowed(f"localhost:{PORT}")
    assert not fence.host_allowed(f"workstation.example:{PORT}")
    bound = Fence("192.168.1.5", PORT, TOKEN)
    assert bound.host_allowed(f"192.168.1.5:{PORT}")
    assert not bound.host_allowed(f"192.168.1.6:{PORT}")


def test_a_change_needs_the_token_as_json() -> None:
    def post(**headers: str) -> int | None:
        refusal = FENCE.refusal("POST", "/api/approve", {**HOST, **headers})
        return None if refusal is None else refusal.status

    token = TOKEN_HEADER.lower()
    assert post(**JSON) == 403  # no token
    assert post(**JSON, **{token: "t" * 42}) == 403
    assert post(**JSON, **{token: ""}) == 403
    assert post(**{token: TOKEN, "content-type": "text/plain"}) == 415  # a form's type
    assert post(**{token: TOKEN}) == 415
    assert post(**JSON, **{token: TOKEN}) is None
    assert post(**JSON, **{token: TOKEN, "origin": f"http://localhost:{PORT}"}) is None


def test_a_cross_origin_request_is_refused() -> None:
    token = {TOKEN_HEADER.lower(): TOKEN, **JSON}
    for origin in ("http://evil.example", f"https://localhost:{PORT}", "null"):
        for method in ("GET", "POST"):
            refusal = FENCE.refusal(method, "/api/approve", {**HOST, **token, "origin": origin})
            assert refusal is not None and refusal.status == 403, (origin, method)
    for site in ("cross-site", "same-site"):
        refusal = FENCE.refusal("GET", "/api/changes", {**HOST, "sec-fetch-site": site})
        assert refusal is not None and refusal.status == 403
        # a person following a link to the page reads nothing: allowed
        navigate = {**HOST, "sec-fetch-site": site, "sec-fetch-mode": "navigate"}
        assert FENCE.refusal("GET", "/", navigate) is None
        assert FENCE.refusal("GET", "/api/changes", navigate) is not None
    assert FENCE.refusal("GET", "/api/changes", {**HOST, "sec-fetch-site": "same-origin"}) is None


def test_other_methods_are_not_served() -> None:
    for method in ("PUT", "DELETE", "PATCH", "OPTIONS"):
        refusal = FENCE.refusal(method, "/api/approve", HOST)
        assert refusal is not None and refusal.status == 405


# --- the app and the server ---------------------------------------------------------------------


class _Store:
    """What the app reads of the feeds: a snapshot."""

    namespace = "shop"

    def __init__(self, snapshot: Snapshot) -> None:
        self.snap = snapshot
        self.stopped = threading.Event()

    def snapshot(self) -> Snapshot:
        return self.snap

    def ready(self) -> bool:
        return True

    def bump(self) -> None:
        pass

    def wait_newer(self, version: int, timeout: float) -> int:
        return self.snap.version

    def secret_keys(self, namespace: str, name: str) -> tuple[tuple[str, ...] | None, str]:
        return ("password",), ""


class _Book:
    def get(self, obj: Any, version: Any) -> dict[str, Any]:
        return {"state": "current", "mode": "default", "sources": [], "copies": []}


def _snapshot(
    workloads: list[dict[str, Any]] | None = None,
    sources: list[Source] | None = None,
    notes: list[Note] | None = None,
    rollouts: list[dict[str, Any]] | None = None,
    rollouts_feed: FeedState | None = None,
) -> Snapshot:
    return Snapshot(
        7,
        1_800_000_100.0,
        workloads or [],
        sources or [],
        notes or [],
        [FeedState("x")],
        {},
        rollouts or [],
        rollouts_feed or FeedState("ConfigRollouts in shop", listed=True),
    )


def _app(snapshot: Snapshot | None = None) -> App:
    return App(
        FENCE,
        _Store(snapshot or _snapshot()),  # type: ignore[arg-type]
        _Book(),  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        scope="namespace shop",
        context="",
    )


ROUTES = ["/", "/assets/app.js", "/assets/app.css", "/api/overview", "/api/changes",
          "/api/sources", "/api/workloads", "/api/nothing"]  # fmt: skip


def test_every_answer_carries_the_strict_policy_and_the_token_is_only_in_the_page() -> None:
    app = _app()
    for route in ROUTES:
        response = app.handle(Request("GET", route, headers=HOST))
        headers = response.all_headers()
        assert headers["Content-Security-Policy"] == CSP
        assert headers["X-Content-Type-Options"] == "nosniff"
        assert headers["X-Frame-Options"] == "DENY"
        assert "Access-Control-Allow-Origin" not in headers
        if route == "/":
            assert f'<meta name="configpin-token" content="{TOKEN}">' in response.body.decode()
        else:
            assert TOKEN.encode() not in response.body
    refused = app.handle(Request("GET", "/", headers={"host": f"evil.example:{PORT}"}))
    assert refused.status == 421 and refused.all_headers()["Content-Security-Policy"] == CSP
    assert "'unsafe-inline'" not in CSP and "script-src 'self'" in CSP


def test_the_page_has_no_inline_script_or_style_and_loads_nothing_from_elsewhere() -> None:
    page = _app().handle(Request("GET", "/", headers=HOST)).body.decode()
    assert "<script>" not in page and " style=" not in page and "<style" not in page
    assert "http://" not in page and "https://" not in page
    script = _app().handle(Request("GET", "/assets/app.js", headers=HOST)).body.decode()
    assert "innerHTML" not in script and "eval(" not in script
    assert ".style." not in script and 'setAttribute("style"' not in script


def test_approve_and_preview_are_refused_without_the_token() -> None:
    app = _app()
    body = json.dumps({"kind": "configmap", "namespace": "shop", "name": "cfg"}).encode()
    for route in ("/api/approve", "/api/preview"):
        response = app.handle(Request("POST", route, headers={**HOST, **JSON}, body=body))
        assert response.status == 403


@contextlib.contextmanager
def _serving(app: App) -> Iterator[int]:
    server = Server(("127.0.0.1", 0))
    server.app = app
    server.store = app.store
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_port
    finally:
        server.shutdown()
        server.server_close()


def _ask(
    port: int,
    method: str,
    route: str,
    headers: Mapping[str, str],
    body: bytes = b"",
    length: int | None = None,
) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.putrequest(method, route, skip_host=True, skip_accept_encoding=True)
        for name, value in headers.items():
            conn.putheader(name, value)
        conn.putheader("Content-Length", str(len(body) if length is None else length))
        conn.endheaders(body)
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def test_the_server_refuses_a_forged_host_and_a_post_without_the_token() -> None:
    app = _app()
    with _serving(app) as port:
        object.__setattr__(app, "fence", Fence("127.0.0.1", port, TOKEN))
        own = {"Host": f"localhost:{port}"}
        assert _ask(port, "GET", "/api/overview", own) == 200
        assert _ask(port, "GET", "/api/overview", {"Host": f"evil.example:{port}"}) == 421
        assert _ask(port, "GET", "/api/overview", {}) == 421
        body = b'{"kind":"configmap","namespace":"shop","name":"cfg"}'
        assert (
            _ask(port, "POST", "/api/approve", {**own, "Content-Type": "application/json"}, body)
            == 403
        )
        headers = {**own, "Content-Type": "application/json", TOKEN_HEADER: TOKEN}
        # (refused before a byte of it is read: none is sent)
        assert _ask(port, "POST", "/api/preview", headers, length=2 * 1024 * 1024) == 413
        assert _ask(port, "DELETE", "/api/approve", own) == 405


# --- the pages' data ------------------------------------------------------------------------------

NS = "shop"
CONTENT = "c0ffee00c0ffee00c0ff"
CHANGE = f"{NS}/configmap/cfg@{CONTENT}"
T0 = 1_800_000_000.0


def _reader(name: str, *, record: Mapping[str, Any] | None = None) -> dict[str, Any]:
    annotations = {}
    if record is not None:
        annotations[ANN_ROLLOUT] = json.dumps(record)
    dep = deployment(
        name,
        pod_spec(container(env=[env_key_ref("configmap", "cfg", "a", "A")])),
        replicas=1,
        annotations=annotations,
    )
    dep["metadata"]["namespace"] = NS
    dep["metadata"]["creationTimestamp"] = "2020-01-01T00:00:00Z"
    dep["spec"]["template"]["metadata"]["annotations"] = {ANN_SOURCES: '{"configmap/cfg":"d"}'}
    dep["status"] = {"observedGeneration": 1, "replicas": 1, "readyReplicas": 1}
    dep["metadata"]["generation"] = 1
    return dep


def _record(state: str, since: float, wave: list[int] | None = None) -> dict[str, Any]:
    """A rollout record as configpin writes it (`wave`: the wave it started in, of how many;
    None: a record made before that field, or outside waves)."""
    record: dict[str, Any] = {
        "state": state,
        "since": since,
        "changes": [CHANGE],
        "healthy": True,
        "by": "alice at x",
    }
    if wave is not None:
        record["wave"] = wave
    return record


def _cfg(**annotations: str) -> Source:
    return Source("configmap", NS, "cfg", "9", annotations, ("a", "b"))


WHO = json.dumps({"user": "alice", "at": T0, "content": CONTENT, "keys": ["a"], "more": 0})


def _rollout(
    waves: list[dict[str, Any]],
    members: list[dict[str, Any]],
    *,
    reason: str = "Rolling",
    condition: str = "Reconciling",
    content: str = CONTENT,
    resource_version: str = "9",
    **more: Any,
) -> dict[str, Any]:
    """cfg's ConfigRollout as configpin publishes it (webhook/core/rollouts.py's shape): its
    change, its waves' counts, its members not done yet, `condition` True with `reason`."""
    said = {"observedGeneration": 1, "lastTransitionTime": "2027-01-15T08:00:01Z"}
    return {
        "apiVersion": "configpin.io/v1alpha1",
        "kind": "ConfigRollout",
        "metadata": {"name": "configmap-cfg", "namespace": NS, "generation": 1},
        "spec": {"source": {"kind": "ConfigMap", "name": "cfg"}},
        "status": {
            "observedGeneration": 1,
            "source": {"ref": "configmap/cfg", "uid": "u1", "resourceVersion": resource_version},
            "change": {
                "content": content,
                "keys": ["a"],
                "changedBy": "alice",
                "changedAt": "2027-01-15T08:00:00Z",
            },
            "waves": waves,
            "members": members,
            "conditions": [
                {
                    **said,
                    "type": ctype,
                    "status": "True" if ctype == condition else "False",
                    "reason": reason,
                    "message": f"{reason}: as configpin says it" if ctype == condition else "",
                }
                for ctype in ("Ready", "Reconciling", "Stalled")
            ],
            "history": [],
            **more,
        },
    }


def _member(name: str, wave: int, state: str, reason: str | None = None, **more: str) -> dict:
    out: dict[str, Any] = {"namespace": NS, "kind": "Deployment", "name": name, "wave": wave}
    out["state"] = state
    if reason is not None:
        out["reason"] = reason
    return {**out, **more}


def _page(
    names: list[str],
    records: Mapping[str, Any],
    rollouts: list[dict[str, Any]],
    notes: list[Note] | None = None,
    status_of: Any = lambda _o: None,
    rollouts_feed: FeedState | None = None,
) -> dict[str, Any]:
    """The page of CHANGE (alice's write of key a) over its readers `names`, their rollout
    `records`, cfg's ConfigRollouts `rollouts` and the controller's `notes`."""
    workloads = [_reader(n, record=records.get(n)) for n in names]
    snap = _snapshot(
        workloads, [_cfg(**{ANN_CHANGED_BY: WHO})], notes, rollouts, rollouts_feed=rollouts_feed
    )
    found = changes.change(snap, CHANGE, status_of)
    assert found is not None
    return found


def _rows(found: Mapping[str, Any]) -> list[tuple[str, int, str, str]]:
    """The timeline: (name, wave, state, what it waits for), in the page's order."""
    return [(r["name"], r["wave"], r["state"], r["waits_for"]) for r in found["rows"]]


APPROVAL, WINDOW, WAITING = "AwaitingApproval", "AwaitingWindow", "Waiting"


def test_waiting_members_are_shown_with_what_their_configrollout_says_they_wait_for() -> None:
    """Waves 1,approve,100% as cfg's ConfigRollout says them: w0 completed wave 1 (its record:
    wave 1 of 2); w3, w1 and w2 wait in wave 2 of 2, listed in that order: two for an approval,
    w1 for a rollout window that opens at 09:00. The page shows them so, in the listed order,
    with the words of the core's one table and the controller's message; the change's
    verdict is the ConfigRollout's. A controller Event whose text says another wave (7 of 9)
    changes nothing."""
    names = ["w0", "w1", "w2", "w3"]
    records = {"w0": _record("complete", T0 + 1, [1, 2])}
    approve = "shop/configmap/cfg@c0ffee waits for an approval (wave 2 of 2 comes after approve)"
    rollout = _rollout(
        [{"wave": 1, "members": 1, "complete": 1}, {"wave": 2, "members": 3, "waiting": 3}],
        [
            _member("w3", 2, "waiting", APPROVAL, message=approve),
            _member("w1", 2, "waiting", WINDOW, message="outside its rollout windows",
                    until="2027-01-15T09:00:00Z"),
            _member("w2", 2, "waiting", APPROVAL, message=approve),
        ],
        reason=APPROVAL,
    )  # fmt: skip
    notes = [
        Note(NS, "Deployment", "w0", "ConfigRolloutComplete", "done", "Normal", T0 + 6),
        Note(NS, "Deployment", "w2", "ConfigRolloutWaiting",
             f"not rolled yet: {CHANGE} rolls in waves: wave 7 of 9 starts when wave 6 is "
             "complete (0 of 1 rollouts)", "Normal", T0 + 2),
    ]  # fmt: skip
    found = _page(names, records, [rollout], notes)
    assert _rows(found) == [
        ("w0", 1, "complete", ""),
        ("w3", 2, "waiting", APPROVAL),
        ("w1", 2, "waiting", WINDOW),
        ("w2", 2, "waiting", APPROVAL),
    ]
    rows = {r["name"]: r for r in found["rows"]}
    assert rows["w3"]["waits"] == REASONS[RolloutReason.AWAITING_APPROVAL].words
    assert rows["w1"]["waits"] == REASONS[RolloutReason.AWAITING_WINDOW].words
    assert rows["w3"]["detail"] == approve and rows["w1"]["until"] == T0 + 3600
    assert rows["w1"]["detail"] == "outside its rollout windows"
    assert rows["w0"]["start"] == T0 + 1 and rows["w0"]["end"] == T0 + 6
    assert rows["w3"]["start"] == T0  # (it has waited since the change)
    assert found["waves"] == 2 and found["wave_sizes"] == [1, 3]
    assert found["verdict"] == {
        "condition": "Reconciling",
        "reason": APPROVAL,
        "message": f"{APPROVAL}: as configpin says it",
    }
    assert found["rollout"] == {"names": [f"{NS}/configmap-cfg"], "said": "", "not_shown": 0}
    assert found["approval"] == {
        "asked": True,
        "after_wave": 1,
        "approved": [],
        "namespaces": [NS],
    }
    assert found["by"] == "alice" and found["keys"] == ["a"]
    listed = changes.changes(_snapshot([], [_cfg(**{ANN_CHANGED_BY: WHO})], [], [rollout]))
    [summary] = listed["changes"]
    assert summary["id"] == CHANGE and summary["counts"] == {"waiting": 3}
    assert summary["waiting_approval"] == 2 and summary["verdict"]["reason"] == APPROVAL


def test_a_rolled_members_wave_is_the_one_its_record_names() -> None:
    """Waves 1, 3 as the ConfigRollout counts them. w0 and w1 completed (their records: wave 1
    and wave 2 of 2); w2 rolls, its record made before records named a wave: the wave its
    ConfigRollout lists it in; w3 completed with such a record, and the ConfigRollout lists
    no member done: no wave is said for it (shown last, as "-")."""
    names = ["w0", "w1", "w2", "w3"]
    records = {
        "w0": _record("complete", T0 + 1, [1, 2]),
        "w1": _record("complete", T0 + 5, [2, 2]),
        "w2": _record("rolling", T0 + 9),
        "w3": _record("complete", T0 + 4),
    }
    rollout = _rollout(
        [
            {"wave": 1, "members": 1, "complete": 1},
            {"wave": 2, "members": 3, "complete": 2, "rolling": 1},
        ],
        [_member("w2", 2, "rolling")],
    )
    found = _page(names, records, [rollout])
    assert _rows(found) == [
        ("w0", 1, "complete", ""),
        ("w1", 2, "complete", ""),
        ("w2", 2, "rolling", ""),
        ("w3", 0, "complete", ""),
    ]
    assert found["waves"] == 2 and found["wave_sizes"] == [1, 3]


FEED = "ConfigRollouts in shop"


@pytest.mark.parametrize(
    ("feed", "says"),
    [
        (FeedState(FEED, served=False), "this cluster serves no ConfigRollouts"),
        (
            FeedState(FEED, error="you may not list", forbidden="Forbidden: no"),
            "you may not list ConfigRollouts here: Forbidden: no",
        ),
        (FeedState(FEED, listed=True), "there is no ConfigRollout configmap-cfg"),
    ],
)
def test_without_a_configrollout_the_page_says_what_it_cannot_tell(
    feed: FeedState, says: str
) -> None:
    """No ConfigRollout of cfg can be read (none served, none the user may list, none
    published). The page says so and what it cannot tell; it shows w0's rollout with the wave
    its record names, and the others as `configpin status` finds them, with no wave: w1's
    Event says it waits for an approval in wave 2 of 2, which the page does not read; its
    status says awaiting-approval."""
    records = {"w0": _record("complete", T0 + 1, [1, 2])}
    notes = [
        Note(NS, "Deployment", "w1", "ConfigRolloutAwaitingApproval",
             f"not rolled yet: {CHANGE} waits for an approval (wave 2 of 2 comes after "
             "approve): kubectl configpin approve configmap/cfg -n shop", "Normal", T0 + 2),
    ]  # fmt: skip
    states = {
        "w1": {"state": "awaiting-approval", "reason": "waits for an approval"},
        "w2": {"state": "stale", "reason": "configmap/cfg stale"},
    }
    found = _page(
        ["w0", "w1", "w2"],
        records,
        [],
        notes,
        status_of=lambda o: states.get(o["metadata"]["name"]),
        rollouts_feed=feed,
    )
    assert _rows(found) == [
        ("w0", 1, "complete", ""),
        ("w1", 0, "waiting", APPROVAL),
        ("w2", 0, "pending", ""),
    ]
    said = found["rollout"]["said"]
    assert says in said and "cannot tell its waves" in said, said
    assert found["verdict"] is None and found["waves"] == 2 and found["wave_sizes"] == []


def test_a_configrollout_about_other_content_says_nothing_of_this_change() -> None:
    """cfg's ConfigRollout still describes the content before (configpin has not published
    this change yet): its members are not this change's, and the page says so."""
    before = _rollout(
        [{"wave": 1, "members": 1, "waiting": 1}],
        [_member("w0", 1, "waiting", APPROVAL)],
        content="0123456789abcdef0123",
        resource_version="8",
    )
    found = _page(["w0"], {}, [before], status_of=lambda _o: {"state": "stale"})
    assert _rows(found) == [("w0", 0, "pending", "")]
    assert "describes content 0123456789abcdef0123 yet" in found["rollout"]["said"]
    assert found["approval"]["asked"] is False


def test_a_member_listed_by_neither_is_shown_as_its_status_says_with_no_wave() -> None:
    """The ConfigRollout lists w1 (waiting for configpin, wave 2) and counts one member more
    than it lists; w2 neither rolled nor is listed: `configpin status` finds it stale, and it
    is shown pending with no wave said. Where the ConfigRollout lists every member not done,
    a consumer listed by neither is done (no dry run is asked for it)."""
    waves = [{"wave": 1, "members": 1, "complete": 1}, {"wave": 2, "members": 2, "waiting": 2}]
    records = {"w0": _record("complete", T0 + 1, [1, 2])}
    listed = [_member("w1", 2, "waiting", WAITING, message="wave 2 of 2 starts after wave 1")]
    asked: list[str] = []

    def status_of(obj: Mapping[str, Any]) -> dict[str, Any]:
        asked.append(obj["metadata"]["name"])
        return {"state": "stale", "reason": "configmap/cfg stale"}

    counted = _rollout(waves, listed, reason=WAITING, membersNotShown=1)
    found = _page(["w0", "w1", "w2"], records, [counted], status_of=status_of)
    assert _rows(found) == [
        ("w0", 1, "complete", ""),
        ("w1", 2, "waiting", WAITING),
        ("w2", 0, "pending", ""),
    ]
    assert found["rows"][1]["waits"] == REASONS[RolloutReason.WAITING].words
    assert found["rollout"]["not_shown"] == 1 and asked == ["w2"]
    asked.clear()
    every = _rollout(waves, listed, reason=WAITING)
    found = _page(["w0", "w1", "w2"], records, [every], status_of=status_of)
    assert [r["name"] for r in found["rows"]] == ["w0", "w1"] and asked == []


def test_a_superseded_change_says_how_it_ended_as_the_configrollouts_history_says() -> None:
    """cfg holds newer content now, which its ConfigRollout describes; the change before it
    (CHANGE) is shown from its records, and its outcome from the ConfigRollout's history."""
    newer = "feedfacefeedfacefeed"
    who = json.dumps({"user": "bob", "at": T0 + 50, "content": newer, "keys": ["a"], "more": 0})
    rollout = _rollout(
        [{"wave": 1, "members": 1, "complete": 1}],
        [],
        reason="Delivered",
        condition="Ready",
        content=newer,
        history=[{"content": CONTENT, "outcome": "Delivered", "at": "2027-01-15T08:00:30Z"}],
    )
    workloads = [_reader("w0", record=_record("complete", T0 + 1, [1, 1]))]
    snap = _snapshot(workloads, [_cfg(**{ANN_CHANGED_BY: who})], [], [rollout])
    found = changes.change(snap, CHANGE, lambda _o: None)
    assert found is not None and found["current"] is False
    assert _rows(found) == [("w0", 1, "complete", "")]
    assert "ended Delivered" in found["rollout"]["said"], found["rollout"]
    assert found["verdict"] is None


def test_the_configrollout_of_a_source_never_changed_lists_no_change() -> None:
    """cfg was made and never changed: its ConfigRollout describes its content (Ready, no
    member, nobody who changed it) and its source has no record of who changed it. The list
    of changes is empty; the change's own page reads as delivered."""
    rollout = _rollout([], [], reason="Delivered", condition="Ready")
    del rollout["status"]["change"]["changedBy"], rollout["status"]["change"]["changedAt"]
    snap = _snapshot([_reader("w0")], [_cfg()], [], [rollout])
    assert changes.changes(snap)["changes"] == []
    found = changes.change(snap, CHANGE, lambda _o: {"state": "current"})
    assert found is not None and found["rows"] == [] and found["verdict"]["reason"] == "Delivered"


@pytest.mark.parametrize("now", [False, True])
def test_an_approval_is_shown_as_the_source_records_it_and_says_now_when_it_was(
    now: bool,
) -> None:
    """`approve --now` is said as such (issue 40): the page reads `now` from the record."""
    record = {"user": "oncall", "at": T0, "content": CONTENT, "sig": "x"}
    if now:
        record["now"] = True
    source = _cfg(**{ANN_CHANGED_BY: WHO, ANN_APPROVED: json.dumps(record)})
    snap = _snapshot([_reader("w0", record=_record("complete", T0 + 1))], [source])
    found = changes.change(snap, CHANGE, lambda _o: None)
    assert found is not None
    assert found["approval"]["approved"] == [
        {"namespace": NS, "user": "oncall", "at": T0, "now": now}
    ]


def test_a_change_not_acted_on_yet_lists_its_stale_readers_as_the_dry_run_says() -> None:
    """The source's record says alice changed key `a`; nothing rolled or waited yet: the
    readers of `a` are listed as the status dry run finds them (stale: pending; not checked
    yet: checking; current: not a member), a reader of `b` only is no member. No
    ConfigRollout says a wave for them."""
    other = _reader("reads-b")
    other["spec"]["template"]["spec"]["containers"][0]["env"][0]["valueFrom"]["configMapKeyRef"][
        "key"
    ] = "b"
    workloads = [_reader("stale"), _reader("unchecked"), _reader("current"), other]
    states = {
        "stale": {"state": "stale", "reason": "configmap/cfg stale"},
        "current": {"state": "current"},
    }
    snap = _snapshot(workloads, [_cfg(**{ANN_CHANGED_BY: WHO})])
    found = changes.change(snap, CHANGE, lambda o: states.get(o["metadata"]["name"]))
    assert found is not None
    shown = {r["name"]: (r["state"], r["wave"]) for r in found["rows"]}
    assert shown == {"stale": ("pending", 0), "unchecked": ("checking", 0)}


def test_used_by_lists_the_readers_of_each_key_and_how() -> None:
    items = pod_spec(container())
    items["containers"][0]["volumeMounts"] = [{"name": "v", "mountPath": "/etc/c"}]
    items["volumes"] = [
        {"name": "v", "configMap": {"name": "cfg", "items": [{"key": "b", "path": "b"}]}}
    ]
    sub = pod_spec(container())
    sub["containers"][0]["volumeMounts"] = [{"name": "v", "mountPath": "/x", "subPath": "a"}]
    sub["volumes"] = [{"name": "v", "configMap": {"name": "cfg"}}]
    made = [
        _reader("env-a"),
        deployment("from-all", pod_spec(container(env_from=[env_from("configmap", "cfg")]))),
        deployment("items-b", items),
        deployment("sub", sub),
        deployment("elsewhere", pod_spec()),
    ]
    for obj in made:
        obj["metadata"]["namespace"] = NS
    snap = _snapshot(made, [_cfg()])
    doc = views.source(snap, "configmap", NS, "cfg", lambda _n, _m: (None, ""))
    by_key = {k["key"]: {(c["name"], c["how"]) for c in k["consumers"]} for k in doc["keys"]}
    assert by_key == {
        "a": {("env-a", "env"), ("from-all", "envFrom"), ("sub", "subPath")},
        "b": {("from-all", "envFrom"), ("items-b", "volume"), ("sub", "subPath")},
    }
    assert doc["workloads"] == 4


def test_a_source_is_kept_as_names_never_values() -> None:
    """A ConfigMap as the feed keeps it: its key names and configpin's annotations; no value,
    no other annotation (kubectl's last-applied copy holds every value)."""
    obj = configmap(
        "cfg",
        {"password": "hunter2"},
        annotations={
            "kubectl.kubernetes.io/last-applied-configuration": '{"data":{"password":"hunter2"}}',
            ANN_CHANGED_BY: "{}",
        },
    )
    obj["binaryData"] = {"blob": "aHVudGVyMg=="}
    kept = _source(SourceKind.CONFIGMAP, obj, with_keys=True)
    assert kept.keys == ("blob", "password")
    assert kept.annotations == {ANN_CHANGED_BY: "{}"}
    assert "hunter2" not in repr(kept) and "aHVudGVyMg" not in repr(kept)
    secret = _source(
        SourceKind.SECRET, {"metadata": {"name": "s", "namespace": NS}}, with_keys=False
    )
    assert secret.keys is None


def test_the_command_answers_help(capsys: pytest.CaptureFixture[str]) -> None:
    from webhook.commands.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["dashboard", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "--port" in out and "--address" in out
    # (the waves are the ConfigRollouts' to say: the dashboard takes no --rollout-waves)
    assert "--rollout-waves" not in out


def test_a_records_wave_is_its_first_changes_and_not_another_ones() -> None:
    """w0 rolled for db's change and cfg's together, db's first: its record's wave 1 of 2 is
    db's wave; on cfg's page no wave is said for it (its ConfigRollout lists no member done)."""
    record = {**_record("complete", T0 + 1, [1, 2]), "changes": [f"{NS}/secret/db@0a0b", CHANGE]}
    rollout = _rollout([{"wave": 1, "members": 1, "complete": 1}], [])
    found = _page(["w0"], {"w0": record}, [rollout])
    assert _rows(found) == [("w0", 0, "complete", "")]


def test_each_workload_row_shows_its_updated_and_ready_replicas() -> None:
    """A row says the workload's updated, ready and desired pods: by its own status where the
    page holds it (fresher than published), else as its ConfigRollout's member says; a failed
    member, the pods its signal names. The workloads page says them too."""
    signal = "updated pod w1-6d4f-x2: container app restarted 3 times"
    rollout = _rollout(
        [{"wave": 1, "members": 3, "rolling": 1, "failed": 1, "waiting": 1}],
        [
            _member("w0", 1, "rolling"),
            _member("w1", 1, "failed", "Held", message=signal),
            _member("w9", 1, "waiting", WAITING),
        ],
        reason="Held",
        condition="Stalled",
    )
    rollout["status"]["members"][1].update(
        replicas={"updated": 1, "ready": 0, "desired": 1}, pods=["w1-6d4f-x2"]
    )
    rollout["status"]["members"][2]["replicas"] = {"updated": 4, "ready": 3, "desired": 4}
    records = {"w0": _record("rolling", T0 + 1, [1, 1])}
    found = _page(["w0", "w1"], records, [rollout])
    rows = {r["name"]: r for r in found["rows"]}
    # w0 and w1: the page holds them (status: 1 ready of 1, no updatedReplicas counted yet)
    assert rows["w0"]["replicas"] == {"updated": 0, "ready": 1, "desired": 1}
    assert rows["w1"]["replicas"] == {"updated": 0, "ready": 1, "desired": 1}
    assert rows["w1"]["pods"] == ["w1-6d4f-x2"] and rows["w0"]["pods"] == []
    assert rows["w9"]["replicas"] == {"updated": 4, "ready": 3, "desired": 4}  # (as published)
    snap = _snapshot([_reader("w0")], [_cfg()], [], [])
    [row] = views.workloads(snap, lambda _o: None)["workloads"]
    assert row["replicas"] == {"updated": 0, "ready": 1, "desired": 1}


def test_the_change_page_says_each_changed_keys_old_and_new_digests_from_its_rollout() -> None:
    """Where cfg's ConfigRollout says the changed keys' digests (keyed: never a value), the
    change's page says each, an added key with no old one; one that says none (a controller
    that did not see the change): the page says the names alone."""
    rollout = _rollout([{"wave": 1, "members": 1, "rolling": 1}], [_member("w0", 1, "rolling")])
    digests = [{"key": "a", "old": "3f2a" * 4, "new": "9c1d" * 4}, {"key": "n", "new": "ab" * 8}]
    rollout["status"]["change"]["keyDigests"] = digests
    found = _page(["w0"], {}, [rollout])
    assert found["keys"] == ["a"]
    assert found["key_digests"] == [
        {"key": "a", "old": "3f2a" * 4, "new": "9c1d" * 4},
        {"key": "n", "old": None, "new": "ab" * 8},
    ]
    del rollout["status"]["change"]["keyDigests"]
    assert _page(["w0"], {}, [rollout])["key_digests"] is None
    assert _page(["w0"], {}, [])["key_digests"] is None


def test_the_change_page_says_its_sources_earlier_changes_and_how_each_ended() -> None:
    """The source's history (its ConfigRollout's: content, outcome, when it moved on), latest
    first, each ending as a badge in words; none remembered: an empty list (the page says why)."""
    rollout = _rollout([{"wave": 1, "members": 1, "rolling": 1}], [_member("w0", 1, "rolling")])
    rollout["status"]["history"] = [
        {"content": "old1", "outcome": "Delivered", "at": "2026-12-03T10:00:00Z"},
        {"content": "old2", "outcome": "RolledBack", "at": "2026-12-03T11:00:00Z"},
    ]
    found = _page(["w0"], {}, [rollout])
    history = found["history"]
    assert [e["content"] for e in history] == ["old2", "old1"]
    assert history[0]["ended"] == {"state": "rolled-back", "title": "Rolled back"}
    assert history[0]["at"] == 1796295600.0
    del rollout["status"]["history"]
    assert _page(["w0"], {}, [rollout])["history"] == []
