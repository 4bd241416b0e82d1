"""Cache truth: no wrong hits, no stale hits (issue 12), through ``@casmon.cache`` itself."""

import collections
import contextlib
import importlib
import json
import os
import pickle
import sqlite3
import threading
import textwrap
import time
import warnings

import numpy as np
import pytest

import casmon
from casmon.caching import CacheWarning, cache_entries
from tests.conftest import run_python
from tests.support.damage import damage_cached_result
from tests.support.sources import write_module


@pytest.fixture
def store(tmp_path):
    s = casmon.open(tmp_path / "s", autoflush=None)
    yield s
    s.close()


@contextlib.contextmanager
def no_cache_warnings():
    """A context that fails the test if casmon refuses or warns."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)
        yield


# -- wrong hits: different inputs must never share a key --------------------------------------------------
def test_bound_builtin_methods_count_their_object(store):
    calls = []

    @casmon.cache(store=store)
    def apply(fn, arg):
        calls.append(1)
        return fn(arg)

    d1, d2 = {"k": 1}, {"k": 2}
    assert (apply(d1.get, "k"), apply(d2.get, "k")) == (1, 2)
    assert apply({"k": 1}.get, "k") == 1 and len(calls) == 2, "an equal dict's method is a hit"

    @casmon.cache(store=store)
    def total(fn):
        return fn()

    assert (total(np.zeros(3).sum), total(np.ones(3).sum)) == (0.0, 3.0)

    @casmon.cache(store=store)
    def grow(extend):
        extend([0])
        return len(extend.__self__)

    assert (grow(collections.deque(range(10)).extend), grow(collections.deque(range(9)).extend)) == (11, 10)


def test_pandas_categoricals_and_index_freq(store):
    pd = pytest.importorskip("pandas")

    @casmon.cache(store=store)
    def codes(s):
        return s.cat.codes.tolist()

    a = pd.Series(pd.Categorical(["a", "b"], categories=["a", "b"]))
    b = pd.Series(pd.Categorical(["a", "b"], categories=["b", "a"]))
    assert codes(a) == [0, 1] and codes(b) == [1, 0]

    @casmon.cache(store=store)
    def dummies(s):
        return list(pd.get_dummies(s).columns)

    unused = pd.Series(pd.Categorical(["a"], categories=["a", "z"]))
    assert dummies(pd.Series(pd.Categorical(["a"]))) == ["a"]
    assert dummies(unused) == ["a", "z"]

    @casmon.cache(store=store)
    def is_ordered(s):
        return bool(s.cat.ordered)

    assert is_ordered(pd.Series(pd.Categorical(["a"], ordered=False))) is False
    assert is_ordered(pd.Series(pd.Categorical(["a"], ordered=True))) is True

    @casmon.cache(store=store)
    def freq(s):
        return str(s.index.freq)

    idx = pd.date_range("2024-01-01", periods=3, freq="D")
    assert freq(pd.Series([1, 2, 3], index=idx)) == "<Day>"
    assert freq(pd.Series([1, 2, 3], index=pd.DatetimeIndex(list(idx)))) == "None"


class Quantity(np.ndarray):
    """An ndarray subclass carrying a unit, the way units libraries do."""

    def __new__(cls, values, unit):
        obj = np.asarray(values, dtype=float).view(cls)
        obj.unit = unit
        return obj

    def __array_finalize__(self, obj):
        self.unit = getattr(obj, "unit", None)


def test_ndarray_subclass_attributes_count(store):
    @casmon.cache(store=store)
    def in_metres(q):
        return float(q.sum()) * (1000.0 if q.unit == "km" else 1.0)

    assert in_metres(Quantity([2.0], "m")) == 2.0
    assert in_metres(Quantity([2.0], "km")) == 2000.0
    assert in_metres(np.array([2.0]).view(Quantity)) == 2.0  # unit None: another key again

    @casmon.cache(store=store)
    def kind(a):
        return type(a).__name__

    assert kind(np.ones(2)) == "ndarray" and kind(Quantity([1, 1], "m")) == "Quantity"
    assert kind(np.rec.array([(1, 2.0)], dtype=[("a", "i4"), ("b", "f8")])) == "recarray"


def test_masked_arrays(store):
    calls = []

    @casmon.cache(store=store)
    def filled(a):
        calls.append(1)
        return np.ma.filled(a).tolist()

    with no_cache_warnings():
        assert filled(np.ma.array([1, 2, 3])) == [1, 2, 3]  # no mask: cached, no crash
        assert filled(np.ma.array([1, 2, 3])) == [1, 2, 3] and len(calls) == 1
        assert filled(np.ma.array([1, 2, 3], mask=[0, 1, 0], fill_value=9)) == [1, 9, 3]
        assert filled(np.ma.array([1, 2, 3], mask=[0, 1, 0], fill_value=7)) == [1, 7, 3]
        assert filled(np.ma.array([1, 2, 3], mask=[1, 0, 0], fill_value=7)) == [7, 2, 3]
    assert len(calls) == 4


def test_two_lambdas_on_one_line(store):
    inc, dbl = casmon.cache(store=store)(lambda x: x + 1), casmon.cache(store=store)(lambda x: x * 2)
    assert (inc(3), dbl(3)) == (4, 6)
    assert (inc(3), dbl(3)) == (4, 6)


def test_a_function_argument_counts_by_its_code(store):
    def square(x):
        return x * x

    @casmon.cache(store=store)
    def apply(fn, x):
        return fn(x)

    # Module-level helpers count by name and code: replacing the code in place changes the key.
    assert apply(_helper, 3) == 6
    old = _helper.__code__
    try:
        _helper.__code__ = _other.__code__
        assert apply(_helper, 3) == 9
    finally:
        _helper.__code__ = old
    assert apply(_helper, 3) == 6
    with pytest.warns(CacheWarning, match="'fn'"):
        assert apply(square, 3) == 9  # a local function has no name to count it by: uncached, one warning


def _helper(x):
    return x * 2


def _other(x):
    return x * x


class Doubler:
    def __init__(self, k):
        self.k = k

    def run(self, x):
        return self.k * x * 2


def test_a_user_object_counts_by_its_class_code(store):
    @casmon.cache(store=store)
    def use(obj, x):
        return obj.run(x)

    assert use(Doubler(1), 5) == 10
    old = Doubler.run
    try:
        Doubler.run = lambda self, x: self.k * x * 3
        assert use(Doubler(1), 5) == 15, "the class's method changed: a different key"
    finally:
        Doubler.run = old
    assert use(Doubler(1), 5) == 10


# -- stale hits: the version follows what the function reads ----------------------------------------------
PARAMS = {"lr": 1}
TABLE = np.arange(4)


def test_non_scalar_globals_edited_in_the_same_process(store):
    @casmon.cache(store=store)
    def scaled(x):
        return x * PARAMS["lr"] + int(TABLE.sum())

    assert scaled(10) == 16
    PARAMS["lr"] = 2
    try:
        with pytest.warns(CacheWarning, match="changed since its results were cached") as w:
            assert scaled(10) == 26
            TABLE[0] = 100
            assert scaled(10) == 126
        assert all(x.filename == __file__ for x in w), "the warning points at the caller's line"
    finally:
        PARAMS["lr"] = 1
        TABLE[0] = 0
    assert scaled(10) == 16
    assert scaled.cache_info().misses == 3, "back to the first content: the first entry is used again"


def test_closures_over_non_scalar_values(store):
    cfg = {"k": 1}
    w = np.ones(3)

    @casmon.cache(store=store)
    def f(x):
        return x * cfg["k"] + float(w.sum())

    assert f(1) == 4.0
    cfg["k"] = 5
    with pytest.warns(CacheWarning, match="changed"):
        assert f(1) == 8.0
        w[:] = 0
        assert f(1) == 5.0


def test_code_replaced_in_place_like_autoreload(store):
    def g(a, b):
        return a + b

    cg = casmon.cache(store=store)(g)
    assert cg(1, 2) == 3
    g.__code__ = (lambda a, b: a * b).__code__  # what IPython's %autoreload does
    with pytest.warns(CacheWarning, match="changed"):
        assert cg(1, 2) == 2
    assert cg(1, 2) == 2 and cg.cache_info().misses == 2


def test_a_function_that_changes_what_it_reads_while_it_runs_still_hits(store):
    log = []

    @casmon.cache(store=store)
    def f(x):
        log.append(x)  # its own side effect, not an edit
        return x + 1

    tracker = f.__casmon_cache__.tracker
    assert f(1) == 2 and f(1) == 2 and f(2) == 3 and f(2) == 3
    assert log == [1, 2]
    n = tracker.computations
    for _ in range(50):
        f(1)
    assert tracker.computations == n, "hits do not recompute the version"


def test_version_is_not_recomputed_on_hits(store):
    @casmon.cache(store=store)
    def f(x):
        return x * PARAMS["lr"]

    f(1)
    t = f.__casmon_cache__.tracker
    n = t.computations
    for i in range(100):
        f(1)
    assert t.computations == n and f.cache_info().hits == 100


LOCK = threading.Lock()
CONN = sqlite3.connect(":memory:", check_same_thread=False)


def test_a_global_that_cannot_be_hashed_is_named_once(store):
    @casmon.cache(store=store)
    def query(x):
        with LOCK:  # a lock holds no input: no warning for it
            return CONN.execute("select ? * 2", (x,)).fetchone()[0]

    with pytest.warns(CacheWarning, match=r"reads 'CONN' \(sqlite3.Connection\), which cannot be hashed") as w:
        assert query(2) == 4
    assert len([x for x in w if "LOCK" in str(x.message)]) == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)
        assert query(2) == 4 and query(3) == 6  # once per function
    assert query.cache_info().hits == 1


CONFIG_V1 = "THRESH = 1\nPARAMS = {'lr': 1}\n"
MAIN = '''
import sys, json, warnings
sys.path.insert(0, sys.argv[2])
import casmon
import config
from config import PARAMS

calls = []

@casmon.cache(store=sys.argv[1])
def scaled(x):
    calls.append(x)
    return x * config.THRESH

@casmon.cache(store=sys.argv[1])
def lr(x):
    calls.append(x)
    return x * PARAMS["lr"]

@casmon.cache(store=sys.argv[1])
def inside(x):
    import config as c
    calls.append(x)
    return x + c.THRESH

with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    r = [scaled(10), lr(10), inside(10)]
print(json.dumps({"result": r, "computed": len(calls)}))
'''


def test_module_attribute_and_non_scalar_constants_across_processes(tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    cfg = code / "config.py"
    write_module(cfg, CONFIG_V1)
    loc = str(tmp_path / "s")

    def run():
        return json.loads(run_python(MAIN, loc, str(code)).stdout)

    assert run() == {"result": [10, 10, 11], "computed": 3}
    assert run()["computed"] == 0
    write_module(cfg, CONFIG_V1.replace("THRESH = 1", "THRESH = 2"))
    assert run() == {"result": [20, 10, 12], "computed": 2}
    write_module(cfg, CONFIG_V1.replace("THRESH = 1", "THRESH = 2").replace("'lr': 1", "'lr': 3"))
    assert run() == {"result": [20, 30, 12], "computed": 1}


STALE_SOURCE = '''
import sys, json, importlib, pathlib, time, os
sys.path.insert(0, sys.argv[2])
import casmon
import helpers
f = casmon.cache(store=sys.argv[1])(helpers.compute)
first = f(3)
src = pathlib.Path(sys.argv[2], "helpers.py")
src.write_text(src.read_text().replace("x + 1", "x + 100"))   # edited, not reloaded: the old code still runs
os.utime(src, (time.time() + 5, time.time() + 5))
import linecache; linecache.checkcache()
print(json.dumps([first, f(4)]))
'''


def test_source_edited_but_not_reloaded_does_not_name_the_running_code(tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    write_module(code / "helpers.py", "def compute(x):\n    return x + 1\n")
    loc = str(tmp_path / "s")
    assert json.loads(run_python(STALE_SOURCE, loc, str(code)).stdout) == [4, 5]
    # A fresh process runs the edited code: it must not get the old code's results.
    out = run_python("import sys; sys.path.insert(0, sys.argv[2]); import casmon, helpers\n"
                     "f = casmon.cache(store=sys.argv[1])(helpers.compute)\nprint(f(4))", loc, str(code)).stdout
    assert out.strip() == "104"


# -- files by content -----------------------------------------------------------------------------------
def _old(path):
    t = time.time() - 3600
    os.utime(path, (t, t))


def test_files_count_by_content(store, tmp_path):
    calls = []

    @casmon.cache(store=store, files=["path"])
    def load(path):
        calls.append(path)
        with open(path) as fh:
            return fh.read().upper()

    p = tmp_path / "data.txt"
    p.write_text("abc")
    _old(p)
    assert load(str(p)) == "ABC"
    assert load(str(p)) == "ABC" and len(calls) == 1
    p.write_text("xyz")
    assert load(str(p)) == "XYZ" and len(calls) == 2, "edited file: recomputed"
    p.write_text("abc")
    _old(p)
    assert load(str(p)) == "ABC" and len(calls) == 2, "same content again: the first entry"
    assert load(p) == "ABC" and len(calls) == 3, "a Path is another value than a str"
    entry = load.ref(str(p)).entry
    assert entry["files"] == [["path", str(p), importlib.import_module('casmon.caching.files').file_digest(p).hex(), 3]]


def test_a_hit_on_an_unchanged_file_does_not_read_it(store, tmp_path, monkeypatch):
    cm = importlib.import_module("casmon.keys.filedigest")
    monkeypatch.setattr(cm, "_RACY_NS", 0)  # trust a stat taken just after the write (the 2 s guard is tested below)

    @casmon.cache(store=store, files=["path"])
    def size(path):
        return os.path.getsize(path)

    p = tmp_path / "big.bin"
    p.write_bytes(os.urandom(1 << 20))
    _old(p)
    size(str(p))
    n = cm.files_hashed
    for _ in range(20):
        assert size(str(p)) == 1 << 20
    assert cm.files_hashed == n, "hits stat the file, they do not hash it"
    # Same size, same mtime, other bytes: the ctime changed, so it is hashed again.
    st = os.stat(p)
    p.write_bytes(os.urandom(1 << 20))
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    size(str(p))
    assert cm.files_hashed == n + 1
    assert size.cache_info().misses == 2


def test_a_file_changed_moments_ago_is_hashed_again(store, tmp_path):
    cm = importlib.import_module("casmon.keys.filedigest")
    p = tmp_path / "fresh.txt"
    p.write_text("abc")
    d = cm.file_digest(p)
    n = cm.files_hashed
    assert cm.file_digest(p) == d and cm.files_hashed == n + 1, "changed under 2 s ago: the stat is not trusted yet"


def test_folders_count_by_content(store, tmp_path):
    calls = []

    @casmon.cache(store=store, files=["folder"])
    def listing(folder):
        calls.append(1)
        return sorted(str(q.relative_to(folder)) for q in folder.rglob("*"))

    d = tmp_path / "d"
    (d / "sub").mkdir(parents=True)
    (d / "a.txt").write_text("1")
    (d / "sub" / "b.txt").write_text("2")
    assert listing(d) == ["a.txt", "sub", "sub/b.txt"]
    assert listing(d) and len(calls) == 1
    (d / "sub" / "b.txt").write_text("3")
    listing(d)
    assert len(calls) == 2, "a file inside changed"
    (d / "empty").mkdir()
    assert "empty" in listing(d) and len(calls) == 3, "a new empty folder counts"
    (d / "sub" / "b.txt").rename(d / "sub" / "c.txt")
    assert "sub/c.txt" in listing(d) and len(calls) == 4, "a renamed file counts"
    entry = listing.ref(d).entry
    assert sorted(os.path.basename(f[1]) for f in entry["files"]) == ["a.txt", "c.txt"]


def test_files_lists_and_missing_paths(store, tmp_path):
    @casmon.cache(store=store, files=[0])
    def concat(paths):
        return "".join(open(q).read() if os.path.exists(q) else "-" for q in paths)

    a, b = tmp_path / "a", tmp_path / "b"
    a.write_text("A")
    assert concat([str(a), str(b)]) == "A-"
    b.write_text("B")
    assert concat([str(a), str(b)]) == "AB", "a file that appeared counts"
    with pytest.warns(CacheWarning, match="'paths'"):
        assert concat(iter([str(a)])) == "A"  # not a path or a list of paths: uncached, one warning
    with pytest.raises(ValueError, match="no parameter named 'nope'"):
        casmon.cache(store=store, files=["nope"])(lambda x: x)


# -- counting ----------------------------------------------------------------------------------------------
def test_one_call_is_one_entry_after_a_damaged_result_was_recomputed(store, tmp_path):
    @casmon.cache(store=store)
    def f(n):
        return np.random.default_rng(n).random(n)

    first = f(200_000)
    store.flush()
    damage_cached_result(store, tmp_path / "s", f, 200_000)
    with pytest.warns(CacheWarning, match="damaged"):
        again = f(200_000)
    store.flush()
    assert np.array_equal(first, again)
    assert sum(1 for _k, r in store.records("cache") if r["fn"] == f.__casmon_cache__.name) == 2, "two records"
    info = f.cache_info()
    assert (info.entries, info.stored_bytes) == (1, 200_000 * 8), "one key counts once"
    stats = cache_entries(store)[f.__casmon_cache__.name]
    assert (stats["entries"], stats["bytes"]) == (1, 200_000 * 8)
    assert (stats["duplicates"], stats["replaced"]) == (0, 1), "a recomputed result is no race of two processes"


# -- pickling ----------------------------------------------------------------------------------------------
def test_cached_wrappers_pickle(store):
    from tests.cache import test_cache_workers as w

    g = pickle.loads(pickle.dumps(w.square))
    assert g is w.square, "a module's cached function pickles by reference"
    wrapped = casmon.cache(store=str(store.url))(w.plain_cube)
    h = pickle.loads(pickle.dumps(wrapped))
    assert h is not wrapped and h.__wrapped__ is w.plain_cube and h(3) == 27
    assert h.__casmon_cache__.options()["store"] == str(store.url)


def test_cached_coroutine_functions_are_coroutine_functions(store):
    import asyncio
    import inspect

    @casmon.cache(store=store)
    async def fetch(x):
        return x * 2

    assert inspect.iscoroutinefunction(fetch)
    assert asyncio.run(fetch(2)) == 4 and asyncio.run(fetch(2)) == 4
    assert fetch.cache_info().hits == 1 and fetch.is_cached(2)


# -- hits beside other processes, gc and cache_clear ---------------------------------------------------------

def _big(i):
    return np.random.default_rng(i).random(40_000)  # too large to travel inline in its cache entry


_big.__module__ = "__main__"


def test_a_cache_hit_on_an_entry_another_process_just_flushed_is_a_hit_not_damage(tmp_path):
    """With pool-style writers flushing every call beside gc, a process found another's fresh cache
    entry, but its pack index, read less than a second before, did not list the result yet and a miss
    re-reads it at most once a second -- so it warned 'damaged or missing', recomputed and wrote the
    result again. Small results travel inline in the entry and escaped it."""
    import warnings

    root = tmp_path / "s"
    s1 = casmon.open(root, autoflush=None)
    s1.put(1)
    s1.flush()
    s2 = casmon.open(root, autoflush=None)  # the other process
    c1 = casmon.cache(store=s1)(_big)
    c2 = casmon.cache(store=s2)(_big)
    c2(0)
    s2.flush()
    s2.table("cache").last_refresh -= 10  # its cache table was read over a second ago (no sleep)
    s2.objects.index.refresh()  # and its pack index just now, as any read or put does
    c1(1)
    s1.flush()  # the first process's entry for key 1, and its value, are stored
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert c2(1).tobytes() == _big(1).tobytes()
    assert c2.cache_info().hits == 1 and c2.cache_info().misses == 1


def test_cache_hits_through_gc_clear_and_fresh_processes(tmp_path):
    """The plain-bytes memory of a cache (``_mem``), the object store's ``_known``/``_pending`` and the
    record refs: hits after gc, after ``cache_clear`` (nothing remembered is served), after a fresh open,
    and every digest users see is a ``Digest`` (hex ``str``, ``.short``)."""
    loc = tmp_path / "s"
    s = casmon.open(loc)
    n = {"calls": 0}

    @casmon.cache(store=s)
    def f(i):
        return np.full(100 + i, i)

    for i in range(50):
        f(i)
    s.flush()
    s.gc(grace=0)
    for i in range(50):
        assert (f(i) == i).all() and f(i).shape == (100 + i,)
    r = f.ref(3)
    dg = getattr(r, "digest", None)
    if dg is not None:
        assert isinstance(dg, casmon.Digest) and str(dg) == dg.hex() and len(dg.short) == 12
    f.cache_clear()
    assert not f.is_cached(3)
    assert (f(3) == 3).all()
    assert f.is_cached(3)
    s.flush()
    s2 = casmon.open(loc)

    @casmon.cache(store=s2)
    def f(i):  # noqa: F811 - the same function, a fresh store object
        return np.full(100 + i, i)

    assert f.is_cached(3) and not f.is_cached(4)
    assert s2.verify().ok
    for d in list(s.objects._pending) + list(s.objects._known):
        assert type(d) is bytes and len(d) == 16
    del n


# -- warnings point at the caller's line ---------------------------------------------------------------------

GLOBAL_CONN = sqlite3.connect(":memory:", check_same_thread=False)


@pytest.mark.filterwarnings("ignore:casmon.record. not a git repository")
def test_cache_warnings_point_at_the_callers_line(tmp_path):
    from casmon.caching import KIND_FN, name_digest
    from casmon.keys.codeversion import function_name

    s = casmon.open(tmp_path / "s")

    @casmon.cache(store=s)
    def takes(x, lock):
        return x

    @casmon.cache(store=s)
    def reads_global(x):
        return GLOBAL_CONN.execute("select ?", (x,)).fetchone()[0]

    @casmon.cache(store=s)
    def changed(x):
        return x

    name = function_name(changed)  # results of an older version of `changed` were cached
    s.append(KIND_FN, {"fn": name, "version": "0" * 32, "time": 1.0}, key=name_digest(name))
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        takes(1, threading.Lock())
        reads_global(1)
        changed(1)
    cw = [w for w in got if issubclass(w.category, casmon.CacheWarning)]
    texts = " | ".join(str(w.message) for w in cw)
    assert len(cw) == 3, texts
    assert all(w.filename == __file__ for w in cw), [(w.filename, w.lineno) for w in cw]
    assert "ignore=['lock']" in texts and "hashers={'lock'" in texts
    assert "gc --now" in texts
    s.close()
