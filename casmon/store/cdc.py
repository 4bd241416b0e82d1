"""Content-defined chunking: cut a byte stream where its content says, so an insertion moves only nearby cuts.

Gear hashes (FastCDC's, as restic cuts with a rolling hash): ``h16(i) = sum(GEAR16[b[i-j]] << j for j < 16)``
mod 2**16 and ``h32(i) = sum(GEAR32[b[i-j]] << j for j < 32)`` mod 2**32, with two fixed random tables. Byte
``i`` is a *candidate* when ``h16(i)`` has its top 11 bits clear and ``h32(i)`` its top 8 (one byte in
2**19): it depends on the 32 bytes ending at ``i`` only. ``h16`` is computed for a whole block at once with
numpy (four shift-and-add passes on 16-bit numbers, doubling the window each time, instead of a Python
loop per byte), ``h32`` only at the one byte in 2,048 that passes ``h16``'s test: a 32-bit hash at every
byte, the plain way, cuts at half the speed (and is what content where many bytes pass ``h16``'s test
gets: long runs of one byte, a crafted pattern). A cut is the first candidate at least ``min_size`` after the
previous cut, or ``max_size`` after it when there is none. Candidates do not depend on where reading
started, so the cuts after an edit fall back onto the earlier ones within a piece or two. Measured against
the ``fastcdc`` package (docs/BENCHMARKS.md): its compiled build cuts an order of magnitude faster, its
pure-Python one several times slower, and it would bring four more dependencies.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import IO, Any

import numpy as np

__all__ = ["MIN_SIZE", "AVG_SIZE", "MAX_SIZE", "MASK_BITS", "candidates", "Cutter", "pieces"]

MIN_SIZE = 512 << 10
MAX_SIZE = 8 << 20
#: A candidate is one byte in 2**19 (11 bits of ``h16``, 8 of ``h32``), so a piece averages
#: ``MIN_SIZE + 2**19`` = 1 MiB.
MASK_BITS = 19
AVG_SIZE = MIN_SIZE + (1 << MASK_BITS)
_WINDOW = 32
_BLOCK = 1 << 20  # bytes hashed at once: the hash arrays are 2 bytes a byte

# Fixed for all time: pieces of equal content must be cut equally by every casmon version.
_GEAR32 = np.random.Generator(np.random.PCG64(0x6361736D6F6E)).integers(0, 2**32, size=256, dtype=np.uint32)
_GEAR16 = np.random.Generator(np.random.PCG64(0x636463)).integers(0, 2**16, size=256, dtype=np.uint16)
_BELOW16 = np.uint16(1 << (16 - 11))  # top 11 bits clear
_BELOW32 = np.uint32(1 << (32 - (MASK_BITS - 11)))  # top 8 bits clear
_SHIFTS = np.arange(_WINDOW, dtype=np.uint32)


def candidates(data: Any, context: bytes = b"") -> np.ndarray[Any, np.dtype[np.int64]]:
    """The offsets in ``data`` (a bytes-like) of the candidate bytes (a cut falls after one). ``context``: the
    bytes just before ``data`` (up to 31 are used), so a block's candidates are those of the whole stream;
    bytes before the stream's start count as absent (they add nothing to a hash)."""
    ctx = bytes(context[-(_WINDOW - 1):]) if context else b""
    buf = np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)
    if ctx:
        buf = np.concatenate([np.frombuffer(ctx, dtype=np.uint8), buf])
    h = np.take(_GEAR16, buf)
    tmp = np.empty_like(h)
    shift = 1
    while shift < 16:  # h[i] sums the window of ``2*shift`` bytes ending at i
        np.left_shift(h[:-shift], shift, out=tmp[:-shift])
        np.add(h[shift:], tmp[:-shift], out=h[shift:])
        shift *= 2
    pre = np.flatnonzero(h < _BELOW16)
    del h, tmp
    if len(pre) > len(buf) >> 8:  # content many bytes pass (long runs, a crafted pattern): h32 everywhere
        h32 = np.take(_GEAR32, buf)
        shift = 1
        while shift < _WINDOW:
            h32[shift:] += h32[:-shift] << np.uint32(shift)
            shift *= 2
        pre = pre[h32[pre] < _BELOW32]
    elif len(pre):
        at = pre[:, None] - np.arange(_WINDOW)[None, :]  # the 32 bytes ending at each, newest first
        g = np.take(_GEAR32, buf[np.maximum(at, 0)])
        g[at < 0] = 0  # before the stream's start: absent
        pre = pre[(g << _SHIFTS).sum(axis=1, dtype=np.uint32) < _BELOW32]
    hits = pre.astype(np.int64) - len(ctx)
    return hits[hits >= 0]


class Cutter:
    """Cuts fed bytes into pieces as they come: :meth:`feed` returns the pieces complete so far, :meth:`end` the
    rest. Holds at most ``max_size`` plus one fed block, and the candidates in it as a numpy array: content
    where nearly every byte is a candidate (a crafted repeating pattern) costs 8 bytes a byte of the
    ``min_size`` it then cuts at, never a Python object per byte."""

    def __init__(self, min_size: int = MIN_SIZE, max_size: int = MAX_SIZE) -> None:
        if not 0 < min_size <= max_size:
            raise ValueError(f"casmon: chunking needs 0 < min_size <= max_size, got {min_size} and {max_size}")
        self.min_size, self.max_size = min_size, max_size
        self._buf = bytearray()  # bytes since the last cut
        self._cands: np.ndarray[Any, np.dtype[np.int64]] = np.empty(0, np.int64)  # offsets in _buf, ascending
        self._tail = b""  # the bytes before the block to come, for its hashes

    def feed(self, data: Any) -> list[bytes]:
        mv = memoryview(data).cast("B")
        out: list[bytes] = []
        for o in range(0, mv.nbytes, _BLOCK):
            block = mv[o:o + _BLOCK]
            self._cands = np.concatenate([self._cands, candidates(block, self._tail) + len(self._buf)])
            self._buf += block
            self._tail = bytes(self._buf[-(_WINDOW - 1):])
            out.extend(self._cut(final=False))
        return out

    def end(self) -> list[bytes]:
        return self._cut(final=True)

    def _cut(self, final: bool) -> list[bytes]:
        out: list[bytes] = []
        while self._buf:
            i = int(np.searchsorted(self._cands, self.min_size - 1))  # a cut falls after its candidate byte
            at = int(self._cands[i]) + 1 if i < len(self._cands) else None
            if at is None or at > self.max_size:
                if len(self._buf) < self.max_size and not final:
                    break  # a candidate may come yet
                at = min(self.max_size, len(self._buf))
            out.append(bytes(self._buf[:at]))
            del self._buf[:at]
            self._cands = self._cands[int(np.searchsorted(self._cands, at)):] - at
        return out


def pieces(f: IO[bytes], read_size: int = 4 << 20, min_size: int = MIN_SIZE, max_size: int = MAX_SIZE) -> Iterator[bytes]:
    """The pieces of the binary stream ``f``, read ``read_size`` bytes at a time."""
    c = Cutter(min_size, max_size)
    while True:
        block = f.read(read_size)
        if not block:
            break
        yield from c.feed(block)
    yield from c.end()
