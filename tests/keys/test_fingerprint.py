import copy
import dataclasses
import math
import pickle
import threading

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import casmon
from casmon import Digest, fingerprint
from tests.conftest import run_python

fp = fingerprint


def test_digest_is_16_bytes_and_prints_hex():
    d = fp(1)
    assert isinstance(d, Digest) and len(d) == 16
    assert str(d) == d.hex() and len(str(d)) == 32
    assert Digest(str(d)) == d
    with pytest.raises(ValueError, match="32 hex digits"):
        Digest("xyz")
    with pytest.raises(ValueError):
        Digest(b"short")


def test_types_are_tagged():
    values = [1, 1.0, True, "1", b"1", bytearray(b"1"), (1,), [1], {1}, frozenset({1}), None, 1 + 0j, np.int64(1), np.float64(1)]
    assert len({fp(v) for v in values}) == len(values)


def test_containers_are_structural():
    assert fp((1, 2)) != fp([1, 2])
    assert fp([[1], 2]) != fp([1, [2]])
    assert fp(("ab", "c")) != fp(("a", "bc"))
    assert fp({"a": 1, "b": 2}) != fp({"b": 2, "a": 1}), "dict order is part of the value"
    assert fp({"a": 1, "b": 2}) == fp(dict([("a", 1), ("b", 2)]))
    assert fp({3, 1, 2}) == fp({1, 2, 3})
    assert fp(frozenset("abc")) == fp(frozenset("cba"))


def test_floats():
    assert fp(float("nan")) == fp(float("nan")) == fp(-float("nan"))
    assert fp(0.0) != fp(-0.0)
    assert fp(math.inf) != fp(-math.inf)
    assert fp(0.1 + 0.2) != fp(0.3)


def test_big_ints():
    assert fp(2**64) != fp(2**64 + 1)
    assert fp(-(2**200)) != fp(2**200)
    assert fp(2**63 - 1) != fp(2**63)


def test_arrays_by_dtype_shape_and_content():
    a = np.arange(12, dtype=np.float64).reshape(3, 4)
    assert fp(a) == fp(a.copy())
    assert fp(a) != fp(a.astype(np.float32))
    assert fp(a) != fp(a.reshape(4, 3))
    assert fp(a) != fp(a.reshape(12))
    b = a.copy()
    b[1, 2] += 1e-12
    assert fp(a) != fp(b)


def test_large_arrays_differing_in_one_middle_element_do_not_collide():
    # FineCache keys on repr(), which elides the middle of large arrays.
    a = np.zeros(10_000)
    b = a.copy()
    b[5_000] = 1
    assert repr(a) == repr(b)
    assert fp(a) != fp(b)


def test_memory_order_and_views_do_not_matter():
    a = np.random.default_rng(0).random((300, 200))
    f = np.asfortranarray(a)
    assert f.flags.f_contiguous and not f.flags.c_contiguous
    assert fp(a) == fp(f)
    view = a[::3, 5:150:2]
    assert not view.flags.c_contiguous
    assert fp(view) == fp(view.copy())
    assert fp(a.T) == fp(np.ascontiguousarray(a.T))
    big = np.random.default_rng(1).random((3000, 700))  # over the 8 MiB block size
    assert fp(np.asfortranarray(big)) == fp(big)


def test_zero_dim_empty_and_special_dtypes():
    assert fp(np.array(3.0)) != fp(np.array([3.0]))
    assert fp(np.zeros((0, 3))) != fp(np.zeros((3, 0)))
    dt = np.dtype([("x", "<i4"), ("y", "<f8")])
    s = np.zeros(4, dtype=dt)
    s2 = s.copy()
    s2["y"][2] = 1
    assert fp(s) != fp(s2)
    assert fp(np.array(["a", "b"])) != fp(np.array(["a", "c"]))
    assert fp(np.arange(3).astype("M8[s]")) != fp(np.arange(3).astype("M8[ms]"))


def test_object_arrays_hash_their_elements():
    a = np.array([{"a": 1}, "x", None], dtype=object)
    b = np.array([{"a": 1}, "x", None], dtype=object)
    assert fp(a) == fp(b)
    b[0] = {"a": 2}
    assert fp(a) != fp(b)


@dataclasses.dataclass
class Point:
    x: float
    y: np.ndarray


class Plain:
    def __init__(self, data, tags):
        self.data = data
        self.tags = tags


def test_dataclasses_and_objects():
    assert fp(Point(1.0, np.arange(3))) == fp(Point(1.0, np.arange(3)))
    assert fp(Point(1.0, np.arange(3))) != fp(Point(1.0, np.arange(4)))
    # Objects with the default repr (addresses) hash by content, not address.
    o1, o2 = Plain(np.ones(100_000), {"b", "a"}), Plain(np.ones(100_000), {"a", "b"})
    assert repr(o1) != repr(o2)
    assert fp(o1) == fp(o2)
    o2.data[50_000] = 2
    assert fp(o1) != fp(o2)


def test_recursive_structures():
    a = [1]
    a.append(a)
    b = [1]
    b.append(b)
    assert fp(a) == fp(b)
    c = [2]
    c.append(c)
    assert fp(a) != fp(c)
    d = {"k": None}
    d["k"] = d
    fp(d)


