"""Metric compaction: an ended run's many small batches become one record, and no step of it loses or
duplicates a point (kills at each named fault point, readers during it)."""

import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import casmon
from casmon.runs.compaction import compact_run, compact_runs
from casmon.runs.metrics import KIND_METRICS, metrics_key
from tests.support.processes import ENV, PY

pytestmark = pytest.mark.filterwarnings("ignore::casmon.RunWarning")

WRITE = """
import os, sys, numpy as np, casmon
from casmon import faultpoints
from casmon.runs import recorder
store = casmon.open(sys.argv[1], create=True)
if sys.argv[2] == "no-compact":
    recorder.COMPACT_OVER = 1 << 60  # as a run killed before its end compacted: gc's work
with casmon.record(store=store, capture_output=False) as run:
    for i in range(int(sys.argv[3])):
        run.log(loss=float(i), acc=i * 0.5, step=i)
        if i % 7 == 0:
            store.flush()
    faultpoints.configure(os.environ.get("AT_END"))  # armed for the run's end only: merges during it go on
"""


def _records(store, ref):
    store.table(KIND_METRICS).refresh()
    return [r for r in store.lookup(KIND_METRICS, metrics_key(ref)) if r.get("run") == ref]


def _write_run(path, n, how="compact", env=None):
    p = subprocess.run([PY, "-c", WRITE, str(path), how, str(n)], env=env or ENV, capture_output=True, text=True,
                       timeout=300)
    return p


@pytest.fixture
def store(tmp_path):
    s = casmon.open(tmp_path / "s", create=True)
    yield s
    s.close()


def _many_batches(store, n=400, every=3, **kw):
    with casmon.record(store=store, capture_output=False, **kw) as run:
        for i in range(n):
            run.log(loss=float(i), acc=i * 0.5, step=i)
            if i % every == 0:
                store.flush()
    return run.ref


def test_a_run_of_many_batches_is_one_record_once_it_ends_and_reads_the_same(store):
    ref = _many_batches(store)
    recs = _records(store, ref)
    assert len(recs) == 1 and recs[0]["covers"]
    r = casmon.load_run("latest", store)
    loss = r.metric("loss")
    assert np.array_equal(loss.steps, np.arange(400)) and np.array_equal(loss.values, np.arange(400.0))
    assert np.array_equal(r.metric("acc").values, np.arange(400) * 0.5)
    assert r.metric_summary()["loss"]["n"] == 400


def test_a_run_of_few_batches_is_left_as_it_is(store):
    ref = _many_batches(store, n=10, every=100)
    assert len(_records(store, ref)) <= 2 and all("covers" not in r for r in _records(store, ref))


def test_a_stored_batch_of_many_points_survives_compaction_and_gc(store):
    with casmon.record(store=store, capture_output=False) as run:
        for k in range(12):
            for i in range(1000):
                run.log(x=float(k * 1000 + i), step=k * 1000 + i)
            store.flush()
    assert len(_records(store, run.ref)) == 1
    store.gc(grace=0)
    x = casmon.load_run("latest", store).metric("x")
    assert np.array_equal(x.values, np.arange(12000.0))


def test_a_resumed_run_continues_after_its_compacted_points_and_compacts_again(store):
    ref = _many_batches(store, n=100, every=2)
    with casmon.record(store=store, capture_output=False, resume=ref, resume_ok=True) as run:
        for i in range(100, 200):
            run.log(loss=float(i), acc=i * 0.5, step=i)
            if i % 2 == 0:
                store.flush()
    recs = _records(store, ref)
    assert len(recs) == 1
    loss = casmon.load_run(ref, store).metric("loss")
    assert np.array_equal(loss.steps, np.arange(200)) and np.array_equal(loss.values, np.arange(200.0))


def test_compacting_twice_or_a_run_already_compacted_changes_nothing(store):
    ref = _many_batches(store)
    assert compact_run(store, ref) is False
    assert len(_records(store, ref)) == 1
    assert len(casmon.load_run("latest", store).metric("loss")) == 400


def test_a_crafted_covers_field_is_named_damage_not_a_crash_or_a_hang(store):
    ref = _many_batches(store, n=5, every=100)
    for bad in ([[0, 1 << 62]], "all", [[3, 1]], [[0]] * 70000):
        store.append(KIND_METRICS, {"run": ref, "seq": 99, "s": {}, "covers": bad}, key=metrics_key(ref))
        store.flush()
        r = casmon.load_run("latest", store)
        if bad == [[0, 1 << 62]]:
            assert r.metric_summary() is not None  # a huge range is a range: it covers, it does not loop
            continue
        with pytest.raises(casmon.DamagedObjectError, match="covers"):
            r.metric("loss")
        casmon.delete_run(ref, store)
        ref = _many_batches(store, n=5, every=100)


