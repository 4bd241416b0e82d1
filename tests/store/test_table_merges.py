"""Merging level-0 table files into generations, beside readers and other writers: every entry is
kept once, a reader sees new writes on a miss, and readers never count an entry twice (generations
record exactly which level-0 files they contain, so racing merges overlap harmlessly), whichever
thread or process merges, refreshes or flushes meanwhile."""

import math
import os
import random
import sys
import threading
import time
import warnings
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import casmon
from casmon import faultpoints
from casmon.store import reliance
from casmon.store.backend import open_backend
from casmon.store.table import Table, L0_MERGE
from tests.support.tables import random_keys


def fill(t: Table, ks, batch: int, start: int = 0) -> None:
    """Add entries in level-0 files of ``batch`` entries, merging as a writer's flush does."""
    for i, k in enumerate(ks, start):
        t.add(k, b"v%d" % i)
        if i % batch == batch - 1:
            t.flush()
            if t.wants_merge():
                t.consolidate()
    t.flush()


def test_lookups_are_right_across_many_generations_and_writers(tmp_path):
    b = open_backend(tmp_path / "s")
    ks = random_keys(30_000)
    writers = [Table(b, "records/x/", f"w{i}") for i in range(3)]
    for j, t in enumerate(writers):  # three writers, interleaved files, each merging what it sees
        fill(t, ks[j::3], 700, start=0)
    # The same entry added twice (another writer) is one entry.
    writers[0].add(ks[1], b"v0")
    writers[0].flush()
    reader = Table(b, "records/x/", "r")
    reader.refresh()
    gens = reader._active_gens
    assert gens and all(g.v == 2 for g in gens)
    # Size-tiered: generations grow geometrically, so there are few of them.
    assert len(gens) <= 2 * math.log2(30_000 / 700) + 3, [g.count for g in gens]
    want = {}
    for j in range(3):
        for i, k in enumerate(ks[j::3]):
            want.setdefault(k, set()).add(b"v%d" % i)
    want[ks[1]].add(b"v0")
    for k in ks[::37] + [ks[1]]:
        assert set(reader.lookup(k)) == want[k]
        assert len(reader.lookup(k)) == len(want[k])  # no duplicates
    assert reader.lookup(b"\x00" * 16) == [] and reader.lookup(b"\xff" * 16) == []
    n = sum(len(v) for v in want.values())
    # The duplicate waits in a level-0 file: one entry once merged (count and items agree meanwhile).
    assert reader.count() == len(list(reader.items())) in (n, n + 1)
    assert set(reader.items()) == {(k, v) for k, vs in want.items() for v in vs}
    # A forced merge leaves one generation with every entry; lookups still right.
    reader.consolidate(force=True)
    reader2 = Table(b, "records/x/", "r2")
    assert reader2.count() == n and len(reader2._active_gens) == 1
    for k in ks[::101]:
        assert set(reader2.lookup(k)) == want[k]


_keys = st.binary(min_size=16, max_size=16) | st.sampled_from([b"\0" * 16, b"\x01" + b"\0" * 15, b"\xff" * 16])


_vals = st.binary(max_size=40) | st.sampled_from([b"", b"x", b"same value"])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(files=st.lists(st.lists(st.tuples(_keys, _vals), max_size=40), max_size=6), nb=st.sampled_from([1, 2, 4]))
def test_a_merge_by_columns_keeps_each_pair_once_in_key_order(files, nb):
    """Merges handle entries as columns (issue 14: a million tuples cost seconds). They must keep
    exactly what ``dict.fromkeys`` and a stable sort by key kept: each (key, value) once, where it
    first appears, values of one key in the order they came."""
    from casmon.store.codec import FRAME_HEADER, decode_frame, read_header
    from casmon.store.table.format import Columns, TableFile, _encode_v2, encode_table_file

    tables = [TableFile(f"t{i}", encode_table_file(f)) for i, f in enumerate(files)]
    flat = [kv for tf in tables for kv in tf.items()]
    expected = sorted(dict.fromkeys(flat), key=lambda kv: kv[0])
    cols = Columns.of_tables(tables).sorted_unique()
    assert cols.entries() == expected
    bucket_files, binary, meta = _encode_v2(cols, nb)
    back = []
    for data in bucket_files:
        off = 0
        while off < len(data):
            frame_len = FRAME_HEADER + read_header(data, "b", off).stored_len
            back.extend(TableFile("b", decode_frame(data[off : off + frame_len], "b")[1]).items())
            off += frame_len
    assert back == expected
    assert _encode_v2(expected, nb) == (bucket_files, binary, meta)  # the same bytes as from tuples
    assert _encode_v2(list(dict.fromkeys(flat)), nb) == (bucket_files, binary, meta)  # unsorted: sorted there


