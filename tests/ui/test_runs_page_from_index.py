"""The runs page of a store with a runs index shows what a store without it shows: the first page, a sort, a
filter; a crafted or stale index entry loses to the runs."""

import json
import shutil

import pytest

import casmon
from benchmarks.runs_store import build
from casmon.ui import model, table

pytestmark = pytest.mark.filterwarnings("ignore::casmon.RunWarning")


def _page(s, **how):
    view = table.runs_view(model.RunIndex(s), **how)
    return view.total, [(e.ref, e.name, e.status, e.start, e.digest, row) for e, _r, row in view.rows], view.error


def _stores(tmp_path, change=None, metrics=2):
    """An indexed store (``change`` applied to it after the index was written) and its copy without an index."""
    path = tmp_path / "s"
    build(str(path), 120, metrics=metrics, points=5)
    casmon.list_runs(casmon.open(path))  # the runs index, as the first `casmon runs` leaves it
    if change is not None:
        change(path)
    plain = tmp_path / "plain"
    shutil.copytree(path, plain)
    shutil.rmtree(plain / "runs-index")
    return path, plain


def test_the_first_runs_page_of_an_indexed_store_shows_what_a_store_without_the_index_shows(tmp_path):
    path, plain = _stores(tmp_path)
    for how in ({}, {"desc": False}, {"page": 2}):
        want = _page(casmon.open(plain, read_only=True), **how)
        assert _page(casmon.open(path, read_only=True), **how) == want and want[0] == 120


def test_a_sort_or_filter_through_the_index_shows_what_the_runs_say(tmp_path):
    path, plain = _stores(tmp_path)
    from casmon.runs.tags import tag_run

    for s in (casmon.open(path), casmon.open(plain)):
        tag_run("runs/7", add=["baseline"], remove=["best"], store=s)  # an edit after the index was written
    for how in ({"sort": "metric.loss"}, {"sort": "param.lr", "desc": False}, {"q": "tag:best or status:failed"},
                {"sort": "metric.acc", "desc": False, "page": 3}, {"sort": "param.model.act"}, {"sort": "status"},
                {"sort": "run", "desc": False}, {"sort": "param.nothing"}, {"sort": "metric.nothing"},
                {"sort": "info.nothing"}, {"sort": "comment"},
                {"q": "status:ok and (param.lr>0.01 or tag:baseline)", "sort": "metric.loss"},
                {"q": "lr>0.001 and model.act=gelu", "desc": False}, {"q": "model.depth>=5 or status=failed"},
                {"q": "loss<0.5 and tag:best", "sort": "param.lr"}, {"q": "nothing>1"}, {"q": "lr>abc"},
                {"q": "started>2020-01-01 and run>3", "sort": "run"}, {"q": "base"}, {"q": "comment=x or acc>0.2"}):
        assert _page(casmon.open(path, read_only=True), **how) == _page(casmon.open(plain, read_only=True), **how)


def test_a_filter_naming_a_parameter_and_a_metric_says_so_through_the_index_as_without_it(tmp_path):
    path, plain = _stores(tmp_path, metrics=5)  # a metric "lr" beside the parameter "lr"
    for how in ({"q": "status:ok and (lr>0.01 or tag:baseline)"}, {"q": "lr>0.01", "sort": "param.lr"},
                {"q": "lr>0.01", "sort": "comment", "page": 2}):
        got = _page(casmon.open(path, read_only=True), **how)
        assert got == _page(casmon.open(plain, read_only=True), **how) and "is both" in got[2]


def _craft(path):
    from casmon.runs import index

    base = path / "runs-index" / "base"
    entries = index.decode(base.read_bytes(), "base")
    for ref, field, value in (("runs/120", "params", "not a dict"), ("runs/119", "comment", 7)):
        m = json.loads(entries[ref][2])
        m[field] = value
        entries[ref][2] = json.dumps(m)
    base.write_bytes(index.encode(entries))  # a sound checksum over crafted fields
    index._read.clear()


def test_a_crafted_index_entry_on_the_first_page_loses_to_the_stored_manifest(tmp_path):
    path, plain = _stores(tmp_path, _craft)
    assert _page(casmon.open(path, read_only=True)) == _page(casmon.open(plain, read_only=True))


