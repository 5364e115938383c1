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
from webhook.process.config import Settings, env_name, flag_name, settings_markdown

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
    for field, info in Settings.model_fields.items():
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
    assert settings.port == 9443
    assert settings.controller is False
    assert settings.manifests == [Path("a"), Path("b")]


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        (["--port", "70000"], {}, "--port (CONFIGPIN_PORT): Input should be less than or equal"),
        ([], {"CONFIGPIN_COALESCE_WINDOW": "soon"}, "--coalesce-window (CONFIGPIN_COALESCE_"),
        (["--lease-duration", "0"], {}, "--lease-duration (CONFIGPIN_LEASE_DURATION)"),
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
        description = Settings.model_fields[field].description or ""
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
