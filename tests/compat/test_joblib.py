"""casmon.compat.joblib: joblib's documented Memory examples run unchanged but for the import, and agree with joblib.

``docs_examples`` is the code of joblib's doc/memory.rst, in order, as written there (``np.float`` is
``float``: numpy 2 has no ``np.float``); each value the page shows is collected, each print captured. The
same code runs on ``joblib.Memory`` and on casmon's, and the two transcripts must be equal but for joblib's
``verbose`` trace, which casmon does not print.
"""

import collections
import contextlib
import datetime
import io
import mmap
import pickle
import re

import numpy as np
import pytest

from casmon.store.mapped import MAP_MIN

joblib = pytest.importorskip("joblib")


def docs_examples(Memory, cachedir, cachedir2):
    shown = []
    show = shown.append

    # A simple example
    memory = Memory(cachedir, verbose=0)

    @memory.cache
    def f(x):
        print('Running f(%s)' % x)
        return x

    print(f(1))
    print(f(1))
    print(f(2))

    # Using with numpy
    @memory.cache
    def g(x):
        print('A long-running calculation, with parameter %s' % x)
        return np.hamming(x)

    @memory.cache
    def h(x):
        print('A second long-running calculation, using g(x)')
        return np.vander(x)

    a = g(3)
    show(a)
    show(g(3))
    b = h(a)
    b2 = h(a)
    show(b2)
    show(np.allclose(b, b2))

    # Using memmapping
    memory2 = Memory(cachedir2, mmap_mode='r')
    square = memory2.cache(np.square)
    a = np.vander(np.arange(3)).astype(float)
    show(square(a))
    res = square(a)
    show(res)
    show(res.flags.writeable)  # "If the memory mapping mode used was 'r' ... the array will be read only"
    del res

    # Shelving: using references to cached values
    result = g.call_and_shelve(4)
    show(re.fullmatch(r'MemorizedResult\(location=".*", func=".*g.*", args_id=".*"\)', repr(result)) is not None)
    show(result.get())
    result.clear()
    try:
        result.get()
    except KeyError:
        show("KeyError")

    # Gotchas: within a session, two functions of one name do not collide
    @memory.cache
    def func(x):
        print('Running func(%s)' % x)

    func2 = func

    @memory.cache
    def func(x):  # noqa: F811 - the page's example redefines it
        print('Running a different func(%s)' % x)

    func(1)
    func2(1)
    func(1)  # No recomputation so far
    func2(1)  # No recomputation so far

    # Gotchas: lambda functions (the page's lines that it does not skip)
    def my_print(x):
        print(x)

    f = memory.cache(lambda: my_print(1))
    g = memory.cache(lambda: my_print(2))
    f()
    f()

    # Gotchas: it works on numpy ufuncs
    sin = memory.cache(np.sin)
    print(sin(0))

    # Ignoring some arguments
    @memory.cache(ignore=['debug'])
    def my_func(x, debug=True):
        print('Called with x = %s' % x)

    my_func(0)
    my_func(0, debug=False)
    my_func(0, debug=True)
    return shown


def transcript(Memory, root):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        shown = docs_examples(Memory, str(root / "cache"), str(root / "cache2"))
    # joblib's verbose=1 trace of a call: a rule, "[Memory] Calling ...", the call, a rule with its duration
    text = re.sub(r"_{20,}\n\[Memory\].*?_+\w+ - [\d.]+s, [\d.]+min\n", "", out.getvalue(), flags=re.S)
    return text, shown


def assert_same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        if isinstance(x, np.ndarray):
            assert isinstance(y, np.ndarray) and x.dtype == y.dtype and np.array_equal(x, y)
        else:
            assert x == y


def test_joblibs_documented_examples_print_and_return_what_joblib_does(tmp_path):
    from casmon.compat.joblib import Memory

    theirs = transcript(joblib.Memory, tmp_path / "joblib")
    ours = transcript(Memory, tmp_path / "casmon")
    assert ours[0] == theirs[0]
    assert "Running f(1)\n1\n1\nRunning f(2)\n2\n" in ours[0] and "Called with x = 0\n" in ours[0]
    assert_same(ours[1], theirs[1])
    assert (tmp_path / "casmon" / "cache" / "casmon").is_dir()


