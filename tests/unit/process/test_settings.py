"""Settings have one source of truth, the Settings model: the `serve` flags, `--help`, the
table in docs/settings.md and the chart's values.yaml comments are made from it or checked
against it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from webhook.commands.cli import build_parser, main
from webhook.core.budget import Budget
from webhook.core.durations import HOUR, SECOND
from webhook.core.waves import WaveStep
from webhook.process.config import (
    FIELDS,
    GROUPS,
    Settings,
    env_name,
    flag_name,
    flags_of,
    settings_markdown,
)

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "charts" / "configpin"


def _words(text: str) -> str:
    return " ".join(text.split())


def test_every_setting_is_a_flag_with_its_description_default_and_variable() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "webhook", "serve", "--help"],
        capture_output=True,
        text=True,
        check=True,
        env={"COLUMNS": "400", "PATH": ""},
    )
    text = _words(proc.stdout)
    for field, info in FIELDS.items():
        assert flag_name(field) in text, field
        assert env_name(field) in text, field
        assert _words(info.description or "") in text, field
    assert "[default: 8443; env CONFIGPIN_PORT]" in text


def test_flags_parse_into_settings() -> None:
    args = build_parser().parse_args(
        ["serve", "--port", "9443", "--no-controller", "--manifests", "a", "--manifests", "b"]
    )
    given = {k: v for k, v in vars(args).items() if k != "command" and v is not None}
    settings = Settings(**given)
    assert settings.server.port == 9443
    assert settings.controller.enabled is False
    assert settings.cluster.manifests == [Path("a"), Path("b")]


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        (["--port", "70000"], {}, "--port (CONFIGPIN_PORT): Input should be less than or equal"),
        ([], {"CONFIGPIN_COALESCE_WINDOW": "soon"}, "--coalesce-window (CONFIGPIN_COALESCE_"),
        (["--lease-duration", "0"], {}, "--lease-duration (CONFIGPIN_LEASE_DURATION)"),
        (["--rollout-waves", "1,soon"], {}, "--rollout-waves (CONFIGPIN_ROLLOUT_WAVES): Value"),
        (
            [],
            {"CONFIGPIN_ROLLOUT_BUDGET": "6 a day"},
            "--rollout-budget (CONFIGPIN_ROLLOUT_BUDGET)",
        ),
        (["--rollout-windows", "[x"], {}, "--rollout-windows (CONFIGPIN_ROLLOUT_WINDOWS)"),
        (["--workload-kinds", "x"], {}, "--workload-kinds (CONFIGPIN_WORKLOAD_KINDS)"),
        (["--pin-owned-by", "deployment"], {}, "--pin-owned-by (CONFIGPIN_PIN_OWNED_BY)"),
        (["--tls-cipher-suites", "TLS_NONE"], {}, "--tls-cipher-suites (CONFIGPIN_TLS_CIPHER_"),
        # a list's variable takes JSON: anything else is refused as a list, naming the flag
        ([], {"CONFIGPIN_EXCLUDE_NAMESPACES": "a,b"}, "--exclude-namespaces (CONFIGPIN_EXCLUDE"),
    ],
)
def test_a_wrong_value_stops_serve_naming_the_flag(
    argv: list[str],
    env: dict[str, str],
    expected: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main(["serve", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("configpin serve: ")
    assert expected in err
    assert "Traceback" not in err


def test_a_wrong_choice_is_refused_by_the_parser(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--mode", "sometimes"])
    assert exited.value.code == 2
    assert "--mode: invalid choice: 'sometimes'" in capsys.readouterr().err


# Every flag of `configpin serve`, by the group the code reads it from (settings.rollout.waves):
# the flags and their variables stay flat, as the chart and SPEC name them.
GROUPED = {
    "cluster": [
        "kubeconfig", "manifests", "namespace", "namespace_selector", "exclude_namespaces",
    ],
    "admission": [
        "mode", "strict", "max_sources", "read_deadline", "read_workers", "digest_key_file",
        "digest_key_secret",
    ],
    "snapshots": ["snapshots", "snapshot_grace_period"],
    "workloads": ["workload_kinds", "argo_rollouts", "pin_owned_by"],
    "rollout": [
        "rollout_waves", "max_rolling", "rollout_windows", "rollout_budget", "coalesce_window",
        "min_rollout_interval", "catch_up_window", "refresh_pods",
    ],
    "controller": [
        "controller", "leader_elect", "lease_name", "lease_duration", "controller_qps",
        "controller_burst", "resync_period",
    ],
    "server": [
        "host", "port", "tls_cert", "tls_key", "client_ca", "tls_cipher_suites",
        "tls_handshake_timeout", "header_timeout", "body_timeout", "keep_alive_timeout",
        "max_connections", "max_header_bytes", "shutdown_delay", "drain_timeout",
    ],
    "certs": [
        "certs_dir", "self_signed_certs", "cert_secret", "service_name", "webhook_config_name",
    ],
    "logging": ["log_level", "log_format"],
}  # fmt: skip


def test_each_group_holds_the_flags_of_what_it_sets() -> None:
    assert {name: list(flags_of(group)) for name, group in GROUPS.items()} == GROUPED
    assert list(FIELDS) == [field for fields in GROUPED.values() for field in fields]
    assert len(FIELDS) == 53


def test_texts_are_parsed_once_into_the_group_the_code_reads() -> None:
    settings = Settings(
        rollout_waves="1,approve,100%",
        rollout_budget=" 2/30s ",
        rollout_windows='[{"kind": "deny", "schedule": "0 22 * * 5", "duration": "60h"}]',
        tls_cipher_suites=" TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256 ,",
        pin_owned_by="Foo.example.com",
        min_rollout_interval=7,
        controller_qps=5,
    )
    rollout = settings.rollout
    assert rollout.waves == (WaveStep(count=1), WaveStep(approve=True), WaveStep(fraction=1.0))
    assert rollout.budget == Budget(2, 30 * SECOND)
    assert rollout.budget_text == "2/30s"  # as written, for status to quote
    [window] = rollout.windows
    assert (window.kind, window.seconds) == ("deny", 60 * HOUR // SECOND)
    assert (rollout.min_interval, settings.controller.qps) == (7, 5)
    assert settings.server.cipher_suites == ("TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",)
    assert settings.workloads.owner_kinds == frozenset({("example.com", "Foo")})
    # parsed at validation, not on each read: the same objects every time
    assert settings.rollout is rollout
    assert rollout.waves is settings.rollout.waves
    assert rollout.windows is settings.rollout.windows
    assert settings.workloads.custom_kinds is settings.workloads.custom_kinds
    assert Settings().rollout.budget_text == "6/1h"


def test_the_flat_variable_sets_the_grouped_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONFIGPIN_ROLLOUT_WAVES", "off")
    monkeypatch.setenv("CONFIGPIN_CONTROLLER", "false")
    monkeypatch.setenv("CONFIGPIN_SNAPSHOTS", "false")
    monkeypatch.setenv("CONFIGPIN_EXCLUDE_NAMESPACES", '["tools"]')
    monkeypatch.setenv("configpin_log_level", "debug")  # (any case, as before)
    monkeypatch.setenv("CONFIGPIN_PORT", "9443")
    settings = Settings(port=10443)  # a flag wins over the environment
    assert settings.rollout.waves is None
    assert settings.controller.enabled is False
    assert settings.snapshots.enabled is False
    assert settings.cluster.exclude_namespaces == ["tools"]
    assert "tools" in settings.cluster.excluded_namespaces
    assert settings.logging.level == "debug"
    assert settings.server.port == 10443
    with pytest.raises(ValueError, match="not a flag"):
        Settings(rollout={"rollout_waves": "off"})


def test_help_shows_the_flags_under_their_groups_headings() -> None:
    text = _serve_help()
    headings = [text.index(f"\n{group.title}:\n") for group in GROUPS.values()]
    assert headings == sorted(headings)
    section = text[text.index("\nRollouts:\n") : text.index("\nController:\n")]
    assert "--rollout-waves ROLLOUT_WAVES" in section
    assert "--max-rolling" in section
    assert "--port" not in section


def _serve_help() -> str:
    parser = build_parser(["serve"])
    sub = next(a for a in parser._actions if a.dest == "command")
    return sub.choices["serve"].format_help()  # type: ignore[attr-defined]


def test_the_docs_settings_table_is_the_models() -> None:
    page = (REPO / "docs" / "settings.md").read_text()
    match = re.search(r"<!-- settings:begin[^>]*-->\n(.*?)<!-- settings:end -->", page, re.S)
    assert match, "docs/settings.md lost its settings markers"
    assert match[1] == settings_markdown(), (
        "docs/settings.md's settings table drifted from webhook/process/config.py: replace it "
        "with `python -c 'from webhook.process.config import settings_markdown; "
        "print(settings_markdown())'`"
    )


def _chart_flags() -> dict[str, str]:
    """values path -> flag, for every flag the chart's Deployment sets straight from a value."""
    template = (CHART / "templates" / "deployment.yaml").read_text()
    found = dict(
        (value, flag)
        for flag, value in re.findall(r"- (--[a-z-]+)=\{\{ \.Values\.([A-Za-z.]+) \}\}", template)
    )
    found |= {
        value: flag
        for flag, value in re.findall(
            r'ternary "(--[a-z-]+)" "--no-[a-z-]+" \.Values\.([A-Za-z.]+)', template
        )
    }
    # (a list in values.yaml, given to the flag as JSON)
    found |= {
        value: flag
        for flag, value in re.findall(
            r'printf "(--[a-z-]+)=%s" \(toJson \.Values\.([A-Za-z.]+)\)', template
        )
    }
    return found


