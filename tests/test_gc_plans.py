"""What `casmon gc --dry-run` shows is what `casmon gc` then does, for every mix of cleared,
recomputed and duplicated cache entries."""

import json

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