def _craft_failing(path):
    """Entries whose manifest text fails the checks a stored manifest passes, with parameters that lie."""
    from casmon.runs import index

    base = path / "runs-index" / "base"
    entries = index.decode(base.read_bytes(), "base")
    for ref, field, value in (("runs/120", "comment", 7), ("runs/118", "start", 1.0), ("runs/117", "git", [1])):
        m = json.loads(entries[ref][2])
        m[field] = value
        m["params"]["lr"] = 999.0
        m["params"]["model"]["act"] = "lied"
        entries[ref][2] = json.dumps(m)
    base.write_bytes(index.encode(entries))
    index._read.clear()


@pytest.mark.parametrize("how", [{"q": "param.lr>100"}, {"q": "lr>100 or model.act=lied"}, {"sort": "param.lr"},
                                 {"sort": "param.model.act", "desc": False}, {"q": "model.act=lied and tag:best"}])
def test_a_crafted_entry_that_fails_the_checks_sorts_and_filters_as_its_stored_manifest(tmp_path, how):
    path, plain = _stores(tmp_path, _craft_failing)
    assert _page(casmon.open(path, read_only=True), **how) == _page(casmon.open(plain, read_only=True), **how)


def _rewrite_and_delete(path):
    s = casmon.open(path)
    ref = s.get_ref("runs/5")
    s.set_ref("runs/120", ref.target, ref.data)  # the ref now names another manifest: its entry is stale
    casmon.delete_run("runs/119", s)


def test_a_stale_index_entry_loses_to_the_runs_ref(tmp_path):
    path, plain = _stores(tmp_path, _rewrite_and_delete)
    got = _page(casmon.open(path, read_only=True))
    assert got == _page(casmon.open(plain, read_only=True))
    assert got[0] == 119 and "runs/119" not in [r[0] for r in got[1]]


def _forbid_reads(monkeypatch, s):
    """Reading the run record table or any run's manifest fails the test."""
    from casmon.runs import listing

    real = type(s).records

    def records(self, kind, *a, **k):
        assert kind != casmon.runs.KIND_RUN, "the run record table was read"
        return real(self, kind, *a, **k)

    def no_manifest(*a, **k):
        raise AssertionError(f"a manifest was read: {a[1:3]}")

    monkeypatch.setattr(type(s), "records", records)
    monkeypatch.setattr(listing, "load_data", no_manifest)
    monkeypatch.setattr(model, "load_data", no_manifest)


@pytest.mark.parametrize("how", [{}, {"desc": False}, {"page": 2}, {"sort": "run"}, {"sort": "status"},
                                 {"sort": "metric.loss", "desc": False}, {"sort": "param.lr"},
                                 {"q": "status:ok and (lr>0.01 or tag:baseline)"}])
def test_the_first_runs_page_is_built_from_the_index_without_reading_run_records_or_manifests(tmp_path, monkeypatch,
                                                                                               how):
    from casmon.ui.server import App

    path, plain = _stores(tmp_path)
    want = _page(casmon.open(plain, read_only=True), **how)
    s = casmon.open(path, read_only=True)
    _forbid_reads(monkeypatch, s)
    assert _page(s, **how) == want
    app = App(s)
    try:
        from urllib.parse import urlencode

        query = {**{k: v for k, v in how.items() if k != "desc"}, "order": "desc" if how.get("desc", True) else "asc"}
        status, body, _ctype = app.handle("/?" + urlencode(query))
        assert status == 200 and body.count(b"<tr data-run=") == len(want[1])
    finally:
        app.runs.stop()


def test_a_tag_filter_through_the_index_typed_again_sees_the_tags_edited_meanwhile(tmp_path):
    from casmon.runs.tags import tag_run

    path, _plain = _stores(tmp_path)
    s = casmon.open(path)
    idx = model.RunIndex(s)
    try:
        q = "tag:fresh or param.lr>0.05"
        first = table.runs_view(idx, q=q)
        tag_run("runs/3", add=["fresh"], store=s)
        again = table.runs_view(idx, q=q)
        assert again.total == first.total + 1 and "runs/3" in {e.ref for e, _r, _row in again.rows}
    finally:
        idx.stop()
