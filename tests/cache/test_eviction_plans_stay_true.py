"""Eviction drops what its plan saw, nothing written after it: a plan is made, shown, then carried out, and a
writer may store an entry of a planned key in between (a refresh, a call computed again after a clear)."""

import numpy as np
import pytest

import casmon
from casmon.caching import evict, eviction_plan


def test_an_entry_stored_again_after_the_eviction_plan_is_kept(tmp_path):
    s = casmon.open(tmp_path / "s")
    calls = []

    @casmon.cache(store=s)
    def f(x):
        calls.append(x)
        return np.full(1000, float(len(calls)))

    f(1)
    s.flush()
    plan = eviction_plan(s, max_size=0)
    assert len(plan) == 1
    fresh = f.refresh(1)  # acknowledged: stored and flushed after the plan was made
    s.flush()
    assert evict(s, plan=plan) == (0, 0)  # the refreshed entry stays, and so does the value it holds
    assert f.is_cached(1)
    again = f(1)
    assert len(calls) == 2 and np.array_equal(again, fresh)
    s.close()


def test_an_entry_stored_again_after_the_plan_frees_nothing_its_value_still_needs(tmp_path):
    """g's entry and h's hold one value; the plan drops both, then h computes its entry again: the value
    stays, and the bytes said freed are only what really goes."""
    s = casmon.open(tmp_path / "s")
    shared, own = np.zeros(5000), np.arange(3000.0)

    @casmon.cache(store=s)
    def g(x):
        return shared.copy()

    @casmon.cache(store=s)
    def h(x):
        return shared.copy()

    @casmon.cache(store=s)
    def k(x):
        return own.copy()

    g(0), h(0), k(0)
    s.flush()
    plan = eviction_plan(s, max_size=0)
    assert len(plan) == 3
    h.refresh(0)
    s.flush()
    assert evict(s, plan=plan) == (2, own.nbytes)
    assert h.is_cached(0) and not g.is_cached(0) and not k.is_cached(0)
    s.close()


def test_a_value_another_function_stores_after_the_plan_is_not_said_freed(tmp_path):
    s = casmon.open(tmp_path / "s")
    value = np.arange(5000.0)

    @casmon.cache(store=s)
    def g(x):
        return value.copy()

    @casmon.cache(store=s)
    def later(x):
        return value.copy()

    g(0)
    s.flush()
    plan = eviction_plan(s, max_size=0)
    later(0)  # a new key, holding the planned value
    s.flush()
    assert evict(s, plan=plan) == (1, 0)
    assert later.is_cached(0) and not g.is_cached(0)
    s.close()


def _gc(st, *args):
    import json

    from tests.support.cli import cli

    return json.loads(cli("gc", "--store", st, "--now", "--json", *args).stdout)


def test_max_size_never_drops_an_entry_whose_value_a_run_keeps_and_says_only_what_gc_deletes(tmp_path):
    """A run's info holds the value an old entry holds: dropping that entry frees nothing (the run keeps the
    value), so it is not dropped to make room, and the bytes said freed are what gc deletes."""
    st = str(tmp_path / "s")
    s = casmon.open(st)
    kept_by_run, other = np.arange(40_000.0), np.arange(30_000.0) + 0.5
    old, newer = _two_functions(s, kept_by_run, other)
    old(0)
    s.flush()
    newer(0)
    with casmon.record(store=s) as run:
        run.info["weights"] = kept_by_run.copy()
    s.close()
    plan = _gc(st, "--dry-run", "--max-size", str(other.nbytes))  # the limit counts what evicting can free
    assert (plan["evicted_entries"], plan["evicted_bytes"]) == (0, 0), plan
    old_gone = _gc(st, "--dry-run", "--older-than", "0s")  # unused entries all go, and old's frees nothing
    assert (old_gone["evicted_entries"], old_gone["evicted_bytes"]) == (2, other.nbytes), old_gone
    real = _gc(st, "--max-size", "0")
    assert (real["evicted_entries"], real["evicted_bytes"]) == (1, other.nbytes), real
    assert real["deleted_objects"] >= 1
    s = casmon.open(st)
    old, newer = _two_functions(s, kept_by_run, other)
    assert old.is_cached(0) and not newer.is_cached(0)
    s.close()


def _two_functions(s, a, b):
    @casmon.cache(store=s)
    def old(x):
        return a.copy()

    @casmon.cache(store=s)
    def newer(x):
        return b.copy()

    return old, newer


WRITER = """
import sys, numpy as np, casmon
s = casmon.open(sys.argv[1])

@casmon.cache(store=s, version="1")  # one version: the checker reads the writer's entries
def f(k):
    return np.full(4000, float(k % 5))  # keys share values: five values for twenty keys

for i in range(int(sys.argv[2])):
    (f.refresh if i % 3 == 0 else f)(i % 20)
    s.flush()
s.close()
print("done", flush=True)
"""


# The same function (__main__.f) on the store after the race: every entry it keeps is a hit with its own value.
CHECK = """
import sys, warnings, numpy as np, casmon
warnings.simplefilter("error")
s = casmon.open(sys.argv[1])

@casmon.cache(store=s, version="1")  # one version: the checker reads the writer's entries
def f(k):
    raise AssertionError(f"entry {k} is listed but not a hit")

kept = [k for k in range(20) if f.is_cached(k)]
for k in kept:
    assert np.array_equal(f(k), np.full(4000, float(k % 5))), k
print("kept", kept)
"""


@pytest.mark.slow
def test_gc_max_size_racing_a_writer_leaves_every_entry_it_keeps_loadable(tmp_path, min_grace):
    """A writer computes and refreshes entries whose values they share while gc --max-size runs again and again:
    every entry left loads its own value (no entry outlives its value), and verify finds the store sound."""
    import os
    import subprocess
    import sys
    import time

    from tests.support.cli import cli

    min_grace(0.2)
    st = str(tmp_path / "s")
    casmon.open(st).close()
    writer = subprocess.Popen([sys.executable, "-c", WRITER, st, "300"], env=dict(os.environ), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 600
    try:
        runs = 0
        while writer.poll() is None or runs < 3:
            assert time.monotonic() < deadline, "the writer never ended"
            cli("gc", "--store", st, "--max-size", str(2 * 4000 * 8), "--grace", "0.2")
            runs += 1
        out, err = writer.communicate(timeout=60)
        assert writer.returncode == 0 and "done" in out, err
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()
    cli("gc", "--store", st, "--grace", "0.2")
    assert "store is sound" in cli("verify", "--store", st).stdout
    checked = subprocess.run([sys.executable, "-c", CHECK, st], env=dict(os.environ), capture_output=True, text=True,
                             timeout=300)
    assert checked.returncode == 0 and checked.stdout.startswith("kept "), checked.stdout + checked.stderr
    print(f"{runs} gc runs raced the writer; {checked.stdout.strip()}")
