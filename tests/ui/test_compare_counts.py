"""The compare page's metric table counts a metric's points in words that agree with the count."""

import numpy as np

import casmon
from casmon.runs.imported import write_run
from tests.ui.test_ui import Served, text_of


def test_a_metric_of_one_point_is_one_point_not_one_points(tmp_path):
    s = casmon.open(tmp_path / "s")
    for n in (1, 3):
        write_run(s, comment=f"r{n}", start=1.7e9, end=1.7e9 + 9,
                  metrics={"score": (np.arange(n), np.linspace(0.5, 0.9, n), 1.7e9 + np.arange(n))})
    s.close()
    srv = Served(tmp_path / "s")
    try:
        text = " ".join(text_of(srv.get("/compare?run=1&run=2")).split())
    finally:
        srv.close()
    assert "1 point" in text and "3 points" in text and "1 points" not in text
