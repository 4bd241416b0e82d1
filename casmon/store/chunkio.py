"""Large chunks' I/O: the chunk pool, and reading loose chunks straight into their buffers.

Loaded by the first large value written or read (:mod:`casmon.store.objects` keeps what a small
value's hit reads: a pack's frame, checked); a script whose first hit is a small value never loads it.
"""

from __future__ import annotations

import io
import os
import _thread  # threading's locks, without loading threading on a hit
from collections.abc import Callable
TYPE_CHECKING = False  # typing's flag without importing typing (~2 ms of a first hit)
if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor
    from typing import TypeVar

    import numpy as np
    import numpy.typing as npt

    from casmon.store.objects import ObjectStore, Out

    _T = TypeVar("_T")
    _R = TypeVar("_R")

import xxhash

from casmon.errors import DamagedObjectError
from casmon.keys.digest import Digest
from casmon.store.codec import FRAME_HEADER, decode_body, read_header
from casmon.store.objects import _bytes_of, loose_key

__all__ = ["chunk_pool", "map_chunks", "get_into_many", "stored_payload"]


_pool_lock = _thread.allocate_lock()
_pool_state: tuple[int, ThreadPoolExecutor] | None = None  # (pid, pool)


def chunk_pool() -> ThreadPoolExecutor | None:
    """The thread pool that hashes, compresses, writes and reads large chunks, or None.

    xxhash, blosc and zstd release the GIL, as do file reads and writes, so the
    pool's threads use every core on one value. One pool per process, started
    on first use (a forked child starts its own); None while the interpreter
    exits (Python 3.12 refuses new threads then), and callers do the work in
    their own thread.
    """
    global _pool_state
    st = _pool_state
    if st is not None and st[0] == os.getpid():
        return st[1]
    with _pool_lock:
        st = _pool_state
        if st is not None and st[0] == os.getpid():
            return st[1]
        from concurrent.futures import ThreadPoolExecutor  # loaded by the first large value, not by a hit

        try:
            pool = ThreadPoolExecutor(max_workers=max(2, min(8, os.cpu_count() or 2)), thread_name_prefix="casmon-chunk")
            pool.submit(int).result()  # start a thread now: fails here, not later, if threads cannot start
        except RuntimeError:
            return None
        _pool_state = (os.getpid(), pool)
        return pool


def map_chunks(fn: Callable[[_T], _R], items: list[_T]) -> list[_R | None]:
    """``[fn(x) for x in items]`` on the chunk pool (in order; the first error is raised after all ended).

    Before the pool has started (a script's first hit) the items are spread over a few plain threads
    instead: starting the pool imports ``concurrent.futures`` and ``logging``, which cost a fresh
    process more than reading a 32 MB value does.
    """
    if len(items) <= 1:
        return [fn(x) for x in items]
    st = _pool_state
    if st is None or st[0] != os.getpid():
        return _spread(fn, items)
    pool = chunk_pool()
    if pool is None:
        return [fn(x) for x in items]
    try:
        futs = [pool.submit(fn, x) for x in items]
    except RuntimeError:  # the interpreter began to exit meanwhile
        return [fn(x) for x in items]
    out: list[_R | None] = []
    error: BaseException | None = None
    for f in futs:
        try:
            out.append(f.result())
        except BaseException as e:  # noqa: BLE001 - wait for every job, then raise the first error
            error = error or e
            out.append(None)
    if error is not None:
        raise error
    return out


def _spread(fn: Callable[[_T], _R], items: list[_T]) -> list[_R | None]:
    """``[fn(x) for x in items]`` on short-lived threads, the caller's among them; in order, and the first
    error (in item order) is raised once every item has ended."""
    out: list[_R | None] = [None] * len(items)
    errors: list[BaseException | None] = [None] * len(items)
    todo = iter(range(len(items)))  # next() on a range iterator is atomic under the GIL
    lock = _thread.allocate_lock()

    def drain() -> None:
        while True:
            with lock:
                i = next(todo, None)
            if i is None:
                return
            try:
                out[i] = fn(items[i])
            except BaseException as e:  # noqa: BLE001 - every item runs; the first error is raised below
                errors[i] = e

    import threading  # a thread's: a hit starts none

    threads: list[threading.Thread] = []
    for _ in range(min(len(items), max(2, min(8, os.cpu_count() or 2))) - 1):
        t = threading.Thread(target=drain, name="casmon-read", daemon=True)
        try:
            t.start()
        except RuntimeError:  # no new threads while the interpreter exits: the caller does the rest
            break
        threads.append(t)
    drain()
    for t in threads:
        t.join()
    for e in errors:
        if e is not None:
            raise e
    return out


