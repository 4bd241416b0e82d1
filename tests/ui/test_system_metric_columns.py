"""The runs table's metric columns: the user's metrics before the sampled ``sys/`` ones, which never crowd them out."""

import pytest

import casmon
from casmon.ui import model, table

pytestmark = pytest.mark.filterwarnings("ignore::casmon.RunWarning")


def test_the_runs_table_shows_the_users_metrics_before_system_metrics(tmp_path, monkeypatch):
    monkeypatch.setattr(table, "MAX_METRIC_COLUMNS", 3)
    s = casmon.open(tmp_path / "s")
    try:
        with casmon.record(store=s, capture_output=False, system_metrics=False) as run:
            run.log({"train/a": 1.0, "val/b": 2.0, "sys/cpu_percent": 5.0, "sys/rss_bytes": 1.0})  # as sampled
        s.flush()
        view = table.runs_view(model.RunIndex(s))
        assert view.metrics == ["metric.train/a", "metric.val/b", "metric.sys/cpu_percent"]
    finally:
        s.close()
