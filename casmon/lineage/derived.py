"""A derived lineage index: the few fields of every cache entry that lineage joins, in one file of the store.

Like a database index, not a second store of truth: it is made from the cache table's records (the newest per
key) and names the table files it was made from. A query reads it, then reads directly the records of the
files it does not name (entries written since, this process's waiting ones); where a file it names is no
longer read (merged, rewritten by repair, collected by gc), or the file is missing, damaged (its checksums) or
crafted (a field of the wrong type), the index is made again from the records. Deleting it loses nothing; gc
keeps nothing alive through it (it names keys and digests, never as references).

The file: :data:`MAGIC`, the header's length (8 bytes, little-endian), the header (JSON sealed by
:func:`casmon.store.metafile.seal`: the sources, the row count, the payload's xxh3-128) and the payload (JSON:
interned strings and one row per entry, :data:`FIELDS`).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import xxhash

from casmon.caching import KIND
from casmon.errors import CasmonError, DamagedObjectError, warn_damage
from casmon.store import metafile
from casmon.store.records import parse_record

if TYPE_CHECKING:
    from casmon.store.store import Store

__all__ = ["INDEX_KEY", "MAGIC", "FIELDS", "read_entries", "newest", "REWRITE_MIN"]

INDEX_KEY = "derived/lineage/cache"
MAGIC = b"casmon lineage index 1\n"
#: A row: ``[key, fn, v, time, expires, result, rf, pc, up, files, label, a]`` (``fn`` and ``v`` index the
#: strings; ``a``: the parameters' digests, which ``diff`` compares).
FIELDS = ("key", "fn", "v", "time", "expires", "result", "rf", "pc", "up", "files", "label", "a")
#: The index is written again once this many records were read beside it (fewer: reading them costs little).
REWRITE_MIN = 4096
_FMAX = 1e18


def newest(entries: dict[str, dict[str, Any]], key: str, rec: dict[str, Any]) -> None:
    """Keep ``rec`` as ``key``'s record where it is as new as the one kept (the newest wins; equal times, the
    later read)."""
    old = entries.get(key)
    if old is None or rec.get("time", 0) >= old.get("time", 0):
        entries[key] = rec


def _parsed(store: Store, raw: list[tuple[bytes, bytes]], into: dict[str, dict[str, Any]]) -> None:
    for k, v in raw:
        try:
            rec = parse_record(KIND, k, v)
        except DamagedObjectError as e:  # one malformed record hides no other (verify names it)
            warn_damage(store.url, e.key, e.reason)
            continue
        newest(into, bytes(k).hex(), rec)


def read_entries(store: Store, write: bool = True) -> dict[str, dict[str, Any]]:
    """Every cache entry's newest record (its lineage fields, name, version, times, result), by key hex: through
    the index where it holds, from the records where it does not (and then, if ``write`` and the store can be
    written, the index is made again)."""
    table = store.table(KIND)
    got = _load(store)
    if got is not None:
        sources, entries = got
        beyond = table.items_beyond(sources)
        if beyond is not None:
            files, pending, names = beyond
            _parsed(store, files, entries)
            if write and len(files) >= REWRITE_MIN:
                _save(store, entries, names)
            _parsed(store, pending, entries)
            return entries
    beyond = table.items_beyond(())
    if beyond is None:  # cannot be: nothing was seen
        raise CasmonError(f"the cache table of {store.url} cannot be read")
    files, pending, names = beyond
    entries = {}
    _parsed(store, files, entries)
    if write:
        _save(store, entries, names)
    _parsed(store, pending, entries)
    return entries


# -- the file -----------------------------------------------------------------------------------------------
def _rows(entries: dict[str, dict[str, Any]]) -> tuple[list[str], list[list[Any]]]:
    strings: dict[str, int] = {}

    def s(x: Any) -> int | None:
        if not isinstance(x, str):
            return None
        i = strings.get(x)
        if i is None:
            i = strings[x] = len(strings)
        return i

    rows = []
    for k, r in entries.items():
        files = r.get("files")
        label = r.get("label")
        rows.append([k, s(r.get("fn", "?")), s(r.get("v")), r.get("time", 0.0), r.get("expires"), r.get("result"),
                     r.get("rf"), r.get("pc"), r.get("up"), files if isinstance(files, list) else None,
                     label if isinstance(label, str) else None, r.get("a")])
    return list(strings), rows


def _save(store: Store, entries: dict[str, dict[str, Any]], sources: list[str]) -> None:
    """Write the index; a store that cannot be written (read-only, full, away) keeps none: nothing is lost."""
    if store.read_only:
        return
    try:
        strings, rows = _rows(entries)
        payload = json.dumps({"strings": strings, "rows": rows}, separators=(",", ":"), allow_nan=False).encode()
        header = metafile.seal({"sources": sources, "n": len(rows), "payload": xxhash.xxh3_128_hexdigest(payload)})
        store.backend.set(INDEX_KEY, MAGIC + len(header).to_bytes(8, "little") + header + payload)
    except (CasmonError, OSError, ValueError, TypeError):
        return


def _load(store: Store) -> tuple[list[str], dict[str, dict[str, Any]]] | None:
    """The index's sources and entries; None where it is missing, damaged or crafted (then it is made again)."""
    try:
        data = store.backend.get(INDEX_KEY)
    except (CasmonError, OSError):
        return None
    if data is None:
        return None
    try:
        return _decode(bytes(data))
    except (DamagedObjectError, ValueError, TypeError, KeyError, IndexError, RecursionError, OverflowError):
        return None


