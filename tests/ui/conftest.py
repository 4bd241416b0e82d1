"""What the UI's browser tests share: one headless Debian chromium per test module, through Playwright."""

import pytest

from tests.support.browser import ARGS, CHROMIUM


@pytest.fixture(scope="module")
def browser():
    sync_playwright = pytest.importorskip("playwright.sync_api").sync_playwright
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()
