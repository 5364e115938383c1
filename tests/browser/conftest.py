"""Fixtures of the dashboard's browser tests: the integration suite's control plane and
clients (tests/integration/conftest.py), and Debian's chromium driven by Playwright
(harness/browser.py), one browser for the session and a new page per test.

Everything under tests/browser is marked ``browser``. Screenshots go to
``$CONFIGPIN_DASHBOARD_SCREENSHOTS`` (docs/dashboard, to refresh the docs' pictures), else to
the test's temporary folder: they are taken either way.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.browser import browser as chromium
from tests.integration.conftest import control_plane, k8s, kube

__all__ = ["control_plane", "k8s", "kube"]

_HERE = Path(__file__).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(_HERE):
            item.add_marker(pytest.mark.browser)


@pytest.fixture(scope="session")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    with chromium(tmp_path_factory.mktemp("chromium-profile")) as context:
        yield context


@pytest.fixture
def page(browser: object) -> Iterator[object]:
    from playwright.sync_api import BrowserContext

    assert isinstance(browser, BrowserContext)
    tab = browser.new_page()
    try:
        yield tab
    finally:
        tab.close()


@pytest.fixture(scope="session")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where screenshots go."""
    chosen = os.environ.get("CONFIGPIN_DASHBOARD_SCREENSHOTS")
    if chosen:
        folder = Path(chosen)
        folder.mkdir(parents=True, exist_ok=True)
        return folder
    return tmp_path_factory.mktemp("screenshots")
