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

import numpy as np
import pytest

import casmon
from tests.conftest import ROOT
from tests.support.browser import needs_chromium, watch
from tests.ui.test_ui import HOSTILE, HOSTILE_KEY, Served, built, wide  # noqa: F401 - fixtures: the module's stores

pytestmark = needs_chromium

#: The dashboard's loss panel's uPlot instance (casmon-charts.js keeps it on its element), and the scatter's.
UPLOT = "document.querySelector(\"#charts .chart-box[data-metric='loss'] .chart-area\").uplot"
SCATTER = "document.querySelector('#charts .scatter-area').uplot"
#: The loss panel drawn (a panel draws when it comes into view).
LOSS_DRAWN = "() => { const a = document.querySelector(\"#charts .chart-box[data-metric='loss'] .chart-area\"); return a && a.uplot; }"


def _loss_panel(page) -> None:
    page.locator("#charts .chart-box[data-metric='loss']").scroll_into_view_if_needed()
    page.wait_for_function(LOSS_DRAWN, timeout=30_000)
#: How far each group header's left and right edges are from those of its first and last visible column.
EDGES = """() => {
    const out = {}, seen = h => h.getClientRects().length > 0;
    for (const [group, prefixes] of [["metric", ["metric."]], ["param", ["param.", "info."]]]) {
        const heads = [...document.querySelectorAll("#runs thead tr:last-child th[data-col]")]
            .filter(h => seen(h) && prefixes.some(p => h.dataset.col.startsWith(p)));
        const g = [...document.querySelectorAll("#runs thead tr.col-groups th")].find(
            th => seen(th) && th.classList.contains(group));
        const a = g.getBoundingClientRect(), f = heads[0].getBoundingClientRect(), l = heads.at(-1).getBoundingClientRect();
        out[group] = [Math.round(a.left - f.left), Math.round(a.right - l.right)];
    }
    return out;
}"""


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
        # casmon's own scripts, and the parallel coordinates' data block (read as data): nothing from the store
        assert page.evaluate("[...document.scripts].map(s => s.src ? new URL(s.src).pathname : s.type)") == [
            "/static/casmon-ui.js", "/static/casmon-parcoords.js", "application/json"]
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
        # hiding fixed columns keeps the group header row over its columns (the first group's span shrinks too)
        for col in ("comment", "commit", "dirty", "param.lr"):
            page.locator(f"#column-chooser input[value='{col}']").uncheck()
        assert page.evaluate(EDGES) == {"metric": [0, 0], "param": [0, 0]}
        for col in ("comment", "commit", "dirty", "param.lr"):
            page.locator(f"#column-chooser input[value='{col}']").check()
        assert page.evaluate(EDGES) == {"metric": [0, 0], "param": [0, 0]}

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
        _loss_panel(page)
        page.screenshot(path=str(tmp_path / "compare.png"), full_page=True)

        # the dashboard: a panel per metric and info curve, each with a line per run
        assert page.locator("#charts figure.chart-box").evaluate_all("fs => fs.map(f => f.dataset.metric)") == [
            "acc", "loss", "info:curve"]
        assert page.evaluate(f"{UPLOT}.series.map(s => s.label)") == ["step", "3-again", f"2-{HOSTILE}", "1-base"]
        # hover: the legend shows the values under the cursor
        loss_box = "#charts .chart-box[data-metric='loss']"
        over = page.locator(f"{loss_box} .u-over")
        box = over.bounding_box()
        page.mouse.move(box["x"] + box["width"] * 0.5, box["y"] + box["height"] * 0.5)
        values = page.locator(f"{loss_box} .u-legend .u-series .u-value").all_inner_texts()
        step = int(values[0])
        assert float(values[2]) == pytest.approx(0.25 * 20 / (step + 1), rel=1e-3), values  # 2-…'s loss at that step
        # log scale, and back
        page.locator(f"{loss_box} input[data-panel-log]").check()
        assert page.evaluate(f"{UPLOT}.scales.y.distr") == 3
        page.locator(f"{loss_box} input[data-panel-log]").uncheck()
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
        assert labels == ["step", "lr=0.02 (1 run)", "lr=0.1 (2 runs)"]  # in order of the value
        page.locator("#charts select[data-control=group]").select_option("")
        # an info curve (50 points) over its index; the scatter of a parameter against a metric
        page.locator("#charts .chart-box[data-metric='info:curve']").scroll_into_view_if_needed()
        page.wait_for_function("() => document.querySelector(\"#charts .chart-box[data-metric='info:curve'] .chart-area\").uplot")
        assert page.evaluate("document.querySelector(\"#charts .chart-box[data-metric='info:curve'] .chart-area\")"
                             ".uplot.series[0].label") == "index"
        page.locator("#charts select[data-control=sx]").select_option("lr")
        page.locator("#charts select[data-control=sy]").select_option("loss")
        pts = page.evaluate(f"{SCATTER}.data")
        assert pts[0] == [0.02, 0.1, 0.1] and sorted(v for col in pts[1:] for v in col if v is not None) == [0.25, 0.5, 0.5]
        # a legend click hides a run
        page.locator(f"{loss_box} .u-legend .u-series").nth(1).click()
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
        _loss_panel(page)
        page.wait_for_function("() => document.querySelectorAll('#charts figure.chart-box canvas').length === 3")
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
                _loss_panel(page)
            page.screenshot(path=str(tmp_path / f"{name}.png"), full_page=True)
            width = page.evaluate("document.documentElement.scrollWidth")
            assert width <= 1400, (name, width)
        # the compare chart grouped by lr: three groups of runs, each a mean line with a band
        page.goto(base + f"/compare?{tails}", wait_until="load")
        page.wait_for_selector("#charts[data-ready]")
        _loss_panel(page)
        page.locator("#charts select[data-control=group]").select_option("lr")
        assert page.evaluate(f"{UPLOT}.series.filter(s => !s.band).map(s => s.label)") == [
            "step", "lr=0.01 (2 runs)", "lr=0.03 (2 runs)", "lr=0.1 (3 runs)"]  # numerically: not 0.1 before 0.01
        assert page.evaluate("document.documentElement.scrollWidth") <= 1400
        for q, words in (("loss%3C", "needs a value after '<'"), ("nosuchkey%3E1", "no run has a column 'nosuchkey'")):
            page.goto(base + "/?q=" + q, wait_until="load")
            assert words in page.locator("#filter-error").inner_text()
            assert page.locator("table#runs tbody tr").count() == 7  # every run, not "0 of 7"
        _clean(w)
    finally:
        srv.close()


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """Twelve runs of a sweep with forty parameters each and a long comment: loss from about 1 to 1e-4."""
    from casmon.runs.imported import write_run

    path = tmp_path_factory.mktemp("sweep") / "store"
    s = casmon.open(path)
    steps = np.arange(200)
    for i in range(12):
        lr = [10, 2, 0.5][i % 3]  # as text, "10" < "2": a legend must order them as numbers
        loss = 10.0 ** (-4 * steps / 199) * (1 + 0.1 * i)
        params = {"lr": lr, **{f"p{k:02d}": float(k * i) for k in range(40)}}
        write_run(s, comment=f"sweep {i} " + "with a comment long enough to need room " * 2, start=1.7e9 + i * 100,
                  end=1.7e9 + i * 100 + 60, params=params, info={"final_acc": [0.5, 0.75][i % 2]},
                  metrics={"loss": (steps, loss, 1.7e9 + i * 100 + steps * 0.1)})
    s.close()
    return path


