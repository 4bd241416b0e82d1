"""``store.export_zarr`` / ``casmon export --zarr`` (casmon/store/zarrexport.py): a real zarr v3 hierarchy that
zarr-python, xarray and tensorstore open in a process where casmon cannot be imported."""

import os
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import zarr

import casmon
from casmon.errors import DamagedObjectError
from casmon.store.zarrexport import ExportError, layout
from casmon.store.zarrview import node_name
from tests.support.cli import cli
from tests.support.damage import damage_cached_result

#: Opens an export with zarr (every array), tensorstore (numeric arrays) and xarray (metric groups), in a
#: process where ``import casmon`` fails; writes what it read as a pickle of plain numpy values.
_READER = textwrap.dedent(
    """
    import sys, pickle, warnings
    sys.modules["casmon"] = None  # casmon is not installed, as far as this process can tell
    warnings.simplefilter("ignore")
    try:
        import casmon
    except ImportError:
        pass
    else:
        raise SystemExit("casmon imported")
    import numpy as np, zarr
    kind, where, out = sys.argv[1:4]
    if kind == "folder":
        store = where
    elif kind == "zip":
        store = zarr.storage.ZipStore(where, mode="r")
    else:
        import obstore.store, os
        bucket, _, prefix = where[len("s3://"):].partition("/")
        store = zarr.storage.ObjectStore(obstore.store.S3Store(
            bucket, prefix=prefix, endpoint=os.environ["AWS_ENDPOINT_URL"], region="us-east-1",
            virtual_hosted_style_request=False, client_options={"allow_http": True}), read_only=True)
    root = zarr.open_group(store, mode="r")
    got = {"zarr": {}, "groups": {}, "tensorstore": {}, "xarray": {}}
    for path, node in root.members(max_depth=None):
        if isinstance(node, zarr.Array):
            got["zarr"][path] = node[...]
        else:
            got["groups"][path] = dict(node.attrs)
    try:
        import tensorstore as ts
    except ImportError:
        ts = None
    if ts is not None and kind != "s3":
        for path, a in got["zarr"].items():
            if a.dtype.kind not in "biufc" or a.dtype.fields:
                continue
            if kind == "folder":
                kv = {"driver": "file", "path": where + "/" + path}
            else:
                kv = {"driver": "zip", "base": {"driver": "file", "path": where}, "path": path + "/"}
            got["tensorstore"][path] = ts.open({"driver": "zarr3", "kvstore": kv}, read=True).result().read().result()
    import xarray as xr
    for path, attrs in got["groups"].items():
        if attrs.get("casmon", {}).get("type") in ("xarray.Dataset", "pandas.DataFrame"):
            got["xarray"][path] = xr.open_zarr(store, group=path).load()
        if path.count("/") == 3 and path.split("/")[2] == "metrics":
            ds = xr.open_zarr(store, group=path)
            got["xarray"][path] = {k: ds[k].values for k in ("step", "value", "time")}
    with open(out, "wb") as f:
        pickle.dump(got, f)
    """
)


