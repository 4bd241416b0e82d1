"""The readers a first hit runs parse headers, offsets and sums without struct (so a hit loads no _struct): they
give what struct gives for every input, and a short or crafted input answers as it did (the same casmon error, or
struct's own error where that was the answer)."""

from __future__ import annotations

import os
import random
import struct

import pytest

from casmon.errors import DamagedObjectError
from casmon.store import codec, manifest
from casmon.store.objects import Location
from casmon.store.table import format as fmt


def test_a_frame_header_reads_as_struct_reads_it_for_any_bytes_and_offset():
    rng = random.Random(46)
    for _ in range(2000):
        data = bytes(rng.getrandbits(8) for _ in range(rng.randrange(40, 90)))
        at = rng.randrange(0, len(data) - 39)
        want = struct.unpack_from("<4sBBBBQQ16s", data, at)
        words = struct.unpack_from("<5Q", data, at)
        w = words[0] ^ words[1] ^ words[2] ^ words[3] ^ words[4]
        w ^= w >> 32
        w ^= w >> 16
        w ^= w >> 8
        assert codec._xor_at(data, at) == w & 0xFF
        try:
            h = codec.read_header(data, "k", at)
        except DamagedObjectError:
            continue
        assert (bytes(h.digest), h.kind, h.codec, h.raw_len, h.stored_len) == (want[7], want[3], want[2], want[5], want[6])


def test_a_sound_frame_header_reads_back_from_bytes_a_memoryview_and_a_numpy_array():
    np = pytest.importorskip("numpy")
    raw = os.urandom(5000)
    _d, frame = codec.encode_frame(raw, codec.KIND_CHUNK, codec.get_codec("zstd"))
    for data in (frame, memoryview(frame), bytearray(frame), np.frombuffer(frame, np.uint8)):
        h = codec.read_header(data, "k")
        assert h.raw_len == 5000 and h.stored_len == len(frame) - codec.FRAME_HEADER
        assert codec.decode_frame(data, "k")[1] == raw
    with pytest.raises(DamagedObjectError, match="truncated"):
        codec.read_header(frame[:39], "k")


def test_the_lazy_frame_structs_are_the_formats_a_frame_has():
    assert codec._HEADER.format == "<4sBBBBQQ16s" and codec._HEADER.size == codec.FRAME_HEADER
    assert codec._LZ4_HEADER.size == codec.FRAME_HEADER + 4
    assert fmt.LA_HEAD.size == fmt.LA_HEAD_SIZE and fmt._COUNT.size == fmt._COUNT_SIZE
    assert fmt._LA_SUM.format == "<Q"


def test_offsets_and_sums_read_as_struct_reads_them_and_a_short_buffer_raises_structs_error():
    rng = random.Random(7)
    for n in (0, 1, 2, 9, 100):
        vals = [rng.getrandbits(64) for _ in range(n)]
        raw = os.urandom(3) + struct.pack(f"<{n}Q", *vals) + os.urandom(5)
        assert fmt._u64s(raw, n, 3) == tuple(vals)
        assert fmt._u64s(memoryview(raw), n, 3) == tuple(vals)
    with pytest.raises(struct.error):
        fmt._u64s(b"\0" * 15, 2)


def test_a_table_file_and_a_block_too_short_or_crafted_are_damaged_as_before():
    good = fmt.encode_table_file([(b"k" * 16, b"v1"), (b"a" * 16, b"value two")])
    assert good[:8] == struct.pack("<4sI", b"CTB1", 2)
    t = fmt.TableFile("t", good)
    assert len(t) == 2
    assert fmt._Block("b", good).find(b"k" * 16) == [b"v1"]
    for bad in (b"", b"CTB", good[:7], good[:-1], b"XXXX" + good[4:], good[:4] + struct.pack("<I", 1 << 31) + good[8:]):
        with pytest.raises(DamagedObjectError, match="not a valid table file"):
            fmt.TableFile("t", bad)
        with pytest.raises(DamagedObjectError, match="not a valid table file"):
            fmt._Block("b", bad).find(b"k" * 16)
    assert fmt.encode_table_file([]) == struct.pack("<4sIQ", b"CTB1", 0, 0)


def test_an_index_entry_round_trips_and_one_of_the_wrong_length_is_damaged():
    loc = Location("ab" * 16, 1 << 40, 123456, 3, (1 << 64) - 1)
    b = loc.encode()
    assert b == struct.pack("<16sQIBQ", bytes.fromhex("ab" * 16), 1 << 40, 123456, 3, (1 << 64) - 1)
    assert Location.decode(b) == loc and Location.decode(memoryview(b)) == loc
    for n in (0, 36, 38):
        with pytest.raises(DamagedObjectError, match=f"an index entry is {n} bytes, not 37"):
            Location.decode(b"\0" * n)


def test_a_manifest_too_short_for_its_header_length_is_damaged():
    from casmon.keys.digest import Digest

    d = Digest(b"\1" * 16)
    for raw in (b"m", b"m\0", b"m\0\0\0", b"m\xff\xff\xff\xff{}"):
        with pytest.raises(DamagedObjectError, match="not a valid manifest"):
            manifest.decode_manifest(d, raw)