def test_many_runs_and_parameters(sweep, browser):
    """Forty parameters: the logged metric is on screen at 1,400 px without scrolling, the start cell is one
    line; twelve runs on one chart: twelve colours; a log scale ticks at powers of ten, labelled alike; group by
    parameters only (not final_acc), groups in numeric order; the scatter has a log x."""
    srv = Served(sweep)
    base = f"http://127.0.0.1:{srv.port}"
    try:
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        w = watch(page, lambda url: url.startswith(base + "/"))
        page.goto(base + "/", wait_until="load")
        assert page.evaluate("document.documentElement.scrollWidth") <= 1400
        box = page.locator("#runs").locator("xpath=..").bounding_box()
        loss = page.locator("#runs th[data-col='metric.loss']").bounding_box()
        assert loss["x"] + loss["width"] <= box["x"] + box["width"], (loss, box)  # no sideways scrolling to see it
        lines = page.evaluate("""() => [...document.querySelectorAll("#runs td[data-col=start]")].map(td => {
            const r = document.createRange(); r.selectNodeContents(td); return r.getClientRects().length; })""")
        assert lines == [1] * 12
        tails = "&".join(f"run={i}" for i in range(1, 13))
        page.goto(base + f"/compare?{tails}", wait_until="load")
        page.wait_for_selector("#charts[data-ready]")
        _loss_panel(page)
        strokes = page.evaluate(f"{UPLOT}.series.slice(1).filter(s => !s.band).map(s => s.stroke())")
        assert len(strokes) == 12 and len(set(strokes)) == 12, strokes
        page.locator("#charts .chart-box[data-metric='loss'] input[data-panel-log]").check()
        assert page.evaluate(f"{UPLOT}.axes[1]._splits") == [0.0001, 0.001, 0.01, 0.1, 1, 10]
        assert page.evaluate(f"{UPLOT}.axes[1]._values") == ["0.0001", "0.001", "0.01", "0.1", "1", "10"]
        options = page.locator("#charts select[data-control=group] option").evaluate_all("os => os.map(o => o.value)")
        assert "lr" in options and not [o for o in options if o.startswith("info.")], options
        page.locator("#charts select[data-control=group]").select_option("lr")
        assert page.evaluate(f"{UPLOT}.series.filter(s => !s.band).map(s => s.label)") == [
            "step", "lr=0.5 (4 runs)", "lr=2 (4 runs)", "lr=10 (4 runs)"]
        page.locator("#charts select[data-control=sx]").select_option("lr")
        assert page.evaluate(f"{SCATTER}.scales.x.distr") == 1
        page.locator("#charts input[data-control=logx]").check()
        assert page.evaluate(f"{SCATTER}.scales.x.distr") == 3
        assert page.evaluate(f"{SCATTER}.axes[0]._values") == ["0.1", "1", "10"]  # lr 0.5 to 10
        assert page.evaluate("document.documentElement.scrollWidth") <= 1400
        _clean(w)
    finally:
        srv.close()


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


