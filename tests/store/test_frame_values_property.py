"""Property: any pandas or xarray value a cache hit serves is the value the function returned, exactly (dtypes,
column and row index types and names, attrs, flags, encoding), whether the frame handlers store it as columns
or it falls back to a pickle."""

import numpy as np
import pandas as pd
import pytest
import xarray as xr
from hypothesis import HealthCheck, given, settings, strategies as st

import casmon

from tests.store.test_frame_values import _exactly, _xr_exactly

COLUMNS = {
    "f8": lambda n: np.linspace(-1, 1, n),
    "f4-nan": lambda n: np.where(np.arange(n) % 2, np.nan, -0.0).astype("f4"),
    "i1": lambda n: np.arange(n, dtype="i1"),
    "u8": lambda n: np.full(n, 2**64 - 1, "u8"),
    "bool": lambda n: np.arange(n) % 2 == 0,
    "c8": lambda n: np.arange(n, dtype="c8") * 1j,
    "M8[s]": lambda n: np.arange(n).astype("datetime64[s]"),
    "M8[ns]-NaT": lambda n: np.array(["NaT"] * n, "datetime64[ns]"),
    "m8[ms]": lambda n: np.arange(n).astype("timedelta64[ms]"),
    "tz": lambda n: pd.date_range("2020", periods=n, tz="Europe/Paris"),
    "Int64": lambda n: pd.array([None if i % 2 else i for i in range(n)], dtype="Int64"),
    "boolean": lambda n: pd.array([None if i % 2 else True for i in range(n)], dtype="boolean"),
    "string[pyarrow]": lambda n: pd.array(["x"] * n, dtype="string[pyarrow]"),
    "str": lambda n: pd.array(["y"] * n, dtype="str"),
    "category": lambda n: pd.Categorical(["a", "b"] * (n // 2) + ["a"] * (n % 2), categories=["b", "a"], ordered=True),
    "period": lambda n: pd.period_range("2020", periods=n, freq="M"),
    "interval": lambda n: pd.interval_range(0, n) if n else pd.IntervalIndex([]),
    "sparse": lambda n: pd.arrays.SparseArray(np.zeros(n)),
    "object-mixed": lambda n: np.array([1, "a", None, 2.5][:1] * n + [], object) if n else np.array([], object),
}

LABELS = st.one_of(st.text(max_size=3), st.integers(-3, 3), st.tuples(st.text(max_size=1), st.integers(0, 2)),
                   st.booleans(), st.floats(allow_nan=False, width=16))


def _row_index(kind, n):
    return {
        "range": lambda: pd.RangeIndex(n),
        "range-offset": lambda: pd.RangeIndex(3, 3 + 2 * n, 2, name="r"),
        "int32": lambda: pd.Index(np.arange(n, dtype="int32"), name="i"),
        "float": lambda: pd.Index(np.arange(n) / 2),
        "object-int": lambda: pd.Index(list(range(n)), dtype=object),
        "str": lambda: pd.Index([f"r{i}" for i in range(n)]),
        "dt-freq": lambda: pd.date_range("2021", periods=n, freq="3h", name="t"),
        "dt-tz": lambda: pd.date_range("2021", periods=n, tz="UTC"),
        "td": lambda: pd.timedelta_range("1s", periods=n, freq="s"),
        "multi": lambda: pd.MultiIndex.from_arrays([np.arange(n), [f"m{i}" for i in range(n)]], names=["a", None]),
        "category": lambda: pd.CategoricalIndex(["c"] * n),
        "period": lambda: pd.period_range("2020", periods=n, freq="D"),
    }[kind]()


@st.composite
def frames(draw):
    n = draw(st.integers(0, 4))
    numeric = ["f8", "f4-nan", "i1", "u8", "bool", "c8", "M8[s]", "M8[ns]-NaT", "m8[ms]"]
    # half the frames all numpy columns: those the column layout stores, where it must be exact
    kinds = draw(st.lists(st.sampled_from(numeric if draw(st.booleans()) else sorted(COLUMNS)), max_size=4))
    labels = draw(st.lists(LABELS, min_size=len(kinds), max_size=len(kinds)))
    data = {i: COLUMNS[k](n) for i, k in enumerate(kinds)}
    df = pd.DataFrame(data, index=_row_index(draw(st.sampled_from(
        ["range", "range-offset", "int32", "float", "dt-freq", "td"] * 2 + ["object-int", "str", "dt-tz", "multi",
                                                                         "category", "period"])), n))
    cols = draw(st.sampled_from(["labels", "range", "range-offset", "int32", "object-int"]))
    if cols == "labels":
        df.columns = pd.Index(labels, dtype=object) if labels else pd.Index([])
    elif cols == "range-offset":
        df.columns = pd.RangeIndex(5, 5 + 3 * len(kinds), 3, name="c")
    elif cols == "int32":
        df.columns = pd.Index(np.arange(len(kinds), dtype="int32"))
    elif cols == "object-int":
        df.columns = pd.Index(list(range(len(kinds))), dtype=object)
    df.attrs = draw(st.sampled_from([{}, {}, {"u": "m"}, {"n": [1, 2.5]}, {"t": (1, 2)}]))
    if draw(st.booleans()) and df.index.is_unique and df.columns.is_unique:
        df = df.set_flags(allows_duplicate_labels=False)
    if kinds and draw(st.booleans()):
        return df.iloc[:, 0]
    return df


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(want=frames())
def test_any_pandas_value_comes_back_exactly_from_put_and_a_cache_hit(tmp_path_factory, want):
    s = casmon.open(tmp_path_factory.mktemp("s"))
    _exactly(s.get(s.put(want)), want)

    @casmon.cache(store=s, version="values")
    def f():
        return want

    f()
    hit = f.ref()
    assert hit is not None
    _exactly(f(), want)


@st.composite
def datasets(draw):
    nx, ny = draw(st.integers(0, 3)), draw(st.integers(1, 2))
    ds = xr.Dataset(attrs=draw(st.sampled_from([{}, {"title": "t"}, {"bad": np.int64(1)}])))
    for name in draw(st.lists(st.sampled_from(["a", "b", "data", "x", "y", "lab", "when", "s"]), unique=True,
                              max_size=5)):
        kind = draw(st.sampled_from(["var-xy", "var-x", "coord-x", "dimcoord", "scalar", "str", "time", "obj"]))
        var = {"var-xy": lambda: (("x", "y"), np.arange(nx * ny, dtype="f4").reshape(nx, ny), {"units": "K"}),
               "var-x": lambda: ("x", np.arange(nx, dtype="i2")),
               "coord-x": lambda: ("x", np.arange(nx) * 10.0),
               "dimcoord": lambda: (name, np.arange(2)),
               "scalar": lambda: ((), np.float64(1.5)),
               "str": lambda: ("x", np.array(["ab"] * nx)),
               "time": lambda: ("x", pd.date_range("2020", periods=nx).values),
               "obj": lambda: ("x", np.array([None] * nx, object))}[kind]()
        try:
            if kind.startswith("coord") or kind == "dimcoord":
                ds = ds.assign_coords({name: var})
            else:
                ds[name] = var
        except (ValueError, KeyError):
            continue
        if draw(st.booleans()):
            ds[name].encoding = draw(st.sampled_from([{"dtype": "int16"}, {"chunks": (1,)}, {"zlib": True}]))
    if draw(st.booleans()) and ds.data_vars:
        return ds[draw(st.sampled_from(sorted(ds.data_vars)))]
    return ds


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(want=datasets())
def test_any_xarray_value_comes_back_exactly_from_put_and_a_cache_hit(tmp_path_factory, want):
    s = casmon.open(tmp_path_factory.mktemp("s"))
    _xr_exactly(s.get(s.put(want)), want)

    @casmon.cache(store=s, version="values")
    def f():
        return want

    f()
    _xr_exactly(f(), want)