def test_lookups_in_one_thread_and_refreshes_in_another_never_collide(tmp_path):
    """A background flush refreshes a table while the caller's thread looks blocks up. The kill
    campaign on 3.13 caught "OrderedDict mutated during iteration": a cached block moved to the
    end of the block cache (a lookup) while the refresh walked the cache. Forced here with a tiny
    switch interval, so the threads change places inside either loop."""
    import threading

    from casmon.store import reliance

    s = casmon.open(tmp_path / "s", autoflush=None)
    keys = [casmon.fingerprint(("k", i)) for i in range(3_000)]
    for i, k in enumerate(keys):
        s.append("cache", {"i": i}, key=k)
    s.flush()
    t = s.table("cache")
    t.consolidate(force=True)
    t.refresh()
    assert any(g.v == 2 for g in t._active_gens)
    for k in keys:
        t.lookup(k)  # every block in the block cache
    errors, stop = [], threading.Event()

    def looker():
        try:
            while not stop.is_set():
                for k in keys[::7]:
                    assert t.lookup(k)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        th = threading.Thread(target=looker)
        th.start()
        try:
            for _ in range(300):
                t.refresh()
        except Exception as e:  # noqa: BLE001
            errors.append(e)
        stop.set()
        th.join()
    finally:
        sys.setswitchinterval(old)
    assert not errors, errors


def test_a_flush_beside_puts_survives_thread_switches_inside_snapshots(tmp_path):
    """``list(d.items())`` is one C call, but a garbage collection inside it runs gc callbacks and
    finalizers, which are Python code: another thread can run there and add to ``d``, and the copy
    fails with "dictionary changed size during iteration". A 1M-entry build with a gc callback
    installed (as profilers and memory tools do) made every background flush fail this way in
    its check of the waiting values. Forced here: thousands of values waiting, a collection every
    few allocations, each switching threads, while the caller's thread puts more."""
    import gc
    import threading

    s = casmon.open(tmp_path / "s", autoflush=None)
    first = [s.put(("v", i)) for i in range(6_000)]
    errors, stop = [], threading.Event()

    def checker():  # the step of a flush that copies the waiting values
        while not stop.is_set():
            try:
                reliance.check_pending_values(s)
            except Exception as e:  # noqa: BLE001
                errors.append(e)
                return

    def switch(phase, info):
        time.sleep(0)  # let the other thread run inside whatever collected

    old, interval = gc.get_threshold(), sys.getswitchinterval()
    gc.callbacks.append(switch)
    gc.set_threshold(5)
    sys.setswitchinterval(1e-6)
    try:
        th = threading.Thread(target=checker)
        th.start()
        more = [s.put(("w", i)) for i in range(1_000)]
        stop.set()
        th.join()
    finally:
        gc.callbacks.remove(switch)
        gc.set_threshold(*old)
        sys.setswitchinterval(interval)
    assert not errors, errors
    s.flush()
    fresh = casmon.open(tmp_path / "s")
    assert fresh.get(first[-1]) == ("v", 5_999) and fresh.get(more[-1]) == ("w", 999)