def test_a_live_run_in_another_process_updates_without_a_reload(tmp_path, browser):
    """A run that starts in its own process while the runs table is open, logs for a few seconds and fails: the
    table puts its row in within one poll (no run was live: a poll every 5 s) and follows its status and info
    cells; its page shows new points, output and at last ``failed`` with the traceback; nothing reloads.
    The run goes on until the test has seen it live on both pages, then is told to end (a stop file)."""
    from casmon.runs.imported import write_run

    path = tmp_path / "store"
    s = casmon.open(path)
    write_run(s, comment="before", start=time.time() - 100, end=time.time() - 90, params={"lr": 0.5},
              info={"final": 0.5}, metrics={"loss": ([0, 1], [1.0, 0.5], [time.time() - 100] * 2)})
    s.close()
    srv = Served(path)
    base = f"http://127.0.0.1:{srv.port}"
    proc = None
    try:
        table = browser.new_page(viewport={"width": 1400, "height": 900})
        run = browser.new_page(viewport={"width": 1400, "height": 900})
        w1 = watch(table, lambda url: url.startswith(base + "/"))
        w2 = watch(run, lambda url: url.startswith(base + "/"))
        table.goto(base + "/", wait_until="load")
        table.evaluate("window.notReloaded = true")
        assert table.locator("#runs tbody tr").count() == 1
        env = {**os.environ, "CASMON_HEARTBEAT_S": "1"}
        stop = tmp_path / "stop"
        proc = subprocess.Popen([sys.executable, "-m", "tests.ui.live_writer", str(path), str(stop), "fail"], cwd=ROOT,
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 30
        while not [r for r in _get(base + "/api/runs?since=0")["runs"] if r["status"] == "running" and r["metrics"]]:
            assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read() if proc.poll() else "slow"
            time.sleep(0.2)
        started = time.monotonic()
        table.wait_for_selector("#runs tr[data-run='2'] td[data-col=status] .casmon-status", timeout=8_000)
        assert time.monotonic() - started < 7  # one idle poll (5 s), not 15
        assert table.locator("#runs tbody tr").first.get_attribute("data-run") == "2"  # newest first: on top
        assert table.locator("#runs-count").inner_text() == "2 runs"
        assert table.locator("#runs tr[data-run='2'] td[data-col=run] a").get_attribute("href") == "/run/2"
        assert table.locator("#runs tr[data-run='2'] td[data-col='param.lr']").inner_text() == "0.1"
        run.goto(base + "/run/2", wait_until="load")
        run.evaluate("window.notReloaded = true")
        assert table.locator("tr[data-run='2'] td[data-col=status]").inner_text() == "running"
        assert run.locator("#run-status").inner_text() == "running"
        assert run.locator("#run-traceback").is_hidden()
        n = run.locator("#run-metrics tr[data-metric=loss] [data-k=n]")
        first = int(n.inner_text().replace(",", ""))
        run.wait_for_function(f"""() => {{
            const c = document.querySelector("#run-metrics tr[data-metric=loss] [data-k=n]");
            return c && parseInt(c.textContent.replace(/,/g, "")) > {first}; }}""", timeout=15_000)
        run.wait_for_function("() => document.querySelectorAll('#charts canvas').length >= 2", timeout=10_000)
        points = run.evaluate("document.querySelector('#charts .chart-box[data-metric=loss] .chart-area').uplot"
                              ".data[0].length")
        assert points > 1
        stop.touch()  # seen live on both pages: the run ends now, and fails
        run.wait_for_function("() => document.querySelector('#run-status').textContent === 'failed'", timeout=30_000)
        run.wait_for_selector("#run-traceback", state="visible", timeout=5_000)  # shown without a reload
        assert "RuntimeError: diverged at step" in run.locator("#run-traceback").inner_text()
        assert run.locator("h2#traceback").is_visible()
        table.wait_for_function(
            "() => document.querySelector(\"tr[data-run='2'] td[data-col=status]\").textContent === 'failed'",
            timeout=30_000)
        table.wait_for_function(  # an info value the run set at its end: its cell fills in
            "() => document.querySelector(\"tr[data-run='2'] td[data-col='info.final']\").textContent === '0.9'",
            timeout=10_000)
        assert "new columns" in table.locator("#new-runs").inner_text()  # acc: a metric the table had no column for
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
        if proc is not None:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=60)
    assert proc.returncode == 3  # it raised, as told


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
    acc = "document.querySelector(\"#charts .chart-box[data-metric='acc'] .chart-area\").uplot"
    page.wait_for_function(f"() => {acc}")  # the inline scripts ran, with the inline points
    assert page.evaluate(f"{acc}.data[0].length") == 20
    assert "+lr = 0.02" in page.locator(".casmon-add").all_inner_texts()
    assert page.locator("a").count() == 0  # nothing to follow in a file sent by mail
    bg = page.locator(".casmon-add").first.evaluate("e => getComputedStyle(e).backgroundColor")
    assert bg == "rgb(218, 251, 225)"  # the inline style sheet applied under the file's own policy
    assert page.evaluate("document.documentElement.scrollWidth") <= 1400
    page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
    _clean(w)
    # one run: its own page, offline too (a chart per metric and info curve, its output)
    s = casmon.open(built["path"], read_only=True, trust=False, create=False)
    try:
        one, n = write_report(s, ["2"], tmp_path / "run2.html")
    finally:
        s.close()
    assert n == 1
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    w = watch(page, lambda url: url.startswith("file://"))
    page.goto(one.as_uri(), wait_until="load")
    page.wait_for_selector("#charts[data-ready]")
    assert page.locator("h1").inner_text() == f"Run 2-{HOSTILE}"
    _loss_panel(page)
    page.wait_for_function("() => document.querySelectorAll('#charts figure.chart-box canvas').length === 3")
    assert "training with lr=0.02" in page.locator("pre.output").inner_text()
    assert page.evaluate("document.documentElement.scrollWidth") <= 1400
    _clean(w)
    assert not built["marker"].exists()


