"""A sort or filter over the runs index's parameter, info and tag columns shows what the runs' rows show:
random runs (numbers, text, yes/no, empty, nested, lists, huge integers, a parameter and a metric of one name),
tag edits after the index was written, and random filter expressions and sorts, through the index and without it."""

import random
import shutil
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import casmon
from casmon.runs import index as runs_index
from casmon.runs.tags import tag_run
from casmon.ui import model, table, vectors

pytestmark = pytest.mark.filterwarnings("ignore::casmon.RunWarning")

KEYS = ["lr", "batch", "act", "loss", "flag", "note"]
VALUES = [0, 1, -3, 2.5, 0.01, 1e-5, 10, "a", "B", "10", "", "relu", True, False, None, 2**60, [1, 2],
          {"depth": 3}, {"depth": "deep"}, float("nan"), float("inf")]
TAGS = ["baseline", "best", "x"]


def _params(rng):
    return {k: rng.choice(VALUES) for k in rng.sample(KEYS, rng.randint(0, 4))}


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """A store of random runs with a runs index (tags edited and runs ended after it was written) and its copy
    without the index."""
    rng = random.Random(46)
    path = tmp_path_factory.mktemp("agree") / "s"
    s = casmon.open(path)
    for i in range(40):
        if i == 34:
            casmon.list_runs(s)  # the index's base, with its columns; the runs after it are read directly
        with casmon.record(store=s, params=_params(rng), tags=rng.sample(TAGS, rng.randint(0, 2)),
                           capture_output=False, system_metrics=False) as run:
            run.info = {k: v for k, v in _params(rng).items() if k != "loss"}
            if rng.random() < 0.8:
                run.log(loss=rng.choice([0.1, 0.5, 2.0, float("nan")]), acc=rng.random())
    casmon.list_runs(s)
    for ref in ("runs/3", "runs/8", "runs/20"):
        tag_run(ref, add=["edited", "baseline"], remove=["best"], store=s)  # edits after the base was written
    plain = path.parent / "plain"
    shutil.copytree(path, plain)
    shutil.rmtree(plain / "runs-index")
    assert runs_index.columns((path / "runs-index" / "base").read_bytes(), "base").fields
    return path, plain


def _page(path, **how):
    view = table.runs_view(model.RunIndex(casmon.open(path, read_only=True)), per=100, **how)
    return view.total, [e.ref for e, _r, _row in view.rows], view.error


def _rows_page(path, **how):
    """The page as the rows alone make it: every run's row, the filter tested on each."""
    with mock.patch.object(vectors, "view", lambda *a, **k: None):
        return _page(path, **how)


COLUMNS = [p + k for k in KEYS for p in ("param.", "info.")] + [
    "lr", "loss", "param.act.depth", "metric.loss", "metric.acc", "acc", "status", "start", "run"]
_TERM = st.one_of(
    st.builds(lambda c, o, v: f"{c}{o}{v}", st.sampled_from(COLUMNS), st.sampled_from(["<", "<=", ">", ">=", "=", "!="]),
              st.sampled_from(["0", "1", "-1", "0.01", "0.3", "2.5", "10", "a", "B", "relu", "yes", "no", "ok", "deep",
                               "1e-5", "true", "2020-01-01", "3"])),
    st.builds(lambda t: f"tag:{t}", st.sampled_from(TAGS + ["edited", "none"])))


def _expr(depth):
    if depth == 0:
        return _TERM
    return st.one_of(_TERM, st.builds(lambda a, j, b, p: f"({a} {j} {b})" if p else f"{a} {j} {b}",
                                      _expr(depth - 1), st.sampled_from(["and", "or"]), _expr(depth - 1), st.booleans()))


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(_expr(2), st.sampled_from(["start", "param.lr", "info.lr", "param.act", "param.act.depth", "param.flag",
                                  "info.note", "param.loss", "metric.loss", "run", "status"]), st.booleans())
def test_a_filter_and_sort_through_the_columns_shows_what_the_rows_show(stores, q, sort, desc):
    path, plain = stores
    assert _page(path, q=q, sort=sort, desc=desc) == _rows_page(plain, q=q, sort=sort, desc=desc)


@pytest.mark.parametrize("sort", ["param.lr", "info.note", "param.act.depth", "param.nothing"])
def test_a_sort_by_a_parameter_through_the_columns_shows_what_the_rows_show(stores, sort):
    path, plain = stores
    for desc in (True, False):
        assert _page(path, sort=sort, desc=desc) == _rows_page(plain, sort=sort, desc=desc)


def test_a_filter_on_parameters_and_tags_parses_no_manifest_of_a_run_the_columns_hold(stores, monkeypatch):
    path, _plain = stores
    parsed = []
    slim = runs_index.slim
    monkeypatch.setattr(runs_index, "slim", lambda e, where: parsed.append(e[6]) or slim(e, where))
    runs_index._read.clear()
    idx = model.RunIndex(casmon.open(path, read_only=True))
    idx.entries()
    del parsed[:]
    table.runs_view(idx, q="param.batch>0 or tag:baseline", sort="param.lr", per=1)
    # only the runs whose cells the columns cannot hold (a list, a huge integer, a tag edit) and the page's run
    cols = runs_index.columns((path / "runs-index" / "base").read_bytes(), "base")
    odd = {cols.keys[i] for i in range(cols.n) if cols.a["flag"][i] & runs_index.FLAT_ROW}
    assert 0 < len(odd) < cols.n - 10
    assert len(parsed) <= len(odd | {"runs/3", "runs/8", "runs/20"}) + 1


def test_keys_past_the_columns_fields_are_sorted_and_filtered_from_the_runs_rows(tmp_path, monkeypatch):
    """A store with more distinct keys than the index gives columns: a run with others is read from its row for
    those, and every sort and filter shows what the rows show."""
    monkeypatch.setattr(runs_index, "FIELDS_MAX", 2)
    path = tmp_path / "s"
    s = casmon.open(path)
    for i in range(8):
        with casmon.record(store=s, params={f"k{i % 4}": i, "k0": i % 3, f"t{i % 2}": "ab"[i % 2]},
                           capture_output=False, system_metrics=False):
            pass
    casmon.list_runs(s)
    cols = runs_index.columns((path / "runs-index" / "base").read_bytes(), "base")
    assert len(cols.fields) == 2 and (cols.a["flag"] & runs_index.FLAT_MORE).any()
    plain = tmp_path / "plain"
    shutil.copytree(path, plain)
    shutil.rmtree(plain / "runs-index")
    for how in ({"sort": "param.k1"}, {"sort": "param.k3", "desc": False}, {"sort": "param.t1"},
                {"q": "k1>0"}, {"q": "k3>=0 or k0=1"}, {"q": "t0=a or t1=b", "sort": "param.k0"}, {"q": "k2<5"}):
        assert _page(path, **how) == _rows_page(plain, **how)
