#!/usr/bin/env python3
"""Write charts/configpin/README.md from Chart.yaml and the comments in values.yaml.

    .venv/bin/python hack/chart-readme.py           # write it
    .venv/bin/python hack/chart-readme.py --check   # exit 1 if it is not current

values.yaml is the one place a value is described (tests/unit/project/test_chart.py wants a
comment above every key): the README's table is those comments, one row per key, its default
as values.yaml has it. A comment block separated from its key by a blank line (the file's
header) is not the key's; commented-out examples (`#  - kind: allow`, two spaces after the
`#`) are left to values.yaml. tests/unit/project/test_chart_readme.py fails when the README is
not what this script writes, so an edit of values.yaml without it does not go unnoticed.
(helm-docs does the same for Go-templated READMEs; this is the same idea in a page of Python.)
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "charts" / "configpin"
README = CHART / "README.md"

_KEY = re.compile(r"^( *)([A-Za-z0-9_.-]+):(.*)$")

INTRO = """\
## Install

There is no published image yet: build it from the repository's `Dockerfile` (or `make image`)
and push it where the cluster pulls from. Then:

```sh
helm install configpin charts/configpin -n configpin --create-namespace \\
  --set image.repository=REGISTRY/configpin --set image.tag=0.1.0
kubectl label namespace my-app configpin.io/enabled=true
helm test configpin -n configpin   # /readyz over HTTPS through the Service, certificate checked
```

What the chart installs, cert-manager, OpenShift, `hostNetwork` and the opt-in label:
[Install in a cluster](../../docs/install.md); monitoring, upgrade and uninstall:
[Operations](../../docs/operations.md). How configpin works: the [README](../../README.md).
"""


@dataclass(frozen=True)
class Row:
    key: str  # dotted path, e.g. controller.leaderElect
    default: Any
    description: str
    section: bool  # a map whose keys have rows of their own


def rows(values_text: str) -> list[Row]:
    """One row per key of values.yaml, in its order, with the comment right above it."""
    defaults = yaml.safe_load(values_text) or {}
    found: list[Row] = []
    stack: list[tuple[int, str]] = []  # (indent, key) of the maps we are in
    comment: list[str] = []
    for line in values_text.splitlines():
        stripped = line.strip()
        if not stripped:
            comment = []
            continue
        if stripped.startswith("#"):
            text = stripped[1:]
            if not text.startswith("  "):  # an example is left out
                comment.append(text.strip())
            continue
        match = _KEY.match(line)
        if not match:  # a list item or a continued value: not a key
            comment = []
            continue
        indent, key, rest = len(match[1]), match[2], match[3].split(" #", 1)[0].strip()
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = [k for _, k in stack] + [key]
        value = _lookup(defaults, path)
        section = not rest and isinstance(value, dict) and bool(value)
        found.append(Row(".".join(path), value, " ".join(comment), section))
        comment = []
        if not rest:
            stack.append((indent, key))
    return found


def _lookup(tree: Any, path: list[str]) -> Any:
    for key in path:
        tree = tree[key]
    return tree


def _escape(text: str) -> str:
    """Table-safe Markdown: pipes escaped, and angle brackets outside code spans (GitHub would
    take <release> for a tag and drop it)."""
    parts = text.replace("|", "\\|").split("`")
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("<", "&lt;").replace(">", "&gt;").replace("*", "\\*")
    return "`".join(parts)


def _default(row: Row) -> str:
    if row.section:
        return ""
    shown = json.dumps(row.default, ensure_ascii=False, separators=(", ", ": "))
    return "`" + shown.replace("|", "\\|") + "`"


def render(chart_yaml: str, values_text: str) -> str:
    chart = yaml.safe_load(chart_yaml)
    lines = [
        f"# {chart['name']}",
        "",
        "<!-- Written by hack/chart-readme.py from Chart.yaml and values.yaml: edit those, then",
        "     run `.venv/bin/python hack/chart-readme.py`. -->",
        "",
        " ".join(str(chart["description"]).split()),
        "",
        f"Chart version {chart['version']}, configpin {chart['appVersion']}, "
        f"Kubernetes `{chart['kubeVersion']}`.",
        "",
        INTRO,
        "## Values",
        "",
        "Every value, as `values.yaml` describes it (`values.schema.json` checks them). "
        "Keys in bold group the ones below them.",
        "",
        "| Key | Default | Description |",
        "|---|---|---|",
    ]
    for row in rows(values_text):
        key = f"**`{row.key}`**" if row.section else f"`{row.key}`"
        lines.append(f"| {key} | {_default(row)} | {_escape(row.description)} |")
    return "\n".join(lines) + "\n"


def current() -> str:
    """The README as it should be now."""
    return render((CHART / "Chart.yaml").read_text(), (CHART / "values.yaml").read_text())


def main(argv: list[str]) -> int:
    text = current()
    if argv == ["--check"]:
        if README.exists() and README.read_text() == text:
            return 0
        print(
            f"{README.relative_to(REPO)} is not current: run hack/chart-readme.py", file=sys.stderr
        )
        return 1
    if argv:
        print(__doc__, file=sys.stderr)
        return 2
    README.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
