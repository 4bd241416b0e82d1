"""The ML libraries' values in the store: back as the type they were, stored once, sharing what is equal."""

import sys

import numpy as np
import pytest

import casmon
from casmon.errors import UnpicklableError, UntrustedStoreError
from casmon.maintenance.usage import stats

torch = pytest.importorskip("torch") if sys.version_info < (3, 12) else None
pa = pytest.importorskip("pyarrow")
pl = pytest.importorskip("polars")
Image = pytest.importorskip("PIL.Image")
needs_torch = pytest.mark.skipif(torch is None, reason="torch is installed on Python 3.11 only (its CPU build)")


@pytest.fixture
def store(tmp_path):
    return casmon.open(tmp_path / "s")


def chunk_bytes(store):
    store.flush()
    return stats(store)["chunk_bytes"]


@needs_torch
def test_tensors_come_back_as_they_were(store):
    t = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    cases = [t, t.bfloat16(), t.to(torch.int8), t[:, 1:4], t.T, torch.nn.Parameter(t.clone()), t.clone().requires_grad_(True),
             torch.zeros(0, 3), torch.tensor(3.5), t.to(torch.complex64).conj()]
    for v in cases:
        back = store.get(store.put(v))
        assert type(back) is type(v) and back.dtype == v.dtype and back.shape == v.shape
        assert back.requires_grad == v.requires_grad and torch.equal(back.detach().resolve_conj(), v.detach().resolve_conj())
    m = torch.nn.Sequential(torch.nn.Linear(6, 2))
    opt = torch.optim.Adam(m.parameters())
    m(t).sum().backward()
    opt.step()
    m2, opt2 = store.get(store.put((m, opt)))
    assert torch.equal(m2[0].weight, m[0].weight) and opt2.state_dict()["state"][0]["step"] == 1
    assert opt2.param_groups[0]["params"][0] is m2[0].weight, "a tensor two objects share stays one"
    sparse = torch.sparse_coo_tensor([[0, 2]], [1.0, 2.0], (4,))
    assert torch.equal(store.get(store.put(sparse)).to_dense(), sparse.to_dense())


@needs_torch
def test_channels_last_tensors_come_back_channels_last_and_share_the_stored_copy(store):
    """A channels-last tensor (what a conv net is given for speed) comes back in that memory format, as a numpy
    array keeps its memory order; its elements are stored once with its contiguous twin's."""
    for shape, fmt in (((2, 3, 4, 5), torch.channels_last), ((2, 3, 2, 4, 5), torch.channels_last_3d)):
        t = torch.arange(float(np.prod(shape))).reshape(shape)
        cl = t.to(memory_format=fmt)
        back = store.get(store.put(cl))
        assert back.is_contiguous(memory_format=fmt) and back.stride() == cl.stride() and torch.equal(back, cl)
        plain = store.get(store.put(t))
        assert plain.is_contiguous() and plain.stride() == t.stride()
        assert store.put(cl) != store.put(t)  # one value each, for their formats
    big = torch.randn(8, 64, 32, 32)
    store.put(big)
    before = chunk_bytes(store)
    store.put(big.to(memory_format=torch.channels_last))
    assert chunk_bytes(store) - before < 0.01 * big.nbytes  # its elements, in C order, are the twin's chunks
    grad = torch.zeros(1, 3, 2, 2).to(memory_format=torch.channels_last).requires_grad_(True)
    back = store.get(store.put(torch.nn.Parameter(grad.detach())))
    assert type(back) is torch.nn.Parameter and back.is_contiguous(memory_format=torch.channels_last)


@needs_torch
def test_equal_tensors_are_stored_once_and_checkpoints_share_unchanged_ones(store):
    one = torch.randn(1 << 20)  # 4 MiB
    before = chunk_bytes(store)
    digests = {store.put(one.clone()) for _ in range(5)}
    assert len(digests) == 1
    assert chunk_bytes(store) - before <= 1.01 * one.nbytes
    gen = torch.Generator().manual_seed(0)
    ckpt = {f"layer{i}": torch.randn(256, 256, generator=gen) for i in range(8)}
    distinct = sum(t.nbytes for t in ckpt.values())
    start = chunk_bytes(store)
    for step in range(5):
        ckpt[f"layer{step}"] = torch.randn(256, 256, generator=gen)
        distinct += ckpt[f"layer{step}"].nbytes if step else 0
        store.put(dict(ckpt))
    assert chunk_bytes(store) - start <= 1.1 * (distinct + 256 * 256 * 4)


