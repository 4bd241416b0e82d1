"""A non-contiguous array's C-order bytes made in staged tiles are its C-order copy's bytes, whatever the shape,
dtype, strides or tile size, so its key is the copy's.

The tiles are shrunk (a few bytes a side) so small arrays cross many tile boundaries, on and off whole tiles."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from casmon import fingerprint
from casmon.keys import corder, fingerprint as fpmod, segments

#: 1, 2, 4, 8, 16 bytes, odd sizes (3, 9) and structured ones without padding (a padded one is keyed field by field,
#: never through a tile).
DTYPES = ["|u1", "|b1", "<i2", ">f2", "<f4", ">i4", "<f8", "<M8[ns]", "<c16", "S3", "S16", "V16",
          np.dtype([("a", "<i4"), ("b", "<f4")]), np.dtype([("a", "u1"), ("b", "<f8")])]

LAYOUTS = ["T", "F", "negT", "slicedT", "stepT", "negboth", "broadcast", "3d", "3dT", "C"]


def _view(rows: int, cols: int, dtype: object, layout: str, seed: int) -> np.ndarray:
    """A ``rows × cols`` (or 3-d) view of random bytes: NaN payloads and all, as a user's array may hold."""
    size = np.dtype(dtype).itemsize  # type: ignore[call-overload]
    raw = np.random.default_rng(seed).integers(0, 256, (rows + 3) * (2 * cols + 3) * size, dtype=np.uint8)
    base = raw.view(dtype).reshape(rows + 3, 2 * cols + 3)
    if layout == "T":
        return base[:cols, :rows].copy().T
    if layout == "F":
        return np.asfortranarray(base[:rows, :cols])
    if layout == "negT":
        return base[:cols, :rows].copy().T[::-1]
    if layout == "slicedT":  # a window of a transpose: its rows do not start where the base's do
        return base.T[1 : rows + 1, 2 : cols + 2]
    if layout == "stepT":
        return base.T[: 2 * rows : 2, :cols] if 2 * rows <= base.shape[1] else base.T[:rows, :cols]
    if layout == "negboth":
        return base[:cols, :rows].T[::-1, ::-1]
    if layout == "broadcast":  # rows repeated, zero stride
        return np.broadcast_to(base[0, :cols], (rows, cols))
    if layout == "3d":
        return base[:rows, : 2 * cols].reshape(rows, cols, 2).transpose(1, 0, 2)
    if layout == "3dT":
        return base[:rows, : 2 * cols].reshape(rows, cols, 2).transpose(2, 1, 0)
    return base[:rows, :cols]


