"""Near-identical values a function can tell apart key differently; keys of common values never change."""

import array
import collections
import ctypes
import datetime
import decimal
import struct
import warnings

import numpy as np
import pandas as pd
import pytest

from casmon.keys.fingerprint import fingerprint

RAW = bytes(range(16))
MD = np.dtype(np.float64, metadata={"unit": "m"})
ALIGNED = np.dtype([("a", "u1"), ("b", "<i4")], align=True)
SAME_OFFSETS = np.dtype({"names": ["a", "b"], "formats": ["u1", "<i4"], "offsets": [0, 4], "itemsize": 8})


def _pairs():
    """(name, a, b): values equal or alike in bytes, that a function sees differently."""
    return [
        ("memoryview format", memoryview(RAW), memoryview(RAW).cast("i")),
        ("memoryview shape", memoryview(RAW).cast("i"), memoryview(RAW).cast("i", (2, 2))),
        ("memoryview read-only or writable", memoryview(RAW), memoryview(bytearray(RAW))),
        ("memoryview strides", memoryview(RAW)[::2], memoryview(RAW[::2])),
        ("memoryview of an int format, read-only or writable",
         memoryview(RAW).cast("i"), memoryview(bytearray(RAW)).cast("i")),
        ("dtype metadata", np.zeros(3, MD), np.zeros(3)),
        ("dtype metadata values", np.zeros(3, MD), np.zeros(3, np.dtype(np.float64, metadata={"unit": "km"}))),
        ("dtype metadata on a field", np.zeros(2, [("x", MD)]), np.zeros(2, [("x", "<f8")])),
        ("dtype metadata on a subarray base", np.zeros(2, [("x", MD, (2,))]), np.zeros(2, [("x", "<f8", (2,))])),
        ("aligned struct flag", np.zeros(2, ALIGNED), np.zeros(2, SAME_OFFSETS)),
        ("record dtype", np.zeros(1, np.dtype((np.record, [("a", "<i4")]))), np.zeros(1, [("a", "<i4")])),
        ("byte order", np.zeros(2, ">i4"), np.zeros(2, "<i4")),
        ("field titles", np.zeros(2, [(("t", "a"), "<i4")]), np.zeros(2, [("a", "<i4")])),
        ("field offsets", np.zeros(1, {"names": ["a"], "formats": ["<i4"], "offsets": [0], "itemsize": 8}),
         np.zeros(1, {"names": ["a"], "formats": ["<i4"], "offsets": [4], "itemsize": 8})),
        ("string dtype or object", np.array(["a", "b"], dtype=np.dtypes.StringDType()), np.array(["a", "b"], dtype=object)),
        ("string dtype NA object", np.array(["a"], dtype=np.dtypes.StringDType(na_object=None)),
         np.array(["a"], dtype=np.dtypes.StringDType())),
        ("datetime unit", np.zeros(1, "M8[s]"), np.zeros(1, "M8[ms]")),
        ("unicode width", np.zeros(1, "U2"), np.zeros(1, "U3")),
        ("recarray", np.rec.array([(1, 2)], dtype=[("a", "<i4"), ("b", "<i4")]), np.array([(1, 2)], dtype=[("a", "<i4"), ("b", "<i4")])),
        ("bytes or bytearray", b"ab", bytearray(b"ab")),
        ("bytes or memoryview", b"ab", memoryview(b"ab")),
        ("array.array typecode", array.array("i", [1, 2]), array.array("I", [1, 2])),
        ("array.array float width", array.array("f", [1.0]), array.array("d", [1.0])),
        ("ctypes array element type", (ctypes.c_int * 2)(1, 2), (ctypes.c_uint * 2)(1, 2)),
        ("categorical ordered flag", pd.Series(pd.Categorical(["a", "b"], ordered=True)),
         pd.Series(pd.Categorical(["a", "b"], ordered=False))),
        ("categorical category order", pd.Series(pd.Categorical(["a"], categories=["a", "b"])),
         pd.Series(pd.Categorical(["a"], categories=["b", "a"]))),
        ("nullable or numpy ints", pd.Series([1, 2], dtype="Int64"), pd.Series([1, 2], dtype="int64")),
        ("zero sign", -0.0, 0.0),
        ("float or numpy float", 1.0, np.float64(1.0)),
        ("str or numpy str", "a", np.str_("a")),
        ("dtype objects with metadata", MD, np.dtype(np.float64)),
        ("dtype objects aligned", ALIGNED, SAME_OFFSETS),
        ("structured scalar of an aligned dtype", np.zeros(1, ALIGNED)[0], np.zeros(1, SAME_OFFSETS)[0]),
        ("deque maxlen", collections.deque([1], maxlen=3), collections.deque([1])),
        ("decimal exponent", decimal.Decimal("1.0"), decimal.Decimal("1.00")),
        ("datetime fold", datetime.datetime(2020, 1, 1, fold=1), datetime.datetime(2020, 1, 1)),
        ("frame column name types", pd.DataFrame({1: [1]}), pd.DataFrame({"1": [1]})),
        ("interval closed side", pd.Series(pd.IntervalIndex.from_breaks([0, 1], closed="left")),
         pd.Series(pd.IntervalIndex.from_breaks([0, 1], closed="right"))),
        ("sparse fill value", pd.Series(pd.arrays.SparseArray([0, 1], fill_value=0)),
         pd.Series(pd.arrays.SparseArray([0, 1], fill_value=1))),
        ("string storage", pd.Series(["a"], dtype="string[python]"), pd.Series(["a"], dtype=object)),
    ]


