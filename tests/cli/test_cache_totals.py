"""Totals count a stored value once: two functions that return the same value share its one stored copy, and
``casmon cache``, ``cache NAME``, ``gc --max-size`` (its plan, its dry-run text, its JSON) and the UI's cache
page say so -- "shared" where entries share a value, never the value once per entry."""

import json

import numpy as np
import pytest

import casmon
from casmon.view.text import size
from tests.support.cli import cli

pytestmark = pytest.mark.filterwarnings("ignore:casmon.record. not a git repository")

SHARED = np.zeros(500_000)  # 3.8 MiB, compresses to almost nothing: the store is far smaller than the totals
OWN = np.arange(125_000, dtype=float)  # 0.95 MiB


def shared_store(path, order=("first", "own", "second")):
    """``first`` and ``second`` return one value (stored once); ``own`` a value of its own; called in ``order``,
    so the least recently used comes first."""
    s = casmon.open(path)

    @casmon.cache(store=s)
    def first(x):
        return SHARED.copy()

    @casmon.cache(store=s)
    def second(x):
        return SHARED.copy()

    @casmon.cache(store=s)
    def own(x):
        return OWN.copy()

    fns = {"first": first, "second": second, "own": own}
    for name in order:
        fns[name](0)
        s.flush()
    s.close()
    return str(path)


def names(stdout: str) -> str:
    return " ".join(stdout.split())


def test_cache_lists_a_shared_value_once_in_its_total_and_marks_it_shared(tmp_path):
    st = shared_store(tmp_path / "s")
    out = names(cli("cache", "--store", st).stdout)
    assert f"results in all: {size(SHARED.nbytes + OWN.nbytes)}" in out, out
    assert f"{size(SHARED.nbytes)} of it shared between functions" in out and "each stored value counted once" in out
    assert out.count(f"{size(SHARED.nbytes)} ({size(SHARED.nbytes)} shared)") == 2  # first's row and second's
    one = names(cli("cache", "--store", st, "first").stdout)
    assert f"{size(SHARED.nbytes)} ({size(SHARED.nbytes)} shared) of results" in one, one


def test_entries_of_one_function_holding_one_value_count_it_once(tmp_path):
    s = casmon.open(tmp_path / "s")

    @casmon.cache(store=s)
    def same(x):
        return SHARED.copy()

    same(1), same(2), same(3)
    s.close()
    out = names(cli("cache", "--store", str(tmp_path / "s")).stdout)
    assert f"results in all: {size(SHARED.nbytes)}" in out and "shared" not in out, out


def _gc(st, *args):
    return json.loads(cli("gc", "--store", st, "--now", "--json", *args).stdout)


def test_max_size_evicts_no_entry_whose_value_a_newer_entry_keeps(tmp_path):
    """first (oldest) and second (newest) share a value; own is between. Dropping first would free nothing:
    the limit is met by dropping own alone, and the bytes said are own's."""
    st = shared_store(tmp_path / "s")
    limit = str(SHARED.nbytes + OWN.nbytes // 2)
    dry = _gc(st, "--dry-run", "--max-size", limit)
    assert (dry["evicted_entries"], dry["evicted_bytes"]) == (1, OWN.nbytes), dry
    real = _gc(st, "--max-size", limit)
    assert (real["evicted_entries"], real["evicted_bytes"]) == (1, OWN.nbytes)
    left = names(cli("cache", "--store", st).stdout)
    assert "first" in left and "second" in left and ".own" not in left, left


def test_max_size_counts_a_shared_value_once_in_what_it_frees(tmp_path):
    st = shared_store(tmp_path / "s")
    text = names(cli("gc", "--store", st, "--now", "--dry-run", "--max-size", "100K").stdout)
    assert f"would drop 3 cache entries ({size(SHARED.nbytes + OWN.nbytes)} of results)" in text, text
    assert text.count(f"1 entry ({size(SHARED.nbytes)}, {size(SHARED.nbytes)} of it shared with another function") == 2
    real = _gc(st, "--max-size", "100K")
    assert (real["evicted_entries"], real["evicted_bytes"]) == (3, SHARED.nbytes + OWN.nbytes)
    assert "no cached functions" in cli("cache", "--store", st).stdout


def test_a_cleared_entry_whose_value_another_keeps_frees_nothing_and_says_so(tmp_path):
    st = shared_store(tmp_path / "s")
    cli("cache", "clear", "first", "--store", st)
    text = names(cli("gc", "--store", st, "--now", "--dry-run").stdout)
    assert "would drop 1 cache entry (0 B of results)" in text, text
    assert "first: 1 entry (frees nothing: a kept entry, a run or a call log holds the same result)" in text
    assert _gc(st)["evicted_bytes"] == 0
    assert "second" in names(cli("cache", "--store", st).stdout)
    assert "store is sound" in cli("verify", "--store", st).stdout  # the shared value survived the gc


def test_cache_info_counts_a_value_its_entries_share_once(tmp_path):
    s = casmon.open(tmp_path / "s")

    @casmon.cache(store=s)
    def same(x):
        return SHARED.copy()

    same(1), same(2)
    assert same.cache_info()[2:] == (2, SHARED.nbytes)  # two entries, one stored value
    s.close()


def test_stats_labels_the_gc_reserve_in_the_stored_bytes(tmp_path):
    from casmon.store.reserve import RESERVE_BYTES

    st = shared_store(tmp_path / "s")
    js = json.loads(cli("stats", "--store", st, "--json").stdout)
    assert js["reserve_bytes"] == RESERVE_BYTES and js["stored_bytes"] > RESERVE_BYTES
    out = names(cli("stats", "--store", st).stdout)
    assert f"{size(RESERVE_BYTES)} of it the gc reserve, room for gc on a full disk" in out, out
    s = casmon.open(st, read_only=True)
    assert "of it the gc reserve" in repr(s.stats())
    s.close()


def test_duplicates_that_hold_the_newest_records_value_free_nothing(tmp_path):
    """Three threads miss one key at once and compute it alike: three records, one stored value. gc drops two
    duplicate records and says they free nothing; a function whose threads compute differently frees theirs."""
    import threading

    st = str(tmp_path / "s")
    s = casmon.open(st)

    @casmon.cache(store=s, ignore=["gate"], wait=False)
    def alike(x, kind, gate):
        gate.wait()  # all three have missed before any stores
        return SHARED.copy() if kind == "same" else np.random.default_rng().random(1000)

    for kind, key in (("same", 1), ("other", 2)):
        gate = threading.Barrier(3, timeout=300)
        threads = [threading.Thread(target=alike, args=(key, kind, gate)) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    s.close()
    dry = _gc(st, "--dry-run")
    assert (dry["duplicate_entries"], dry["duplicate_bytes"]) == (4, 2 * 8000), dry
    text = names(cli("gc", "--store", st, "--now", "--dry-run").stdout)
    assert f"would drop 4 duplicate cache entries ({size(2 * 8000)} of results;" in text, text
    real = _gc(st)
    assert (real["duplicate_entries"], real["duplicate_bytes"]) == (4, 2 * 8000)


def test_a_functions_entries_list_totals_a_shared_value_once(tmp_path):
    s = casmon.open(tmp_path / "s")

    @casmon.cache(store=s)
    def same(x):
        return SHARED.copy()

    same(1), same(2)
    shown = repr(same.entries())
    assert shown.startswith(f"2 cache entries, {size(SHARED.nbytes)}, each stored value once:"), shown
    assert f"{size(SHARED.nbytes)}, each stored value once" in same.entries()._repr_html_()
    s.close()