def test_merge_keeps_every_entry_and_bounds_files(tmp_path):
    b = open_backend(tmp_path / "s")
    t = Table(b, "records/x/", "w1")
    ks = random_keys(30_000)
    for i, k in enumerate(ks):
        t.add(k, str(i).encode())
        if i % 1000 == 999:
            t.write_l0(t.take_pending())
            t.consolidate()
    assert t.l0_count < L0_MERGE
    files = b.list("records/x/")
    assert len(files) < 30
    reader = Table(b, "records/x/", "w2")
    assert reader.count() == 30_000
    assert sorted(int(v) for _, v in reader.items()) == list(range(30_000))
    for i in (0, 12_345, 29_999):
        assert reader.lookup(ks[i]) == [str(i).encode()]
    assert reader.lookup(os.urandom(16)) == []


def test_reader_sees_new_writes_on_miss(tmp_path, monkeypatch):
    import time

    import casmon.store.table.table

    monkeypatch.setattr(casmon.store.table.table, "MISS_REFRESH_INTERVAL", 0.2)
    b = open_backend(tmp_path / "s")
    reader = Table(b, "r/", "w2")
    assert reader.lookup(b"k" * 16) == []
    w = Table(b, "r/", "w1")
    w.add(b"k" * 16, b"v")
    w.write_l0(w.take_pending())
    assert reader.lookup(b"k" * 16) == []  # listed a moment ago: misses do not list again yet
    time.sleep(0.25)
    assert reader.lookup(b"k" * 16) == [b"v"]


def test_concurrent_merges_lose_nothing(tmp_path):
    b = open_backend(tmp_path / "s")
    w = Table(b, "r/", "w1")
    ks = random_keys(20 * 100)
    for i, k in enumerate(ks):
        w.add(k, b"%d" % i)
        if i % 100 == 99:
            w.write_l0(w.take_pending())
    a, c = Table(b, "r/", "ma"), Table(b, "r/", "mc")
    a.refresh()
    c.refresh()
    # Both read the same level-0 files, then both merge: overlapping generations.
    ga = a.consolidate()
    real_refresh = c.refresh
    c.refresh = lambda: None  # c does not see a's merge: it merges the same files again
    gc_ = c.consolidate()
    c.refresh = real_refresh
    assert ga and gc_ and ga != gc_
    reader = Table(b, "r/", "rd")
    vals = [v for _, v in reader.items()]
    assert sorted(vals) == sorted(b"%d" % i for i in range(2000))
    assert reader.lookup(ks[7]) == [b"7"]
    reader.consolidate(force=True)
    assert sorted(v for _, v in Table(b, "r/", "z").items()) == sorted(b"%d" % i for i in range(2000))


@pytest.fixture
def points(tmp_path):
    d = tmp_path / "points"
    d.mkdir()
    yield d
    faultpoints.configure(None)


def write_l0s(t: Table, first: int, files: int, per_file: int) -> list[bytes]:
    """``files`` level-0 files of ``per_file`` entries each; entry values are their numbers."""
    keys = []
    for f in range(files):
        for j in range(per_file):
            n = first + f * per_file + j
            k = n.to_bytes(4, "big") * 4
            t.add(k, b"%d" % n)
            keys.append(k)
        t.write_l0(t.take_pending())
    return keys


def paused_merge(points, point: str, table: Table, **kw):
    """Start ``table.consolidate(**kw)`` in a thread and wait until it stops at ``point``."""
    faultpoints.configure(f"{point}@1=pause:{points}")
    out = {}
    th = threading.Thread(target=lambda: out.setdefault("gid", table.consolidate(**kw)))
    th.start()
    reached = points / f"{point}.reached"
    for _ in range(6000):
        if reached.exists() or not th.is_alive():
            break
        th.join(0.01)
    assert reached.exists(), "the merge did not reach the fault point"

    def resume():
        (points / f"{point}.go").write_text("")
        th.join(60)
        assert not th.is_alive()
        faultpoints.configure(None)
        return out["gid"]

    return resume


