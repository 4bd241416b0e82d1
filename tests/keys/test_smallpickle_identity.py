"""A small mutable value of builtins (a keyword-only default's dict, a constant list) is checked by the identity
of what its containers hold: any change to it is seen, and the check loads no pickle module."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from casmon.keys import smallpickle
from casmon.keys.smallpickle import pickle_matches, small_pickle
from tests.support.processes import ENV


def _value():
    inner = [1, 2.5]
    return {"a": inner, "b": (inner, {"k": bytearray(b"xy")}), "c": {1, 2}, "d": [None, "s", b"b", (3, (4,))]}


CHANGES = [
    lambda v: v["a"].append(3),
    lambda v: v["a"].__setitem__(0, 1000),  # an equal-looking change of one item
    lambda v: v["b"][1]["k"].__setitem__(0, 0),  # a bytearray inside a dict inside a tuple
    lambda v: v["b"][1].__setitem__("k2", 1),
    lambda v: v["c"].add(3),
    lambda v: v.__setitem__("e", 1),
    lambda v: v.pop("a"),
    lambda v: v["d"].__setitem__(3, (3, (5,))),
    lambda v: v.__setitem__("a", list(v["a"])),  # an equal list, another object: counted as a change
]


@pytest.mark.parametrize("change", range(len(CHANGES)))
def test_any_change_to_a_small_builtin_value_is_seen(change):
    v = _value()
    pk = small_pickle(v)
    assert pk is not None and not isinstance(pk, bytes), "a small builtin value is checked by identity"
    assert pickle_matches(v, pk)
    CHANGES[change](v)
    assert not pickle_matches(v, pk)


class Obj:
    pass


def test_a_value_with_other_objects_or_many_containers_is_pickled():
    assert isinstance(small_pickle([1, Obj()]), bytes)
    big = [[i] for i in range(smallpickle.IDENTITY_CHECK_LIMIT + 1)]
    assert isinstance(small_pickle(big), bytes)
    assert pickle_matches(big, small_pickle(big))


def test_a_recursive_builtin_value_is_checked_and_ends():
    v: list = [1]
    v.append(v)
    pk = small_pickle(v)
    assert pickle_matches(v, pk)
    v.append(2)
    assert not pickle_matches(v, pk)


def test_checking_a_small_builtin_value_loads_no_pickle_module():
    code = textwrap.dedent("""
        import json, sys
        from casmon.keys.smallpickle import pickle_matches, small_pickle
        v = ((2,), {"offset": 1})
        ok = pickle_matches(v, small_pickle(v))
        print(json.dumps([ok, [m for m in ("pickle", "_pickle", "casmon.keys.cpickle") if m in sys.modules]]))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "[true, []]"