@pytest.mark.parametrize("name,a,b", _pairs(), ids=[p[0] for p in _pairs()])
def test_near_identical_values_key_differently(name, a, b):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # keying a dtype with metadata no longer leaks numpy's npy-format warning
        assert fingerprint(a) != fingerprint(b), name


def test_equal_dtypes_keep_their_own_keys_in_either_order():
    # Equal dtypes (== and hash) that differ in metadata: a key cached for one is never the other's.
    plain, tagged = np.zeros(2), np.zeros(2, MD)
    first = [fingerprint(plain), fingerprint(tagged)]
    assert [fingerprint(plain), fingerprint(tagged)] == first and first[0] != first[1]
    aligned, unaligned = np.zeros(2, ALIGNED), np.zeros(2, SAME_OFFSETS)
    assert fingerprint(unaligned) != fingerprint(aligned) != fingerprint(np.zeros(2, SAME_OFFSETS))


def test_unpicklable_dtype_metadata_is_named():
    from casmon.errors import UnpicklableError
    import threading

    with pytest.raises(UnpicklableError, match="dtype"):
        fingerprint([np.zeros(1, np.dtype(np.float64, metadata={"lock": threading.Lock()}))])


def test_memoryviews_of_equal_views_key_the_same():
    assert fingerprint(memoryview(RAW).cast("i")) == fingerprint(memoryview(bytes(RAW)).cast("i"))
    assert fingerprint(memoryview(bytearray(RAW))[::2]) == fingerprint(memoryview(bytearray(RAW))[::2])
    big = bytes(200_000)
    assert fingerprint(memoryview(big).cast("d")) != fingerprint(memoryview(big))
    assert fingerprint(memoryview(np.zeros((3, 4)))) == fingerprint(memoryview(np.zeros((3, 4))))
    assert fingerprint(memoryview(np.zeros((4, 3)).T)) != fingerprint(memoryview(np.zeros((3, 4))))  # strides


# Digests of common values computed on the code before views and dtypes counted more: they must not move
# (every stored cache entry of such a value would miss).
PINNED = {
    "int0": "e0a499a430c63fc7f3b8c54d2b212222",
    "int1": "4c11dd1cf13a5a2c286fd547822d66b4",
    "intneg": "4a07631c2b2044e3da1a74ecdfdb004c",
    "intbig": "ee2da3ccacd0275882f8504e6e1a1a07",
    "float": "770487274eba5d21f254a1028442cd27",
    "negzero": "f6b43928ce5e5192820ab6b29963bd6b",
    "nan": "db69bd64fbca60c07afba0d474c15417",
    "str": "b08fc9e7d79cba9198532136980a92e6",
    "str_empty": "85fefc6f12f345b396720846b631026c",
    "bytes": "07d11780facf08922d6c94eedf03ac0c",
    "bytearray": "aa276c56105acc43347a2f5b2b6ce943",
    "none": "626d368fe0e74b4f1a038927df1311d6",
    "true": "1d33c0bd3511c80d20948828081ddcb4",
    "list": "4c94a62b061bf8369dc674ab278ff0dd",
    "tuple": "a9a23b0231cd076d0e592ec12cc4d465",
    "dict": "89b8306c4fa28cfc56a1abe827e9dd05",
    "set": "725480654387385c1bafdf3d6f3497e1",
    "f64": "0bdf6788725dfdb7cb3dfa6da640c791",
    "i64_2d": "7f76f460b471722e267fa0eed9221642",
    "f64_big": "5d198fa7e9b27ceb5ff4ff5bffdd6e63",
    "f32_fortran": "e3050a35f4f079e9a54ddadbb4a22e56",
    "struct": "2c177375b8d413f92f9c755d0731217e",
    "np_scalar": "a103ce5a2a8795e154346ca84df22fb4",
    "u_str": "68f73dbca56f6844619ae5bac227570a",
    "mv_bytes": "65c59cd05149978694cb8203935e2638",
    "frame": "0954170cc6870e60f9be6f780f1919c0",
    "series": "f9b28c8b4f41d43acda139f1464a4e98",
    "cat": "f56a781b6f0c644caffa67551af998c2",
}


