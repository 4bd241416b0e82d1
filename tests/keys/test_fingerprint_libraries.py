"""Keys of the ML libraries' values: equal values share one, in this process and in a fresh one;
values a function can tell apart do not (near-misses drawn per library, as in the differential test)."""

import json
import os
import pickle
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from casmon import fingerprint as fp
from casmon.errors import NotKeyableError, UnstableKeyWarning
from casmon.keys.fingerprint import Fingerprinter

torch = pytest.importorskip("torch") if sys.version_info < (3, 12) else None
pa = pytest.importorskip("pyarrow")
pl = pytest.importorskip("polars")
sp = pytest.importorskip("scipy.sparse")
xr = pytest.importorskip("xarray")
Image = pytest.importorskip("PIL.Image")

needs_torch = pytest.mark.skipif(torch is None, reason="torch is installed on Python 3.11 only (its CPU build)")


def fed(v):
    """How many bytes the fingerprint of ``v`` reads: what it costs."""
    f = Fingerprinter()
    f.feed_value(v)
    f.digest()
    return f.fed


# -- equal values, distinct objects ------------------------------------------------------------------------
#: Built the same way in this process and in a fresh one: each must key alike in both, and alike twice here.
BUILD = textwrap.dedent("""
    import numpy as np, sys
    values = {}
    if sys.version_info < (3, 12):
        import torch
        torch.manual_seed(0)
        t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
        values["tensor"] = t
        values["tensor-view"] = t[1:, 1:3]
        values["bfloat16"] = t.bfloat16()
        values["parameter"] = torch.nn.Parameter(t.clone())
        values["generator"] = torch.Generator().manual_seed(3)
        m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
        values["module"] = m
        values["state_dict"] = m.state_dict()
        values["optimizer"] = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        values["sparse"] = torch.sparse_coo_tensor([[0, 2]], [1.0, 2.0], (4,))
    import pyarrow as pa, polars as pl, scipy.sparse as sp, xarray as xr, pandas as pd
    from PIL import Image
    a = pa.array([1, None, 3, 4, 5, 6])
    values["arrow-slice"] = a.slice(2, 3)
    values["arrow-chunked"] = pa.chunked_array([a.slice(0, 2), a.slice(2)])
    values["arrow-table"] = pa.table({"a": a, "s": pa.array(["x", "yy", None, "z", "", "w"])})
    values["polars"] = pl.DataFrame({"a": [1, 2], "s": ["x", None]})
    values["polars-series"] = pl.Series("n", [1.5, 2.5])
    values["pandas-arrow"] = pd.Series(["a", None, "b"], dtype="str")
    values["csr"] = sp.csr_matrix(np.array([[0, 1.0], [2.0, 0]]))
    values["coo"] = sp.coo_array(np.array([[0, 1.0], [2.0, 0]]))
    values["xarray"] = xr.Dataset({"v": ("x", np.arange(3.0))}, coords={"x": [1, 2, 3]})
    values["image"] = Image.new("RGB", (3, 2), (1, 2, 3))
    values["fortran"] = np.asfortranarray(np.arange(200_000.0).reshape(400, 500))
    import jax.numpy as jnp, datasets
    values["jax"] = jnp.arange(6.0).reshape(2, 3)
    values["jax-weak"] = jnp.asarray(1.5)
    values["hf"] = datasets.Dataset.from_dict({"a": [1, 2, 3], "b": ["x", "y", "z"]}).select([2, 0])
""")


def built():
    ns = {}
    exec(BUILD, ns)
    return ns["values"]


def test_equal_values_key_alike_here_and_in_a_fresh_process():
    code = BUILD + "\nfrom casmon import fingerprint as fp\nimport json\nprint(json.dumps({k: fp(v).hex() for k, v in values.items()}))"
    # The fresh process imports every library (seconds): it starts first and works while this one does.
    fresh = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first, again = built(), built()
        here = {name: fp(v).hex() for name, v in first.items()}
        assert here == {name: fp(v).hex() for name, v in again.items()}, "built twice, the same keys"
        out, err = fresh.communicate(timeout=120)
    finally:
        fresh.kill()
        fresh.wait()
    assert fresh.returncode == 0, err
    assert json.loads(out.strip().splitlines()[-1]) == here


