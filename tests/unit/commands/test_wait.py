"""`configpin wait` (webhook/commands/wait.py) with no cluster: its command line, its timeout,
the sources it reads from files, and its loop over a reader that answers as the API server and
configpin's controller would (a status about the source as it stands, or about an earlier
version of it). Against the real API server: tests/integration/test_wait.py."""

from __future__ import annotations

import io
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from webhook.commands import wait
from webhook.commands.cli import build_parser, main
from webhook.commands.wait import (
    EXIT_DELIVERED,
    EXIT_ERROR,
    EXIT_FAILED,
    Target,
    UsageError,
    combine,
    judge,
    parse_target,
    parse_timeout,
    sources_in_files,
    wait_for,
)
from webhook.core.model import SourceKind
from webhook.core.rollouts import (
    ChangeView,
    MemberState,
    MemberView,
    RolloutReason,
    rollout_status,
)
from webhook.kube.errors import Forbidden, KubeError, NotFound

NS = "shop"
CFG = Target(SourceKind.CONFIGMAP, NS, "cfg")
DB = Target(SourceKind.SECRET, NS, "db")
UID = "6f7a0c1e-0000-4000-8000-000000000001"
NOW = "2026-05-01T10:00:00Z"


# -- the command line --------------------------------------------------------------------------


def _args(*argv: str) -> Any:
    return build_parser(["wait", *argv]).parse_args(["wait", *argv])


def test_the_command_line_takes_sources_files_a_namespace_and_a_timeout() -> None:
    args = _args("configmap/cfg", "secret/db", "-n", NS, "-f", "a.yaml", "-f", "-")
    assert args.command == "wait"
    assert args.sources == ["configmap/cfg", "secret/db"]
    assert args.namespace == NS
    assert args.filename == ["a.yaml", "-"]
    assert args.timeout == "5m"
    assert args.kubeconfig is None and args.context is None
    args = _args("-f", "dir", "--timeout", "30s", "--kubeconfig", "kc", "--context", "prod")
    assert args.sources == [] and args.timeout == "30s"
    assert str(args.kubeconfig) == "kc" and args.context == "prod"


@pytest.mark.parametrize(
    ("text", "kind", "name"),
    [
        ("configmap/cfg", SourceKind.CONFIGMAP, "cfg"),
        ("cm/cfg", SourceKind.CONFIGMAP, "cfg"),
        ("ConfigMaps/cfg", SourceKind.CONFIGMAP, "cfg"),
        ("secret/db", SourceKind.SECRET, "db"),
    ],
)
def test_a_source_is_named_as_kubectl_names_it(text: str, kind: SourceKind, name: str) -> None:
    assert parse_target(text) == (kind, name)


@pytest.mark.parametrize("text", ["cfg", "deployment/web", "configmap/", "configmap/a/b", "/cfg"])
def test_anything_else_is_a_usage_error(text: str) -> None:
    with pytest.raises(UsageError, match="configmap/NAME or secret/NAME"):
        parse_target(text)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30s", 30.0),
        ("5m", 300.0),
        ("1h", 3600.0),
        ("1h30m", 5400.0),
        ("1.5m", 90.0),
        ("500ms", 0.5),
        ("90", 90.0),
        ("2.5", 2.5),
        ("0", 0.0),
    ],
)
def test_a_timeout_is_a_go_duration_or_plain_seconds(text: str, seconds: float) -> None:
    assert parse_timeout(text) == seconds


@pytest.mark.parametrize("text", ["", "5x", "m", "-5s", "-1", "inf", "nan", "5 m"])
def test_a_timeout_that_is_no_duration_is_a_usage_error(text: str) -> None:
    with pytest.raises(UsageError, match="--timeout"):
        parse_timeout(text)


def test_usage_errors_exit_2_before_any_cluster_is_asked(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    nowhere = ["--kubeconfig", str(tmp_path / "none")]
    assert main(["wait", *nowhere]) == EXIT_ERROR
    assert "configmap/NAME, secret/NAME or -f FILE expected" in capsys.readouterr().err
    assert main(["wait", "deployment/web", *nowhere]) == EXIT_ERROR
    assert "'deployment/web'" in capsys.readouterr().err
    assert main(["wait", "cm/cfg", "--timeout", "soon", *nowhere]) == EXIT_ERROR
    assert "--timeout: 'soon'" in capsys.readouterr().err
    only_workloads = tmp_path / "app.yaml"
    only_workloads.write_text("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\n")
    assert main(["wait", "-f", str(only_workloads), *nowhere]) == EXIT_ERROR
    assert "no ConfigMap or Secret in the files given" in capsys.readouterr().err
    assert main(["wait", "-f", str(tmp_path / "missing.yaml"), *nowhere]) == EXIT_ERROR
    assert "missing.yaml" in capsys.readouterr().err
    assert main(["wait", "cm/cfg", *nowhere]) == EXIT_ERROR  # the kubeconfig is not there
    assert "configpin wait: no cluster" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("codes", "code"),
    [([], 0), ([0, 0], 0), ([0, 1], 1), ([1, 0, 2], 2), ([2, 0], 2), ([1, 1], 1)],
)
def test_the_exit_status_is_the_highest_of_the_sources(codes: list[int], code: int) -> None:
    assert combine(codes) == code