@needs_torch
def test_a_stored_tensor_opens_lazily(store):
    t = torch.arange(10_000, dtype=torch.int32).reshape(100, 100)
    arr = store.open_array(store.put(t))
    assert arr.shape == (100, 100) and (arr[3:5, :4] == t[3:5, :4].numpy()).all()


@needs_torch
def test_a_tensor_saved_on_a_missing_device_names_it_and_the_way_out(store, monkeypatch):
    from casmon.store.libraries.torch import TensorHandler, TorchDeviceError

    h = TensorHandler()
    meta, bufs = h.encode(torch.ones(3))
    meta["device"] = "cuda:0" if not torch.cuda.is_available() else "xla:9"
    with pytest.raises(TorchDeviceError, match="CASMON_MAP_LOCATION"):
        h.decode(meta, [np.frombuffer(bytes(bufs[0].data), np.uint8).copy()])
    monkeypatch.setenv("CASMON_MAP_LOCATION", "cpu")
    back = h.decode(meta, [np.frombuffer(bytes(bufs[0].data), np.uint8).copy()])
    assert back.device.type == "cpu" and torch.equal(back, torch.ones(3))


@needs_torch
def test_an_untrusted_store_loads_tensors_but_not_arrow_streams(tmp_path):
    s = casmon.open(tmp_path / "u")
    dt, da = s.put(torch.ones(4)), s.put(pa.table({"a": [1, 2]}))
    s.flush()
    u = casmon.open(tmp_path / "u", trust=False)
    assert torch.equal(u.get(dt), torch.ones(4))
    with pytest.raises(UntrustedStoreError):
        u.get(da)


def test_arrow_polars_and_images_come_back_as_they_were(store):
    a = pa.array([1, None, 3, 4])
    for v in [pa.table({"a": a, "s": ["x", None, "", "z"]}), a.slice(1, 2), pa.chunked_array([a, a.slice(2)]),
              pa.record_batch([a], names=["a"])]:
        back = store.get(store.put(v))
        assert type(back) is type(v) and back.equals(v)
    c = pa.chunked_array([a, a.slice(2)])
    assert store.get(store.put(c)).num_chunks == 2, "chunking is kept"
    df = pl.DataFrame({"a": [1, 2], "c": pl.Series(["u", "v"], dtype=pl.Categorical), "e": pl.Series(["x", "y"], dtype=pl.Enum(["x", "y"]))})
    back = store.get(store.put(df))
    assert back.equals(df) and back.schema == df.schema
    s = df["a"].rename("n")
    assert store.get(store.put(s)).equals(s) and store.get(store.put(s)).name == "n"
    im = Image.new("P", (5, 4), 2)
    im.putpalette([i % 256 for i in range(768)])
    im.info["dpi"] = [72, 72]
    back = store.get(store.put(im))
    assert (back.mode, back.size, back.tobytes(), back.getpalette(), back.info) == (im.mode, im.size, im.tobytes(), im.getpalette(), im.info)


def test_a_memory_mapped_dataset_is_stored_by_content(store, tmp_path):
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_dict({"a": [1, 2, 3], "b": ["x", "y", "z"]}).save_to_disk(str(tmp_path / "ds"))
    ds = datasets.load_from_disk(str(tmp_path / "ds")).select([2, 0])
    d = store.put(ds)
    import shutil
    shutil.rmtree(tmp_path / "ds")
    back = store.get(d)
    assert back.to_dict() == {"a": [3, 1], "b": ["z", "x"]} and back.features == ds.features


