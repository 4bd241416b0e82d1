"""Content-defined chunking: cut a byte stream where its content says, so an insertion moves only nearby cuts.

A gear hash (FastCDC's, as restic cuts with a rolling hash) at byte ``i`` is
``sum(GEAR[b[i-j]] << j for j < 32)`` mod 2**32: it depends on the 32 bytes ending at ``i`` only, so it is
computed for a whole block at once with numpy (five shift-and-add passes, doubling the window each time,
instead of a Python loop per byte; 32 bits, as 64 halve the speed for no better cuts). A byte whose hash
has the top :data:`MASK_BITS` bits clear is a *candidate*; a cut is the first candidate at least ``min_size`` after the previous cut, or
``max_size`` after it when there is none. Candidates do not depend on where reading started, so the cuts
after an edit fall back onto the earlier ones within a piece or two. Measured against the ``fastcdc``
package (docs/BENCHMARKS.md): its compiled build cuts ~20x faster, its pure-Python one ~7x slower, and it
would bring four more dependencies; this one cuts at about a third of the speed ``store.put`` stores.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import IO, Any

import numpy as np

__all__ = ["MIN_SIZE", "AVG_SIZE", "MAX_SIZE", "MASK_BITS", "candidates", "Cutter", "pieces"]

MIN_SIZE = 512 << 10
MAX_SIZE = 8 << 20
#: A candidate is a byte whose hash has these many top bits clear: one in 2**19, so a piece averages
#: ``MIN_SIZE + 2**19`` = 1 MiB.
MASK_BITS = 19
AVG_SIZE = MIN_SIZE + (1 << MASK_BITS)
_WINDOW = 32
_BLOCK = 1 << 20  # bytes hashed at once: the hash arrays are 4 bytes a byte

# Fixed for all time: pieces of equal content must be cut equally by every casmon version.
_GEAR = np.random.Generator(np.random.PCG64(0x6361736D6F6E)).integers(0, 2**32, size=256, dtype=np.uint32)
_BELOW = np.uint32(1 << (32 - MASK_BITS))  # top MASK_BITS bits clear: the hash is below this


def candidates(data: Any, context: bytes = b"") -> np.ndarray[Any, np.dtype[np.int64]]:
    """The offsets in ``data`` (a bytes-like) of the bytes whose gear hash marks a candidate cut (a cut falls
    after that byte). ``context``: the bytes just before ``data`` (up to 31 are used), so a block's hashes
    equal those of the whole stream."""
    ctx = bytes(context[-(_WINDOW - 1):]) if context else b""
    buf = np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)
    if ctx:
        buf = np.concatenate([np.frombuffer(ctx, dtype=np.uint8), buf])
    h = _GEAR[buf]
    shift = 1
    while shift < _WINDOW:  # h[i] sums the window of ``2*shift`` bytes ending at i
        h[shift:] += h[:-shift] << np.uint32(shift)
        shift *= 2
    hits = np.flatnonzero(h < _BELOW).astype(np.int64) - len(ctx)
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
