"""``casmon ui`` in a real browser: the pages of stores built in the test, in headless Chromium.

Chromium is the distribution's (``apt-get install chromium``; ``.ci/run``
installs it when missing), driven by Playwright for Python; Playwright's own
browser download is never used. The server listens on 127.0.0.1, port 0, in a
thread. Any request to another origin is refused and counted; console errors
(a Content-Security-Policy violation is one) fail the test. Screenshots go to
``tmp_path`` only. One test watches a run that goes on in another process:
its page and the runs table follow it without a reload.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request

import pytest

import casmon
from tests.conftest import ROOT
from tests.support.browser import ARGS, CHROMIUM, needs_chromium, watch
from tests.ui.test_ui import HOSTILE, HOSTILE_KEY, Served, built, wide  # noqa: F401 - fixtures: the module's stores

pytestmark = needs_chromium

#: The chart's uPlot instance (casmon-charts.js keeps it on its element).
UPLOT = "document.querySelector('#charts .chart-area').uplot"


@pytest.fixture(scope="module")
def browser():
    sync_playwright = pytest.importorskip("playwright.sync_api").sync_playwright
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


def _clean(w) -> None:
    """The console's own line for a page answered 4xx is not an error of the page."""
    w.console_errors[:] = [e for e in w.console_errors if "status of 40" not in e]
    assert w.dialogs == [] and w.foreign == []
    assert w.console_errors == [] and w.page_errors == []


