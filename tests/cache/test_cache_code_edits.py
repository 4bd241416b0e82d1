"""Code a cached function reaches that can change without a new function object: a metaclass's
methods, and defaults reassigned in the process (``helper.__defaults__ = ...``). Each edit misses;
none is served the result of the code as it was."""

import importlib
import sys
import textwrap
import uuid

import pytest

import casmon

pytestmark = pytest.mark.filterwarnings("ignore::casmon.caching.CacheWarning")  # each edit says what changed

SOURCE = textwrap.dedent('''
    class Meta(type):
        def __call__(cls, *args, **kwargs):
            obj = type.__call__(cls, *args, **kwargs)
            obj.scale = 2
            return obj


    def call_by_three(cls, *args, **kwargs):
        obj = type.__call__(cls, *args, **kwargs)
        obj.scale = 3
        return obj


    class Model(metaclass=Meta):
        def __init__(self, x):
            self.x = x


    def build(x):
        m = Model(x)
        return m.x * m.scale




    def helper(x, k=2):
        return x * k


    def kw_helper(x, *, k=2):
        return x * k


    def uses_helper(x):
        return helper(x)


    def uses_kw_helper(x):
        return kw_helper(x)


    def own(x, k=2, *, j=1):
        return x * k + j
''')


@pytest.fixture
def mod(tmp_path, monkeypatch):
    name = f"code_edits_{uuid.uuid4().hex[:12]}"
    (tmp_path / f"{name}.py").write_text(SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    m = importlib.import_module(name)
    yield m
    sys.modules.pop(name, None)


def test_editing_a_metaclass_call_invalidates(mod, tmp_path):
    f = casmon.cache(mod.build, store=str(tmp_path / "s"))
    assert f(5) == 10
    mod.Meta.__call__.__code__ = mod.call_by_three.__code__
    assert f(5) == 15
    assert f.__casmon_cache__.misses == 2




def test_a_helpers_defaults_reassigned_in_the_process_are_seen(mod, tmp_path):
    f = casmon.cache(mod.uses_helper, store=str(tmp_path / "s"))
    assert f(3) == 6
    assert f(3) == 6
    mod.helper.__defaults__ = (5,)
    assert f(3) == 15
    mod.helper.__defaults__ = (2,)  # an equal tuple, another object: the version is the first one's again
    assert f(3) == 6
    assert f.__casmon_cache__.misses == 2


def test_a_helpers_keyword_defaults_reassigned_in_the_process_are_seen(mod, tmp_path):
    f = casmon.cache(mod.uses_kw_helper, store=str(tmp_path / "s"))
    assert f(3) == 6
    mod.kw_helper.__kwdefaults__ = {"k": 7}
    assert f(3) == 21
    mod.kw_helper.__kwdefaults__ = None
    with pytest.raises(TypeError):
        f(3)  # k has no value now: the call fails as the function does, never a stale hit


@pytest.mark.parametrize("pinned", [None, "1"])
def test_the_cached_functions_own_defaults_reassigned_key_its_calls(mod, tmp_path, pinned):
    f = casmon.cache(mod.own, store=str(tmp_path / "s"), version=pinned)
    assert f(3) == 7
    mod.own.__defaults__ = (5,)
    assert f(3) == 16
    assert f(3, 2) == 7  # keyed by the argument given, not by the default it had when computed
    assert f(3, 5) == 16
    mod.own.__kwdefaults__ = {"j": 0}
    assert f(3) == 15
    assert f(3, 5, j=1) == 16
