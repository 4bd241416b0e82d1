"""NaN and infinities in the UI: said as such in tables and JSON ("NaN", "Infinity", "-Infinity"), marked on
charts, and never a page that fails to render; a downsampled chart keeps every extreme."""

import json
import math

import numpy as np
import pytest

import casmon

pytestmark = pytest.mark.filterwarnings("ignore::casmon.RunWarning")


def _diverged(tmp_path):
    s = casmon.open(tmp_path / "s")
    with casmon.record(comment="diverged", store=s, capture_output=False) as run:
        run.log(loss=1.0, gap=float("nan"), up=1.0)
        run.log(loss=float("inf"), gap=float("nan"), up=-float("inf"))
        run.log(loss=float("nan"), gap=float("nan"), up=2.0)
    s.close()
    return str(tmp_path / "s")


def _strict_json(text):
    def refuse(c):
        raise AssertionError(f"not JSON: {c}")

    return json.loads(text, parse_constant=refuse)


def test_nan_and_infinities_are_said_as_such_in_the_ui(tmp_path):
    from casmon.ui import api, model, runpage
    from casmon.ui.pages import Ctx
    from casmon.ui.server import _json

    store = _diverged(tmp_path)
    s = casmon.open(store, read_only=True)
    index = model.RunIndex(s)
    e = index.find("latest")
    state = _strict_json(_json(api.run_state(index, e)).decode())
    loss = state["metrics"]["loss"]
    assert (loss["last"], loss["max"], loss["last_text"], loss["max_text"]) == ("NaN", "Infinity", "NaN", "inf")
    assert state["metrics"]["up"]["min_text"] == "-inf" and state["cells"]["metric.gap"] == "NaN"
    points = _strict_json(_json(api.metric_points(index, [e], "up", 2000)).decode())["series"][0]
    assert points["value"] == [1.0, None, 2.0] and points["marks"] == {"-Infinity": [1]}
    page = runpage.run_page(Ctx(s.url, False), e, index.run(e)).decode()
    assert '<td class="num" data-k="last">NaN</td>' in page and '<td class="num" data-k="max">inf</td>' in page
    s.close()


def test_a_downsampled_chart_keeps_every_extreme_and_marks_what_is_not_finite():
    from casmon.runs import Series
    from casmon.ui.series import metric_json

    n = 1_000_000
    values = np.ones(n)
    values[123_457] = 1000.0
    values[500_000] = -7.0
    values[700_001] = float("nan")
    values[900_000] = float("inf")
    s = Series("loss", np.arange(n), values, np.zeros(n))
    got = metric_json("1", "loss", s, 2000)
    assert 998 <= len(got["value"]) <= 2000 and max(got["max"]) == 1000.0 and min(got["min"]) == -7.0
    assert all(v is None or math.isfinite(v) for v in got["max"] + got["min"] + got["value"])
    assert sorted(got["marks"]) == ["Infinity", "NaN"]
    for kind, at in (("NaN", 700_001), ("Infinity", 900_000)):  # the bucket holding the point is marked
        (i,) = got["marks"][kind]
        assert got["step"][i] <= at < got["step"][i] + got["every"]  # buckets of ``every`` steps, from step[i]


def test_a_run_with_nan_or_infinity_in_its_info_or_params_has_a_page_and_a_report(tmp_path):
    from casmon.ui import model, runpage
    from casmon.ui.pages import Ctx
    from casmon.ui.report import report_html

    s = casmon.open(tmp_path / "s")
    with casmon.record(store=s, capture_output=False, params={"lr": float("inf")}) as run:
        run.info["score"] = float("nan")
        run.log(loss=1.0)
    index = model.RunIndex(s)
    e = index.find("latest")
    page = runpage.run_page(Ctx(s.url, False), e, index.run(e)).decode()
    spec = _strict_json(page.split('id="casmon-chart-data">')[1].split("</script>")[0])
    assert spec["runs"][0]["params"] == {"lr": "Infinity", "info.score": "NaN"}
    assert "NaN" in report_html(s, ["latest"])[0].decode()
    s.close()
