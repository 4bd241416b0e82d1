"""An argument that hashes differently every time makes every call a miss: the cache says so, naming it."""

import itertools
import warnings

import pytest

import casmon

_counter = itertools.count()


class Fresh:
    """Pickles with a new number each time (as a torch Generator's state or an id-bearing handle do)."""

    def __init__(self, v):
        self.v = v

    def __reduce__(self):
        return (Fresh, (self.v,), {"n": next(_counter)})


def test_an_argument_that_never_hashes_the_same_is_named_in_one_warning(tmp_path):
    s = casmon.open(tmp_path / "s")

    @casmon.cache(store=s)
    def f(a, b):
        return a.v + b

    with pytest.warns(casmon.CacheWarning, match=r"never be a cache hit: parameter 'a' hashes differently"):
        f(Fresh(1), 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", casmon.CacheWarning)
        assert f(Fresh(1), 2) == 3  # said once
    assert f.cache_info().hits == 0


def test_stable_arguments_raise_no_such_warning(tmp_path):
    s = casmon.open(tmp_path / "s")

    @casmon.cache(store=s)
    def f(a, b):
        return a + b

    with warnings.catch_warnings():
        warnings.simplefilter("error", casmon.CacheWarning)
        assert f(1, 2) == 3 and f(2, 3) == 5 and f(1, 2) == 3
    assert f.cache_info().hits == 1
