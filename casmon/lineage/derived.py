"""A derived lineage index: the few fields of every cache entry that lineage joins, as columns in one file.

Like a database index, not a second store of truth: it is made from the cache table's records (the newest per
key) and names the table files it was made from. A query reads it, then reads directly the records of the
files it does not name (entries written since, this process's waiting ones) and merges them in; where a file
it names is no longer read (merged, rewritten by repair, collected by gc), or the file is missing, damaged (its
checksums) or crafted (a column of the wrong length, an index out of range, keys out of order), the index is
made again from the records. Deleting it loses nothing; gc keeps nothing alive through it (it names keys and
digests, never as references).

The file: :data:`MAGIC`, the header's length (8 bytes, little-endian), the header (JSON sealed by
:func:`casmon.store.metafile.seal`: the sources, the row count, each section's length, the payload's xxh3-128)
and the payload: each column of :class:`casmon.lineage.columns.Columns` as raw little-endian bytes, in
:data:`SECTIONS` order, then the string table and the parameters' digests (JSON lists).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import numpy as np
import xxhash

from casmon.caching import KIND
from casmon.errors import CasmonError, DamagedObjectError, warn_damage
from casmon.store import metafile
from casmon.lineage.columns import ITEMS, ROWS, Columns
from casmon.store.records import parse_record

if TYPE_CHECKING:
    from casmon.store.store import Store

__all__ = ["INDEX_KEY", "MAGIC", "FIELDS", "SECTIONS", "read_columns", "read_entries", "newest", "REWRITE_MIN",
           "LINKS_KEY", "load_links", "save_links"]

#: Not the JSON index's name (``derived/lineage/cache``): processes of both versions on one store do not make
#: each other's index again at every query.
INDEX_KEY = "derived/lineage/columns"
MAGIC = b"casmon lineage index 2\n"
#: The record fields the index holds (``a``: the parameters' digests, which ``diff`` compares).
FIELDS = ("key", "fn", "v", "time", "expires", "result", "rf", "pc", "up", "files", "label", "a")
#: The index is written again once this many records were read beside it (fewer: reading them costs little).
REWRITE_MIN = 4096
_FMAX = 1e18
#: The payload's sections, in order: the columns, the strings, the parameters' digests (``a``).
SECTIONS = (*ROWS, *ITEMS, "strings", "avals")


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


def read_columns(store: Store, write: bool = True) -> Columns:
    """Every cache entry's newest record's lineage fields, as columns: through the index where it holds, merged
    with the records it does not name; from the records where it does not hold (and then, if ``write`` and the
    store can be written, the index is made again)."""
    table = store.table(KIND)
    got = _load(store)
    if got is not None:
        sources, cols = got
        beyond = table.items_beyond(sources)
        if beyond is not None:
            files, pending, names = beyond
            if files:
                cols = cols.merged(_columns(store, files))
                if write and len(files) >= REWRITE_MIN:
                    _save(store, cols, names)
            return cols.merged(_columns(store, pending)) if pending else cols
    beyond = table.items_beyond(())
    if beyond is None:  # cannot be: nothing was seen
        raise CasmonError(f"the cache table of {store.url} cannot be read")
    files, pending, names = beyond
    cols = _columns(store, files)
    if write:
        _save(store, cols, names)
    return cols.merged(_columns(store, pending)) if pending else cols


def read_entries(store: Store, write: bool = True) -> dict[str, dict[str, Any]]:
    """Every cache entry's newest record's lineage fields, by key hex (:func:`read_columns`, as dicts)."""
    return read_columns(store, write).records()


def _columns(store: Store, raw: list[tuple[bytes, bytes]]) -> Columns:
    entries: dict[str, dict[str, Any]] = {}
    _parsed(store, raw, entries)
    return Columns.from_records(entries)


# -- the file -----------------------------------------------------------------------------------------------
def encode(cols: Columns, sources: list[str]) -> bytes:
    """The index file of ``cols``, made from the table files ``sources``."""
    parts = [np.ascontiguousarray(getattr(cols, c), dt).tobytes() for c, dt in {**ROWS, **ITEMS}.items()]
    for texts in (cols.strings, cols.avals):
        parts.append(json.dumps(texts, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass"))
    h = xxhash.xxh3_128()
    for x in parts:
        h.update(x)
    header = metafile.seal({"sources": sources, "n": cols.n, "sections": [len(x) for x in parts],
                            "payload": h.hexdigest()})
    return b"".join([MAGIC, len(header).to_bytes(8, "little"), header, *parts])


def _save(store: Store, cols: Columns, sources: list[str]) -> None:
    """Write the index; a store that cannot be written (read-only, full, away) keeps none: nothing is lost."""
    if store.read_only:
        return
    try:
        store.backend.set(INDEX_KEY, encode(cols, sources))
    except (CasmonError, OSError, ValueError, TypeError, UnicodeError):
        return


def _load(store: Store) -> tuple[list[str], Columns] | None:
    """The index's sources and columns; None where it is missing, damaged or crafted (then it is made again)."""
    try:
        data = store.backend.get(INDEX_KEY)
    except (CasmonError, OSError):
        return None
    if data is None:
        return None
    try:
        return _decode(data)
    except (DamagedObjectError, ValueError, TypeError, KeyError, IndexError, RecursionError, OverflowError,
            UnicodeError):
        return None


