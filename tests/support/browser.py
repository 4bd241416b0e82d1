"""Headless Debian Chromium for the browser tests (``tests/*/test_*_browser.py``).

Chromium is the distribution's (``apt-get install chromium``; ``.ci/run`` installs it when
missing), driven by Playwright for Python; Playwright's own browser download is never used.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

CHROMIUM = shutil.which("chromium")
#: Without the background-networking flags Chromium keeps calling Google's hosts, which this machine refuses.
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync"]
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (apt-get install chromium)")


@dataclass
class Watched:
    """What a page did that a casmon page must never do."""

    foreign: list[str] = field(default_factory=list)  # requests refused: a CDN, an <img src=x>, ... is a bug
    dialogs: list[str] = field(default_factory=list)  # alert() and the like: an injected script ran
    console_errors: list[str] = field(default_factory=list)  # a Content-Security-Policy violation is one
    page_errors: list[str] = field(default_factory=list)


def watch(page, allowed: Callable[[str], bool]) -> Watched:
    """Refuse and count every request whose URL ``allowed`` rejects; collect dialogs and errors."""
    w = Watched()

    def route(r):
        if allowed(r.request.url):
            r.continue_()
        else:
            w.foreign.append(r.request.url)
            r.abort()

    page.route("**/*", route)
    page.on("dialog", lambda d: (w.dialogs.append(d.message), d.dismiss()))
    page.on("console", lambda m: w.console_errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: w.page_errors.append(str(e)))
    return w
