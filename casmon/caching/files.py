"""Files and folders by content: the digests ``@casmon.cache(files=...)`` keys a call with.

A file's digest is remembered by its stat (device, inode, size, mtime, ctime), so a hit
on a large input file costs one ``stat``, not a read; a folder is the digest of its tree.
Kept apart from the decorator because it is plain file hashing that knows nothing of stores.
"""

from __future__ import annotations

import os
import stat
from typing import Any

from casmon.keys.digest import Digest
from casmon.keys.filedigest import file_digest
from casmon.keys.fingerprint import Fingerprinter

__all__ = ["file_digest", "path_digest", "files_key_value"]


def path_digest(path: str | os.PathLike, listing: list | None = None) -> tuple[str, Digest | None, int]:
    """``(kind, digest, size)`` of what ``path`` names: a file's bytes, a folder's tree, or nothing.

    A folder is every file and subfolder under it, by relative path and
    content (symbolic links are followed; a link loop is an error; a pipe,
    socket or device in it by name only). ``listing``,
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
            if not stat.S_ISREG(fst.st_mode):
                # a pipe, socket or device: named, never opened (a pipe's open waits for a writer, /dev/zero's
                # read never ends; a crafted entry's folder, as `stale` reads it, may hold either)
                fp.str_("s")
                fp.str_(name)
                continue
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

