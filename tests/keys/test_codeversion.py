"""The code version's source text, found without tokenizing (``codeversion._def_block``).

A first cache hit in a fresh process reads its function's source; ``inspect.getsource``
tokenizes for it, and on Python 3.11 the tokenizer's first use costs 4-5 ms. casmon finds
the ``def`` from the code's own line table instead. It must name exactly what
``inspect.getsource`` names, or every cache entry would miss once after an upgrade; where it
cannot be sure, it must step aside.

After an edit and a reload (``importlib.reload``, IPython's autoreload) ``linecache`` may still
hold the file as casmon (or a traceback) last read it, while ``inspect.getsource`` calls
``linecache.checkcache`` first: the block must be measured against the text ``inspect`` reads,
so a reloaded function keeps its own source text and two bodies never share a version.
"""

import importlib
import inspect
import os
import subprocess
import sys
import textwrap
import types

import pytest

from casmon.keys import codeversion as cv
from casmon.keys import sourcetree

MODULES = ["casmon.caching.memoize", "casmon.store.store", "casmon.store.table.table", "casmon.cli.app", "casmon.keys.codeversion", "json.decoder",
           "textwrap", "inspect", "argparse", "dataclasses", "tests.cache.test_cache_truth", "tests.conftest"]


def functions_of(mod):
    """Every function (and every function nested in one, by its code) of ``mod``."""
    seen = set()
    for obj in vars(mod).values():
        items = [obj] + ([v for v in vars(obj).values()] if isinstance(obj, type) else [])
        for f in items:
            f = getattr(f, "__func__", f)
            if isinstance(f, (staticmethod, classmethod)):
                f = f.__func__
            if isinstance(f, types.FunctionType) and f.__module__ == mod.__name__ and id(f.__code__) not in seen:
                seen.add(id(f.__code__))
                yield f.__code__, f


def nested_codes(code):
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            yield c
            yield from nested_codes(c)


@pytest.mark.parametrize("modname", MODULES)
def test_the_block_is_what_inspect_reads(modname):
    mod = importlib.import_module(modname)
    fast = slow = 0
    for code, fn in functions_of(mod):
        for c in [code, *nested_codes(code)]:
            if c.co_name.startswith("<"):
                continue
            found = cv._def_block(c)
            if found is None:
                slow += 1
                continue
            try:
                expected = cv._tree_of(inspect.getsource(c))[0]
            except OSError:
                continue
            got = cv._tree_of("".join(found[0]))[0]
            assert got == expected, f"{modname}: {c.co_qualname} at line {c.co_firstlineno}"
            fast += 1
    assert fast > 3 * slow, (fast, slow)  # the fast path is the common one


SOURCES = {
    "dead code after return": "def f(x):\n    return x\n    print('never')\n",
    "a trailing pass": "def f(x):\n    if x:\n        g(x)\n    else:\n        pass\n",
    "a trailing string": "def f(x):\n    y = x\n    '''\nat column 0\n'''\n",
    "a docstring only": "def f():\n    '''doc'''\n",
    "a header over lines": "def f(\n    a,\n    b=2,\n):\n    return (\n        a + b\n    )\n",
    "decorators": "def deco(*a):\n    return lambda f: f\n@deco(\n    1)\n@deco()\ndef f(a):\n    return a\n",
    "a nested def last": "def f(a):\n    def g(b):\n        return a + b\n    return g\n",
    "comments after": "def f(a):\n    return a\n    # a comment, deeper\n# and one at column 0\nx = 1\n",
}


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_crafted_layouts_give_the_same_text_or_step_aside(tmp_path, name, monkeypatch):
    path = tmp_path / f"mod_{abs(hash(name))}.py"
    path.write_text(SOURCES[name])
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = importlib.import_module(path.stem)
    f = inspect.unwrap(mod.f)
    expected = cv._tree_of(inspect.getsource(f))[0]
    found = cv._def_block(f.__code__)
    if found is not None:
        assert cv._tree_of("".join(found[0]))[0] == expected
    cv._code_memo.clear()
    assert cv._function_source(f)[0] == expected


