"""The HTML views in a real browser: a notebook-like page of every view, loaded in headless Chromium.

Chromium comes from the distribution (``apt-get install chromium``; ``.ci/run``
installs it when missing), driven by Playwright for Python; Playwright's own
browser download is never used. Nothing leaves the machine: every request the
page makes is refused and counted. Screenshots go to ``tmp_path`` only.
"""

import html

import pytest

import casmon
from casmon.view import display
from tests.support.browser import ARGS, CHROMIUM, needs_chromium, watch
from tests.view.test_display import HOSTILE, HOSTILE_FILE, all_views, build_store

pytestmark = needs_chromium


def notebook_page(views: list) -> str:
    """What Jupyter does with objects: each cell's output is the object's ``_repr_html_()``."""
    cells = []
    for i, obj in enumerate(views):
        cells.append(f"<section class=\"cell\" id=\"cell{i}\" data-type=\"{html.escape(type(obj).__name__)}\">"
                     f"<pre class=\"input\">In [{i + 1}]: {html.escape(type(obj).__name__)}</pre>"
                     f"<div class=\"output\">{obj._repr_html_()}</div></section>")
    return ("<!doctype html><html><head><meta charset=\"utf-8\"><title>casmon views</title></head><body>"
            + "".join(cells) + "</body></html>")


def diff_files_added(page) -> list[str]:
    row = page.locator("#cell3 tr", has=page.locator("th", has_text="files added"))
    return row.locator("code").all_inner_texts()


def test_views_in_a_real_browser(tmp_path, monkeypatch):
    sync_playwright = pytest.importorskip("playwright.sync_api").sync_playwright
    built = build_store(tmp_path, monkeypatch)
    views = all_views(built["path"], built["square"])
    built["store"].close()
    page_file = tmp_path / "page.html"
    page_file.write_text(notebook_page(views), encoding="utf-8")

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            w = watch(page, lambda url: url.startswith("file://"))  # a view loads nothing from the network
            page.goto(page_file.as_uri(), wait_until="load")
            page.screenshot(path=str(tmp_path / "views.png"), full_page=True)

            cell = {i: page.locator(f"#cell{i} .output") for i in range(len(views))}
            # every view rendered as a casmon view, not as an error
            assert page.locator(".output > .casmon-view").count() == len(views)
            assert page.get_by_text("cannot show it").count() == 0

            # the run list: a header and one row per run, statuses as badges
            runs = cell[0].locator("table").first
            assert runs.locator("tr").count() == 3
            assert runs.locator("tr").nth(1).locator("td").first.inner_text() == "1-base"
            assert cell[0].locator(".casmon-status-ok").count() == 2
            headers = runs.locator("th").all_inner_texts()
            assert headers[:3] == ["run", "status", "started"] and {"loss", "lr"} <= set(headers)

            # a hostile comment is shown as text, and nothing ran
            assert runs.locator("tr").nth(2).locator("td").first.inner_text() == f"2-{HOSTILE}"
            assert cell[2].get_by_text(HOSTILE, exact=True).count() >= 1  # the comment row of run 2
            assert page.evaluate("document.scripts.length") == 0
            assert page.evaluate("document.querySelectorAll('img').length") == 0
            assert page.evaluate("document.querySelectorAll('.output b').length") == 0  # a file named <b …>
            assert diff_files_added(page) == [HOSTILE_FILE]
            assert w.dialogs == [] and w.foreign == []

            # the diff: the patch in colour, line by line, and the metrics side by side
            diff = cell[3]
            added = diff.locator(".casmon-add").all_inner_texts()
            removed = diff.locator(".casmon-del").all_inner_texts()
            assert "+lr = 0.02" in added and "-lr = 0.1" in removed
            green = diff.locator(".casmon-add").first.evaluate("e => getComputedStyle(e).backgroundColor")
            red = diff.locator(".casmon-del").first.evaluate("e => getComputedStyle(e).backgroundColor")
            assert green == "rgb(218, 251, 225)" and red == "rgb(255, 235, 233)"
            loss = diff.locator("tr", has=page.locator("td", has_text="loss")).first.locator("td").all_inner_texts()
            assert loss == ["loss", "0.5", "0.25"]
            info_table = diff.locator("table", has=page.locator("td", has_text="loss")).first
            assert info_table.locator("th").all_inner_texts() == ["key", "1-base", f"2-{HOSTILE}"]
            assert diff.get_by_text("files changed").count() == 1

            # the run: status, code state, info, files
            run1 = cell[1].inner_text()
            assert "commit" in run1 and "on main, clean" in run1 and "config.yaml" in run1 and "0.5" in run1
            start = casmon.list_runs(casmon.open(built["path"], trust=False))[0].manifest["start"]
            assert display.when(start) in run1 and str(start) not in run1

            # stats: sizes and ratios for people; the call log, its sessions; the array; the cache
            stats = cell[4].inner_text()
            assert "KiB" in stats and "dedup" in stats and "×" in stats
            assert "11.166" not in stats and repr(views[4]["dedup_ratio"]) not in stats
            assert "ok" in cell[5].locator(".casmon-status").inner_text()
            assert cell[6].locator("tr").count() == 2 and "_step(x, note=" in cell[6].inner_text()
            assert cell[7].locator("tr").count() == 2
            arr = cell[8].inner_text()
            assert "(8,)" in arr and "float64" in arr
            assert cell[9].locator("tr").count() == 3  # two cache entries
            assert "_square" in cell[10].inner_text() and "array(1000,) float64" in cell[10].inner_text()
            assert w.console_errors == [] and w.page_errors == []
        finally:
            browser.close()
    assert (tmp_path / "views.png").stat().st_size > 10_000
    assert not built["marker"].exists()
