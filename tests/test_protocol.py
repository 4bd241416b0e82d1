"""The write and collection protocol, step by step: every writer step against every gc step.

Writers and gc stop at named fault points (casmon.faultpoints), so each
interleaving is run on purpose rather than by luck. The scenario is the hard
one: a value that an earlier, dead job stored is unreachable and condemned by
gc; a new job stores the same value again (deduplication) and writes a record
that names it, while gc sweeps. Whatever the interleaving, and whether the
writer is killed at its step or not, no record may name a missing object.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import casmon
from casmon import condemned, faultpoints
from casmon.gc import read_lists

WRITER_POINTS = ["put.after_chunks", "flush.sealed", "flush.after_pack", "flush.after_index", "flush.after_records"]
GC_POINTS = ["gc.locked", "gc.after_mark", "gc.before_sweep", "gc.after_sweep", "gc.after_condemn"]
GRACE = 60.0


def big_value():
    return np.arange(300_000, dtype=np.float64)  # one loose chunk


def small_value():
    return {"params": list(range(50)), "name": "small"}


def age_lists(loc: str, seconds: float) -> int:
    """Make every published condemned list look ``seconds`` older (as if gc had condemned it then)."""
    root = Path(loc) / "gc" / "condemned"
    n = 0
    for p in root.glob("*"):
        if ".partial" in p.name:
            continue
        lst = condemned.decode(p.name, p.read_bytes())
        lst.time -= seconds
        p.write_bytes(condemned.encode(lst))
        n += 1
    return n


def orphaned_store(loc: str):
    """A store where a dead job left both values unreachable, and gc has condemned them long enough ago."""
    s = casmon.open(loc, autoflush=None)
    big, small = s.put(big_value()), s.put(small_value())
    s.append("keep", {"what": "something else"}, refs=[s.put("unrelated")])
    s.close()  # the job "died" before writing any record that names big or small
    rep = casmon.open(loc).gc(grace=GRACE)
    assert rep.condemned >= 3  # the two values and the big value's chunk
    assert age_lists(loc, 2 * GRACE) == 1
    return big, small


def _writer(loc: str, spec: str, done: str) -> None:
    faultpoints.configure(spec)
    s = casmon.open(loc, autoflush=None)
    big, small = s.put(big_value()), s.put(small_value())
    s.append("job", {"n": 1}, refs=[big, small])
    s.flush()
    Path(done).write_text("ok")
    os._exit(0)


def _wait_for(path: Path, proc=None, thread=None, timeout: float = 60.0) -> bool:
    """Wait until ``path`` exists (True) or the process/thread ended without reaching it (False)."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc is not None and not proc.is_alive():
            return path.exists()
        if thread is not None and not thread.is_alive():
            return path.exists()
        if time.monotonic() > deadline:
            raise AssertionError(f"{path.name} not reached in {timeout} s")
        time.sleep(0.005)
    return True


def run_interleaving(tmp: Path, wpoint: str, gpoint: str, kill: bool, gc_first: bool) -> dict:
    loc = str(tmp / "s")
    pauses = tmp / "pause"
    pauses.mkdir()
    big, small = orphaned_store(loc)
    done = tmp / "writer.done"
    ctx = multiprocessing.get_context("fork")
    gc_errors: list[BaseException] = []

    def run_gc():
        try:
            casmon.open(loc).gc(grace=GRACE)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            gc_errors.append(e)

    faultpoints.configure(f"{gpoint}=pause:{pauses}")
    try:
        writer = ctx.Process(target=_writer, args=(loc, f"{wpoint}=pause:{pauses}", str(done)))
        gc_thread = threading.Thread(target=run_gc)
        if gc_first:
            gc_thread.start()
            g_reached = _wait_for(pauses / f"{gpoint}.reached", thread=gc_thread)
            writer.start()
            w_reached = _wait_for(pauses / f"{wpoint}.reached", proc=writer)
        else:
            writer.start()
            w_reached = _wait_for(pauses / f"{wpoint}.reached", proc=writer)
            gc_thread.start()
            g_reached = _wait_for(pauses / f"{gpoint}.reached", thread=gc_thread)
        if kill and w_reached:
            writer.kill()
        (pauses / f"{wpoint}.go").touch()
        writer.join(60)
        (pauses / f"{gpoint}.go").touch()
        gc_thread.join(60)
    finally:
        faultpoints.configure(None)
        (pauses / f"{wpoint}.go").touch()
        (pauses / f"{gpoint}.go").touch()
    assert not gc_errors, gc_errors
    wrote = done.exists()
    assert wrote != (kill and w_reached), "the writer must finish exactly when it was not killed"

    def check(stage: str) -> None:
        s = casmon.open(loc)
        rep = s.verify()
        assert rep.ok, f"{stage}: {rep.as_dict()}"
        jobs = list(s.records("job"))
        if wrote:
            assert len(jobs) == 1, f"{stage}: the acknowledged record is lost"
        for _k, rec in jobs:
            assert rec["_refs"] == [big.hex(), small.hex()]
            assert np.array_equal(s.get(big), big_value()) and s.get(small) == small_value(), stage

    check("right after")
    # Every list ages past the grace period and gc sweeps again: what the record names must survive.
    age_lists(loc, 2 * GRACE)
    casmon.open(loc).gc(grace=GRACE)
    age_lists(loc, 2 * GRACE)
    casmon.open(loc).gc(grace=GRACE)
    check("after two more sweeps")
    return {"writer_reached": w_reached, "gc_reached": g_reached, "wrote": wrote}


