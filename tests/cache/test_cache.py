import asyncio
import json
import os
import subprocess
import sys
import textwrap
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest

import casmon
from casmon.caching import CacheWarning
from tests.conftest import ROOT, run_parallel, run_python
from tests.support.damage import damage_cached_result
from tests.support.sources import write_module


@pytest.fixture
def store(tmp_path):
    s = casmon.open(tmp_path / "s", autoflush=None)
    yield s
    s.close()


def counted(store, **opts):
    calls = []

    def deco(fn):
        def inner(*a, **k):
            calls.append((a, k))
            return fn(*a, **k)

        inner.__name__ = fn.__name__
        inner.__qualname__ = fn.__qualname__
        inner.__module__ = fn.__module__
        import inspect

        inner.__signature__ = inspect.signature(fn)
        return casmon.cache(store=store, **opts)(inner), calls

    return deco


def test_hits_and_bound_argument_normalisation(store):
    calls = []

    @casmon.cache(store=store)
    def f(x, y=2, *, z=3):
        calls.append((x, y, z))
        return x * y * z

    assert f(1) == 6
    assert f(1) == 6
    assert f(x=1) == 6
    assert f(1, y=2) == 6
    assert f(1, 2, z=3) == 6
    assert len(calls) == 1
    assert f(1, 3) == 9 and f(1, z=4) == 8
    assert len(calls) == 3
    info = f.cache_info()
    assert (info.hits, info.misses, info.entries) == (4, 3, 3)
    with pytest.raises(TypeError):
        f()  # a bad call fails as it would without the cache
    with pytest.raises(TypeError):
        f(1, x=2)


def test_var_args_and_kwargs(store):
    calls = []

    @casmon.cache(store=store)
    def f(*args, **kwargs):
        calls.append(1)
        return (args, sorted(kwargs.items()))

    f(1, 2, a=1, b=2)
    f(1, 2, b=2, a=1)  # keyword order does not matter
    assert len(calls) == 1
    f(2, 1, a=1, b=2)
    assert len(calls) == 2


def test_finecache_collisions_do_not_happen(store):
    @casmon.cache(store=store)
    def total(arr):
        return float(arr.sum())

    a = np.zeros(10_000)
    b = a.copy()
    b[5_000] = 1.0
    assert repr(a) == repr(b)
    assert total(a) == 0.0 and total(b) == 1.0

    class Obj:  # default repr shows the address, which is reused
        def __init__(self, v):
            self.v = v

    @casmon.cache(store=store)
    def val(o):
        return o.v

    assert val(Obj(1)) == 1
    assert val(Obj(2)) == 2

    @casmon.cache(store=store)
    def many(a1, a2, a3, a4, a5, a6, a7, a8, a9, a10):
        return a1 + a10

    assert many(*range(10)) == 9 and many(*range(10)) == 9  # no "file name too long"


def test_ignore_and_hashers(store):
    calls = []

    @casmon.cache(store=store, ignore=["verbose"], hashers={"df": lambda d: d["id"], 1: lambda s: s.lower()})
    def f(df, name, verbose=False):
        calls.append(1)
        return (df["id"], name)

    f({"id": 1, "junk": 1}, "A", verbose=True)
    f({"id": 1, "junk": 2}, "a", verbose=False)
    assert len(calls) == 1
    f({"id": 2, "junk": 1}, "a")
    assert len(calls) == 2
    with pytest.raises(ValueError, match="no parameter named 'nope'"):
        casmon.cache(store=store, ignore=["nope"])(lambda x: x)
    with pytest.raises(ValueError, match="no parameter at position 5"):
        casmon.cache(store=store, hashers={5: str})(lambda x: x)


class Model:
    def __init__(self, w):
        self.w = w
        self.calls = 0

    def predict(self, x):
        self.calls += 1
        return self.w * x


def test_methods_static_and_class_methods(store):
    calls = []

    class Scaler:
        factor = 10

        def __init__(self, k):
            self.k = k

        @casmon.cache(store=store)
        def scale(self, x):
            calls.append("m")
            return self.k * x

        @casmon.cache(store=store)
        @staticmethod
        def add(a, b):
            calls.append("s")
            return a + b

        @classmethod
        @casmon.cache(store=store)
        def times(cls, x):
            calls.append("c")
            return cls.factor * x

    assert Scaler(2).scale(3) == 6 and Scaler(2).scale(3) == 6  # self by content
    assert Scaler(3).scale(3) == 9
    assert Scaler.add(1, 2) == 3 and Scaler(1).add(1, 2) == 3
    assert Scaler.times(2) == 20 and Scaler.times(2) == 20
    assert calls == ["m", "m", "s", "c"]


