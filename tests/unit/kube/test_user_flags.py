"""kubectl's flags on the user's connection (webhook.kube.userflags, webhook.kube.user): `--as` and
`--as-group` go out as kubectl sends them, one Impersonate-Group line per group; and
`--request-timeout`, read as client-go reads it, bounds every request (and is told to the API
server as `timeout`, as client-go tells it), whatever a command's own default is. Before, none of
these flags existed."""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit.kube.fakeapi import TOKEN, FakeAPI, serve
from webhook.kube.errors import KubeError
from webhook.kube.raw import Kube
from webhook.kube.user import connect_as_user
from webhook.kube.userflags import UserFlags, parse_request_timeout


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeAPI]:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    yield from serve(FakeAPI())


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("0", 0.0),  # no timeout
        ("5", 5.0),  # a bare integer: seconds
        ("30s", 30.0),
        ("1m", 60.0),
        ("2h", 7200.0),
        ("1m30s", 90.0),
        ("500ms", 0.5),
        ("1.5s", 1.5),
    ],
)
def test_request_timeout_is_read_as_kubectl_reads_it(text: str, seconds: float) -> None:
    assert parse_request_timeout(text) == seconds


@pytest.mark.parametrize("text", ["", "5x", "1.5", "-1s", "soon", "1 m"])
def test_a_request_timeout_kubectl_refuses_is_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="invalid timeout value"):
        parse_request_timeout(text)


def test_as_and_as_group_go_out_as_kubectls_impersonation_headers(
    fake: FakeAPI, tmp_path: Path
) -> None:
    flags = UserFlags(as_user="system:serviceaccount:shop:deployer", as_groups=("ops", "a,b"))
    conn, namespace = connect_as_user(fake.kubeconfig(tmp_path), None, flags)
    with conn:
        Kube(conn).get("/api/v1/namespaces/shop/configmaps")
        Kube(conn).create("/api/v1/namespaces/shop/configmaps", {"metadata": {"name": "x"}})
    assert namespace == "team-a"
    for seen in fake.seen:
        assert seen.headers.get_all("Impersonate-User") == ["system:serviceaccount:shop:deployer"]
        # one line a group: the API server never splits a line at its commas
        assert seen.headers.get_all("Impersonate-Group") == ["ops", "a,b"]
        assert seen.headers["Authorization"] == f"Bearer {TOKEN}"  # still as the user
    assert len(fake.seen) == 2


def test_without_as_nobody_is_impersonated(fake: FakeAPI, tmp_path: Path) -> None:
    conn, _ = connect_as_user(fake.kubeconfig(tmp_path), None, UserFlags(as_groups=()))
    with conn:
        Kube(conn).get("/version")
    [seen] = fake.seen
    assert seen.headers.get_all("Impersonate-User") is None
    assert seen.headers.get_all("Impersonate-Group") is None
    assert "timeout" not in seen.query  # no --request-timeout: nothing said


def test_request_timeout_bounds_every_request_over_the_commands_own_limit(
    fake: FakeAPI, tmp_path: Path
) -> None:
    """The server takes 5 s; `--request-timeout 500ms` gives up after half a second, although
    the command asked for 30 s (wait asks for 10), and tells the server too."""
    conn, _ = connect_as_user(fake.kubeconfig(tmp_path), None, UserFlags(request_timeout=0.5))
    fake.delay = 5.0
    with conn:
        kube = Kube(conn, timeout=30.0)
        start = time.monotonic()
        with pytest.raises(KubeError, match="ReadTimeoutError"):
            kube.get("/api/v1/namespaces")
        assert time.monotonic() - start < 3.0
    [seen] = fake.seen
    assert seen.query["timeout"] == ["500ms"]  # as client-go sends it: a Go duration


def test_request_timeout_0_is_no_timeout(fake: FakeAPI, tmp_path: Path) -> None:
    conn, _ = connect_as_user(fake.kubeconfig(tmp_path), None, UserFlags(request_timeout=0.0))
    fake.delay = 1.2
    with conn:
        kube = Kube(conn, timeout=0.3)  # the command's own limit, which 0 lifts
        assert kube.get("/api/v1/namespaces") == {"kind": "List", "items": []}
    assert "timeout" not in fake.seen[0].query


def test_a_watch_under_request_timeout_is_asked_to_end_within_it(
    fake: FakeAPI, tmp_path: Path
) -> None:
    conn, _ = connect_as_user(fake.kubeconfig(tmp_path), None, UserFlags(request_timeout=2.0))
    with conn, Kube(conn).watch("/api/v1/configmaps", "1", timeout_seconds=300) as events:
        assert list(events) == [{"kind": "List", "items": []}]
    [seen] = fake.seen
    assert seen.query["timeoutSeconds"] == ["2"]
    assert seen.query["watch"] == ["true"]
