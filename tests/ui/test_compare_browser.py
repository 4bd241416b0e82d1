"""The compare page in a real browser (headless Chromium): its charts drawn from packed, downsampled series, a
damaged series said in its panel while the other runs draw, and a zoom drawing every point in view."""

from __future__ import annotations

import time

import numpy as np
import pytest

import casmon
from tests.support.browser import needs_chromium, watch
from tests.ui.test_compare_charts import _damage_one_batch
from tests.ui.test_ui import Served

pytestmark = [needs_chromium, pytest.mark.filterwarnings("ignore::casmon.RunWarning")]

POINTS = 3000


def _area(metric: str) -> str:
    return f"document.querySelector(\"#charts .chart-box[data-metric='{metric}'] .chart-area\")"


def _drawn(page, metric: str) -> None:
    page.locator(f"#charts .chart-box[data-metric='{metric}']").scroll_into_view_if_needed()
    page.wait_for_function(f"() => {_area(metric)} && {_area(metric)}.uplot", timeout=30_000)


def _lines(page, metric: str) -> dict:
    """Each run's line of a panel: its label, its x and y (uPlot's data, joined over every run's x)."""
    return page.evaluate(f"""() => {{
        const u = {_area(metric)}.uplot, out = {{}};
        u.series.forEach((s, i) => {{
            if (i === 0 || s.band) {{ return; }}
            const xs = [], ys = [];
            u.data[i].forEach((y, j) => {{ if (y !== null && y !== undefined) {{ xs.push(u.data[0][j]); ys.push(y); }} }});
            out[s.label] = [xs, ys];
        }});
        return out;
    }}""")


def test_the_compare_page_draws_its_runs_charts_says_a_damaged_series_and_zooms_to_every_point(tmp_path, browser):
    from casmon.runs.imported import write_run

    s = casmon.open(tmp_path / "s")
    steps = np.arange(POINTS)
    for i in range(3):
        write_run(s, comment=f"r{i}", start=1.7e9, end=1.7e9 + 9, params={"lr": 0.1 * (i + 1)},
                  metrics={"loss": (steps, 1000.0 - steps * (i + 1.0) / 10, 1.7e9 + steps),
                           "acc": (steps, (steps % 7) * (i + 1.0), 1.7e9 + steps)})
    s.close()
    _damage_one_batch(tmp_path / "s", "2")
    srv = Served(tmp_path / "s")
    try:
        page = browser.new_page(viewport={"width": 1400, "height": 1200})
        w = watch(page, lambda url: url.startswith(f"http://127.0.0.1:{srv.port}/"))
        page.goto(f"http://127.0.0.1:{srv.port}/compare?run=1&run=2&run=3", wait_until="load")
        page.wait_for_selector("#charts[data-ready]")
        for m in ("acc", "loss"):
            _drawn(page, m)
        page.screenshot(path=str(tmp_path / "compare.png"), full_page=True)
        acc = _lines(page, "acc")
        assert sorted(acc) == ["1-r0", "2-r1", "3-r2"]
        for label, (xs, ys) in acc.items():  # downsampled to about the panel's pixels, its extremes in the band
            assert 100 <= len(xs) < POINTS and xs[0] == 0 and xs[-1] == POINTS - 1
        loss = _lines(page, "loss")
        assert sorted(loss) == ["1-r0", "3-r2"]  # the damaged run's loss is not drawn ...
        error = page.locator("#charts .chart-box[data-metric='loss'] .casmon-error").inner_text()
        assert "not base64" in error  # ... its panel says why
        for label, k in (("1-r0", 1.0), ("3-r2", 3.0)):  # each line starts and ends at the run's own points
            xs, ys = loss[label]
            assert (xs[0], ys[0]) == (0, 1000.0) and (xs[-1], ys[-1]) == (POINTS - 1, 1000.0 - (POINTS - 1) * k / 10)

        # zoom: a drag over a tenth of the loss panel; the panels then draw every point in view, not buckets
        box = page.locator("#charts .chart-box[data-metric='acc'] .u-over").bounding_box()
        page.mouse.move(box["x"] + box["width"] * 0.45, box["y"] + box["height"] * 0.5)
        page.mouse.down()
        page.mouse.move(box["x"] + box["width"] * 0.55, box["y"] + box["height"] * 0.5, steps=5)
        page.mouse.up()
        every = f"""() => {{
            const xs = {_area('acc')}.uplot.data[0];
            return xs.length > 20 && xs.every((x, j) => j === 0 || x - xs[j - 1] === 1);
        }}"""
        page.wait_for_function(every, timeout=30_000)
        xs, ys = _lines(page, "acc")["3-r2"]
        view = page.evaluate(f"() => [{_area('acc')}.uplot.scales.x.min, {_area('acc')}.uplot.scales.x.max]")
        assert 0 < view[0] < view[1] < POINTS - 1
        inside = [(x, y) for x, y in zip(xs, ys) if view[0] <= x <= view[1]]
        assert inside and all(y == (x % 7) * 3.0 for x, y in inside)  # the points themselves: no bucket means
        # zoomed out (a double click): the overview again, the whole run
        page.locator("#charts .chart-box[data-metric='acc'] .u-over").dblclick()
        page.wait_for_function(f"() => {_area('acc')}.uplot.data[0].slice(-1)[0] === {POINTS - 1} && "
                               f"{_area('acc')}.uplot.data[0].length < {POINTS}", timeout=30_000)
        w.console_errors[:] = [e for e in w.console_errors if "status of 40" not in e]
        assert w.dialogs == [] and w.foreign == [] and w.console_errors == [] and w.page_errors == []
    finally:
        srv.close()