def test_unpicklable_error_names_the_path():
    with pytest.raises(TypeError, match=r"value\[1\]\['f'\]: function .*<lambda>"):
        fp([1, {"f": lambda x: x}])
    with pytest.raises(casmon.UnpicklableError, match=r"value\['a'\]\[1\]: _thread.lock"):
        fp({"a": [1, threading.Lock()]})
    with pytest.raises(TypeError, match=r"\.lock"):
        fp(Plain(1, threading.Lock()))


class Custom:
    def __init__(self, key, noise):
        self.key = key
        self.noise = noise


def test_register_hasher():
    try:
        casmon.register_hasher(Custom, lambda c: c.key)
        assert fp(Custom("a", 1)) == fp(Custom("a", 2))
        assert fp(Custom("a", 1)) != fp(Custom("b", 1))
        assert fp(Custom("a", 1)) != fp("a"), "tagged with the type"
        assert fp([Plain(Custom("a", 1), set())]) == fp([Plain(Custom("a", 9), set())]), "used inside pickled objects too"
    finally:
        casmon.unregister_hasher(Custom)
    assert fp(Custom("a", 1)) != fp(Custom("a", 2))
    with pytest.raises(TypeError):
        casmon.register_hasher("notatype", len)


def test_pandas():
    pd = pytest.importorskip("pandas")
    df = pd.DataFrame({"x": [1, 2, 3], "y": ["a", "b", "c"]})
    assert fp(df) == fp(df.copy())
    assert fp(df) != fp(df.assign(y=["a", "b", "d"]))
    assert fp(df) != fp(df.rename(columns={"x": "z"}))
    assert fp(df) != fp(df.set_index("y"))
    assert fp(df["x"]) != fp(df["x"].astype("float64"))
    assert fp(pd.Index([1, 2])) != fp(pd.Index([2, 1]))


def test_stable_across_processes_and_hash_seeds():
    code = (
        "import numpy as np, casmon, sys\n"
        "v = [{'a': {'x', 'y', 'z'}, 'b': np.arange(10.)}, frozenset({'p', 'q'}), 'é', 2**70, 1.5]\n"
        "print(casmon.fingerprint(v))\n"
    )
    outs = {run_python(code, env={"PYTHONHASHSEED": str(seed)}).stdout.strip() for seed in (1, 2, 3)}
    assert len(outs) == 1
    v = [{"a": {"x", "y", "z"}, "b": np.arange(10.0)}, frozenset({"p", "q"}), "é", 2**70, 1.5]
    assert outs == {str(fp(v))}


json_like = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text() | st.binary(),
    lambda children: st.lists(children) | st.tuples(children, children) | st.dictionaries(st.text(), children),
    max_leaves=30,
)


@settings(max_examples=200, deadline=None)
@given(json_like)
def test_equal_values_hash_equal(v):
    assert fp(v) == fp(copy.deepcopy(v))
    assert fp(v) == fp(pickle.loads(pickle.dumps(v)))


@settings(max_examples=200, deadline=None)
@given(json_like, json_like)
def test_different_values_hash_different(a, b):
    if fp(a) == fp(b):
        assert pickle.dumps(a) == pickle.dumps(b) or repr(a) == repr(b)


def test_local_classes_and_functions():
    class Local:
        def __init__(self, v):
            self.v = v

    assert fp(Local(1)) == fp(Local(1)) != fp(Local(2))
    assert fp(len) == fp(len) != fp(abs)
    assert fp(np.log) != fp(np.exp)
    assert fp(Point) != fp(Plain)
    with pytest.raises(TypeError, match="lambda"):
        fp(lambda: 1)

    def inner():
        pass

    with pytest.raises(TypeError, match="locals"):
        fp(inner)


def test_numbers_pack_as_struct_packs_them_though_a_hit_loads_no_struct():
    """The key's number encodings are int.to_bytes and a memoryview's cast, byte for byte what struct gave."""
    import struct

    from casmon.keys import fingerprint as fpm

    floats = [0.0, -0.0, 1.5, -2.25e-310, 5e-324, 1.7976931348623157e308, float("inf"), float("-inf"), 1 / 3]
    floats += [struct.unpack("<d", bytes.fromhex(h))[0] for h in ("010000000000f87f", "ffffffffffffffff")]  # NaN payloads
    for v in floats:
        assert fpm._pack_d(v) == struct.pack("<d", v)
    assert fpm._pack_dd(1.25, -0.0) == struct.pack("<dd", 1.25, -0.0)
    for v in (0, 1, -1, (1 << 63) - 1, -(1 << 63), True):
        assert fpm._pack_q(v) == struct.pack("<q", v)
    for v in (0, 1, 255, (1 << 64) - 1):
        assert fpm._pack_Q(v) == struct.pack("<Q", v)
    np = pytest.importorskip("numpy")
    assert fpm._pack_Q(np.int64(7)) == struct.pack("<Q", 7) and fpm._pack_q(np.intp(-3)) == struct.pack("<q", -3)
