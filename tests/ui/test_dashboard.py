"""The metrics dashboard (run and compare pages) and the runs page's parallel coordinates.

Server side, without a browser: ``/api/run/NAME/metrics`` groups a run's metrics by prefix and downsamples the
series it is asked for; an unknown metric is a 404 with a JSON error. In headless Chromium (as
``test_ui_browser.py`` drives it): a panel per metric in collapsible groups, cursors and zoom that follow each
other across panels, the compare page's runs overlaid, and the runs page's parallel coordinates with brushing.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import casmon
from casmon.ui.series import metric_groups
from tests.support.browser import needs_chromium, watch
from tests.ui.test_ui import Served

DASH = ["train/loss", "train/acc", "val/loss", "sys/cpu"]


def _store(path, runs: int = 2, n: int = 50, extra: dict | None = None):
    """``runs`` runs logging train/loss, train/acc, val/loss and sys/cpu over ``n`` steps, with parameters."""
    from casmon.runs.imported import write_run

    s = casmon.open(path)
    steps = np.arange(n)
    for i in range(runs):
        metrics = {"train/loss": (steps, 1.0 / (steps + 1) * (1 + i), 1.7e9 + steps),
                   "train/acc": (steps, 1 - 0.5 / (steps + 1) - 0.05 * i, 1.7e9 + steps),
                   "val/loss": (steps[::5], 1.2 / (steps[::5] + 1) * (1 + i), 1.7e9 + steps[::5]),
                   "sys/cpu": (steps, 50 + 10 * np.sin(steps / 5 + i), 1.7e9 + steps)}
        metrics.update(extra or {})
        write_run(s, comment=f"r{i}", start=1.7e9 + i, end=1.7e9 + i + n,
                  params={"lr": [0.1, 0.01, 0.001][i % 3], "opt": ["adam", "sgd"][i % 2], "layers": 2 + i},
                  metrics=metrics)
    s.close()
    return path


@pytest.fixture
def served(tmp_path):
    srv = Served(_store(tmp_path / "s", extra={"loss": (np.arange(10_000), np.linspace(2, 1, 10_000),
                                                        np.zeros(10_000))}))
    yield srv
    srv.close()


def _api(srv, path):
    status, headers, body = srv.request(path)
    assert headers["content-type"].startswith("application/json"), (path, status, body[:300])
    return status, json.loads(body)


def test_metrics_are_grouped_by_prefix_train_val_other_prefixes_the_ungrouped_and_the_sampled_sys_last():
    # sys/ is sampled, not logged: an 8-GPU node's 39 panels never stand before the user's own "loss"
    got = metric_groups(["sys/gpu0/util", "loss", "val/loss", "train/loss", "alpha/x", "train/acc", "info:curve", "/odd"])
    assert got == [{"group": "train", "metrics": ["train/acc", "train/loss"]},
                   {"group": "val", "metrics": ["val/loss"]},
                   {"group": "alpha", "metrics": ["alpha/x"]},
                   {"group": "", "metrics": ["/odd", "loss"]},
                   {"group": "info", "metrics": ["info:curve"]},
                   {"group": "sys", "metrics": ["sys/gpu0/util"]}]
    assert metric_groups([]) == []


def test_the_run_metrics_endpoint_groups_every_metric_and_returns_only_those_named(served):
    status, got = _api(served, "/api/run/1/metrics")
    assert status == 200 and got["series"] == {}
    assert [(g["group"], g["metrics"]) for g in got["groups"]] == [
        ("train", ["train/acc", "train/loss"]), ("val", ["val/loss"]), ("", ["loss"]), ("sys", ["sys/cpu"])]
    status, got = _api(served, "/api/run/2/metrics?name=val/loss&name=train/acc")
    assert status == 200 and set(got["series"]) == {"val/loss", "train/acc"}
    v = got["series"]["val/loss"]
    assert v["step"] == list(range(0, 50, 5)) and v["value"][1] == pytest.approx(1.2 / 6 * 2) and "min" not in v


def test_the_run_metrics_endpoint_reads_a_runs_records_once_for_every_metric_it_is_asked(served, monkeypatch):
    # A long run's points are one record per flush (a sampled GPU node: one every 10 s, dozens of sys/ metrics):
    # reading them once per metric asked for would read them dozens of times.
    from casmon.runs import listing

    reads = []
    real = listing.read_series
    monkeypatch.setattr(listing, "read_series", lambda *a, **k: reads.append(a[3:]) or real(*a, **k))
    status, got = _api(served, "/api/run/1/metrics?name=train/loss&name=train/acc&name=val/loss&name=sys/cpu")
    assert status == 200 and set(got["series"]) == set(DASH) and len(reads) == 1
    assert got["series"]["val/loss"]["step"] == list(range(0, 50, 5))
    status, got = _api(served, "/api/run/1/metrics?name=train/loss&name=train/acc&name=loss")
    assert status == 200 and set(got["series"]) == {"train/loss", "train/acc", "loss"}
    assert len(reads) == 2 and set(reads[1][0]) == {"loss"}  # an ended run's series kept: only the new one read


def test_a_report_reads_each_runs_records_once_for_all_its_metrics(tmp_path, monkeypatch):
    from casmon.runs import listing
    from casmon.ui.report import report_html

    path = _store(tmp_path / "s")
    reads = []
    real = listing.read_series
    monkeypatch.setattr(listing, "read_series", lambda *a, **k: reads.append(a[3:]) or real(*a, **k))
    with casmon.open(path, read_only=True) as store:
        html, _n = report_html(store, ["1", "2"])
    assert len([r for r in reads if r and r[0] is not None]) == 2  # one read per run, not one per metric
    assert b"val/loss" in html and b"sys/cpu" in html


@pytest.mark.parametrize("n", [1, 7, 100, 2000])
def test_the_run_metrics_endpoint_downsamples_to_at_most_n_buckets_with_the_envelope(served, n):
    status, got = _api(served, f"/api/run/1/metrics?name=loss&n={n}")
    s = got["series"]["loss"]
    assert status == 200 and s["n"] == 10_000
    assert 1 <= len(s["value"]) <= n and len(s["step"]) == len(s["value"]) == len(s["min"]) == len(s["max"])
    assert min(s["min"]) == pytest.approx(1.0) and max(s["max"]) == pytest.approx(2.0)  # every extreme is in a band
    assert all(lo <= v <= hi for lo, v, hi in zip(s["min"], s["value"], s["max"]))
    assert s["step"] == sorted(s["step"])


@pytest.mark.parametrize("path, status, words", [
    ("/api/run/1/metrics?name=nope", 404, "no metric 'nope'"),
    ("/api/run/1/metrics?name=train/loss&name=val/nope", 404, "no metric 'val/nope'"),
    ("/api/run/99/metrics?name=loss", 404, "no run '99'"),
    ("/api/run/1/metrics?name=loss&n=0", 400, "n: 1 to"),
    ("/api/run/1/metrics?name=loss&n=20001", 400, "n: 1 to"),
    ("/api/run/1/metrics?name=loss&n=x", 400, "whole number"),
    ("/api/run/1/metrics?names=loss", 400, "unknown parameter 'names'"),
    ("/api/run/1/metrics?" + "&".join(f"name=m{i}" for i in range(101)), 400, "at most 100"),
])
def test_bad_dashboard_requests_are_a_json_error_naming_what_is_wrong(served, path, status, words):
    got_status, got = _api(served, path)
    assert got_status == status and words in got["error"], got


def test_a_run_named_metrics_is_still_a_run_and_a_name_with_a_slash_is_no_route(served):
    status, got = _api(served, "/api/run/1")
    assert status == 200 and got["tail"] == "1"
    assert served.request("/api/run/1/x/metrics")[0] == 404


def test_the_pages_carry_the_groups_and_the_runs_page_the_parallel_coordinates_data(served):
    import re

    def block(body, id_):
        return json.loads(re.search(rf'<script type="application/json" id="{id_}">(.*?)</script>', body, re.S).group(1))

    spec = block(served.get("/run/1"), "casmon-chart-data")
    assert [g["group"] for g in spec["groups"]] == ["train", "val", "", "sys"]
    spec = block(served.get("/compare?run=1&run=2"), "casmon-chart-data")
    assert spec["mode"] == "compare" and [g["group"] for g in spec["groups"]] == ["train", "val", "", "sys"]
    pc = block(served.get("/"), "casmon-parcoords-data")
    assert [r["tail"] for r in pc["runs"]] == ["2", "1"]  # the rows the table shows, in its order
    assert pc["runs"][0]["params"] == {"layers": 3, "lr": 0.01, "opt": "sgd"}
    assert pc["runs"][0]["metrics"]["val/loss"]["min"] == pytest.approx(1.2 / 46 * 2)
    assert pc["runs"][0]["href"] == "/run/2"


def test_parallel_coordinates_offer_first_the_parameters_most_runs_have(tmp_path):
    # one Hugging Face run brings 40 parameters the sweep's runs lack: the sweep's lr and depth must stay on screen
    import re

    from casmon.runs.imported import write_run

    s = casmon.open(tmp_path / "s")
    loss = {"loss": (np.arange(3), np.arange(3.0), np.zeros(3))}
    for i in range(3):
        write_run(s, comment=f"sweep{i}", start=1.7e9 + i, end=1.7e9 + i + 3, params={"lr": 0.1 / (i + 1), "depth": 2 + i},
                  metrics=loss)
    write_run(s, comment="hf", start=1.7e9 + 9, end=1.7e9 + 12,
              params={f"accelerator_config.k{j:02d}": j for j in range(40)}, metrics=loss)
    s.close()
    srv = Served(tmp_path / "s")
    try:
        body = srv.get("/")
    finally:
        srv.close()
    pc = json.loads(re.search(r'<script type="application/json" id="casmon-parcoords-data">(.*?)</script>', body,
                              re.S).group(1))
    assert pc["varying"][:2] == ["depth", "lr"] and pc["params"][:2] == ["depth", "lr"]


# -- in a browser ------------------------------------------------------------------------------------------

#: A dashboard panel's uPlot instance.
PANEL = "(m => document.querySelector(`#charts .chart-box[data-metric='${m}'] .chart-area`).uplot)"


def _open(browser, srv, path, ready="#charts[data-ready]"):
    base = f"http://127.0.0.1:{srv.port}"
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    w = watch(page, lambda url: url.startswith(base + "/"))
    page.goto(base + path, wait_until="load")
    page.wait_for_selector(ready, timeout=30_000)
    return page, w


def _clean(w) -> None:
    assert w.foreign == [] and w.dialogs == [] and w.console_errors == [] and w.page_errors == []


def _drawn(page, metrics):
    page.locator("#charts").scroll_into_view_if_needed()
    page.wait_for_function("ms => ms.every(m => { const a = document.querySelector("
                           "`#charts .chart-box[data-metric='${m}'] .chart-area`); return a && a.uplot; })",
                           arg=metrics, timeout=30_000)


@needs_chromium
def test_a_run_shows_a_panel_per_metric_in_groups_with_cursor_and_zoom_following_across_panels(tmp_path, browser):
    srv = Served(_store(tmp_path / "s", runs=1))
    try:
        page, w = _open(browser, srv, "/run/1")
        _drawn(page, DASH)
        groups = page.locator("#charts details.dash-group").evaluate_all(
            "ds => ds.map(d => [d.dataset.group, [...d.querySelectorAll('figure.chart-box')].map(f => f.dataset.metric)])")
        assert groups == [["train", ["train/acc", "train/loss"]], ["val", ["val/loss"]], ["sys", ["sys/cpu"]]]
        assert page.locator("#charts figure.chart-box canvas").count() == 4
        page.screenshot(path=str(tmp_path / "run-dashboard.png"), full_page=True)
        # hovering one panel moves the cursor of the others to the same step
        over = page.locator("#charts .chart-box[data-metric='train/loss'] .u-over")
        box = over.bounding_box()
        page.mouse.move(box["x"] + box["width"] * 0.5, box["y"] + box["height"] * 0.5)
        page.wait_for_function(f"() => {PANEL}('sys/cpu').cursor.idx !== null && {PANEL}('val/loss').cursor.left > 0",
                               timeout=10_000)
        step = page.evaluate(f"{PANEL}('train/loss').data[0][{PANEL}('train/loss').cursor.idx]")
        assert page.evaluate(f"{PANEL}('sys/cpu').data[0][{PANEL}('sys/cpu').cursor.idx]") == step
        # a drag in one panel zooms every panel to the same steps
        page.mouse.move(box["x"] + box["width"] * 0.2, box["y"] + box["height"] * 0.5)
        page.mouse.down()
        page.mouse.move(box["x"] + box["width"] * 0.5, box["y"] + box["height"] * 0.5, steps=5)
        page.mouse.up()
        ranges = {m: page.evaluate(f"[{PANEL}('{m}').scales.x.min, {PANEL}('{m}').scales.x.max]") for m in DASH}
        assert len({tuple(round(v, 6) for v in r) for r in ranges.values()}) == 1, ranges
        lo, hi = ranges["train/loss"]
        assert 0 < lo < hi < 49 and hi - lo < 25
        # smoothing and a per-panel log scale redraw and keep the zoom
        page.locator("#charts .chart-box[data-metric='train/loss'] input[data-panel-log]").check()
        assert page.evaluate(f"{PANEL}('train/loss').scales.y.distr") == 3
        assert page.evaluate(f"{PANEL}('train/acc').scales.y.distr") == 1
        assert page.evaluate(f"{PANEL}('train/loss').scales.x.min") == pytest.approx(lo)
        before = page.evaluate(f"{PANEL}('sys/cpu').data[1].slice(0, 4)")
        page.locator("#charts input[data-control=smooth]").fill("0.9")
        after = page.evaluate(f"{PANEL}('sys/cpu').data[1].slice(0, 4)")
        assert after[0] == pytest.approx(before[0]) and after[3] != pytest.approx(before[3])
        # "reset zoom" zooms every panel out; a drag zooms in again, a double click zooms out too
        page.locator("#charts button.dash-reset").click()
        assert page.evaluate(f"[{PANEL}('sys/cpu').scales.x.min, {PANEL}('sys/cpu').scales.x.max]") == [0, 49]
        assert page.locator("#charts button.dash-reset").is_disabled()
        page.mouse.move(box["x"] + box["width"] * 0.2, box["y"] + box["height"] * 0.5)
        page.mouse.down()
        page.mouse.move(box["x"] + box["width"] * 0.5, box["y"] + box["height"] * 0.5, steps=5)
        page.mouse.up()
        assert page.evaluate(f"{PANEL}('sys/cpu').scales.x.max") < 49
        # steps zoomed are no range of wall-clock time: another x shows every panel whole
        page.locator("#charts select[data-control=x]").select_option("time")
        assert page.evaluate(f"[{PANEL}('sys/cpu').scales.x.min, {PANEL}('sys/cpu').scales.x.max]") == [1.7e9, 1.7e9 + 49]
        page.locator("#charts select[data-control=x]").select_option("step")
        page.locator("#charts .chart-box[data-metric='val/loss'] .u-over").dblclick()
        assert page.evaluate(f"[{PANEL}('train/acc').scales.x.min, {PANEL}('train/acc').scales.x.max]") == [0, 49]
        assert page.evaluate(f"[{PANEL}('val/loss').scales.x.min, {PANEL}('val/loss').scales.x.max]") == [0, 45]
        # a group collapses; a window resized meanwhile, it opens at the new width
        page.locator("#charts details.dash-group[data-group=train] > summary").click()
        assert page.locator("#charts .chart-box[data-metric='train/loss']").is_hidden()
        assert page.locator("#charts .chart-box[data-metric='sys/cpu']").is_visible()
        wide = page.evaluate(f"{PANEL}('sys/cpu').width")
        page.set_viewport_size({"width": 1000, "height": 900})
        page.wait_for_function(f"w => {PANEL}('sys/cpu').width !== w", arg=wide, timeout=10_000)
        page.locator("#charts details.dash-group[data-group=train] > summary").click()
        page.wait_for_function(f"() => Math.abs({PANEL}('train/loss').width - {PANEL}('sys/cpu').width) <= 2",
                               timeout=10_000)
        _clean(w)
    finally:
        srv.close()


@needs_chromium
def test_the_compare_page_overlays_the_runs_in_every_panel_with_a_legend(tmp_path, browser):
    srv = Served(_store(tmp_path / "s", runs=2))
    try:
        page, w = _open(browser, srv, "/compare?run=1&run=2")
        _drawn(page, DASH)
        for m in DASH:
            assert page.evaluate(f"{PANEL}('{m}').series.filter(s => !s.band).map(s => s.label)") == ["step", "1-r0", "2-r1"]
        legend = page.locator("#charts .chart-box[data-metric='val/loss'] .u-legend .u-series .u-label").all_inner_texts()
        assert legend[1:3] == ["1-r0", "2-r1"]
        assert page.evaluate(f"{PANEL}('val/loss').data[2][1]") == pytest.approx(1.2 / 6 * 2)  # 2-r1 at step 5
        page.screenshot(path=str(tmp_path / "compare-dashboard.png"), full_page=True)
        _clean(w)
    finally:
        srv.close()


@needs_chromium
def test_panels_below_the_fold_load_only_when_scrolled_into_view(tmp_path, browser):
    extra = {f"sys/m{i:03d}": (np.arange(20), np.arange(20.0) + i, np.zeros(20)) for i in range(60)}
    srv = Served(_store(tmp_path / "s", runs=1, n=20, extra=extra))
    try:
        page, w = _open(browser, srv, "/run/1")
        asked = []
        page.on("request", lambda r: asked.append(r.url) if "/metrics?" in r.url else None)
        assert page.locator("#charts .chart-box canvas").count() == 0  # the metrics table fills the window
        page.locator("#charts .chart-box[data-metric='train/acc']").scroll_into_view_if_needed()
        page.wait_for_function(f"() => {PANEL}('train/acc')", timeout=30_000)
        drawn = page.evaluate("document.querySelectorAll('#charts .chart-box canvas').length")
        assert page.locator("#charts figure.chart-box").count() == 64 and 0 < drawn < 40, drawn
        last = page.locator("#charts .chart-box[data-metric='sys/m059']")
        assert last.locator("canvas").count() == 0
        last.scroll_into_view_if_needed()
        page.wait_for_function(f"() => {PANEL}('sys/m059')", timeout=30_000)
        assert page.evaluate(f"{PANEL}('sys/m059').data[1][3]") == 62.0
        assert asked and all(u.count("name=") < 40 for u in asked)  # never all 64 at once
        assert page.evaluate("document.querySelectorAll('#charts .chart-box canvas').length") < 64
        _clean(w)
    finally:
        srv.close()


@needs_chromium
def test_parallel_coordinates_draw_a_line_per_run_and_brushing_an_axis_hides_the_others(tmp_path, browser):
    srv = Served(_store(tmp_path / "s", runs=5))
    try:
        page, w = _open(browser, srv, "/", ready="#parcoords[data-ready]")
        assert page.locator("#parcoords path.pc-line").count() == 5
        axes = page.locator("#parcoords g.pc-axis").evaluate_all("gs => gs.map(g => g.dataset.axis)")
        assert axes == ["layers", "lr", "opt", "metric:train/loss"]
        hrefs = sorted(page.locator("#parcoords a.pc-run").evaluate_all("as => as.map(a => a.getAttribute('href'))"))
        assert hrefs == [f"/run/{i}" for i in range(1, 6)]
        page.locator("#parcoords").scroll_into_view_if_needed()
        page.screenshot(path=str(tmp_path / "parcoords.png"), full_page=True)
        # brush the top of the lr axis (lr = 0.1: runs 1 and 4)
        hit = page.locator("#parcoords rect.pc-hit[data-brush=lr]").bounding_box()
        x = hit["x"] + hit["width"] / 2
        page.mouse.move(x, hit["y"] + 2)
        page.mouse.down()
        page.mouse.move(x, hit["y"] + hit["height"] * 0.2, steps=4)
        page.mouse.up()
        shown = page.locator("#parcoords a.pc-run[data-shown='1']").evaluate_all("as => as.map(a => a.dataset.run)")
        assert sorted(shown) == ["1", "4"]
        assert page.locator("#parcoords path.pc-line.pc-out").count() == 3
        assert page.locator("#parcoords path.pc-line.pc-out").first.is_hidden()
        assert page.locator("#parcoords .pc-count").inner_text() == "2 of 5 runs"
        # another metric and its min keep the brush; a click on the axis clears it
        page.locator("#parcoords select[data-pc=metric]").select_option("val/loss")
        page.locator("#parcoords select[data-pc=stat]").select_option("min")
        assert page.locator("#parcoords g.pc-axis").last.get_attribute("data-axis") == "metric:val/loss"
        assert page.locator("#parcoords .pc-count").inner_text() == "2 of 5 runs"
        page.mouse.click(x, hit["y"] + hit["height"] * 0.6)
        assert page.locator("#parcoords .pc-count").inner_text() == "5 of 5 runs"
        # a line opens its run
        spot = page.evaluate("""() => {  // a point of run 3's line that no other line covers
            const path = document.querySelector("#parcoords a.pc-run[data-run='3'] path"), len = path.getTotalLength();
            const m = path.getScreenCTM();
            for (let f = 0.02; f < 1; f += 0.01) {
                const p = path.getPointAtLength(len * f), x = m.a * p.x + m.c * p.y + m.e, y = m.b * p.x + m.d * p.y + m.f;
                const hit = document.elementFromPoint(x, y);
                if (hit && hit.closest("a.pc-run") && hit.closest("a.pc-run").dataset.run === "3") { return [x, y]; }
            }
            return null;
        }""")
        assert spot is not None
        page.mouse.click(*spot)
        page.wait_for_url(f"http://127.0.0.1:{srv.port}/run/3")
        _clean(w)
    finally:
        srv.close()


@needs_chromium
def test_a_run_without_a_value_on_some_axes_still_draws_a_line_across_the_ones_it_has(tmp_path, browser):
    # a sweep beside a run of another script: params the other lacks sit between the ones both have
    from casmon.runs.imported import write_run

    s = casmon.open(tmp_path / "s")
    loss = {"loss": (np.arange(5), np.arange(5.0), np.zeros(5))}
    write_run(s, comment="a", start=1.7e9, end=1.7e9 + 5, params={"a": 1, "b": 2, "c": 3}, metrics=loss)
    write_run(s, comment="b", start=1.7e9 + 1, end=1.7e9 + 6, params={"a": 2, "c": 1}, metrics=loss)
    s.close()
    srv = Served(tmp_path / "s")
    try:
        page, w = _open(browser, srv, "/", ready="#parcoords[data-ready]")
        d = page.locator("#parcoords a.pc-run[data-run='2'] path").get_attribute("d")
        assert d.count("M") == 1 and d.count("L") == 2, d  # a, c and loss joined: no lone, invisible points
        _clean(w)
    finally:
        srv.close()


@needs_chromium
def test_metric_and_parameter_names_that_are_markup_quotes_or_object_keys_are_drawn_as_names(tmp_path, browser):
    from casmon.runs.imported import write_run

    s = casmon.open(tmp_path / "s")
    odd = ["__proto__", "constructor", "a'b\"c/<i>x</i>", "toString"]
    for i in range(3):
        write_run(s, comment=f"o{i}", start=1.7e9 + i, end=1.7e9 + i + 5,
                  params={"constructor": i, "<b>p</b>": ["x", "y"][i % 2]} if i else {"<b>p</b>": "x"},
                  metrics={m: (np.arange(5), np.arange(5.0) * (i + 1), np.zeros(5)) for m in odd})
    s.close()
    srv = Served(tmp_path / "s")
    try:
        page, w = _open(browser, srv, "/compare?run=1&run=2&run=3")
        page.locator("#charts").scroll_into_view_if_needed()
        page.wait_for_function("() => document.querySelectorAll('#charts .chart-box canvas').length === 4", timeout=30_000)
        titles = page.locator("#charts .panel-title").all_inner_texts()
        assert sorted(titles) == sorted(odd)
        page, w2 = _open(browser, srv, "/", ready="#parcoords[data-ready]")
        assert page.locator("#parcoords path.pc-line").count() == 3
        names = page.locator("#parcoords g.pc-axis text.pc-name").evaluate_all("ts => ts.map(t => t.firstChild.nodeValue)")
        assert "<b>p</b>" in names and "constructor" in names
        _clean(w)
        _clean(w2)
    finally:
        srv.close()


@needs_chromium
def test_a_live_runs_panels_grow_and_a_new_metric_gets_a_panel_in_its_group_without_a_reload(tmp_path, browser):
    import os
    import subprocess
    import sys
    import time

    from casmon.runs.imported import write_run
    from tests.conftest import ROOT

    path = tmp_path / "store"
    s = casmon.open(path)
    write_run(s, comment="before", start=1.7e9, end=1.7e9 + 5,
              metrics={"train/loss": (np.arange(5), np.ones(5), np.zeros(5))})
    s.close()
    srv = Served(path)
    proc = subprocess.Popen([sys.executable, "-m", "tests.ui.dashboard_writer", str(path), str(tmp_path)], cwd=ROOT,
                            env={**os.environ, "CASMON_HEARTBEAT_S": "1"}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:  # the run is listed, running, with points
            status, got = _api(srv, "/api/run/2/metrics")
            if status == 200 and got["status"] == "running" and got["groups"]:
                break
            assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read() if proc.poll() else "slow"
            time.sleep(0.2)
        run, w1 = _open(browser, srv, "/run/2")
        cmp, w2 = _open(browser, srv, "/compare?run=2&run=1")
        for page in (run, cmp):
            page.evaluate("window.notReloaded = true")
            _drawn(page, ["train/loss"])
        grow = (f"n => {PANEL}('train/loss') && {PANEL}('train/loss').data[0].length > n")
        first = run.evaluate(f"{PANEL}('train/loss').data[0].length")
        run.wait_for_function(grow, arg=first, timeout=30_000)
        first = cmp.evaluate(f"{PANEL}('train/loss').data[0].length")
        cmp.wait_for_function(grow, arg=first, timeout=30_000)
        (tmp_path / "val").touch()
        for page in (run, cmp):
            page.wait_for_selector("#charts details.dash-group[data-group=val] .chart-box[data-metric='val/loss']",
                                   timeout=30_000)
            page.locator("#charts .chart-box[data-metric='val/loss']").scroll_into_view_if_needed()
            page.wait_for_function(f"() => {PANEL}('val/loss') && {PANEL}('val/loss').data[0].length > 0", timeout=30_000)
            assert page.evaluate("window.notReloaded")
        (tmp_path / "stop").touch()
        run.wait_for_function("() => document.querySelector('#run-status').textContent === 'ok'", timeout=60_000)
        _clean(w1)
        _clean(w2)
    finally:
        srv.close()
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=60)


def test_the_runs_page_has_no_parallel_coordinates_for_one_run_or_runs_without_parameters(tmp_path):
    from casmon.runs.imported import write_run

    srv = Served(_store(tmp_path / "one", runs=1))
    try:
        assert 'id="parcoords"' not in srv.get("/") and "casmon-parcoords-data" not in srv.get("/")
    finally:
        srv.close()
    s = casmon.open(tmp_path / "bare")
    for i in range(3):
        write_run(s, comment=f"b{i}", start=1.7e9 + i, end=1.7e9 + i + 1,
                  metrics={"loss": (np.arange(3), np.ones(3), np.zeros(3))})
    s.close()
    srv = Served(tmp_path / "bare")
    try:
        assert "casmon-parcoords-data" not in srv.get("/")
    finally:
        srv.close()