def test_a_failed_request_of_some_runs_charts_says_so_and_the_other_runs_draw(tmp_path, browser):
    """A compare page asks for 10 runs a request: one failing (the server gone a moment, a run deleted) left
    every panel an error, the runs of the requests that came back undrawn."""
    from casmon.runs.imported import write_run

    s = casmon.open(tmp_path / "s")
    steps = np.arange(50)
    for i in range(12):
        write_run(s, comment=f"r{i}", start=1.7e9, end=1.7e9 + 9, metrics={"loss": (steps, steps * (i + 1.0), 1.7e9 + steps)})
    s.close()
    srv = Served(tmp_path / "s")
    try:
        page = browser.new_page(viewport={"width": 1400, "height": 1200})
        w = watch(page, lambda url: url.startswith(f"http://127.0.0.1:{srv.port}/"))
        page.route("**/api/runs/metrics?*run=11*", lambda r: r.fulfill(status=503, content_type="application/json",
                                                                       body='{"error": "the server is busy"}'))
        page.goto(f"http://127.0.0.1:{srv.port}/compare?" + "&".join(f"run={i}" for i in range(1, 13)), wait_until="load")
        page.wait_for_selector("#charts[data-ready]")
        _drawn(page, "loss")
        assert sorted(_lines(page, "loss")) == sorted(f"{i}-r{i - 1}" for i in range(1, 11))  # runs 1-10 drawn
        error = page.locator("#charts .chart-box[data-metric='loss'] .casmon-error").inner_text()
        assert error == "the server is busy"  # said once for the two runs it failed
        w.console_errors[:] = [e for e in w.console_errors if "status of 503" not in e]
        assert w.dialogs == [] and w.foreign == [] and w.console_errors == [] and w.page_errors == []
    finally:
        srv.close()


def test_runs_grouped_by_a_parameter_named_or_valued_like_an_object_property_draw_their_groups(tmp_path, browser):
    """A parameter value ``constructor`` or ``__proto__`` (or a parameter so named, which some runs lack) is a
    group like any other: looked up in a plain object, it was Object's own, and the chart threw."""
    from casmon.runs.imported import write_run

    s = casmon.open(tmp_path / "s")
    steps = np.arange(50)
    params = [{"opt": "constructor", "constructor": 1}, {"opt": "constructor", "constructor": 1},
              {"opt": "__proto__", "constructor": 2}, {"opt": "toString"}]
    for i, p in enumerate(params):
        write_run(s, comment=f"r{i}", start=1.7e9, end=1.7e9 + 9, params=p,
                  metrics={"loss": (steps, steps * (i + 1.0), 1.7e9 + steps)})
    s.close()
    srv = Served(tmp_path / "s")
    try:
        page = browser.new_page(viewport={"width": 1400, "height": 1200})
        w = watch(page, lambda url: url.startswith(f"http://127.0.0.1:{srv.port}/"))
        page.goto(f"http://127.0.0.1:{srv.port}/compare?run=1&run=2&run=3&run=4", wait_until="load")
        page.wait_for_selector("#charts[data-ready]")
        _drawn(page, "loss")
        for by, want in (("opt", ["opt=__proto__ (1 run)", "opt=constructor (2 runs)", "opt=toString (1 run)"]),
                         ("constructor", ["constructor=(none) (1 run)", "constructor=1 (2 runs)", "constructor=2 (1 run)"])):
            page.select_option("#charts select[data-control='group']", by)
            page.wait_for_function(f"() => {_area('loss')}.uplot && {_area('loss')}.uplot.series.some("
                                   f"s => s.label && s.label.indexOf({by!r} + '=') === 0)", timeout=30_000)
            assert sorted(_lines(page, "loss")) == want
        assert w.dialogs == [] and w.foreign == [] and w.console_errors == [] and w.page_errors == []
    finally:
        srv.close()