@needs_torch
def test_copies_of_torch_values_key_alike():
    t = torch.randn(5, 3)
    assert fp(t) == fp(t.clone()) == fp(torch.from_numpy(t.numpy().copy()))
    assert fp(t.T) == fp(t.T.contiguous()), "strides do not count"
    g = torch.Generator().manual_seed(7)
    assert fp(g) == fp(g) == fp(torch.Generator().manual_seed(7))
    torch.rand(1, generator=g)
    assert fp(g) != fp(torch.Generator().manual_seed(7)), "a generator counts by its state"
    m = torch.nn.Linear(3, 2)
    m2 = pickle.loads(pickle.dumps(m))
    assert fp(m) == fp(m2) and fp(m.state_dict()) == fp(m2.state_dict())
    m2.weight.data[0, 0] += 1
    assert fp(m) != fp(m2)
    m2.weight.data[0, 0] -= 1
    m2.train(False)
    assert fp(m) != fp(m2), "a module's flags count"


@needs_torch
def test_one_change_gives_another_torch_key():
    t = torch.zeros(2, 3)
    base = fp(t)
    changed = t.clone()
    changed[1, 2] = 1e-30
    others = [changed, t.double(), t.reshape(3, 2), t.reshape(6), t.clone().requires_grad_(True),
              torch.nn.Parameter(t.clone()), t.bfloat16(), t.half(), t.to_sparse(), t[None]]
    keys = [fp(o) for o in others]
    assert base not in keys and len(set(keys)) == len(keys)
    z = torch.tensor([1 + 2j])
    assert fp(z.conj()) == fp(z.conj().resolve_conj()) != fp(z), "the conjugate bit is resolved, not ignored"
    s = torch.sparse_coo_tensor([[0, 0]], [1.0, 2.0], (2,))
    assert fp(s) != fp(s.coalesce()), "duplicate entries are not their sum"


@needs_torch
def test_a_view_of_a_large_tensor_reads_only_its_own_elements():
    big = torch.zeros(64 << 20, dtype=torch.uint8)
    assert fed(big[:1024]) < 4096
    assert fed(big.reshape(8192, 8192)[:, :1]) < 16 << 10, "a strided view copies its own elements only"
    assert fp(big[:1024]) == fp(torch.zeros(1024, dtype=torch.uint8))


@needs_torch
def test_a_tensor_with_a_hook_keys_without_torchs_serialization_warning():
    p = torch.nn.Parameter(torch.ones(3))
    p.register_hook(lambda g: g)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fp(p) == fp(torch.nn.Parameter(torch.ones(3)))


def test_arrow_keys_count_values_not_layout():
    a = pa.array(list(range(100)) + [None] * 3)
    assert fp(a.slice(10, 5)) == fp(pa.array(list(range(10, 15))))
    assert fed(a.slice(10, 5)) < 512, "a slice reads its own values, not its parent's"
    s = pa.array(["ab", None, "c", "", "def"] * 4)
    assert fp(pa.chunked_array([s.slice(0, 3), s.slice(3)])) == fp(pa.chunked_array([s]))
    assert fp(s.slice(1, 4)) == fp(pa.array(s.to_pylist()[1:5]))
    n = pa.array([[1, 2], [3], None, [4, 5, 6]])
    assert fp(n.slice(1, 2)) == fp(pa.array([[3], None])) != fp(n.slice(2, 2))
    t = pa.table({"a": a, "s": pa.array([str(i) for i in range(103)])})
    assert fp(t) == fp(pa.concat_tables([t.slice(0, 50), t.slice(50)]))
    assert fp(t) != fp(t.rename_columns(["a", "t"]))
    assert fp(a.cast(pa.int32())) != fp(a)
    assert fp(pa.array([1, 2], pa.int64())) != fp(pa.array([1, 2], pa.timestamp("s")))


def test_scipy_sparse_keys_ignore_cached_flags_and_attribute_order():
    m = sp.random(30, 30, density=0.2, format="csr", random_state=1)
    c = m.copy()
    m.has_sorted_indices  # sets a cached flag on m only
    assert fp(m) == fp(c) == fp(pickle.loads(pickle.dumps(c)))
    assert fp(m) != fp(sp.csr_array(m)), "a sparse array is not a sparse matrix"
    assert fp(m) != fp(m.tocsc()) and fp(m) != fp(m * 2)
    d = m.copy()
    d.indices = d.indices.astype(np.int64)
    assert fp(d) != fp(m), "the index dtype counts"


def test_xarray_keys_see_none_and_empty_attrs_alike():
    ds = xr.Dataset({"v": ("x", np.arange(3.0))})
    k = fp(ds)
    pickle.dumps(ds)  # xarray turns attrs None into {} here
    assert fp(ds) == k == fp(xr.Dataset({"v": ("x", np.arange(3.0))}))
    assert fp(ds.assign_attrs(a=1)) != k and fp(ds.rename({"v": "w"})) != k
    assert fp(ds["v"]) != fp(ds["v"].rename("w"))