def test_gc_compacts_a_run_that_ended_without_compacting(tmp_path):
    path = tmp_path / "s"
    p = _write_run(path, 300, "no-compact")
    assert p.returncode == 0, p.stderr
    s = casmon.open(path)
    ref = casmon.load_run("latest", s).ref
    assert len(_records(s, ref)) > 8
    assert compact_runs(s) == [ref]
    assert len(_records(s, ref)) == 1
    assert np.array_equal(casmon.load_run("latest", s).metric("loss").values, np.arange(300.0))
    from tests.support.cli import cli

    _write_run(path, 60, "no-compact")
    cli("gc", "--store", str(path))
    assert all(len(_records(casmon.open(path), r.ref)) == 1 for r in casmon.list_runs(casmon.open(path)))


@pytest.mark.parametrize("point", ["compact.appended", "compact.written", "merge.after_buckets",
                                   "merge.after_manifest", "compact.retired"])
def test_a_compaction_killed_at_each_step_loses_no_point_and_duplicates_none(tmp_path, point):
    path = tmp_path / "s"
    env = dict(ENV, AT_END=f"{point}=kill")
    p = _write_run(path, 120, "compact", env)
    assert p.returncode == -9, p.stderr  # killed at the point
    s = casmon.open(path)
    r = casmon.load_run("latest", s)
    assert np.array_equal(r.metric("loss").values, np.arange(120.0))
    assert np.array_equal(r.metric("acc").steps, np.arange(120))
    compact_run(s, r.ref)  # gc's pass finishes it
    assert len(_records(s, r.ref)) == 1
    assert np.array_equal(casmon.load_run("latest", s).metric("loss").values, np.arange(120.0))


def test_readers_during_a_compaction_see_every_point_once(store):
    from casmon.runs import recorder

    saved = recorder.COMPACT_OVER
    recorder.COMPACT_OVER = 1 << 60
    try:
        ref = _many_batches(store, n=600, every=2)
    finally:
        recorder.COMPACT_OVER = saved
    reader = casmon.open(store.url, read_only=True)
    stop = threading.Event()
    bad: list = []

    def read():
        while not stop.is_set():
            try:
                v = casmon.load_run(ref, reader).metric("loss").values
                if not np.array_equal(v, np.arange(600.0)):
                    bad.append(len(v))
            except casmon.CasmonError as e:  # a reader may meet a table mid-rewrite: it says so, never wrong
                bad.append(repr(e))

    t = threading.Thread(target=read)
    t.start()
    try:
        assert compact_run(store, ref)
    finally:
        stop.set()
        t.join()
    assert not [b for b in bad if isinstance(b, int)], bad
    assert len(_records(store, ref)) == 1


def test_a_short_runs_end_in_a_store_of_many_runs_rewrites_no_table_and_gc_retires_its_batches(store, monkeypatch):
    from casmon.runs import recorder

    monkeypatch.setattr(recorder, "COMPACT_OVER", 1 << 60)  # runs that leave their batches: many records
    for _ in range(3):
        with casmon.record(store=store, capture_output=False) as run:
            for i in range(300):
                run.log(x=float(i), step=i)
                if i % 3 == 0:
                    store.flush()
    monkeypatch.undo()
    big = store.table(KIND_METRICS).count()
    ref = _many_batches(store, n=12, every=1)  # 12 batches: compacted, but too few to rewrite the table for
    recs = _records(store, ref)
    assert sum("covers" in r for r in recs) == 1 and len(recs) > 1 and store.table(KIND_METRICS).count() > big
    assert np.array_equal(casmon.load_run("latest", store).metric("loss").values, np.arange(12.0))
    assert ref in compact_runs(store)  # gc's pass retires them (and compacts the others)
    assert len(_records(store, ref)) == 1
    assert np.array_equal(casmon.load_run("latest", store).metric("loss").values, np.arange(12.0))


