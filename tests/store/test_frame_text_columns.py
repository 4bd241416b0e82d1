"""DataFrames with text, categorical, nullable and zoned columns are stored as column arrays (not one pickle) and
come back exactly (casmon/store/libraries/columns.py, strings.py)."""

import numpy as np
import pandas as pd
import pytest

import casmon
from casmon.errors import DamagedObjectError
from casmon.store import serialize

from tests.store.test_frame_values import _exactly, _round_trip


def _obj(values):
    return pd.Series(values, dtype=object)


STORED = {
    "object-str": lambda: pd.DataFrame({"name": _obj([f"n{i}" for i in range(5)]), "x": np.arange(5.0)}),
    "str": lambda: pd.DataFrame({"s": ["a", "bé", None, ""]}),  # pandas 3's default text dtype, NaN missing
    "str-python": lambda: pd.DataFrame({"s": pd.array(["a", None], dtype=pd.StringDtype("python", na_value=np.nan))}),
    "string-python": lambda: pd.DataFrame({"s": pd.array(["a", None, "c"], dtype="string[python]")}),
    "string-pyarrow": lambda: pd.DataFrame({"s": pd.array(["a", None, "c"], dtype="string[pyarrow]")}),
    "odd-text": lambda: pd.DataFrame({"s": _obj(["", "\x00", "a\x00b", "😀𝄞", "\U0010ffff", "é" * 3])}),
    "category": lambda: pd.DataFrame({"c": pd.Categorical(["a", "b", None, "a"], categories=["b", "a", "z"])}),
    "category-ordered-int": lambda: pd.DataFrame({"c": pd.Categorical([3, 1, 3], categories=[3, 1, 2], ordered=True)}),
    "category-object": lambda: pd.DataFrame({"c": pd.Categorical(_obj(["x", "y"]), categories=pd.Index(["y", "x"], dtype=object))}),
    "category-dates": lambda: pd.DataFrame({"c": pd.Categorical(pd.to_datetime(["2020-01-01", "2021-01-01"]))}),
    "Int64": lambda: pd.DataFrame({"i": pd.array([1, None, 3], dtype="Int64"), "u": pd.array([None, 2, 3], dtype="UInt8")}),
    "boolean": lambda: pd.DataFrame({"b": pd.array([True, None, False], dtype="boolean")}),
    "Float64": lambda: pd.DataFrame({"f": pd.array([1.5, None, -0.0], dtype="Float64"),
                                     "g": pd.array([0.0, 1.0, 2.0], dtype="Float32") / pd.array([0.0, 1.0, 1.0], dtype="Float32")}),
    "tz": lambda: pd.DataFrame({"t": pd.date_range("2020-03-29", periods=5, freq="h", tz="Europe/Paris")}),
    "tz-nat": lambda: pd.DataFrame({"t": pd.to_datetime(["2020-01-01", None]).tz_localize("UTC")}),
    "str-index": lambda: pd.DataFrame({"x": [1, 2]}, index=pd.Index(["r1", "r2"], name="row")),
    "object-str-index": lambda: pd.DataFrame({"x": [1, 2]}, index=pd.Index(["r1", "r2"], dtype=object)),
    "categorical-index": lambda: pd.DataFrame({"x": [1, 2]}, index=pd.CategoricalIndex(["a", "b"])),
    "tz-index": lambda: pd.DataFrame({"x": [1, 2]}, index=pd.date_range("2020", periods=2, tz="UTC", freq="D")),
    "one-row": lambda: pd.DataFrame({"s": _obj(["only"]), "c": pd.Categorical(["k"])}),
    "no-rows": lambda: pd.DataFrame({"s": _obj([]), "t": pd.Series([], dtype="str"), "c": pd.Categorical([])}),
    "zarr-like-names": lambda: pd.DataFrame({"a/b": ["x"], "..": ["y"], "zarr.json": ["z"], "index": ["i"], "c": ["w"]}),
    "series": lambda: pd.Series(["a", "b"], name="s"),
    "str-in-pieces": lambda: pd.DataFrame({"s": pd.concat([pd.Series(["a", "b"]), pd.Series(["c", None])],
                                                          ignore_index=True)}),
    "string-pyarrow-sliced": lambda: pd.DataFrame({"s": pd.concat(
        [pd.Series(["a", "bb"], dtype="string[pyarrow]"), pd.Series(["c", None], dtype="string[pyarrow]")],
        ignore_index=True)[1:].reset_index(drop=True)}),
    "multiindex": lambda: pd.DataFrame({"x": [1, 2]}, index=pd.MultiIndex.from_tuples([(1, 2), (3, 4)])),
    "multiindex-text-tz": lambda: pd.DataFrame({"x": np.arange(4.0)}, index=pd.MultiIndex.from_arrays(
        [np.arange(4), ["m0", "m1", "m0", None], pd.date_range("2020", periods=4, tz="UTC")], names=["a", None, "t"])),
    "multiindex-unused-levels": lambda: pd.DataFrame(
        {"x": np.arange(6)}, index=pd.MultiIndex.from_product([["a", "b", "c"], [1, 2]], names=["k", "n"])).iloc[2:],
    "multiindex-sorted": lambda: pd.DataFrame({"x": [1, 2]}, index=pd.MultiIndex(
        levels=[["a", "b"], [1]], codes=[[0, 1], [0, 0]], sortorder=0)),
}