def assert_exact(b, prefix: str, expected: set[int]):
    reader = Table(b, prefix, "reader")
    vals = [int(v) for _, v in reader.items()]
    dup = [v for v, c in Counter(vals).items() if c > 1]
    assert not dup, f"{len(dup)} entries read twice, e.g. {dup[:5]}"
    assert set(vals) == expected
    assert reader.count() == len(expected)
    for n in sorted(expected)[:: max(1, len(expected) // 7)]:
        assert reader.lookup(n.to_bytes(4, "big") * 4) == [b"%d" % n]


def test_racing_merges_then_a_third_merge_count_each_entry_once(tmp_path, points):
    """The case of issue 11: A merges files 1-16 (paused before its manifest); B merges 1-40 and
    deletes them; A's manifest appears. A later merge folds A's small generation with new files:
    its covers no longer name files 1-16, yet B holds them too."""
    b = open_backend(tmp_path / "s")
    w = Table(b, "r/", "w")
    write_l0s(w, 0, 16, 10)  # entries 0..159, files 1..16
    a = Table(b, "r/", "ma")
    resume = paused_merge(points, "merge.after_buckets", a)
    write_l0s(w, 160, 24, 100)  # files 17..40, entries 160..2559
    gb = Table(b, "r/", "mb").consolidate()
    assert gb
    ga = resume()
    assert ga and ga != gb
    expected = set(range(2560))
    assert_exact(b, "r/", expected)
    write_l0s(w, 2560, 16, 10)  # files 41..56
    assert Table(b, "r/", "mc").consolidate()
    expected |= set(range(2560, 2720))
    assert_exact(b, "r/", expected)
    # A fourth writer appends and merges again: still exact, and the overlap is gone for good.
    write_l0s(w, 2720, 16, 10)
    Table(b, "r/", "md").consolidate(force=True)
    expected |= set(range(2720, 2880))
    assert_exact(b, "r/", expected)
    assert len(b.list("r/gens/")) == 1


def test_partial_overlap_is_read_once(tmp_path, points):
    """A forced merge takes an old generation and files 1-16 (paused); a normal merge takes files
    1-20 but not the large generation. The two generations overlap partly; a third merge folds the
    small one. Readers count every entry once at every step."""
    b = open_backend(tmp_path / "s")
    w = Table(b, "r/", "w")
    write_l0s(w, 0, 20, 100)  # 2,000 entries in files 1..20
    Table(b, "r/", "m0").consolidate(force=True)  # G0: files 1..20
    write_l0s(w, 2000, 16, 5)  # files 21..36, 80 entries
    a = Table(b, "r/", "ma")
    resume = paused_merge(points, "merge.after_buckets", a, force=True)  # G0 + files 21..36
    write_l0s(w, 2080, 4, 5)  # files 37..40
    gb = Table(b, "r/", "mb").consolidate()  # files 21..40; G0 is too large to take along
    ga = resume()
    assert ga and gb
    expected = set(range(2100))
    assert_exact(b, "r/", expected)
    write_l0s(w, 2100, 16, 5)
    Table(b, "r/", "mc").consolidate()
    expected |= set(range(2100, 2180))
    assert_exact(b, "r/", expected)


def test_level0_files_inside_a_generation_are_ignored(tmp_path, points):
    """A merge killed (here: paused) after its manifest, before deleting what it merged: readers
    do not read the merged level-0 files twice, and the next merge deletes them."""
    b = open_backend(tmp_path / "s")
    w = Table(b, "r/", "w")
    write_l0s(w, 0, 16, 10)
    a = Table(b, "r/", "ma")
    resume = paused_merge(points, "merge.after_manifest", a)
    try:
        assert len(b.list("r/l0/")) == 16 and len(b.list("r/gens/")) == 1
        assert_exact(b, "r/", set(range(160)))
    finally:
        resume()
    assert_exact(b, "r/", set(range(160)))


def test_store_stats_count_records_exactly(tmp_path, points):
    s = casmon.open(tmp_path / "s", autoflush=None)
    for i in range(16):
        for j in range(20):
            s.append("cache", {"i": i, "j": j})
        s.table("cache").flush()
    loc = tmp_path / "s"
    a = casmon.open(loc, autoflush=None).table("cache")
    resume = paused_merge(points, "merge.after_buckets", a)
    for i in range(16, 40):
        for j in range(20):
            s.append("cache", {"i": i, "j": j})
        s.table("cache").flush()
    casmon.open(loc, autoflush=None).table("cache").consolidate()
    resume()
    for i in range(40, 56):
        s.append("cache", {"i": i})
        s.table("cache").flush()
    casmon.open(loc, autoflush=None).table("cache").consolidate()
    fresh = casmon.open(loc, autoflush=None)
    assert fresh.stats()["records"]["cache"] == 40 * 20 + 16
    assert sum(1 for _ in fresh.records("cache")) == 40 * 20 + 16


def test_lookups_beside_a_thread_that_writes_and_merges_never_miss(tmp_path):
    """Three threads look up keys already written while a fourth writes level-0 files and merges them,
    switches forced everywhere (a tiny switch interval, a gc callback that yields). Two defects showed
    as misses: a lookup read the generations, the level-0 files and the waiting entries at different
    moments (a merge moved entries from one to another in between), and a refresh that listed the
    folder before the writer's newest level-0 file dropped that file from memory until the next
    refresh. Each now holds: the view is taken in one step, and a refresh keeps this writer's level-0
    files written after its listing unless a listed generation holds them."""
    import gc

    b = open_backend(tmp_path / "t")
    t = Table(b, "r/", "w1")
    rng = random.Random(1)
    known: dict[bytes, bytes] = {}
    lock = threading.Lock()
    stop = time.monotonic() + 3.0
    errors: list[str] = []

    def writer():
        i = 0
        try:
            while time.monotonic() < stop:
                ks = [rng.randbytes(16) for _ in range(300)]
                for k in ks:
                    t.add(k, str(i).encode())
                    i += 1
                t.write_l0(t.take_pending())
                with lock:
                    for j, k in enumerate(ks):
                        known[k] = str(i - 300 + j).encode()
                if rng.random() < 0.5:
                    t.consolidate(min_l0=1, force=rng.random() < 0.3)
        except BaseException as e:  # noqa: BLE001
            errors.append(repr(e))

    def reader(seed):
        r = random.Random(seed)
        try:
            while time.monotonic() < stop and not errors:
                with lock:
                    if not known:
                        continue
                    k = r.choice(list(known))
                    v = known[k]
                got = t.lookup(k)
                if got != [v]:
                    errors.append(f"lookup {k.hex()} -> {got}, want {v}")
                    return
                if r.random() < 0.05:
                    t.refresh()
        except BaseException as e:  # noqa: BLE001
            errors.append(repr(e))

    def switch(phase, info):
        time.sleep(0)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    gc.callbacks.append(switch)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            threads = [threading.Thread(target=writer)] + [threading.Thread(target=reader, args=(s,)) for s in range(3)]
            for th in threads:
                th.start()
            for th in threads:
                th.join()
    finally:
        gc.callbacks.remove(switch)
        sys.setswitchinterval(interval)
    assert not errors, errors[:3]
    assert len(known) > 1000


def test_items_beyond_lists_again_where_a_generation_it_reads_is_merged_away_meanwhile(tmp_path):
    """A reader lists the table, then a writer merges a listed generation into a new one and deletes it before the
    reader reads it: the reader lists again and answers every entry, never the table without that generation's
    (the lineage index, made from this answer, would name the generation and lack its entries)."""
    b = open_backend(tmp_path / "s")
    ks = random_keys(3000)
    w = Table(b, "records/x/", "w0")
    fill(w, ks[:2000], 20)
    w.consolidate()
    r = Table(b, "records/x/", "r")
    r.refresh()
    assert r._active_gens
    read = r._gen_entries
    merged = []

    def merge_first(g, tolerant):
        if not merged:
            merged.append(g.id)
            fill(w, ks[2000:], 20)
            w.consolidate()
            assert not b.exists("records/x/gens/" + g.id)  # merged away and deleted
        return read(g, tolerant)

    r._gen_entries = merge_first
    files, _pending, names = r.items_beyond(())
    assert merged and merged[0] not in names
    assert {k for k, _v in files} >= set(ks[:2000])
