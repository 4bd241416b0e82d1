"""Room to collect garbage on a full disk: a small ballast file that gc gives up first.

gc frees space, but it must write a little before it deletes anything (its
lock), and on a disk with no room left that write fails: the one command that
could make room could not run. So a local store keeps ``gc/reserve``, written
when the store is made. A gc that finds the disk (nearly) full deletes it
before it takes the lock, and writes it again once it has run (smaller if it
freed less than that).
"""

from __future__ import annotations

from casmon.store.backend import Backend

__all__ = ["RESERVE_KEY", "RESERVE_BYTES", "ensure", "release_if_full", "restore"]

RESERVE_KEY = "gc/reserve"
RESERVE_BYTES = 256 << 10
RESERVE_MIN = 16 << 10


def _free(backend: Backend) -> int | None:
    root = backend.local_root
    if root is None:
        return None
    import shutil  # loaded when a store is made or collected, not when one is opened

    try:
        return shutil.disk_usage(root).free
    except OSError:
        return None


def ensure(backend: Backend) -> None:
    """Write the reserve of a local store if it is missing (best effort): whole where there is room, else
    as much as half the room left, down to the few KiB a gc needs for its lock and its fence."""
    free = _free(backend)
    if free is None or backend.read_only:
        return
    size = min(RESERVE_BYTES, free // 2)
    if size < RESERVE_MIN:
        return
    try:
        if not backend.exists(RESERVE_KEY):
            backend.create(RESERVE_KEY, bytes(size))
    except OSError:
        pass


def release_if_full(backend: Backend) -> bool:
    """Delete the reserve if the disk has less room than it holds; True if it did."""
    free = _free(backend)
    if free is None or free >= RESERVE_BYTES or not backend.exists(RESERVE_KEY):
        return False
    backend.delete(RESERVE_KEY)
    return True


def restore(backend: Backend) -> None:
    """After gc: the reserve again, if gc made the room for it."""
    ensure(backend)
