"""A crafted runs index (its checksum made valid) shows on the runs page no more than list_runs shows from it:
an entry stands only for the run it names, whose ref names the entry's manifest."""

import json
import shutil

import pytest

import casmon
from benchmarks.runs_store import build
from casmon.runs import index
from casmon.ui import model, table

pytestmark = pytest.mark.filterwarnings("ignore::casmon.RunWarning")


def _page(s, **how):
    view = table.runs_view(model.RunIndex(s), **how)
    return view.total, [(e.ref, e.status, row) for e, _r, row in view.rows], view.error


def _listed(root):
    return {r.ref: (r.status, r.flat_params(), {k: v["last"] for k, v in r.metric_summary().items()})
            for r in casmon.list_runs(casmon.open(root, read_only=True))}


def test_an_entry_of_no_run_claiming_a_runs_manifest_changes_nothing_the_page_shows(tmp_path):
    root = tmp_path / "s"
    build(str(root), 12, metrics=1, points=2)
    casmon.list_runs(casmon.open(root))
    plain = tmp_path / "plain"
    shutil.copytree(root, plain)
    shutil.rmtree(plain / "runs-index")
    base = root / "runs-index" / "base"
    entries = index.decode(base.read_bytes(), "base")
    for n in (5, 6):  # entries named as no run is, each claiming a real run's manifest, saying other things
        e = list(entries[f"runs/{n}"])
        m = json.loads(e[2])
        m["params"], m["status"] = {"lr": 123.0}, "failed"
        e[2], e[7] = json.dumps(m), "failed"
        e[0] = "0-0-0"
        e[4] = {"loss": {"n": 1, "last": 99.0, "step": 0, "time": 1.0, "min": 99.0, "max": 99.0, "digest": None}}
        entries[f"runs/ghost{n}"] = e
    base.write_bytes(index.encode(entries))  # a valid checksum
    assert index.decode(base.read_bytes(), "base").keys() >= {"runs/ghost5", "runs/ghost6"}
    assert _listed(root) == _listed(plain)
    for how in ({}, {"q": "lr>100"}, {"q": "status:failed"}, {"sort": "param.lr"}, {"sort": "metric.loss"},
                {"q": "loss>50"}, {"sort": "status", "q": "lr>0"}):
        assert _page(casmon.open(root, read_only=True), **how) == _page(casmon.open(plain, read_only=True), **how), how
    s = casmon.open(root, read_only=True)
    ri = model.RunIndex(s)
    r = ri.run(ri.find("5"))
    assert r.params()["lr"] != 123.0 and r.metric_summary()["loss"]["last"] != 99.0
