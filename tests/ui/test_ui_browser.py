"""``casmon ui`` in a real browser: every page of a store built in the test, loaded in headless Chromium.

Chromium is the distribution's (``apt-get install chromium``; ``.ci/run``
installs it when missing), driven by Playwright for Python; Playwright's own
browser download is never used. The server listens on 127.0.0.1, port 0, in a
thread. Any request to another origin is refused and counted; console errors
(a Content-Security-Policy violation is one) fail the test. Screenshots go to
``tmp_path`` only.
"""

from __future__ import annotations

import re

import pytest

from tests.support.browser import ARGS, CHROMIUM, needs_chromium, watch
from tests.ui.test_ui import HOSTILE, HOSTILE_KEY, Served, built  # noqa: F401 - built: the module's store, made once

pytestmark = needs_chromium


def test_every_page_in_a_real_browser(tmp_path, built):  # noqa: F811
    sync_playwright = pytest.importorskip("playwright.sync_api").sync_playwright
    srv = Served(built["path"])
    base = f"http://127.0.0.1:{srv.port}"
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 900})
                w = watch(page, lambda url: url.startswith(base + "/"))  # a page loads nothing from elsewhere

                # -- runs: rows, info columns, the hostile comment as text, sorting by a click
                page.goto(base + "/", wait_until="load")
                rows = page.locator("table#runs tbody tr")
                assert rows.count() == 4
                names = page.locator("table#runs tbody td.name").all_inner_texts()
                assert names == ["4-odd", "3-again", f"2-{HOSTILE}", "1-base"]
                heads = page.locator("table#runs thead th").all_inner_texts()
                assert {"lr", "loss", "epochs"} <= {h.strip(" ▲▼") for h in heads}
                assert page.evaluate("document.scripts.length") == 1  # casmon-ui.js, nothing from the store
                assert page.evaluate("document.querySelectorAll('img').length") == 0
                page.screenshot(path=str(tmp_path / "runs.png"), full_page=True)
                page.locator("table#runs thead th[data-col='info.loss'] a").click()
                page.wait_for_url(re.compile(r"sort=info\.loss"))
                loss = page.locator("table#runs tbody td.name").all_inner_texts()
                assert loss[:3] in (["1-base", "3-again", f"2-{HOSTILE}"], ["3-again", "1-base", f"2-{HOSTILE}"])
                page.locator("table#runs thead th[data-col='info.loss'] a").click()  # again: the other way
                page.wait_for_url(re.compile(r"order=asc"))
                assert page.locator("table#runs tbody td.name").first.inner_text() == f"2-{HOSTILE}"

                # -- select three runs and compare them
                page.goto(base + "/", wait_until="load")
                button = page.locator("#compare-button")
                assert button.is_disabled()
                for tail in ("1", "2", "3"):
                    page.locator(f"table#runs tr[data-run='{tail}'] input[type=checkbox]").check()
                assert button.is_enabled() and button.inner_text() == "Compare 3 runs"
                assert page.locator("table#runs tr.selected").count() == 3
                button.click()
                page.wait_for_url(re.compile(r"/compare\?"))
                assert re.findall(r"run=(\d)", page.url) == ["3", "2", "1"]  # the table's order: 3-again is the reference
                page.screenshot(path=str(tmp_path / "compare.png"), full_page=True)

                # metrics side by side; the chosen metric's chart (one bar per run), another on request
                lr = page.locator("table.metrics tr[data-key='lr'] td").all_inner_texts()
                assert [x.strip() for x in lr] == ["0.1", "0.02", "0.1"]
                visible = page.locator("figure.metric-chart:visible")
                assert visible.count() == 1 and visible.locator("rect.mark.bar").count() == 3
                page.locator("#metric-select").select_option("loss")
                assert page.locator("figure.metric-chart[data-metric='loss']").is_visible()
                assert page.locator("figure.metric-chart:visible").count() == 1
                bars = page.locator("figure.metric-chart[data-metric='loss'] rect.mark.bar")
                heights = [float(bars.nth(i).get_attribute("height")) for i in range(3)]
                assert heights[0] == heights[2] and heights[1] == pytest.approx(heights[0] / 2, rel=0.02)
                # overlaid curves: a line per run; the legend hides one
                curve = page.locator("figure.curve[data-key='curve']")
                assert curve.locator("polyline.mark.line").count() == 3
                curve.locator("g.legend").nth(1).click()
                assert "off" in (curve.locator("polyline.mark.line").nth(1).get_attribute("class") or "")
                # the patch, coloured line by line, and the tracked file's diff
                added = page.locator(".casmon-add").all_inner_texts()
                removed = page.locator(".casmon-del").all_inner_texts()
                assert "+lr = 0.02" in added and "+lr: 0.02" in added and "-lr: 0.1" in removed
                green = page.locator(".casmon-add").first.evaluate("e => getComputedStyle(e).backgroundColor")
                red = page.locator(".casmon-del").first.evaluate("e => getComputedStyle(e).backgroundColor")
                assert green == "rgb(218, 251, 225)" and red == "rgb(255, 235, 233)"
                # runs with identical outputs, by digest
                groups = page.locator("#groups tr", has=page.locator("th", has_text="all info values"))
                assert groups.locator(".group").all_inner_texts() == ["3-again, 1-base"]
                # where the logged calls diverge; click through to the call
                found = page.locator("p.divergence.found")
                assert found.count() == 1 and "_step call 2" in found.inner_text()
                found.locator("a").nth(1).click()
                page.wait_for_url(re.compile(r"/call\?"))
                assert page.locator("h1").inner_text().endswith("#5")  # the second _step call of the second run
                inputs = page.locator("h2#inputs + table tr").all_inner_texts()
                assert any(t.startswith("x") and "1.0" in t for t in inputs)

                # -- a run: its patch, output, links to its calls and cache entries
                page.goto(base + "/run/2", wait_until="load")
                assert page.locator("h1 code").inner_text() == f"2-{HOSTILE}"
                assert "training with lr=0.02" in page.locator("pre.output").inner_text()
                page.locator("a.run-calls").click()
                page.wait_for_url(re.compile(r"/calls\?run=2"))
                assert page.locator("figure.histogram rect.mark.bin").count() >= 1
                assert page.locator("h2#list + table tr").count() == 4  # a header and the run's three calls
                page.go_back()
                page.locator("a", has_text="session").first.click()
                page.wait_for_url(re.compile(r"/calls\?session="))
                assert page.locator("h2#list + table tr").count() == 10  # the session: all three runs' calls
                page.goto(base + "/run/4", wait_until="load")
                assert page.get_by_text(HOSTILE_KEY, exact=True).count() == 1  # an info key that is markup: text

                # -- calls, filtered; cache; store
                page.goto(base + "/calls", wait_until="load")
                page.locator("#calls-filter select[name=fn]").select_option("tests.ui.test_ui._step")
                page.locator("#calls-filter button").click()
                page.wait_for_url(re.compile(r"fn=tests\.ui\.test_ui\._step"))
                assert page.locator("h2#list + table tr").count() == 10
                page.goto(base + "/cache", wait_until="load")
                page.locator("a", has_text="tests.ui.test_ui._square").click()
                page.wait_for_url(re.compile(r"/cache\?fn="))
                assert "array(1000,) float64" in page.locator("h2#entries + table").inner_text()
                page.goto(base + "/store", wait_until="load")
                assert "dedup ratio" in page.locator("main").inner_text()
                assert page.locator("svg.chart rect.mark.bar").count() >= 3
                page.screenshot(path=str(tmp_path / "store.png"), full_page=True)

                # -- an error page is a page too (and says what is wrong)
                page.goto(base + "/run/nope", wait_until="load")
                assert "no run 'nope'" in page.locator("#error").inner_text()
                w.console_errors[:] = [e for e in w.console_errors if "404" not in e]  # the 404 itself is logged
                assert w.dialogs == [] and w.foreign == []
                assert w.console_errors == [] and w.page_errors == []
            finally:
                browser.close()
    finally:
        srv.close()
    assert (tmp_path / "compare.png").stat().st_size > 10_000
    assert not built["marker"].exists()


