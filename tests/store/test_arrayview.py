import numpy as np
import pytest

import casmon


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
