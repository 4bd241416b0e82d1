import os

import pytest

from casmon.store.backend import open_backend
from casmon.errors import DamagedObjectError
from casmon.store.table import L0_MERGE, Table, TableFile, encode_table_file


def keys(n, seed=0):
    import random

    r = random.Random(seed)
    return [r.randbytes(16) for _ in range(n)]


def test_table_file_round_trip_and_validation():
    entries = [(b"b" * 16, b"2"), (b"a" * 16, b"1"), (b"a" * 16, b"1b")]
    tf = TableFile("t", encode_table_file(entries))
    assert list(tf.items()) == [(b"a" * 16, b"1"), (b"a" * 16, b"1b"), (b"b" * 16, b"2")]
    assert tf.find(b"a" * 16) == [b"1", b"1b"]
    for bad in [b"", b"XXXX" + bytes(10), encode_table_file(entries)[:-1]]:
        with pytest.raises(DamagedObjectError):
            TableFile("bad", bad)


def test_merge_keeps_every_entry_and_bounds_files(tmp_path):
    b = open_backend(tmp_path / "s")
    t = Table(b, "records/x/", "w1")
    ks = keys(30_000)
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

    import casmon.store.table

    monkeypatch.setattr(casmon.store.table, "MISS_REFRESH_INTERVAL", 0.2)
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
    ks = keys(20 * 100)
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


def test_partial_files_are_ignored(tmp_path):
    b = open_backend(tmp_path / "s")
    t = Table(b, "r/", "w1")
    t.add(b"k" * 16, b"v")
    name = t.write_l0(t.take_pending())
    (tmp_path / "s" / "r" / "l0" / f"{name}.abc.partial").write_bytes(b"junk")
    assert Table(b, "r/", "w2").lookup(b"k" * 16) == [b"v"]