def test_objects_count_attributes_by_name_not_by_order():
    class Box:
        pass

    a, b = Box(), Box()
    a.x, a.y = 1, 2
    b.y, b.x = 2, 1
    assert fp(a) == fp(b)
    b.x = 3
    assert fp(a) != fp(b)


def test_lazy_values_over_files_are_not_keyed(tmp_path):
    p = tmp_path / "t.parquet"
    pl.DataFrame({"a": [1, 2]}).write_parquet(p)
    with pytest.raises(NotKeyableError, match="LazyFrame"):
        fp(pl.scan_parquet(p))
    da = pytest.importorskip("dask.array")
    with pytest.raises(NotKeyableError, match="dask"):
        fp({"x": da.zeros(3)})


def test_a_type_whose_key_changes_under_copy_is_named_once():
    class Pointer:
        counter = 0

        def __reduce__(self):
            Pointer.counter += 1
            return (Pointer, (), {"at": Pointer.counter})

        def __setstate__(self, state):
            pass

    with pytest.warns(UnstableKeyWarning, match="Pointer.*register_hasher"):
        fp(Pointer())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fp(Pointer())  # once per type


def test_fortran_ordered_matrices_key_as_their_c_order_copy():
    for shape in [(300, 700), (5000, 3), (3, 5000)]:
        a = np.asfortranarray(np.random.default_rng(0).random(shape))
        assert fp(a) == fp(np.ascontiguousarray(a))
        b = a.copy(order="F")
        b[-1, -1] += 1
        assert fp(b) != fp(a)