# -- -f: files, folders, standard input --------------------------------------------------------

_MANIFESTS = """\
apiVersion: v1
kind: ConfigMap
metadata: {name: web-config}
data: {a: "1"}
---
apiVersion: v1
kind: Secret
metadata: {name: web-db, namespace: data}
stringData: {password: x}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
---
apiVersion: v1
kind: List
items:
  - {apiVersion: v1, kind: ConfigMap, metadata: {name: listed}}
  - {apiVersion: v1, kind: Service, metadata: {name: svc}}
"""
_FOUND = [
    (SourceKind.CONFIGMAP, None, "web-config"),
    (SourceKind.SECRET, "data", "web-db"),
    (SourceKind.CONFIGMAP, None, "listed"),
]


def test_a_file_gives_its_configmaps_and_secrets_with_the_namespace_it_names(
    tmp_path: Path,
) -> None:
    file = tmp_path / "app.yaml"
    file.write_text(_MANIFESTS)
    assert sources_in_files([str(file)]) == _FOUND


def test_a_folder_gives_those_of_every_manifest_in_it_recursively(tmp_path: Path) -> None:
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "app.yaml").write_text(_MANIFESTS)
    (tmp_path / "z.json").write_text(
        '{"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "json-secret"}}'
    )
    (tmp_path / "notes.txt").write_text("kind: ConfigMap\n")
    assert sources_in_files([str(tmp_path)]) == [
        *_FOUND,
        (SourceKind.SECRET, None, "json-secret"),
    ]


def test_standard_input_is_read_for_dash() -> None:
    assert sources_in_files(["-"], io.BytesIO(_MANIFESTS.encode())) == _FOUND


