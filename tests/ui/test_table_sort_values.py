"""The runs table sorts a column holding NaN and infinities as numbers: -inf first and inf last (ascending),
NaN after every value and before empty cells, either way; a NaN never scrambles the order of the others."""

import pytest

import casmon
from casmon.ui.model import RunIndex
from casmon.ui.table import runs_view

pytestmark = pytest.mark.filterwarnings("ignore::casmon.RunWarning")

LOSSES = [3.0, float("nan"), 1.0, float("inf"), float("-inf"), 2.0, None, float("nan"), 0.5]


@pytest.fixture
def index(tmp_path):
    s = casmon.open(tmp_path / "s", create=True)
    for v in LOSSES:
        with casmon.record(store=s, capture_output=False) as run:
            run.log(other=1.0)
            if v is not None:
                run.log(loss=v)
    idx = RunIndex(s)
    yield idx
    idx.stop()


def _order(view):
    return [row.get("metric.loss") for _e, _r, row in view.rows]


def _text(vs):
    return [repr(v) for v in vs]


@pytest.mark.parametrize("desc, want", [
    (False, [float("-inf"), 0.5, 1.0, 2.0, 3.0, float("inf"), float("nan"), float("nan"), None]),
    (True, [float("inf"), 3.0, 2.0, 1.0, 0.5, float("-inf"), float("nan"), float("nan"), None]),
])
def test_nan_and_infinities_sort_as_numbers_and_nan_goes_last(index, desc, want):
    assert _text(_order(runs_view(index, sort="metric.loss", desc=desc))) == _text(want)
    assert _text(_order(runs_view(index, sort="metric.loss", desc=desc, q="other>0"))) == _text(want)


@pytest.mark.parametrize("page, want", [(10**30, 3), (-5, 1), (0, 1), (2, 2)])
def test_a_page_beyond_either_end_is_the_nearest_page(index, page, want):
    view = runs_view(index, page=page, per=4)
    assert (view.page, view.pages, view.total) == (want, 3, 9)
    view = runs_view(index, sort="metric.loss", q="other>0", page=page, per=4)
    assert (view.page, view.pages) == (want, 3) and len(view.rows) == (1 if want == 3 else 4)
