"""The warm hit path (casmon/caching/hot.py): calls with small immutable arguments that this process answered
before are answered from memory, and never when the full path would answer otherwise."""

from __future__ import annotations

import math

import pytest

import casmon


@pytest.fixture
def store(tmp_path):
    s = casmon.open(tmp_path / "s", autoflush=None)
    yield s
    s.close()


def _counting(store, fn, **opts):
    calls = []

    def inner(*a, **k):
        calls.append((a, k))
        return fn(*a, **k)

    inner.__name__ = inner.__qualname__ = fn.__name__
    inner.__module__ = __name__
    import inspect

    inner.__signature__ = inspect.signature(fn)
    return casmon.cache(inner, store=store, **opts), calls


def _warm(f, *args, **kwargs):
    """Call three times: the first computes, the second hits the store, the third is a warm hit."""
    return [f(*args, **kwargs) for _ in range(3)]


def _sign(x):
    return (type(x).__name__, math.copysign(1.0, x) if isinstance(x, float) else x)


def test_arguments_that_compare_equal_but_key_differently_never_share_a_warm_hit(store):
    f, calls = _counting(store, _sign)
    for x in (0.0, -0.0, 1, 1.0, True, float("nan")):
        _warm(f, x)
    assert [a for a, _ in calls] == [(0.0,), (-0.0,), (1,), (1.0,), (True,), (calls[-1][0][0],)]
    assert f(-0.0) == ("float", -1.0) and f(0.0) == ("float", 1.0) and f(True) == ("bool", True)
    assert f(float("nan")) == ("float", 1.0) and len(calls) == 6  # every NaN is one value, as keys count them


def test_a_warm_hit_returns_a_fresh_copy_of_a_mutable_result(store):
    f, calls = _counting(store, lambda n: {"n": n, "items": list(range(n))})
    a, b, c = _warm(f, 3)
    c["items"].append("mutated by the caller")
    assert f(3) == {"n": 3, "items": [0, 1, 2]} and len(calls) == 1
    assert f(3) is not f(3)


def test_an_immutable_result_is_returned_as_is(store):
    f, calls = _counting(store, lambda a, b="x": (a, b, 2.5))
    assert _warm(f, 1) == [(1, "x", 2.5)] * 3
    assert f(1) is f(1) and len(calls) == 1


def test_a_clear_makes_the_next_call_compute(store):
    f, calls = _counting(store, lambda a: a * 2)
    _warm(f, 21)
    f.cache_clear()
    assert f(21) == 42 and len(calls) == 2


def test_refresh_replaces_what_warm_hits_return(store):
    box = {"v": 1}

    def read(a):
        return (a, box["v"])

    f, calls = _counting(store, read, version="pinned")  # the global is not tracked: a stale result is on purpose
    _warm(f, 1)
    box["v"] = 2
    assert f(1) == (1, 1)
    assert f.refresh(1) == (1, 2)
    assert f(1) == (1, 2) and f(1) == (1, 2)


FACTOR = 2


def _times_factor(a):
    return a * FACTOR


@pytest.mark.filterwarnings("ignore:casmon. the code of")
def test_a_new_code_version_is_not_answered_by_an_old_warm_hit(store):
    global FACTOR
    f = casmon.cache(_times_factor, store=store)
    assert _warm(f, 5) == [10] * 3
    FACTOR = 3
    try:
        assert f(5) == 15 and f(5) == 15
    finally:
        FACTOR = 2
    assert f(5) == 10


@pytest.mark.filterwarnings("ignore:casmon. the code of")
def test_a_mutable_default_keeps_every_call_on_the_full_path(store):
    seen = []

    def total(a, extra=seen):
        return a + sum(extra)

    f, calls = _counting(store, total)
    assert _warm(f, 1) == [1] * 3
    seen.append(10)  # the default's content is part of the key
    assert f(1) == 11 and len(calls) == 2


def test_keyword_and_positional_calls_of_one_key_share_the_entry(store):
    f, calls = _counting(store, lambda a, b=2: a + b)
    assert _warm(f, 1) + _warm(f, a=1) + _warm(f, 1, b=2) + _warm(f, b=2, a=1) == [3] * 12
    assert len(calls) == 1


def test_warm_hits_count_as_hits_and_are_recorded_as_used(store):
    f, calls = _counting(store, lambda a: -a)
    _warm(f, 7)
    for _ in range(10):
        f(7)
    info = f.cache_info()
    assert (info.hits, info.misses) == (12, 1)
    store.flush()
    used = [r for _k, r in store.records("cacheuse")]
    assert sum(e[1] for r in used for e in r["hits"].values()) == 12


def test_a_store_that_cannot_be_read_while_warm_hits_look_for_clears_costs_no_result(store, monkeypatch):
    """Warm hits re-read the clears once a second; when that read fails, the call still returns its result."""
    from casmon.caching import memoize
    from casmon.errors import StoreError

    f, calls = _counting(store, lambda a: a + 1)
    _warm(f, 1)

    def unreachable(*a, **k):
        raise StoreError("the store is away")

    monkeypatch.setattr(store, "lookup", unreachable)
    monkeypatch.setattr(memoize, "CLEAR_CHECK_S", 0.0)
    with pytest.warns(casmon.CacheWarning, match="cannot be read"):
        assert [f(1) for _ in range(3)] == [2, 2, 2]


def test_threads_hitting_more_calls_than_are_remembered_all_get_their_own_results(store, monkeypatch):
    import threading

    from casmon.caching import hot

    monkeypatch.setattr(hot, "MAX_CALLS", 16)  # the table is full and forgets all the time
    f, calls = _counting(store, lambda a, tag="t": {"a": a, "tag": tag})
    for a in range(64):
        f(a)
    wrong: list = []

    def work(seed):
        for i in range(1500):
            a = (i * 7 + seed) % 64
            if f(a) != {"a": a, "tag": "t"}:
                wrong.append(a)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong and len(calls) == 64


def test_hits_on_a_new_store_are_recorded_in_it_after_an_old_one_is_gone(tmp_path):
    """Hit counts are kept per store object; a store opened after another was closed and freed may get the same
    id from Python: it has its own counts, so its hits are written to it, not lost with the old one."""
    from casmon.caching import usage

    old = casmon.open(tmp_path / "old", autoflush=None)
    new = casmon.open(tmp_path / "new", autoflush=None)
    usage._usage_by_store[id(new)] = usage.Usage(old)  # what a freed store at the same id leaves behind
    f, _calls = _counting(new, lambda a: a)
    _warm(f, 1)
    new.flush()
    assert sum(e[1] for _k, r in new.records("cacheuse") for e in r["hits"].values()) == 2
