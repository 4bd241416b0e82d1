"""File digests by content, remembered by stat: what ``files=`` and file-backed values are keyed by.

A file's digest is remembered by its stat (device, inode, size, mtime, ctime), so a hit
on a large input file costs one ``stat``, not a read.
"""

from __future__ import annotations

import os
import threading
import time

import xxhash

from casmon.keys.digest import Digest

__all__ = ["file_digest", "files_hashed"]

#: Files modified less than this long before they were hashed are hashed again at the next call: on
#: file systems with coarse timestamps, a write in the same tick would not change the stat.
_RACY_NS = 2_000_000_000
_READ_BLOCK = 8 << 20

_stat_memo: dict[str, tuple[tuple[int, int, int, int, int], Digest]] = {}
#: Files read and hashed in this process (the stat memo saves the rest).
files_hashed = 0
_stat_memo_lock = threading.Lock()


def _stat_sig(st: os.stat_result) -> tuple[int, int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def file_digest(path: str | os.PathLike[str], st: os.stat_result | None = None) -> Digest:
    """xxh3-128 of a file's bytes, remembered by (device, inode, size, mtime, ctime).

    A file whose stat is unchanged is not read again (a hit on a 10 GB file
    costs one ``stat``). ctime cannot be set by ``touch`` or ``cp -p``, and a
    file changed within 2 s of being hashed is hashed again, so a write that
    keeps size and mtime is still seen.
    """
    # Remembered by the path's stat, which follows links: a link pointed elsewhere has another (dev, inode).
    p = os.path.abspath(os.fspath(path))
    if st is None:
        st = os.stat(p)
    sig = _stat_sig(st)
    m = _stat_memo.get(p)
    if m is not None and m[0] == sig:
        return m[1]
    global files_hashed
    for _ in range(3):
        files_hashed += 1
        start = time.time_ns()
        h = xxhash.xxh3_128()
        buf = bytearray(min(_READ_BLOCK, max(st.st_size, 1)))
        mv = memoryview(buf)
        with open(p, "rb", buffering=0) as fh:
            while True:
                n = fh.readinto(mv)
                if not n:
                    break
                h.update(mv[:n])
        d = Digest.from_raw(h.digest())
        st2 = os.stat(p)
        if _stat_sig(st2) == sig:
            break
        sig = _stat_sig(st2)  # written while it was read: read it again
        st = st2
    if start - max(st.st_mtime_ns, st.st_ctime_ns) > _RACY_NS:
        with _stat_memo_lock:
            _stat_memo[p] = (sig, d)
    return d