def read_without_casmon(tmp_path, kind, where, env=None):
    out = tmp_path / f"read-{kind}.pickle"
    e = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    e.update(env or {})
    done = subprocess.run([sys.executable, "-I", "-c", _READER, kind, str(where), str(out)], capture_output=True, text=True,
                          cwd=tmp_path, env=e, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    with open(out, "rb") as f:
        return pickle.load(f)


def entry(cached, *args):
    ref = cached.ref(*args)
    return f"cache/{node_name(cached.__casmon_cache__.name)}/{ref.key.hex()}", ref


NUMPY = [
    np.arange(10_000, dtype="f8"),
    np.arange(60_000, dtype=">i4").reshape(300, 200),
    np.asfortranarray(np.random.default_rng(1).random((120, 90)).astype("f4")),
    np.arange(10, dtype=np.int8),
    np.array([True, False] * 500),
    np.array(7.5),
    np.zeros((0, 5), dtype="u2"),
    np.arange(4000, dtype=np.complex64),
    np.arange(50, dtype="u8").reshape(5, 10),
    np.array([(1, 2.5), (3, -1.0)], dtype=[("a", "<i4"), ("b", "<f8")]),
    np.array(["ab", "c", ""]),
]


class Opaque:
    def __init__(self):
        self.blob = b"x" * 100


def _dataset():
    import pandas as pd
    import xarray as xr

    return xr.Dataset({"t": (("x", "y"), np.random.default_rng(0).random((600, 4)), {"units": "K"}),
                       "z": ("x", np.arange(600, dtype="i2"))},
                      coords={"x": np.arange(600) * 10, "y": pd.date_range("2020", periods=4),
                              "lab": ("y", np.array(["a", "b", "c", "d"]))}, attrs={"title": "t"})


DATASET = _dataset()


def _store_of_every_kind(tmp_path):
    torch = pytest.importorskip("torch")
    jnp = pytest.importorskip("jax.numpy")
    s = casmon.open(tmp_path / "s", chunk_size=1 << 12)
    import pandas as pd

    values = [*NUMPY, DATASET, DATASET["t"].rename(None), pd.DataFrame({"a": np.arange(5), "b": np.linspace(0, 1, 5)}),
              torch.arange(3000, dtype=torch.float32).reshape(100, 30), torch.ones(7, dtype=torch.int64),
              jnp.arange(500, dtype=jnp.float32), {"not": "an array"}, Opaque()]

    @casmon.cache(store=s)
    def make(i):
        return values[i]

    for i in range(len(values)):
        make(i)
    with casmon.record(store=s, capture_output=False, params={"lr": 0.1}) as run:
        for i in range(300):
            run.log(loss=1.0 / (i + 1), step=i * 3)
    s.flush()
    return s, make, len(values), run


def _check(got, s, make, n, run):
    for i in range(n):
        path, ref = entry(make, i)
        want = ref.load()
        if hasattr(want, "to_dataset") or hasattr(want, "data_vars"):  # xarray: a group xarray opens, equal
            want = want if hasattr(want, "data_vars") else want.to_dataset(name="data")
            assert got["xarray"][path].equals(want), path
            continue
        if hasattr(want, "columns"):  # a DataFrame: its columns along "index"
            ds = got["xarray"][path]
            assert all(np.array_equal(ds[str(c)].values, want[c].to_numpy()) for c in want.columns), path
            continue
        if isinstance(want, (dict, Opaque)):  # described, never unpickled: a group with its size and type
            about = got["groups"][path]["casmon"]
            assert about["tag"] == ("json" if isinstance(want, dict) else "pickle") and about["size"] > 0, about
            assert isinstance(want, dict) or "Opaque" in about["type"]
            continue
        want = np.asarray(want)
        a = got["zarr"][path]
        assert a.shape == want.shape and a.dtype == want.dtype.newbyteorder("="), (i, a.dtype, want.dtype)
        assert np.array_equal(a, want), i
        if want.dtype.kind in "biufc" and not want.dtype.fields and got["tensorstore"]:
            t = got["tensorstore"][path]
            assert t.shape == want.shape and t.dtype == a.dtype and np.array_equal(t, want), i
    r = casmon.load_run(run.ref, store=s)
    m = r.metric("loss")
    path = f"runs/{node_name(run.ref.split('/', 1)[-1])}/metrics/loss"
    for got_cols in (got["xarray"][path], {c: got["zarr"][f"{path}/{c}"] for c in ("step", "value", "time")}):
        assert np.array_equal(got_cols["step"], m.steps) and got_cols["step"].dtype == np.int64
        assert np.array_equal(got_cols["value"], m.values) and np.array_equal(got_cols["time"], m.times)
    assert got["groups"][f"runs/{node_name(run.ref.split('/', 1)[-1])}"]["params"] == {"lr": 0.1}


def test_every_kind_of_value_exported_to_a_folder_opens_without_casmon_equal_to_its_load(tmp_path):
    s, make, n, run = _store_of_every_kind(tmp_path)
    done = s.export_zarr(tmp_path / "out")
    assert done.arrays == n - 5 + (5 + 4 + 2) + 3 and (tmp_path / "out" / "zarr.json").is_file()
    _check(read_without_casmon(tmp_path, "folder", tmp_path / "out"), s, make, n, run)


def test_an_export_to_a_zip_file_opens_without_casmon(tmp_path):
    s, make, n, run = _store_of_every_kind(tmp_path)
    s.export_zarr(tmp_path / "out.zip")
    _check(read_without_casmon(tmp_path, "zip", tmp_path / "out.zip"), s, make, n, run)


def test_an_export_to_s3_opens_without_casmon(tmp_path, s3_env):
    env, bucket = s3_env
    s, make, n, run = _store_of_every_kind(tmp_path)
    s.export_zarr(f"s3://{bucket}/exported")
    _check(read_without_casmon(tmp_path, "s3", f"s3://{bucket}/exported", env), s, make, n, run)
    with pytest.raises(ExportError, match="stored there already"):
        s.export_zarr(f"s3://{bucket}/exported")


def test_equal_chunks_are_one_file_hard_linked_in_a_folder(tmp_path):
    s = casmon.open(tmp_path / "s", chunk_size=1 << 16)
    base = np.random.default_rng(0).random(8192 * 4)  # 4 chunks of 64 KiB

    @casmon.cache(store=s)
    def a():
        return np.concatenate([base, base])  # its second half repeats its first

    @casmon.cache(store=s)
    def b():
        return base.copy()  # the same chunks in another array

    a(), b()
    s.flush()
    done = s.export_zarr(tmp_path / "out")
    files = [p for p in (tmp_path / "out").rglob("*") if p.is_file() and p.name != "zarr.json"]
    inodes = {p.stat().st_ino for p in files}
    assert len(files) == 12 and len(inodes) == 4 and done.linked == 8
    g = zarr.open_group(tmp_path / "out", mode="r")
    assert np.array_equal(g[entry(a)[0]][:], np.concatenate([base, base]))
    assert np.array_equal(g[entry(b)[0]][:], base)


def test_an_export_to_a_zip_reports_no_hard_links_as_a_zip_holds_none(tmp_path):
    s = casmon.open(tmp_path / "s", chunk_size=1 << 16)
    base = np.random.default_rng(0).random(8192 * 4)

    @casmon.cache(store=s)
    def a():
        return np.concatenate([base, base])

    a()
    s.close()
    assert s.export_zarr(tmp_path / "out.zip").linked == 0
    out = cli("export", "--zarr", str(tmp_path / "o2.zip"), "--store", str(tmp_path / "s")).stdout
    assert "exported" in out and "hard-linked" not in out
    assert "hard-linked" in cli("export", "--zarr", str(tmp_path / "o3"), "--store", str(tmp_path / "s")).stdout


def test_many_small_chunks_are_sharded_by_zarr(tmp_path):
    s = casmon.open(tmp_path / "s", chunk_size=1 << 12)  # 512 float64 a chunk

    @casmon.cache(store=s)
    def big():
        return np.arange(1_000_000, dtype="f8")  # 1954 chunks

    big()
    s.flush()
    s.export_zarr(tmp_path / "out")
    z = zarr.open_array(tmp_path / "out", path=entry(big)[0], mode="r")
    assert z.shards is not None and z.chunks == (512,)
    chunk_files = [p for p in (tmp_path / "out" / entry(big)[0]).rglob("*") if p.is_file() and p.name != "zarr.json"]
    assert 1 < len(chunk_files) <= 4
    assert np.array_equal(z[123_456:234_567], np.arange(123_456, 234_567, dtype="f8"))


@pytest.mark.parametrize("shape, chunks, itemsize, want", [
    ((100_000,), (512,), 8, ((512,), (512 * 196,))),  # one shard: no bigger than the array
    ((10_000_000,), (512,), 8, ((512,), (512 * 1024,))),  # capped by chunks
    ((10,), (4,), 8, ((4,), None)),  # few chunks
    ((10_000, 1000), (200, 1000), 8, ((200, 1000), None)),  # big chunks
    ((0, 5), (1, 5), 2, ((1, 5), None)),
    ((), (), 8, ((), None)),
    ((1000, 1000, 100), (1, 1000, 100), 8, ((1, 1000, 100), (83, 1000, 100))),  # capped by bytes
    ((3, 100_000), (1, 1000), 8, ((1, 1000), (3, 100_000))),  # across rows, then columns
])
def test_an_exported_arrays_shards_hold_many_small_chunks_within_bounds(shape, chunks, itemsize, want):
    assert layout(shape, chunks, itemsize) == want


def test_an_export_takes_what_is_named_and_refuses_what_is_not(tmp_path):
    s = casmon.open(tmp_path / "s")

    @casmon.cache(store=s)
    def f(n):
        return np.arange(n)

    @casmon.cache(store=s)
    def g(n):
        return np.ones(n)

    f(3), f(4), g(5)
    with casmon.record(store=s, capture_output=False) as run:
        run.log(loss=1.0)
    with casmon.record(store=s, capture_output=False) as other:
        other.log(loss=2.0)
    s.flush()

    def members(out):
        return {k for k, _ in zarr.open_group(out, mode="r").members(max_depth=None)}

    only_run = members(s.export_zarr(tmp_path / "r", run.name).url)
    assert f"runs/{run.name}/metrics/loss/value" in only_run and not any(other.name in k for k in only_run)
    assert not any(k.startswith("cache/") for k in only_run)
    path_f4 = entry(f, 4)[0]
    by_key = members(s.export_zarr(tmp_path / "k", f.ref(4).key.hex()[:10]).url)
    assert path_f4 in by_key and entry(f, 3)[0] not in by_key and not any(k.startswith("runs/") for k in by_key)
    by_fn = members(s.export_zarr(tmp_path / "fn", g.__casmon_cache__.name).url)
    assert entry(g, 5)[0] in by_fn and path_f4 not in by_fn
    for bad, says in [("nosuch", "is not a run, a cached or logged function or a cache entry key"), ("", "cannot export")]:
        with pytest.raises(ExportError, match=says):
            s.export_zarr(tmp_path / "bad", bad)
        assert not (tmp_path / "bad").exists()


def test_an_export_never_writes_over_what_exists(tmp_path):
    s = casmon.open(tmp_path / "s")

    @casmon.cache(store=s)
    def f():
        return np.arange(5)

    f()
    s.flush()
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "mine.txt").write_text("keep")
    (tmp_path / "x.zip").write_bytes(b"not yours")
    for target in ("full", "x.zip"):
        with pytest.raises(ExportError, match="it exists"):
            s.export_zarr(tmp_path / target)
    assert (tmp_path / "full" / "mine.txt").read_text() == "keep" and (tmp_path / "x.zip").read_bytes() == b"not yours"
    with pytest.raises(ExportError, match="inside the store"):
        s.export_zarr(tmp_path / "s" / "export")  # casmon's own folder holds casmon's files only
    assert not (tmp_path / "s" / "export").exists()
    (tmp_path / "empty").mkdir()
    s.export_zarr(tmp_path / "empty")  # an empty folder is a new one
    assert np.array_equal(zarr.open_array(tmp_path / "empty", path=entry(f)[0], mode="r")[:], np.arange(5))