def test_every_page_in_a_real_browser(tmp_path, built, browser):  # noqa: F811
    srv = Served(built["path"])
    base = f"http://127.0.0.1:{srv.port}"
    try:
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        w = watch(page, lambda url: url.startswith(base + "/"))  # a page loads nothing from elsewhere

        # -- runs: rows, column groups, the hostile comment as text, sorting by a click, the column chooser
        page.goto(base + "/", wait_until="load")
        assert page.locator("table#runs tbody tr").count() == 4
        names = page.locator("table#runs tbody td.name").all_inner_texts()
        assert names == ["4-odd", "3-again", f"2-{HOSTILE}", "1-base"]
        heads = {h.strip(" ▲▼") for h in page.locator("table#runs thead th[data-col]").all_inner_texts()}
        assert {"lr", "cfg.opt", "info loss", "info epochs", "acc", "loss"} <= heads
        assert page.evaluate("document.scripts.length") == 1  # casmon-ui.js, nothing from the store
        assert page.evaluate("document.querySelectorAll('img').length") == 0
        page.locator("table#runs thead th[data-col='info.loss'] a").click()
        page.wait_for_url(re.compile(r"sort=info\.loss"))
        loss = page.locator("table#runs tbody td.name").all_inner_texts()
        assert loss[:3] in (["1-base", "3-again", f"2-{HOSTILE}"], ["3-again", "1-base", f"2-{HOSTILE}"])
        page.locator("#column-chooser summary").click()
        page.locator("#column-chooser input[value='param.cfg.opt']").uncheck()
        assert page.locator("table#runs td[data-col='param.cfg.opt']").first.is_hidden()
        page.reload(wait_until="load")  # kept in this browser
        assert page.locator("table#runs th[data-col='param.cfg.opt']").is_hidden()
        page.locator("#column-chooser summary").click()
        page.locator("#column-chooser input[value='param.cfg.opt']").check()

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
        page.wait_for_selector("#charts[data-ready]")
        page.screenshot(path=str(tmp_path / "compare.png"), full_page=True)

        # the chart: uPlot's canvas, loss by default (a logged metric, not a parameter), one line per run
        assert page.locator("#charts canvas").count() == 1
        assert page.locator("#charts select[data-control=metric]").input_value() == "loss"
        assert page.evaluate(f"{UPLOT}.series.map(s => s.label)") == ["step", "3-again", f"2-{HOSTILE}", "1-base"]
        # hover: the legend shows the values under the cursor
        over = page.locator("#charts .u-over")
        box = over.bounding_box()
        page.mouse.move(box["x"] + box["width"] * 0.5, box["y"] + box["height"] * 0.5)
        values = page.locator("#charts .u-legend .u-series .u-value").all_inner_texts()
        step = int(values[0])
        assert float(values[2]) == pytest.approx(0.25 * 20 / (step + 1), rel=1e-3), values  # 2-…'s loss at that step
        # log scale, and back
        page.locator("#charts input[data-control=log]").check()
        assert page.evaluate(f"{UPLOT}.scales.y.distr") == 3
        page.locator("#charts input[data-control=log]").uncheck()
        assert page.evaluate(f"{UPLOT}.scales.y.distr") == 1
        # zoom: a drag across the plot narrows x; a double click zooms out again
        full = page.evaluate(f"[{UPLOT}.scales.x.min, {UPLOT}.scales.x.max]")
        page.mouse.move(box["x"] + box["width"] * 0.3, box["y"] + box["height"] * 0.5)
        page.mouse.down()
        page.mouse.move(box["x"] + box["width"] * 0.6, box["y"] + box["height"] * 0.5, steps=5)
        page.mouse.up()
        zoomed = page.evaluate(f"[{UPLOT}.scales.x.min, {UPLOT}.scales.x.max]")
        assert zoomed[0] > full[0] and zoomed[1] < full[1] and zoomed[1] - zoomed[0] < (full[1] - full[0]) / 2
        # smoothing: the EMA moves the curve
        before = page.evaluate(f"{UPLOT}.data[1].slice(0, 3)")
        page.locator("#charts input[data-control=smooth]").fill("0.9")
        after = page.evaluate(f"{UPLOT}.data[1].slice(0, 3)")
        assert after[0] == pytest.approx(before[0]) and after[2] > before[2]
        page.locator("#charts input[data-control=smooth]").fill("0")
        # grouped by a parameter: the mean of each group, its min-max band drawn behind
        page.locator("#charts select[data-control=group]").select_option("lr")
        labels = page.evaluate(f"{UPLOT}.series.filter(s => !s.band).map(s => s.label)")
        assert labels == ["step", "lr=0.1 (2 runs)", "lr=0.02 (1 run)"]
        page.locator("#charts select[data-control=group]").select_option("")
        # an info curve (50 points) over its index; the scatter of a parameter against a metric
        page.locator("#charts select[data-control=metric]").select_option("info:curve")
        assert page.evaluate(f"{UPLOT}.series[0].label") == "index"
        page.locator("#charts select[data-control=view]").select_option("scatter")
        page.locator("#charts select[data-control=sx]").select_option("lr")
        page.locator("#charts select[data-control=sy]").select_option("loss")
        pts = page.evaluate(f"{UPLOT}.data")
        assert pts[0] == [0.02, 0.1, 0.1] and sorted(v for col in pts[1:] for v in col if v is not None) == [0.25, 0.5, 0.5]
        # a legend click hides a run
        page.locator("#charts select[data-control=view]").select_option("curves")
        page.locator("#charts .u-legend .u-series").nth(1).click()
        assert page.evaluate(f"{UPLOT}.series[1].show") is False
        # tables: only what differs
        assert page.locator("table.params tr[data-key='cfg.opt']").is_visible()
        page.locator("#only-differs").check()
        assert page.locator("table.params tr[data-key='cfg.opt']").is_hidden()
        assert page.locator("table.params tr[data-key='lr']").is_visible()
        page.locator("#only-differs").uncheck()
        # the patch, coloured line by line, and the tracked file's diff
        added = page.locator(".casmon-add").all_inner_texts()
        removed = page.locator(".casmon-del").all_inner_texts()
        assert "+lr = 0.02" in added and "+lr: 0.02" in added and "-lr: 0.1" in removed
        green = page.locator(".casmon-add").first.evaluate("e => getComputedStyle(e).backgroundColor")
        assert green == "rgb(218, 251, 225)"
        groups = page.locator("#groups tr", has=page.locator("th", has_text="all outputs"))
        assert groups.locator(".group").all_inner_texts() == ["3-again, 1-base"]
        found = page.locator("p.divergence.found")
        assert found.count() == 1 and "_step call 2" in found.inner_text()
        found.locator("a").nth(1).click()
        page.wait_for_url(re.compile(r"/call\?"))
        assert page.locator("h1").inner_text().endswith("#5")  # the second _step call of the second run

        # -- a run: its charts (one per metric), patch, output, links to its calls
        page.goto(base + "/run/2", wait_until="load")
        page.wait_for_selector("#charts[data-ready]")
        assert page.locator("h1 code").inner_text() == f"2-{HOSTILE}"
        assert page.locator("#charts figure.chart-box canvas").count() == 3  # acc, loss, info curve
        assert "training with lr=0.02" in page.locator("pre.output").inner_text()
        page.locator("a.run-calls").click()
        page.wait_for_url(re.compile(r"/calls\?run=2"))
        assert page.locator("figure.histogram rect.mark.bin").count() >= 1
        assert page.locator("h2#list + table tr").count() == 4  # a header and the run's three calls
        page.goto(base + "/run/4", wait_until="load")
        assert page.get_by_text(HOSTILE_KEY, exact=True).count() == 1  # an info key that is markup: text

        # -- calls, cache, store, and an error page
        page.goto(base + "/calls", wait_until="load")
        page.locator("#calls-filter select[name=fn]").select_option("tests.ui.test_ui._step")
        page.locator("#calls-filter button").click()
        page.wait_for_url(re.compile(r"fn=tests\.ui\.test_ui\._step"))
        assert page.locator("h2#list + table tr").count() == 10
        page.goto(base + "/store", wait_until="load")
        assert page.locator("svg.chart rect.mark.bar").count() >= 3
        page.goto(base + "/run/nope", wait_until="load")
        assert "no run 'nope'" in page.locator("#error").inner_text()
        _clean(w)
    finally:
        srv.close()
    assert (tmp_path / "compare.png").stat().st_size > 10_000
    assert not built["marker"].exists()


