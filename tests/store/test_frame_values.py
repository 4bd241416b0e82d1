"""pandas and xarray values stored one numeric part per column or variable (casmon/store/libraries/pandas.py,
xarray.py): they come back equal, load from an untrusted store, and what the layout cannot hold is pickled."""

import numpy as np
import pandas as pd
import pytest
import xarray as xr

import casmon


def _round_trip(tmp_path, values, trust=True):
    s = casmon.open(tmp_path / "s")

    @casmon.cache(store=s, version="values")  # the values are the test's: no need to hash them as code
    def f(i):
        return values[i]

    for i in range(len(values)):
        f(i)
    s.flush()
    s.close()
    t = casmon.open(tmp_path / "s", trust=trust)
    refs = [f.ref(i) for i in range(len(values))]
    return [(t.manifest(r.digest), t.get(r.digest)) for r in refs]


FRAMES = [
    pd.DataFrame({"a": [1, 2, 3], "b": [0.5, np.nan, 1.0], "c": [True, False, True]}),
    pd.DataFrame({"t": pd.date_range("2020", periods=4), "d": pd.to_timedelta([1, 2, 3, 4], unit="s")},
                 index=pd.Index([5, 3, 9, 1], name="k")),
    pd.DataFrame(np.arange(12.0).reshape(4, 3)),
    pd.DataFrame({"x": np.arange(3, dtype="u2")}, index=pd.date_range("2021", periods=3, name="when").as_unit("s")),
    pd.DataFrame({"a": np.zeros(0)}),
    pd.DataFrame(index=pd.RangeIndex(2, 12, 3)),
    pd.Series([1.5, 2.5], name="s"),
    pd.Series([1, 2], index=pd.Index([0.5, 1.5])),
]


def test_pandas_frames_come_back_equal_stored_as_columns(tmp_path):
    for want, (m, got) in zip(FRAMES, _round_trip(tmp_path, FRAMES, trust=False)):
        assert m.tag == "handler" and m.meta["handler"] == "pandas.DataFrame"
        if isinstance(want, pd.Series):
            pd.testing.assert_series_equal(got, want, check_index_type=True)
        else:
            pd.testing.assert_frame_equal(got, want, check_index_type=True, check_column_type=True)
    df = FRAMES[0].copy()
    df.attrs = {"source": "x"}
    assert _round_trip(tmp_path / "attrs", [df])[0][1].attrs == {"source": "x"}


DECLINED = [
    pd.DataFrame({"o": pd.Series(["x", 1], dtype=object)}),
    pd.DataFrame({"o": pd.Series(["x", None], dtype=object)}),  # object dtype cannot say None is missing: pickled
    pd.DataFrame({"o": pd.Series(["x", "\ud800"], dtype=object)}),  # a lone surrogate is no UTF-8
    pd.DataFrame({"a": [1, 2]}, index=pd.MultiIndex.from_tuples([(1, 2), ((3,), 4)])),  # a tuple label
    pd.DataFrame([[1, 2]], columns=["a", "a"]),
    pd.DataFrame({("a", 1): [1]}),
    pd.DataFrame({"a": [1]}).set_flags(allows_duplicate_labels=False).pipe(lambda d: d.__setattr__("attrs", {"n": np.int64(1)}) or d),
]


def test_frames_the_column_layout_cannot_hold_are_pickled_and_still_come_back(tmp_path):
    for want, (m, got) in zip(DECLINED, _round_trip(tmp_path, DECLINED)):
        assert m.tag == "pickle", want
        pd.testing.assert_frame_equal(got, want)


def _dataset():
    return xr.Dataset(
        {"t": (("x", "y"), np.arange(12.0).reshape(3, 4), {"units": "K"}), "z": ("x", np.array([0, 1, 2], "i2"))},
        coords={"x": [10, 20, 30], "y": pd.date_range("2020", periods=4), "lab": ("x", np.array(["a", "b", "c"]))},
        attrs={"title": "t", "n": [1, 2]})


def test_xarray_values_come_back_identical_stored_as_variables(tmp_path):
    ds = _dataset()
    values = [ds, ds["t"], xr.DataArray(np.zeros(3)), xr.DataArray(np.float32(2.5), name="scalar"), xr.Dataset()]
    for want, (m, got) in zip(values, _round_trip(tmp_path, values, trust=False)):
        assert m.tag == "handler" and m.meta["handler"] == "xarray.Dataset", want
        assert type(got) is type(want) and got.identical(want), (got, want)