def test_a_zip_that_appears_while_exporting_is_never_overwritten(tmp_path, monkeypatch):
    import casmon.store.zarrexport as zx

    s = casmon.open(tmp_path / "s")

    @casmon.cache(store=s)
    def f():
        return np.arange(5)

    f()
    s.flush()
    real = zx._blank_local
    checks = []

    def late(path, what):  # another process writes the target after the first check
        real(path, what)
        checks.append(path)
        path.write_bytes(b"someone else's")

    monkeypatch.setattr(zx, "_blank_local", late)
    with pytest.raises(ExportError, match="it exists"):
        s.export_zarr(tmp_path / "out.zip")
    assert (tmp_path / "out.zip").read_bytes() == b"someone else's" and checks
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.zip", "s"]


def test_a_damaged_chunk_fails_the_export_and_leaves_nothing_behind(tmp_path):
    s = casmon.open(tmp_path / "s")

    @casmon.cache(store=s)
    def big():
        return np.random.default_rng(5).random(200_000)

    big()
    s.flush()
    damage_cached_result(s, tmp_path / "s", big)
    for target in ("out", "out.zip"):
        with pytest.raises(DamagedObjectError):
            s.export_zarr(tmp_path / target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s"]  # no target, no partial folder


def test_casmon_export_zarr_on_the_command_line(tmp_path):
    s = casmon.open(tmp_path / "s")
    with casmon.record(store=s, capture_output=False) as run:
        run.log(loss=0.25)
    s.close()
    out = cli("export", "--zarr", str(tmp_path / "out"), "latest", "--store", str(tmp_path / "s")).stdout
    assert "exported 3 arrays" in out
    g = zarr.open_group(tmp_path / "out", mode="r")
    assert g[f"runs/{run.name}/metrics/loss/value"][:].tolist() == [0.25]
    bad = cli("export", "--zarr", str(tmp_path / "o2"), "nosuch", "--store", str(tmp_path / "s"), check=False)
    assert bad.returncode == 1 and "'nosuch' is not a run" in bad.stderr and not (tmp_path / "o2").exists()
    one = cli("export", "onlyone", "--store", str(tmp_path / "s"), check=False)
    assert one.returncode != 0 and "export takes RUN TARGET" in one.stderr, one.stderr


def _small_store(tmp_path):
    s = casmon.open(tmp_path / "s", chunk_size=1 << 12)

    @casmon.cache(store=s)
    def make(i):
        return np.arange(2000.0) * i

    for i in range(3):
        make(i)
    s.flush()
    return s


def test_an_s3_export_that_dies_midway_leaves_no_hierarchy_a_reader_opens(tmp_path, s3_env, monkeypatch):
    """The root's zarr.json is written last on an object store: an export killed after some arrays leaves
    objects no reader takes for the hierarchy (zarr finds no group there)."""
    from casmon.store import zarrexport

    s = _small_store(tmp_path)
    real, calls = zarrexport._array, []

    def dies_at_the_second(*a, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt  # as a kill would stop it: nothing after runs
        return real(*a, **kw)

    monkeypatch.setattr(zarrexport, "_array", dies_at_the_second)
    with pytest.raises(KeyboardInterrupt):
        s.export_zarr(f"s3://{s3_env[1]}/half")
    from casmon.store.backend import open_backend

    backend = open_backend(f"s3://{s3_env[1]}/half")
    assert backend.list_dir("")  # something was written...
    with pytest.raises(zarr.errors.GroupNotFoundError):  # ...but no hierarchy
        zarr.open_group(backend.zstore, mode="r")


def test_an_s3_prefix_that_gains_an_object_while_exporting_fails_the_export_and_keeps_it(tmp_path, s3_env, monkeypatch):
    """Another writer's object landing under the prefix mid-export (its own root, or a node this export also
    writes) is never overwritten: the export fails naming the prefix."""
    from casmon.store import zarrexport
    from casmon.store.backend import open_backend

    s = _small_store(tmp_path)
    url = f"s3://{s3_env[1]}/raced"
    theirs = open_backend(url)
    real, calls = zarrexport._array, []

    def another_writer_meanwhile(dst, path, *a, **kw):
        calls.append(path)
        if len(calls) == 1:
            theirs.set("zarr.json", b'{"theirs": 1}')
            theirs.set(f"{path}/zarr.json", b'{"theirs": 2}')
        return real(dst, path, *a, **kw)

    monkeypatch.setattr(zarrexport, "_array", another_writer_meanwhile)
    with pytest.raises(ExportError, match="while exporting"):
        s.export_zarr(url)
    assert bytes(theirs.get("zarr.json")) == b'{"theirs": 1}' and bytes(theirs.get(f"{calls[0]}/zarr.json")) == b'{"theirs": 2}'


def _layouts():
    rng = np.random.default_rng(9)
    noise = rng.random(3 * 32768 + 1000)  # 256 KiB chunks: loose objects, raw (noise does not compress)
    ramp = np.arange(3 * 32768 + 1000, dtype="f8")  # compressed chunks
    return {
        "raw": noise,
        "compressed": ramp,
        "compressed-then-raw": np.concatenate([ramp[:32768], noise[:2 * 32768]]),
        "raw-then-compressed": np.concatenate([noise[:32768], ramp[:2 * 32768 + 5]]),
        "fortran": np.asfortranarray(rng.random((64, 2100))),
        "big-endian": ramp.astype(">i8"),
        "rows": rng.random((1000, 70)).astype("f4"),
    }


@pytest.mark.parametrize("codec", ["blosc-lz4", "zstd", "none"])
def test_an_arrays_stored_chunks_are_copied_into_the_export_as_stored_and_open_without_casmon(tmp_path, codec):
    from casmon.store.objects import loose_key

    s = casmon.open(tmp_path / "s", chunk_size=1 << 18, array_codec=codec)
    values = _layouts()
    names = sorted(values)

    @casmon.cache(store=s)
    def make(name):
        return values[name]

    @casmon.cache(store=s, mmap=True)
    def mapped():
        return np.random.default_rng(3).random((3000, 100))  # laid out whole: one raw object of 2.4 MB

    for name in names:
        make(name)
    mapped()
    s.flush()
    s.export_zarr(tmp_path / "out")
    got = read_without_casmon(tmp_path, "folder", tmp_path / "out")
    for name in names + [None]:
        path, ref = entry(make, name) if name else entry(mapped)
        want = ref.load()
        a = got["zarr"][path]
        assert a.shape == want.shape and a.dtype == want.dtype.newbyteorder("=") and np.array_equal(a, want), name
    # A full chunk stored in an encoding zarr reads is its stored payload, byte for byte: nothing re-encoded.
    path, ref = entry(make, "raw")
    first = next(s.manifest(ref.digest).chunk_digests())
    stored = (tmp_path / "s" / loose_key(first)).read_bytes()[40:]
    assert (tmp_path / "out" / path / "c" / "0").read_bytes() == stored


def test_a_damaged_chunk_of_any_encoding_fails_the_export_and_writes_nothing(tmp_path):
    from casmon.store.objects import loose_key

    for i, value in enumerate([np.arange(100_000, dtype="f8"), np.random.default_rng(2).random(100_000)]):
        s = casmon.open(tmp_path / f"s{i}", chunk_size=1 << 18)

        @casmon.cache(store=s)
        def make():
            return value

        make()
        s.flush()
        digests = list(s.manifest(make.ref().digest).chunk_digests())
        p = tmp_path / f"s{i}" / loose_key(digests[-2])  # a full chunk, not the first
        data = bytearray(p.read_bytes())
        data[-100] ^= 2
        p.write_bytes(bytes(data))
        s.objects.clear_caches()
        with pytest.raises(DamagedObjectError):
            s.export_zarr(tmp_path / f"out{i}")
        assert not (tmp_path / f"out{i}").exists() and not list(tmp_path.glob(f".out{i}.*"))


def test_a_dataset_with_netcdf_encoding_and_a_tensor_export_as_a_group_and_an_array_opened_without_casmon(tmp_path):
    import xarray as xr

    torch = pytest.importorskip("torch")
    ds = xr.Dataset({"t": (("x", "y"), np.arange(12.0).reshape(4, 3) * 0.5, {"long_name": "temperature"})},
                    coords={"x": np.arange(4), "y": [10, 20, 30]})
    ds["t"].encoding = {"dtype": np.dtype("int16"), "scale_factor": np.float32(0.5), "_FillValue": np.int16(-999),
                        "missing_value": np.float32(np.nan), "original_shape": (4, 3), "units": "K"}
    ds.encoding = {"unlimited_dims": set(), "source": "/data/in.nc"}
    values = [ds, torch.arange(24, dtype=torch.int32).reshape(4, 6)]
    s = casmon.open(tmp_path / "s")

    @casmon.cache(store=s)
    def make(i):
        return values[i]

    make(0), make(1)
    s.flush()
    assert s.manifest(make.ref(0).digest).tag == "handler"  # stored as variables, not pickled
    s.export_zarr(tmp_path / "out")
    got = read_without_casmon(tmp_path, "folder", tmp_path / "out")
    path, _ref = entry(make, 0)
    assert got["xarray"][path].equals(ds) and got["xarray"][path]["t"].attrs["long_name"] == "temperature"
    path, _ref = entry(make, 1)
    assert np.array_equal(got["zarr"][path], values[1].numpy()) and got["zarr"][path].dtype == np.int32


def test_casmon_export_zarr_writes_a_tensor_as_an_array_though_the_command_line_imports_no_torch(tmp_path):
    from tests.support.cli import cli_process

    torch = pytest.importorskip("torch")
    s = casmon.open(tmp_path / "s")

    @casmon.cache(store=s)
    def t():
        return torch.arange(30, dtype=torch.float32).reshape(5, 6)

    t()
    s.close()
    cli_process("export", "--zarr", str(tmp_path / "out"), "--store", str(tmp_path / "s"))
    got = zarr.open_group(tmp_path / "out", mode="r")[entry(t)[0]]
    assert isinstance(got, zarr.Array) and np.array_equal(got[:], np.arange(30, dtype="f4").reshape(5, 6))


def test_an_export_killed_midway_is_cleared_by_the_next_export_to_its_target(tmp_path):
    """SIGKILL while the hierarchy is written beside the target: the next export to that target writes it whole
    and removes the dead export's hidden copy (it held up to the whole store's bytes); the copy of an export still
    running, or of one this host cannot tell is dead, is left alone."""
    import signal
    import time

    s = casmon.open(tmp_path / "s", chunk_size=1 << 16, array_codec="none")

    @casmon.cache(store=s)
    def make(i):
        return np.random.default_rng(i).integers(0, 1 << 60, 400_000)

    for i in range(8):
        make(i)
    s.close()
    out = tmp_path / "out"
    # an export that pauses after its first chunk (a write that then sleeps): midway for sure
    code = ("import sys, time, casmon, casmon.store.zarrexport as z\n"
            "real = z._LinkingStore.set\n"
            "async def slow(self, key, value):\n"
            "    await real(self, key, value)\n"
            "    open(sys.argv[2], 'a').close()\n"
            "    time.sleep(3600)\n"
            "z._LinkingStore.set = slow\n"
            "casmon.open(sys.argv[1]).export_zarr(sys.argv[3])\n")

    def paused(flag):
        p = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "s"), str(flag), str(out)])
        deadline = time.monotonic() + 120
        while not flag.exists():
            if p.poll() is not None or time.monotonic() > deadline:
                p.kill()
                raise AssertionError("the export never wrote a chunk")
            time.sleep(0.05)
        return p

    def hidden():
        return {n.name for n in tmp_path.iterdir() if n.name.startswith(".out.")}

    dead = paused(tmp_path / "flag1")
    dead.send_signal(signal.SIGKILL)
    dead.wait()
    (killed,) = hidden()
    assert not out.exists()  # what the killed export wrote: hidden, beside the target
    running = paused(tmp_path / "flag2")
    try:
        (live,) = hidden() - {killed}
        (tmp_path / ".out.elsewhere.partial").mkdir()  # another host's, or an older casmon's: not known dead
        got = casmon.open(tmp_path / "s").export_zarr(out)
        assert got.arrays == 8
        assert hidden() == {live, ".out.elsewhere.partial"}  # the dead one's only
        g = zarr.open_group(str(out), mode="r")
        assert sum(len(list(grp.arrays())) for _n, grp in g["cache"].groups()) == 8
    finally:
        running.kill()
        running.wait()


def test_a_column_named_zarr_json_exports_as_a_node_of_its_own_not_over_its_groups_metadata(tmp_path):
    """On a file system a node named ``zarr.json`` would be its group's metadata file: it is escaped."""
    import pandas as pd

    s = casmon.open(tmp_path / "s")
    want = pd.DataFrame({"zarr.json": np.arange(3.0), "b": np.arange(3)})

    @casmon.cache(store=s)
    def f():
        return want

    f()
    s.flush()
    path, _ = entry(f)
    s.export_zarr(tmp_path / "out")
    g = zarr.open_group(tmp_path / "out", mode="r")[path]
    assert g.attrs["arrays"] == ["zarr%2Ejson", "b"] and g["zarr%2Ejson"][:].tolist() == [0.0, 1.0, 2.0]