def test_async_function(store):
    calls = []

    @casmon.cache(store=store)
    async def fetch(x):
        calls.append(x)
        await asyncio.sleep(0)
        return x + 1

    assert asyncio.run(fetch(1)) == 2
    assert asyncio.run(fetch(1)) == 2
    assert calls == [1]
    assert fetch.__name__ == "fetch"
    with pytest.raises(TypeError, match="generator"):

        @casmon.cache(store=store)
        def gen():
            yield 1


def test_wrapper_keeps_name_doc_signature(store):
    @casmon.cache(store=store)
    def documented(a: int, b: str = "x") -> str:
        """Doc."""
        return b * a

    import inspect

    assert documented.__name__ == "documented" and documented.__doc__ == "Doc."
    assert str(inspect.signature(documented)) == "(a: int, b: str = 'x') -> str"


def test_hits_are_fresh_copies(store):
    @casmon.cache(store=store)
    def make(n):
        return np.arange(n, dtype=float)

    a = make(5)
    a[0] = 99
    b = make(5)
    assert b[0] == 0.0
    b[1] = 77
    assert make(5)[1] == 1.0


def test_helpers_clear_is_cached_ref(store):
    @casmon.cache(store=store)
    def big(n):
        return np.ones((n, 1000))

    assert not big.is_cached(2000)
    big(2000)
    assert big.is_cached(2000) and big.is_cached(n=2000)
    r = big.ref(2000)
    assert r.nbytes == 2000 * 1000 * 8
    assert np.array_equal(r.load(), np.ones((2000, 1000)))
    z = r.open_array()
    assert z.shape == (2000, 1000) and float(z[1500, 3]) == 1.0
    with pytest.raises(KeyError, match="not cached"):
        big.ref(3)
    info = big.cache_info()
    assert info.entries == 1 and info.stored_bytes == 16_000_000
    big.cache_clear()
    assert not big.is_cached(2000)
    assert big.cache_info().entries == 0
    big(2000)
    assert big.cache_info().misses == 2


def test_persists_across_processes(tmp_path):
    code = textwrap.dedent(
        """
        import sys, casmon
        calls = []
        @casmon.cache(store=sys.argv[1])
        def slow(x):
            calls.append(x)
            return {"x": x, "sq": x * x}
        print(slow(4), len(calls))
        """
    )
    assert run_python(code, str(tmp_path / "s")).stdout.split()[-1] == "1"
    assert run_python(code, str(tmp_path / "s")).stdout.split()[-1] == "0"


