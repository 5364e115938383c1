"""The commands that act as the user at the keyboard take kubectl's flags, with kubectl's
meaning: `--as`, `--as-group` (repeatable) and `--request-timeout`; a wrong value is refused with
exit 2 and a line that says what is allowed, before anything is sent. Before, none of them
existed (argparse refused them as unknown)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit.kube.fakeapi import FakeAPI, serve
from webhook.commands.cli import main

COMMANDS = {
    "status": ["status"],
    "plan": ["plan", "-f", "cm.yaml"],
    "approve": ["approve", "configmap/web"],
    "wait": ["wait", "configmap/web"],
    "dashboard": ["dashboard"],
    "version": ["version"],
}


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeAPI]:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBECONFIG", raising=False)
    yield from serve(FakeAPI())


@pytest.mark.parametrize("command", COMMANDS)
def test_a_wrong_request_timeout_is_refused_with_what_is_allowed(
    command: str, fake: FakeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [*COMMANDS[command], "--kubeconfig", str(fake.kubeconfig(tmp_path))]
    with pytest.raises(SystemExit) as stopped:
        main([*argv, "--request-timeout", "5x"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert "argument --request-timeout: invalid timeout value '5x'" in err
    assert "(e.g. 1s | 2m | 3h)" in err
    assert fake.seen == []  # refused before anything was sent


@pytest.mark.parametrize("command", COMMANDS)
def test_as_group_without_as_is_refused_as_kubectl_refuses_it(
    command: str, fake: FakeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [*COMMANDS[command], "--kubeconfig", str(fake.kubeconfig(tmp_path))]
    assert main([*argv, "--as-group", "ops"]) == 2
    assert f"configpin {command}: --as-group needs --as USER" in capsys.readouterr().err
    assert fake.seen == []


def test_status_sends_every_request_as_the_user_asked_for_within_the_timeout(
    fake: FakeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["status", "--kubeconfig", str(fake.kubeconfig(tmp_path))]
    argv += ["--as", "jane", "--as-group", "ops", "--as-group", "audit"]
    assert main([*argv, "--request-timeout", "1m30s"]) == 0
    assert "No workloads found" in capsys.readouterr().err
    assert "/apis/apps/v1/namespaces/team-a/deployments" in fake.paths()
    for seen in fake.seen:
        assert seen.headers.get_all("Impersonate-User") == ["jane"]
        assert seen.headers.get_all("Impersonate-Group") == ["ops", "audit"]
        assert seen.query["timeout"] == ["1m30s"]


def test_a_slow_api_server_is_given_up_after_request_timeout(
    fake: FakeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake.delay = 5.0
    argv = ["approve", "configmap/web", "--kubeconfig", str(fake.kubeconfig(tmp_path))]
    assert main([*argv, "--request-timeout", "1"]) == 2
    err = capsys.readouterr().err
    assert "configpin approve: configmap/web: PATCH" in err
    assert "ReadTimeoutError" in err
    [seen] = fake.seen
    assert seen.query["timeout"] == ["1s"]
