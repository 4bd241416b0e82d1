"""Bit flips that really damage a file.

A flipped bit inside a compressed payload can decode to the very same content (an lz4
match offset moved by 16 inside a run of equal bytes, say). Nothing is lost then and
casmon rightly reports nothing, so a test that expects a report must flip a bit that
changes what the file holds: these helpers move on to the next byte until it does.
Files that are not casmon frames (casmon.json, markers) are flipped where asked.
"""

from pathlib import Path

from casmon.store.codec import FRAME_HEADER, decode_frame, read_header
from casmon.errors import DamagedObjectError


def _contents(data: bytes) -> list[bytes] | None:
    """The decoded frames of ``data`` in order, or None if it is not (only) sound casmon frames."""
    out, off = [], 0
    try:
        while off < len(data):
            h = read_header(data, "probe", off)
            end = off + FRAME_HEADER + h.stored_len
            out.append(bytes(decode_frame(data[off:end], "probe")[1]))
            off = end
    except (DamagedObjectError, ValueError):
        return None
    return out or None


def flip_at(data: bytes, pos: int, mask: int) -> tuple[bytes, int]:
    """``(data with mask flipped, where)``: at ``pos``, or at the first byte from there on where
    the flip changes the decoded content (if ``data`` is casmon frames)."""
    before = _contents(data)
    n = len(data)
    for step in range(n):
        i = (pos + step) % n
        out = bytearray(data)
        out[i] ^= mask
        out = bytes(out)
        if before is None or _contents(out) != before:
            return out, i
    raise AssertionError("no single flip damages this file")


def flip_file(path: Path, where: float = 0.5, mask: int = 0x10) -> None:
    data = path.read_bytes()
    path.write_bytes(flip_at(data, min(len(data) - 1, int(len(data) * where)), mask)[0])


def damage_cached_result(store, root: Path, cached, *args) -> None:
    """Flip one bit in the middle of the first chunk of ``cached(*args)``'s stored result (a local folder at
    ``root``) and forget every copy in memory, so the next call reads the damaged file."""
    from casmon.store.objects import loose_key

    chunk = next(store.manifest(cached.ref(*args).digest).chunk_digests())
    p = root / loose_key(chunk)
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 1
    p.write_bytes(bytes(data))
    store.objects.clear_caches()
    cached.__casmon_cache__._mem.clear()
