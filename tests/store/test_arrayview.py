import numpy as np
import pytest

import casmon
from casmon.keys.digest import Digest


@pytest.fixture
def store(tmp_path):
    return casmon.open(tmp_path / "s", chunk_size=1 << 16)


@pytest.mark.parametrize(
    "a",
    [
        np.arange(100_000.0),
        np.arange(200_000, dtype=">i4").reshape(1000, 200),
        np.random.default_rng(0).random((333, 70)).astype(np.float32),
        np.arange(10, dtype=np.int8),
        np.array([True, False] * 5000),
        np.arange(0, 30_000).astype("M8[s]"),
        np.array(7.5),
    ],
    ids=lambda a: f"{a.dtype}{a.shape}",
)
def test_open_array_matches_and_reads_one_chunk_per_row(store, a):
    d = store.put(a)
    z = store.open_array(d)
    assert z.shape == a.shape
    assert np.array_equal(z[...], a)
    if a.ndim and a.shape[0] > 10:
        before = z.store.chunks_read
        i = a.shape[0] // 2 + 1
        assert np.array_equal(z[i], a[i])
        assert z.store.chunks_read - before == 1
        assert np.array_equal(z[3:17], a[3:17])


def test_fortran_order_array(store):
    a = np.asfortranarray(np.random.default_rng(1).random((300, 500)))
    z = store.open_array(store.put(a))
    assert np.array_equal(z[...], a)
    before = z.store.chunks_read
    assert np.array_equal(z[:, 123], a[:, 123])
    assert z.store.chunks_read - before == 1  # a column is one chunk in Fortran order


def test_open_array_is_read_only_and_rejects_non_arrays(store):
    z = store.open_array(store.put(np.arange(10)))
    with pytest.raises(Exception):
        z[0] = 5
    with pytest.raises(TypeError, match="not a numpy array"):
        store.open_array(store.put({"a": 1}))


def test_one_row_of_a_large_array_reads_one_chunk(tmp_path):
    s = casmon.open(tmp_path / "s")  # default 4 MiB chunks
    a = np.random.default_rng(0).random((20_000, 256))  # 40 MiB
    z = s.open_array(s.put(a))
    assert np.array_equal(z[12_345], a[12_345])
    assert z.store.chunks_read == 1


@pytest.mark.parametrize("order", ["C", "F"])
def test_an_array_laid_out_for_mapping_opens_lazily_in_row_chunks(tmp_path, order):
    """A value put with mmap=True is one raw object (up to a GiB): open_array maps it, checks it once, and reads a
    row or a slice by itself, not the whole value; damage is found when it is opened."""
    from casmon.errors import DamagedObjectError
    from casmon.store.arrayview import WHOLE_VIEW_CHUNK
    from casmon.store.objects import loose_key

    s = casmon.open(tmp_path / "s")
    a = np.random.default_rng(3).random((4000, 1000))  # 32 MB: 8 row chunks of 4 MiB
    a = np.asfortranarray(a) if order == "F" else a
    d = s.put(a, mmap=True)
    m = s.manifest(d)
    assert len(m.parts[0]["c"]) == 1  # laid out whole
    z = s.open_array(d)
    assert z.chunks[0 if order == "C" else 1] * 8 * (1000 if order == "C" else 4000) <= WHOLE_VIEW_CHUNK
    before = z.store.chunks_read
    if order == "C":
        assert np.array_equal(z[1234], a[1234]) and np.array_equal(z[3990:], a[3990:])
        assert z.store.chunks_read - before == 2
    else:
        assert np.array_equal(z[:, 567], a[:, 567])
        assert z.store.chunks_read - before == 1
    assert np.array_equal(z[...], a)
    s.flush()
    path = tmp_path / "s" / loose_key(Digest(m.parts[0]["c"][0]))
    raw = bytearray(path.read_bytes())
    raw[-5] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(DamagedObjectError):
        casmon.open(tmp_path / "s").open_array(d)


def test_a_structured_array_with_a_big_endian_field_is_refused_not_read_swapped(store):
    """zarr describes a structured dtype's byte order as a whole: a big-endian field would come back byte-swapped
    without a word, so open_array refuses it (get() reads it right); a little-endian one opens."""
    be = np.zeros(10, dtype=[("a", "<i4"), ("b", ">f8"), ("c", "u1")])
    be["b"] = np.arange(10) * 1.5
    d = store.put(be)
    with pytest.raises(TypeError, match="big-endian field"):
        store.open_array(d)
    assert np.array_equal(store.get(d), be)
    le = be.astype([("a", "<i4"), ("b", "<f8"), ("c", "u1")])
    z = store.open_array(store.put(le))
    assert np.array_equal(z[...]["b"], le["b"])