def test_a_cache_entry_link_opens_the_entry_view(built, browser):  # noqa: F811
    """A function's cache page links each entry to its own view: the record, its parameters, its neighbours."""
    srv = Served(built["path"])
    base = f"http://127.0.0.1:{srv.port}"
    try:
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        w = watch(page, lambda url: url.startswith(base + "/"))
        page.goto(base + "/cache?fn=_square", wait_until="load")
        assert page.locator("table#versions tr[id^=version-]").count() == 1
        link = page.locator("table#entries td[data-k=key] a")
        assert link.count() == 1
        key = link.inner_text()
        link.click()
        page.wait_for_url(re.compile(r"/cache\?fn=tests\.ui\.test_ui\._square&entry=[0-9a-f]{32}$"))
        assert page.locator("h1").inner_text().startswith(f"Entry {key[:12]} of tests.ui.test_ui._square")
        assert "array(1000,) float64" in page.locator("table#entry-record").inner_text()
        assert page.locator("table#entry-params td code").first.inner_text() == "n"
        assert "no other live entry" in page.locator("main").inner_text()
        page.locator("table#entry-record a", has_text="#1").click()  # its code version, on the function's page
        page.wait_for_url(re.compile(r"/cache\?fn=tests\.ui\.test_ui\._square#version-1$"))
        _clean(w)
    finally:
        srv.close()


