"""The warm hit path (casmon/caching/hot.py), under races and changes, answers exactly what the full path would: after the store it read is
gone, when a result cannot be rebuilt, when the code or the entry changes while a hit is being read, and it keeps
no more in memory than the calls it can still answer."""

from __future__ import annotations

import gc
import os
import shutil
import threading
import tracemalloc

import pytest

import casmon
from casmon.caching import memoize


def _counting(fn, calls, **opts):
    def inner(*a, **k):
        calls.append(a)
        return fn(*a, **k)

    inner.__name__ = inner.__qualname__ = fn.__name__
    inner.__module__ = __name__
    import inspect

    inner.__signature__ = inspect.signature(fn)
    return casmon.cache(inner, **opts)


def test_a_warm_hit_is_not_answered_from_a_store_that_no_longer_holds_the_entry(tmp_path):
    """The store is closed and its folder deleted: the next call reopens an empty store there, misses and stores
    its result again (as the full path does), instead of a hit on an entry no store holds."""
    path = tmp_path / "s"
    calls: list = []
    f = _counting(lambda a: [a], calls, store=str(path))
    assert [f(1) for _ in range(3)] == [[1]] * 3 and len(calls) == 1
    f.__casmon_cache__.store.close()
    shutil.rmtree(path)
    assert f(1) == [1]
    assert len(calls) == 2  # computed again: the store it reopened holds nothing
    assert f.is_cached(1)  # and the result is stored in it


class Rebuilt:
    """A result whose unpickling fails while $CASMON_TEST_REBUILD_FAILS is set (a class that cannot be rebuilt
    in this state of the process)."""

    def __init__(self, v):
        self.v = v

    def __setstate__(self, state):
        if os.environ.get("CASMON_TEST_REBUILD_FAILS"):
            raise ValueError("cannot be rebuilt now")
        self.__dict__.update(state)


def _make_rebuilt(a):
    return Rebuilt(a)


def test_a_result_that_cannot_be_rebuilt_on_a_warm_hit_is_recomputed_with_a_warning(tmp_path, monkeypatch):
    """As on the full path (lookup_result: "a class's __setstate__ cannot rebuild it here: compute"), never an
    exception out of the call."""
    store = casmon.open(tmp_path / "s", autoflush=None)
    try:
        calls: list = []
        f = _counting(_make_rebuilt, calls, store=store)
        assert [f(1).v for _ in range(3)] == [1, 1, 1] and len(calls) == 1
        monkeypatch.setenv("CASMON_TEST_REBUILD_FAILS", "1")
        with pytest.warns(casmon.CacheWarning, match="recomputing"):
            r = f(1)
        assert isinstance(r, Rebuilt) and r.v == 1 and len(calls) == 2
    finally:
        store.close()


FACTOR = 2


def _times_factor(a):
    return [a * FACTOR]


@pytest.mark.filterwarnings("ignore:casmon. the code of")
def test_a_hit_read_under_the_old_code_version_never_answers_calls_of_the_new_one(tmp_path, monkeypatch):
    """A thread reads a hit of the old code while another thread changes a global the function reads and calls it:
    the first thread's hit must not become the warm answer of the new version."""
    store = casmon.open(tmp_path / "s", autoflush=None)
    try:
        f = casmon.cache(_times_factor, store=store)
        assert f(5) == [10]
        real_get, fired = store.get, []

        def get(d, *a, **k):
            v = real_get(d, *a, **k)
            if not fired:  # the code changes while this thread reads the old result
                fired.append(1)

                def other():
                    global FACTOR
                    FACTOR = 3
                    assert f(5) == [15]

                t = threading.Thread(target=other)
                t.start()
                t.join()
            return v

        monkeypatch.setattr(store, "get", get)
        assert f(5) == [10]  # read before the change: the old result is fair for this call
        monkeypatch.setattr(store, "get", real_get)
        assert f(5) == [15] and f(5) == [15]
    finally:
        globals()["FACTOR"] = 2
        store.close()


