"""The code version's parses, kept beside the interpreter's bytecode cache so a fresh process does not parse
unchanged functions again.

A code version reads each function's ``def`` block, parses it, strips docstrings and decorators, dumps the
tree as text, finds the names the code only writes to, and compiles the block to check it is the code that
runs (see :mod:`casmon.keys.codeversion`). For a script's first cached call that is most of the version's
cost. What it yields depends on nothing but the block's text and the code object, so it is kept under a
digest of exactly those: the Python version, the block's text, the code's name, compiler flags and what
the code does (its signature without line numbers). An edit changes the text and so the digest: a
stale parse is never looked up, let alone served.

Where: ``__pycache__/{module}.{cache_tag}.casmon-parses`` beside the source (or under
``sys.pycache_prefix``), one JSON file per source file, written as the interpreter writes bytecode: not at
all under ``PYTHONDONTWRITEBYTECODE``, and atomically (a reader sees the old file or the new). Each entry
carries a check of its key and value; an entry that fails it, a file that does not parse, or one too large is
ignored (and rewritten on the next miss). Anyone who can write there can replace the bytecode the
interpreter runs, so the file is trusted as far as that bytecode is.
"""

from __future__ import annotations

import os
import sys
import _thread  # threading's locks, without loading threading on a hit
from types import CodeType
TYPE_CHECKING = False  # typing's flag without importing typing (~2 ms of a first hit)
if TYPE_CHECKING:
    from typing import Any

from casmon.keys.digest import xxhash

from casmon.keys import jsonlite

__all__ = ["lookup", "remember", "write_all", "entry_key", "STATS", "MAX_ENTRIES", "MAX_BYTES"]

#: Changes whenever what an entry holds or how a parse is made changes: older entries are then not found.
FORMAT = 1
#: Entries kept per source file (the newest); a file edited many times does not grow without bound.
MAX_ENTRIES = 512
#: A cache file larger than this is ignored.
MAX_BYTES = 8 << 20
_SUFFIX = ".casmon-parses"

#: Counts for tests and diagnostics: ``hits``, ``misses``, ``ignored`` (entries or files that failed their
#: checks) and ``writes``.
STATS = {"hits": 0, "misses": 0, "ignored": 0, "writes": 0}

_lock = _thread.allocate_lock()
_files: dict[str, dict[str, list[Any]]] = {}  # cache path -> its entries, read once per process
_dirty: set[str] = set()  # cache paths with entries this process added, written at exit
_exit_hooked = False


def entry_key(block: str, code: CodeType, sig: Any, file: str | None = None) -> str:
    """The digest a parse is kept under: everything the parse and its compile check depend on: the block's
    text, the code's names, flags and signature ``sig``, and the whole ``file`` where that decided."""
    h = xxhash.xxh3_128()
    h.update(repr((FORMAT, sys.implementation.cache_tag, sys.version_info[:2], code.co_name, code.co_qualname,
                   code.co_flags, file is not None)).encode())
    for part in (block, repr(sig), file or ""):
        h.update(b"\0%d\0" % len(part))
        h.update(part.encode("utf-8", "surrogatepass"))
    return h.hexdigest()


def _check(key: str, text: str, names: list[str]) -> str:
    return xxhash.xxh3_64_hexdigest(jsonlite.dumps([key, text, names]).encode("utf-8", "surrogatepass"))


def _cache_path(source: str) -> str | None:
    if not source.endswith(".py") or sys.implementation.cache_tag is None:
        return None
    source = os.path.abspath(source)  # ``python script.py``: the script's code names it as given
    if not os.path.isfile(source):
        # A notebook cell's code names a file that was never written (``/tmp/ipykernel_.../1.py``), and a
        # script that changed folders names one elsewhere: no cache is kept beside either.
        return None
    try:
        from importlib.util import cache_from_source

        pyc = cache_from_source(source)
    except (ValueError, NotImplementedError):
        return None
    return pyc[: -len(".pyc")] + _SUFFIX if pyc.endswith(".pyc") else None


def _load(path: str) -> dict[str, list[Any]]:
    """The valid entries of the cache file at ``path`` (none if it is missing, too large or malformed)."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except OSError:
        return {}
    try:
        if len(raw) > MAX_BYTES:
            raise ValueError("too large")
        doc = jsonlite.loads(raw)
        if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("entries"), dict):
            raise ValueError("not a parse cache")
    except (ValueError, RecursionError, UnicodeDecodeError):
        STATS["ignored"] += 1
        return {}
    entries: dict[str, list[Any]] = doc["entries"]
    return entries


def _valid(key: str, entry: Any) -> tuple[str, frozenset[str]] | None:
    if not (isinstance(entry, list) and len(entry) == 3 and isinstance(entry[0], str) and isinstance(entry[1], list)
            and all(isinstance(n, str) for n in entry[1]) and isinstance(entry[2], str)):
        return None
    if entry[2] != _check(key, entry[0], entry[1]):
        return None
    return entry[0], frozenset(entry[1])


def _entries(source: str) -> tuple[str, dict[str, list[Any]]] | None:
    path = _cache_path(source)
    if path is None:
        return None
    with _lock:
        entries = _files.get(path)
    if entries is None:
        entries = _load(path)
        with _lock:
            entries = _files.setdefault(path, entries)
    return path, entries


def lookup(source: str, keys: tuple[str, ...]) -> tuple[str, frozenset[str]] | None:
    """The kept ``(tree text, write-only names)`` of a parse of a block of ``source`` under the first of
    ``keys`` that has a valid one, or None."""
    found = _entries(source)
    got = None
    for key in keys if found is not None else ():
        entry = found[1].get(key) if found is not None else None
        if entry is not None:
            got = _valid(key, entry)
            if got is not None:
                break
            STATS["ignored"] += 1
    STATS["hits" if got is not None else "misses"] += 1
    return got


def remember(source: str, key: str, text: str, names: frozenset[str]) -> None:
    """Keep a parse made from ``source``'s block under ``key``. Written when the process exits, once per
    file however many functions it holds; any failure to write is ignored (the parse is made again)."""
    global _exit_hooked
    if sys.dont_write_bytecode:
        return
    found = _entries(source)
    if found is None:
        return
    path, entries = found
    listed = sorted(names)
    with _lock:
        entries.pop(key, None)
        entries[key] = [text, listed, _check(key, text, listed)]
        while len(entries) > MAX_ENTRIES:
            del entries[next(iter(entries))]
        _dirty.add(path)
        if not _exit_hooked:
            import atexit

            atexit.register(write_all)
            _exit_hooked = True


def write_all() -> None:
    """Write every cache file with parses this process added (at exit; callable sooner)."""
    while True:
        with _lock:
            if not _dirty:
                return
            path = _dirty.pop()
            import json  # a write's: a hit reads only

            doc = json.dumps({"format": FORMAT, "entries": _files.get(path, {})})
        if len(doc) <= MAX_BYTES:
            _write(path, doc)


def _write(path: str, doc: str) -> None:
    tmp = f"{path}.{os.getpid()}.{_thread.get_ident()}.tmp"
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(tmp, "w", encoding="utf-8", errors="surrogatepass") as f:
            f.write(doc)
        os.replace(tmp, path)  # a reader sees the old file or the new, never half of one
        STATS["writes"] += 1
    except (OSError, UnicodeEncodeError):
        try:
            os.unlink(tmp)
        except OSError:
            pass