def test_what_cannot_be_read_is_a_usage_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [1\n")
    with pytest.raises(UsageError, match=r"bad\.yaml"):
        sources_in_files([str(bad)])
    nameless = tmp_path / "nameless.yaml"
    nameless.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {}\n")
    with pytest.raises(UsageError, match=r"no metadata\.name"):
        sources_in_files([str(nameless)])


def test_a_source_named_twice_is_waited_for_once() -> None:
    targets = wait._targets(
        [(SourceKind.CONFIGMAP, "cfg")],
        [(SourceKind.CONFIGMAP, None, "cfg"), (SourceKind.CONFIGMAP, "other", "cfg")],
        NS,
    )
    assert targets == [CFG, Target(SourceKind.CONFIGMAP, "other", "cfg")]


class _Api:
    def __enter__(self) -> _Api:
        return self

    def __exit__(self, *_: object) -> None:
        return None


def _run_command(
    monkeypatch: pytest.MonkeyPatch, argv: list[str], waited: Callable[..., int]
) -> tuple[int, list[Any]]:
    """`configpin wait ARGV` with a kubeconfig whose context names namespace `ctx`, and the
    loop replaced by `waited`; what it was asked to wait for."""
    asked: list[Any] = []

    def wait_for(reader: Any, targets: Any, timeout: float) -> int:
        asked.append((list(targets), timeout))
        return waited()

    monkeypatch.setattr(wait, "connect_from_args", lambda args: (_Api(), "ctx"))
    monkeypatch.setattr(wait, "Kube", lambda api, timeout: None)
    monkeypatch.setattr(wait, "wait_for", wait_for)
    return main(["wait", *argv]), asked


def test_a_source_is_looked_for_in_its_manifests_namespace_else_n_else_the_contexts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    file = tmp_path / "app.yaml"
    file.write_text(_MANIFESTS)
    code, asked = _run_command(monkeypatch, ["secret/db", "-f", str(file)], lambda: 0)
    assert code == 0
    assert asked == [
        (
            [
                Target(SourceKind.SECRET, "ctx", "db"),
                Target(SourceKind.CONFIGMAP, "ctx", "web-config"),
                Target(SourceKind.SECRET, "data", "web-db"),
                Target(SourceKind.CONFIGMAP, "ctx", "listed"),
            ],
            300.0,
        )
    ]
    code, asked = _run_command(
        monkeypatch, ["-f", str(file), "-n", NS, "--timeout", "10m"], lambda: 1
    )
    assert code == 1
    assert [str(t) + "@" + t.namespace for t in asked[0][0]] == [
        "configmap/web-config@shop",
        "secret/web-db@data",
        "configmap/listed@shop",
    ]
    assert asked[0][1] == 600.0


def test_an_interrupted_wait_exits_130_not_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def interrupted() -> int:
        raise KeyboardInterrupt

    code, _ = _run_command(monkeypatch, ["configmap/cfg"], interrupted)
    assert code == wait.EXIT_INTERRUPTED == 130
    assert "configpin wait: interrupted" in capsys.readouterr().err


# -- what a status says ------------------------------------------------------------------------


def _source(version: str, uid: str = UID) -> dict[str, Any]:
    return {"metadata": {"name": "cfg", "uid": uid, "resourceVersion": version}}


def _member(state: MemberState, reason: RolloutReason | None = None, message: str = "") -> Any:
    return MemberView(NS, "Deployment", "web", 1, state, reason, message)


def _rollout(
    version: str,
    *members: MemberView,
    uid: str = UID,
    generation: int = 1,
    observed: int | None = None,
) -> dict[str, Any]:
    status = rollout_status(
        source="configmap/cfg",
        uid=uid,
        resource_version=version,
        generation=generation if observed is None else observed,
        change=ChangeView(content="c-" + version, keys=("a",)),
        waves=[list(members)],
        consumers=max(1, len(members)),
        now=NOW,
    )
    return {"metadata": {"name": "configmap-cfg", "generation": generation}, "status": status}


READY = (_member(MemberState.COMPLETE),)
ROLLING = (_member(MemberState.ROLLING, message="1 of 2 updated pods ready"),)
APPROVAL = (
    _member(MemberState.WAITING, RolloutReason.AWAITING_APPROVAL, "approve it: kubectl ..."),
)
ROLLED_BACK = (_member(MemberState.FAILED, RolloutReason.ROLLED_BACK, "CrashLoopBackOff"),)


def test_ready_about_the_source_as_it_stands_is_delivered() -> None:
    look = judge(_source("7"), _rollout("7", *READY))
    assert look.code == EXIT_DELIVERED
    assert look.said == "Ready: delivered: 1 of 1 consumers run the content"


def test_ready_about_an_earlier_version_or_object_is_no_verdict() -> None:
    look = judge(_source("8"), _rollout("7", *READY))
    assert look.code is None
    assert "about resourceVersion 7, not 8" in look.said
    look = judge(_source("7", uid="new"), _rollout("7", *READY))
    assert look.code is None and "an earlier object of that name" in look.said


def test_stalled_is_failed_with_its_reason_and_message() -> None:
    look = judge(_source("7"), _rollout("7", *ROLLED_BACK))
    assert look.code == EXIT_FAILED
    assert look.said.startswith("Stalled RolledBack: rolled back: deployment/web: CrashLoop")


def test_reconciling_is_not_done_and_says_why_with_its_wave_and_ready_count() -> None:
    look = judge(_source("7"), _rollout("7", *APPROVAL))
    assert look.code is None
    assert look.said == (
        "Reconciling AwaitingApproval: waits for an approval: deployment/web: approve it: "
        "kubectl ... (wave 1/1, ready 0/1)"
    )


def test_a_status_behind_its_generation_or_none_at_all_is_no_verdict() -> None:
    look = judge(_source("7"), _rollout("7", *READY, generation=2, observed=1))
    assert look.code is None and "generation" in look.said
    look = judge(_source("7"), None)
    assert look.code is None and look.absent
    look = judge(_source("7"), {"metadata": {"generation": 1}})
    assert look.code is None and "describe resourceVersion 7" in look.said


# -- the loop ----------------------------------------------------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds > 0
        self.now += seconds


Answer = Mapping[str, Any] | None | Exception
Script = Callable[[float], tuple[Answer, Answer]]


class _Reader:
    """The API server as the loop reads it: for each source, a script of what the source and
    its ConfigRollout are at each moment (seconds since the start)."""

    def __init__(self, clock: _Clock, scripts: dict[Target, Script], served: bool = True):
        self.clock = clock
        self.start = clock.now
        self.scripts = scripts
        self.is_served = served
        self.reads = 0
        self.consumers: dict[Target, bool | None] = {}  # (default: consumed)

    def _at(self, target: Target) -> tuple[Answer, Answer]:
        return self.scripts[target](self.clock.now - self.start)

    def source(self, target: Target) -> Mapping[str, Any]:
        self.reads += 1
        answer = self._at(target)[0]
        if isinstance(answer, Exception):
            raise answer
        assert answer is not None
        return answer

    def rollout(self, target: Target) -> Mapping[str, Any] | None:
        answer = self._at(target)[1]
        if isinstance(answer, Exception):
            raise answer
        return answer

    def served(self) -> bool:
        return self.is_served

    def consumed(self, target: Target) -> bool | None:
        return self.consumers.get(target, True)


def _run(
    scripts: dict[Target, Script],
    timeout: float = 60.0,
    served: bool = True,
    consumers: dict[Target, bool | None] | None = None,
) -> tuple[int, str, str, float, _Reader]:
    clock = _Clock()
    reader = _Reader(clock, scripts, served)
    reader.consumers = dict(consumers or {})
    out, err = io.StringIO(), io.StringIO()
    start = clock.now
    code = wait_for(
        reader, list(scripts), timeout, clock=clock, sleep=clock.sleep, out=out, err=err
    )
    return code, out.getvalue(), err.getvalue(), clock.now - start, reader


def test_it_waits_past_an_earlier_ready_for_the_change_the_source_holds_now() -> None:
    """Started the instant after an apply: the status still says Ready about the version before;
    configpin then describes the new one, rolling, and then Ready."""

    def script(t: float) -> tuple[Answer, Answer]:
        if t < 3:
            return _source("8"), _rollout("7", *READY)
        if t < 6:
            return _source("8"), _rollout("8", *ROLLING)
        return _source("8"), _rollout("8", *READY)

    code, out, err, took, _ = _run({CFG: script})
    assert code == EXIT_DELIVERED
    assert 6 <= took <= 7
    assert out == "configmap/cfg delivered (Ready: delivered: 1 of 1 consumers run the content)\n"
    assert err.splitlines() == [
        "configmap/cfg: its ConfigRollout is about resourceVersion 7, not 8 (the source as it "
        "stands): waiting for configpin to describe that",
        "configmap/cfg: Reconciling Rolling: rolling: deployment/web: 1 of 2 updated pods ready "
        "(wave 1/1, ready 0/1)",
    ]  # once each: a line when what it says changes


def test_a_newer_change_while_it_waits_is_the_one_it_waits_for() -> None:
    def script(t: float) -> tuple[Answer, Answer]:
        if t < 3:
            return _source("8"), _rollout("8", *ROLLING)
        if t < 5:  # changed again: Ready about 8 is no longer the change it holds
            return _source("9"), _rollout("8", *READY)
        return _source("9"), _rollout("9", *ROLLED_BACK)

    code, out, _, took, _ = _run({CFG: script})
    assert code == EXIT_FAILED and 5 <= took <= 6
    assert out.startswith("configmap/cfg failed (Stalled RolledBack: rolled back:")


def test_the_timeout_exits_2_naming_what_was_not_done_and_what_it_last_said() -> None:
    code, out, err, took, _ = _run(
        {CFG: lambda t: (_source("8"), _rollout("8", *APPROVAL))}, timeout=3
    )
    assert code == EXIT_ERROR and took == 3
    assert out == ""
    assert "configpin wait: timed out after 3s" in err
    assert "configpin wait: configmap/cfg not done: Reconciling AwaitingApproval:" in err


def test_timeout_0_looks_once() -> None:
    code, _, _, took, reader = _run({CFG: lambda t: (_source("7"), _rollout("7", *READY))}, 0)
    assert (code, took, reader.reads) == (EXIT_DELIVERED, 0, 1)
    code, _, err, took, reader = _run({CFG: lambda t: (_source("7"), None)}, 0)
    assert (code, took, reader.reads) == (EXIT_ERROR, 0, 1)
    assert "timed out after 0s" in err


def test_several_sources_are_waited_for_together_and_the_highest_code_wins() -> None:
    def db(t: float) -> tuple[Answer, Answer]:
        return _source("3"), _rollout("3", *(ROLLING if t < 4 else ROLLED_BACK))

    code, out, _, took, _ = _run({CFG: lambda t: (_source("7"), _rollout("7", *READY)), DB: db})
    assert code == EXIT_FAILED and 4 <= took <= 5
    assert out.splitlines()[0].startswith("configmap/cfg delivered (Ready:")
    assert out.splitlines()[1].startswith("secret/db failed (Stalled RolledBack:")


def test_sources_of_several_namespaces_are_named_with_their_namespace() -> None:
    other = Target(SourceKind.CONFIGMAP, "other", "cfg")
    ready = lambda t: (_source("7"), _rollout("7", *READY))  # noqa: E731
    code, out, _, _, _ = _run({CFG: ready, other: ready})
    assert code == EXIT_DELIVERED
    assert [line.split(" (")[0] for line in out.splitlines()] == [
        "configmap/cfg in shop delivered",
        "configmap/cfg in other delivered",
    ]


def test_a_missing_source_ends_the_wait_at_once_with_2() -> None:
    gone = NotFound("GET /api/v1/namespaces/shop/configmaps/db", 404, "NotFound")
    code, out, err, took, _ = _run(
        {
            CFG: lambda t: (_source("7"), _rollout("7", *ROLLING)),
            DB: lambda t: (gone, None),
        }
    )
    assert code == EXIT_ERROR and took == 0 and out == ""
    assert "configpin wait: secret/db in namespace shop not found" in err
    assert "configmap/cfg not done: Reconciling Rolling" in err


@pytest.mark.parametrize(
    ("refused", "right"),
    [
        ("source", "wait needs 'get' on configmaps in namespace shop"),
        ("rollout", "wait needs 'get' on configrollouts.configpin.io in namespace shop"),
    ],
)
def test_a_refusal_exits_2_naming_the_right_it_lacks(refused: str, right: str) -> None:
    no = Forbidden("GET ...", 403, 'Forbidden: configmaps "cfg" is forbidden: User "u" cannot')

    def script(t: float) -> tuple[Answer, Answer]:
        return (no, None) if refused == "source" else (_source("7"), no)

    code, _, err, _, _ = _run({CFG: script})
    assert code == EXIT_ERROR
    assert right in err
    assert "is forbidden" in err  # the API server's own answer


def test_no_configrollout_is_waited_for_and_after_a_while_said_once() -> None:
    code, out, err, took, _ = _run({CFG: lambda t: (_source("7"), None)}, timeout=30)
    assert code == EXIT_ERROR and took == 30 and out == ""
    hints = [line for line in err.splitlines() if "no ConfigRollout configmap-cfg" in line]
    assert len(hints) == 1
    assert "after 10s" in hints[0]
    assert "configpin.io/enabled=true" in hints[0] and "consume it" in hints[0]


def test_the_hint_says_so_when_the_cluster_does_not_serve_configrollouts() -> None:
    _, _, err, _, _ = _run({CFG: lambda t: (_source("7"), None)}, timeout=12, served=False)
    assert "does not serve configrollouts.configpin.io" in err


def test_a_configrollout_that_appears_late_is_read() -> None:
    def script(t: float) -> tuple[Answer, Answer]:
        return _source("7"), (None if t < 4 else _rollout("7", *READY))

    code, out, err, took, _ = _run({CFG: script})
    assert code == EXIT_DELIVERED and 4 <= took <= 5
    assert "delivered" in out and err == ""


def test_a_connection_fault_after_the_first_look_is_waited_out() -> None:
    fault = KubeError("GET ...", None, "ProtocolError")

    def script(t: float) -> tuple[Answer, Answer]:
        if 1 <= t < 3:
            return fault, None
        return _source("7"), _rollout("7", *(ROLLING if t < 3 else READY))

    code, _, err, _, _ = _run({CFG: script})
    assert code == EXIT_DELIVERED
    assert "configmap/cfg: cannot read it now: GET ...: ProtocolError" in err


def test_a_connection_fault_at_the_first_look_exits_2_at_once() -> None:
    fault = KubeError("GET /api/v1/namespaces/shop/configmaps/cfg", None, "MaxRetryError")
    code, _, err, took, _ = _run({CFG: lambda t: (fault, None)})
    assert code == EXIT_ERROR and took == 0
    assert "configpin wait: configmap/cfg: GET /api/v1/namespaces/shop/configmaps/cfg" in err


@pytest.mark.parametrize(
    ("consumed", "code"), [(False, EXIT_DELIVERED), (None, EXIT_ERROR), (True, EXIT_ERROR)]
)
def test_with_no_configrollout_only_a_source_nothing_consumes_is_done(
    consumed: bool | None, code: int
) -> None:
    """No ConfigRollout: a source no workload consumes has nothing to deliver (0 at once);
    one consumed, or where the user may not list the workloads, is waited for (here until the
    timeout)."""
    code_, out, _err, took, _ = _run(
        {CFG: lambda _t: (_source("8"), None)}, timeout=5, consumers={CFG: consumed}
    )
    assert code_ == code
    if code == EXIT_DELIVERED:
        assert took < 1
        assert out == "configmap/cfg delivered (no workload consumes it: nothing to deliver)\n"
    else:
        assert took >= 5