def _comment_above(values_text: str, dotted: str) -> str:
    """The comment block right above key `dotted` (a.b.c) in values.yaml."""
    lines = values_text.splitlines()
    wanted = dotted.split(".")
    stack: list[tuple[int, str]] = []
    for i, line in enumerate(lines):
        m = re.match(r"^(\s*)([A-Za-z][A-Za-z0-9]*):", line)
        if not m:
            continue
        indent = len(m[1])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, m[2]))
        if [k for _, k in stack] == wanted:
            comment: list[str] = []
            j = i - 1
            while j >= 0 and lines[j].strip().startswith("#"):
                comment.insert(0, lines[j].strip().lstrip("#").strip())
                j -= 1
            return " ".join(comment)
    raise AssertionError(f"values.yaml has no {dotted}")


def test_chart_values_say_what_their_flag_says() -> None:
    values_text = (CHART / "values.yaml").read_text()
    mapping = _chart_flags()
    assert {"mode", "strict", "controller.coalesceWindowSeconds"} <= set(mapping)
    assert {"controller.rolloutWindows", "controller.rolloutBudget"} <= set(mapping)
    for value, flag in mapping.items():
        field = flag.removeprefix("--").replace("-", "_")
        description = FIELDS[field].description or ""
        assert _words(description) in _words(_comment_above(values_text, value)), (
            f"values.yaml {value} sets {flag}: its comment must say {description!r}"
        )


def test_json_logs_carry_decision_fields(capsys: pytest.CaptureFixture[str]) -> None:
    import json
    import logging

    from webhook.process.logs import setup_logging

    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        setup_logging("info", "json")
        logging.getLogger("configpin.test").info(
            "rolled %s", "web", extra={"workload": "Deployment/team/web", "source": "configmap/a"}
        )
        try:
            raise ValueError("boom")
        except ValueError:
            logging.getLogger("configpin.test").exception("failed")
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)
    first, second = (json.loads(line) for line in capsys.readouterr().err.splitlines())
    assert first["message"] == "rolled web"
    assert first["level"] == "info"
    assert first["logger"] == "configpin.test"
    assert first["workload"] == "Deployment/team/web"
    assert first["source"] == "configmap/a"
    assert "time" in first
    assert "ValueError: boom" in second["exception"]
