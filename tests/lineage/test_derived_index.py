"""The derived lineage index answers as the records do: built, read, extended by entries written after it, and
made again where it is stale, damaged, crafted or deleted; deleting it loses nothing."""

import os
import tempfile
import time

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import casmon
from casmon.caching import KIND
from casmon.keys.digest import Digest
from casmon.lineage import derived, stale, used_by
from casmon.lineage.index import Index
from casmon.store import metafile

FNS = [f"pipe.stage{i}" for i in range(4)]


def full_scan(store):
    """Every entry's newest record, read as the queries read them before the index: every record, checked."""
    out = {}
    for k, r in store.records(KIND, strict=False):
        derived.newest(out, k.hex(), r)
    return {k: {f: r[f] for f in derived.FIELDS if f in r and f != "key"} for k, r in out.items()}


def projected(entries):
    return {k: {f: r[f] for f in derived.FIELDS if f in r and f != "key"} for k, r in entries.items()}


def add_pipeline(store, rnd, t):
    prev = None
    for i, fn in enumerate(FNS[:rnd.randint(1, 4)]):
        key = Digest.from_raw(os.urandom(16))
        rec = {"fn": fn, "result": os.urandom(16).hex(), "time": t, "v": os.urandom(16).hex()[:32], "rf": os.urandom(16).hex()}
        if rnd.random() < 0.3:
            rec["expires"] = t + rnd.choice([-100.0, 1000.0])
        if rnd.random() < 0.3:
            rec["a"] = {"x": os.urandom(8).hex()}
        if prev is not None:
            rec["pc"] = {"x": prev[1]}
            if rnd.random() < 0.5:
                rec["up"] = {"x": [prev[0]]}
        store.append(KIND, rec, key=key)
        prev = (bytes(key).hex(), rec["rf"])
    return prev[0]


def answers(store):
    ix = Index(store)
    return (sorted(stale(ix).nodes), sorted((k, sorted(used_by(k, ix).nodes)) for k in sorted(ix.entries)[:5]))


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.tuples(st.integers(1, 6), st.booleans(), st.booleans()), min_size=1, max_size=5),
       st.randoms(use_true_random=False))
def test_the_index_answers_as_the_records_do_as_entries_are_written_around_it(steps, rnd):
    with tempfile.TemporaryDirectory() as d:
        s = casmon.open(os.path.join(d, "s"), create=True)
        t = time.time() - 1000
        for n, flush, query in steps:
            for _ in range(n):
                t += 1
                add_pipeline(s, rnd, t)
            if flush:
                s.flush()
            if query:  # the index is made or extended here; entries written after it are seen
                assert projected(derived.read_entries(s)) == full_scan(s)
        assert projected(derived.read_entries(s)) == full_scan(s)
        with_index = answers(s)
        s.backend.set(derived.INDEX_KEY, b"")  # as if there were none: made again from the records
        assert answers(s) == with_index
        s.close()


@pytest.fixture
def built(tmp_path):
    import random

    s = casmon.open(str(tmp_path / "s"), create=True)
    rnd = random.Random(1)
    for i in range(30):
        add_pipeline(s, rnd, time.time() - 100 + i)
    s.flush()
    derived.read_entries(s)
    assert s.backend.get(derived.INDEX_KEY)
    yield s
    s.close()


