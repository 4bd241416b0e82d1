"""Reading a table whole: every entry, the count, the contents' key, gaps in the writers' numbering.

:class:`~casmon.store.table.table.Table` hands these to this module, loaded on first use: a lookup (a cached
call's hit) never runs them; gc, verify, merges, ``casmon ui`` and stats do.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
TYPE_CHECKING = False  # typing's flag without importing typing
if TYPE_CHECKING:
    from casmon.store.table.format import Payload
    from casmon.store.table.table import Table

from casmon.errors import DamagedObjectError, StoreError
from casmon.store.codec import decode_frame
from casmon.store.table.format import Generation, TableFile
from casmon.store.table.ranges import gaps_of, ranges_of_names, ranges_union
from casmon.store.table.format import _Vanished

__all__ = ["contents_key", "entry_count", "file_tables", "gap_name", "gaps", "gen_entries", "items", "items_beyond",
           "items_once", "missing_segments", "snapshot", "READ_TRIES"]

#: Listings a read whole takes before it gives up, when each meets a file a merge deleted since (the first
#: three re-list at once; the rest first ask whether a missing file's generation is still listed: damage).
READ_TRIES = 8


def changed_under(t: Table) -> StoreError:
    """What a read whole raises rather than answer with part of the table."""
    return StoreError(f"table {t.prefix} of {t.backend.url} changed under this read {READ_TRIES} times "
                      f"(writers merging it); try again")


def file_tables(t: Table, g: Generation, i: int, tolerant: bool,
                 data: Payload | None = None) -> tuple[list[TableFile], bool]:
    """``(tables, damaged)`` of bucket file ``i`` of ``g``: the whole bucket (format 1) or its
    blocks (format 2, damaged blocks skipped and remembered). Missing: ``([], ...)``."""
    key = t._bucket_key(g.id, i)
    if g.v < 2:
        if (g.id, i) in t._bad_buckets:
            return [], True
        tf = t._buckets.get((g.id, i))
        if tf is None and data is not None:
            try:
                tf = TableFile(key, decode_frame(data, key)[1])
            except DamagedObjectError as e:
                t._bad_bucket(g, i, key, e.reason)
                return [], True
        elif tf is None:
            tf = t._read_bucket(g, i, key, tolerant)
        if tf is None and (g.id, i) not in t._bad_buckets:
            raise _Vanished(key)  # merged away meanwhile: its entries are in a generation a new listing names
        return ([tf], False) if tf is not None else ([], True)
    if g.lookaside is not None:  # every block's length: read the copy's rest at once (a failed check: _Vanished)
        g.lookaside.settle()
    per = g.blocks >> (g.nbuckets.bit_length() - 1)
    blocks = range(i * per, (i + 1) * per)
    if data is None:
        fetched = t._fetch(g, key, tolerant)
        if fetched is False:
            raise _Vanished(key)  # merged away meanwhile, as above
        if fetched is None:
            t._bad_block(g, i * per, key, f"missing, although generation {g.id} needs it")
            return [], True
        data = fetched
    out, damaged = [], False
    for b in blocks:
        ln = int(g.lens[b])
        if not ln:
            continue
        if (g.id, b) in t._bad_blocks:
            damaged = True
            continue
        start = int(g.starts[b])
        where = f"{key}@{start}"
        try:
            out.append(TableFile(where, decode_frame(data[start : start + ln], where)[1]))
        except DamagedObjectError as e:
            t._bad_block(g, b, key, f"block at {start}: {e.reason}")
            damaged = True
    return out, damaged


def items(t: Table, refresh: bool = True, strict: bool = True) -> Iterator[tuple[bytes, bytes]]:
    """Every entry once: generations, then level-0 files, then this writer's waiting ones.

    ``strict`` (the default) raises :class:`DamagedObjectError` if a file the
    table needs is damaged or missing, rather than return part of the table
    (gc must see every record); ``strict=False`` skips such files (and names
    them in ``t.damaged``). A generation merged away meanwhile is never
    skipped: the table lists again and reads what replaced it, and raises
    :class:`StoreError` after :data:`READ_TRIES` listings that each met one.
    """
    t.decide_from_manifests()
    if refresh or not t._listed:
        t.refresh()
    for attempt in range(READ_TRIES):
        try:
            entries = items_once(t, tolerant=attempt >= 3)
            break
        except _Vanished:
            t.refresh()
    else:
        raise changed_under(t)
    if strict and t.damaged:
        key, reason = next(iter(sorted(t.damaged.items())))
        more = f"; {len(t.damaged) - 1} more damaged files" if len(t.damaged) > 1 else ""
        raise DamagedObjectError(key, f"{reason}{more}; this table cannot be read whole until "
                                      f"`casmon verify --repair` has run")
    yield from entries


def snapshot(t: Table) -> tuple[list[Generation], list[TableFile], list[tuple[bytes, bytes]], frozenset[str]]:
    with t._lock:
        pending = [kv for _, entries in t._batches for kv in entries] + list(t._pending)
        return list(t._active_gens), list(t._l0.values()), pending, t._grouped


def gen_entries(t: Table, g: Generation, tolerant: bool) -> list[tuple[bytes, bytes]]:
    out: list[tuple[bytes, bytes]] = []
    for i in range(g.nbuckets):
        for tf in t._file_tables(g, i, tolerant)[0]:
            out.extend(tf.items())
    return out


def items_once(t: Table, tolerant: bool) -> list[tuple[bytes, bytes]]:
    gens, l0, pending, grouped = snapshot(t)
    out: list[tuple[bytes, bytes]] = []
    seen: set[tuple[bytes, bytes]] = set()
    for g in gens:
        entries = t._gen_entries(g, tolerant)
        if g.id in grouped:  # its provenance overlaps another generation's: each entry once
            fresh = []
            for kv in entries:
                if kv not in seen:
                    seen.add(kv)
                    fresh.append(kv)
            entries = fresh
        out.extend(entries)
    for tf in l0:
        out.extend(tf.items())
    out.extend(pending)
    return out


def items_beyond(t: Table, seen: Iterable[str]) -> tuple[list[tuple[bytes, bytes]], list[tuple[bytes, bytes]],
                                                      list[str]] | None:
    """What a reader that already holds the entries of the files ``seen`` (names from an earlier answer) lacks:
    the entries of the other files it reads now, this writer's waiting ones, and the names of every file read
    now. None where a file of ``seen`` is no longer read (merged, rewritten, collected): what it held may be
    gone. Damaged files are skipped, as ``items(strict=False)`` skips them; :class:`StoreError` as :func:`items`."""
    t.decide_from_manifests()
    done = set(seen)
    t.refresh()
    for _attempt in range(READ_TRIES):
        with t._lock:
            gens, l0, pending = list(t._active_gens), dict(t._l0), snapshot(t)[2]
        names = [g.id for g in gens] + sorted(l0)
        if not done <= set(names):
            return None
        try:
            out: list[tuple[bytes, bytes]] = []
            for g in gens:
                if g.id not in done:
                    # as items(): a generation merged away meanwhile lists again, never reads as empty under
                    # a name the answer then claims
                    out.extend(t._gen_entries(g, tolerant=_attempt >= 3))
            for name in sorted(l0):
                if name not in done:
                    out.extend(l0[name].items())
            return out, pending, names
        except _Vanished:
            t.refresh()
    raise changed_under(t)


def entry_count(t: Table, refresh_left: int = READ_TRIES - 1) -> int:
    """How many entries :meth:`items` yields (damaged files aside), without reading them where it can;
    :class:`StoreError` as :func:`items`."""
    t.decide_from_manifests()
    if not t._listed:
        t.refresh()
    with t._lock:
        gens, l0, groups, grouped = list(t._active_gens), list(t._l0.values()), t._groups, t._grouped
        n = sum(g.count for g in gens if g.id not in grouped) + sum(len(t) for t in l0) + t.pending
    by_id = {g.id: g for g in gens}
    for group in groups:
        m = t._distinct.get(group)
        if m is None:
            seen: set[tuple[bytes, bytes]] = set()
            try:
                for gid in sorted(group):
                    seen.update(t._gen_entries(by_id[gid], tolerant=True))
            except _Vanished:  # merged away meanwhile, or a lookaside copy failed with its manifest gone: list again
                t.refresh()
                if not refresh_left:
                    raise changed_under(t) from None
                return entry_count(t, refresh_left - 1)
            m = t._distinct[group] = len(seen)
        n += m
    return n


def missing_segments(t: Table) -> list[str]:
    """Level-0 files that must have existed but are gone: gaps in a writer's numbering.

    A writer numbers its level-0 files 1, 2, 3, ...; a generation records
    exactly which numbers it holds. A number below the writer's newest one
    that is neither listed nor held by a generation was deleted (or is in a
    generation whose manifest is damaged). The newest file of a writer
    leaves no trace when deleted.
    """
    t.decide_from_manifests()
    first = gaps(t)
    if not first:
        return []
    second = gaps(t)  # a merge between the two listings of one refresh can look like a gap
    return [g for g in first if g in second]


def gaps(t: Table) -> list[str]:
    t.refresh()
    with t._lock:
        accounted = ranges_union(ranges_of_names(t._listed_l0), *(g.accounted() for g in t._gens.values()))
    return [gap_name(t, w, lo, hi) for w, lo, hi in gaps_of(accounted)]


def gap_name(t: Table, w: str, lo: int, hi: int) -> str:
    if lo == hi:
        return f"{t.prefix}l0/*-{w}-{lo:06x}"
    return f"{t.prefix}l0/*-{w}-{lo:06x} to *-{w}-{hi:06x} ({hi - lo + 1} files)"


def contents_key(t: Table) -> tuple[tuple[str, ...], tuple[str, ...], int]:
    """What the table holds as of its last listing, as the names of the files a reader reads and the count of
    this writer's entries not yet written: equal keys, equal entries (files are written once). Readers that
    decode every entry (``casmon ui``) keep what they decoded until it changes."""
    with t._lock:
        pending = sum(len(e) for _, e in t._batches) + len(t._pending)
        return tuple(g.id for g in t._active_gens), tuple(sorted(t._l0)), pending