def test_same_result_stored_once(tmp_path):
    s = casmon.open(tmp_path / "s", autoflush=None)
    a = np.random.default_rng(0).random(2 * 1024 * 1024 // 8)

    @casmon.cache(store=s)
    def f(i):
        return a

    f(0)
    s.flush()
    one = s.stats()["stored_bytes"]
    for i in range(1, 200):
        f(i)
    s.flush()
    assert s.stats()["stored_bytes"] <= one * 1.05 + 20_000  # + a few small record files


def test_1000_small_misses_add_few_files(tmp_path):
    s = casmon.open(tmp_path / "s", autoflush=None)

    @casmon.cache(store=s)
    def f(i):
        return {"i": i, "v": [i] * 3}

    f(-1)
    s.flush()
    before = sum(1 for p in (tmp_path / "s").rglob("*") if p.is_file())
    for i in range(1000):
        f(i)
    s.flush()
    after = sum(1 for p in (tmp_path / "s").rglob("*") if p.is_file())
    assert after - before <= 10


def test_unhashable_argument_runs_uncached_with_one_warning(store):
    calls = []

    @casmon.cache(store=store)
    def f(x, cb):
        calls.append(1)
        return x

    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert f(1, lambda: 0) == 1
        assert f(1, lambda: 0) == 1
    assert len(calls) == 2
    msgs = [str(x.message) for x in w if issubclass(x.category, CacheWarning)]
    assert len(msgs) == 1 and "'cb'" in msgs[0] and "function" in msgs[0]


def test_unpicklable_result_is_returned_with_a_warning(store):
    @casmon.cache(store=store)
    def f():
        return threading.Lock()

    with pytest.warns(CacheWarning, match="not cached"):
        lock = f()
    assert hasattr(lock, "acquire")
    assert not f.is_cached()


def test_storage_error_never_loses_the_result(store, monkeypatch):
    @casmon.cache(store=store)
    def f(n):
        return np.arange(n)

    def full(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store.backend, "create_async", full)
    monkeypatch.setattr(store.backend, "create", full)
    monkeypatch.setattr(store.backend, "create_frame", full)  # large chunks on a local folder
    with pytest.warns(CacheWarning, match="No space left"):
        r = f(100_000)
    assert np.array_equal(r, np.arange(100_000))


def test_damaged_result_is_recomputed_and_healed(store, tmp_path):
    calls = []

    @casmon.cache(store=store)
    def f(n):
        calls.append(n)
        return np.random.default_rng(n).random(n)

    first = f(200_000)
    store.flush()
    damage_cached_result(store, tmp_path / "s", f, 200_000)
    with pytest.warns(CacheWarning, match="damaged"):
        again = f(200_000)
    assert np.array_equal(first, again) and len(calls) == 2
    store.flush()
    assert casmon.open(tmp_path / "s").verify().ok  # the good copy replaced the damaged file
    assert np.array_equal(f(200_000), first) and len(calls) == 2


HELPERS_V1 = '''
SCALE = 2

def helper(x):
    return x * SCALE
'''

MAIN = '''
import sys, json, warnings
sys.path.insert(0, sys.argv[2])
import casmon
import helpers

calls = []

@casmon.cache(store=sys.argv[1])
def compute(x):
    calls.append(x)
    return helpers.helper(x) + 1

with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    r = compute(10)
print(json.dumps({"result": r, "computed": len(calls), "warnings": [str(x.message) for x in w]}))
'''


def test_helper_edits_invalidate_across_processes(tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    write_module(code / "helpers.py", HELPERS_V1)
    store = str(tmp_path / "s")

    def run():
        return json.loads(run_python(MAIN, store, str(code)).stdout)

    assert run() == {"result": 21, "computed": 1, "warnings": []}
    assert run()["computed"] == 0
    # Comments, blank lines and docstrings do not count.
    write_module(code / "helpers.py", HELPERS_V1.replace("def helper(x):", '# a comment\n\ndef helper(x):\n    """Doubles."""\n'))
    assert run()["computed"] == 0
    # A change to what the helper does counts, with one warning.
    write_module(code / "helpers.py", HELPERS_V1.replace("x * SCALE", "x * SCALE + 0.5"))
    r = run()
    assert r["result"] == 21.5 and r["computed"] == 1
    assert len(r["warnings"]) == 1 and "changed" in r["warnings"][0]
    # So does a module-level constant the helper uses.
    write_module(code / "helpers.py", HELPERS_V1.replace("SCALE = 2", "SCALE = 3"))
    r = run()
    assert r["result"] == 31 and r["computed"] == 1


def test_version_pin(tmp_path):
    s = casmon.open(tmp_path / "s", autoflush=None)
    src1 = "def f(x):\n    return x + 1\n"
    src2 = "def f(x):\n    return x + 2\n"
    ns1, ns2 = {"__name__": "pinned"}, {"__name__": "pinned"}
    exec(src1, ns1)
    exec(src2, ns2)
    f1 = casmon.cache(store=s, version="1")(ns1["f"])
    f2 = casmon.cache(store=s, version="1")(ns2["f"])
    assert f1(1) == 2
    assert f2(1) == 2, "same pinned version: the stored result is used"


def test_concurrent_processes_same_key(tmp_path):
    code = textwrap.dedent(
        """
        import sys, time, casmon, numpy as np
        @casmon.cache(store=sys.argv[1])
        def slow(i):
            time.sleep(0.2)
            return np.full(1000, i)
        for i in range(5):
            assert slow(i)[0] == i
        """
    )
    run_parallel([["-c", code, str(tmp_path / "s")] for _ in range(3)])
    s = casmon.open(tmp_path / "s")
    assert s.verify().ok
    from casmon.caching import cache_entries

    (stats,) = cache_entries(s).values()
    assert 5 <= stats["entries"] <= 15  # no lock: each process may have computed each key


def test_cli_cache_listing_clear_and_eviction(tmp_path):
    loc = str(tmp_path / "s")
    code = textwrap.dedent(
        """
        import sys, time, casmon, numpy as np
        @casmon.cache(store=sys.argv[1])
        def prep(i):
            return np.full(250_000, i, dtype=np.float64)   # 2 MB each
        @casmon.cache(store=sys.argv[1])
        def other(i):
            return i
        for i in range(5):
            prep(i)
            time.sleep(0.05)
        prep(0)   # a hit: 0 is now the most recently used
        other(1)
        """
    )
    run_python(code, loc)
    from tests.cli.test_cli import cli

    out = cli("cache", "--store", loc).stdout
    assert "__main__.prep" in out and "__main__.other" in out
    rep = json.loads(cli("gc", "--store", loc, "--max-size", "5M", "--now", "--json").stdout)
    assert rep["evicted_entries"] == 3 and rep["deleted_objects"] >= 3
    from casmon.caching import cache_entries

    s = casmon.open(loc)
    assert cache_entries(s)["__main__.prep"]["entries"] == 2
    keys = {r["result"] for _, r in s.records("cache") if r["fn"] == "__main__.prep"}
    kept = sorted(int(s.get(k)[0]) for k in keys)
    assert kept == [0, 4], "the least recently used were evicted"
    assert s.verify().ok
    assert "cleared __main__.other" in cli("cache", "clear", "other", "--store", loc).stdout
    assert "__main__.other" not in cache_entries(casmon.open(loc))
    r = cli("cache", "clear", "nothing", "--store", loc, check=False)
    assert r.returncode != 0 and "no cached function 'nothing'" in r.stderr
    rep = json.loads(cli("gc", "--store", loc, "--older-than", "0s", "--now", "--json").stdout)
    assert rep["evicted_entries"] == 3  # the two prep entries, and the cleared one of other


def test_runnable_example(tmp_path):
    example = ROOT / "docs" / "examples" / "cached_preprocessing.py"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    run = lambda: subprocess.run([sys.executable, str(example), str(tmp_path / "s")], capture_output=True, text=True, env=env, timeout=300, check=True).stdout  # noqa: E731
    first = run()
    assert first.count("computing features") == 3
    second = run()
    assert "computing features" not in second and "hits=3" in second


def test_ignore_given_as_one_name_or_position_leaves_out_that_parameter_only(store):
    calls = []

    @casmon.cache(store=store, ignore="ab")
    def f(a, b, ab=0):
        calls.append((a, b))
        return (a, b)

    assert f(1, 2, ab=5) == (1, 2) and f(3, 4, ab=6) == (3, 4) and f(1, 2, ab=7) == (1, 2)
    assert calls == [(1, 2), (3, 4)]

    @casmon.cache(store=store, ignore=1)
    def g(x, verbose):
        calls.append(x)
        return x

    assert g(5, True) == 5 and g(5, False) == 5 and calls[-1] == 5 and len(calls) == 3
    with pytest.raises(ValueError, match="ignore: no parameter named 'verbose'"):
        casmon.cache(store=store, ignore="verbose")(lambda x: x)


@pytest.mark.parametrize("option, value, message", [
    ("memory_entries", None, "memory_entries must be a whole number"),
    ("memory_entries", "10", "memory_entries must be a whole number"),
    ("memory_entries", -1, "memory_entries must be a whole number"),
    ("memory_entries", True, "memory_entries must be a whole number"),
    ("hashers", [("x", str)], "hashers= must be a mapping"),
    ("mmap", "no", "mmap must be True or False"),
])
def test_cache_options_of_the_wrong_kind_are_refused_at_decoration_naming_the_option(store, option, value, message):
    with pytest.raises((TypeError, ValueError), match=message):
        casmon.cache(store=store, **{option: value})(lambda x: x)


def test_a_code_edit_after_a_clear_misses_and_computes(tmp_path):
    """A clear, then a real edit: the next process's first call finds the new version (whose check reads the
    clear) and computes, in its own time."""
    write_module(tmp_path / "m.py", "import casmon\n\n@casmon.cache(store='s')\ndef f(x):\n    return x + 1\n")
    run_python("from m import f\nassert f(1) == 2\nf.cache_clear()\n", cwd=tmp_path)
    write_module(tmp_path / "m.py", "import casmon\n\n@casmon.cache(store='s')\ndef f(x):\n    return x + 5\n")
    p = subprocess.run([sys.executable, "-c", "import warnings; warnings.simplefilter('ignore')\n"
                        "from m import f\nprint(f(1), f(1), f.cache_info().misses)"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.stdout.split() == ["6", "6", "1"], p.stderr
