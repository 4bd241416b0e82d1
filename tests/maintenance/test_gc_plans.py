"""What `casmon gc --dry-run` shows is what `casmon gc` then does, for every mix of cleared,
recomputed and duplicated cache entries."""

import json
import math

import pytest

import casmon
from tests.support.cli import cli, cached_store, tree


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


REPORT = ("evicted_entries", "evicted_bytes", "deleted_objects", "deleted_bytes", "repacked_packs", "deleted_packs",
          "unreachable", "condemned", "waiting", "live_values")


@pytest.mark.filterwarnings("ignore:casmon.record. not a git repository")
@pytest.mark.parametrize("limits", [["--max-size", "700K"], ["--older-than", "0s"], ["--max-size", "1M", "--older-than", "30d"]])
def test_gc_dry_run_with_eviction_equals_the_real_run(tmp_path, limits):
    st = tmp_path / "s"
    cached_store(st)
    before = tree(st)
    dry = json.loads(cli("gc", "--store", str(st), "--now", "--dry-run", "--json", *limits).stdout)
    assert tree(st) == before, "a dry run changes nothing"
    assert dry["evicted_entries"] > 0 and dry["deleted_objects"] > 0 and dry["deleted_bytes"] > 0
    real = json.loads(cli("gc", "--store", str(st), "--now", "--json", *limits).stdout)
    assert {k: dry[k] for k in REPORT} == {k: real[k] for k in REPORT}
    assert "store is sound" in cli("verify", "--store", str(st)).stdout


@pytest.mark.filterwarnings("ignore:casmon.record. not a git repository")
def test_gc_dry_run_text_lists_the_eviction_and_the_condemned(tmp_path):
    st = tmp_path / "s"
    cached_store(st)
    out = cli("gc", "--store", str(st), "--dry-run", "--max-size", "700K").stdout
    assert "would drop" in out and "tests.support.cli" in out or "big" in out
    dry = json.loads(cli("gc", "--store", str(st), "--dry-run", "--json", "--max-size", "700K").stdout)
    real = json.loads(cli("gc", "--store", str(st), "--json", "--max-size", "700K").stdout)
    # with the grace period the real run condemns what the eviction made unreachable; the preview says how many
    assert real["condemned"] == dry["condemned"] > 0 and real["deleted_objects"] == dry["deleted_objects"] == 0


@pytest.mark.filterwarnings("ignore:casmon.record. not a git repository")
def test_cache_clear_then_gc_frees_the_space_as_the_message_says(tmp_path):
    st = tmp_path / "s"
    cached_store(st)
    out = cli("cache", "clear", "big", "--store", str(st)).stdout
    assert "gc --now" in " ".join(out.split()) and "grace" in out
    rep = json.loads(cli("gc", "--now", "--json", "--store", str(st)).stdout)
    assert rep["evicted_entries"] == 6 and rep["deleted_bytes"] >= 6 * 300_000


@pytest.mark.filterwarnings("ignore:casmon.record. not a git repository")
def test_gc_now_and_grace_conflict_and_help_texts(tmp_path):
    st = tmp_path / "s"
    cached_store(st)
    r = cli("gc", "--now", "--grace", "5", "--store", str(st), check=False)
    assert r.returncode == 1 and "--now" in r.stderr and "--grace" in r.stderr
    for cmd in ("gc", "runs", "diff"):
        h = " ".join(cli(cmd, "--help").stdout.split())
        assert "--json" in h and "JSON" in h.split("--json", 1)[1][:80], cmd
    assert "CASMON_STORE" in cli("stats", "--help").stdout


@pytest.mark.parametrize("value", [math.nan, math.inf, 1e308, -1.0])
def test_gc_grace_refuses_nan_inf_absurd_and_negative(tmp_path, value):
    cached_store(tmp_path / "s")
    s = casmon.open(tmp_path / "s")
    with pytest.raises(ValueError, match="gc grace must be a finite number of seconds"):
        s.gc(grace=value, dry_run=True)
    s.close()
