"""The store opened as a read-only zarr v3 hierarchy (casmon/store/zarrview.py): cache entries as arrays over
their stored chunks, runs' metrics as step/value/time arrays, consolidated at the root."""

import asyncio

import numpy as np
import pytest
import zarr

import casmon
from casmon.errors import CasmonError, DamagedObjectError
from casmon.keys.digest import Digest
from casmon.store.zarrview import node_name
from tests.support.damage import damage_cached_result


def _open(view, **kw):
    return zarr.open_group(view, mode="r", **kw)


def _entry(view, cached, *args):
    ref = cached.ref(*args)
    return f"cache/{node_name(cached.__casmon_cache__.name)}/{ref.key.hex()}", ref


ARRAYS = [
    np.arange(10_000, dtype="f8"),
    np.arange(60_000, dtype=">i4").reshape(300, 200),
    np.random.default_rng(0).random((333, 70)).astype(np.float32),
    np.asfortranarray(np.random.default_rng(1).random((120, 90))),
    np.arange(10, dtype=np.int8),
    np.array([True, False] * 500),
    np.array(7.5),
    np.zeros((0, 5), dtype="u2"),
    np.arange(4000, dtype=np.complex64),
]


def test_a_cached_array_read_through_the_view_equals_its_load(tmp_path):
    s = casmon.open(tmp_path / "s", chunk_size=1 << 12)

    @casmon.cache(store=s)
    def make(i):
        return ARRAYS[i]

    for i in range(len(ARRAYS)):
        make(i)
    s.flush()
    root = _open(s.zarr())
    for i, a in enumerate(ARRAYS):
        path, ref = _entry(root, make, i)
        z = root[path]
        want = ref.load()
        assert isinstance(z, zarr.Array), path
        native = want.dtype.newbyteorder("=")  # zarr v3 reads in the machine's byte order, as the bytes codec says
        assert z.shape == want.shape and z.dtype == native, (i, z.dtype, want.dtype)
        got = z[...]
        assert np.array_equal(got, want) and got.dtype == native
        assert z.attrs["casmon"]["result"] == ref.digest.hex()


def test_the_view_walks_with_consolidated_metadata_and_refuses_writes(tmp_path):
    s = casmon.open(tmp_path / "s")

    @casmon.cache(store=s)
    def f(n):
        return np.arange(n)

    f(3)
    with casmon.record(store=s, capture_output=False, params={"lr": float("inf"), "nan": float("nan")}) as run:
        run.log(loss=0.5, step=1)
    s.flush()
    view = s.zarr(consolidated=True)
    assert view.supports_writes is False
    root = zarr.open_consolidated(view, mode="r")
    assert root.metadata.consolidated_metadata is not None
    names = {k for k, _m in root.members(max_depth=None)}
    # the view read as asked for lists the same tree
    assert {k for k, _m in zarr.open_group(s.zarr(), mode="r").members(max_depth=None)} == names
    rname = casmon.list_runs(s)[0].ref.split("/", 1)[-1]
    assert {f"runs/{rname}/metrics/loss/step", f"runs/{rname}/metrics/loss/value",
            f"runs/{rname}/metrics/loss/time"} <= names
    assert root[f"runs/{rname}"].attrs["params"] == {"lr": "Infinity", "nan": "NaN"}
    assert root[f"runs/{rname}"].attrs["status"] == "ok"
    # without consolidated metadata too: the listing is the same tree
    assert {k for k, _m in zarr.open_group(view, mode="r", use_consolidated=False).members(max_depth=None)} == names
    with pytest.raises(PermissionError):
        asyncio.run(view.set("x/zarr.json", None))
    with pytest.raises(PermissionError):
        asyncio.run(view.delete("zarr.json"))


def test_a_runs_group_carries_its_tags_and_note_with_later_edits_applied(tmp_path):
    from casmon.runs.tags import note_run, tag_run

    s = casmon.open(tmp_path / "s")
    with casmon.record(store=s, capture_output=False, tags=["base", "drop"]) as run:
        run.log(loss=0.5, step=1)
    with casmon.record(store=s, capture_output=False) as run2:
        run2.log(loss=0.4, step=1)
    first, second = casmon.list_runs(s)
    tag_run(first.name, add=["best"], remove=["drop"], store=s)  # after the run ended
    note_run(first.name, "the one to keep", store=s)
    s.flush()
    name = first.ref.split("/", 1)[-1]
    other = second.ref.split("/", 1)[-1]
    for root in (zarr.open_consolidated(s.zarr(consolidated=True), mode="r"), zarr.open_group(s.zarr(), mode="r")):
        attrs = root[f"runs/{name}"].attrs  # the bulk listing and a run read alone say the same
        assert attrs["tags"] == ["base", "best"] and attrs["note"] == "the one to keep"
        assert root[f"runs/{other}"].attrs["tags"] == [] and "note" not in root[f"runs/{other}"].attrs
    alone = zarr.open_group(s.zarr(), mode="r", path=f"runs/{name}")
    assert alone.attrs["tags"] == ["base", "best"] and alone.attrs["note"] == "the one to keep"