def test_a_zoom_up_to_the_last_int64_step_asks_for_steps_the_server_takes(tmp_path, browser):
    """A run whose steps reach int64's ends: a zoom to its right edge sent ``to=9223372036854776000`` (the
    float the chart holds), which no int64 step is, and the server refused it: the zoom never drew its points."""
    from casmon.runs.imported import write_run

    s = casmon.open(tmp_path / "s")
    top = np.iinfo(np.int64).max
    steps = np.concatenate([np.arange(0, 3000) * (top // 3000), [top]]).astype(np.int64)
    for i in range(2):
        write_run(s, comment=f"r{i}", start=1.7e9, end=1.7e9 + 9,
                  metrics={"loss": (steps, np.arange(len(steps)) * (i + 1.0), 1.7e9 + np.arange(len(steps)))})
    s.close()
    srv = Served(tmp_path / "s")
    try:
        page = browser.new_page(viewport={"width": 1400, "height": 1200})
        w = watch(page, lambda url: url.startswith(f"http://127.0.0.1:{srv.port}/"))
        zooms: list = []
        page.on("response", lambda r: zooms.append((r.url, r.status)) if "from=" in r.url else None)
        page.goto(f"http://127.0.0.1:{srv.port}/compare?run=1&run=2", wait_until="load")
        page.wait_for_selector("#charts[data-ready]")
        _drawn(page, "loss")
        box = page.locator("#charts .chart-box[data-metric='loss'] .u-over").bounding_box()
        page.mouse.move(box["x"] + box["width"] * 0.9, box["y"] + box["height"] * 0.5)
        page.mouse.down()
        page.mouse.move(box["x"] + box["width"] + 30, box["y"] + box["height"] * 0.5, steps=5)  # past the edge
        page.mouse.up()
        deadline = time.monotonic() + 30
        while not zooms and time.monotonic() < deadline:
            page.wait_for_timeout(100)
        assert zooms and all(status == 200 for _u, status in zooms), zooms
        assert w.page_errors == []
    finally:
        srv.close()


def test_a_charts_y_ticks_over_a_narrow_range_read_as_different_numbers(tmp_path, browser):
    from casmon.runs.imported import write_run

    s = casmon.open(tmp_path / "s")
    steps = np.arange(20)
    for i in range(2):  # scores that differ in the sixth digit, as two runs of a seeded model do
        write_run(s, comment=f"r{i}", start=1.7e9, end=1.7e9 + 9,
                  metrics={"score": (steps, 0.98250 + (steps + i) * 1e-7, 1.7e9 + steps)})
    s.close()
    srv = Served(tmp_path / "s")
    try:
        page = browser.new_page(viewport={"width": 1400, "height": 1200})
        page.goto(f"http://127.0.0.1:{srv.port}/compare?run=1&run=2", wait_until="load")
        page.wait_for_selector("#charts[data-ready]")
        _drawn(page, "score")
        ticks = page.evaluate(f"() => {_area('score')}.uplot.axes[1]._values")
        assert len(ticks) >= 3 and len(set(ticks)) == len(ticks), ticks  # not "0.9825" at every tick
        # and the axis is wide enough to show them whole, not "982498" under a clipped "0."
        widest, size = page.evaluate(f"""() => {{
            const u = {_area('score')}.uplot, c = document.createElement("canvas").getContext("2d");
            c.font = u.axes[1].font[0];
            return [Math.max(...u.axes[1]._values.map(t => c.measureText(t).width)) / devicePixelRatio,
                    u.axes[1]._size];
        }}""")
        assert widest + 8 <= size, (widest, size, ticks)
        page.close()
    finally:
        srv.close()
