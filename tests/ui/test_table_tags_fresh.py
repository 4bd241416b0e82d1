"""The runs table's ``tag:`` filter follows tag edits at once: a view kept for a filter is not reused once a
run's tags changed (``casmon tag``), though the listing of runs did not."""

import pytest

import casmon
from casmon.runs import tag_run
from casmon.ui.model import RunIndex
from casmon.ui.table import runs_view

pytestmark = pytest.mark.filterwarnings("ignore::casmon.RunWarning")


@pytest.fixture
def index(tmp_path):
    s = casmon.open(tmp_path / "s", create=True)
    for i in range(3):
        with casmon.record(store=s, capture_output=False) as run:
            run.params = {"lr": 0.1 * (i + 1)}
            run.log(loss=1.0 / (i + 1))
    idx = RunIndex(s)
    yield s, idx
    idx.stop()


def _names(view):
    return sorted(e.name for e, _r, _row in view.rows)


@pytest.mark.parametrize("q", ["tag:best", "tag:best and lr>0", "lr>0 and (tag:best or tag:other)"])
def test_a_tag_filter_shows_a_run_tagged_after_the_view_was_made(index, q):
    s, idx = index
    assert _names(runs_view(idx, q=q)) == []
    tag_run("2", add=["best"], store=s)
    assert _names(runs_view(idx, q=q)) == ["2"]
    tag_run("2", remove=["best"], store=s)
    assert _names(runs_view(idx, q=q)) == []


def test_a_sorted_view_without_tags_is_still_kept(index):
    s, idx = index
    first = runs_view(idx, sort="metric.loss", q="lr>0")
    assert [e.name for e, _r, _row in first.rows] == ["1", "2", "3"]
    assert [e.name for e, _r, _row in runs_view(idx, sort="metric.loss", q="lr>0").rows] == ["1", "2", "3"]