def test_wide_pages_fit_a_laptop_screen(tmp_path, wide, browser):  # noqa: F811
    """Seven runs with 500-element lists: no page is wider than the 1,400 px window; a bad filter says why."""
    srv = Served(wide)
    base = f"http://127.0.0.1:{srv.port}"
    try:
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        w = watch(page, lambda url: url.startswith(base + "/"))
        tails = "&".join(f"run={i}" for i in range(1, 8))
        for name, path in (("runs", "/"), ("compare", f"/compare?{tails}"), ("run", "/run/4")):
            page.goto(base + path, wait_until="load")
            if name != "runs":
                page.wait_for_selector("#charts[data-ready]")
                assert page.locator("#charts canvas").count() >= 1
            page.screenshot(path=str(tmp_path / f"{name}.png"), full_page=True)
            width = page.evaluate("document.documentElement.scrollWidth")
            assert width <= 1400, (name, width)
        # the compare chart grouped by lr: three groups of runs, each a mean line with a band
        page.goto(base + f"/compare?{tails}", wait_until="load")
        page.wait_for_selector("#charts[data-ready]")
        page.locator("#charts select[data-control=group]").select_option("lr")
        assert page.evaluate(f"{UPLOT}.series.filter(s => !s.band).map(s => s.label)") == [
            "step", "lr=0.1 (3 runs)", "lr=0.03 (2 runs)", "lr=0.01 (2 runs)"]
        assert page.evaluate("document.documentElement.scrollWidth") <= 1400
        for q, words in (("loss%3C", "needs a value after '<'"), ("nosuchkey%3E1", "no run has a column 'nosuchkey'")):
            page.goto(base + "/?q=" + q, wait_until="load")
            assert words in page.locator("#filter-error").inner_text()
            assert page.locator("table#runs tbody tr").count() == 7  # every run, not "0 of 7"
        _clean(w)
    finally:
        srv.close()


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