def test_a_runs_metric_read_as_arrays_equals_load_run(tmp_path):
    from casmon.runs.zarrtree import METRIC_CHUNK

    s = casmon.open(tmp_path / "s")
    n = METRIC_CHUNK * 2 + 123
    with casmon.record(store=s, capture_output=False) as run:
        for i in range(n):
            run.log(loss=float(np.sin(i)), step=i * 2)
            if i % 5000 == 0:
                s.flush()  # several batches, not aligned with chunks
    r = casmon.load_run(-1, store=s)
    want = r.metric("loss")
    g = _open(s.zarr())[f"runs/{r.ref.split('/', 1)[-1]}/metrics/loss"]
    assert np.array_equal(g["step"][:], want.steps) and g["step"].dtype == np.int64
    assert np.array_equal(g["value"][:], want.values)
    assert np.array_equal(g["time"][:], want.times)
    assert np.array_equal(g["value"][METRIC_CHUNK - 3 : METRIC_CHUNK + 3], want.values[METRIC_CHUNK - 3 : METRIC_CHUNK + 3])


def test_xarray_opens_a_runs_metrics_group(tmp_path):
    xr = pytest.importorskip("xarray")
    s = casmon.open(tmp_path / "s")
    with casmon.record(store=s, capture_output=False) as run:
        for i in range(100):
            run.log(loss=1.0 / (i + 1), step=i)
    r = casmon.load_run(-1, store=s)
    view = s.zarr()
    for consolidated in (False, None):
        ds = xr.open_zarr(view, group=f"runs/{r.ref.split('/', 1)[-1]}/metrics/loss", consolidated=consolidated)
        assert np.array_equal(ds["step"].values, r.metric("loss").steps)
        assert np.array_equal(ds["value"].values, r.metric("loss").values)


def test_a_damaged_chunk_read_through_the_view_raises_damage(tmp_path):
    s = casmon.open(tmp_path / "s")

    @casmon.cache(store=s)
    def big():
        return np.random.default_rng(5).random(200_000)  # one chunk of its own (loose): the helper flips it

    big()
    s.flush()
    damage_cached_result(s, tmp_path / "s", big)
    path, _ref = _entry(None, big)
    z = _open(s.zarr())[path]
    with pytest.raises(DamagedObjectError):
        z[:]


