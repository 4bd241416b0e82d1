"""Values that equal others in bytes but not to a function (memoryview views, dtype metadata, alignment,
record dtypes) are told apart by the cache and come back from it exactly as they were put."""

import array
import warnings

import numpy as np
import pandas as pd
import pytest

import casmon
from casmon.caching import CacheWarning
from casmon.keys.fingerprint import fingerprint

RAW = bytes(range(48))
MD = np.dtype(np.float64, metadata={"unit": "m"})
ALIGNED = np.dtype([("a", "u1"), ("b", "<i4")], align=True)


@pytest.fixture
def store(tmp_path):
    s = casmon.open(tmp_path / "s", autoflush=None)
    yield s
    s.close()


def _views():
    return {
        "bytes view": memoryview(RAW),
        "writable view": memoryview(bytearray(RAW)),
        "int view": memoryview(RAW).cast("i"),
        "writable 2-d double view": memoryview(bytearray(RAW)).cast("d", (2, 3)),
        "0-d view": memoryview(RAW[:8]).cast("q", []),
        "empty int view": memoryview(b"").cast("i"),
        "bool view": memoryview(bytes([0, 1, 1])).cast("?"),
        "char view": memoryview(b"ab").cast("c"),
        "large writable view": memoryview(bytearray(range(256)) * 1024).cast("H"),
    }


def _seen(v):
    """What a function sees of a memoryview."""
    return (v.format, v.itemsize, v.shape, v.strides, v.readonly, v.c_contiguous, v.tobytes(), v.tolist(), type(v.obj))


def _dtype_facts(dt):
    """A dtype as a function sees it, beyond ``==`` (which ignores metadata and alignment)."""
    fields = [(n, _dtype_facts(dt.fields[n][0]), dt.fields[n][1:]) for n in dt.names or ()]
    base = _dtype_facts(dt.subdtype[0]) if dt.subdtype else None
    return str(dt), dict(dt.metadata or {}), dt.isalignedstruct, dt.type, dt.itemsize, fields, base


def _facts(v):
    """Everything compared of a result: its key, and the dtypes of the arrays in it."""
    if isinstance(v, dict):
        return {k: _facts(x) for k, x in v.items()}
    if isinstance(v, memoryview):
        return _seen(v)
    if isinstance(v, np.ndarray):
        return fingerprint(v), type(v), _dtype_facts(v.dtype), v.shape
    return fingerprint(v)


def _exact_values():
    return {
        "metadata": np.arange(4, dtype=MD),
        "aligned struct": np.zeros(3, ALIGNED),
        "record dtype": np.zeros(2, np.dtype((np.record, [("a", "<i4"), ("b", "<f8")]))),
        "metadata on a field": np.zeros(2, [("x", MD), ("y", "<i2")]),
        "big-endian": np.arange(5, dtype=">i4"),
        "strided with metadata": np.arange(40_000, dtype=MD)[::2],
        "string dtype": np.array(["a", "bc"], dtype=np.dtypes.StringDType()),
        "arrays in a dict": {"m": np.arange(3, dtype=MD), "al": np.zeros(2, ALIGNED), "view": memoryview(RAW).cast("i"),
                             "strided": np.arange(40_000, dtype=MD)[::2], "plain strided": np.arange(40_000.0)[::2]},
        "array.array": array.array("I", [1, 2, 3]),
        "ordered categorical": pd.Series(pd.Categorical(["b", "a"], categories=["b", "a"], ordered=True)),
    }


@pytest.mark.parametrize("name", sorted(_views()))
def test_a_memoryview_result_is_stored_and_a_hit_returns_the_same_view(store, name):
    calls = []

    @casmon.cache(store=store)
    def make(which):
        calls.append(which)
        return _views()[which]

    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)  # stored, not "returned but not cached"
        first = make(name)
        again = make(name)
    assert calls == [name] and _seen(again) == _seen(first) == _seen(_views()[name])
    if not again.readonly:
        again.obj[0] ^= 1  # writable over its own bytes: the stored value is not touched
        assert make(name).obj[0] == _views()[name].obj[0]


