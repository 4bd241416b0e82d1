"""Large byte runs in a fingerprint, hashed in fixed segments on every core.

One xxh3 stream uses one core: a 256 MiB argument took 13-16 ms to key while
the other core idled. A run of :data:`RUN_MIN` bytes or more (an array's data,
a large ``bytes``) is cut at fixed offsets into :data:`SEGMENT` -byte pieces,
each hashed on its own (xxhash lets go of the GIL, so threads run them at
once), and the fingerprint takes the pieces' digests in order in place of the
bytes. The cut depends on nothing but the run's length, never on the machine
or on how the bytes arrive: a strided array fed in blocks of rows, an Arrow
column in chunks and a contiguous copy of either give the same digests, on
two cores or sixty-four.
"""

from __future__ import annotations

import os
import _thread  # threading's locks, without loading threading on a hit
from collections.abc import Callable
TYPE_CHECKING = False  # typing's flag without importing typing (~2 ms of a first hit)
if TYPE_CHECKING:
    from typing import Any

import xxhash

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor

__all__ = ["RUN_MIN", "SEGMENT", "SegmentedRun"]

#: Runs this long or longer are hashed in segments (shorter ones stay one stream: a thread costs ~50 µs).
RUN_MIN = 32 << 20
#: The segment length: part of every large run's key, so it never changes.
SEGMENT = 8 << 20

#: Threads beside the caller's: every other core, up to 7.
_WORKERS = max(1, min(7, (os.cpu_count() or 2) - 1))
_pool_lock = _thread.allocate_lock()
_pool_state: tuple[int, ThreadPoolExecutor] | None = None  # (pid, pool): a forked child makes its own


def _pool() -> ThreadPoolExecutor | None:
    """The threads that hash segments, or None where threads cannot start (the interpreter exits)."""
    global _pool_state
    st = _pool_state
    if st is not None and st[0] == os.getpid():
        return st[1]
    with _pool_lock:
        st = _pool_state
        if st is not None and st[0] == os.getpid():
            return st[1]
        from concurrent.futures import ThreadPoolExecutor

        try:
            pool = ThreadPoolExecutor(max_workers=_WORKERS, thread_name_prefix="casmon-hash")
            pool.submit(int).result()
        except RuntimeError:
            return None
        _pool_state = (os.getpid(), pool)
        return pool


def _digest(mv: Any) -> bytes:
    return xxhash.xxh3_128_digest(mv)


class SegmentedRun:
    """The digests of a run's :data:`SEGMENT` -byte pieces, fed in pieces of any size; whole segments that
    arrive together are hashed in parallel, the caller's thread taking one share."""

    __slots__ = ("left", "digests", "_h", "_fill")

    def __init__(self, total: int) -> None:
        self.left = total  # bytes of the run still to come
        self.digests = bytearray()
        self._h: Any = None  # the segment being filled across calls
        self._fill = 0

    def feed(self, data: Any) -> None:
        mv = memoryview(data).cast("B")
        n = mv.nbytes
        if n > self.left:
            raise ValueError(f"{n} bytes fed where the run has {self.left} left")
        self.left -= n
        pos = 0
        if self._fill:  # finish the segment an earlier piece began
            take = min(SEGMENT - self._fill, n)
            self._h.update(mv[:take])
            self._fill += take
            pos = take
            if self._fill == SEGMENT:
                self.digests += self._h.digest()
                self._h, self._fill = None, 0
        whole = (n - pos) // SEGMENT
        if whole:
            segs = [mv[pos + i * SEGMENT : pos + (i + 1) * SEGMENT] for i in range(whole)]
            self.digests += b"".join(_parallel(segs))
            pos += whole * SEGMENT
        if pos < n:
            self._h = xxhash.xxh3_128(mv[pos:])
            self._fill = n - pos

    def feed_produced(self, produce: Callable[[int, int], Any]) -> None:
        """Feed the whole run as ``produce(start, stop)`` gives it, one segment's bytes at a time, on every core.

        For bytes that must be made before they are hashed (a Fortran array's C-order copy): each thread
        makes and hashes its own segments, so the copying runs on every core too, and no copy of the whole
        run exists at once. The digests are those :meth:`feed` gives for the same bytes."""
        if self._fill or self.digests:
            raise ValueError("feed_produced takes a whole run, not the rest of one")
        total, self.left = self.left, 0
        bounds = [(o, min(o + SEGMENT, total)) for o in range(0, total, SEGMENT)]
        self.digests += b"".join(_parallel_map(lambda b: _digest(produce(b[0], b[1])), bounds))

    def end(self) -> bytes:
        """The segments' digests, in order (16 bytes each); the run must have been fed whole."""
        if self.left:
            raise ValueError(f"the run ended {self.left} bytes short")
        if self._fill:
            self.digests += self._h.digest()
            self._h, self._fill = None, 0
        return bytes(self.digests)


def _digests(segs: list[Any]) -> list[bytes]:
    return [_digest(s) for s in segs]


def _parallel_map(fn: Callable[[Any], bytes], items: list[Any]) -> list[bytes]:
    """``[fn(x) for x in items]`` in shares of consecutive items: one per pool thread and one for the caller's."""
    pool = _pool() if len(items) > 1 else None
    if pool is None:
        return [fn(x) for x in items]
    k = min(len(items), _WORKERS + 1)
    shares = [items[i * len(items) // k : (i + 1) * len(items) // k] for i in range(k)]

    def run(share: list[Any]) -> list[bytes]:
        return [fn(x) for x in share]

    try:
        futs = [pool.submit(run, sh) for sh in shares[1:]]
    except RuntimeError:  # the interpreter began to exit: the same digests, in this thread
        return [fn(x) for x in items]
    out = run(shares[0])
    for f in futs:
        out += f.result()
    return out


def _parallel(segs: list[Any]) -> list[bytes]:
    """The digests of ``segs`` in order, in shares of consecutive segments: one per pool thread and one for
    the caller's."""
    pool = _pool() if len(segs) > 1 else None
    if pool is None:
        return _digests(segs)
    k = min(len(segs), _WORKERS + 1)
    shares = [segs[i * len(segs) // k : (i + 1) * len(segs) // k] for i in range(k)]
    try:
        futs = [pool.submit(_digests, sh) for sh in shares[1:]]
    except RuntimeError:  # the interpreter began to exit: the same digests, in this thread
        return _digests(segs)
    out = _digests(shares[0])
    for f in futs:
        out += f.result()
    return out