def test_two_lambdas_never_share_entries(tmp_path):
    from casmon.compat.joblib import Memory

    memory = Memory(str(tmp_path), verbose=0)
    calls = []
    f = memory.cache(lambda: calls.append(1))
    g = memory.cache(lambda: calls.append(2))
    f(), f(), g(), g(), f()
    assert calls == [1, 2]  # joblib's page skips these lines: its lambdas collide and recompute


def map_of(a):
    x = a
    while x is not None and not isinstance(x, mmap.mmap):
        x = getattr(x, "base", None) if not isinstance(x, memoryview) else x.obj
    return x


def big(seed):
    return np.random.default_rng(seed).random(MAP_MIN // 8 + 1000)


def test_mmap_mode_r_maps_a_large_result_read_only_on_the_miss_and_the_hit(tmp_path):
    from casmon.compat.joblib import Memory

    memory = Memory(str(tmp_path), verbose=0)
    double = memory.cache(lambda x: x * 2, mmap_mode="r")
    x = big(0)
    first, again = double(x), double(x)
    for r in (first, again):
        assert map_of(r) is not None and not r.flags.writeable
        assert np.array_equal(r, x * 2)
        with pytest.raises(ValueError):
            r[0] = 1.0
    expected = joblib.Memory(str(tmp_path / "joblib"), mmap_mode="r", verbose=0).cache(lambda x: x * 2)(x)
    assert np.array_equal(again, expected)


Pair = collections.namedtuple("Pair", "x y")


def test_mmap_mode_r_makes_every_array_of_a_result_read_only_as_joblib_does(tmp_path):
    from casmon.compat.joblib import Memory

    def make(n):
        return {"a": np.arange(n, dtype=float), "b": [(np.ones(n), 3)], "p": Pair(np.zeros(2), "s")}

    ours = Memory(str(tmp_path / "c"), mmap_mode="r", verbose=0).cache(make)
    theirs = joblib.Memory(str(tmp_path / "j"), mmap_mode="r", verbose=0).cache(make)
    for got in (ours(300_000), ours(300_000), theirs(300_000), theirs(300_000)):
        arrays = [got["a"], got["b"][0][0], got["p"].x]
        assert [a.flags.writeable for a in arrays] == [False, False, False]
        assert got["b"][0][1] == 3 and type(got["p"]) is Pair and got["p"].y == "s"


def test_mmap_mode_r_never_makes_the_callers_own_array_read_only(tmp_path):
    from casmon.compat.joblib import Memory

    mine = np.arange(10.0)
    same = Memory(str(tmp_path), mmap_mode="r").cache(lambda: mine)
    assert not same().flags.writeable
    assert mine.flags.writeable


def test_mmap_mode_c_gives_a_writable_copy_that_never_reaches_the_store(tmp_path):
    from casmon.compat.joblib import Memory

    ones = Memory(str(tmp_path)).cache(lambda n: np.ones(n), mmap_mode="c")
    a = ones(5)
    a[:] = 7
    b = ones(5)
    assert b.flags.writeable and np.array_equal(b, np.ones(5))
    b[:] = 9
    assert np.array_equal(ones(5), np.ones(5))


def test_the_decorator_forms_and_ignore(tmp_path):
    from casmon.compat.joblib import Memory

    memory = Memory(tmp_path, verbose=0)  # a pathlib.Path, as joblib takes
    calls = []

    @memory.cache
    def a(x):
        calls.append(("a", x))
        return x

    @memory.cache()
    def b(x):
        calls.append(("b", x))
        return x

    def c(x, verbose=0):
        calls.append(("c", x))
        return x

    c = memory.cache(c, ignore=["verbose"], mmap_mode="r")
    for fn in (a, b, c):
        assert fn(1) == 1 and fn(1) == 1
    assert c(1, verbose=3) == 1
    assert calls == [("a", 1), ("b", 1), ("c", 1)]
    assert c.func.__name__ == "c" and c.ignore == ["verbose"] and c.mmap_mode == "r"
    assert memory.eval(a, 1) == 1 and calls == [("a", 1), ("b", 1), ("c", 1)]


def test_a_method_cached_at_instantiation_with_self_ignored_as_joblibs_page_shows(tmp_path):
    from casmon.compat.joblib import Memory

    memory = Memory(str(tmp_path), verbose=0)
    calls = []

    class Foo(object):
        def __init__(self):
            self.method = memory.cache(self.method, ignore=['self'])

        def method(self, x):
            calls.append(x)
            return x + 1

    a, b = Foo(), Foo()
    assert a.method(1) == 2 and b.method(1) == 2 and calls == [1]  # self does not count
    assert b.method.check_call_in_cache(1) and b.method.call_and_shelve(1).get() == 2 and calls == [1]


def test_check_call_in_cache_and_the_functions_clear(tmp_path):
    from casmon.compat.joblib import Memory

    memory = Memory(str(tmp_path), verbose=0)
    calls = []
    f = memory.cache(lambda x: calls.append(x) or x * 10)
    assert not f.check_call_in_cache(1)
    assert f(1) == 10 and f(2) == 20
    assert f.check_call_in_cache(1) and f.check_call_in_cache(x=2) and not f.check_call_in_cache(3)
    assert calls == [1, 2]
    f.clear(warn=False)
    assert not f.check_call_in_cache(1)
    assert f(1) == 10 and calls == [1, 2, 1]
    out, meta = f.call(1)  # computed again, whatever is stored
    assert out == 10 and calls == [1, 2, 1, 1] and meta["time"] > 0 and "duration" in meta


def test_eval_in_a_loop_keeps_no_function_per_call(tmp_path):
    import gc

    from casmon.compat.joblib import Memory

    memory = Memory(str(tmp_path), verbose=0)
    for i in range(50):
        assert memory.eval(_shelved_square, 3) == 9
    gc.collect()
    assert len(memory._funcs) <= 1


def test_memory_clear_forgets_every_function_of_its_store(tmp_path):
    from casmon.compat.joblib import Memory

    memory = Memory(str(tmp_path), verbose=0)
    calls = []
    f = memory.cache(lambda x: calls.append(("f", x)) or x)
    g = memory.cache(lambda x: calls.append(("g", x)) or -x)
    f(1), g(1)
    Memory(str(tmp_path)).clear(warn=False)  # another Memory of the same folder, as after a restart
    assert not f.check_call_in_cache(1) and not g.check_call_in_cache(1)
    f(1), g(1)
    assert calls == [("f", 1), ("g", 1), ("f", 1), ("g", 1)]


SQUARED = []


def _shelved_square(x):
    SQUARED.append(x)
    return np.asarray(x) ** 2


def test_a_shelved_result_pickles_and_its_clear_drops_that_call_only(tmp_path):
    from casmon.compat.joblib import Memory

    memory = Memory(str(tmp_path), verbose=0)
    sq = memory.cache(_shelved_square)
    r4, r5 = sq.call_and_shelve(4), sq.call_and_shelve(5)
    again = pickle.loads(pickle.dumps(r4))
    assert again.get() == 16 and r5.get() == 25
    r4.clear()
    with pytest.raises(KeyError, match="may have been cleared"):
        r4.get()
    with pytest.raises(KeyError):
        again.get()
    assert not sq.check_call_in_cache(4) and sq.check_call_in_cache(5) and r5.get() == 25
    SQUARED.clear()
    assert sq(4) == 16 and sq(5) == 25 and SQUARED == [4]  # computed again: this process forgot it too


def test_a_shelved_result_is_read_by_another_process_at_once(tmp_path):
    import subprocess
    import sys

    from casmon.compat.joblib import Memory
    from tests.conftest import ROOT

    import casmon

    store = casmon.open(str(tmp_path / "c"), autoflush=None)  # no background flush to make it pass by timing
    shelved = Memory(store, verbose=0).cache(_shelved_square).call_and_shelve(6)
    (tmp_path / "r.pkl").write_bytes(pickle.dumps(shelved))
    read = "import pickle, sys; print(pickle.loads(open(sys.argv[1], 'rb').read()).get())"
    p = subprocess.run([sys.executable, "-c", read, str(tmp_path / "r.pkl")], capture_output=True, text=True,
                       env={**__import__("os").environ, "PYTHONPATH": str(ROOT)}, cwd=tmp_path, timeout=300)
    assert p.returncode == 0 and p.stdout.strip() == "36", p.stderr  # a worker gets it while this process runs on


PARALLEL = r"""
import os, sys, warnings, joblib
import casmon
from casmon.compat.joblib import Memory
memory = Memory(casmon.open(sys.argv[1]) if sys.argv[3] == "store" else sys.argv[1], verbose=0)

@memory.cache
def sq(x):
    with open(sys.argv[2], "a") as f:
        f.write(f"{x}\n")
    return x * x

def get(r):
    return r.get()

if __name__ == "__main__":
    print(joblib.Parallel(n_jobs=2)(joblib.delayed(sq)(i) for i in range(4)))  # computed in the workers
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "the code of sq changed": the workers keyed it by another version
        print([sq(i) for i in range(4)])
    r = sq.call_and_shelve(7)
    print(joblib.Parallel(n_jobs=2)(joblib.delayed(get)(r) for _ in range(4)))  # workers that looked up before
"""


@pytest.mark.parametrize("location", ["folder", "store"])
def test_joblib_parallel_workers_share_the_scripts_entries_and_read_its_shelved_results(tmp_path, location):
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT

    (tmp_path / "job.py").write_text(PARALLEL)
    for _run in range(2):  # the script run again: its workers and itself find every call stored
        p = subprocess.run([sys.executable, "job.py", str(tmp_path / "c"), str(tmp_path / "calls"), location],
                           cwd=tmp_path, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
                           timeout=600)
        assert p.returncode == 0, p.stderr
        assert p.stdout.split("\n")[:3] == ["[0, 1, 4, 9]", "[0, 1, 4, 9]", "[49, 49, 49, 49]"]
        assert sorted((tmp_path / "calls").read_text().split()) == ["0", "1", "2", "3", "7"]


def test_a_memory_on_a_store_pickles_to_that_store(tmp_path):
    import casmon
    from casmon.compat.joblib import Memory

    store = casmon.open(str(tmp_path / "s"))
    memory = Memory(store, verbose=0)
    again = pickle.loads(pickle.dumps(memory))
    assert again.store.url == store.url  # not a store inside it ({url}/casmon is where a folder's results go)
    again.cache(_shelved_square)(3)
    again.store.flush()
    assert memory.cache(_shelved_square).check_call_in_cache(3)


def test_location_none_caches_nothing_as_in_joblib(tmp_path, monkeypatch):
    from casmon.compat.joblib import Memory

    monkeypatch.chdir(tmp_path)
    ours, theirs = Memory(None), joblib.Memory(None)
    for memory in (ours, theirs):
        calls = []
        f = memory.cache(lambda x: calls.append(x) or x + 1)
        assert f(1) == 2 and f(1) == 2 and calls == [1, 1]
        assert not f.check_call_in_cache(1)
        shelved = f.call_and_shelve(3)
        assert shelved.get() == 4
        shelved.clear()
        with pytest.raises(KeyError):
            shelved.get()
        f.clear()
        memory.clear(warn=False)
        memory.reduce_size(bytes_limit=0)
    assert list(tmp_path.iterdir()) == []


def _fill(memory, n, size=50_000):
    calls = []

    def make(i):
        calls.append(i)
        return np.random.default_rng(i).random(size)  # random: it does not compress

    f = memory.cache(make)
    for i in range(n):
        f(i)
    return f, calls


def test_reduce_size_keeps_the_most_recently_used_within_the_limit(tmp_path):
    from casmon.compat.joblib import Memory

    memory = Memory(str(tmp_path), verbose=0)
    f, calls = _fill(memory, 4)
    f(0)  # used again: the newest use
    memory.reduce_size(bytes_limit=2 * 400_000 + 50_000)
    assert [f.check_call_in_cache(i) for i in range(4)] == [True, False, False, True]
    f(1)
    assert calls == [0, 1, 2, 3, 1]
    memory.reduce_size(bytes_limit="1K")
    assert not any(f.check_call_in_cache(i) for i in range(4))


def test_memorys_bytes_limit_as_joblib_before_1_5_took_it_is_what_reduce_size_keeps(tmp_path):
    from casmon.compat.joblib import Memory

    memory = Memory(str(tmp_path), verbose=0, bytes_limit=400_000 + 50_000)  # joblib 1.4 and before
    f, calls = _fill(memory, 3)
    memory.reduce_size()
    assert [f.check_call_in_cache(i) for i in range(3)] == [False, False, True]
    memory.reduce_size(bytes_limit="1K")  # the call's own limit wins
    assert not f.check_call_in_cache(2)
    with pytest.raises(ValueError, match="casmon.compat.joblib: Memory: 'lots' is not a size"):
        Memory(str(tmp_path), bytes_limit="lots")


def test_reduce_size_by_age(tmp_path):
    from casmon.compat.joblib import Memory

    memory = Memory(str(tmp_path), verbose=0)
    f, calls = _fill(memory, 2)
    memory.reduce_size(age_limit=datetime.timedelta(days=1))
    assert f.check_call_in_cache(0) and f.check_call_in_cache(1)
    memory.reduce_size(age_limit=0)
    assert not f.check_call_in_cache(0) and not f.check_call_in_cache(1)


@pytest.mark.parametrize("kw, match", [
    ({"bytes_limit": "lots"}, "not a size"), ({"bytes_limit": -1}, "a size must be"),
    ({"bytes_limit": float("nan")}, "a size must be"), ({"items_limit": 3}, "items_limit is not supported"),
    ({"age_limit": "1 day"}, "age_limit must be"),
])
def test_a_bad_reduce_size_argument_is_one_clear_error(tmp_path, kw, match):
    from casmon.compat.joblib import Memory

    with pytest.raises(ValueError, match=rf"casmon.compat.joblib: reduce_size: .*{match}"):
        Memory(str(tmp_path)).reduce_size(**kw)


def test_bad_memory_arguments_are_one_clear_error(tmp_path):
    from casmon.compat.joblib import Memory

    with pytest.raises(ValueError, match="mmap_mode must be one of"):
        Memory(str(tmp_path), mmap_mode="rw")
    with pytest.raises(ValueError, match="mmap_mode must be one of"):
        Memory(str(tmp_path)).cache(lambda: 1, mmap_mode="x")
    with pytest.raises(ValueError, match="backend 'hdfs' is not supported"):
        Memory(str(tmp_path), backend="hdfs")
    with pytest.raises(TypeError, match="ignore must be a list"):
        Memory(str(tmp_path)).cache(lambda x: 1, ignore="x")
    with pytest.raises(TypeError, match="location must be"):
        Memory(3)


@pytest.mark.parametrize("helper", ["casmon", "joblib"])
def test_cache_validation_callback_computes_a_stale_entry_again(tmp_path, helper):
    from casmon.compat.joblib import Memory, expires_after as ours

    expires_after = ours if helper == "casmon" else joblib.expires_after
    memory = Memory(str(tmp_path), verbose=0)
    calls = []
    fresh = memory.cache(lambda x: calls.append(("fresh", x)) or x, cache_validation_callback=expires_after(days=1))
    stale = memory.cache(lambda x: calls.append(("stale", x)) or x, cache_validation_callback=expires_after(seconds=0))
    for fn in (fresh, stale):
        assert fn(1) == 1 and fn(1) == 1
    assert calls == [("fresh", 1), ("stale", 1), ("stale", 1)]


def test_a_joblib_method_cached_at_class_level_names_the_function_called_without_self(tmp_path):
    from casmon.compat.joblib import Memory

    memory = Memory(str(tmp_path), verbose=0)

    class Model:
        @memory.cache  # joblib refuses this too: the cached function is not bound to the object
        def predict(self, x):
            return x

    with pytest.raises(TypeError, match=r"Model\.predict: missing a required argument: 'x'"):
        Model().predict(3)


def _jdouble(x):
    return 2 * x


def test_a_joblib_cache_in_the_same_location_is_left_whole_by_clear_and_reduce_size(tmp_path):
    from casmon.compat.joblib import Memory

    theirs = joblib.Memory(str(tmp_path), verbose=0).cache(_jdouble)
    theirs(1)
    before = sorted(p.relative_to(tmp_path) for p in (tmp_path / "joblib").rglob("*"))
    memory = Memory(tmp_path, verbose=0)  # a pathlib.Path, as joblib takes it
    memory.cache(_jdouble)(1)
    memory.clear(warn=False)
    memory.reduce_size(bytes_limit=0)
    assert sorted(p.relative_to(tmp_path) for p in (tmp_path / "joblib").rglob("*")) == before
    assert theirs.check_call_in_cache(1)


def test_a_staticmethod_is_cached_as_its_function_and_a_classmethod_is_one_clear_error(tmp_path):
    from casmon.compat.joblib import Memory

    memory = Memory(str(tmp_path), verbose=0)

    class Maths:
        @memory.cache  # over @staticmethod, as joblib takes it
        @staticmethod
        def triple(x):
            return 3 * x

    assert Maths.triple(2) == 6 and Maths().triple(2) == 6 and Maths.triple.check_call_in_cache(2)
    assert memory.cache(staticmethod(_jdouble))(4) == 8
    with pytest.raises(TypeError, match=r"casmon.compat.joblib: cache: .*classmethod"):
        memory.cache(classmethod(_jdouble))
