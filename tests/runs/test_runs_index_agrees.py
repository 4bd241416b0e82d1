"""Over random histories of a store (runs that end ok or fail, runs still running, runs resumed, deleted or
re-tagged, listings in between), a listing through the runs index says what a listing that reads every ref
and manifest says, whatever the file clock's tick."""

import shutil
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import casmon
from casmon.runs import index
from casmon.runs.tags import tag_run

pytestmark = pytest.mark.filterwarnings("ignore::casmon.RunWarning")

OPS = st.lists(st.sampled_from(["ok", "failed", "running", "end running", "resume", "delete", "tag", "list"]),
               min_size=3, max_size=9)


def _view(runs):
    """What a listing says of each run (as text: a NaN metric equals a NaN)."""
    return [repr((r.ref, r.name, r.status, r.manifest.get("start"), r.params(), r.metric_summary(), r.tags,
                  r.manifest.get("n"), r.error is None)) for r in runs]


def _direct(path):
    aside = path.parent / "aside"
    shutil.rmtree(aside, ignore_errors=True)
    if (path / "runs-index").exists():
        shutil.move(path / "runs-index", aside)
    try:
        return _view(casmon.list_runs(casmon.open(path, read_only=True)))
    finally:
        if aside.exists():
            shutil.rmtree(path / "runs-index", ignore_errors=True)
            shutil.move(aside, path / "runs-index")
        index._read.clear()


def _ended(s, i, fail):
    try:
        with casmon.record(store=s, capture_output=False) as run:
            run.params = {"i": i, "cfg": {"lr": 0.1 * i}}
            run.tags = ["t%d" % (i % 3)]
            run.log(loss=1.0 / (i + 1), acc=float("nan") if i % 2 else 0.5)
            if fail:
                raise RuntimeError("failed on purpose")
    except RuntimeError:
        pass


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(ops=OPS, tick=st.sampled_from([-3600, 3600]), fold=st.sampled_from([1, 32]), data=st.data())
def test_a_listing_through_the_index_says_what_the_runs_say(tmp_path_factory, monkeypatch, ops, tick, fold, data):
    import casmon.store.backend.local as local

    at = time.time_ns() + tick * 10**9  # a tick over long ago (stamps settled) or not over yet
    monkeypatch.setattr(local, "_stamp_of", lambda st: f"{st.st_ino:x}.{at:x}.{at:x}.{st.st_size:x}")
    monkeypatch.setattr(index, "FOLD_AT", fold)
    index._read.clear()
    path = tmp_path_factory.mktemp("agree") / "s"
    s = casmon.open(path, create=True)
    running = []
    try:
        for i, op in enumerate(ops):
            refs = [r.ref for r in casmon.list_runs(s) if r.status != "running"]
            if op in ("ok", "failed"):
                _ended(s, i, op == "failed")
            elif op == "running":
                rec = casmon.record(store=s, capture_output=False)
                rec.__enter__()  # nothing logged: its live thread writes nothing between two listings
                running.append(rec)
            elif op == "end running" and running:
                running.pop(0).__exit__(None, None, None)
            elif op == "resume" and refs:
                ref = data.draw(st.sampled_from(refs))
                try:
                    with casmon.record(store=s, capture_output=False, resume=ref) as run:
                        run.log(loss=-1.0)
                except casmon.CasmonError:
                    pass  # an ok run is not resumed: the listing still agrees
            elif op == "delete" and refs:
                casmon.delete_run(data.draw(st.sampled_from(refs)), s, force=True)
            elif op == "tag" and refs:
                tag_run(data.draw(st.sampled_from(refs)), add=["x%d" % i], remove=["t0"], store=s)
            assert _view(casmon.list_runs(s)) == _direct(path)
        assert _view(casmon.list_runs(casmon.open(path))) == _direct(path)
    finally:
        for rec in running:
            rec.__exit__(None, None, None)
        s.close()
