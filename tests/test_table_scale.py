"""Tables at scale: format-2 generations (blocks, block directory, bloom filter), size-tiered merges,
and stores written by the casmon before them (format 1)."""

import importlib
import json
import math
import os
import random
import subprocess
import sys
import warnings
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import casmon
from casmon.store.backend import open_backend
from casmon.errors import DamagedObjectError, StoreFormatError
from casmon.store.table import BLOCK_ENTRIES, StoreDamageWarning, Table, _hashes

ROOT = Path(__file__).resolve().parent.parent
#: The last commit whose tables were format 1 (whole buckets, no bloom filter).


def keys(n, seed=0):
    r = random.Random(seed)
    return [r.randbytes(16) for _ in range(n)]


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
    ks = keys(30_000)
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


def test_a_lookup_is_one_small_read(tmp_path):
    b = open_backend(tmp_path / "s")
    ks = keys(40_000, seed=1)
    t = Table(b, "records/x/", "w")
    for k in ks:
        t.add(k, b"x" * 40)
    t.flush()
    t.consolidate(force=True)
    reader = Table(b, "records/x/", "r")
    reader.refresh()
    (g,) = reader._active_gens
    assert g.v == 2 and g.blocks >= 40_000 // BLOCK_ENTRIES
    bucket_bytes = sum(len(b.get(k)) for k in b.list("records/x/buckets/"))
    firsts = {}
    for k in ks:
        firsts.setdefault(g.block_of(k), k)
    for k in list(firsts.values())[:50]:  # keys of distinct blocks (a block read stays in memory)
        before = b.requests
        assert reader.lookup(k) == [b"x" * 40]
        assert b.requests - before == 1  # one range read of one block ...
    blk = max(g.lens)
    assert blk < bucket_bytes / 100  # ... a small one
    # Absent keys: the bloom filter answers without reading (false positives aside, ~1%).
    before = b.requests
    absent = keys(500, seed=99)
    for k in absent:
        assert reader.lookup(k, refresh_on_miss=False) == []
    assert b.requests - before < 25


def test_a_bloom_false_positive_reads_a_block_and_finds_nothing(tmp_path):
    b = open_backend(tmp_path / "s")
    ks = keys(5000, seed=2)
    t = Table(b, "records/x/", "w")
    for k in ks:
        t.add(k, b"1")
    t.flush()
    t.consolidate(force=True)
    reader = Table(b, "records/x/", "r")
    reader.refresh()
    (g,) = reader._active_gens
    present = set(ks)
    r = random.Random(7)
    fp = None
    for _ in range(100_000):  # about 1% of absent keys pass the filter
        k = r.randbytes(16)
        if k not in present and g.may_hold(*_hashes(k)):
            fp = k
            break
    assert fp is not None
    before = b.requests
    assert reader.lookup(fp, refresh_on_miss=False) == []
    assert b.requests - before == 1 or g.lens[g.block_of(fp)] == 0
    assert all(g.may_hold(*_hashes(k)) for k in ks)  # never a false negative


def test_a_damaged_block_costs_only_its_own_entries(tmp_path):
    b = open_backend(tmp_path / "s")
    ks = keys(20_000, seed=3)
    t = Table(b, "records/x/", "w")
    for i, k in enumerate(ks):
        t.add(k, b"v%d" % i)
    t.flush()
    t.consolidate(force=True)
    reader = Table(b, "records/x/", "r")
    reader.refresh()
    (g,) = reader._active_gens
    target = ks[123]
    blk = g.block_of(target)
    fkey = f"records/x/buckets/{g.id}/{blk >> g.shift:04x}"
    path = tmp_path / "s" / fkey
    data = bytearray(path.read_bytes())
    data[g.starts[blk] + g.lens[blk] - 3] ^= 0xFF  # inside the block's payload
    path.write_bytes(bytes(data))
    in_block = [k for k in ks if g.block_of(k) == blk]
    other = [k for k in ks if g.block_of(k) != blk and g.block_of(k) >> g.shift == blk >> g.shift]
    with pytest.warns(StoreDamageWarning, match=fkey):
        assert reader.lookup(target) == []
    assert fkey in reader.damaged
    for k in other[:200]:  # the rest of the same file reads fine
        assert reader.lookup(k)
    with pytest.raises(DamagedObjectError):
        list(reader.items())
    assert sum(1 for _ in reader.items(strict=False)) == len(ks) - len(in_block)
    # verify sees it; the survey salvages every other block of the file; repair keeps them.
    sv = reader.survey()
    assert fkey in sv.damaged
    assert len(sv.entries()) == len(ks) - len(in_block)
    reader.rewrite(sv, sv.entries())
    fresh = Table(b, "records/x/", "r2")
    assert fresh.count() == len(ks) - len(in_block) and not fresh.damaged
    assert fresh.survey().ok
    assert fresh.lookup(other[0])