@pytest.fixture(params=[0, 24])
def tiny_tiles(monkeypatch, request):
    """Tiles a few bytes a side; every matrix staged, or rows of 24 bytes or less copied straight."""
    monkeypatch.setattr(corder, "TILE_RUN", 16)
    monkeypatch.setattr(corder, "TILE_BYTES", 96)
    monkeypatch.setattr(corder, "STAGE_BYTES", 256)
    monkeypatch.setattr(corder, "NARROW", request.param)
    monkeypatch.setattr(corder, "NARROW_COLUMNS", request.param // 8)
    monkeypatch.setattr(corder, "SHORT_ROWS", request.param // 8)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.integers(1, 40), cols=st.integers(1, 40), dtype=st.sampled_from(DTYPES),
       layout=st.sampled_from(LAYOUTS), seed=st.integers(0, 2**32 - 1), run=st.sampled_from([1, 8, 16, 24, 2048]),
       tile=st.sampled_from([1, 40, 96, 1000]), stage=st.sampled_from(["none", "small", "big"]),
       narrow=st.sampled_from([0, 16, 512]))
def test_a_tiled_copy_is_the_c_order_copy(monkeypatch, rows, cols, dtype, layout, seed, run, tile, stage, narrow):
    monkeypatch.setattr(corder, "TILE_RUN", run)
    monkeypatch.setattr(corder, "TILE_BYTES", tile)
    monkeypatch.setattr(corder, "STAGE_BYTES", 2 * tile)
    monkeypatch.setattr(corder, "NARROW", narrow)
    monkeypatch.setattr(corder, "NARROW_COLUMNS", narrow // 8)
    monkeypatch.setattr(corder, "SHORT_ROWS", narrow // 64)
    x = _view(rows, cols, dtype, layout, seed)
    want = np.ascontiguousarray(x)
    out = np.empty(x.shape, x.dtype)
    scratch = {"none": None, "small": np.empty(3, np.uint8), "big": np.empty(1 << 16, np.uint8)}[stage]
    corder.tiled_copy(out, x, scratch)
    assert out.tobytes() == want.tobytes()


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.integers(1, 60), cols=st.integers(1, 60), dtype=st.sampled_from(DTYPES),
       layout=st.sampled_from(LAYOUTS), seed=st.integers(0, 2**32 - 1))
def test_a_non_contiguous_arrays_key_is_its_c_order_copys_across_tiles(tiny_tiles, monkeypatch, rows, cols, dtype,
                                                                       layout, seed):
    monkeypatch.setattr(segments, "RUN_MIN", 256)  # fingerprint reads them there
    monkeypatch.setattr(segments, "SEGMENT", 200)  # boundaries fall mid-row and mid-tile
    monkeypatch.setattr(fpmod, "_INLINE_LIMIT", 64)
    x = _view(rows, cols, dtype, layout, seed)
    assert fingerprint(x) == fingerprint(np.ascontiguousarray(x))


def test_a_matrix_with_no_bytes_to_stage_is_copied_as_numpy_copies_it():
    refs = np.array([object(), "x", 3, None] * 6, object).reshape(4, 6).T
    out = np.empty(refs.shape, object)
    corder.tiled_copy(out, refs)
    assert all(x is y for x, y in zip(out.ravel(), np.ascontiguousarray(refs).ravel()))
    empty = np.lib.stride_tricks.as_strided(np.zeros(1, dtype=[]), (30, 40), (0, 1))  # itemsize 0, strides odd
    out = np.empty((30, 40), dtype=[])
    corder.tiled_copy(out, empty)
    assert out.shape == (30, 40)


@pytest.mark.parametrize("layout", ["T", "F", "negT", "slicedT"])
def test_segment_bytes_are_the_c_order_copys_bytes_wherever_they_are_cut(tiny_tiles, layout):
    x = _view(37, 29, "<f8", layout, 5)
    flat = np.ascontiguousarray(x).tobytes()
    scratch: dict = {}
    for start, stop in [(0, 1), (0, 232), (5, 700), (231, 233), (1000, len(flat)), (len(flat) - 1, len(flat))]:
        assert bytes(corder.c_order_bytes(x, scratch, start, stop)) == flat[start:stop], (start, stop)


def test_a_fortran_matrix_between_the_inline_limit_and_a_run_keys_as_its_copy():
    """Keyed through ``_transposed`` (no segments below RUN_MIN): 1000 × 700 float64, tiles of the real size."""
    a = np.random.default_rng(6).random((1000, 700))
    assert fpmod._INLINE_LIMIT < a.nbytes < segments.RUN_MIN
    for v in (np.asfortranarray(a), a.T, np.asfortranarray(a)[::-1]):
        assert fingerprint(v) == fingerprint(np.ascontiguousarray(v))


@pytest.mark.parametrize("shape, dtype", [((5000, 3), "<f8"), ((5000, 64), "<f8"), ((5000, 40), "<c16"),
                                          ((5000, 500), "|u1"), ((3, 50000), "<f8"), ((1, 9000), "|u1")])
def test_a_matrix_of_a_few_columns_or_rows_is_copied_straight_not_staged(shape, dtype):
    """A tile of a few columns or rows holds too few elements, or runs too short, to repay staging (3 float64
    columns took 3x as long, 3 rows 2.2x)."""
    x = np.asfortranarray(np.random.default_rng(7).integers(0, 100, shape).astype(dtype))
    stage = np.full(corder.STAGE_BYTES, 0xAB, np.uint8)
    out = np.empty(x.shape, x.dtype)
    corder.tiled_copy(out, x, stage)
    assert out.tobytes() == np.ascontiguousarray(x).tobytes()
    assert (stage == 0xAB).all()
    wide = np.asfortranarray(np.random.default_rng(8).random((300, 200)))  # wider: staged
    corder.tiled_copy(np.empty(wide.shape), wide, stage)
    assert not (stage == 0xAB).all()