def test_a_hit_that_ends_after_a_refresh_never_makes_warm_hits_return_the_replaced_result(tmp_path):
    """A hit that read the old result finishes after another thread's refresh stored a new one: the warm answer
    is the entry's result (what f.lookup returns), not the one the late hit read."""
    store = casmon.open(tmp_path / "s", autoflush=None)
    box = {"v": 1}

    def read(a):
        return [a, box["v"]]

    f = casmon.cache(read, store=store, version="pinned")
    fired: list = []

    def observer(_store, _fn, _key, _d, hit):
        if hit and not fired:  # this thread has its hit in hand; another thread refreshes the entry now
            fired.append(1)

            def other():
                box["v"] = 2
                assert f.refresh(1) == [1, 2]

            t = threading.Thread(target=other)
            t.start()
            t.join()

    try:
        f(1)
        memoize.observers.append(observer)
        try:
            assert f(1) == [1, 1]
        finally:
            memoize.observers.remove(observer)
        assert f.lookup(1) == [1, 2]
        assert f(1) == [1, 2] and f(1) == [1, 2]
    finally:
        store.close()


def test_a_hit_read_before_a_refresh_does_not_make_the_replaced_result_the_entry_again(tmp_path, monkeypatch):
    """The full path (memoize.lookup_result remembering the digest it read): a refresh made while a hit was
    being read stays the entry, in memory as in the store."""
    store = casmon.open(tmp_path / "s", autoflush=None)
    box = {"v": 1}

    def read(a):
        return [a, box["v"]]

    f = casmon.cache(read, store=store, version="pinned")
    try:
        f(1)
        real_get, fired = store.get, []

        def get(d, *a, **k):
            v = real_get(d, *a, **k)
            if not fired:
                fired.append(1)

                def other():
                    box["v"] = 2
                    assert f.refresh(1) == [1, 2]

                t = threading.Thread(target=other)
                t.start()
                t.join()
            return v

        monkeypatch.setattr(store, "get", get)
        assert f(1) == [1, 1]
        monkeypatch.setattr(store, "get", real_get)
        assert f.lookup(1) == [1, 2] and f(1) == [1, 2]
    finally:
        store.close()


def _rows(a):
    return list(range(a, a + 4000))  # about 20 KB pickled


def _kept_by_warm_hits(snapshot) -> int:
    """Bytes still allocated by casmon/caching/hot.py (the warm hit table's results and keys)."""
    flt = tracemalloc.Filter(True, os.path.join("*", "casmon", "caching", "hot.py"))
    return sum(s.size for s in snapshot.filter_traces([flt]).statistics("filename"))


def test_warm_hits_keep_no_more_results_than_the_function_remembers(tmp_path):
    """With memory_entries=8 only 8 calls can be answered warm; the results of the others are not kept."""
    store = casmon.open(tmp_path / "s", autoflush=None)
    f = casmon.cache(_rows, store=store, memory_entries=8)
    try:
        for a in range(300):
            f(a)
        tracemalloc.start()
        try:
            for a in range(300):
                f(a)
                f(a)
            gc.collect()
            kept = _kept_by_warm_hits(tracemalloc.take_snapshot())
        finally:
            tracemalloc.stop()
        assert kept < 50 * 20_000, f"{kept} bytes kept for warm hits of 300 calls, of which 8 can be answered"
    finally:
        store.close()


def test_a_clear_releases_the_results_kept_for_warm_hits(tmp_path):
    store = casmon.open(tmp_path / "s", autoflush=None)
    f = casmon.cache(_rows, store=store)
    try:
        for a in range(100):
            f(a)
        tracemalloc.start()
        try:
            for a in range(100):
                f(a)
            f.cache_clear()
            gc.collect()
            kept = _kept_by_warm_hits(tracemalloc.take_snapshot())
        finally:
            tracemalloc.stop()
        assert kept < 10 * 20_000, f"{kept} bytes still kept for warm hits after cache_clear()"
    finally:
        store.close()
