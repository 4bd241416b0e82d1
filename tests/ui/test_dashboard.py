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
from tests.support.browser import ARGS, CHROMIUM, needs_chromium, watch
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


def test_metrics_are_grouped_by_prefix_train_val_then_other_prefixes_sys_and_the_ungrouped_last():
    got = metric_groups(["sys/gpu0/util", "loss", "val/loss", "train/loss", "alpha/x", "train/acc", "info:curve", "/odd"])
    assert got == [{"group": "train", "metrics": ["train/acc", "train/loss"]},
                   {"group": "val", "metrics": ["val/loss"]},
                   {"group": "alpha", "metrics": ["alpha/x"]},
                   {"group": "sys", "metrics": ["sys/gpu0/util"]},
                   {"group": "", "metrics": ["/odd", "loss"]},
                   {"group": "info", "metrics": ["info:curve"]}]
    assert metric_groups([]) == []


def test_the_run_metrics_endpoint_groups_every_metric_and_returns_only_those_named(served):
    status, got = _api(served, "/api/run/1/metrics")
    assert status == 200 and got["series"] == {}
    assert [(g["group"], g["metrics"]) for g in got["groups"]] == [
        ("train", ["train/acc", "train/loss"]), ("val", ["val/loss"]), ("sys", ["sys/cpu"]), ("", ["loss"])]
    status, got = _api(served, "/api/run/2/metrics?name=val/loss&name=train/acc")
    assert status == 200 and set(got["series"]) == {"val/loss", "train/acc"}
    v = got["series"]["val/loss"]
    assert v["step"] == list(range(0, 50, 5)) and v["value"][1] == pytest.approx(1.2 / 6 * 2) and "min" not in v


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
    status, body = served.request("/api/run/1/x/metrics")[0], None
    assert status == 404


def test_the_pages_carry_the_groups_and_the_runs_page_the_parallel_coordinates_data(served):
    import re

    def block(body, id_):
        return json.loads(re.search(rf'<script type="application/json" id="{id_}">(.*?)</script>', body, re.S).group(1))

    spec = block(served.get("/run/1"), "casmon-chart-data")
    assert [g["group"] for g in spec["groups"]] == ["train", "val", "sys", ""]
    spec = block(served.get("/compare?run=1&run=2"), "casmon-chart-data")
    assert spec["mode"] == "compare" and [g["group"] for g in spec["groups"]] == ["train", "val", "sys", ""]
    pc = block(served.get("/"), "casmon-parcoords-data")
    assert [r["tail"] for r in pc["runs"]] == ["2", "1"]  # the rows the table shows, in its order
    assert pc["runs"][0]["params"] == {"layers": 3, "lr": 0.01, "opt": "sgd"}
    assert pc["runs"][0]["metrics"]["val/loss"]["min"] == pytest.approx(1.2 / 46 * 2)
    assert pc["runs"][0]["href"] == "/run/2"