@pytest.mark.parametrize("kind", sorted(STORED))
def test_a_frame_with_a_text_categorical_nullable_or_zoned_column_is_stored_as_columns_and_comes_back_exactly(
        tmp_path, kind):
    want = STORED[kind]()
    (m, got), = _round_trip(tmp_path, [want], trust=False)
    assert m.tag == "handler" and m.meta["handler"] == "pandas.DataFrame", kind
    _exactly(got, want)
    for col in (want.to_frame() if isinstance(want, pd.Series) else want):
        w = want if isinstance(want, pd.Series) else want[col]
        g = got if isinstance(got, pd.Series) else got[col]
        assert [type(x) for x in g.tolist()] == [type(x) for x in w.tolist()]  # str stays str, NA stays NA


class Name(str):
    pass


def test_a_str_subclass_in_a_text_column_keeps_the_frame_pickled_and_its_type(tmp_path):
    want = pd.DataFrame({"s": _obj([Name("a"), "b"])})
    (m, got), = _round_trip(tmp_path, [want])
    assert m.tag == "pickle" and type(got["s"][0]) is Name


def test_a_frame_stored_as_one_pickle_by_an_older_casmon_still_loads(tmp_path, monkeypatch):
    """Stores written before text columns were columns hold such frames as one pickle: they load as they were."""
    from casmon.store.libraries.pandas import PandasHandler

    want = pd.DataFrame({"s": _obj(["a", "b"]), "c": pd.Categorical(["x", "y"])})
    s = casmon.open(tmp_path / "s")
    with monkeypatch.context() as m:
        m.setattr(PandasHandler, "encode", lambda self, v: None)  # as an older casmon declined it
        old = s.put(want)
    s.flush()
    s.close()
    t = casmon.open(tmp_path / "s")
    assert t.manifest(old).tag == "pickle"
    _exactly(t.get(old), want)
    assert t.manifest(t.put(want)).tag == "handler"


