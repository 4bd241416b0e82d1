"""A non-contiguous array (transposed, Fortran-ordered, strided) is keyed as its C-order copy is, whichever way
its bytes are made: each core copies and hashes its own segments, and the key is the copy's.

The run and segment lengths are shrunk in most tests so that small arrays cross many segment boundaries,
mid-row and on rows; one test keeps the real lengths."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from casmon import fingerprint
from casmon.keys import fingerprint as fpmod, segments


@pytest.fixture
def small_segments(monkeypatch):
    monkeypatch.setattr(segments, "RUN_MIN", 4096)  # fingerprint reads them there
    monkeypatch.setattr(segments, "SEGMENT", 1000)  # no row length divides it: boundaries fall mid-row
    monkeypatch.setattr(fpmod, "_INLINE_LIMIT", 1024)  # below RUN_MIN, as the real one is


DTYPES = ["<f8", "<f4", "|u1", "<i2", ">i4", "<c16", "|b1", "<M8[s]", "<f2", "S3",
          np.dtype([("a", "<i4"), ("b", "<f4")]), np.dtype([("a", "u1"), ("b", "<f8")], align=True)]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.integers(1, 90), cols=st.integers(1, 90), dtype=st.sampled_from(DTYPES),
       layout=st.sampled_from(["T", "F", "step", "negstep", "3d"]), seed=st.integers(0, 2**32 - 1))
def test_a_non_contiguous_array_keys_as_its_c_order_copy(small_segments, rows, cols, dtype, layout, seed):
    raw = np.random.default_rng(seed).integers(0, 256, rows * cols * 2 * np.dtype(dtype).itemsize, dtype=np.uint8)
    base = raw.view(dtype)[: rows * cols * 2].reshape(rows, cols * 2)
    a = {"T": base[:, :cols].copy().T, "F": np.asfortranarray(base[:, :cols]), "step": base[:, ::2],
         "negstep": base[::-1, ::-2], "3d": base.reshape(rows, cols, 2).transpose(1, 0, 2)}[layout]
    assert fingerprint(a) == fingerprint(np.ascontiguousarray(a))


def test_a_transposed_array_over_the_real_run_length_keys_as_its_copy():
    a = np.random.default_rng(1).random((2048, 2304))  # 36 MiB: over RUN_MIN, rows of 18 KiB cross segments
    assert a.nbytes >= segments.RUN_MIN
    for v in (a.T, np.asfortranarray(a), a[:, ::-1]):
        assert fingerprint(v) == fingerprint(np.ascontiguousarray(v))
    assert fingerprint(a.T) != fingerprint(a)


def test_a_row_longer_than_a_segment_keys_as_its_copy():
    a = np.asfortranarray(np.random.default_rng(2).random((3, 1_500_000)))  # 12 MB rows, over SEGMENT each
    assert a[0].nbytes > segments.SEGMENT and a.nbytes >= segments.RUN_MIN
    assert fingerprint(a) == fingerprint(np.ascontiguousarray(a))