def test_report_file_opens_offline(tmp_path, built):  # noqa: F811
    """The report file alone, from file://: charts, diff and script work; nothing is fetched, no CSP errors."""
    sync_playwright = pytest.importorskip("playwright.sync_api").sync_playwright
    from casmon.ui import write_report
    import casmon

    s = casmon.open(built["path"], read_only=True, trust=False, create=False)
    try:
        path, n = write_report(s, ["1", "2", "3"], tmp_path / "report.html")
    finally:
        s.close()
    assert n == 3
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            page = browser.new_page()
            w = watch(page, lambda url: url.startswith("file://"))
            page.goto(path.as_uri(), wait_until="load")
            assert page.locator("figure.metric-chart:visible").count() == 1  # the inline script ran
            page.locator("#metric-select").select_option("loss")
            assert page.locator("figure.metric-chart[data-metric='loss']").is_visible()
            assert page.locator("figure.curve polyline.mark.line").count() >= 3
            assert "+lr = 0.02" in page.locator(".casmon-add").all_inner_texts()
            assert page.locator("a").count() == 0  # nothing to follow in a file sent by mail
            bg = page.locator(".casmon-add").first.evaluate("e => getComputedStyle(e).backgroundColor")
            assert bg == "rgb(218, 251, 225)"  # the inline style sheet applied under the file's own policy
            page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
        finally:
            browser.close()
    assert w.foreign == [] and w.console_errors == [] and w.page_errors == []
    assert not built["marker"].exists()