def _decode(data: bytes) -> tuple[list[str], dict[str, dict[str, Any]]]:
    m = len(MAGIC)
    if data[:m] != MAGIC or len(data) < m + 8:
        raise ValueError("not a lineage index")
    n = int.from_bytes(data[m:m + 8], "little")
    if n > len(data) - m - 8 or n > metafile.MAX_BYTES:
        raise ValueError("its header's length is out of range")
    head = metafile.load_object(data[m + 8:m + 8 + n], INDEX_KEY)
    if not metafile.checked(head, INDEX_KEY):
        raise ValueError("no checksum")
    payload = data[m + 8 + n:]
    if head.get("payload") != xxhash.xxh3_128_hexdigest(payload):
        raise ValueError("its payload does not match its checksum")
    sources = head.get("sources")
    if not isinstance(sources, list) or not all(isinstance(x, str) for x in sources):
        raise TypeError("sources")
    body = json.loads(payload)
    strings, rows = body["strings"], body["rows"]
    if not isinstance(strings, list) or not all(type(x) is str for x in strings) or type(rows) is not list:
        raise TypeError("strings")
    if len(rows) != head.get("n"):
        raise ValueError("row count")
    entries: dict[str, dict[str, Any]] = {}
    for row in rows:
        key, fn, v, t, exp, result, rf, pc, up, files, label, a = row
        if type(key) is not str or len(key) != 32 or type(t) not in (int, float) or not 0 <= t <= _FMAX:
            raise TypeError("row")
        if type(fn) is not int or fn < 0 or v is not None and (type(v) is not int or v < 0):
            raise TypeError("a string's index")
        r: dict[str, Any] = {"fn": strings[fn], "time": t}
        if v is not None:
            r["v"] = _digest(strings[v])
        if exp is not None:
            if type(exp) not in (int, float) or not 0 <= exp <= _FMAX:
                raise TypeError("expires")
            r["expires"] = exp
        if result is not None:
            r["result"] = _digest(result)
        if rf is not None:
            r["rf"] = _digest(rf)
        if pc is not None:
            if type(pc) is not dict:
                raise TypeError("pc")
            for x in pc.values():
                _digest(x)
            r["pc"] = pc
        if up is not None:
            if type(up) is not dict:
                raise TypeError("up")
            for ks in up.values():
                if type(ks) is not list:
                    raise TypeError("up")
                for x in ks:
                    _digest(x)
            r["up"] = up
        if files is not None:
            if type(files) is not list:
                raise TypeError("files")
            r["files"] = files  # read through Index.files, which takes only well-formed ones
        if label is not None:
            if type(label) is not str:
                raise TypeError("label")
            r["label"] = label
        if a is not None:
            if type(a) is not dict or not all(type(x) is str for x in a.values()):
                raise TypeError("a")
            r["a"] = a
        entries[key] = r
    return sources, entries


def _digest(x: Any) -> str:
    if type(x) is not str or len(x) != 32:
        raise TypeError("not a digest")
    return x
