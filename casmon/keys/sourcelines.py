"""A source file's lines as :mod:`linecache` gives them, read without loading linecache where nothing has.

linecache imports :mod:`tokenize` (about a millisecond) to find a file's encoding, and a script's first
cache hit reads its function's file once. A file on disk without an encoding declaration (PEP 263: UTF-8,
with or without a BOM) is read here, as linecache reads it (universal newlines, a last line given its
newline); everything else goes to linecache: a process that has loaded it (its cache may hold IPython's
cells and zip imports' sources), a name that is no file, a file that declares a coding, one that does not
decode. Lines are kept, and the same list returned, until :func:`checkcache` sees the file change.
"""

from __future__ import annotations

import os
import sys

__all__ = ["checkcache", "getlines"]

#: filename -> (size, mtime_ns, lines), as linecache keeps them.
_kept: dict[str, tuple[int, int, list[str]]] = {}


def getlines(filename: str) -> list[str]:
    """The lines of ``filename`` (``[]`` if it cannot be read), kept until :func:`checkcache` drops them."""
    lc = sys.modules.get("linecache")
    if lc is None:
        kept = _kept.get(filename)
        if kept is not None:
            return kept[2]
        read = read_plain(filename)
        if read is not None:
            _kept[filename] = read
            return read[2]
    import linecache  # an unusual file, or loaded already: its own rules

    return linecache.getlines(filename)


def checkcache(filename: str) -> None:
    """Forget ``filename``'s lines if the file changed since they were read (as ``linecache.checkcache``)."""
    kept = _kept.get(filename)
    if kept is not None:
        try:
            st = os.stat(filename)
        except (OSError, ValueError):
            st = None
        if st is None or (st.st_size, st.st_mtime_ns) != kept[:2]:
            _kept.pop(filename, None)
    lc = sys.modules.get("linecache")
    if lc is not None:
        lc.checkcache(filename)


def read_plain(filename: str) -> tuple[int, int, list[str]] | None:
    """``(size, mtime_ns, lines)`` of a UTF-8 source file without a coding declaration, read as linecache
    reads it; None where linecache must decide (no such file, a coding line, bytes that do not decode)."""
    if not filename or (filename.startswith("<") and filename.endswith(">")):
        return None
    try:
        st = os.stat(filename)
        with open(filename, "rb") as f:
            data = f.read()
    except (OSError, ValueError):
        return None
    body = data[3:] if data.startswith(b"\xef\xbb\xbf") else data
    if b"coding" in b"\n".join(body.split(b"\n", 2)[:2]):  # any declaration, even utf-8's: tokenize decides
        return None
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return None
    import io  # already loaded by the interpreter: no cost

    lines = io.StringIO(text, newline=None).readlines()
    if not lines:
        return None  # an empty file: linecache's lines for it differ by version ([] or ['\n'] on 3.13)
    if not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    return st.st_size, st.st_mtime_ns, lines