def _pinned_values():
    return {
        "int0": 0, "int1": 1, "intneg": -7, "intbig": 2**70, "float": 1.5, "negzero": -0.0, "nan": float("nan"),
        "str": "abc", "str_empty": "", "bytes": b"xyz", "bytearray": bytearray(b"xy"), "none": None, "true": True,
        "list": [1, "a", 2.5], "tuple": (1, 2), "dict": {"a": 1, "b": [2.0, None]}, "set": {1, 2, 3},
        "f64": np.arange(10, dtype=np.float64), "i64_2d": np.arange(6, dtype=np.int64).reshape(2, 3),
        "f64_big": np.linspace(0, 1, 100_000),
        "f32_fortran": np.asfortranarray(np.arange(12, dtype=np.float32).reshape(3, 4)),
        "struct": np.zeros(2, dtype=[("a", "<i4"), ("b", "<f8")]), "np_scalar": np.float64(2.5),
        "u_str": np.array(["ab", "c"]), "mv_bytes": memoryview(b"abcd"),
        "frame": pd.DataFrame({"x": [1, 2, 3], "y": [0.5, 1.5, 2.5]}),
        "series": pd.Series([1.0, 2.0], name="s"), "cat": pd.Series(pd.Categorical(["a", "b"], ordered=True)),
    }


@pytest.mark.parametrize("name", sorted(PINNED))
def test_keys_of_common_values_are_pinned(name):
    assert fingerprint(_pinned_values()[name]).hex() == PINNED[name]


