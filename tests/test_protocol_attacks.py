"""Attacks on the write and collection protocol (docs/RELIABILITY.md) from outside: each test is one
precise way to get a record that names a missing object, found while building tests/test_campaign.py."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import casmon
from casmon import faultpoints

from .test_protocol import GRACE, _wait_for, age_lists


def test_a_revived_object_whose_new_pack_has_the_condemned_packs_name(tmp_path):
    """A dead job left one small value alone in a pack; gc condemned it (named by that pack). A rerun stores
    the same value: it is condemned, so the rerun writes a new copy -- but the new pack holds the same bytes,
    so it has the same name, and "a new pack entry no list names" is the very entry the list names. gc
    sweeps the list between the rerun's pack and its record, and the record names a value that is gone."""
    loc = str(tmp_path / "s")
    pauses = tmp_path / "pause"
    pauses.mkdir()
    dead = casmon.open(loc, autoflush=None)
    d = dead.put({"orphan": 1})  # one manifest, the only object of its flush
    dead.close()  # the job dies before any record names it
    assert casmon.open(loc).gc(grace=GRACE).condemned == 1
    assert age_lists(loc, 2 * GRACE) == 1
    w = casmon.open(loc, autoflush=None)
    assert w.put({"orphan": 1}) == d
    assert w.objects.revived == 1  # condemned: a new copy, not deduplicated
    w.append("job", {"n": 1}, refs=[d])
    faultpoints.configure(f"flush.after_index=pause:{pauses}")
    try:
        t = threading.Thread(target=w.flush)
        t.start()
        _wait_for(pauses / "flush.after_index.reached", thread=t)
        faultpoints.configure(None)
        casmon.open(loc).gc(grace=GRACE)  # sweeps the due list: d is unreachable, the record is not visible yet
    finally:
        (pauses / "flush.after_index.go").touch()
        t.join(60)
    s = casmon.open(loc)
    rep = s.verify()
    assert rep.ok, rep.as_dict()
    assert s.get(d) == {"orphan": 1}


def test_a_writers_index_merge_that_began_before_gc_took_its_lock(tmp_path):
    """W7 merges the index only if `gc/lock` does not exist: a check, then the merge. A writer that checked
    just before gc took the lock, and was descheduled after reading the index files, writes its generation
    after gc swept: the same provenance as gc's generation, a newer id, so gc's is redundant -- and the
    writer's still holds the swept entries. The index names a pack gc deleted; a later writer deduplicates
    against that entry and writes a record that names a missing value."""
    from casmon.store.table import L0_MERGE

    loc = str(tmp_path / "s")
    dead = casmon.open(loc, autoflush=None)
    orphan = dead.put({"orphan": 2})
    dead.close()
    assert casmon.open(loc).gc(grace=GRACE).condemned == 1
    assert age_lists(loc, 2 * GRACE) == 1
    live = casmon.open(loc, autoflush=None)
    live.objects.index.consolidate = lambda *a, **k: None  # (this writer does not merge)
    for i in range(L0_MERGE):  # level-0 index files enough for a writer's merge (W7), all reachable
        live.append("keep", {"i": i}, refs=[live.put({"keep": i})])
        live.flush()

    w = casmon.open(loc, autoflush=None)
    idx = w.objects.index
    idx.refresh()
    assert idx.wants_merge()
    stalled, go = threading.Event(), threading.Event()
    write_generation = idx._write_generation

    def descheduled(*a, **k):  # the entries are read; the writer is off the CPU while gc runs
        stalled.set()
        go.wait(60)
        return write_generation(*a, **k)

    idx._write_generation = descheduled
    t = threading.Thread(target=w._merge_tables)  # W7: a writer's merge holds the store lock while it runs
    t.start()
    assert stalled.wait(60)
    done: dict = {}
    g = threading.Thread(target=lambda: done.setdefault("rep", casmon.open(loc).gc(grace=GRACE)))
    g.start()
    g.join(1.0)
    assert g.is_alive() and not done  # gc waits: it cannot sweep under a merge that read the index before it
    go.set()
    t.join(60)
    g.join(120)
    rep = done["rep"]  # after the merge: sweeps the orphan, merges the index without it
    assert rep.deleted_objects == 1
    # What the resurrected entry does to the next writer that has the index in memory (any lookup loads
    # it): it deduplicates against the entry, and its record names a value that is not stored.
    r = casmon.open(loc, autoflush=None)
    r.objects.index.lookup(b"\0" * 16)
    assert r.put({"orphan": 2}) == orphan
    r.append("job", {"n": 1}, refs=[orphan])
    r.close()
    s = casmon.open(loc)
    assert s.verify().ok, s.verify().as_dict()
    assert s.get(orphan) == {"orphan": 2}


