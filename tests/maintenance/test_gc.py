"""``casmon gc`` (casmon/maintenance/gc.py): it removes only what nothing reachable needs, after the grace
period, keeps what a live process put until a record names it, repacks live values, clears old
``*.partial`` files, and a dry run changes nothing."""

import time

import numpy as np

import casmon
from tests.support.stores import build


def test_gc_now_removes_only_unreachable(tmp_path):
    s, keep, small, orphan, orphan_small, big = build(tmp_path)
    rep = s.gc(grace=0)
    assert rep.deleted_objects >= 3  # orphan's manifest and chunk(s), orphan_small
    fresh = casmon.open(tmp_path / "s")
    assert orphan not in fresh and orphan_small not in fresh
    assert np.array_equal(fresh.get(keep)["big"], big)
    assert fresh.get(small) == [1, 2, 3]
    assert fresh.verify().ok


def test_gc_waits_for_the_grace_period(tmp_path, min_grace):
    min_grace(0.5)
    s, keep, small, orphan, orphan_small, big = build(tmp_path)
    s.close()  # the job that stored the orphans is over (a live one would keep what it put, see below)
    s = casmon.open(tmp_path / "s")
    first = s.gc(grace=0.5)
    assert first.deleted_objects == 0 and first.waiting >= 3
    assert orphan in casmon.open(tmp_path / "s")
    time.sleep(0.6)
    second = s.gc(grace=0.5)
    assert second.deleted_objects >= 3
    assert orphan not in casmon.open(tmp_path / "s")
    assert casmon.open(tmp_path / "s").verify().ok


def test_a_live_process_keeps_what_it_put_until_a_record_names_it(tmp_path, min_grace):
    """A value put and not yet named (a call still running) survives gc while its process lives."""
    min_grace(0.5)
    s = casmon.open(tmp_path / "s", autoflush=None)
    held = s.put(np.arange(100_000.0))
    s.flush()
    gc_store = casmon.open(tmp_path / "s")
    gc_store.gc(grace=0.5)  # condemns it
    time.sleep(0.6)
    s.flush()  # the holder sees the list and copies what it holds
    gc_store.gc(grace=0.5)  # sweeps the list: the old copy goes, the new one stays
    s.append("call", {"n": 1}, refs=[held])
    s.close()
    fresh = casmon.open(tmp_path / "s")
    assert fresh.verify().ok and fresh.get(held)[-1] == 99_999.0


def test_gc_dry_run_changes_nothing(tmp_path):
    s, *_ = build(tmp_path)
    before = sorted(str(p) for p in (tmp_path / "s").rglob("*"))
    rep = s.gc(grace=0, dry_run=True)
    assert rep.deleted_objects >= 3
    assert sorted(str(p) for p in (tmp_path / "s").rglob("*")) == before


def test_gc_repacks_and_keeps_live_values(tmp_path):
    s = casmon.open(tmp_path / "s", autoflush=None)
    live = [s.put(("live", i)) for i in range(10)]
    dead = [s.put(("dead", i, "x" * 200)) for i in range(90)]
    s.append("k", {}, refs=live)
    s.flush()
    rep = s.gc(grace=0)
    assert rep.repacked_packs == 1
    fresh = casmon.open(tmp_path / "s")
    assert [fresh.get(d) for d in live] == [("live", i) for i in range(10)]
    assert all(d not in fresh for d in dead)
    assert fresh.verify().ok


def test_gc_removes_old_partial_files(tmp_path):
    s, *_ = build(tmp_path)
    junk = tmp_path / "s" / "objects" / "ab" / "abc.1234.partial"
    junk.parent.mkdir(parents=True, exist_ok=True)
    junk.write_bytes(b"half")
    import os

    old = time.time() - 3600
    os.utime(junk, (old, old))
    assert s.gc(grace=0).partial_files == 1
    assert not junk.exists()
