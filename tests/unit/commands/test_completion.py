"""Shell completion (webhook.commands.completion) and the name help gives: `configpin completion
bash|zsh` prints a script that asks `configpin __complete` what fits; kubectl (1.26 and newer)
asks `kubectl_complete-configpin` the same for `kubectl configpin ...`; run as the plugin, help
and usage say `kubectl configpin`. Before, there was no completion, and the plugin's help said
`configpin`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from webhook.commands.cli import build_parser, main, program
from webhook.commands.completion import NO_FILE, NO_SPACE, complete

BIN = Path(sys.executable).parent  # where configpin, kubectl-configpin and the completer are


def _complete(*words: str) -> tuple[list[str], int]:
    lines, directive = complete(build_parser(list(words)), list(words))
    return [line.split("\t")[0] for line in lines], directive


def _env(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "HOME": str(tmp_path),
        "KUBECONFIG": str(tmp_path / "none"),
    }


def test_commands_flags_and_their_values_complete() -> None:
    assert _complete("st") == (["status"], NO_FILE)
    names, _ = _complete("")
    assert {"status", "plan", "approve", "wait", "dashboard", "version", "completion"} <= set(names)
    assert "__complete" not in names
    flags, directive = _complete("status", "--")
    assert {"--as", "--as-group", "--request-timeout", "--kubeconfig", "--output"} <= set(flags)
    assert directive == NO_FILE
    assert _complete("status", "-o", "") == (["wide", "json", "yaml"], NO_FILE)
    assert _complete("status", "--output=j") == (["--output=json"], NO_FILE)
    assert _complete("version", "-o", "y") == (["yaml"], NO_FILE)
    assert _complete("completion", "") == (["bash", "zsh"], NO_FILE)
    assert _complete("serve", "--mode", "s") == (["snapshot"], NO_FILE)
    assert _complete("certs", "g") == (["generate"], NO_FILE)


def test_a_source_completes_its_kind_and_a_file_flag_leaves_it_to_the_shell() -> None:
    # the kind, with no space after it: the name comes next
    assert _complete("approve", "") == (["configmap/", "secret/"], NO_FILE | NO_SPACE)
    assert _complete("wait", "configmap/web", "s") == (["secret/"], NO_FILE | NO_SPACE)
    # file names: nothing from us, and file completion left on (directive 0)
    assert _complete("plan", "-f", "") == ([], 0)
    assert _complete("status", "--kubeconfig", "") == ([], 0)
    # a flag's value is not taken for a command or a positional
    assert _complete("status", "-n", "st") == ([], NO_FILE)


def test_context_completes_the_kubeconfigs_contexts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    one.write_text(yaml.safe_dump({"contexts": [{"name": "prod", "context": {}}]}))
    two.write_text(yaml.safe_dump({"contexts": [{"name": "dev", "context": {}}]}))
    monkeypatch.setenv("KUBECONFIG", f"{one}{os.pathsep}{two}")
    assert _complete("status", "--context", "") == (["prod", "dev"], NO_FILE)
    assert _complete("dashboard", "--context", "d") == (["dev"], NO_FILE)


def test_complete_answers_in_cobras_protocol(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["__complete", "status", "--as-g"]) == 0
    said = "with --as: act as a member of this group too"
    assert capsys.readouterr().out == f"--as-group\t{said}\n:4\n"


def test_the_bash_script_completes_configpin(tmp_path: Path) -> None:
    script = tmp_path / "try.sh"
    script.write_text(
        "source <(configpin completion bash)\ntry() { COMP_LINE=$1; COMP_POINT=${#1}; "
        "COMPREPLY=(); _configpin_complete; printf '%s|' \"${COMPREPLY[@]}\"; echo; }\n"
        'try "configpin sta"\ntry "configpin status --output=j"\n'
        'try "configpin approve "\ntry "configpin status --as jane --as-g"\n'
    )
    done = subprocess.run(
        ["bash", str(script)], capture_output=True, text=True, env=_env(tmp_path), check=False
    )
    assert done.returncode == 0, done.stderr
    # readline replaces what follows the last '=': only "json" is put in
    assert done.stdout.splitlines() == ["status|", "json|", "configmap/|secret/|", "--as-group|"]


def test_the_zsh_script(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(BIN / "configpin"), "completion", "zsh"], capture_output=True, text=True, check=True
    )
    assert done.stdout.startswith("#compdef configpin\n")
    assert 'configpin __complete "${(@)words[2,CURRENT]}"' in done.stdout
    if shutil.which("zsh") is None:
        pytest.skip("zsh is not installed here: its script was checked for its text only")
    # zsh's completion functions stood in for: what the script hands them is what zsh shows
    script = tmp_path / "try.zsh"
    script.write_text(
        "compdef() { : }\n"
        '_describe() { print -r -- "${5:-}${(j:|:)${(@P)4}}" }\n'
        "_files() { print -r -- files }\n"
        "source <(configpin completion zsh)\n"
        'try() { words=("$@"); CURRENT=$#; _configpin }\n'
        'try configpin sta\ntry configpin status --output=j\ntry configpin approve ""\n'
        'try configpin plan -f ""\n'
    )
    ran = subprocess.run(
        ["zsh", "-f", str(script)], capture_output=True, text=True, env=_env(tmp_path), check=False
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines() == [
        "status:is each workload pinned, to what, and is it stale?",
        "--output=json",
        "-Sconfigmap/:a ConfigMap|secret/:a Secret",  # no space after the kind
        "files",
    ]


def test_kubectl_completes_the_plugin_through_kubectl_complete_configpin(
    tmp_path: Path,
) -> None:
    completer = BIN / "kubectl_complete-configpin"
    asked = subprocess.run(
        [str(completer), "status", "-o", ""], capture_output=True, text=True, check=False
    )
    assert asked.returncode == 0 and asked.stdout == "wide\njson\nyaml\n:4\n", asked.stderr
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed here: its completer was asked directly only")
    # as kubectl runs it, from PATH, for `kubectl configpin appr<TAB>`
    done = subprocess.run(
        ["kubectl", "__complete", "configpin", "appr"],
        capture_output=True,
        text=True,
        env=_env(tmp_path),
        check=False,
    )
    assert done.stdout.splitlines()[0].split("\t")[0] == "approve", done.stdout + done.stderr


def test_the_plugins_help_and_usage_say_kubectl_configpin(tmp_path: Path) -> None:
    assert program("/usr/local/bin/kubectl-configpin") == "kubectl configpin"
    assert program("/usr/local/bin/configpin") == "configpin"

    def run(name: str, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(BIN / name), *args], capture_output=True, text=True, env=_env(tmp_path)
        )

    assert run("kubectl-configpin", "status", "--help").stdout.startswith(
        "usage: kubectl configpin status "
    )
    assert run("kubectl-configpin", "--help").stdout.startswith("usage: kubectl configpin ")
    wrong = run("kubectl-configpin", "wait", "--request-timeout", "x")
    assert wrong.returncode == 2
    assert wrong.stderr.splitlines()[-1].startswith("kubectl configpin wait: error: argument")
    assert run("configpin", "status", "--help").stdout.startswith("usage: configpin status ")
    # the plugin's script hands over to kubectl's own completion, which asks the completer
    handed = run("kubectl-configpin", "completion", "bash")
    assert handed.stdout.splitlines()[-1] == "source <(kubectl completion bash)"
    assert handed.stderr == ""  # kubectl_complete-configpin is on PATH
