"""docs/development.md's layout is the code's: every folder and module of webhook/ is named there,
under its own folder, and nothing is named that is not there; no module of webhook/ is longer
than a reader can hold (600 lines, issue 38)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
PACKAGE = REPO / "webhook"
LONGEST = 600

_ENTRY = re.compile(r"^( *)([a-z_]+)/ ")  # "  core/   pure decision core ..."
_MODULE = re.compile(r"\b([a-z_]+)\.py\b")


def _layout_block() -> list[str]:
    text = (REPO / "docs" / "development.md").read_text()
    section = text.split("## Layout", 1)[1]
    block = section.split("```", 2)[1]
    lines = block.splitlines()
    start = next(i for i, line in enumerate(lines) if line == "webhook/")
    end = next(i for i, line in enumerate(lines) if i > start and not line.startswith(" "))
    return lines[start + 1 : end]


def _named() -> dict[str, set[str]]:
    """Each folder of webhook/ the layout names (relative, "" for the top), with the modules
    named in its part of the block (its own lines, not its sub-folders')."""
    named: dict[str, set[str]] = {"": set()}
    stack: list[tuple[int, str]] = []  # (indent, folder)
    for line in _layout_block():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        folder = _ENTRY.match(line)
        while stack and indent <= stack[-1][0] and (folder or indent < stack[-1][0] + 2):
            stack.pop()
        if folder:
            parent = stack[-1][1] if stack else ""
            path = f"{parent}/{folder[2]}".lstrip("/")
            named.setdefault(path, set())
            stack.append((indent, path))
            line = line[folder.end() :]
        where = stack[-1][1] if stack else ""
        named[where].update(_MODULE.findall(line))
    return named


def _code() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for init in PACKAGE.rglob("__init__.py"):
        folder = init.parent.relative_to(PACKAGE).as_posix()
        folder = "" if folder == "." else folder
        found[folder] = {
            p.stem for p in init.parent.glob("*.py") if p.name not in ("__init__.py", "__main__.py")
        }
    return found


def test_the_layout_names_every_folder_and_module_of_webhook_where_it_is() -> None:
    named, code = _named(), _code()
    assert sorted(named) == sorted(code), "folders of webhook/ the layout names"
    for folder, modules in code.items():
        assert named[folder] >= modules, (
            f"webhook/{folder}: modules the layout does not name there: "
            f"{sorted(modules - named[folder])}"
        )
        assert named[folder] <= modules, (
            f"webhook/{folder}: the layout names modules that are not there: "
            f"{sorted(named[folder] - modules)}"
        )


def test_no_module_of_webhook_is_longer_than_a_reader_can_hold() -> None:
    long = {
        p.relative_to(REPO).as_posix(): n
        for p in PACKAGE.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > LONGEST
    }
    assert long == {}, f"modules over {LONGEST} lines"