def test_a_crafted_manifest_is_damage_not_a_crash(tmp_path):
    from casmon.store.codec import KIND_TABLE, encode_frame, get_codec
    from casmon.store.table import parse_generation

    head = {"count": 1, "nbuckets": 1, "covers": [], "marks": {}, "contains": {}, "v": 2,
            "blocks": 2, "bloom_bits": 64, "bloom_k": 7}
    good = json.dumps(head).encode() + b"\0" + bytes(8) + bytes(8)
    g = parse_generation("g", "k", good)
    assert g.v == 2 and list(g.lens) == [0, 0]
    bad = [
        json.dumps(head).encode() + b"\0" + bytes(7),  # short directory
        json.dumps(dict(head, blocks=3)).encode() + b"\0" + bytes(12) + bytes(8),  # not a power of two
        json.dumps(dict(head, bloom_bits=0)).encode() + b"\0" + bytes(8),
        json.dumps(dict(head, v=3)).encode() + b"\0" + bytes(16),  # a future version
        json.dumps(dict(head, bloom_k=10**9)).encode() + b"\0" + bytes(16),
    ]
    for raw in bad:
        with pytest.raises(DamagedObjectError):
            parse_generation("g", "k", raw)
    # One in a store: skipped with a warning, the rest of the table readable.
    b = open_backend(tmp_path / "s")
    t = Table(b, "records/x/", "w")
    t.add(b"a" * 16, b"1")
    t.flush()
    _, frame = encode_frame(bad[0], KIND_TABLE, get_codec("zstd"))
    b.create("records/x/gens/0000000000000001-wg-000001", frame)
    r = Table(b, "records/x/", "r")
    with pytest.warns(StoreDamageWarning):
        assert r.lookup(b"a" * 16) == [b"1"]


# -- stores written by the casmon before format 2 ------------------------------------------
OLD_WRITER = r"""
import sys, casmon
sys.path.insert(0, sys.argv[3])
import workmod
store = casmon.open(sys.argv[1])
work = casmon.cache(store=store)(workmod.work)
for i in range(int(sys.argv[2])):
    work(i)
    if i % 3000 == 2999:
        store.flush()  # level-0 files, then format-1 generations as they accumulate
store.append("note", {"n": 1}, key=b"k" * 16)
store.close()
"""

# The cached function lives in a module file both processes import: its code version then comes from
# the same source on both sides (Python 3.13 keeps `python -c` source for inspect, older ones do not,
# so a function defined in `-c` code and one made by exec() would be two versions there).
WORKMOD = """
def work(i):
    return {"i": i, "sq": i * i}
"""


def run_old(old: Path, code: str, *args) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(old))
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True,
                          env=env, cwd=str(old), timeout=600)


def test_a_store_written_before_format_2_is_read_then_upgraded(tmp_path, old_casmon, monkeypatch):
    root = tmp_path / "store"
    n = 12_000
    (tmp_path / "workmod.py").write_text(WORKMOD)
    p = run_old(old_casmon, OLD_WRITER, root, n, tmp_path)
    assert p.returncode == 0, p.stderr
    assert json.loads((root / "casmon.json").read_text())["format"] == 1
    assert list((root / "records/cache/gens").iterdir())  # it has format-1 generations to read

    # Read by this casmon as it is: read-only opens change nothing.
    ro = casmon.open(root, read_only=True)
    assert ro.verify().ok
    assert ro.lookup("note", b"k" * 16) == [{"n": 1}]
    assert json.loads((root / "casmon.json").read_text())["format"] == 1

    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "workmod", raising=False)
    work_fn = importlib.import_module("workmod").work
    with warnings.catch_warnings():
        warnings.simplefilter("error", StoreDamageWarning)
        store = casmon.open(root)
        cached = casmon.cache(store=store)(work_fn)
        for i in random.Random(0).sample(range(n), 300):
            assert cached(i) == {"i": i, "sq": i * i}
        # Every one a hit: the old process's entries, found in format-1 generations and level-0 files.
        assert cached.cache_info().hits == 300 and cached.cache_info().misses == 0
        # More writing: merges write format-2 generations, and the marker says format 2 first.
        for i in range(n, n + 9_000):
            cached(i)
            if i % 3000 == 2999:
                store.flush()
        store.flush()
        t = store.table("cache")
        t.consolidate(force=True)
        t.refresh()
        assert all(g.v == 2 for g in t._active_gens)
        assert t.count() == n + 9_000
        store.close()
    assert json.loads((root / "casmon.json").read_text())["format"] == 2
    again = casmon.open(root)
    assert again.verify().ok
    assert again.lookup("note", b"k" * 16) == [{"n": 1}]
    assert len({k for k, _ in again.records("cache")}) >= n
    again.close()
    # The casmon before format 2 now refuses the store, saying to upgrade, instead of misreading it.
    p = run_old(old_casmon, "import sys, casmon; casmon.open(sys.argv[1])", root)
    assert p.returncode != 0 and "Upgrade casmon" in p.stderr, p.stderr
    with pytest.raises(StoreFormatError):  # and this one refuses a newer format than its own
        from casmon.maintenance.verify import marker_bytes

        (tmp_path / "newer").mkdir()
        (tmp_path / "newer/casmon.json").write_bytes(marker_bytes({"format": 99}))
        casmon.open(tmp_path / "newer")