def test_a_crafted_string_column_layout_is_damage_not_a_raw_error(tmp_path):
    s = casmon.open(tmp_path / "s")
    d = s.put(pd.DataFrame({"s": _obj(["ab", "c"])}))
    m = s.manifest(d)
    meta = m.meta["meta"]
    enc = serialize.Encoded(m.tag, m.meta, m.inline)
    offsets = np.array([0, 2, 3], np.int64).view(np.uint8)
    bad = [
        [np.array([0, 3, 2], np.int64).view(np.uint8), np.frombuffer(b"abc", np.uint8)],  # offsets fall
        [offsets, np.frombuffer(b"ab", np.uint8)],  # offsets beyond the bytes
        [offsets, np.frombuffer(b"a\xffc", np.uint8)],  # not UTF-8
        [np.zeros(0, np.uint8), np.zeros(0, np.uint8)],
    ]
    for buffers in bad:
        with pytest.raises(DamagedObjectError, match="cannot decode"):
            serialize.decode(enc, [b.copy() for b in buffers], trusted=False)
    crafted = dict(meta, columns=[dict(meta["columns"][0], strings={"dtype": "string", "storage": "x", "na": "NA"})])
    with pytest.raises(DamagedObjectError, match="cannot decode"):
        serialize.decode(serialize.Encoded(m.tag, {**m.meta, "meta": crafted}, m.inline),
                         [offsets.copy(), np.frombuffer(b"abc", np.uint8).copy()], trusted=False)


def test_a_crafted_categorical_code_beyond_its_categories_is_damage(tmp_path):
    s = casmon.open(tmp_path / "s")
    d = s.put(pd.DataFrame({"c": pd.Categorical(["a", "b"])}))
    m = s.manifest(d)
    enc = serialize.Encoded(m.tag, m.meta, m.inline)
    got = s.get(d)
    assert list(got["c"]) == ["a", "b"]
    codes = np.array([0, 7], np.int8).view(np.uint8)
    cats = [np.array([0, 1, 2], np.int64).view(np.uint8), np.frombuffer(b"ab", np.uint8)]
    with pytest.raises(DamagedObjectError, match="cannot decode"):
        serialize.decode(enc, [codes.copy(), *[c.copy() for c in cats]], trusted=False)


def test_a_data_frame_arguments_cache_key_is_what_it_was(tmp_path):
    """Storage changed, keys did not: a frame argument's key is the digest keys/ computes, as before."""
    from casmon.keys.fingerprint import fingerprint

    df = pd.DataFrame({"s": _obj(["a", "b"]), "c": pd.Categorical(["x", "y"])})
    assert fingerprint(df) == fingerprint(df.copy())


def _text_datasets():
    import xarray as xr

    labels = np.array(["a", "bé", "", "😀"], object)
    return [
        xr.Dataset({"v": ("x", np.arange(4.0))}, coords={"x": labels}),  # an object index
        xr.Dataset({"v": ("x", np.arange(4.0))}, coords={"x": pd.Index(labels.tolist())}),  # pandas 3's str index
        xr.Dataset({"v": ("x", np.arange(4.0))}, coords={"x": pd.Index(labels.tolist(), dtype="string[python]")}),
        xr.Dataset({"v": ("x", np.arange(4.0)), "name": ("x", labels)}, coords={"lab": ("x", labels[::-1].copy())}),
        pd.DataFrame({"v": [1.0, 2.0]}, index=pd.Index(["r1", "r2"], name="row")).to_xarray(),
        xr.DataArray(np.arange(2.0), dims="x", coords={"x": np.array(["p", "q"], object)}, name="d"),
    ]


@pytest.mark.parametrize("i", range(len(_text_datasets())))
def test_an_xarray_value_with_text_coordinates_or_variables_is_stored_as_variables_and_comes_back_exactly(tmp_path, i):
    from tests.store.test_frame_values import _xr_exactly

    want = _text_datasets()[i]
    (m, got), = _round_trip(tmp_path, [want], trust=False)
    assert m.tag == "handler" and m.meta["handler"] == "xarray.Dataset"
    _xr_exactly(got, want)
    for k in want.coords:
        assert got.indexes[k].dtype == want.indexes[k].dtype if k in want.indexes else got[k].dtype == want[k].dtype


def test_xarray_text_the_layout_cannot_hold_stays_pickled(tmp_path):
    import xarray as xr

    declined = [xr.Dataset({"o": ("x", np.array(["a", None], object))}),
                xr.Dataset({"o": (("x", "y"), np.array([["a", "b"]], object))})]
    for want, (m, got) in zip(declined, _round_trip(tmp_path, declined)):
        assert m.tag == "pickle"
        assert got.identical(want)


