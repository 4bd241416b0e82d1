"""What `casmon gc --dry-run` shows is what `casmon gc` then does, for every mix of cleared,
recomputed and duplicated cache entries."""

import json

import pytest

import casmon
from tests.test_cli_defects import cli


def _gc(store_path, *extra):
    r = cli("gc", "--store", str(store_path), "--json", "--now", *extra)
    return json.loads(r.stdout)


def test_an_entry_recomputed_after_a_clear_is_kept_by_preview_and_by_gc(tmp_path):
    path = tmp_path / "s"
    store = casmon.open(path, autoflush=None)
    calls = []

    @casmon.cache(store=store)
    def f(x):
        calls.append(x)
        return x * 10

    f(1), f(2)
    store.flush()
    f.cache_clear()
    f(1)  # computed again after the clear: a valid entry beside the cleared one
    assert calls == [1, 2, 1]
    store.flush()
    store.close()
    preview = _gc(path, "--dry-run")
    real = _gc(path)
    for k in ("evicted_entries", "evicted_bytes", "duplicate_entries", "duplicate_bytes"):
        assert preview[k] == real[k], (k, preview, real)
    assert real["evicted_entries"] == 1  # f(2): cleared and never computed again
    store = casmon.open(path, autoflush=None)
    again = casmon.cache(store=store)(f.__wrapped__)
    calls.clear()
    assert again(1) == 10 and calls == []  # the recomputed entry survived gc
    assert again(2) == 20 and calls == [2]


def test_gc_merges_the_small_packs_a_flush_per_call_leaves(tmp_path):
    """A pool's worker flushes after every call: a pack per call. gc merges them, losing nothing."""
    path = tmp_path / "s"
    store = casmon.open(path, autoflush=None)
    calls = []

    @casmon.cache(store=store)
    def g(i):
        calls.append(i)
        return {"i": i, "pad": "x" * (2000 + i)}  # small, compressible results

    for i in range(40):
        g(i)
        store.flush()  # one pack each
    store.close()
    packs = lambda: sorted(p.name for p in (path / "packs").iterdir())  # noqa: E731
    before = packs()
    assert len(before) >= 40
    preview = _gc(path, "--dry-run")
    real = _gc(path)
    assert preview["repacked_packs"] == real["repacked_packs"] >= 40
    after = packs()
    assert len(after) <= 2 and not set(after) & set(before)
    store = casmon.open(path, autoflush=None)
    again = casmon.cache(store=store)(g.__wrapped__)
    calls.clear()
    assert [again(i)["i"] for i in range(40)] == list(range(40)) and calls == []
    assert store.verify().ok
    assert _gc(path)["repacked_packs"] == 0  # one merged pack is not merged again

