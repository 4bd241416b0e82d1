"""Eviction drops what its plan saw, nothing written after it: a plan is made, shown, then carried out, and a
writer may store an entry of a planned key in between (a refresh, a call computed again after a clear)."""

import numpy as np

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