def test_keying_values_imports_no_ml_library():
    code = ("import sys, numpy as np, casmon; casmon.fingerprint([1, {'a': np.zeros(3)}, object]);"
            "print([m for m in ('torch', 'jax', 'polars', 'pyarrow', 'scipy', 'xarray', 'PIL', 'datasets') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True,
                         env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert out.stdout.strip() == "[]"


# -- near-misses: equal keys mean values a function cannot tell apart ---------------------------------------
def _tensor_same(a, b):
    if type(a) is not type(b) or a.dtype != b.dtype or a.shape != b.shape or a.layout != b.layout:
        return False
    if a.requires_grad != b.requires_grad:
        return False
    if a.layout == torch.sparse_coo:
        return a.is_coalesced() == b.is_coalesced() and _tensor_same(a._indices(), b._indices()) and _tensor_same(a._values(), b._values())
    x, y = a.detach().resolve_conj().resolve_neg(), b.detach().resolve_conj().resolve_neg()
    return x.contiguous().reshape(-1).view(torch.uint8).tolist() == y.contiguous().reshape(-1).view(torch.uint8).tolist()


@st.composite
def tensors(draw):
    dtype = draw(st.sampled_from(["float32", "float64", "int64", "bfloat16", "bool", "complex64"]))
    shape = draw(st.sampled_from([(2,), (1, 2), (2, 1)]))
    vals = draw(st.lists(st.sampled_from([0, 1]), min_size=2, max_size=2))
    t = torch.tensor(vals).to(getattr(torch, dtype)).reshape(shape)
    kind = draw(st.sampled_from(["plain", "grad", "param", "conj", "T", "sparse"]))
    if kind == "grad" and t.is_floating_point():
        t = t.requires_grad_(True)
    elif kind == "param" and t.is_floating_point():
        t = torch.nn.Parameter(t)
    elif kind == "conj" and t.is_complex():
        t = t.conj()
    elif kind == "T" and t.ndim == 2:
        t = t.T
    elif kind == "sparse" and dtype != "bfloat16":
        t = t.to_sparse()
        if draw(st.booleans()):
            t = t.coalesce()
    return t


def _arrow_same(a, b):
    ca = a if isinstance(a, pa.ChunkedArray) else pa.chunked_array([a])
    cb = b if isinstance(b, pa.ChunkedArray) else pa.chunked_array([b])
    return type(a) is type(b) and ca.type == cb.type and ca.to_pylist() == cb.to_pylist() and str(ca.type) == str(cb.type)


@st.composite
def arrow_values(draw):
    typ = draw(st.sampled_from([pa.int64(), pa.int32(), pa.float64(), pa.string(), pa.large_string(), pa.list_(pa.int64()), pa.bool_()]))
    items = draw(st.lists(st.sampled_from([0, 1, None]), min_size=1, max_size=5))
    conv = {pa.string(): str, pa.large_string(): str, pa.bool_(): bool}.get(typ, None)
    vals = [None if x is None else ([x] * x if pa.types.is_list(typ) else (conv(x) if conv else x)) for x in items]
    arr = pa.array(vals, type=typ)
    off = draw(st.integers(0, len(arr) - 1))
    arr = arr.slice(off, draw(st.integers(0, len(arr) - off)))
    if draw(st.booleans()) and len(arr) > 1:
        cut = draw(st.integers(0, len(arr)))
        return pa.chunked_array([arr.slice(0, cut), arr.slice(cut)], type=typ)
    return arr


def _sparse_same(a, b):
    if type(a) is not type(b) or a.shape != b.shape or a.dtype != b.dtype:
        return False
    return all(getattr(a, k).dtype == getattr(b, k).dtype and np.array_equal(getattr(a, k), getattr(b, k))
               for k in ("data", "indices", "indptr"))


@st.composite
def sparse_values(draw):
    dense = np.array(draw(st.lists(st.sampled_from([0.0, 1.0, 2.0]), min_size=4, max_size=4))).reshape(2, 2)
    cls = draw(st.sampled_from([sp.csr_matrix, sp.csr_array, sp.csc_matrix]))
    m = cls(dense.astype(draw(st.sampled_from(["f8", "f4"]))))
    if draw(st.booleans()):
        m.indices = m.indices.astype(np.int64)
    return m


def _image_same(a, b):
    return (type(a) is type(b) and a.mode == b.mode and a.size == b.size and a.tobytes() == b.tobytes()
            and a.info == b.info and a.getpalette() == b.getpalette())


@st.composite
def images(draw):
    mode = draw(st.sampled_from(["L", "RGB", "P", "1"]))
    size = draw(st.sampled_from([(1, 2), (2, 1), (2, 2)]))
    im = Image.new(mode, size, draw(st.sampled_from([0, 1])))
    if draw(st.booleans()):
        im.info["dpi"] = draw(st.sampled_from([(72, 72), (96, 96)]))
    return im


FAMILIES = {"arrow": (arrow_values(), _arrow_same), "scipy": (sparse_values(), _sparse_same), "pil": (images(), _image_same)}
if torch is not None:
    FAMILIES["torch"] = (tensors(), _tensor_same)


@pytest.mark.parametrize("family", sorted(FAMILIES))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_equal_keys_mean_values_a_function_cannot_tell_apart(family, data):
    strategy, same = FAMILIES[family]
    a, b = data.draw(strategy, label="a"), data.draw(strategy, label="b")
    if fp(a) == fp(b):
        assert same(a, b), f"fingerprint collision between values a function can tell apart:\n{a!r}\n{b!r}"


# -- near-misses found by attacking the keys ----------------------------------------------------------------
def test_what_a_function_can_see_beyond_the_values_counts():
    jnp = pytest.importorskip("jax.numpy")
    assert fp(jnp.asarray(1.0)) != fp(jnp.float32(1.0)), "weak_type changes what arithmetic gives"
    a = xr.DataArray(np.arange(3.0), coords={"x": [1, 2, 3]}, dims="x")
    assert fp(a) != fp(a.drop_indexes("x")), "indexes count"
    s = pl.Series([3, 1, 2])
    assert fp(s) != fp(s.set_sorted()), "polars' sorted flag changes max()"
    rgb, rgba = Image.new("P", (1, 1)), Image.new("P", (1, 1))
    rgb.putpalette([10, 20, 30] * 256)
    rgba.putpalette([10, 20, 30, 0] * 256, rawmode="RGBA")
    assert fp(rgb) != fp(rgba), "a palette's alpha counts"


def test_an_order_a_getstate_gives_counts():
    class Recent:
        def __init__(self, keys):
            self.d = dict.fromkeys(keys)

        def __getstate__(self):
            return dict(self.d)  # its order is its meaning (oldest first)

        def __setstate__(self, state):
            self.d = state

    assert fp(Recent("xy")) != fp(Recent("yx"))


@needs_torch
def test_strided_tensors_and_gradients_key_by_content():
    t = torch.arange(10.0)
    assert fp(t[::2]) == fp(t[::2].clone()) == fp(torch.tensor([0.0, 2, 4, 6, 8]))
    assert fp(torch.ones(1).expand(4)) == fp(torch.ones(4))
    z = torch.tensor([1 + 2j, 3 - 1j])
    assert fp(z.imag) == fp(torch.tensor([2.0, -1.0]))
    g = torch.ones(2, requires_grad=True)
    h = torch.ones(2, requires_grad=True)
    g.grad = torch.ones(2)
    assert fp(g) != fp(h), "a leaf's .grad counts"


def test_arrow_values_under_nulls_and_views_do_not_count():
    pc = pytest.importorskip("pyarrow.compute")
    filled = pc.if_else(pa.array([True, False]), pa.array([5, 7]), pa.scalar(None, pa.int64()))
    assert fp(filled) == fp(pa.array([5, None]))
    s = pc.if_else(pa.array([True, False]), pa.array(["a", "bcd"]), pa.scalar(None, pa.string()))
    assert fp(s) == fp(pa.array(["a", None]))
    if hasattr(pa, "string_view"):
        v = pa.array(["abc", "de", "f"], pa.string_view())
        assert fp(v.slice(1)) == fp(pa.array(["de", "f"], pa.string_view()))
        assert fp(v) != fp(pa.array(["abc", "de", "f"], pa.large_string())), "the type still counts"


def test_file_backed_arrow_and_streaming_datasets_are_not_keyed(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    pds = pytest.importorskip("pyarrow.dataset")
    p = tmp_path / "t.parquet"
    pq.write_table(pa.table({"a": [1, 2]}), p)
    for lazy in (pds.dataset(p), pq.ParquetFile(p)):
        with pytest.raises(NotKeyableError):
            fp(lazy)
    datasets = pytest.importorskip("datasets")
    j = tmp_path / "d.jsonl"
    j.write_text('{"a": 1}\n')
    with pytest.raises(NotKeyableError, match="IterableDataset"):
        fp(datasets.load_dataset("json", data_files=str(j), split="train", streaming=True))


def test_pandas_backed_xarray_coords_count_their_dtype():
    pd = pytest.importorskip("pandas")
    times = pd.date_range("2024-01-01", periods=2, freq="h", tz="UTC")
    utc = xr.DataArray([1, 2], coords={"t": times}, dims="t")
    eastern = xr.DataArray([1, 2], coords={"t": times.tz_convert("US/Eastern")}, dims="t")
    assert fp(utc) != fp(eastern)
    cats = xr.DataArray([1, 2], coords={"c": pd.CategoricalIndex(["a", "b"], categories=["b", "a"])}, dims="c")
    plain = xr.DataArray([1, 2], coords={"c": pd.Index(["a", "b"], dtype=object)}, dims="c")
    assert fp(cats) != fp(plain)


def test_a_custom_reduction_keeps_its_state_order():
    import copyreg

    class Ordered:
        def __init__(self, keys):
            self.d = dict.fromkeys(keys)

        def __reduce__(self):
            return (Ordered, ("",), dict.fromkeys(self.d))

    assert fp(Ordered("xy")) != fp(Ordered("yx"))

    class Registered:
        def __init__(self, keys):
            self.keys = keys

    copyreg.pickle(Registered, lambda r: (Registered, ("",), dict.fromkeys(r.keys)))
    try:
        assert fp(Registered("xy")) != fp(Registered("yx"))
    finally:
        copyreg.dispatch_table.pop(Registered, None)


def test_polars_bookkeeping_flags_do_not_count():
    import io

    a = pl.DataFrame({"l": [[1], [2, 3]]})
    f = io.BytesIO()
    a.write_ipc(f)
    f.seek(0)
    b = pl.read_ipc(f)  # equal, without polars' FAST_EXPLODE flag
    assert a.equals(b) and fp(a) == fp(b)


@pytest.mark.parametrize("dtype", ["Int64", "UInt8", "boolean", "Float32"])
def test_a_nullable_columns_key_is_the_same_after_pandas_memoizes_its_dtypes_properties(dtype):
    """pandas memoizes a nullable dtype's derived properties on the (shared) dtype as first asked for: a frame's
    key is the same before and after, so loading or reading one frame never changes another's key."""
    pd = pytest.importorskip("pandas")
    import numpy as np

    from casmon.keys.fingerprint import fingerprint

    df = pd.DataFrame({"i": pd.array([1, None, 0], dtype=dtype)})
    before = fingerprint(df)
    df["i"].dtype.numpy_dtype  # what to_numpy(dtype=..., na_value=...) does inside pandas
    df["i"].array.to_numpy(dtype=df["i"].dtype.numpy_dtype, na_value=np.zeros((), df["i"].dtype.numpy_dtype)[()])
    assert "_cache" in vars(df["i"].dtype) or dtype == "boolean"  # boolean's is a plain property
    assert fingerprint(df) == before