def test_a_crafted_multiindex_code_beyond_its_level_is_damage(tmp_path):
    s = casmon.open(tmp_path / "s")
    want = STORED["multiindex"]()
    d = s.put(want)
    m = s.manifest(d)
    assert m.tag == "handler"
    enc = serialize.Encoded(m.tag, m.meta, m.inline)
    x = np.array([1, 2], np.int64).view(np.uint8)
    levels = [np.array([1, 3], np.int64).view(np.uint8), np.array([0, 9], np.int8).view(np.uint8),
              np.array([2, 4], np.int64).view(np.uint8), np.array([0, 1], np.int8).view(np.uint8)]
    with pytest.raises(DamagedObjectError, match="cannot decode"):
        serialize.decode(enc, [x.copy(), *[b.copy() for b in levels]], trusted=False)
    levels[1] = np.array([0, 1], np.int8).view(np.uint8)
    got = serialize.decode(enc, [x.copy(), *[b.copy() for b in levels]], trusted=False)
    _exactly(got, want)


@pytest.mark.parametrize("save_with, load_with", [("python", "python"), ("python", "arrow"), ("arrow", "python")])
def test_text_columns_store_and_load_the_same_with_pyarrow_loaded_or_not(tmp_path, monkeypatch, save_with, load_with):
    """Without pyarrow loaded (pandas 2 without it) the same layout is made and read in Python."""
    from casmon.store.libraries import strings

    arrow = strings._arrow
    want = pd.DataFrame({"s": _obj(["", "\x00", "a\x00b", "😀𝄞", "é" * 3, "plain"]),
                         "t": pd.array(["x", None, "", "é", "😀", "z"], dtype="string[python]")})
    s = casmon.open(tmp_path / "s")
    monkeypatch.setattr(strings, "_arrow", (lambda: None) if save_with == "python" else arrow)
    d = s.put(want)
    assert s.manifest(d).tag == "handler"
    assert s.put(pd.DataFrame({"s": _obj(["a", "\ud800"])})) is not None  # a lone surrogate: pickled, not corrupt
    monkeypatch.setattr(strings, "_arrow", (lambda: None) if load_with == "python" else arrow)
    s.objects.clear_caches()
    _exactly(s.get(d), want)


CATEGORIES = {
    "dates-with-freq": lambda: pd.Categorical(pd.date_range("2020", periods=3, freq="D")),
    "zoned-dates-with-freq": lambda: pd.Categorical(pd.date_range("2020", periods=2, freq="h", tz="Asia/Tokyo")),
    "durations-with-freq": lambda: pd.Categorical(pd.timedelta_range("1s", periods=2, freq="s")),
    "a-range": lambda: pd.Categorical.from_codes([0, 1, -1], categories=pd.RangeIndex(3)),
    "named": lambda: pd.Categorical(["a", "b"], categories=pd.Index(["a", "b"], name="letters")),
}


@pytest.mark.parametrize("kind", sorted(CATEGORIES))
def test_a_categorical_columns_categories_come_back_as_the_index_they_were(tmp_path, kind):
    """A cache hit's categories are the same index: its type (a range), its freq and its name, not only equal labels."""
    want = pd.DataFrame({"c": CATEGORIES[kind]()}, index=pd.CategoricalIndex(CATEGORIES[kind]()[:3][::-1])
                        if len(CATEGORIES[kind]()) == 3 else None)
    (m, got), = _round_trip(tmp_path, [want], trust=False)
    _exactly(got, want)
    for g, w in ((got["c"].cat.categories, want["c"].cat.categories), (got.index, want.index)):
        g, w = (g.categories, w.categories) if isinstance(w, pd.CategoricalIndex) else (g, w)
        assert repr(g) == repr(w) and type(g) is type(w) and g.name == w.name
        assert getattr(g, "freq", None) == getattr(w, "freq", None)
