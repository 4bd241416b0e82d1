"""The cache's options in seconds and bytes refuse NaN, infinities and absurd values, naming the option:
``evict``/``eviction_plan`` (``max_size``, ``older_than``) and ``@cache(expires_after=, wait=)``. A NaN limit
compares false with everything (it would evict nothing, or everything); 1e308 seconds overflows the clock a
wait is added to."""

import math

import pytest

import casmon
from tests.support.stores import one_cached_call
from casmon.caching import evict, eviction_plan


@pytest.fixture
def store(tmp_path):
    return one_cached_call(tmp_path / "s")


@pytest.mark.parametrize("kw, name", [({"max_size": math.nan}, "max_size"), ({"max_size": math.inf}, "max_size"),
                                      ({"max_size": 10 ** 400}, "max_size"), ({"max_size": -1}, "max_size"),
                                      ({"older_than": math.nan}, "older_than"), ({"older_than": 1e308}, "older_than")])
def test_eviction_limits_refuse_nan_inf_and_absurd(store, kw, name):
    s = casmon.open(store)
    for fn in (eviction_plan, evict):
        with pytest.raises(ValueError, match=f"{name} must be a finite number"):
            fn(s, **kw)
    s.close()


@pytest.mark.parametrize("kw, words", [({"expires_after": 1e308}, "expires_after="), ({"wait": math.inf}, "wait="),
                                       ({"wait": 1e308}, "wait="), ({"wait": math.nan}, "wait=")])
def test_cache_options_in_seconds_refuse_inf_and_absurd(tmp_path, kw, words):
    with pytest.raises(ValueError, match=words):
        casmon.cache(store=str(tmp_path / "s"), **kw)(lambda x: x)


def test_eviction_limits_take_numpy_numbers(store):
    import numpy as np

    s = casmon.open(store)
    assert eviction_plan(s, max_size=np.int64(1 << 30), older_than=np.float64(3600.0)) == {}
    assert len(eviction_plan(s, max_size=np.int64(0))) == 1
    s.close()