def test_a_live_run_in_another_process_updates_without_a_reload(tmp_path, browser):
    """A run that logs for a few seconds in its own process: the run's page shows new points, output and at
    last ``ok``, the runs table its status, and neither page reloads."""
    path = tmp_path / "store"
    casmon.open(path).close()
    env = {**os.environ, "CASMON_HEARTBEAT_S": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "tests.ui.live_writer", str(path), "6"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    srv = Served(path)
    base = f"http://127.0.0.1:{srv.port}"
    try:
        deadline = time.monotonic() + 30
        while not [r for r in _get(base + "/api/runs?since=0")["runs"] if r["status"] == "running" and r["metrics"]]:
            assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read() if proc.poll() else "slow"
            time.sleep(0.2)
        table = browser.new_page(viewport={"width": 1400, "height": 900})
        run = browser.new_page(viewport={"width": 1400, "height": 900})
        w1 = watch(table, lambda url: url.startswith(base + "/"))
        w2 = watch(run, lambda url: url.startswith(base + "/"))
        table.goto(base + "/", wait_until="load")
        run.goto(base + "/run/1", wait_until="load")
        for p in (table, run):
            p.evaluate("window.notReloaded = true")
        assert table.locator("tr[data-run='1'] td[data-col=status]").inner_text() == "running"
        assert run.locator("#run-status").inner_text() == "running"
        n = run.locator("#run-metrics tr[data-metric=loss] [data-k=n]")
        first = int(n.inner_text().replace(",", ""))
        run.wait_for_function(f"""() => {{
            const c = document.querySelector("#run-metrics tr[data-metric=loss] [data-k=n]");
            return c && parseInt(c.textContent.replace(/,/g, "")) > {first}; }}""", timeout=15_000)
        run.wait_for_function("() => document.querySelectorAll('#charts canvas').length >= 2", timeout=10_000)
        points = run.evaluate("document.querySelector('#charts .chart-box[data-metric=loss] .chart-area').uplot"
                              ".data[0].length")
        assert points > 1
        run.wait_for_function("() => document.querySelector('#run-status').textContent === 'ok'", timeout=30_000)
        table.wait_for_function(
            "() => document.querySelector(\"tr[data-run='1'] td[data-col=status]\").textContent === 'ok'", timeout=30_000)
        assert "step " in run.locator("#output-tail").inner_text()
        final = int(n.inner_text().replace(",", ""))
        assert final > first
        run.wait_for_function(  # the chart's last points, drawn once the run ended
            f"() => document.querySelector('#charts .chart-box[data-metric=loss] .chart-area').uplot.data[0].length"
            f" >= {min(final, 2000)}", timeout=10_000)
        assert table.evaluate("window.notReloaded") and run.evaluate("window.notReloaded")
        _clean(w1)
        _clean(w2)
    finally:
        srv.close()
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=60)
    assert proc.returncode == 0


def test_report_file_opens_offline(tmp_path, built, browser):  # noqa: F811
    """The report file alone, from file://: uPlot's chart, tables, diff and script work; nothing is fetched."""
    from casmon.ui import write_report

    s = casmon.open(built["path"], read_only=True, trust=False, create=False)
    try:
        path, n = write_report(s, ["1", "2", "3"], tmp_path / "report.html")
    finally:
        s.close()
    assert n == 3
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    w = watch(page, lambda url: url.startswith("file://"))
    page.goto(path.as_uri(), wait_until="load")
    page.wait_for_selector("#charts[data-ready]")
    assert page.locator("#charts canvas").count() == 1  # the inline scripts ran, with the inline points
    page.locator("#charts select[data-control=metric]").select_option("acc")
    assert page.evaluate(f"{UPLOT}.data[0].length") == 20
    assert "+lr = 0.02" in page.locator(".casmon-add").all_inner_texts()
    assert page.locator("a").count() == 0  # nothing to follow in a file sent by mail
    bg = page.locator(".casmon-add").first.evaluate("e => getComputedStyle(e).backgroundColor")
    assert bg == "rgb(218, 251, 225)"  # the inline style sheet applied under the file's own policy
    assert page.evaluate("document.documentElement.scrollWidth") <= 1400
    page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
    _clean(w)
    assert not built["marker"].exists()