def _readinto(f: io.RawIOBase, mv: memoryview) -> int:
    """Fill ``mv`` from file ``f`` (unbuffered reads may return less than asked); the bytes read."""
    got = 0
    while got < mv.nbytes:
        n = f.readinto(mv[got:])
        if not n:
            break
        got += n
    return got


#: Raw chunks are read and hashed in pieces this large, so the hash reads what was just copied
#: while it is still in the CPU's cache instead of reading the whole chunk from memory again.
_PIECE = 1 << 20


def _readinto_hashed(f: io.RawIOBase, mv: memoryview) -> tuple[int, bytes]:
    """Fill ``mv`` from file ``f`` piece by piece, hashing each piece as it lands: (bytes read, xxh3-128)."""
    h = xxhash.xxh3_128()
    got = 0
    while got < mv.nbytes:
        piece = mv[got : got + _PIECE]
        n = _readinto(f, piece)
        if n:
            h.update(piece[:n])
        got += n
        if n < piece.nbytes:
            break
    return got, h.digest()


def stored_payload(self: ObjectStore, d: Digest, scratch: Out | None = None) -> tuple[int, bytes | memoryview] | None:
    """Loose blob ``d``'s payload as it is stored, with the id of the codec it is stored with, checked against
    ``d`` (a compressed one decoded into ``scratch``, of its raw length, to check it): what an export copies
    without compressing it again. None where ``d`` is no loose object (packed, or missing)."""
    key = loose_key(d)
    data = self.backend.get(key)
    if data is None:
        return None
    try:
        codec = read_header(data, key).codec
    except DamagedObjectError:
        self.found_damaged(d)
        raise
    self._decode(data, key, d, None if codec == 0 else scratch)
    return codec, _bytes_of(data)[FRAME_HEADER:]


def get_into_many(self: ObjectStore, jobs: list[tuple[Digest, npt.NDArray[np.uint8]]], window: int = 8) -> None:
    """Read many large blobs into their buffers, on the chunk pool.

    From a local folder each loose object is read straight into its buffer
    (a raw payload is never copied again) and checked there; from other
    stores ``window`` objects are fetched at a time and decoded on the pool.
    """
    if not jobs:
        return
    if self.backend.local_root is not None:
        missing = [j for j, ok in zip(jobs, map_chunks(lambda j: read_local_into(self, j), jobs)) if not ok]
    else:
        missing = []
        for i in range(0, len(jobs), window):
            batch = jobs[i : i + window]
            keys = [loose_key(d) for d, _ in batch]
            got = [(d, out, key, data) for (d, out), key, data in zip(batch, keys, self.backend.get_many(keys))]
            missing += [(d, out) for d, out, _, data in got if data is None]
            found = [(d, out, key, data) for d, out, key, data in got if data is not None]
            map_chunks(lambda g: self._decode(g[3], g[2], g[0], g[1]), found)
    for d, out in missing:
        self.get(d, out=out, loose_hint=False)  # not loose after all: packed, or missing


def read_local_into(self: ObjectStore, job: tuple[Digest, npt.NDArray[np.uint8]]) -> bool:
    """Read loose object ``d`` from a local folder into ``out`` and check it; False if there is no such file."""
    d, out = job
    key = loose_key(d)
    path = self.backend.local_path(key)
    if path is None:  # not a local folder after all: read it the ordinary way
        return False
    try:
        f = open(path, "rb", buffering=0)
    except FileNotFoundError:
        return False
    self.backend.requests += 1
    try:
        with f:
            head = f.read(FRAME_HEADER)
            try:
                frame = read_header(head, key)
                if frame.digest != d:
                    raise DamagedObjectError(key, f"header names digest {frame.digest.hex()}, expected {d.hex()}")
                size = os.fstat(f.fileno()).st_size
                if size != FRAME_HEADER + frame.stored_len:
                    raise DamagedObjectError(key, f"payload is {size - FRAME_HEADER} bytes, header says "
                                                  f"{frame.stored_len} (truncated or extended)")
                mv = _bytes_of(out)
                if frame.codec == 0 and frame.raw_len == mv.nbytes == frame.stored_len:
                    got, digest = _readinto_hashed(f, mv)
                    if got != mv.nbytes:
                        raise DamagedObjectError(key, f"payload is {got} bytes, header says {frame.stored_len} (truncated)")
                    if digest != frame.digest:
                        raise DamagedObjectError(key, "content does not match its digest")
                else:
                    decode_body(frame, f.read(), key, out)
            except DamagedObjectError:
                self.found_damaged(d)
                raise
    except FileNotFoundError:
        return False
    return True
