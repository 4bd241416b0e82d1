"""Reused buffers for the chunks a zarr view hands to zarr, and the limit on how many are read at once.

zarr copies each chunk a store returns into its output on its one event-loop
thread, then drops the chunk. A chunk read into a fresh buffer costs the
reading thread page faults on first touch, and its release an ``munmap``; a
chunk handed over as a map of its file costs faults and an ``munmap`` too, and
the bytes zarr copies are the file's, which can change (or be cut, a
``SIGBUS``) after they were checked. A buffer from this pool is private memory,
already faulted in and aligned, and it is checked after the read that filled
it, so zarr copies exactly the bytes that were checked.

A buffer comes back only when nothing refers to it. Each lease is a fresh array
whose base is a ``memoryview`` of the pooled memory, not an array, so numpy's
chains of views stop at the lease: every view, reshape, ``asarray`` or
``memoryview`` zarr makes of it keeps the lease alive, and a weakref finalizer
returns the memory when the last of them is gone (reference counts are not
used: a borrowed reference is not counted on newer Pythons).

:func:`reading` bounds the chunks read at once from a local folder to one
fewer than the cores (at least one), so zarr's copying thread, the read's
critical path, keeps a core to itself while the next chunks are read: more
readers only take turns with it (measured, 2 cores, a whole 1 GiB read: 0.30-0.33 s
with one reader, 0.34 s with zarr's ten at once).
"""

from __future__ import annotations

import os
import threading
import weakref
from collections import deque
from typing import Any

import numpy as np

__all__ = ["lease", "reading", "POOL_BYTES", "pooled_bytes"]

#: The most memory the pool keeps between reads (zarr holds up to ``async.concurrency``, 10, chunks at once:
#: ten 4 MiB chunks and one being read fit). A lease past it is a plain fresh buffer, never kept.
POOL_BYTES = 48 << 20

_lock = threading.Lock()
_free: dict[int, deque[np.ndarray[Any, np.dtype[np.uint8]]]] = {}
_kept = 0  # bytes the pool owns, leased or free
#: Chunks read at once from a local folder.
READERS = max(1, (os.cpu_count() or 2) - 1)
_readers = threading.BoundedSemaphore(READERS)


def _fresh_in_child() -> None:
    """A forked child starts with free slots and an empty pool: the parent's other threads, which may have held a
    slot or the lock at the fork, are not in the child to give them back."""
    global _lock, _readers, _free, _kept
    _lock, _readers, _free, _kept = threading.Lock(), threading.BoundedSemaphore(READERS), {}, 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_fresh_in_child)


def lease(nbytes: int) -> np.ndarray[Any, np.dtype[np.uint8]]:
    """A writable buffer of ``nbytes`` (contents undefined) that nothing else holds; its memory goes back to the
    pool when the returned array and everything made from it are gone."""
    global _kept
    with _lock:
        free = _free.setdefault(nbytes, deque())
    try:
        mem = free.pop()  # atomic: a finalizer (any thread, any time) appends without the lock
    except IndexError:
        with _lock:
            if _kept + nbytes > POOL_BYTES:
                return np.empty(nbytes, np.uint8)
            _kept += nbytes
        mem = np.empty(nbytes, np.uint8)
    out: np.ndarray[Any, np.dtype[np.uint8]] = np.frombuffer(mem.data, np.uint8)
    weakref.finalize(out, free.append, mem).atexit = False
    return out


def pooled_bytes() -> int:
    """The bytes the pool owns now, leased or free (for tests)."""
    return _kept


class _Reading:
    def __init__(self, limited: bool) -> None:
        self.limited = limited

    def __enter__(self) -> None:
        if self.limited:
            _readers.acquire()

    def __exit__(self, *exc: object) -> None:
        if self.limited:
            _readers.release()


_LIMITED, _UNLIMITED = _Reading(True), _Reading(False)


def reading(local: bool) -> _Reading:
    """Held while one chunk is read for zarr. From a ``local`` folder, reads beyond the limit wait (see the
    module's doc); from a remote store they do not: there, reads in flight hide each request's latency."""
    return _LIMITED if local else _UNLIMITED