RUN_JOB = """
import sys, casmon
store = casmon.open(sys.argv[1])
with casmon.record(comment="r", store=store) as run:
    print("the run's own output, " * 200)
    run.info["table"] = list(range(2000))   # a value the manifest names
"""


@pytest.mark.parametrize("kill_at", ["flush.sealed@2", "flush.after_records@2"])
def test_a_run_killed_between_its_ref_and_its_record(tmp_path, min_grace, kill_at):
    """A run's end writes its manifest, a `run` record naming every value the manifest needs, the ref (set_ref:
    objects first, then the ref), then flushes the record. Killed in that flush, the ref points at the final
    manifest, but no record keeps the output and info values the manifest names by digest (gc follows
    manifests' chunks and children, not digests inside a JSON manifest): gc removes them, and the run, listed
    as "ok", cannot show its output."""
    import os
    import time

    from .conftest import run_python

    min_grace(1.0)
    loc = str(tmp_path / "s")
    p = run_python(RUN_JOB, loc, env={"CASMON_FAULTPOINTS": f"{kill_at}=kill"}, cwd=tmp_path, check=False)
    assert p.returncode == -9, p.stderr  # killed in the run's last flush
    for _ in range(3):
        casmon.open(loc).gc(grace=1.0)
        time.sleep(1.1)
    s = casmon.open(loc)
    assert s.verify().ok
    (run,) = casmon.list_runs(s)
    # The record that protects the final manifest's values is written before the ref names that manifest:
    # killed in between, the run still shows as not finished -- never as "ok" without its output.
    assert run.status == "running"
    assert casmon.load_run(run.name, s).status == "running"


def test_a_value_put_before_gc_swept_its_chunk_and_written_after(tmp_path, min_grace):
    """Found by tests/test_campaign.py (a writer that stores values without records killed; verify not clean).

    A job that stores values without (yet) a record: `put` of a large value relies on its loose chunk,
    which an earlier dead job left and gc condemned after this writer last looked at the lists; the
    value's manifest waits in memory for the next flush. gc sweeps the chunk; the flush then writes the
    manifest. No record names the value, so W3 never checks it -- but the store now holds a manifest
    whose chunk is gone, and `verify` reports the store broken ("missing object ... needed by value").
    At the most aggressive grace (1 s) a job that flushes less than once a second meets this."""
    import time

    min_grace(1.0)  # in real time: the grace period really passes between the put and the flush
    loc = str(tmp_path / "s")
    dead = casmon.open(loc, autoflush=None)
    v = np.random.default_rng(0).random(100_000)  # one loose chunk and a manifest
    dead.put(v)
    dead.close()  # no record names it
    w = casmon.open(loc, autoflush=None)
    w.objects.refresh_view()  # this writer looks at the condemned lists now: none yet
    d = w.put(v)  # the chunk is stored and condemned by no list: relied on; the manifest waits in memory
    assert casmon.open(loc).gc(grace=1.0).condemned == 2  # the chunk and the old manifest
    time.sleep(1.2)
    casmon.open(loc).gc(grace=1.0)  # the list is due: the chunk and the old manifest go
    w.flush()  # the manifest, put before the sweep, comes to be written after it
    rep = casmon.open(loc).verify()
    assert rep.ok, rep.as_dict()
    assert d not in casmon.open(loc) or np.array_equal(casmon.open(loc).get(d), v)