def test_a_cache_hit_on_a_small_result_reads_one_block(tmp_path):
    """A small result travels in its cache entry: a hit reads the entry's block, not the index and a pack."""
    root = tmp_path / "s"
    store = casmon.open(root)

    def sq(i):
        return {"i": i, "sq": i * i}

    cached = casmon.cache(store=store)(sq)
    for i in range(3000):
        cached(i)
    store.flush()
    store.table("cache").consolidate(force=True)
    store.objects.index.consolidate(force=True)
    store.close()
    fresh = casmon.open(root)
    again = casmon.cache(store=fresh)(sq)
    assert again(0) == {"i": 0, "sq": 0}  # the first hit lists and loads the tables
    assert all("inline" in r for _, r in fresh.records("cache"))
    for i in random.Random(5).sample(range(1, 3000), 40):
        before = fresh.backend.requests
        assert again(i) == {"i": i, "sq": i * i}
        assert fresh.backend.requests - before <= 1  # one block of the cache table (none if read already)
    assert again.cache_info().hits == 41 and again.cache_info().misses == 0
    # A copy that does not hash to the result's digest is never used.
    d = fresh.put({"a": 1})
    assert not fresh.objects.prime(d, b'j{"a":2}')
    fresh.objects.clear_caches()
    assert fresh.get(d) == {"a": 1}
    fresh.close()


def test_a_damaged_pack_copy_of_a_small_result_is_not_used_its_inline_copy_is(tmp_path):
    s = casmon.open(tmp_path / "s", autoflush=None)
    calls = []

    def small(x):
        calls.append(x)
        return {"x": x}

    casmon.cache(store=s)(small)(1)
    s.flush()
    d = casmon.Digest(next(iter(s.records("cache")))[1]["result"])
    loc = s.objects.locate(d)
    pack = tmp_path / "s/packs" / loc.pack
    data = bytearray(pack.read_bytes())
    data[loc.offset + loc.length - 3] ^= 0xFF  # the result's own frame in the pack
    pack.write_bytes(bytes(data))
    s2 = casmon.open(tmp_path / "s", autoflush=None)
    with pytest.raises(DamagedObjectError):  # the pack's copy is damaged, and caught
        s2.get(d)
    s2.objects.clear_caches()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert casmon.cache(store=s2)(small)(1) == {"x": 1}  # the entry's copy, checked against the digest
    assert calls == [1]


@pytest.mark.parametrize("n", [10, 300])  # a block (checked with Python lists) and a larger file (numpy)
def test_a_crafted_table_file_is_refused(n):
    import numpy as np

    from casmon.store.table import TableFile, encode_table_file

    ents = [(i.to_bytes(2, "big") * 8, b"v%d" % i) for i in range(n)]
    good = encode_table_file(ents)
    assert [k for k, _ in TableFile("x", good).items()] == [k for k, _ in ents]
    swapped = bytearray(good)
    swapped[8:24], swapped[24:40] = good[24:40], good[8:24]
    off = 8 + 16 * n
    offs = np.frombuffer(good[off : off + 8 * (n + 1)], "<u8").copy()
    offs[3], offs[4] = offs[4], offs[3]
    backwards = good[:off] + offs.tobytes() + good[off + 8 * (n + 1) :]
    for bad, why in [(bytes(swapped), "not sorted"), (backwards, "offsets"), (good[:-1], "offsets")]:
        with pytest.raises(DamagedObjectError, match=why):
            TableFile("x", bad)


_keys = st.binary(min_size=16, max_size=16) | st.sampled_from([b"\0" * 16, b"\x01" + b"\0" * 15, b"\xff" * 16])
_vals = st.binary(max_size=40) | st.sampled_from([b"", b"x", b"same value"])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(files=st.lists(st.lists(st.tuples(_keys, _vals), max_size=40), max_size=6), nb=st.sampled_from([1, 2, 4]))
def test_a_merge_by_columns_keeps_each_pair_once_in_key_order(files, nb):
    """Merges handle entries as columns (issue 14: a million tuples cost seconds). They must keep
    exactly what ``dict.fromkeys`` and a stable sort by key kept: each (key, value) once, where it
    first appears, values of one key in the order they came."""
    from casmon.store.codec import FRAME_HEADER, decode_frame, read_header
    from casmon.store.table import Columns, TableFile, _encode_v2, encode_table_file

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
                s._check_pending_values()
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


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=5000) | st.builds(lambda b, n: b * n, st.binary(min_size=1, max_size=40), st.integers(1, 3000)))
def test_table_files_compress_to_the_bytes_numcodecs_lz4_writes(data):
    """Table files are compressed through the ``lz4`` package (1 ms to import, where numcodecs takes
    60-90 ms at the exit flush) and decoded by numcodecs: the bytes must be numcodecs' own, so any
    casmon, older ones included, reads them."""
    from numcodecs import lz4 as ncl

    from casmon.store.codec import _lz4_compress

    out = _lz4_compress()(memoryview(data))
    assert out == ncl.compress(data, 1)
    if data:  # numcodecs cannot decode its own empty frame; casmon compresses 64 bytes and more
        assert ncl.decompress(out) == data