#: For the chart on the page: the darkest pixel (0: white, 255: black in some channel) in a 5-pixel column around
#: step X at value Y, and the canvas position of that point.
INK_AT = """([x, y]) => {
    const u = document.querySelector('#charts .chart-area').uplot;
    const px = Math.round(u.valToPos(x, 'x', true)), py = Math.round(u.valToPos(y, 'y', true));
    const d = u.ctx.getImageData(px - 2, py - 2, 5, 5).data;
    let ink = 0;
    for (let i = 0; i < d.length; i += 4) {  // over white: the canvas is transparent where nothing is drawn
        const a = d[i + 3] / 255;
        ink = Math.max(ink, 255 - Math.min(d[i], d[i + 1], d[i + 2]) * a - 255 * (1 - a));
    }
    return {ink, px, py, top: u.bbox.top, height: u.bbox.height};
}"""


def test_a_spike_among_a_million_points_is_drawn_at_full_height_and_nan_and_inf_are_marked(tmp_path, browser):
    from casmon.runs.imported import write_run

    n = 1_000_000
    values = np.linspace(1.0, 0.5, n)
    values[123_457] = 1000.0
    values[700_001] = float("nan")
    values[900_000] = float("inf")
    s = casmon.open(tmp_path / "s")
    write_run(s, comment="spiky", start=1.7e9, end=1.7e9 + 60, metrics={"loss": (np.arange(n), values, np.zeros(n))})
    s.close()
    srv = Served(tmp_path / "s")
    try:
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        w = watch(page, lambda url: url.startswith(f"http://127.0.0.1:{srv.port}/"))
        page.goto(f"http://127.0.0.1:{srv.port}/run/1", wait_until="load")
        page.wait_for_selector("#charts[data-ready]")
        page.screenshot(path=str(tmp_path / "spike.png"), full_page=True)
        spike = [page.evaluate(INK_AT, [123_457, y]) for y in (900, 500, 100)]
        assert all(p["ink"] > 60 for p in spike), spike  # the band's edge goes up to the spike and back, seen
        assert spike[0]["py"] - spike[0]["top"] < 0.2 * spike[0]["height"]  # ... to the top of the plot
        assert page.evaluate(INK_AT, [300_000, 500])["ink"] < 30  # where there is no spike, nothing is drawn
        assert page.locator("#charts .chart-marks").inner_text() == "1-spiky: \u2715 NaN \u00d71, \u25b2 +inf \u00d71"
        assert page.locator('#run-metrics [data-k="max"]').inner_text() == "inf"
        _clean(w)
    finally:
        srv.close()


@pytest.mark.parametrize("values", [[0.75], [0.75, float("nan")]], ids=["one-point", "one-point-then-nan"])
def test_a_metric_with_one_finite_point_draws_that_point(tmp_path, browser, values):
    """Lines are drawn without point markers, so a series with a single finite value (a run that logged once,
    or diverged at its second step) drew nothing at all: an empty chart."""
    from casmon.runs.imported import write_run

    n = len(values)
    s = casmon.open(tmp_path / "s")
    write_run(s, comment="short", start=1.7e9, end=1.7e9 + 60,
              metrics={"loss": (np.arange(n), np.array(values), np.zeros(n))})
    s.close()
    srv = Served(tmp_path / "s")
    try:
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        w = watch(page, lambda url: url.startswith(f"http://127.0.0.1:{srv.port}/"))
        page.goto(f"http://127.0.0.1:{srv.port}/run/1", wait_until="load")
        page.wait_for_selector("#charts[data-ready]")
        page.screenshot(path=str(tmp_path / "one.png"), full_page=True)
        assert page.evaluate(INK_AT, [0, 0.75])["ink"] > 60
        _clean(w)
    finally:
        srv.close()
