"""Large runs in a key are hashed in fixed segments on every core: the key depends on the bytes alone, never on
the machine, the threads, or how the bytes arrive."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import xxhash

from casmon.keys import segments
from casmon.keys.fingerprint import Concat, fingerprint
from casmon.keys.segments import RUN_MIN, SEGMENT, SegmentedRun


def _reference(tag: bytes, data: bytes) -> bytes:
    """The documented form: tag, length, then each fixed segment's xxh3-128 in order."""
    digests = b"".join(xxhash.xxh3_128_digest(data[i : i + SEGMENT]) for i in range(0, len(data), SEGMENT))
    return xxhash.xxh3_128_digest(tag + struct.pack("<Q", len(data)) + digests)


@pytest.fixture(scope="module")
def big() -> np.ndarray:
    return np.random.default_rng(3).integers(0, 255, RUN_MIN + 5 * SEGMENT // 2, dtype=np.uint8)  # a partial last segment


def test_a_large_bytes_key_is_its_segments_digests(big):
    data = big.tobytes()
    assert bytes(fingerprint(data)) == _reference(b"b", data)
    short = data[: RUN_MIN - 1]  # below the run size: one stream, as before
    assert bytes(fingerprint(short)) == xxhash.xxh3_128_digest(b"b" + struct.pack("<Q", len(short)) + short)


def test_the_key_does_not_depend_on_threads(big, monkeypatch):
    with_pool = fingerprint(big)
    monkeypatch.setattr(segments, "_pool", lambda: None)  # as at interpreter exit: all in the caller's thread
    assert fingerprint(big) == with_pool


def test_strided_fortran_chunked_and_contiguous_copies_share_a_key(big):
    a = big[: (big.nbytes // 4096) * 4096].view(np.float64).reshape(-1, 64)
    assert a.nbytes >= RUN_MIN
    strided = np.repeat(a, 2, axis=1)[:, ::2]  # fed in 8 MiB blocks of rows
    fortran = np.asfortranarray(a)  # fed in tiles
    assert not strided.flags.c_contiguous and not fortran.flags.c_contiguous
    assert fingerprint(strided) == fingerprint(a) == fingerprint(fortran) == fingerprint(a.copy())
    raw = a.reshape(-1).view(np.uint8)
    cuts = [0, 7, SEGMENT - 1, SEGMENT + 3, 3 * SEGMENT, raw.nbytes]  # pieces across segment boundaries
    one = Concat([raw])
    pieces = Concat([raw[x:y] for x, y in zip(cuts, cuts[1:])])
    assert fingerprint(one) == fingerprint(pieces)


def test_any_change_anywhere_changes_the_key(big):
    base = fingerprint(big)
    for at in (0, SEGMENT - 1, SEGMENT, RUN_MIN, big.nbytes - 1):
        b = big.copy()
        b[at] ^= 1
        assert fingerprint(b) != base, at
    swapped = big.copy()
    swapped[:SEGMENT], swapped[SEGMENT : 2 * SEGMENT] = big[SEGMENT : 2 * SEGMENT], big[:SEGMENT]
    assert fingerprint(swapped) != base
    assert fingerprint(big[:-1]) != base and fingerprint(big.view(np.int8)) != base


def test_a_run_must_be_fed_exactly_its_length():
    run = SegmentedRun(10)
    run.feed(b"x" * 4)
    with pytest.raises(ValueError, match="short"):
        run.end()
    with pytest.raises(ValueError, match="left"):
        run.feed(b"y" * 7)


def test_a_cached_call_with_a_large_argument_hits_on_an_equal_copy(big, tmp_path):
    import casmon

    calls = []

    @casmon.cache(store=casmon.open(tmp_path / "s"))
    def total(a):
        calls.append(1)
        return int(a.sum())

    assert total(big) == total(big.copy()) == int(big.sum())
    assert len(calls) == 1
    b = big.copy()
    b[-1] ^= 1
    total(b)
    assert len(calls) == 2