def test_xarray_values_the_layout_cannot_hold_are_pickled(tmp_path):
    pytest.importorskip("dask")
    ds = _dataset()
    declined = [ds.assign_attrs(bad=np.int64(1)), ds.chunk({"x": 1}), xr.Dataset({"o": ("x", np.array([1, "a"], object))}),
                xr.DataArray([1.0], dims="x", coords={"data": ("x", [2.0])})]
    for want, (m, got) in zip(declined, _round_trip(tmp_path, declined)):
        assert m.tag == "pickle"
        assert got.identical(want)


@pytest.mark.parametrize("make, field", [
    (lambda: pd.DataFrame({"a": np.arange(5.0)}), "columns"),
    (lambda: xr.Dataset({"t": ("x", np.arange(5.0))}), "variables"),
])
def test_a_crafted_frame_manifest_is_damage_not_a_raw_error(tmp_path, make, field):
    """casmon's own library handlers failing on a crafted manifest say damage, as its numpy handler does."""
    from casmon.errors import DamagedObjectError
    from casmon.store import serialize

    s = casmon.open(tmp_path / "s")
    d = s.put(make())
    m = s.manifest(d)
    meta = dict(m.meta["meta"])
    meta[field] = [dict(meta[field][0], array={"dtype": "'<f8'", "shape": [7], "order": "C"})]  # 40 bytes, not 56
    enc = serialize.Encoded(m.tag, {**m.meta, "meta": meta}, m.inline)
    with pytest.raises(DamagedObjectError, match="cannot decode"):
        serialize.decode(enc, [np.zeros(40, np.uint8)], trusted=False)


def _exactly(got, want):
    """Equal as a cache hit must be: values, dtypes, index and column index types, names, attrs and flags."""
    assert type(got) is type(want)
    if isinstance(want, pd.Series):
        pd.testing.assert_series_equal(got, want, check_index_type=True, check_flags=True, check_exact=True)
        assert got.name == want.name
    else:
        pd.testing.assert_frame_equal(got, want, check_index_type=True, check_column_type=True, check_flags=True,
                                      check_exact=True)
        assert repr(got.columns) == repr(want.columns) and [type(c) for c in got.columns] == [type(c) for c in want.columns]
    assert repr(got.index) == repr(want.index) and got.attrs == want.attrs and got.flags == want.flags


EXACT = [
    pd.DataFrame({"a": [1, 2]}).set_flags(allows_duplicate_labels=False),
    pd.Series([1.0, 2.0], name="s").set_flags(allows_duplicate_labels=False),
    pd.DataFrame(np.zeros((2, 2)), columns=pd.Index([1, 2], dtype="int32")),
    pd.DataFrame(np.zeros((2, 2)), columns=pd.Index([1, 2], dtype="uint64")),
    pd.DataFrame(np.zeros((2, 2)), columns=pd.Index([1, 2], dtype=object)),
    pd.DataFrame(np.zeros((2, 2)), columns=pd.Index(["a", "b"], dtype=object)),
    pd.DataFrame(np.zeros((2, 2)), columns=pd.Index(["a", "b"], dtype="string[pyarrow]")),
    pd.DataFrame(np.zeros((2, 2)), columns=pd.Index(["a", 1], dtype=object)),
    pd.DataFrame(np.zeros((2, 2)), columns=pd.RangeIndex(5, 7)),
    pd.DataFrame(np.zeros((2, 2)), columns=pd.RangeIndex(0, 4, 2, name="c")),
    pd.DataFrame(),
    pd.DataFrame(index=pd.Index([1, 2], dtype="int16")),
]


@pytest.mark.parametrize("i", range(len(EXACT)))
def test_frame_column_index_type_and_flags_come_back_exactly(tmp_path, i):
    """A frame's column index (range bounds, dtype, label types) and its flags come back as they were, stored
    as columns or pickled: a cache hit is never a frame whose columns or flags differ."""
    want = EXACT[i]
    (_, got), = _round_trip(tmp_path, [want], trust=False)
    _exactly(got, want)


