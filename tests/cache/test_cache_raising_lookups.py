"""User objects whose attribute lookups raise never break a cached call.

An attribute-dict config (``__getattr__`` that reads ``self._d[name]`` and so raises KeyError),
a metaclass whose ``__getattribute__`` raises, a ``__wrapped__`` that raises: the code-version
walk asks such objects for ``__wrapped__``, ``__class__``, ``__dict__``. The walk counts what it
cannot read by type and goes on: the call returns its value, the second call hits, and an edit
to code the walk could read still misses. Calls run in a thread with a deadline.
"""

import importlib
import sys
import warnings

import pytest

import casmon
from tests.support import deadline

DEADLINE = 120.0

SOURCES = {
    "an attribute-dict global whose __getattr__ raises KeyError": '''
class Cfg:
    def __init__(self, **kw):
        self.__dict__["_d"] = kw
    def __getattr__(self, n):
        return self._d[n]
    def __call__(self, x):
        return x + self._d["a"]
cfg = Cfg(a=1)
class K:
    def m(self):
        return 1
def f(x):
    return cfg(x) + K().m() - 1
''',
    "a class attribute whose __getattr__ raises KeyError": '''
class Cfg:
    def __init__(self, **kw):
        self.__dict__["_d"] = kw
    def __getattr__(self, n):
        return self._d[n]
    def __call__(self, x):
        return x
class K:
    C = Cfg(a=1)
    def m(self):
        return 1
def f(x):
    return x + K.C.a + K().m() - 1
''',
    "a metaclass whose __getattribute__ raises": '''
class Meta(type):
    def __getattribute__(cls, name):
        if name in ("__name__", "__qualname__", "__module__"):
            return type.__getattribute__(cls, name)
        raise RuntimeError("no attribute " + name)
class Odd(metaclass=Meta):
    pass
class K:
    def m(self):
        return 1
def f(x):
    return x + (Odd is not None) + K().m() - 1
''',
    "a __wrapped__ that raises": '''
class W:
    @property
    def __wrapped__(self):
        raise RuntimeError("no")
    def __call__(self, x):
        return x + 1
w = W()
class K:
    def m(self):
        return 1
    helper = W()
def f(x):
    return w(x) + K().m() - 1
''',
}


def within(fn, *args, **kwargs):
    return deadline.within(DEADLINE, fn, *args, **kwargs)


@pytest.mark.parametrize("case", list(SOURCES))
def test_a_user_object_whose_lookups_raise_does_not_break_the_cached_call(case, tmp_path, monkeypatch):
    name = f"raising_{list(SOURCES).index(case)}_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(SOURCES[case])
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(sys.modules, name, None)  # the test's end removes the module it imports
    del sys.modules[name]
    mod = importlib.import_module(name)
    f = casmon.cache(mod.f, store=str(tmp_path / "s"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # what cannot be read may be named in a warning
        assert within(f, 1) == 2
        assert within(f, 1) == 2
        assert (f.__casmon_cache__.misses, f.__casmon_cache__.hits) == (1, 1)
        mod.K.m.__code__ = (lambda self: 2).__code__
        assert within(f, 1) == 3
        assert f.__casmon_cache__.misses == 2


LAZY_SOURCE = '''
import sys
import types


class Thing:
    def m(self):
        return 1


lazy = types.ModuleType("{lazy}")
lazy.__getattr__ = lambda name: Thing()  # PEP 562: every name answered, __file__ too
sys.modules["{lazy}"] = lazy


class K:
    def m(self):
        return 1


def f(x):
    import {lazy}
    return {lazy}.anything.m() + x + K().m() - 1
'''


@pytest.mark.filterwarnings("ignore::casmon.caching.CacheWarning")
def test_a_module_whose_getattr_answers_every_name_does_not_break_the_cached_call(tmp_path, monkeypatch):
    name = f"lazyuser_{tmp_path.name.replace('-', '_')}"
    lazy = name + "_lazy"
    (tmp_path / f"{name}.py").write_text(LAZY_SOURCE.format(lazy=lazy))
    monkeypatch.syspath_prepend(str(tmp_path))
    for n in (name, lazy):
        monkeypatch.setitem(sys.modules, n, None)  # the test's end removes the modules it imports
        del sys.modules[n]
    mod = importlib.import_module(name)
    f = casmon.cache(mod.f, store=str(tmp_path / "s"))
    assert within(f, 1) == 2
    assert within(f, 1) == 2
    assert (f.__casmon_cache__.misses, f.__casmon_cache__.hits) == (1, 1)
    mod.K.m.__code__ = (lambda self: 2).__code__
    assert within(f, 1) == 3


UNHASHABLE_SOURCE = '''
class Meta(type):
    __hash__ = None

    def __eq__(cls, other):
        raise RuntimeError("no comparing classes")


class K(metaclass=Meta):
    def __init__(self, i):
        self.i = i

    def m(self):
        return self.i


K.ME = K(0)


def f(x, d=K.ME):
    return x.m() + d.m() + 1
'''


@pytest.mark.filterwarnings("ignore::casmon.caching.CacheWarning")
def test_an_argument_whose_class_cannot_be_hashed_does_not_break_the_cached_call(tmp_path, monkeypatch):
    name = f"unhashable_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(UNHASHABLE_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(sys.modules, name, None)  # the test's end removes the module it imports
    del sys.modules[name]
    mod = importlib.import_module(name)
    f = casmon.cache(mod.f, store=str(tmp_path / "s"))
    assert within(f, mod.K(2)) == 3
    assert within(f, mod.K(2)) == 3
    assert within(f, mod.K(3), mod.K(4)) == 8
