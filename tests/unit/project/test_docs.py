"""The docs hold together: README.md stays short and links every page under docs/, each page
links back to it, and every relative link in README.md and docs/*.md reaches a file that
exists and, with a `#anchor`, a heading of that file (as GitHub makes anchors)."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

REPO = Path(__file__).resolve().parents[3]
README = REPO / "README.md"
DOCS = REPO / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]

_FENCE = re.compile(r"^\s*(```|~~~)")
_CODE_SPAN = re.compile(r"`[^`]*`")
_LINK = re.compile(r"\[[^\]]*\]\(([^()\s]+)\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def _outside_code(text: str) -> list[str]:
    """The lines of a Markdown file outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: a link shows its text; lowercase; punctuation other than
    '-' and '_' removed (backticks included); each space becomes '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor GitHub gives the headings of `path` (a repeated one gets -1, -2, ...)."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for line in _outside_code(path.read_text()):
        match = _HEADING.match(line)
        if not match:
            continue
        base = slug(match[2])
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def relative_links(path: Path) -> list[str]:
    """The targets of the inline links in `path` that point into the repository, in order
    (outside code blocks and code spans)."""
    targets = []
    for line in _outside_code(path.read_text()):
        for target in _LINK.findall(_CODE_SPAN.sub("", line)):
            if not _SCHEME.match(target):
                targets.append(target)
    return targets


def _broken(page: Path, target: str) -> str | None:
    """Why `target`, linked from `page`, does not resolve; None when it does."""
    file_part, _, anchor = target.partition("#")
    linked = (page.parent / unquote(file_part)) if file_part else page
    if not linked.exists():
        return f"{target}: no such file"
    if anchor and linked.suffix == ".md" and anchor not in anchors(linked):
        return f"{target}: no heading #{anchor} in {linked.name}"
    return None


def test_slugs_are_githubs() -> None:
    assert slug("Offline render (`configpin render`)") == "offline-render-configpin-render"
    assert slug("Status: is it pinned, to what, is it stale?") == (
        "status-is-it-pinned-to-what-is-it-stale"
    )
    assert slug("GitOps (Argo CD, Flux)") == "gitops-argo-cd-flux"
    assert slug("Metrics (`GET /metrics`)") == "metrics-get-metrics"
    assert slug("On change: roll or refresh") == "on-change-roll-or-refresh"
    assert slug("`render.py`") == "renderpy"
    assert slug("Custom-resource workloads") == "custom-resource-workloads"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page: Path) -> None:
    links = relative_links(page)
    assert links, f"{page.name} links nowhere"
    broken = [why for target in links if (why := _broken(page, target))]
    assert not broken, f"{page.relative_to(REPO)}: " + "; ".join(broken)


def test_the_readme_is_short() -> None:
    lines = len(README.read_text().splitlines())
    assert lines < 250, f"README.md has {lines} lines: move reference to docs/"


def test_every_docs_page_is_linked_from_the_readme() -> None:
    pages = {p.resolve() for p in DOCS.glob("*.md")}
    assert len(pages) >= 5, pages
    linked = {(README.parent / t.partition("#")[0]).resolve() for t in relative_links(README)}
    missing = sorted(p.name for p in pages - linked)
    assert not missing, f"README.md does not link docs/{missing}"


@pytest.mark.parametrize("page", PAGES[1:], ids=lambda p: p.name)
def test_every_docs_page_starts_with_a_link_back_to_the_readme(page: Path) -> None:
    text = page.read_text()
    opening = text.split("\n## ", 1)[0]
    assert "](../README.md)" in opening, f"{page.name}: its opening should link ../README.md"


def test_every_annotation_and_label_is_in_the_annotations_page() -> None:
    """webhook/core/constants.py names what users see; docs/annotations.md lists each."""
    from webhook.core import constants

    page = (DOCS / "annotations.md").read_text()
    names = {
        value
        for key, value in vars(constants).items()
        if key.startswith(("ANN_", "LABEL_")) and isinstance(value, str)
    }
    assert names and not {n for n in names if f"`{n}" not in page}
