"""The code version's source text, found without tokenizing (``codeversion._def_block``).

A first cache hit in a fresh process reads its function's source; ``inspect.getsource``
tokenizes for it, and on Python 3.11 the tokenizer's first use costs 4-5 ms. casmon finds
the ``def`` from the code's own line table instead. It must name exactly what
``inspect.getsource`` names, or every cache entry would miss once after an upgrade; where it
cannot be sure, it must step aside.
"""

import importlib
import inspect
import textwrap
import types

import pytest

from casmon.keys import codeversion as cv

MODULES = ["casmon.caching.memoize", "casmon.store.store", "casmon.store.table", "casmon.cli.app", "casmon.keys.codeversion", "json.decoder",
           "textwrap", "inspect", "argparse", "dataclasses", "tests.test_cache_truth", "tests.conftest"]


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
    assert cv._block_compiles_to(["def f(a):\n", "    return a + 1\n"], mod.f.__code__)
    assert not cv._block_compiles_to(["def f(a):\n", "    return a + 2\n"], mod.f.__code__)


def test_a_closure_and_mangled_names_are_left_to_the_whole_file():
    def outer():
        k = 3

        def inner(a):
            return a + k
        return inner

    inner = outer()
    block, _ = cv._def_block(inner.__code__)
    assert not cv._block_compiles_to(block, inner.__code__)  # a free variable: unsure alone
    cv._code_memo.clear()
    assert cv._function_source(inner)[0] is not None  # the whole file confirms it

    class A:
        def m(self):
            return self.__secret

    block, _ = cv._def_block(A.m.__code__)
    assert not cv._block_compiles_to(textwrap.dedent("".join(block)).splitlines(True), A.m.__code__)
    cv._code_memo.clear()
    assert cv._function_source(A.m)[0] is not None
