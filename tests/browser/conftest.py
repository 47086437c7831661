"""Fixtures of the browser tests: headless Chromium under Playwright."""

from __future__ import annotations

import pytest
from playwright.sync_api import sync_playwright

from tests.browser.browser_support import launch_chromium


@pytest.fixture(scope="module")
def browser():
    """One Chromium per module: a crash or leak in one module's pages stays there."""
    with sync_playwright() as p:
        b = launch_chromium(p)
        yield b
        b.close()
