"""A class holding a registry of many of its instances: the first call walks the class once, a hit
does not fingerprint the registry again, and a change to the registry still misses.

A value too large for the pickle comparison (``smallpickle.PICKLE_CHECK_LIMIT``, lowered here so a
small registry exceeds it) is checked at each hit by a hash of its pickle, streamed: C speed, never
the whole pickle in memory. Counts, not times: how many values the fingerprinter fed.
"""

import importlib
import sys

import pytest

import casmon
from tests.support import deadline
from casmon.keys import codeversion as cv
from casmon.keys import fingerprint as fpm
from casmon.keys import smallpickle

DEADLINE = 300.0

SOURCE = '''
class K:
    all = []

    def __init__(self, i):
        self.i = i
        self.cls = K
        K.all.append(self)

    def m(self):
        return self.i


for i in range({n}):
    K(i)


def f(x):
    return x.m() + len(K.all)
'''


def within(fn, *args, **kwargs):
    return deadline.within(DEADLINE, fn, *args, **kwargs)


def check_registry(n, tmp_path, monkeypatch):
    name = f"registry_{n}_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(SOURCE.format(n=n))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(sys.modules, name, None)  # the test's end removes the module it imports
    del sys.modules[name]
    mod = importlib.import_module(name)
    counts = {"feed": 0, "walk": 0}
    feed, walk = fpm.Fingerprinter.feed, cv.VersionTracker._walk

    def counting_feed(self, *a, **k):
        counts["feed"] += 1
        return feed(self, *a, **k)

    def counting_walk(self, *a, **k):
        counts["walk"] += 1
        return walk(self, *a, **k)

    monkeypatch.setattr(fpm.Fingerprinter, "feed", counting_feed)
    monkeypatch.setattr(cv.VersionTracker, "_walk", counting_walk)
    f = casmon.cache(mod.f, store=str(tmp_path / "s"))
    arg = mod.K.all[5]
    assert within(f, arg) == 5 + n
    assert counts["walk"] <= 2  # f and K, each once: an instance never starts a walk
    assert counts["feed"] < 200 * n  # each instance fed a bounded number of times
    before = counts["feed"]
    assert within(f, arg) == 5 + n
    assert f.__casmon_cache__.hits == 1
    assert counts["feed"] - before < 100, "a hit fingerprinted the registry again"
    mod.K(n)  # the registry grows: f reads its length
    assert within(f, arg) == 5 + n + 1
    assert f.__casmon_cache__.misses == 2
    mod.K.all[0].i = -1  # an instance in it changes
    mod.K.m.__code__ = (lambda self: self.i * 2).__code__
    assert within(f, arg) == 10 + n + 1
    assert f.__casmon_cache__.misses == 3


@pytest.mark.filterwarnings("ignore::casmon.caching.CacheWarning")
def test_a_hit_over_a_wide_registry_does_not_fingerprint_it_again(tmp_path, monkeypatch):
    monkeypatch.setattr(smallpickle, "PICKLE_CHECK_LIMIT", 1024)
    check_registry(300, tmp_path, monkeypatch)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::casmon.caching.CacheWarning")
def test_a_registry_of_ten_thousand_instances_stays_cheap(tmp_path, monkeypatch):
    check_registry(10_000, tmp_path, monkeypatch)


@pytest.mark.filterwarnings("ignore::casmon.caching.CacheWarning")
def test_an_edit_deep_inside_a_large_global_misses(tmp_path, monkeypatch):
    # Past the pickle comparison's limit the check is a hash of the pickle: an edit anywhere still shows.
    monkeypatch.setattr(smallpickle, "PICKLE_CHECK_LIMIT", 1024)
    name = f"large_global_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(
        'ROWS = {"rows": [{"v": i} for i in range(2000)]}\n\n\ndef f(x):\n    return ROWS["rows"][x]["v"]\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(sys.modules, name, None)  # the test's end removes the module it imports
    del sys.modules[name]
    mod = importlib.import_module(name)
    assert smallpickle.small_pickle(mod.ROWS)[:1] == b"#"
    f = casmon.cache(mod.f, store=str(tmp_path / "s"))
    assert within(f, 5) == 5
    assert within(f, 5) == 5
    mod.ROWS["rows"][1999]["v"] = -1  # not a row f reads now, but one it could
    assert within(f, 5) == 5
    assert (f.__casmon_cache__.misses, f.__casmon_cache__.hits) == (2, 1)
    mod.ROWS["rows"][5]["v"] = 7
    assert within(f, 5) == 7
