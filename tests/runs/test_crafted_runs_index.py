"""A crafted runs index (its checksum made valid) is taken for a run only as far as the run's ref agrees with it:
an entry naming a live run's manifest as ended shows no ended run, and is not written into the next index."""

import time

import pytest

import casmon
from casmon.runs import index
from casmon.store.peek import load_data
from casmon.ui import model

pytestmark = pytest.mark.filterwarnings("ignore::casmon.RunWarning")


def test_an_entry_saying_a_live_run_ended_is_not_taken_for_it(tmp_path, monkeypatch):
    monkeypatch.setattr(index, "FOLD_AT", 0)  # every listing writes a new base: the entry is not renewed in it
    root = tmp_path / "s"
    s = casmon.open(root)
    with casmon.record(store=s, capture_output=False, params={"lr": 0.1}) as run:
        casmon.log(loss=1.0)
        s.flush()
        ref = s.get_ref(run.ref)
        assert ref.data["status"] == "running"
        m = dict(load_data(s, ref.target.hex(), "manifest", dict))
        m.update(status="ok", end=m["start"] + 1.0, params={"lr": 123.0}, metrics={})
        e = index.entry("0-0-0", ref.target.hex(), m, {}, time.time())  # a stamp no ref has: its target names it
        assert e is not None
        s.backend.set(index.BASE, index.encode({run.ref: e}))
        for _ in range(2):  # and again, after a listing that may fold what it read into a new base
            other = casmon.open(root)
            got = {r.ref: r for r in casmon.list_runs(other)}[run.ref]
            assert got.status == "running" and got.params()["lr"] == 0.1
            stamp = other.backend.stamp("refs/" + run.ref)
            assert index.load(other)[0].get(run.ref, [None])[0] != stamp
            ui = model.RunIndex(casmon.open(root, read_only=True))
            r = ui.run(ui.find(run.ref.rsplit("/", 1)[-1]))
            assert r.status == "running" and r.params()["lr"] == 0.1
    assert {r.ref: r.status for r in casmon.list_runs(casmon.open(root))}[run.ref] == "ok"
