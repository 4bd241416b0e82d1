"""A DataFrame's text, categorical, nullable and zoned columns through the zarr view and an export
(casmon/store/zarrtext.py, libraries/columns.py): zarr's variable-length strings, codes with their categories,
values with a mask beside them, opened by zarr-python and xarray (tensorstore: the numeric arrays) without
casmon, equal to what casmon loads."""

import numpy as np
import pandas as pd
import pytest
import xarray as xr
import zarr

import casmon
from casmon.errors import DamagedObjectError
from casmon.store.zarrview import node_name
from tests.store.test_zarr_export import entry, read_without_casmon


def _obj(values):
    return list(values)


def _as_objects(df, *labels):
    """``df`` with columns ``labels`` of object dtype (a frame made from text infers pandas 3's ``str``)."""
    for label in labels:
        df[label] = df[label].astype(object)
    return df


ODD = ["", "\x00", "a\x00b", "😀𝄞", "\U0010ffff", "é" * 3, "x" * 1000]


def _frames():
    n = 5000
    return [
        _as_objects(pd.DataFrame({"name": _obj([f"n{i}" for i in range(n)]), "x": np.arange(n, dtype="f8"),
                      "s": pd.array([None if i % 7 == 0 else f"s{i}" for i in range(n)], dtype="str"),
                      "c": pd.Categorical(["u", "v", None, "v"] * (n // 4), categories=["v", "u", "never"], ordered=True),
                      "i": pd.array([None if i % 3 == 0 else i for i in range(n)], dtype="Int64"),
                      "t": pd.date_range("2020-03-29", periods=n, freq="min", tz="Europe/Paris")},
                     index=pd.Index([f"r{i}" for i in range(n)], name="row")), "name"),
        _as_objects(pd.DataFrame({"odd": _obj(ODD), "sp": pd.array(ODD, dtype="string[python]"),
                                  "ci": pd.Categorical([3, 1, 2, 3, 3, 1, 2], categories=[3, 1, 2])}), "odd"),
        _as_objects(pd.DataFrame({"one": _obj(["only"])}), "one"),
        _as_objects(pd.DataFrame({"none": _obj([]), "c": pd.Categorical([])}), "none"),
        pd.DataFrame({"a/b": ["x", "y"], "..": ["p", "q"], "zarr.json": ["z", "w"], "index": ["i", "j"]},
                     index=pd.Index(["k1", "k2"])),
        pd.DataFrame({"dates": pd.Categorical(pd.to_datetime(["2021-01-01", "2020-01-01", "2021-01-01"])),
                      "many": pd.Categorical(["c1", "c4999", "c1"], categories=[f"c{i}" for i in range(5000)])}),
        pd.DataFrame({"x": np.arange(6.0)}, index=pd.MultiIndex.from_product([["a", "b", "c"], [10, 20]],
                                                                            names=["k", "n"])).iloc[1:],
    ]


def _store(tmp_path, chunk_size=1 << 12):
    s = casmon.open(tmp_path / "s", chunk_size=chunk_size)
    frames = _frames()

    @casmon.cache(store=s)
    def make(i):
        return frames[i]

    for i in range(len(frames)):
        make(i)
    s.flush()
    return s, make, frames


def _column(group, want, label):
    """Column ``label`` of ``want`` as the view or an export presents it, back as pandas values."""
    name = group.attrs["arrays"][list(want.columns).index(label)]
    a = group[name]
    values = a[...]
    if "categories" in a.attrs or "categories_array" in a.attrs:  # few plain ones as attributes, else an array
        cats = a.attrs["categories"] if "categories" in a.attrs else group[a.attrs["categories_array"]][...]
        return pd.Categorical.from_codes(values, categories=cats, ordered=a.attrs["ordered"])
    if "missing" in a.attrs:
        missing = group[a.attrs["missing"]][...]
        values = values.astype(object)
        values[missing] = None
    if "timezone" in a.attrs:
        return pd.DatetimeIndex(values).tz_localize("UTC").tz_convert(a.attrs["timezone"])
    return values


def _same(got, want):
    if isinstance(want.dtype, pd.CategoricalDtype):
        assert got.equals(want.array), (got, want)
        return
    if isinstance(want.dtype, pd.DatetimeTZDtype):
        assert got.equals(pd.DatetimeIndex(want)), (got, want)
        return
    w = want.astype(object).where(want.notna(), None).tolist()
    g = [None if x is None else (x.item() if hasattr(x, "item") else x) for x in np.asarray(got, dtype=object).tolist()]
    assert g == [str(x) if isinstance(x, str) else x for x in w]


def test_text_categorical_nullable_and_zoned_columns_open_through_the_view_as_zarr_arrays_equal_to_the_load(tmp_path):
    s, make, frames = _store(tmp_path)
    root = zarr.open_group(s.zarr(), mode="r")
    for i, want in enumerate(frames):
        path, ref = entry(make, i)
        assert s.manifest(ref.digest).tag == "handler"
        g = root[path]
        assert isinstance(g, zarr.Group), path
        loaded = ref.load()
        for label in want.columns:
            _same(_column(g, loaded, label), want[label])
        text = g[g.attrs["arrays"][0]]
        if want.dtypes.iloc[0] == object:
            assert text.metadata.data_type.to_json(zarr_format=3) == "string" and text.shape == (len(want),)
        if "index_array" in g.attrs:
            assert g[g.attrs["index_array"]][...].tolist() == want.index.tolist()
        if "index_levels" in g.attrs:  # a MultiIndex: each level's values and its codes
            index = pd.MultiIndex(levels=[g[n][...].tolist() for n in g.attrs["index_levels"]],
                                  codes=[g[n][...] for n in g.attrs["index_codes"]], names=g.attrs["index_names"])
            assert index.equals(want.index) and index.names == want.index.names
    path, _ = entry(make, 0)
    ds = xr.open_zarr(s.zarr(), group=path, consolidated=False)
    assert ds["name"].values.tolist() == frames[0]["name"].tolist() and ds.sizes["index"] == 5000
    assert ds["index"].values.tolist() == frames[0].index.tolist()
    assert ds["c"].attrs["categories"] == ["v", "u", "never"] and ds["c"].attrs["ordered"] is True


def test_a_text_column_read_through_the_view_reads_only_the_chunks_a_slice_needs(tmp_path):
    from casmon.store import zarrtext

    s, make, frames = _store(tmp_path)
    path, _ = entry(make, 0)
    view = s.zarr()
    a = zarr.open_group(view, mode="r")[f"{path}/name"]
    assert a.chunks[0] < 5000  # stored in chunks of 4 KiB: several zarr chunks of text
    source = view.tree.arrays[f"{path}/name"]
    assert isinstance(source, zarrtext.TextView)
    assert a[1234:1236].tolist() == ["n1234", "n1235"] and source.chunks_read == 1


@pytest.mark.parametrize("part", [0, 1], ids=["offsets", "text"])
def test_a_damaged_stored_text_chunk_read_through_the_view_raises_damage_never_wrong_text(tmp_path, part):
    from casmon.keys.digest import Digest
    from casmon.store.objects import LOOSE_MIN, loose_key

    s = casmon.open(tmp_path / "s", chunk_size=LOOSE_MIN)  # chunks of loose files, one flipped here
    n = 100_000
    d = s.put(_as_objects(pd.DataFrame({"s": [f"name {i:08d}" for i in range(n)]}), "s"))
    s.flush()
    m = s.manifest(d)
    assert m.tag == "handler"
    p = tmp_path / "s" / loose_key(Digest(m.parts[part]["c"][0]))
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 1
    p.write_bytes(bytes(data))
    s.objects.clear_caches()
    from casmon.store.zarrvalues import value_node
    from casmon.store.zarrview import Tree, ZarrView

    tree = Tree()
    value_node(s, tree, "v", d.hex(), {}, "test")
    a = zarr.open_group(ZarrView(s, tree), mode="r")["v/s"]
    with pytest.raises(DamagedObjectError):
        a[:10]
    assert a[n - 2 :].tolist() == [f"name {n - 2:08d}", f"name {n - 1:08d}"]  # the sound chunks still read


def test_a_frames_text_columns_exported_open_without_casmon_in_zarr_and_xarray_equal_to_the_load(tmp_path):
    s, make, frames = _store(tmp_path)
    for kind, out in (("folder", tmp_path / "out"), ("zip", tmp_path / "out.zip")):
        s.export_zarr(out)
        got = read_without_casmon(tmp_path, kind, out)
        for i, want in enumerate(frames):
            path, ref = entry(make, i)
            for label, name in zip(want.columns, got["groups"][path]["arrays"]):
                a = got["zarr"][f"{path}/{name}"]
                col = want[label]
                if col.dtype == object or isinstance(col.dtype, pd.StringDtype):
                    assert a.shape == (len(want),) and a.dtype.kind == "T", (label, a.dtype)
                    assert a.tolist() == col.fillna("").tolist() if col.dtype != object else a.tolist() == col.tolist()
            ds = got["xarray"][path]
            for label, name in zip(want.columns, got["groups"][path]["arrays"]):
                if want[label].dtype == object:
                    assert ds[name].values.tolist() == want[label].tolist()
        if kind == "folder" and got["tensorstore"]:  # tensorstore reads no zarr string: the numeric arrays
            path, _ = entry(make, 0)
            assert np.array_equal(got["tensorstore"][f"{path}/c"], frames[0]["c"].cat.codes.to_numpy())
            assert f"{path}/name" not in got["tensorstore"]


def test_columns_named_like_zarr_paths_are_one_node_each(tmp_path):
    s, make, frames = _store(tmp_path)
    path, _ = entry(make, 4)
    g = zarr.open_group(s.zarr(), mode="r")[path]
    names = g.attrs["arrays"]
    assert names == ["a%2Fb", "%2E%2E", "zarr%2Ejson", "index"] and g.attrs["index_array"] == "index~1"
    assert [g[n][...].tolist() for n in names] == [["x", "y"], ["p", "q"], ["z", "w"], ["i", "j"]]
    assert g["index~1"][...].tolist() == ["k1", "k2"]


def test_ten_million_short_strings_store_load_and_read_through_the_view(tmp_path):
    n = 10_000_000
    want = _as_objects(pd.DataFrame({"s": _obj([f"n{i}" for i in range(n)])}), "s")
    s = casmon.open(tmp_path / "s")
    d = s.put(want)
    m = s.manifest(d)
    assert m.tag == "handler" and sum(p["n"] for p in m.parts) < 16 * n  # 8 bytes of offset and the text each
    got = s.get(d)
    assert got["s"].dtype == object and got["s"].iloc[-1] == f"n{n - 1}" and len(got) == n
    from casmon.store.zarrvalues import value_node
    from casmon.store.zarrview import Tree, ZarrView

    tree = Tree()
    value_node(s, tree, "v", d.hex(), {}, "test")
    a = zarr.open_group(ZarrView(s, tree), mode="r")["v/s"]
    assert a[n - 2 :].tolist() == [f"n{n - 2}", f"n{n - 1}"]


def test_an_xarray_datasets_text_coordinates_open_through_the_view_and_an_export_with_xarray_equal_to_the_load(
        tmp_path):
    labels = [f"site {i} é" for i in range(300)]
    values = [xr.Dataset({"v": ("x", np.arange(300.0)), "name": ("x", np.array(labels[::-1], object))},
                         coords={"x": pd.Index(labels)}),
              pd.DataFrame({"v": np.arange(3.0)}, index=pd.Index(["a", "b", "c"], name="row")).to_xarray()]
    s = casmon.open(tmp_path / "s", chunk_size=1 << 12)

    @casmon.cache(store=s)
    def make(i):
        return values[i]

    for i in range(len(values)):
        make(i)
    s.flush()
    s.export_zarr(tmp_path / "out")
    got = read_without_casmon(tmp_path, "folder", tmp_path / "out")
    for i, want in enumerate(values):
        path, ref = entry(make, i)
        assert s.manifest(ref.digest).tag == "handler"
        for opened in (xr.open_zarr(s.zarr(), group=path, consolidated=False).load(), got["xarray"][path]):
            for k in want.variables:
                assert opened[k].values.tolist() == want[k].values.tolist() and opened[k].dims == want[k].dims, k
            assert opened.indexes[list(want.indexes)[0]].tolist() == list(want.indexes.values())[0].tolist()


class _Bytes:
    """A stored part as :class:`~casmon.store.zarrtext.TextView` reads it (bytes that passed their digest check)."""

    def __init__(self, raw):
        self.raw = np.frombuffer(bytes(raw), np.uint8)
        self.layout = (self.raw.size, 1 << 20, 1 << 20, False)

    def read_bytes(self, lo, hi):
        return self.raw[lo:hi]


@pytest.mark.parametrize("offsets, text, why", [
    ([0, 3, 2], b"abc", "offsets"),  # they fall
    ([0, 2, 9], b"abc", "offsets"),  # past the bytes
    ([-1, 2, 3], b"abc", "offsets"),
    ([0, 2, 3], b"a\xffc", "UTF-8"),
    ([0, 1, 3], b"a\xed\xa0", "UTF-8"),  # an encoded surrogate is no UTF-8 either
    ([0, 1, 2], "é".encode(), "UTF-8"),  # the bytes are UTF-8, but one character is split between two rows
    ([0, 1, 3, 5], "a😀".encode(), "UTF-8"),
])
def test_a_crafted_text_column_read_through_the_view_is_damage_never_wrong_text(offsets, text, why):
    from types import SimpleNamespace

    from casmon.keys.digest import Digest
    from casmon.store.zarrtext import TextView

    view = TextView(SimpleNamespace(digest=Digest("ab" * 16)),
                    _Bytes(np.array(offsets, "<i8").tobytes()), _Bytes(text), len(offsets) - 1)
    with pytest.raises(DamagedObjectError, match=why):
        view.chunk(0)


def test_a_text_chunk_is_zarrs_own_vlen_utf8_encoding_of_the_same_strings():
    """The bytes the view builds are what zarr's own codec makes of the strings, the short last chunk padded with
    the fill value."""
    from types import SimpleNamespace

    from numcodecs import VLenUTF8

    from casmon.keys.digest import Digest
    from casmon.store.libraries.strings import encode_text
    from casmon.store.zarrtext import TextView

    strings = np.array(ODD * 3, object)
    offsets, data = encode_text(strings)
    view = TextView(SimpleNamespace(digest=Digest("ab" * 16)), _Bytes(offsets.tobytes()), _Bytes(data.tobytes()),
                    len(strings))
    view.chunk_rows = 8
    for j in range(3):
        want = np.array((list(strings[8 * j : 8 * j + 8]) + [""] * 8)[:8], object)
        assert view.chunk(j) == bytes(VLenUTF8().encode(want))