def test_strided_arrays_inside_objects_are_stored_as_arrays(store):
    base = np.random.default_rng(0).random((512, 512))
    v = {"x": base[::2, ::2], "y": base[::2, ::2].copy()}
    d = store.put(v)
    back = store.get(d)
    assert (back["x"] == v["x"]).all()
    m = store.manifest(d)
    assert len(m.children) == 1 and len(m.inline) < 4096, "the strided view is a value of its own, not bytes in the pickle"


def test_stats_count_values_written_loose(store):
    store.put(list(range(300_000)))  # a large pickle: its manifest is written like a chunk
    store.flush()
    st = stats(store)
    assert st["values"] == 1 and st["logical_bytes"] > 1 << 20


def test_empty_and_chunked_arrow_values_come_back(store):
    for v in [pa.array([], pa.int64()), pa.record_batch([pa.array([], pa.int64())], names=["a"]),
              pa.chunked_array([pa.array([], pa.int64())]), pa.chunked_array([[1, 2], [], [3]])]:
        back = store.get(store.put(v))
        assert type(back) is type(v) and back.equals(v)
        if isinstance(v, pa.ChunkedArray):
            assert [len(c) for c in back.chunks] == [len(c) for c in v.chunks]


def test_weak_and_zero_dimensional_jax_arrays_and_sorted_polars_columns_come_back(store):
    jnp = pytest.importorskip("jax.numpy")
    for v in (jnp.float32(1.0), jnp.asarray(2.0), jnp.arange(3)):
        back = store.get(store.put(v))
        assert back.shape == v.shape and back.dtype == v.dtype and back.weak_type == v.weak_type
    s = pl.Series("n", [1, 2, 3]).set_sorted()
    assert store.get(store.put(s)).flags["SORTED_ASC"]
    with pytest.raises(UnpicklableError):  # polars can neither write nor pickle it: a clear error, not polars'
        store.put(pl.Series("o", [object()], dtype=pl.Object))


def test_an_rgba_palette_comes_back_with_its_alpha(store):
    im = Image.new("P", (1, 1))
    im.putpalette([10, 20, 30, 0] * 256, rawmode="RGBA")
    assert store.get(store.put(im)).convert("RGBA").getpixel((0, 0)) == (10, 20, 30, 0)


@needs_torch
def test_strided_tensors_are_stored(store):
    t = torch.arange(10.0)
    for v in (t[::2], torch.ones(1).expand(4), torch.tensor([1 + 2j]).imag):
        assert torch.equal(store.get(store.put(v)), v)


LOAD_IN_ANOTHER = """
import sys, json, casmon
s = casmon.open(sys.argv[1])
print(json.dumps({k: type(s.get(d)).__module__.split(".")[0] for k, d in json.loads(sys.argv[2]).items()}))
"""


def test_a_value_saved_in_one_process_loads_in_a_fresh_one(tmp_path):
    """The loading process has saved nothing of the library yet: the handler is found by its stored name.
    (Saved here, where the libraries are imported already: only the loading process must be a fresh one.)"""
    import json
    import subprocess

    import datasets
    import jax.numpy as jnp
    values = {"arrow": pa.table({"a": [1, 2]}), "polars": pl.DataFrame({"a": [1, 2]}), "jax": jnp.arange(3.0),
              "image": Image.new("RGB", (2, 2)), "hf": datasets.Dataset.from_dict({"a": [1, 2]})}
    if torch is not None:
        values["torch"] = torch.ones(3)
    loc = str(tmp_path / "x")
    s = casmon.open(loc)
    digests = json.dumps({k: s.put(v).hex() for k, v in values.items()})
    s.close()
    loaded = subprocess.run([sys.executable, "-c", LOAD_IN_ANOTHER, loc, digests], capture_output=True, text=True, timeout=120)
    assert loaded.returncode == 0, loaded.stderr
    kinds = json.loads(loaded.stdout.strip().splitlines()[-1])
    expected = {"arrow": "pyarrow", "polars": "polars", "jax": "jaxlib", "image": "PIL", "hf": "datasets", "torch": "torch"}
    assert kinds == {k: expected[k] for k in kinds} and len(kinds) >= 5