def _view_strategy():
    from hypothesis import strategies as st

    formats = st.sampled_from(["B", "b", "c", "h", "H", "i", "I", "q", "d", "f", "?"])

    @st.composite
    def views(draw):
        fmt = draw(formats)
        size = struct.calcsize(fmt)
        n = draw(st.integers(0, 12))
        raw = draw(st.binary(min_size=n * size, max_size=n * size))
        if fmt == "?":
            raw = bytes(b & 1 for b in raw)
        view = memoryview(raw if draw(st.booleans()) else bytearray(raw)).cast("B").cast(fmt)
        if n and n % 2 == 0 and draw(st.booleans()):
            view = view.cast("B").cast(fmt, (2, n // 2))
        elif n > 1 and draw(st.booleans()):
            view = view[:: draw(st.integers(1, 3))]
        return view

    return views()


def _seen(v):
    return v.format, v.shape, v.c_contiguous, v.c_contiguous or v.strides, v.readonly, v.tobytes()


def test_memoryviews_key_alike_exactly_when_a_function_sees_them_alike():
    from hypothesis import given, settings

    @settings(max_examples=300, deadline=None)
    @given(_view_strategy(), _view_strategy())
    def check(a, b):
        assert (fingerprint(a) == fingerprint(b)) == (_seen(a) == _seen(b))

    check()


def test_memoryviews_come_back_from_their_stored_form_as_they_went_in():
    from hypothesis import given, settings

    from casmon.store.serialize import decode, encode

    @settings(max_examples=300, deadline=None)
    @given(_view_strategy())
    def check(v):
        enc = encode(v)
        back = decode(enc, [np.frombuffer(bytes(p.data), np.uint8).copy() for p in enc.parts])
        assert (back.format, back.shape, back.readonly, back.tobytes(), back.c_contiguous) == \
            (v.format, v.shape, v.readonly, v.tobytes(), True)
        assert (fingerprint(back) == fingerprint(v)) == v.c_contiguous

    check()


def test_padding_bytes_of_structured_values_do_not_count():
    import copy

    inner = np.dtype([("x", "u1"), ("y", "<i8")], align=True)
    padded = [np.dtype([("a", "u1"), ("b", "<i4")], align=True),
              np.dtype({"names": ["a"], "formats": ["<i4"], "offsets": [4], "itemsize": 12}),
              np.dtype([("p", inner), ("q", "u1", (3,))]), np.dtype([("s", inner, (2,))]),
              np.dtype((np.record, np.dtype([("a", "u1"), ("b", "<i4")], align=True)))]
    for dt in padded:
        for n in (1, 3, 200_000):
            a = np.zeros(n, dt)
            twin = copy.deepcopy(a)  # numpy copies fields: its padding is what the new memory held
            assert fingerprint(twin) == fingerprint(a) and fingerprint(twin[0]) == fingerprint(a[0]), dt
            assert fingerprint(np.asfortranarray(np.zeros((2, n), dt))) == fingerprint(np.zeros((2, n), dt))
    # Keys of zero-padded values are the ones they had before padding stopped counting.
    assert fingerprint(np.zeros(5, padded[2])).hex() == "6c7749711c37ae60745f0f88a32c3bfd"
    assert fingerprint(np.zeros(5, padded[2])[0]).hex() == "77ebf03caa9b88146d33318f5cc8e22e"
    big = np.zeros(300_000, padded[2])
    big["p"]["y"] = np.arange(300_000)
    assert fingerprint(big).hex() == "ad9e76b4e5529b4baa4de1b49ddf60d6"
    assert fingerprint(copy.deepcopy(big)) == fingerprint(big)


def test_structured_values_whose_fields_are_out_of_order_or_overlap_key_by_their_layout():
    """numpy has no descriptor for such dtypes (``dt.descr`` raises): they are keyed by each field's name, dtype,
    offset and title, so the same bytes under fields named in another order are another value."""
    ab = np.dtype({"names": ["a", "b"], "formats": ["<i4", "<i4"], "offsets": [4, 0]})
    ba = np.dtype({"names": ["b", "a"], "formats": ["<i4", "<i4"], "offsets": [0, 4]})
    overlap = np.dtype({"names": ["a", "b"], "formats": ["<i4", "<i2"], "offsets": [0, 0]})
    nested = np.dtype([("n", ab), ("s", ba, (2,))])
    x, y = np.zeros(2, ab), np.zeros(2, ba)
    x["a"], x["b"], y["a"], y["b"] = 1, 2, 1, 2
    assert x.tobytes() == y.tobytes() and x.tolist() != y.tolist()
    keys = {fingerprint(x), fingerprint(y), fingerprint(x[0]), fingerprint(y[0]), fingerprint(np.zeros(2, overlap)),
            fingerprint(np.zeros(2, nested)), fingerprint(np.zeros(2, [("a", "<i4"), ("b", "<i4")]))}
    assert len(keys) == 7
    assert fingerprint(x.copy()) == fingerprint(x) and fingerprint(x[::-1][::-1]) == fingerprint(x)


def test_numpy_float_scalars_count_every_nan_as_one_value():
    """As floats do: 0/0 and np.nan differ in their sign bit, which no comparison sees; np.nan keeps its key."""
    with np.errstate(invalid="ignore"):
        computed = np.float64(0.0) / np.float64(0.0)
    assert np.isnan(computed) and np.signbit(computed) != np.signbit(np.float64(np.nan))
    before = "7043c153bf84c6213e6fd37c708d76af"
    for t in (np.float16, np.float32, np.float64):
        assert fingerprint(t(np.nan)) == fingerprint(-t(np.nan)) == fingerprint(t(computed))
    assert fingerprint(np.complex128(complex(np.nan, 1))) == fingerprint(np.complex128(complex(-np.nan, 1)))
    assert fingerprint(np.complex128(complex(np.nan, 1))) != fingerprint(np.complex128(complex(np.nan, 2)))
    assert fingerprint(np.float64(-0.0)) != fingerprint(np.float64(0.0))
    assert fingerprint(np.float64(np.nan)).hex() == before