def test_a_strided_memoryview_result_comes_back_with_its_format_shape_and_values(store):
    @casmon.cache(store=store)
    def every_other(n):
        return memoryview(bytearray(range(n))).cast("h")[::2]

    first, again = every_other(40), every_other(40)
    assert (again.format, again.shape, again.readonly, again.tolist()) == (first.format, first.shape, False, first.tolist())


def test_memoryviews_over_the_same_bytes_are_different_calls(store):
    calls = []

    @casmon.cache(store=store)
    def describe(view):
        calls.append(1)
        return view.format, view.shape, view.readonly

    buf = bytearray(RAW)
    got = [describe(memoryview(RAW)), describe(memoryview(RAW).cast("i")), describe(memoryview(RAW).cast("i", (3, 4))),
           describe(memoryview(buf)), describe(memoryview(RAW)[::2])]
    assert got == [("B", (48,), True), ("i", (12,), True), ("i", (3, 4), True), ("B", (48,), False), ("B", (24,), True)]
    assert describe(memoryview(bytes(RAW)).cast("i")) == ("i", (12,), True) and len(calls) == 5, "an equal view hits"


def test_dtype_metadata_and_alignment_are_different_calls(store):
    calls = []

    @casmon.cache(store=store)
    def unit_of(a):
        calls.append(1)
        return (a.dtype.metadata or {}).get("unit"), a.dtype.isalignedstruct

    same_offsets = np.dtype({"names": ["a", "b"], "formats": ["u1", "<i4"], "offsets": [0, 4], "itemsize": 8})
    assert unit_of(np.zeros(2)) == (None, False)
    assert unit_of(np.zeros(2, MD)) == ("m", False)
    assert unit_of(np.zeros(2, np.dtype(np.float64, metadata={"unit": "km"}))) == ("km", False)
    assert unit_of(np.zeros(2, same_offsets)) == (None, False)
    assert unit_of(np.zeros(2, ALIGNED)) == (None, True)
    assert unit_of(np.zeros(2, MD)) == ("m", False) and len(calls) == 5


@pytest.mark.parametrize("name", sorted(_exact_values()))
def test_results_round_trip_exactly_through_put_get_and_hits(store, tmp_path, name):
    value = _exact_values()[name]
    want = _facts(value)
    assert _facts(store.get(store.put(value))) == want, "put/get"
    calls = []

    @casmon.cache(store=store)
    def make(which):
        calls.append(1)
        return _exact_values()[which]

    assert _facts(make(name)) == want and _facts(make(name)) == want and calls == [1]
    store.flush()
    with casmon.open(tmp_path / "s") as fresh:
        assert _facts(fresh.get(store.put(value))) == want, "read by another handle"


def test_a_crafted_memoryview_manifest_is_damage_not_a_crash(store):
    from casmon.errors import DamagedObjectError
    from casmon.store.serialize import Encoded, decode

    for meta in ({"format": "T{i:a:}", "shape": [1], "readonly": True}, {"format": "i", "shape": [3], "readonly": True},
                 {"format": "i", "shape": "x", "readonly": True}, {"format": "i", "shape": [1]}):
        enc = Encoded("handler", {"handler": "memoryview", "meta": meta})
        with pytest.raises(DamagedObjectError):
            decode(enc, [np.zeros(4, np.uint8)])


def test_a_stored_memoryview_loads_from_an_untrusted_store(tmp_path):
    from casmon.errors import UntrustedStoreError

    with casmon.open(tmp_path / "s") as s:
        view, tagged = s.put(memoryview(bytearray(RAW)).cast("h")), s.put(np.zeros(3, MD))
    with casmon.open(tmp_path / "s", trust=False) as untrusted:
        back = untrusted.get(view)
        assert (back.format, back.readonly, back.tobytes()) == ("h", False, RAW)
        with pytest.raises(UntrustedStoreError):  # pickled to keep its metadata: loads only where trusted
            untrusted.get(tagged)