def test_every_flipped_bit_of_the_index_is_caught_and_the_answer_is_the_records(built):
    data = bytes(built.backend.get(derived.INDEX_KEY))
    want = full_scan(built)
    step = max(1, len(data) * 8 // 400)
    for bit in range(0, len(data) * 8, step):
        bad = bytearray(data)
        bad[bit // 8] ^= 1 << (bit % 8)
        built.backend.set(derived.INDEX_KEY, bytes(bad))
        assert projected(derived.read_entries(built, write=False)) == want, bit
    built.backend.set(derived.INDEX_KEY, data[: len(data) // 2])  # cut short
    assert projected(derived.read_entries(built)) == want
    assert bytes(built.backend.get(derived.INDEX_KEY)) == data  # and made again


def _swap_keys(c):
    c["key"] = c["key"][::-1].copy()


def _set(col, value, at=0):
    def craft(c):
        if not len(c[col]):
            pytest.skip(f"the store has no {col} items")
        c[col] = c[col].copy()
        c[col][at] = value
    return craft


def _strings(value, which="_strings"):
    def craft(c):
        c[which] = value
    return craft


def _drop_last(col):
    def craft(c):
        c[col] = c[col][:-1].copy()
    return craft


CRAFTS = {"keys out of order": _swap_keys, "fn out of range": _set("fn", 10**6), "fn negative": _set("fn", -1),
          "version out of range": _set("v", -7), "label out of range": _set("label", 10**6),
          "time too far": _set("time", 1e300), "time nan": _set("time", float("nan")),
          "expires negative": _set("expires", -5.0), "flags": _set("has", 9),
          "pc offsets backwards": _set("pc_ptr", 10**6, 1), "up offsets past the end": _set("up_ptr", 10**6, -1),
          "up name out of range": _set("up_name", 10**6), "file digest out of range": _set("f_d", -1),
          "a value out of range": _set("a_val", 10**6), "a column cut short": _drop_last("fn"),
          "an item column cut short": _drop_last("up_key"), "strings not text": _strings([1, 2]),
          "strings not a list": _strings({"a": 1}), "digests not text": _strings([None], "_avals"),
          "digests fewer than named": _strings([], "_avals")}


@pytest.mark.parametrize("what", sorted(CRAFTS))
def test_a_crafted_index_with_a_valid_checksum_is_made_again_from_the_records(built, what):
    from casmon.lineage.columns import ITEMS, ROWS, Columns

    want = full_scan(built)
    sources, cols = derived._load(built)  # the files it names: their records are not read again beside it
    arrays = {c: getattr(cols, c) for c in {**ROWS, **ITEMS}}
    built.backend.set(derived.INDEX_KEY, derived.encode(Columns(dict(arrays), cols.strings, cols.avals), sources))
    assert derived._load(built) is not None  # made again as it was, it is used
    CRAFTS[what](arrays)
    strings = arrays.pop("_strings", cols.strings)
    crafted = Columns(arrays, strings, arrays.pop("_avals", cols.avals))
    crafted.n = cols.n
    built.backend.set(derived.INDEX_KEY, derived.encode(crafted, sources))
    assert derived._load(built) is None
    assert projected(derived.read_entries(built)) == want
    assert derived._load(built) is not None  # made again


def test_an_index_naming_files_no_longer_read_is_made_again(built):
    import random

    want_before = full_scan(built)
    data = bytes(built.backend.get(derived.INDEX_KEY))
    n = len(want_before)
    # a merge (or gc, or repair) rewrites the files the index names
    for i in range(20):
        add_pipeline(built, random.Random(i), time.time())
        built.flush()
    built.table(KIND).consolidate(force=True)
    assert projected(derived.read_entries(built)) == full_scan(built)
    assert len(full_scan(built)) > n
    assert bytes(built.backend.get(derived.INDEX_KEY)) != data


def test_deleting_the_index_loses_nothing_and_an_entry_written_after_it_is_seen(built, tmp_path):
    import random

    url = built.url
    want = full_scan(built)
    built.backend.set(derived.INDEX_KEY, b"")
    assert projected(derived.read_entries(built)) == want
    key = add_pipeline(built, random.Random(5), time.time())  # waiting, not flushed: read beside the index
    assert key in derived.read_entries(built)
    other = casmon.open(url)  # another process's view: the entry once flushed
    built.flush()
    assert key in derived.read_entries(other)
    other.close()


def test_gc_keeps_nothing_alive_through_the_index_and_a_collected_entry_is_gone_from_it(tmp_path):
    import numpy as np

    from casmon.caching import clear_function, evict
    from casmon.errors import MissingObjectError

    store = str(tmp_path / "s")

    @casmon.cache(store=store)
    def make(n):
        return np.arange(n, dtype=float) * 7

    @casmon.cache(store=store)
    def double(a):
        return a * 2

    a = make(500)
    double(a)
    s = make.__casmon_cache__.store
    s.flush()
    make_ref, double_key = make.ref(500), bytes(double.ref(a).key).hex()
    assert bytes(make_ref.key).hex() in derived.read_entries(s)  # the index is written, naming make's entry
    assert s.backend.get(derived.INDEX_KEY)
    clear_function(s, "make")
    evict(s)
    s.gc(grace=0)
    with pytest.raises(MissingObjectError):
        s.get(make_ref.digest)
    assert bytes(make_ref.key).hex() not in derived.read_entries(s)
    status = {n["id"]: n["status"] for n in casmon.lineage.lineage(double_key, s).to_dict()["nodes"]}
    assert status == {f"entry:{double_key}": "live", f"entry:{bytes(make_ref.key).hex()}": "missing"}


def test_a_query_leaves_the_garbage_collector_as_it_found_it_even_when_it_raises(built):
    import gc

    was = gc.isenabled()
    try:
        for enabled in (True, False):
            (gc.enable if enabled else gc.disable)()
            stale(built)
            with pytest.raises(LookupError):
                used_by("no.such.function", built)
            assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()


def test_a_read_only_store_answers_from_the_records_and_writes_no_index(built):
    import random

    want = full_scan(built)
    built.backend.set(derived.INDEX_KEY, b"")
    add_pipeline(built, random.Random(9), time.time())
    built.flush()
    ro = casmon.open(built.url, read_only=True)
    assert projected(derived.read_entries(ro)) == full_scan(built) != want
    ro_stale = sorted(stale(ro).nodes)
    ro.close()
    assert bytes(built.backend.get(derived.INDEX_KEY)) == b""  # the read-only store wrote nothing
    assert ro_stale == sorted(stale(built).nodes)
    assert bytes(built.backend.get(derived.INDEX_KEY)) != b""  # the writable store's query made it again


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_a_named_pipe_in_place_of_the_derived_files_is_read_as_nothing_not_waited_on(built):
    """A crafted store puts a named pipe where the index and the runs' links are kept: opening one for reading
    would wait for a writer forever. The query reads them as empty (damaged: made again from the records)."""
    import subprocess
    import sys
    import textwrap

    from tests.support.processes import ENV

    want = sorted(stale(casmon.open(built.url, read_only=True)).nodes)
    root = built.backend.local_root
    for key in (derived.INDEX_KEY, derived.LINKS_KEY):
        p = root / key
        p.parent.mkdir(parents=True, exist_ok=True)
        if p.exists():
            p.unlink()
        os.mkfifo(p)
    code = textwrap.dedent(f"""
        import casmon
        from casmon.lineage import stale
        print(sorted(stale(casmon.open({built.url!r}, read_only=True)).nodes))
    """)
    p = subprocess.run([sys.executable, "-c", code], env=ENV, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == str(want)


def test_a_query_killed_while_writing_the_index_leaves_the_next_query_right(built):
    """SIGKILL with the index's new copy written beside it, not yet in place: the next query answers as the
    records do (and makes the index)."""
    import random
    import subprocess
    import sys
    import textwrap

    from tests.support.processes import ENV

    built.backend.delete(derived.INDEX_KEY)
    add_pipeline(built, random.Random(3), time.time())
    built.flush()
    want = full_scan(built)
    code = textwrap.dedent(f"""
        import casmon
        from casmon.lineage import stale
        stale(casmon.open({built.url!r}))
    """)
    p = subprocess.run([sys.executable, "-c", code], env={**ENV, "CASMON_FAULTPOINTS": "local.partial_written=kill"},
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == -9, p.stderr
    assert built.backend.get(derived.INDEX_KEY) is None
    s = casmon.open(built.url)
    assert projected(derived.read_entries(s)) == want
    assert s.backend.get(derived.INDEX_KEY) is not None
    s.close()
