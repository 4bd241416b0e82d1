"""A Flag combination or a ``_missing_`` value made at run time is not an edit of the enum.

Python caches each new Flag combination (``F.B | F.C``) and each member ``_missing_`` makes in the
enum's ``_value2member_map_``. That cache is not the enum's code: a cached function over the enum
keeps its hits when a new combination appears, and an edit to the enum's code still misses.
"""

import importlib
import sys

import casmon
from tests.support import deadline

DEADLINE = 120.0

SOURCE = '''
import enum


class F(enum.IntFlag):
    A = 1
    B = 2
    C = 4
    D = 8

    def weight(self):
        return 1


class S(enum.Enum):
    X = 1

    @classmethod
    def _missing_(cls, v):
        m = object.__new__(cls)
        m._value_ = v
        m._name_ = f"dyn{v}"
        return cls._value2member_map_.setdefault(v, m)


def f(x):
    return int(x) * x.weight()


def g(x):
    return x.value * 2
'''


def within(fn, *args, **kwargs):
    return deadline.within(DEADLINE, fn, *args, **kwargs)


def load(tmp_path, monkeypatch):
    name = f"pseudo_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(sys.modules, name, None)  # the test's end removes the module it imports
    del sys.modules[name]
    mod = importlib.import_module(name)
    return mod


def test_new_flag_combinations_leave_the_cached_entries_hitting(tmp_path, monkeypatch):
    mod = load(tmp_path, monkeypatch)
    f = casmon.cache(mod.f, store=str(tmp_path / "s"))
    F = mod.F
    assert within(f, F.A | F.B) == 3
    assert within(f, F.A | F.C) == 5  # a new combination: Python caches it in the enum
    mod.F.B | mod.F.D  # another, made elsewhere
    assert within(f, F.A | F.B) == 3
    assert within(f, F.A | F.C) == 5
    assert (f.__casmon_cache__.misses, f.__casmon_cache__.hits) == (2, 2)
    F.weight.__code__ = (lambda self: 2).__code__
    assert within(f, F.A | F.B) == 6  # an edit of the enum's code still misses
    assert f.__casmon_cache__.misses == 3


def test_members_made_by_missing_leave_the_cached_entries_hitting(tmp_path, monkeypatch):
    mod = load(tmp_path, monkeypatch)
    g = casmon.cache(mod.g, store=str(tmp_path / "s"))
    assert within(g, mod.S.X) == 2
    mod.S(7)
    mod.S(9)
    assert within(g, mod.S.X) == 2
    assert (g.__casmon_cache__.misses, g.__casmon_cache__.hits) == (1, 1)
