"""What every view of the dashboard is checked for in the browser: WCAG 2.1 AA as axe-core
(harness/axe.py: a pinned version from npm, its integrity checked) finds it, with no serious or
critical violation; and reach by keyboard alone: Tab from the top of the page reaches every
control the view shows (each link, button, field)."""

from __future__ import annotations

from typing import Any

from harness import axe

AA = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa"]
BAD = ("serious", "critical")
CONTROLS = "a[href], button:not([disabled]), input:not([disabled]), textarea, select, [tabindex]"


def axe_violations(page: Any) -> list[str]:
    """axe-core's serious and critical violations of WCAG 2.1 AA in the page as it stands
    (evaluated in it once per document), each as "rule: what it says (where)"."""
    if not page.evaluate("typeof window.axe !== 'undefined'"):
        # (as Playwright's add_script_tag would, less the <script> element, which the page's
        # Content-Security-Policy refuses: a script evaluated through DevTools is not refused)
        page.evaluate(axe.ensure().read_text() + "\n;true")
    found = page.evaluate(
        "tags => axe.run(document, {runOnly: {type: 'tag', values: tags}})"
        ".then(r => r.violations.map(v => ({id: v.id, impact: v.impact, help: v.help,"
        " nodes: v.nodes.slice(0, 3).map(n => n.target.join(' '))})))",
        AA,
    )
    return [
        f"{v['id']} ({v['impact']}): {v['help']} at {v['nodes']}"
        for v in found
        if v["impact"] in BAD
    ]


_KEY = (
    "e => e.tagName + ' ' + (e.id || e.getAttribute('href') || e.dataset.testid || '') + ' '"
    " + (e.getAttribute('aria-label') || e.textContent || '').trim().slice(0, 60)"
)


def unreached(page: Any, most: int = 400) -> list[str]:
    """The controls of the page that Tab, pressed from the top, never focuses (each known by
    what it is and says: the page redraws itself when the cluster moves)."""
    controls = set(
        page.eval_on_selector_all(
            CONTROLS,
            f"els => els.filter(e => e.getClientRects().length).map({_KEY})",
        )
    )
    page.evaluate("document.activeElement && document.activeElement.blur()")
    page.evaluate("window.scrollTo(0, 0)")
    reached: set[str] = set()
    for _ in range(min(most, 3 * len(controls) + 5)):
        page.keyboard.press("Tab")
        got = page.evaluate(
            f"(() => {{ const e = document.activeElement; return e && e !== "
            f"document.body ? ({_KEY})(e) : null; }})()"
        )
        if got is not None:
            reached.add(got)
        if reached >= controls:
            break
    return sorted(controls - reached)


def check(page: Any, view: str) -> None:
    """The page passes axe-core and every control is reached by keyboard."""
    bad = axe_violations(page)
    assert not bad, (view, bad)
    missed = unreached(page)
    assert not missed, (view, missed)
