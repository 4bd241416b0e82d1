"""Files and folders by content: the digests ``@casmon.cache(files=...)`` keys a call with.

A file's digest is remembered by its stat (device, inode, size, mtime, ctime), so a hit
on a large input file costs one ``stat``, not a read; a folder is the digest of its tree.
Kept apart from the decorator because it is plain file hashing that knows nothing of stores.
"""

from __future__ import annotations

import os
import stat
import threading
import time
from typing import Any

import xxhash

from casmon.keys.digest import Digest
from casmon.keys.fingerprint import Fingerprinter

__all__ = ["file_digest", "path_digest", "files_key_value"]

#: Files modified less than this long before they were hashed are hashed again at the next call: on
#: file systems with coarse timestamps, a write in the same tick would not change the stat.
_RACY_NS = 2_000_000_000
_READ_BLOCK = 8 << 20

_stat_memo: dict[str, tuple[tuple, Digest]] = {}
files_hashed = 0  # files read and hashed in this process (the stat memo saves the rest)
_stat_memo_lock = threading.Lock()


def _stat_sig(st: os.stat_result) -> tuple:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def file_digest(path: str | os.PathLike, st: os.stat_result | None = None) -> Digest:
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


def path_digest(path: str | os.PathLike, listing: list | None = None) -> tuple[str, Digest | None, int]:
    """``(kind, digest, size)`` of what ``path`` names: a file's bytes, a folder's tree, or nothing.

    A folder is every file and subfolder under it, by relative path and
    content (symbolic links are followed; a link loop is an error). ``listing``,
    if given, receives ``(path, digest hex, size)`` of each file.
    """
    p = os.fspath(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        return "missing", None, 0
    if not stat.S_ISDIR(st.st_mode):
        d = file_digest(p, st)
        if listing is not None:
            listing.append((p, d.hex(), st.st_size))
        return "file", d, st.st_size
    fp = Fingerprinter()
    fp.str_("casmon.folder")
    total = 0
    seen = set()
    for root, dirs, files in os.walk(p, followlinks=True):
        real = os.path.realpath(root)
        if real in seen:
            raise OSError(f"symbolic link loop under {p}: {root}")
        seen.add(real)
        dirs.sort()
        rel = os.path.relpath(root, p).replace(os.sep, "/")
        fp.str_("d")
        fp.str_(rel)
        for name in sorted(files):
            full = os.path.join(root, name)
            fst = os.stat(full)
            d = file_digest(full, fst)
            size = fst.st_size
            total += size
            fp.str_("f")
            fp.str_(name)
            fp.out += bytes(d)
            if listing is not None:
                listing.append((full, d.hex(), size))
    return "folder", fp.digest(), total


def files_key_value(v: Any, listing: list) -> Any:
    """The key value of a ``files=`` parameter: each path with the digest of what it names."""
    if v is None:
        return None
    if isinstance(v, (str, os.PathLike)):
        kind, d, _size = path_digest(v, listing)
        return ("casmon.path", v, kind, None if d is None else bytes(d))
    if isinstance(v, (list, tuple)):
        return type(v)(files_key_value(x, listing) for x in v) if type(v) in (list, tuple) else [files_key_value(x, listing) for x in v]
    if isinstance(v, (set, frozenset)):
        return frozenset(files_key_value(x, listing) for x in v)
    raise TypeError(f"files=: expected a path (str or os.PathLike), a list of paths or None, got {type(v).__name__}")