@pytest.mark.parametrize("damage", ["flip", "truncate", "extend"])
def test_a_damaged_large_chunk_among_sound_ones_raises_damage_through_the_view(tmp_path, damage):
    from casmon.store.objects import loose_key

    s = casmon.open(tmp_path / "s", chunk_size=1 << 20)  # raw chunks of 1 MiB: read through their checked maps

    @casmon.cache(store=s)
    def big():
        return np.random.default_rng(6).random((1024, 512))  # 4 MiB: four chunks of 256 rows

    a = big()
    s.flush()
    path, ref = _entry(None, big)
    z = _open(s.zarr())[path]
    assert z.chunks == (256, 512) and np.array_equal(z[:], a)
    p = tmp_path / "s" / loose_key(list(s.manifest(ref.digest).chunk_digests())[2])
    data = bytearray(p.read_bytes())
    if damage == "flip":
        data[len(data) // 3] ^= 4
    elif damage == "truncate":
        del data[-8:]
    else:
        data += b"\0" * 8
    p.write_bytes(bytes(data))
    s.objects.clear_caches()
    z = _open(s.zarr())[path]
    assert np.array_equal(z[:256], a[:256])  # a sound chunk still reads
    for sl in (slice(None), slice(600, 700)):
        with pytest.raises(DamagedObjectError):
            z[sl]


def test_a_slice_reads_only_the_chunks_it_touches(tmp_path, monkeypatch):
    s = casmon.open(tmp_path / "s", chunk_size=1 << 12)  # 512 float64 a chunk

    @casmon.cache(store=s)
    def big():
        return np.arange(100_000, dtype="f8")

    a = big()
    s.flush()
    reads = []
    real = s.read_chunk
    monkeypatch.setattr(s, "read_chunk", lambda d, out: (reads.append(d), real(d, out))[1])
    path, _ref = _entry(None, big)
    z = _open(s.zarr())[path]
    assert not reads  # opening reads metadata only
    assert np.array_equal(z[1100:1200], a[1100:1200])  # inside chunk 2
    assert len(reads) == 1
    assert np.array_equal(z[1000:2000], a[1000:2000])  # chunks 1 to 3
    assert len(reads) == 1 + 3


class Opaque:
    def __init__(self):
        self.blob = b"x" * 100


def test_the_view_never_unpickles_and_describes_pickles(tmp_path, monkeypatch):
    s = casmon.open(tmp_path / "s")

    @casmon.cache(store=s)
    def both(which):
        return Opaque() if which else np.arange(7)

    both(0), both(1)
    s.flush()
    s.close()
    import pickle

    def boom(*a, **k):
        raise AssertionError("the view unpickled")

    monkeypatch.setattr(pickle, "loads", boom)
    monkeypatch.setattr(pickle, "Unpickler", boom)
    t = casmon.open(tmp_path / "s", trust=False)
    root = _open(t.zarr())
    arr_path, _ = _entry(None, both, 0)  # the key does not depend on the store's trust
    assert np.array_equal(root[arr_path][:], np.arange(7))
    pk = _entry(None, both, 1)[0]
    node = root[pk]
    assert isinstance(node, zarr.Group) and not list(node.keys())
    about = node.attrs["casmon"]
    assert about["tag"] == "pickle" and "Opaque" in about["type"] and about["size"] > 0


@pytest.mark.parametrize("text, want", [("a/b", "a%2Fb"), ("__main__.f", "%5F_main__.f"), ("", "%"), (".", "%2E"),
                                        ("..", "%2E%2E"), ("50%", "50%25"), ("plain.name", "plain.name")])
def test_names_are_one_node_each(text, want):
    assert node_name(text) == want


def test_values_zarr_cannot_present_and_crafted_entries_are_described_groups(tmp_path):
    s = casmon.open(tmp_path / "s")
    odd = {"big_endian_field": np.zeros(3, dtype=[("a", ">i4"), ("b", "<f8")]), "objects": np.array([1, "a"], dtype=object),
           "dict": {"a": 1}}

    @casmon.cache(store=s)
    def f(k):
        return odd[k]

    for k in odd:
        f(k)
    s.append("cache", {"fn": "crafted.fn", "time": 1e9 + 1, "result": "not a digest"}, key=b"\x01" * 16)
    s.flush()
    root = _open(casmon.zarr_view(s))
    for k in odd:
        node = root[_entry(None, f, k)[0]]
        assert isinstance(node, zarr.Group) and node.attrs["casmon"]["description"], k
    crafted = root["cache/crafted.fn/" + "01" * 16]
    assert isinstance(crafted, zarr.Group) and "not a value digest" in crafted.attrs["casmon"]["error"]


def test_metric_names_zarr_reserves_or_splits_are_escaped(tmp_path):
    s = casmon.open(tmp_path / "s")
    with casmon.record(store=s, capture_output=False) as run:
        run.log(**{"a/b": 1.0, "__x": 2.0, "c": 3.0})
    r = casmon.load_run(-1, store=s)
    g = _open(s.zarr())[f"runs/{r.ref.split('/', 1)[-1]}/metrics"]
    assert sorted(g.group_keys()) == ["%5F_x", "a%2Fb", "c"]
    assert g["a%2Fb"].attrs["metric"] == "a/b" and g["a%2Fb/value"][:].tolist() == [1.0]
    assert g["c/value"][:].tolist() == [3.0]  # a metric named like zarr's chunk prefix is still a group


def test_a_damaged_metric_batch_read_through_the_view_raises_damage(tmp_path):
    from casmon.runs.metrics import INLINE_POINTS, metrics_key

    s = casmon.open(tmp_path / "s")
    with casmon.record(store=s, capture_output=False) as run:
        for i in range(INLINE_POINTS * 40):  # one batch past the inline limit: a stored value of its own
            run.log(loss=float(i), step=i)
    s.flush()
    r = casmon.load_run(-1, store=s)
    view = s.zarr()
    batch_values = [c["$"] for rec in s.lookup("metrics", metrics_key(r.ref))
                    for c in rec["s"].values() if "$" in c]
    assert batch_values
    m = s.manifest(batch_values[0])
    from casmon.store.objects import loose_key

    chunk = next(m.chunk_digests())
    p = tmp_path / "s" / loose_key(chunk)
    if not p.exists():
        pytest.skip("the batch's chunk is packed, not a loose file")
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 1
    p.write_bytes(bytes(data))
    s.objects.clear_caches()
    g = _open(view)[f"runs/{r.ref.split('/', 1)[-1]}/metrics/loss"]
    with pytest.raises(DamagedObjectError):
        g["value"][:]


@pytest.mark.parametrize("dt, shape, chunks, fortran", [
    ("f8", (100, 3), (10, 3), False), (">i4", (5,), (2,), False), ("f4", (4, 6, 8), (4, 6, 2), True),
    ("U3", (7,), (7,), False), ("f8", (), (), False), ("M8[s]", (0, 5), (1, 5), False)])
def test_an_arrays_metadata_made_from_its_kinds_template_is_zarrs_own(dt, shape, chunks, fortran):
    """The view describes thousands of arrays from one template per dtype, layout and rank: what zarr itself writes."""
    import json
    import warnings

    from zarr.codecs import BytesCodec, TransposeCodec
    from zarr.storage import MemoryStore

    from casmon.store.arrayview import _metadata

    dt = np.dtype(dt)
    kw = {"compressors": None, "fill_value": np.zeros((), dtype=dt).item() if dt.kind not in "SUVO" else None,
          "filters": [TransposeCodec(order=tuple(reversed(range(len(shape)))))] if fortran else None}
    if dt.byteorder == ">":
        kw["serializer"] = BytesCodec(endian="big")
    scratch = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        zarr.create_array(MemoryStore(scratch), shape=shape, chunks=chunks, dtype=dt, zarr_format=3, **kw)
    assert json.loads(_metadata(dt, shape, chunks, fortran)) == json.loads(scratch["zarr.json"].to_bytes())


_VIEW_WITHOUT_TORCH = """
import sys, json, zarr, casmon
s = casmon.open(sys.argv[1])
root = zarr.open_group(s.zarr(), mode="r")
got = {}
for path in sys.argv[2:]:
    node = root[path]
    got[path] = ([node.dtype.str, list(node.shape), node[...].tobytes().hex(), dict(node.attrs)] if isinstance(node, zarr.Array)
                 else dict(node.attrs))
assert "torch" not in sys.modules, "the view imported torch"
print(json.dumps(got))
"""


def test_a_tensor_is_the_same_array_whether_or_not_the_program_imported_torch(tmp_path):
    import json
    import subprocess
    import sys

    torch = pytest.importorskip("torch")
    s = casmon.open(tmp_path / "s")
    tensors = [torch.arange(1000, dtype=torch.float32), torch.arange(60, dtype=torch.int64).reshape(3, 4, 5),
               torch.tensor([True, False]), torch.ones(3, dtype=torch.float16), torch.zeros(2, 2, dtype=torch.uint8),
               torch.ones(4, dtype=torch.complex64) * (1 + 2j), torch.ones(3, dtype=torch.bfloat16)]

    @casmon.cache(store=s)
    def t(i):
        return tensors[i]

    paths = []
    for i in range(len(tensors)):
        t(i)
        paths.append(_entry(None, t, i)[0])
    s.flush()
    root = _open(s.zarr())
    with_torch = {}
    for i, path in enumerate(paths):
        node = root[path]
        if isinstance(node, zarr.Array):
            assert np.array_equal(node[...], t.ref(i).load().numpy())
            with_torch[path] = [node.dtype.str, list(node.shape), node[...].tobytes().hex(), dict(node.attrs)]
        else:
            with_torch[path] = dict(node.attrs)
    assert isinstance(root[paths[-1]], zarr.Group)  # bfloat16: numpy has no such type
    s.close()
    done = subprocess.run([sys.executable, "-c", _VIEW_WITHOUT_TORCH, str(tmp_path / "s"), *paths], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    without = json.loads(done.stdout)
    for path in paths[:-1]:
        assert without[path] == json.loads(json.dumps(with_torch[path])), path
    assert "import torch before opening the view" in without[paths[-1]]["casmon"]["note"]


def test_opening_the_view_reads_no_value_laid_out_for_mapping_and_its_damage_raises_on_read(tmp_path, monkeypatch):
    from casmon.store import mapped
    from casmon.store.objects import loose_key

    s = casmon.open(tmp_path / "s")

    @casmon.cache(store=s, mmap=True)
    def big():
        return np.random.default_rng(2).random((3000, 1000))  # 24 MB, one raw object

    a = big()
    s.flush()
    m = s.manifest(big.ref().digest)
    assert len(m.parts[0]["c"]) == 1
    maps = []
    real = mapped.map_part
    monkeypatch.setattr(mapped, "map_part", lambda *a, **k: (maps.append(1), real(*a, **k))[1])
    path = _entry(None, big)[0]
    view = s.zarr()
    z = _open(view)[path]
    assert not maps  # nothing of it read yet
    assert np.array_equal(z[1234], a[1234]) and np.array_equal(z[...], a)
    assert len(maps) == 1  # mapped and checked once
    f = tmp_path / "s" / loose_key(Digest(m.parts[0]["c"][0]))
    raw = bytearray(f.read_bytes())
    raw[len(raw) // 2] ^= 1
    f.write_bytes(bytes(raw))
    s.objects.clear_caches()
    z = _open(s.zarr())[path]  # opens: its damage is found when read
    with pytest.raises(DamagedObjectError):
        z[0]


@pytest.mark.parametrize("cell", [{"n": 2**70, "b64": ""}, {"n": 2**62, "b64": ""}, {"n": 5, "b64": "AAAA"},
                                  {"n": 2**62, "$": "0" * 32}], ids=["n-past-int64", "n-past-memory", "short", "stored"])
def test_a_crafted_metric_batch_length_is_a_metric_with_an_error_not_an_array_readers_choke_on(tmp_path, cell):
    import xarray as xr

    from casmon.runs.metrics import KIND_METRICS, metrics_key

    s = casmon.open(tmp_path / "s", create=True)
    with casmon.record(store=s, capture_output=False) as run:
        run.log(good=1.0)
    s.append(KIND_METRICS, {"run": run.ref, "seq": 50, "s": {"bad": cell}}, key=metrics_key(run.ref))
    s.flush()
    view = s.zarr()
    g = _open(view)[f"runs/{run.name}/metrics"]
    assert "batch" in g["bad"].attrs["error"] and list(g["bad"].array_keys()) == []
    assert g["good"]["value"][:].tolist() == [1.0]
    assert len(xr.open_zarr(view, group=f"runs/{run.name}/metrics/bad").data_vars) == 0


def test_an_xarray_dataset_result_opens_lazily_with_xr_open_zarr_equal_to_the_cached_value(tmp_path, monkeypatch):
    xr = pytest.importorskip("xarray")
    import pandas as pd

    s = casmon.open(tmp_path / "s", chunk_size=1 << 12)
    ds = xr.Dataset({"t": (("x", "y"), np.random.default_rng(0).random((2000, 4)), {"units": "K"}),
                     "z": ("x", np.arange(2000, dtype="i2"))},
                    coords={"x": np.arange(2000) * 10, "y": pd.date_range("2020", periods=4),
                            "lab": ("y", np.array(["a", "b", "c", "d"]))}, attrs={"title": "t"})

    @casmon.cache(store=s)
    def make(which):
        return ds if which == "ds" else ds["t"].rename(None)

    make("ds"), make("da")
    s.flush()
    view = s.zarr()
    reads = []
    real = s.read_chunk
    monkeypatch.setattr(s, "read_chunk", lambda d, out: (reads.append(d), real(d, out))[1])
    got = xr.open_zarr(view, group=_entry(None, make, "ds")[0])
    assert len(reads) <= 6  # lazily: xarray reads the index coordinates (x: 4 chunks, y: 1), not t's 16 chunks
    assert got["t"].attrs["units"] == "K" and got["t"].dims == ("x", "y") and "lab" in got.coords
    assert got.load().equals(ds) and got.attrs["title"] == "t"
    da = xr.open_zarr(view, group=_entry(None, make, "da")[0])["data"]
    assert da.load().equals(ds["t"].rename(None))


def test_a_dataframe_result_is_a_group_of_column_arrays_and_its_index(tmp_path):
    import pandas as pd

    s = casmon.open(tmp_path / "s")
    df = pd.DataFrame({"a": np.arange(5), "b": np.linspace(0, 1, 5), 3: [True] * 5},
                      index=pd.Index(np.arange(5) * 2.5, name="k"))

    @casmon.cache(store=s)
    def make():
        return df

    make()
    s.flush()
    g = _open(s.zarr())[_entry(None, make)[0]]
    assert sorted(g.array_keys()) == ["3", "a", "b", "index"] and g.attrs["columns"] == ["a", "b", 3]
    for c in df.columns:
        assert np.array_equal(g[str(c)][:], df[c].to_numpy()) and g[str(c)].metadata.dimension_names == ("index",)
    assert np.array_equal(g["index"][:], df.index.to_numpy()) and g.attrs["index_name"] == "k"


def test_a_frames_crafted_part_layout_is_described_not_presented(tmp_path):
    import pandas as pd

    s = casmon.open(tmp_path / "s")

    @casmon.cache(store=s)
    def make():
        return pd.DataFrame({"a": np.arange(5.0)})

    make()
    s.flush()
    m = s.manifest(make.ref().digest)
    crafted = dict(m.meta)
    crafted["meta"] = {**m.meta["meta"], "columns": [{"name": "a", "array": {"dtype": "'<f8'", "shape": [10**9], "order": "C"}}]}
    from casmon.store import arrayview

    with pytest.raises(ValueError, match="holds 40 bytes"):
        arrayview.chunk_view(s, m, part=0, layout=crafted["meta"]["columns"][0]["array"])


def test_an_array_whose_stored_chunks_split_rows_is_described_never_presented_wrong(tmp_path):
    import copy

    from casmon.store import arrayview

    s = casmon.open(tmp_path / "s", chunk_size=1 << 12)

    @casmon.cache(store=s)
    def make():
        return np.arange(60_000, dtype="i4").reshape(300, 200)  # rows of 800 bytes, 5 to a chunk

    make()
    s.flush()
    m = s.manifest(make.ref().digest)
    assert arrayview.chunk_view(s, m)  # as stored: whole rows
    crafted = copy.copy(m)
    crafted.parts = [dict(m.parts[0], rb=4)]  # chunk boundaries said to fall anywhere: a zarr chunk is not a stored one
    with pytest.raises(ValueError, match="whole rows"):
        arrayview.chunk_view(s, crafted)


def test_logged_calls_arguments_and_results_are_nodes_of_the_view(tmp_path, monkeypatch):
    s = casmon.open(tmp_path / "s")

    @casmon.intercept(store=s)
    def step(x, lr=0.1, *rest, scale=2, **kw):
        return x * lr

    step(np.arange(5.0), 0.5, 7, Opaque(), scale=3, extra=np.ones(2))
    step(np.arange(3.0))
    s.flush()
    s.close()
    import pickle

    monkeypatch.setattr(pickle, "loads", lambda *a, **k: (_ for _ in ()).throw(AssertionError("unpickled")))
    root = _open(casmon.open(tmp_path / "s", trust=False).zarr())
    fn = node_name(f"{step.__module__}.{step.__qualname__}")
    first = root[f"calls/{fn}/1/1"]
    assert first.attrs["n"] == 1 and first.attrs["exception"] is None
    assert np.array_equal(first["args/x"][:], np.arange(5.0)) and first["args/lr"].attrs["value"] == 0.5
    assert first["args/rest/0"].attrs["value"] == 7 and "Opaque" in first["args/rest/1"].attrs["casmon"]["type"]
    assert first["args/scale"].attrs["value"] == 3 and np.array_equal(first["args/kw/extra"][:], np.ones(2))
    assert np.array_equal(first["result"][:], np.arange(5.0) * 0.5)
    second = root[f"calls/{fn}/1/2"]
    assert second["args/lr"].attrs["value"] == 0.1  # a default the call left out
    assert np.array_equal(second["result"][:], np.arange(3.0) * 0.1)


def test_opening_the_view_reads_no_record_and_a_node_reads_only_what_it_shows(tmp_path, monkeypatch):
    s = casmon.open(tmp_path / "s")

    @casmon.cache(store=s)
    def f(i):
        return np.arange(i)

    for i in range(20):
        f(i)
    runs = []
    for i in range(5):
        with casmon.record(store=s, capture_output=False) as run:
            run.log(loss=float(i))
        runs.append(run)
    s.flush()
    manifests, records = [], []
    real_manifest, real_records = s.manifest, s.records
    monkeypatch.setattr(s, "manifest", lambda d, *a, **k: (manifests.append(d), real_manifest(d, *a, **k))[1])
    monkeypatch.setattr(s, "records", lambda kind, *a, **k: (records.append(kind), real_records(kind, *a, **k))[1])
    root = _open(s.zarr())
    assert not manifests and not records  # open: nothing read
    g = root[f"runs/{runs[2].name}/metrics/loss"]
    assert g["value"][:].tolist() == [2.0]
    assert "cache" not in records and len(manifests) <= 3  # one run's manifest (and its values), no entry
    path, ref = _entry(None, f, 7)
    manifests.clear()
    assert np.array_equal(root[path][:], np.arange(7)) and manifests.count(ref.digest) == 1 and len(set(manifests)) == 1


def test_a_node_whose_records_cannot_be_presented_is_a_group_saying_why_and_the_rest_stays(tmp_path, monkeypatch):
    import casmon.runs.zarrtree as runs_tree

    s = casmon.open(tmp_path / "s")
    names = []
    for i in range(2):
        with casmon.record(store=s, capture_output=False) as run:
            run.log(loss=float(i))
        names.append(run.name)
    s.flush()
    real = runs_tree._run

    def crafted(store, tree, r):  # a record no builder foresaw: whatever it raises stays in its node
        if r.name == names[0]:
            raise KeyError("crafted")
        real(store, tree, r)

    monkeypatch.setattr(runs_tree, "_run", crafted)
    root = _open(s.zarr())
    assert root[f"runs/{names[0]}"].attrs["casmon"]["error"] == "KeyError: 'crafted'"
    assert root[f"runs/{names[1]}/metrics/loss/value"][:].tolist() == [1.0]


def test_frame_columns_equal_as_text_are_each_an_array_none_hidden(tmp_path):
    """Columns ``1`` and ``"1"``, and a column named ``index`` beside an index, are each their own array (the
    group's ``arrays`` and ``index_array`` say which): the view never shows one column's values for another."""
    import pandas as pd

    s = casmon.open(tmp_path / "s")
    df = pd.DataFrame({1: [1.0, 2.0], "1": [3.0, 4.0], "index": [5, 6], "1~1": [7, 8]}, index=[10, 20])

    @casmon.cache(store=s)
    def make():
        return df

    make()
    s.flush()
    g = _open(s.zarr())[_entry(None, make)[0]]
    assert len(list(g.array_keys())) == 5 and g.attrs["columns"] == [1, "1", "index", "1~1"]
    for i, name in enumerate(g.attrs["arrays"]):
        assert np.array_equal(g[name][:], df.iloc[:, i].to_numpy()), name
    assert np.array_equal(g[g.attrs["index_array"]][:], df.index.to_numpy())


@pytest.mark.parametrize("meta, error", [
    ({"shape": [1000, 10]}, "holds 8000 bytes"),  # rows past the stored ones would read as zarr's fill value
    ({"shape": [2**40, 2**40]}, "holds 8000 bytes"),  # not a MemoryError on the first read
    ({"shape": [-100, -10]}, "no array layout"),  # negative dimensions whose product is the stored size
    ({"shape": [100.0, 10]}, "no array layout"),
    ({"shape": [True, 8000]}, "no array layout"),
    ({"order": "X"}, "no array layout"),
    ({"dtype": "'V2147483647'", "shape": [0]}, "elements of 2147483647 bytes"),  # zarr would stall on its fill value
])
def test_a_layout_the_stored_part_does_not_hold_is_refused_before_zarr_sees_it(tmp_path, meta, error):
    """Whatever describes an array's layout (a manifest, a tensor handler's array_meta, a frame's column), a shape
    or dtype the stored bytes do not hold exactly is a clean error, never fill values, a hang or a MemoryError."""
    import copy

    from casmon.store import arrayview

    s = casmon.open(tmp_path / "s")
    m = s.manifest(s.put(np.arange(1000.0).reshape(100, 10)))
    crafted = copy.copy(m)
    crafted.meta = {**m.meta, **meta}
    if meta.get("shape") == [0]:
        crafted.parts = [dict(m.parts[0], n=0, c=[])]
    with pytest.raises((ValueError, TypeError), match=error):
        arrayview.chunk_view(s, crafted, lazy=True)
    with pytest.raises((ValueError, TypeError), match=error):  # the same as one column of a frame
        arrayview.chunk_view(s, crafted, lazy=True, part=0, layout=crafted.meta)


def _walk(group):
    """Every node below ``group``: its kind, attributes, and an array's shape and values."""
    out = {}
    for path, node in group.members(max_depth=None):
        if isinstance(node, zarr.Array):
            out[path] = ("array", dict(node.attrs), node.shape, node[...].tolist())
        else:
            out[path] = ("group", dict(node.attrs))
    return out


@pytest.mark.parametrize("whole", [True, False], ids=["whole", "past-whole-max"])
def test_the_runs_groups_consolidated_listing_equals_each_runs_own_nodes_with_a_stale_runs_index(tmp_path, monkeypatch,
                                                                                                whole):
    from casmon.runs import zarrtree

    if not whole:  # more runs than one consolidated listing holds: groups listed, each run's metrics when asked
        monkeypatch.setattr(zarrtree, "WHOLE_MAX", 10)
    s = casmon.open(tmp_path / "s")
    runs = []
    for i in range(6):
        with casmon.record(store=s, capture_output=False, params={"i": i, "lr": 0.1 * i, "x": float("nan")}) as run:
            run.info["note"] = f"r{i}"
            for step in range(i):
                run.log(loss=1.0 / (step + 1), acc=step / 10, step=step)
        runs.append(run)
    s.flush()
    casmon.list_runs(s)  # writes the runs index: every run so far is in it
    assert (tmp_path / "s" / "runs-index" / "base").is_file()
    casmon.delete_run(runs[1].ref, store=s, force=True)  # gone after the index was written
    with casmon.record(store=s, capture_output=False, params={"late": True}) as late:  # new since
        late.log(acc=0.5)
    s.flush()
    want = {node_name(r.ref.split("/", 1)[-1]) for r in casmon.list_runs(s)}
    assert node_name(late.ref.split("/", 1)[-1]) in want and node_name(runs[1].ref.split("/", 1)[-1]) not in want

    g = _open(s.zarr())["runs"]
    # the runs group lists its subtree itself, or, past WHOLE_MAX runs, each run's metrics group does
    assert (g.metadata.consolidated_metadata is not None) is whole
    assert set(g.group_keys()) == want
    if not whole:
        assert all(g[f"{name}/metrics"].metadata.consolidated_metadata is not None for name in want)
    consolidated = _walk(g)
    per_node = {}  # each run opened alone, from a fresh view: read from its ref and manifest, not the index
    fresh = s.zarr()
    for name in want:
        node = zarr.open_group(fresh, path=f"runs/{name}", mode="r", use_consolidated=False)
        per_node[name] = ("group", dict(node.attrs))
        per_node.update({f"{name}/{k}": v for k, v in _walk(node).items()})
    assert consolidated == per_node
    assert consolidated[node_name(runs[3].ref.split("/", 1)[-1])][1]["params"]["x"] == "NaN"
    assert consolidated[f"{node_name(runs[3].ref.split('/', 1)[-1])}/metrics/loss/value"][3] == [1.0, 0.5, 1 / 3]


def test_a_functions_entries_are_listed_from_the_lineage_index_and_the_records_written_since(tmp_path, monkeypatch):
    from casmon.caching import zarrtree
    from casmon.lineage.derived import INDEX_KEY, read_entries

    s = casmon.open(tmp_path / "s")

    @casmon.cache(store=s)
    def f(i):
        return np.arange(i)

    for i in range(1, 4):
        f(i)
    s.flush()
    read_entries(s)  # the derived index written, of three entries
    assert s.backend.get(INDEX_KEY) is not None
    f(4)  # one more since
    s.flush()
    fn = node_name(f.__casmon_cache__.name)
    want = {f.ref(i).key.hex() for i in range(1, 5)}

    def names(view, prefix):
        async def collect():
            return {k async for k in view.list_dir(prefix) if k != "zarr.json"}

        return asyncio.run(collect())

    assert names(s.zarr(), f"cache/{fn}") == want
    monkeypatch.setattr(zarrtree, "_bulk", [])  # the records read one by one: the same entries
    assert names(s.zarr(), f"cache/{fn}") == want

    def unreadable(store):
        raise CasmonError("the index cannot be read")

    monkeypatch.setattr(zarrtree, "_bulk", [unreadable])  # an index that fails: the records still list them
    assert names(s.zarr(), f"cache/{fn}") == want
    f.cache_clear()
    f(2)
    s.flush()
    monkeypatch.undo()
    assert names(s.zarr(), f"cache/{fn}") == {f.ref(2).key.hex()}
    assert _open(s.zarr())[f"cache/{fn}/{f.ref(2).key.hex()}"][:].tolist() == [0, 1]


@pytest.mark.parametrize("whole", [True, False], ids=["whole", "past-whole-max"])
def test_a_damaged_run_ref_and_a_damaged_metric_record_are_error_nodes_in_the_runs_listing_and_hide_no_run(
        tmp_path, monkeypatch, whole):
    from casmon.runs import zarrtree
    from casmon.runs.metrics import KIND_METRICS, metrics_key

    if not whole:
        monkeypatch.setattr(zarrtree, "WHOLE_MAX", 10)
    s = casmon.open(tmp_path / "s", create=True)
    runs = []
    for i in range(3):
        with casmon.record(store=s, capture_output=False) as run:
            run.log(loss=float(i))
        runs.append(run)
    s.append(KIND_METRICS, {"run": runs[2].ref, "seq": "x"}, key=metrics_key(runs[2].ref))  # not {seq, s}
    s.flush()
    casmon.list_runs(s)
    (tmp_path / "s" / "refs" / "runs" / "zz-damaged").write_bytes(b"CSMN garbage")
    names = [node_name(r.ref.split("/", 1)[-1]) for r in runs]
    g = _open(s.zarr())["runs"]
    assert set(g.group_keys()) == {*names, "zz-damaged"}
    assert "error" in g["zz-damaged"].attrs
    assert g[f"{names[0]}/metrics/loss/value"][:].tolist() == [0.0]
    assert "error" in g[f"{names[2]}/metrics"].attrs and g[names[2]].attrs["status"] == "ok"
    fresh = s.zarr()  # each alone, from its ref and manifest: the same nodes
    for name in [*names, "zz-damaged"]:
        alone = zarr.open_group(fresh, path=f"runs/{name}", mode="r", use_consolidated=False)
        assert dict(alone.attrs) == dict(g[name].attrs) and _walk(alone) == _walk(g[name]), name


def test_runs_without_metrics_list_whole_past_whole_max_and_runs_with_metrics_do_not(tmp_path, monkeypatch):
    from casmon.runs import zarrtree

    monkeypatch.setattr(zarrtree, "WHOLE_MAX", 4)
    s = casmon.open(tmp_path / "s")
    for i in range(6):
        with casmon.record(store=s, capture_output=False, params={"i": i}):
            pass
    s.flush()
    g = _open(s.zarr())["runs"]
    assert g.metadata.consolidated_metadata is not None and len(list(g.group_keys())) == 6  # two nodes a run
    for i in range(6):
        with casmon.record(store=s, capture_output=False) as run:
            run.log(loss=float(i), acc=0.5)
    s.flush()
    g = _open(s.zarr())["runs"]
    assert g.metadata.consolidated_metadata is None and len(list(g.group_keys())) == 12
