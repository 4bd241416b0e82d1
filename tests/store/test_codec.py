"""Frames (casmon/store/codec.py): a payload cannot make a reader allocate what its header only claims,
and every frame casmon writes states its size and reads back."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
import xxhash

from casmon.errors import DamagedObjectError
from casmon.store import codec


def _crafted_frame(codec_id: int, body: bytes, raw_len: int, digest: bytes) -> bytes:
    h = codec._HEADER.pack(codec.MAGIC, codec.FRAME_VERSION, codec_id, codec.KIND_CHUNK, 0, raw_len, len(body), digest)
    return h[:7] + bytes([codec._xor(h)]) + h[8:] + body


def test_a_zstd_payload_cannot_make_a_reader_allocate_what_its_header_claims():
    """A 16 KiB zstd payload whose frame header claims 1 GiB: before the fix decode_body allocated
    the whole gigabyte (bytearray of raw_len, zero-filled) and only then let zstd fail; 256 KiB of
    payload could claim 16 GiB. zstd frames state their content size; it must agree first."""
    import numcodecs

    raw = bytes(16 << 10)
    body = bytes(numcodecs.Zstd(level=1).encode(raw))
    body += bytes(16 << 10)  # padding: the MAX_RATIO bound alone lets 32 KiB claim 2 GiB
    frame = _crafted_frame(2, body, 1 << 30, xxhash.xxh3_128_digest(raw))
    tracemalloc.start()
    try:
        with pytest.raises(DamagedObjectError, match="payload says 16384 bytes"):
            codec.decode_frame(frame, "crafted")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, f"{peak >> 20} MiB allocated for a crafted 32 KiB frame"
    # A zstd payload that states no content size (casmon never writes one) is damage, not a bound to trust.
    no_size = bytearray(body)
    no_size[4] = 0x00  # frame header descriptor: no content size, no single segment
    with pytest.raises(DamagedObjectError):
        codec.decode_frame(_crafted_frame(2, bytes(no_size), 1 << 30, xxhash.xxh3_128_digest(raw)), "crafted")


@pytest.mark.parametrize("n", [64, 255, 256, 257, 65_535, 65_791, 65_792, 1 << 20, (5 << 20) + 3])
def test_every_zstd_frame_casmon_writes_states_its_size_and_reads_back(n):
    """The content-size check must never refuse a frame casmon wrote (every size class of the field)."""
    rng = np.random.default_rng(n)
    data = (rng.integers(0, 4, n, dtype=np.uint8)).tobytes()
    _, frame = codec.encode_frame(data, codec.KIND_TABLE, codec.get_codec("zstd"))
    assert frame[5] == 2  # compressed with zstd, not stored raw
    assert bytes(codec.decode_frame(frame, "x")[1]) == data


def test_a_crafted_payload_that_states_the_size_it_claims_commits_no_memory_before_it_fails():
    """A 16 KiB payload whose codec header and frame header agree on 1 GiB (zstd, blosc, lz4): the reader must
    fail without first touching a gigabyte of memory (a zero-filled buffer of the claimed size), which would let
    a crafted object in an untrusted store get a reader killed for memory."""
    code = r'''
import os, resource, struct, sys
import numcodecs  # loaded before the baseline: its import is not the allocation measured
from casmon.store import codec
from casmon.errors import DamagedObjectError
raw_len = 1 << 30
pad = os.urandom(16 << 10)
bodies = {
    2: b"\x28\xb5\x2f\xfd" + bytes([0xE0]) + struct.pack("<Q", raw_len) + pad,   # zstd: single segment, 8-byte size
    1: bytes([2, 1, 0x01, 1]) + struct.pack("<III", raw_len, 1 << 18, 16 + len(pad)) + pad,  # blosc (lz4)
    4: bytes([2, 1, 0x01 | (4 << 5), 1]) + struct.pack("<III", raw_len, 1 << 18, 16 + len(pad)) + pad,  # blosc (zstd)
    3: struct.pack("<I", raw_len) + pad,                                            # numcodecs' lz4: u32 size prefix
}
for cid, body in bodies.items():
    h = codec._HEADER.pack(codec.MAGIC, codec.FRAME_VERSION, cid, codec.KIND_CHUNK, 0, raw_len, len(body), os.urandom(16))
    frame = h[:7] + bytes([codec._xor(h)]) + h[8:] + body
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        codec.decode_frame(frame, "crafted")
    except DamagedObjectError:
        pass
    else:
        sys.exit(f"codec {cid}: a crafted frame decoded")
    print(cid, (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)
'''
    from tests.conftest import run_python

    grown = dict(line.split() for line in run_python(code).stdout.splitlines())
    assert set(grown) == {"1", "2", "3", "4"}
    assert all(int(mib) < 128 for mib in grown.values()), f"peak RSS grew by MiB per codec: {grown}"
