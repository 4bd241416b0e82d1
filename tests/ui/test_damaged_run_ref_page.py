"""A run whose ref file is damaged is on the runs page as list_runs lists it: unreadable, saying why, whichever
way the page's listing was made (from the refs, from the run record table, revalidated) - never hidden, never
shown as the intact run it was."""

import shutil
import warnings

import pytest

import casmon
from benchmarks.runs_store import build
from casmon.ui import model, table

pytestmark = pytest.mark.filterwarnings("ignore::casmon.RunWarning")


def _statuses(s, **how):
    view = table.runs_view(model.RunIndex(s), **how)
    return {e.ref: row["status"] for e, _r, row in view.rows}


def _listed(root):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {r.ref: r.status for r in casmon.list_runs(casmon.open(root, read_only=True))}


@pytest.mark.parametrize("records_from", [0, 10_000], ids=["from-records", "from-refs"])
@pytest.mark.parametrize("indexed", [False, True], ids=["no-index", "indexed"])
def test_a_run_whose_ref_is_damaged_is_unreadable_on_the_runs_page_as_in_list_runs(tmp_path, monkeypatch,
                                                                                   records_from, indexed):
    monkeypatch.setattr(model, "RECORDS_FROM", records_from)
    root = tmp_path / "s"
    build(str(root), 12, metrics=1, points=2)
    if indexed:
        casmon.list_runs(casmon.open(root))
    (root / "refs" / "runs" / "3").write_bytes(b"junk")
    want = _listed(root)
    assert want["runs/3"] == "unreadable" and len(want) == 12
    s = casmon.open(root, read_only=True)
    for how in ({}, {"q": "status:unreadable"}, {"sort": "status"}, {"sort": "metric.loss"}, {"q": "status:ok"},
                {"sort": "param.lr", "q": "lr>0"}):
        got = _statuses(s, per=100, **how)
        assert got == {k: v for k, v in want.items() if k in got}, how
        assert ("runs/3" in got) == (how.get("q", "status:unreadable") == "status:unreadable"), how
    index = model.RunIndex(s)
    e = index.find("3")
    r = index.run(e)
    assert r.status == "unreadable" and "refs/runs/3" in r.manifest["error"] and r.error is not None


def test_a_ref_damaged_while_the_page_is_up_makes_its_run_unreadable_not_gone(tmp_path):
    root = tmp_path / "s"
    build(str(root), 6, metrics=1, points=2)
    s = casmon.open(root, read_only=True)
    index = model.RunIndex(s)
    assert index.run(index.find("3")).status == "ok"
    shutil.copy(root / "refs" / "runs" / "3", tmp_path / "ref3")
    (root / "refs" / "runs" / "3").write_bytes(b"\x00" * 64)
    entries = index.entries(fresh=True)
    assert len(entries) == 6
    r = index.run(index.find("3"))
    assert r.status == "unreadable" and "refs/runs/3" in r.manifest["error"]
    shutil.copy(tmp_path / "ref3", root / "refs" / "runs" / "3")  # repaired: shown intact again
    index.entries(fresh=True)
    assert index.run(index.find("3")).status == "ok"