COMBOS = [(w, g, kill, first) for w in WRITER_POINTS for g in GC_POINTS for kill in (False, True) for first in (False, True)]


@pytest.mark.parametrize("wpoint,gpoint,kill,gc_first", COMBOS,
                         ids=[f"{w}-{g}-{'kill' if k else 'run'}-{'gc' if f else 'w'}first" for w, g, k, f in COMBOS])
def test_interleaving(tmp_path, wpoint, gpoint, kill, gc_first, figures):
    """Every writer step x every gc step x killed or not x who goes first (100 cases)."""
    out = run_interleaving(tmp_path, wpoint, gpoint, kill, gc_first)
    figures("protocol: interleavings of a writer step and a gc step checked", 1)
    figures("protocol: writer killed at its step, store verified clean", int(kill and out["writer_reached"]))


def test_the_walk_names_real_points():
    assert set(WRITER_POINTS + GC_POINTS) <= set(faultpoints.POINTS)
    gc_steps = [p for p in faultpoints.POINTS if p.startswith("gc.")]
    assert set(GC_POINTS) == set(gc_steps)


def test_condemned_values_are_written_again_not_relied_on(tmp_path):
    """The revive-an-orphan case at the default settings: the rerun job writes new copies."""
    loc = str(tmp_path / "s")
    big, small = orphaned_store(loc)
    s = casmon.open(loc, autoflush=None)
    assert s.put(big_value()) == big and s.put(small_value()) == small
    assert s.objects.revived >= 3  # both manifests and the chunk: new copies, not deduplicated
    # gc sweeps the old list before the record is visible (the worst case) ...
    casmon.open(loc).gc(grace=GRACE)
    assert not read_lists(casmon.open(loc))[0] or all(big not in lst.digests for lst in read_lists(casmon.open(loc))[0])
    s.append("job", {"n": 1}, refs=[big, small])
    s.close()
    # ... and the record still finds every value.
    fresh = casmon.open(loc)
    assert fresh.verify().ok
    assert np.array_equal(fresh.get(big), big_value()) and fresh.get(small) == small_value()


def test_a_record_is_never_visible_before_its_values(tmp_path):
    """A record added while a flush is between its pack and its records waits for the next flush."""
    loc = str(tmp_path / "s")
    pauses = tmp_path / "pause"
    pauses.mkdir()
    s = casmon.open(loc, autoflush=None)
    s.append("early", {"i": 0}, refs=[s.put({"v": 0})])
    faultpoints.configure(f"flush.after_index=pause:{pauses}")
    try:
        t = threading.Thread(target=s.flush)
        t.start()
        _wait_for(pauses / "flush.after_index.reached", thread=t)
        late = s.put({"v": 1})  # waits in memory: this flush took its objects already
        s.append("late", {"i": 1}, refs=[late])
        (pauses / "flush.after_index.go").touch()
        t.join()
    finally:
        faultpoints.configure(None)
        (pauses / "flush.after_index.go").touch()
    other = casmon.open(loc)
    assert len(list(other.records("early"))) == 1
    assert list(other.records("late")) == []  # not written by the flush that was under way ...
    assert other.verify().ok
    s.flush()
    other = casmon.open(loc)
    assert [r["i"] for _k, r in other.records("late")] == [1]  # ... but by the next one
    assert other.get(late) == {"v": 1} and other.verify().ok


def test_a_ref_is_never_visible_before_its_value(tmp_path):
    loc = str(tmp_path / "s")
    s = casmon.open(loc, autoflush=None)
    d = s.put({"manifest": "small, so it waits in memory"})
    s.set_ref("runs/x", d)
    other = casmon.open(loc)
    assert other.get(other.get_ref("runs/x").target) == {"manifest": "small, so it waits in memory"}
    assert other.verify().ok


def test_one_gc_at_a_time(tmp_path):
    loc = str(tmp_path / "s")
    pauses = tmp_path / "pause"
    pauses.mkdir()
    casmon.open(loc).close()
    faultpoints.configure(f"gc.after_mark=pause:{pauses}")
    errors = []
    try:
        t = threading.Thread(target=lambda: casmon.open(loc).gc(grace=GRACE))
        t.start()
        _wait_for(pauses / "gc.after_mark.reached", thread=t)
        faultpoints.configure(None)
        with pytest.raises(casmon.errors.StoreError, match="another gc is running"):
            casmon.open(loc).gc(grace=GRACE)
    finally:
        (pauses / "gc.after_mark.go").touch()
        t.join()
    assert not errors
    casmon.open(loc).gc(grace=GRACE)  # the lock is gone with the gc that held it


def test_a_dead_gcs_lock_is_taken_over(tmp_path):
    loc = str(tmp_path / "s")
    ctx = multiprocessing.get_context("fork")
    casmon.open(loc).close()
    pauses = tmp_path / "pause"
    pauses.mkdir()

    def hold():
        faultpoints.configure(f"gc.after_mark=kill")
        casmon.open(loc).gc(grace=GRACE)

    p = ctx.Process(target=hold)
    p.start()
    p.join(60)
    assert (Path(loc) / "gc" / "lock").exists()  # killed while it held the lock
    casmon.open(loc).gc(grace=GRACE)  # same host, dead process: taken over
    assert not (Path(loc) / "gc" / "lock").exists()


def test_grace_below_the_minimum_is_refused(tmp_path):
    s = casmon.open(tmp_path / "s")
    with pytest.raises(ValueError, match="at least 60"):
        s.gc(grace=5)
