"""A real browser for the dashboard's tests and benchmark: Debian's chromium, driven by
Playwright for Python (`playwright` from PyPI, the dev extras), never a browser of its own
(nothing downloads one: `playwright install` is never run).

    python -m harness.browser        # installs chromium with apt-get if it is missing

chromium is installed with apt-get through harness/apt.py (it waits for apt's locks) by
`make test` (hack/run-tests.py) before the browser suites, and by the tests' fixture when it
is missing. It runs as root on a machine with no network but the package registries, so it
is started headless, without its sandbox (root), GPU, QUIC or any of its background
connections (update checks, sync, component updates: each would be refused, many at a time),
with a fresh profile.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from harness import apt

if TYPE_CHECKING:
    from playwright.sync_api import BrowserContext

CHROMIUM: Final = Path("/usr/bin/chromium")
PACKAGES: Final = ("chromium", "fonts-liberation")  # the page's font, for readable screenshots
FLAGS: Final = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
VIEWPORT: Final = {"width": 1280, "height": 800}


def _log(line: str) -> None:
    print(f"harness.browser: {line}", file=sys.stderr, flush=True)


def ensure() -> Path:
    """Debian's chromium, installed with apt-get when it is missing."""
    fonts = Path("/usr/share/fonts/truetype/liberation")
    if CHROMIUM.exists() and fonts.exists():
        return CHROMIUM
    if shutil.which("apt-config") is None:
        raise RuntimeError(f"{CHROMIUM} is missing and this is no Debian machine (no apt)")
    _log(f"installing {' '.join(PACKAGES)} with apt-get")
    noninteractive = {"DEBIAN_FRONTEND": "noninteractive"}
    quiet: dict[str, Any] = {"stdout": subprocess.DEVNULL, "say": _log}
    apt.run(["update", "-qq"], sudo=True, env=noninteractive, **quiet)
    install = ["install", "-y", "-qq", "--no-install-recommends", *PACKAGES]
    apt.run(install, sudo=True, env=noninteractive, **quiet)
    if not CHROMIUM.exists():
        raise RuntimeError(f"{PACKAGES[0]} was installed, but {CHROMIUM} is missing")
    return CHROMIUM


@contextlib.contextmanager
def browser(profile: Path | None = None) -> Iterator[BrowserContext]:
    """chromium with a fresh profile (under `profile`, else a temporary folder), as a
    Playwright browser context; closed on the way out."""
    from playwright.sync_api import sync_playwright

    executable = ensure()
    with contextlib.ExitStack() as stack:
        if profile is None:
            profile = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="chromium-")))
        playwright = stack.enter_context(sync_playwright())
        context = playwright.chromium.launch_persistent_context(
            str(profile),
            executable_path=str(executable),
            args=list(FLAGS),
            headless=True,
            viewport=VIEWPORT,  # type: ignore[arg-type]
        )
        try:
            yield context
        finally:
            context.close()


if __name__ == "__main__":
    print(ensure())