def test_an_edited_file_still_counts_as_stale(tmp_path, monkeypatch):
    path = tmp_path / "edited_mod.py"
    path.write_text("def f(a):\n    return a + 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = importlib.import_module("edited_mod")
    path.write_text("def f(a):\n    return a + 2\n")  # on disk, not what runs
    import linecache

    linecache.checkcache(str(path))
    cv._code_memo.clear()
    assert cv._function_source(mod.f)[0] is None
    assert sourcetree.block_compiles_to(["def f(a):\n", "    return a + 1\n"], mod.f.__code__)
    assert not sourcetree.block_compiles_to(["def f(a):\n", "    return a + 2\n"], mod.f.__code__)


def test_a_closure_and_mangled_names_are_left_to_the_whole_file():
    def outer():
        k = 3

        def inner(a):
            return a + k
        return inner

    inner = outer()
    block, _ = cv._def_block(inner.__code__)
    assert not sourcetree.block_compiles_to(block, inner.__code__)  # a free variable: unsure alone
    cv._code_memo.clear()
    assert cv._function_source(inner)[0] is not None  # the whole file confirms it

    class A:
        def m(self):
            return self.__secret

    block, _ = cv._def_block(A.m.__code__)
    assert not sourcetree.block_compiles_to(textwrap.dedent("".join(block)).splitlines(True), A.m.__code__)
    cv._code_memo.clear()
    assert cv._function_source(A.m)[0] is not None


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _write(path, text):
    path.write_text(text)
    st = os.stat(path)
    os.utime(path, (st.st_atime, st.st_mtime + 5))  # a later edit, whatever the clock's resolution


def test_a_reloaded_function_keeps_its_source_text(tmp_path, monkeypatch):
    # Why it matters: the notebook workflow (edit a module, reload it, call the cached function
    # again). Before, the reloaded f was named by its source text; now its text is None, so its
    # version falls back to bytecode: the same code gets one key in this session and another in
    # a fresh process, and the results cached after the reload are never found again.
    path = tmp_path / "reload_mod_a.py"
    path.write_text("def f(x):\n    return x + 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = importlib.import_module("reload_mod_a")
    cv._function_source(mod.f)  # casmon reads the file once: linecache now holds it
    _write(path, "def f(x):\n    return x + 2\n")
    importlib.reload(mod)
    assert mod.f(1) == 3
    cv._code_memo.clear()
    expected = cv._tree_of("def f(x):\n    return x + 2\n")[0]
    assert cv._function_source(mod.f)[0] == expected


def test_a_reloaded_function_is_not_named_by_another_functions_text(tmp_path, monkeypatch):
    # Why it matters: a function deleted above f, then a reload. f's new co_firstlineno points,
    # in the stale cached lines, at g (same length as f); g's block does not compile to f, so the
    # whole (stale) file is asked, which still holds f unchanged: accepted. f's code version is
    # then g's source text: f's own body is no longer part of its version.
    path = tmp_path / "reload_mod_b.py"
    v0 = "def h(x):\n    return x - 1\n\n\ndef g(x):\n    return x * 10\n\n\ndef f(x):\n    return x + 1\n"
    v1 = "def g(x):\n    return x * 10\n\n\ndef f(x):\n    return x + 1\n"
    path.write_text(v0)
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = importlib.import_module("reload_mod_b")
    cv._function_source(mod.g)  # any read of the file (here: g's version) caches its lines
    _write(path, v1)
    importlib.reload(mod)
    cv._code_memo.clear()
    text = cv._function_source(mod.f)[0]
    assert text != cv._tree_of("def g(x):\n    return x * 10\n")[0], "f is named by g's source"
    assert text == cv._tree_of("def f(x):\n    return x + 1\n")[0]


SESSION = textwrap.dedent('''
    import importlib, os, sys
    sys.dont_write_bytecode = True
    sys.path.insert(0, {root!r})
    sys.path.insert(0, {d!r})
    from casmon.keys import codeversion as cv
    p = os.path.join({d!r}, "shiftmod.py")
    body = sys.argv[1]
    v0 = "def h(x):\\n    return x - 1\\n\\n\\ndef g(x):\\n    return x * 10\\n\\n\\ndef f(x):\\n    return x + " + body + "\\n"
    v1 = "def g(x):\\n    return x * 10\\n\\n\\ndef f(x):\\n    return x + " + body + "\\n"
    with open(p, "w") as fh:
        fh.write(v0)
    import shiftmod as mod
    cv._function_source(mod.g)
    with open(p, "w") as fh:
        fh.write(v1)
    st = os.stat(p)
    os.utime(p, (st.st_atime, st.st_mtime + 5))
    importlib.reload(mod)
    print(mod.f(1), cv.function_version(mod.f))
''')


def test_two_different_bodies_do_not_share_a_version(tmp_path):
    # Why it matters: a wrong cache hit. Two sessions, each deleting h and reloading; f returns
    # x + 1 in one and x + 2 in the other. Both versions are built from g's text (defect above)
    # and nothing else tells them apart, so the second session is served the first one's results.
    script = tmp_path / "session.py"
    d = tmp_path / "mods"
    d.mkdir()
    script.write_text(SESSION.format(root=ROOT, d=str(d)))
    out = {}
    for body in ("1", "2"):
        r = subprocess.run([sys.executable, str(script), body], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        result, version = r.stdout.split()
        out[body] = (result, version)
    assert out["1"][0] != out["2"][0]  # the functions do differ
    assert out["1"][1] != out["2"][1], "same code version for f(x) = x + 1 and f(x) = x + 2"


def test_a_form_feed_before_def_does_not_hide_the_dead_tail(tmp_path, monkeypatch):
    # Why it matters (lower severity): the module promises the text inspect.getsource names, or
    # every entry misses once after an upgrade. A form feed in a def line's indentation counts as
    # a character for the "next line deeper?" test but resets the column for Python, so the
    # dead `pass` after `return` is taken to be outside the def and dropped from the text.
    path = tmp_path / "ff_mod.py"
    path.write_text("\f\f\f\f\fdef f():\n    return 1\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = importlib.import_module("ff_mod")
    expected = cv._tree_of(inspect.getsource(mod.f))[0]
    cv._code_memo.clear()
    assert cv._function_source(mod.f)[0] == expected


def test_a_stale_file_that_swaps_star_args_for_star_star_kwargs_names_no_version(tmp_path, monkeypatch):
    # Why it matters: ``def f(*a)`` and ``def f(**a)`` with one body compile to the same bytecode,
    # names and constants; only co_flags tell them apart. A file edited from one to the other and
    # not reloaded must not name the running code (the whole-file path has this defect too).
    path = tmp_path / "star_mod.py"
    path.write_text("def f(*a):\n    return len(a)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = importlib.import_module("star_mod")
    _write(path, "def f(**a):\n    return len(a)\n")  # on disk; not reloaded
    cv._code_memo.clear()
    assert cv._function_source(mod.f)[0] is None


def test_a_functions_tracker_is_shared_while_it_lives_and_dropped_when_it_is_collected():
    """The trackers are held as a WeakKeyDictionary holds its values: one per live function, none kept for a
    function that is gone (a fresh process's first hit keeps them without loading weakref.py)."""
    import gc

    def make(n):
        def f(x):
            return x + n
        return f

    fs = [make(i) for i in range(50)]
    before = len(cv._trackers)
    ts = [cv.version_tracker(f) for f in fs]
    assert [cv.version_tracker(f) for f in fs] == ts and len({id(t) for t in ts}) == 50
    assert len(cv._trackers) == before + 50
    del fs, ts
    gc.collect()
    assert len(cv._trackers) == before, "trackers of collected functions were kept"
    assert cv.version_tracker(len) is not None  # not weak-referenceable: a tracker of its own, not kept