def _decode(data: Any) -> tuple[list[str], Columns]:
    mv = memoryview(data).cast("B")
    m = len(MAGIC)
    if bytes(mv[:m]) != MAGIC or len(mv) < m + 8:
        raise ValueError("not a lineage index")
    hn = int.from_bytes(mv[m:m + 8], "little")
    if hn > len(mv) - m - 8 or hn > metafile.MAX_BYTES:
        raise ValueError("its header's length is out of range")
    head = metafile.load_object(bytes(mv[m + 8:m + 8 + hn]), INDEX_KEY)
    if not metafile.checked(head, INDEX_KEY):
        raise ValueError("no checksum")
    payload = mv[m + 8 + hn:]
    if head.get("payload") != xxhash.xxh3_128_hexdigest(payload):
        raise ValueError("its payload does not match its checksum")
    sources, n, lens = head.get("sources"), head.get("n"), head.get("sections")
    if not isinstance(sources, list) or not all(isinstance(x, str) for x in sources):
        raise TypeError("sources")
    if type(n) is not int or n < 0 or type(lens) is not list or len(lens) != len(SECTIONS) \
            or not all(type(x) is int and x >= 0 for x in lens) or sum(lens) != len(payload):
        raise ValueError("its sections do not match its payload")
    cols: dict[str, np.ndarray] = {}
    off = 0
    dtypes = {**ROWS, **ITEMS}
    for name, ln in zip(SECTIONS, lens):
        chunk = payload[off:off + ln]
        off += ln
        if name in ("strings", "avals"):
            texts = json.loads(bytes(chunk))
            if type(texts) is not list or not all(type(x) is str for x in texts):
                raise TypeError(name)
            if name == "strings":
                strings = texts
            else:
                avals = texts
        else:
            dt = np.dtype(dtypes[name])
            if ln % dt.itemsize:
                raise ValueError(name)
            cols[name] = np.frombuffer(chunk, dt)
    _check(cols, n, len(strings), len(avals))
    return sources, Columns(cols, strings, avals)


def _check(cols: dict[str, np.ndarray], n: int, ns: int, na: int) -> None:
    """Every column's length, every index's range, the keys' order: a crafted index is made again."""
    for c in ROWS:
        if len(cols[c]) != (n + 1 if c.endswith("_ptr") else n):
            raise ValueError(f"column {c}'s length")
    key = cols["key"]
    if n > 1 and not bool(np.all(key[1:] > key[:-1])):
        raise ValueError("keys out of order")
    t, e = cols["time"], cols["expires"]
    if not bool(np.all((t >= 0) & (t <= _FMAX))) or not bool(np.all(np.isnan(e) | ((e >= 0) & (e <= _FMAX)))):
        raise ValueError("a time out of range")
    if n and not (bool(np.all((cols["fn"] >= 0) & (cols["fn"] < ns))) and cols["has"].max() <= 3):
        raise ValueError("fn")
    for c in ("v", "label"):
        if n and not bool(np.all((cols[c] >= -1) & (cols[c] < ns))):
            raise ValueError(c)
    for p, names in (("pc", ("pc_name", "pc_d")), ("up", ("up_name", "up_key")),
                     ("f", ("f_param", "f_path", "f_d")), ("a", ("a_name", "a_val"))):
        ptr = cols[p + "_ptr"]
        if ptr[0] != 0 or (n and not bool(np.all(ptr[1:] >= ptr[:-1]))):
            raise ValueError(f"{p}'s offsets")
        for c in names:
            if len(cols[c]) != ptr[-1]:
                raise ValueError(f"column {c}'s length")
            if ITEMS[c] == "<i4" and len(cols[c]) and not bool(np.all((cols[c] >= 0)
                                                                      & (cols[c] < (na if c == "a_val" else ns)))):
                raise ValueError(c)


# -- the runs' cache links, by manifest digest ------------------------------------------------------------------
#: A manifest is stored by content: its links, kept by its digest, never go out of date. Derived data too.
LINKS_KEY = "derived/lineage/run-links"
LINKS_MAGIC = b"casmon lineage run links 1\n"


def load_links(store: Store) -> dict[str, list[dict[str, Any]]]:
    """Manifest digest -> its cache links (``{"fn", "key", "hit"}``); empty where the file is missing, damaged
    or crafted (then every manifest is read)."""
    try:
        data = store.backend.get(LINKS_KEY)
        if data is None:
            return {}
        raw = bytes(data)
        m = len(LINKS_MAGIC)
        if raw[:m] != LINKS_MAGIC:
            return {}
        body = metafile.load_object(raw[m:], LINKS_KEY, limit=metafile.DATA_MAX)
        if not metafile.checked(body, LINKS_KEY):
            return {}
        got = body.get("links")
        if type(got) is not dict:
            return {}
        out: dict[str, list[dict[str, Any]]] = {}
        for d, links in got.items():
            if type(links) is not list:
                return {}
            rows = []
            for x in links:
                if type(x) is not list or len(x) != 3 or type(x[0]) is not str or type(x[1]) is not str \
                        or type(x[2]) is not bool:
                    return {}
                rows.append({"key": x[0], "fn": x[1], "hit": x[2]})
            out[d] = rows
        return out
    except (CasmonError, OSError, ValueError, TypeError, RecursionError):
        return {}


def save_links(store: Store, links: dict[str, list[dict[str, Any]]]) -> None:
    """Keep the runs' links; a store that cannot be written keeps none: nothing is lost."""
    if store.read_only:
        return
    try:
        body = metafile.seal({"links": {d: [[x["key"], x["fn"], bool(x.get("hit"))] for x in ls]
                                        for d, ls in links.items()}})
        store.backend.set(LINKS_KEY, LINKS_MAGIC + body)
    except (CasmonError, OSError, ValueError, TypeError):
        return