def _xr_exactly(got, want):
    """identical(), and what identical() does not look at: variable order, indexes, encoding."""
    assert type(got) is type(want) and got.identical(want), (got, want)
    from casmon.store.libraries.tabular import tagged  # compares encodings NaN for NaN, type for type

    assert tagged(got.encoding) == tagged(want.encoding) and list(got.coords) == list(want.coords)
    assert {k: type(i) for k, i in got.xindexes.items()} == {k: type(i) for k, i in want.xindexes.items()}
    if isinstance(want, xr.Dataset):
        assert list(got.variables) == list(want.variables) and list(got.sizes) == list(want.sizes)
        assert all(tagged(got[k].encoding) == tagged(want[k].encoding) for k in want.variables)


def _xr_exact_values():
    ds = xr.Dataset({"t": ("x", np.arange(3.0))}, coords={"x": [1, 2, 3]})
    enc = ds.copy()
    enc["t"].encoding = {"dtype": "int16", "scale_factor": 0.1, "_FillValue": -1}
    da = xr.DataArray(np.zeros(2), dims="x", name="v")
    da.encoding = {"zlib": True}
    sets = ds.copy()
    sets.encoding = {"unlimited_dims": {"x"}, "source": "/data/x.nc"}  # a set of names, as netCDF files give
    netcdf = ds.copy()
    netcdf["t"].encoding = {"dtype": np.dtype("int16"), "scale_factor": np.float32(0.1), "add_offset": np.float64(3),
                            "_FillValue": np.int16(-999), "missing_value": np.float32(np.nan), "units": "K",
                            "original_shape": (3,), "chunksizes": None, "$odd": [1, (2, 3)]}
    return [
        xr.DataArray(np.zeros(3), name="data"),  # named as an unnamed one is stored
        xr.DataArray(np.zeros(3), dims="data"),
        enc, da, sets, netcdf,
        ds.drop_indexes("x"),  # a dimension coordinate without an index
        xr.Dataset(coords={"c": ("x", [3])}).assign(a=("x", [1])),  # a coordinate before a data variable
        xr.Dataset({"a": ("x", [1]), "b": ("x", [2])}, coords={"c": ("x", [3])})[["b", "a"]],
    ]


@pytest.mark.parametrize("i", range(len(_xr_exact_values())))
def test_xarray_values_come_back_with_name_order_indexes_and_encoding(tmp_path, i):
    """A DataArray named "data", a variable's encoding, the variables' order and which coordinates are indexed
    come back as they were: stored as variables where the layout rebuilds them, pickled where not."""
    want = _xr_exact_values()[i]
    (m, got), = _round_trip(tmp_path, [want])
    _xr_exactly(got, want)
    if i in (4, 5):  # encodings as netCDF files give them: stored as variables, not pickled
        assert m.tag == "handler"


def test_a_dataset_read_from_a_netcdf_file_is_stored_as_variables_and_opens_through_the_view_and_an_export(tmp_path):
    import zarr

    from casmon.store.zarrview import node_name

    pytest.importorskip("scipy")
    ds = xr.Dataset({"t": (("x", "y"), np.arange(12.0).reshape(4, 3) * 0.5, {"long_name": "temperature"})},
                    coords={"x": np.arange(4), "y": [10, 20, 30]})
    ds["t"].encoding = {"dtype": "int16", "scale_factor": 0.5, "_FillValue": -999, "units": "K"}
    ds.to_netcdf(tmp_path / "in.nc", engine="scipy")
    want = xr.open_dataset(tmp_path / "in.nc", engine="scipy").load()
    assert isinstance(want["t"].encoding["scale_factor"], np.generic) and "unlimited_dims" in want.encoding
    s = casmon.open(tmp_path / "s")

    @casmon.cache(store=s)
    def f():
        return want

    f()
    s.flush()
    ref = f.ref()
    assert s.manifest(ref.digest).tag == "handler"  # not a pickle
    got = ref.load()
    _xr_exactly(got, want)
    path = f"cache/{node_name(f.__casmon_cache__.name)}/{ref.key.hex()}"
    for opened in (xr.open_zarr(s.zarr(), group=path, consolidated=False), xr.open_zarr(tmp_path / "out", group=path)
                   if s.export_zarr(tmp_path / "out") else None):
        got = opened.load()  # the values as cached (decoded): the encoding says how netCDF packed them, not zarr
        assert got.equals(want) and got["t"].dtype == want["t"].dtype and got["t"].attrs["long_name"] == "temperature"
    assert isinstance(zarr.open_group(tmp_path / "out", mode="r")[path], zarr.Group)
