"""Shell completion: `configpin completion bash|zsh` prints a script that asks configpin itself
what fits (`configpin __complete WORD... CURRENT`), and `kubectl_complete-configpin` answers
kubectl the same way for `kubectl configpin ...` (kubectl 1.26 and newer run that executable,
found on PATH, for a plugin's words: its arguments are the words after `kubectl configpin`, the
last one the word being completed).

One answer for every shell, in the protocol of Cobra (kubectl's library), which kubectl relays:
a candidate a line, its description after a tab, then `:DIRECTIVE` (bits: 2 no space after it,
4 no file names when nothing fits). The candidates come from the command line's own parser, so a
new flag or command completes without anyone remembering to; the values a flag takes are its
choices, file names for the flags that name files, and the kubeconfig's contexts for --context.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Final, TextIO

import yaml

from webhook.core.model import SourceKind
from webhook.kube.userflags import kubeconfig_paths

NO_SPACE: Final = 2  # Cobra's ShellCompDirectiveNoSpace
NO_FILE: Final = 4  # Cobra's ShellCompDirectiveNoFileComp
FILES: Final = 0  # Cobra's ShellCompDirectiveDefault: file names when nothing fits
SHELLS: Final = ("bash", "zsh")

# Flags whose value is a file or a folder (besides those typed Path).
_FILE_FLAGS: Final = frozenset(
    {"filename", "kubeconfig", "manifests", "tls_cert", "tls_key", "client_ca", "certs_dir"}
)
# Positionals that take a ConfigMap or Secret as KIND/NAME: the kind is completed.
_SOURCE_POSITIONALS: Final = frozenset({"source", "sources"})


def _short(text: str | None) -> str:
    """A description as a completion list shows one: its first clause, on one line."""
    if not text or text == argparse.SUPPRESS:
        return ""
    text = " ".join(text.replace("%%", "%").split())
    for cut in (" (", "; "):
        text = text.split(cut, 1)[0]
    return text if len(text) <= 80 else text[:79] + "…"


def _subcommands(
    parser: argparse.ArgumentParser,
) -> argparse._SubParsersAction[argparse.ArgumentParser] | None:
    return next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)


def _options(parser: argparse.ArgumentParser) -> Iterator[tuple[str, str]]:
    for action in parser._actions:
        if action.help == argparse.SUPPRESS:
            continue
        for option in action.option_strings:
            if option.startswith("--"):
                yield option, _short(action.help)
    for action in parser._actions:  # the short forms after the long ones, as kubectl lists
        for option in action.option_strings:
            if not option.startswith("--") and action.help != argparse.SUPPRESS:
                yield option, _short(action.help)


def _takes_value(action: argparse.Action) -> bool:
    return action.nargs != 0


def _contexts() -> list[str]:
    """The context names of the user's kubeconfig files, as kubectl completes --context."""
    names: list[str] = []
    for name in kubeconfig_paths(None):
        try:
            doc = yaml.safe_load(Path(name).read_text())
        except (OSError, yaml.YAMLError, UnicodeDecodeError):
            continue
        for entry in (doc or {}).get("contexts") or [] if isinstance(doc, dict) else []:
            if isinstance(entry, dict) and isinstance(entry.get("name"), str):
                names.append(entry["name"])
    return list(dict.fromkeys(names))


def _values(action: argparse.Action) -> tuple[list[tuple[str, str]], int]:
    """What the value of `action`'s flag may be."""
    if action.choices is not None:
        return [(str(c), "") for c in action.choices], NO_FILE
    if action.type is Path or action.dest in _FILE_FLAGS:
        return [], FILES
    if action.dest == "context":
        return [(c, "") for c in _contexts()], NO_FILE
    return [], NO_FILE


def _positional(
    parser: argparse.ArgumentParser, index: int, current: str
) -> tuple[list[tuple[str, str]], int]:
    """The `index`th positional of a command (one that takes many takes every word after)."""
    positionals = [
        a
        for a in parser._actions
        if not a.option_strings and not isinstance(a, argparse._SubParsersAction)
    ]
    action = None
    for i, candidate in enumerate(positionals):
        if i == index or (i < index and candidate.nargs in ("*", "+")):
            action = candidate
            break
    if action is None:
        return [], NO_FILE
    if action.choices is not None:
        return [(str(c), "") for c in action.choices], NO_FILE
    if action.dest in _SOURCE_POSITIONALS and "/" not in current:
        return [(f"{k.value}/", f"a {k.api_kind}") for k in SourceKind], NO_FILE | NO_SPACE
    return [], NO_FILE


def complete(parser: argparse.ArgumentParser, words: Sequence[str]) -> tuple[list[str], int]:
    """The candidates for the last of `words` (the words after the program's name; the last
    one is being typed, "" for a new one), as `name<TAB>description` lines, and the directive."""
    *typed, current = list(words) or [""]
    expecting: argparse.Action | None = None
    positional = 0
    for word in typed:
        if expecting is not None:
            expecting = None
            continue
        if word.startswith("-") and word != "-":
            action = parser._option_string_actions.get(word.split("=", 1)[0])
            if action is not None and _takes_value(action) and "=" not in word:
                expecting = action
            continue
        sub = _subcommands(parser)
        if sub is not None and word in sub.choices:
            parser, positional = sub.choices[word], 0
            continue
        positional += 1
    prefix = ""
    if expecting is not None:
        found, directive = _values(expecting)
    elif current.startswith("--") and "=" in current:
        flag, _, _ = current.partition("=")
        action = parser._option_string_actions.get(flag)
        if action is None or not _takes_value(action):
            return [], NO_FILE
        found, directive = _values(action)
        prefix = flag + "="
    elif current.startswith("-"):
        found, directive = list(_options(parser)), NO_FILE
    elif (sub := _subcommands(parser)) is not None:
        helps = {a.dest: _short(a.help) for a in sub._choices_actions}
        found = [(name, helps.get(name, "")) for name in sub.choices if not name.startswith("_")]
        directive = NO_FILE
    else:
        found, directive = _positional(parser, positional, current)
    lines = [
        f"{prefix}{name}\t{said}" if said else f"{prefix}{name}"
        for name, said in found
        if (prefix + name).startswith(current)
    ]
    return list(dict.fromkeys(lines)), directive