LOST = """
import os, signal, sys, casmon
store = casmon.open(sys.argv[1], create=True)
run = casmon.start_run(store=store, capture_output=False)
for i in range(90):
    run.log(loss=float(i), step=i)
    if i % 3 == 2:
        store.flush()
store.flush()
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_batch_of_a_lost_run_landing_after_gc_compacted_around_it_is_read_in_order(tmp_path):
    """A lost run's batches can land out of order (a live flush and the script's, a stalled writer): gc must
    not compact across a seq not yet there, or the late batch would be read before the points it follows."""
    import time

    from casmon.store.lock import held
    from casmon.store.records import parse_record

    path = tmp_path / "s"
    p = subprocess.run([PY, "-c", LOST, str(path)], env=ENV, capture_output=True, text=True, timeout=300)
    assert p.returncode == -9, p.stderr
    s = casmon.open(path)
    ref = casmon.load_run("latest", s).ref
    got = s.get_ref(ref)
    s.set_ref(ref, got.target, dict(got.data, heartbeat=time.time() - 3600))  # no heartbeat for an hour: lost
    assert casmon.load_run("latest", s).status == "lost"
    key = bytes(metrics_key(ref))
    table = s.table(KIND_METRICS)
    table.refresh()
    raws = [bytes(v) for v in table.lookup(key)]
    seqs = sorted(parse_record(KIND_METRICS, b"", r)["seq"] for r in raws)
    late = [r for r in raws if parse_record(KIND_METRICS, b"", r)["seq"] == seqs[len(seqs) // 2]][0]
    with held(s.backend, "test", s.url):  # that batch is not there yet
        table.consolidate(force=True, keep=lambda k, v: bytes(v) != late)
    assert compact_runs(s) == [ref]
    s.append(KIND_METRICS, parse_record(KIND_METRICS, b"", late), key=key)  # the writer wakes: it lands
    s.flush()
    r = casmon.load_run("latest", casmon.open(path))
    assert np.array_equal(r.metric("loss").steps, np.arange(90))
    compact_runs(s)  # once every seq is there, one record
    assert np.array_equal(casmon.load_run("latest", casmon.open(path)).metric("loss").steps, np.arange(90))


@pytest.mark.parametrize("point", ["compact.appended", "compact.written", "merge.after_buckets",
                                   "merge.after_manifest", "compact.retired", "index.base_written"])
def test_gc_killed_at_each_step_of_compacting_then_gc_again_loses_no_point_and_lists_the_truth(tmp_path, point):
    import shutil

    path = tmp_path / "s"
    for _ in range(2):
        assert _write_run(path, 90, "no-compact").returncode == 0
    shutil.rmtree(path / "runs-index", ignore_errors=True)  # gc's listing writes the index anew
    env = dict(ENV, CASMON_FAULTPOINTS=f"{point}=kill")
    p = subprocess.run([PY, "-m", "casmon", "gc", "--store", str(path)], env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == -9, p.stdout + p.stderr
    p = subprocess.run([PY, "-m", "casmon", "gc", "--store", str(path)], env=ENV, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    s = casmon.open(path)
    runs = casmon.list_runs(s)
    assert len(runs) == 2
    for r in runs:
        assert np.array_equal(r.metric("loss").values, np.arange(90.0))
        assert np.array_equal(r.metric("acc").steps, np.arange(90))
        assert r.metric_summary()["loss"]["n"] == 90 and len(_records(s, r.ref)) == 1
    direct = [(r.ref, r.status, r.metric_summary()) for r in casmon.list_runs(casmon.open(path, read_only=True))]
    shutil.rmtree(path / "runs-index")
    assert [(r.ref, r.status, r.metric_summary()) for r in casmon.list_runs(casmon.open(path, read_only=True))] \
        == direct


def test_compaction_keeps_nan_infinities_extreme_steps_and_names_that_need_escaping(store):
    from casmon.runs import recorder

    names = ["a/b", "x y", "é\"\\", "$", "covers", "sys/..", "seq", "b64"]
    values = [float("nan"), float("inf"), float("-inf"), 1e308, -0.0, 5e-324, 1.0, 2.0]
    saved = recorder.COMPACT_OVER
    recorder.COMPACT_OVER = 1 << 60
    try:
        with casmon.record(store=store, capture_output=False) as run:
            for i in range(40):
                step = (1 << 63) - 100 + i if i % 2 else -(1 << 63) + i
                run.log(step=step, **{n: v * (i + 1) if v == v and abs(v) < 1e300 else v
                                      for n, v in zip(names, values)})
                if i % 3 == 0:
                    store.flush()
    finally:
        recorder.COMPACT_OVER = saved
    before = casmon.load_run(run.ref, store).metrics()
    summary = casmon.load_run(run.ref, store).metric_summary()
    assert compact_run(store, run.ref)
    assert len(_records(store, run.ref)) == 1
    after = casmon.load_run(run.ref, casmon.open(store.url)).metrics()
    assert sorted(after) == sorted(names)
    for n in names:
        for a, b in ((before[n].steps, after[n].steps), (before[n].values, after[n].values),
                     (before[n].times, after[n].times)):
            assert a.tobytes() == b.tobytes(), n  # bit for bit: NaN, -0.0 and subnormals too
    assert {k: (v["n"], v["step"]) for k, v in casmon.load_run(run.ref, store).metric_summary().items()} == \
        {k: (v["n"], v["step"]) for k, v in summary.items()}
