"""Content-defined chunking: cuts depend on content only, so an edit leaves the pieces away from it as they were."""

import io

import numpy as np
import pytest

from casmon.store import cdc


def _data(n, seed=1):
    return np.random.default_rng(seed).bytes(n)


def test_the_vectorised_candidates_are_the_gear_hashes_byte_by_byte():
    data = _data(1_500_000)
    g16, g32 = [int(g) for g in cdc._GEAR16], [int(g) for g in cdc._GEAR32]
    h16 = h32 = 0
    expected = set()
    for i, b in enumerate(data):
        h16 = ((h16 << 1) + g16[b]) & 0xFFFF
        h32 = ((h32 << 1) + g32[b]) & 0xFFFFFFFF
        if h16 >> 5 == 0 and h32 >> 24 == 0:  # top 11 and top 8 bits clear
            expected.add(i)
    assert len(expected) >= 2 and set(cdc.candidates(data).tolist()) == expected
    for cut in (1, 15, 31, 32, 33, 2500, max(expected) - 10):  # and with its context given, from any offset
        assert set((cdc.candidates(data[cut:], data[:cut]) + cut).tolist()) == {i for i in expected if i >= cut}


def test_a_blocks_candidates_with_its_context_equal_the_whole_streams():
    data = _data(3 << 20)
    whole = cdc.candidates(data)
    assert len(whole) > 2
    parts = [cdc.candidates(data[o:o + 700_001], data[:o]) + o for o in range(0, len(data), 700_001)]
    np.testing.assert_array_equal(np.concatenate(parts), whole)


@pytest.mark.parametrize("read_size", [1, 4096, 3 << 20, 64 << 20])
def test_pieces_rebuild_the_stream_within_the_size_bounds_however_it_is_read(read_size):
    data = _data(24 << 20, seed=2) + bytes(20 << 20)  # random, then a run no candidate falls in
    if read_size == 1:
        read_size = 777_777
    got = list(cdc.pieces(io.BytesIO(data), read_size=read_size))
    assert b"".join(got) == data
    assert all(cdc.MIN_SIZE <= len(p) <= cdc.MAX_SIZE for p in got[:-1])
    assert [len(p) for p in got] == [len(p) for p in cdc.pieces(io.BytesIO(data))]
    assert max(len(p) for p in got) == cdc.MAX_SIZE  # the zeros are cut at the largest size


def test_bytes_inserted_near_the_start_leave_the_later_pieces_shared():
    data = _data(32 << 20, seed=3)
    edited = data[: 1 << 20] + _data(1024, seed=4) + data[1 << 20:]
    before = set(cdc.pieces(io.BytesIO(data)))
    after = list(cdc.pieces(io.BytesIO(edited)))
    new = sum(len(p) for p in after if p not in before)
    assert new <= 2 << 20, new


def test_empty_and_tiny_streams_are_one_piece_or_none():
    assert list(cdc.pieces(io.BytesIO(b""))) == []
    assert list(cdc.pieces(io.BytesIO(b"abc"))) == [b"abc"]


@pytest.mark.parametrize("lo, hi", [(0, 10), (10, 5), (-1, 5)])
def test_sizes_out_of_order_are_a_clear_error(lo, hi):
    with pytest.raises(ValueError, match="min_size <= max_size"):
        cdc.Cutter(lo, hi)


def test_content_where_nearly_every_byte_is_a_candidate_is_cut_at_the_least_size_quickly(monkeypatch):
    import tracemalloc

    monkeypatch.setattr(cdc, "_BELOW16", np.uint16(2**16 - 1))  # as a crafted repeating pattern can make it
    monkeypatch.setattr(cdc, "_BELOW32", np.uint32(2**32 - 1))
    data = _data(24 << 20, seed=9)
    tracemalloc.start()
    try:
        got = list(cdc.pieces(io.BytesIO(data)))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert b"".join(got) == data and {len(p) for p in got[:-1]} == {cdc.MIN_SIZE}
    assert peak < 64 << 20, peak  # no Python object per candidate


def test_content_many_bytes_of_which_pass_the_first_test_gets_the_same_rule(monkeypatch):
    monkeypatch.setattr(cdc, "_BELOW16", np.uint16(1 << 12))  # one byte in 16 passes: h32 is computed everywhere
    monkeypatch.setattr(cdc, "_BELOW32", np.uint32(1 << 25))
    data = _data(300_000, seed=12)
    g16, g32 = [int(g) for g in cdc._GEAR16], [int(g) for g in cdc._GEAR32]
    a = b = 0
    want = []
    for i, c in enumerate(data):
        a = ((a << 1) + g16[c]) & 0xFFFF
        b = ((b << 1) + g32[c]) & 0xFFFFFFFF
        if a < 1 << 12 and b < 1 << 25:
            want.append(i)
    assert len(want) > 100 and cdc.candidates(data).tolist() == want
    assert (cdc.candidates(data[5000:], data[:5000]) + 5000).tolist() == [i for i in want if i >= 5000]


def _seeded_stream(n):
    """Bytes from a hash in counter mode: the same on every Python and numpy version."""
    import hashlib

    out = bytearray()
    i = 0
    while len(out) < n:
        out += hashlib.blake2b(i.to_bytes(8, "little"), digest_size=64).digest()
        i += 1
    return bytes(out[:n])


#: The cuts of ``_seeded_stream(24 MiB)``, computed once: pieces are shared across machines and casmon versions,
#: so every Python, numpy and casmon must cut equal content equally.
GOLDEN_CUTS = [814964, 1992576, 3366224, 4257865, 5229817, 9395007, 10331065, 10915580, 12412383, 13245558,
               15356806, 16690657, 17307832, 19275419, 21095078, 21920807, 22869533, 23758281, 24743218, 25165824]


def _cuts(data):
    offs, pos = [], 0
    for p in cdc.pieces(io.BytesIO(data), read_size=3 << 20):
        pos += len(p)
        offs.append(pos)
    return offs


def test_the_cuts_of_a_seeded_stream_are_the_pinned_ones():
    assert _cuts(_seeded_stream(24 << 20)) == GOLDEN_CUTS


def test_the_cuts_do_not_depend_on_numpys_random_streams(monkeypatch):
    """numpy keeps no promise that a seeded Generator draws the same numbers in its next version: the gear
    tables must not be drawn from one at import."""
    import importlib

    class Other(np.random.PCG64):
        def __init__(self, seed=None):
            super().__init__(12345)

    data = _seeded_stream(12 << 20)
    monkeypatch.setattr(np.random, "PCG64", Other)
    try:
        importlib.reload(cdc)
        assert _cuts(data) == [c for c in GOLDEN_CUTS if c < len(data)] + [len(data)]
    finally:
        monkeypatch.undo()
        importlib.reload(cdc)