def run(parser: argparse.ArgumentParser, words: Sequence[str], out: TextIO | None = None) -> int:
    """Answer a completion request (`__complete`, `kubectl_complete-configpin`)."""
    out = out or sys.stdout
    try:
        lines, directive = complete(parser, words)
    except Exception as e:  # a completion must never print a traceback into the shell
        print(f"configpin completion: {type(e).__name__}: {e}", file=sys.stderr)
        lines, directive = [], 1  # Cobra's ShellCompDirectiveError
    for line in lines:
        print(line, file=out)
    print(f":{directive}", file=out)
    return 0


_BASH: Final = r"""# bash completion for PROG                                  -*- shell-script -*-
# Now:      source <(PROG completion bash)
# For good: PROG completion bash > ~/.local/share/bash-completion/completions/PROG
_PROG_complete() {
    local cur words cword
    if declare -F _get_comp_words_by_ref >/dev/null 2>&1; then
        _get_comp_words_by_ref -n =: cur words cword
    else  # (no bash-completion: the line split at blanks only, so --flag=value is one word)
        local line=${COMP_LINE:0:COMP_POINT}
        read -ra words <<<"$line"
        [[ $line == *[[:blank:]] ]] && words+=("")
        cword=$(( ${#words[@]} - 1 )) cur=${words[-1]}
    fi
    local out line directive
    out=$(PROG __complete "${words[@]:1:cword}" 2>/dev/null) || return 0
    directive=${out##*:}
    COMPREPLY=()
    while IFS= read -r line; do
        [[ -z $line || $line == :* ]] && continue
        COMPREPLY+=("${line%%$'\t'*}")
    done <<<"$out"
    # readline completes after the last = or : (COMP_WORDBREAKS): only that part is replaced
    if [[ $cur == *[=:]* ]]; then
        local typed=${cur%"${cur##*[=:]}"}
        COMPREPLY=("${COMPREPLY[@]#"$typed"}")
    fi
    if (( directive & 2 )); then compopt -o nospace 2>/dev/null; fi
    if (( ${#COMPREPLY[@]} == 0 && (directive & 4) == 0 )); then
        compopt -o default 2>/dev/null
    fi
    return 0
}
complete -F _PROG_complete PROG
"""

_ZSH: Final = r"""#compdef PROG
# zsh completion for PROG
# Now:      source <(PROG completion zsh)        (after compinit)
# For good: PROG completion zsh > "${fpath[1]}/_PROG"
_PROG() {
    local out line directive
    local -a lines comps
    out=$(PROG __complete "${(@)words[2,CURRENT]}" 2>/dev/null) || return 1
    lines=("${(@f)out}")
    directive=${lines[-1]#:}
    for line in "${(@)lines[1,-2]}"; do
        [[ -z $line ]] && continue
        if [[ $line == *$'\t'* ]]; then
            comps+=("${${line%%$'\t'*}//:/\\:}:${line#*$'\t'}")
        else
            comps+=("${line//:/\\:}")
        fi
    done
    if (( ${#comps} )); then
        if (( directive & 2 )); then
            _describe -t values PROG comps -S ''
        else
            _describe -t values PROG comps
        fi
    elif (( (directive & 4) == 0 )); then
        _files
    fi
}
if [[ ${zsh_eval_context[-1]} == loadautofunc ]]; then
    _PROG "$@"
else
    compdef _PROG PROG
fi
"""

_PLUGIN: Final = """\
# `kubectl configpin ...` is completed by kubectl itself (kubectl 1.26 and newer):
# for a plugin's words it runs kubectl_complete-configpin from PATH, which
# `pip install configpin` puts beside kubectl-configpin. kubectl's own completion
# is all {shell} needs; this loads it:
source <(kubectl completion {shell})
"""

COMPLETER: Final = "kubectl_complete-configpin"


def script(shell: str, prog: str, err: TextIO | None = None) -> str:
    """The completion script of `prog` for `shell`: the plugin's (prog `kubectl configpin`)
    hands over to kubectl's own completion, which asks kubectl_complete-configpin."""
    if prog.startswith("kubectl "):
        if shutil.which(COMPLETER) is None:
            print(
                f"configpin completion: {COMPLETER} is not on PATH: kubectl will not complete "
                f"`{prog}` (it is installed with configpin, beside kubectl-configpin)",
                file=err or sys.stderr,
            )
        return _PLUGIN.format(shell=shell)
    name = os.path.basename(prog)
    return (_BASH if shell == "bash" else _ZSH).replace("PROG", name)


__all__ = ["COMPLETER", "NO_FILE", "NO_SPACE", "SHELLS", "complete", "run", "script"]
