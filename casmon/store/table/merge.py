"""Merges: a table's level-0 files and small generations into one generation (:meth:`Table.consolidate`),
and the generation writes and deletes that merges and repair make.

Size-tiered: a merge takes the smallest generations while each holds at most
:data:`~casmon.store.table.table.MERGE_FACTOR` times what is taken so far, so
a table holds O(log n) generations and an entry is rewritten O(log n) times.
Generations whose provenance overlaps are merged together; files a generation
already holds are deleted after the new generation's manifest is visible;
damaged files are left for ``verify --repair``. Writers and gc merge, holding
the store lock; readers never load this module.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from casmon.store.codec import KIND_TABLE, encode_frame
from casmon.store.table import table
from casmon.store.table.encode import Columns, encode_v2
from casmon.store.table.format import (BUCKET_ENTRIES, FILE_ENTRIES, MAX_BUCKETS, _RAW, _ZSTD, Generation, TableFile,
                                       _bucket_of, encode_table_file)
from casmon.store.table.ranges import Ranges, ranges_json, ranges_of_names, ranges_union
from casmon.store.table.format import _Vanished
from casmon.store.table.table import MERGE_FACTOR

if TYPE_CHECKING:
    from casmon.store.table.table import Table

__all__ = ["consolidate", "delete_files", "write_generation"]


def consolidate(t: Table, min_l0: int, force: bool, keep: Callable[[bytes, bytes], bool] | None) -> str | None:
    """:meth:`Table.consolidate` of ``t``: the new generation's id, or None."""
    if not t.backend.supports_deletes or t.backend.read_only:
        return None
    t.refresh()
    with t._lock:
        l0_files = dict(t._l0)
        active = list(t._active_gens)
        groups = list(t._groups)
        all_gens = dict(t._gens)
        bad = {gid for gid, _ in t._bad_buckets} | {gid for gid, _ in t._bad_blocks}
        damaged = bool(t.damaged)
        # Files a generation already holds can go, unless the table is damaged: they may be the only good copy.
        extra_gens = [] if damaged else [all_gens[g] for g in t._redundant if g in all_gens]
        extra_l0 = [] if damaged else list(t._contained_l0)
    l0 = sorted(l0_files)
    if not force and len(l0) < min_l0 and not t.wants_merge():
        return None
    if t.read_copies:  # what to merge and delete is decided from the manifests, never their copies
        t.decide_from_manifests()
        return consolidate(t, min_l0, force, keep)
    l0_total = sum(len(l0_files[n]) for n in l0)
    if force:
        chosen = {g.id for g in active if g.id not in bad}
    else:
        # Size-tiered: take generations smallest first while each holds at most MERGE_FACTOR times
        # what is taken so far. Sizes then grow geometrically: O(log n) generations, and an entry
        # is rewritten O(log n) times over the table's life.
        chosen, total = set(), max(l0_total, 1)
        for g in sorted((g for g in active if g.id not in bad), key=lambda g: (g.count, g.id)):
            if g.count > MERGE_FACTOR * total:
                break
            chosen.add(g.id)
            total += g.count
        # Format-1 generations (an older casmon's) are rewritten as format 2 a bounded amount at a time.
        budget = 4 * total + FILE_ENTRIES
        for g in sorted((g for g in active if g.v < 2 and g.id not in bad | chosen), key=lambda g: g.count):
            if g.count > budget:
                break
            chosen.add(g.id)
            budget -= g.count
    for group in groups:  # an overlap is merged whole, which ends it
        if chosen & group:
            chosen |= group - bad
    gens = [g for g in active if g.id in chosen]
    if not l0 and len(gens) <= 1 and keep is None:
        if extra_gens or extra_l0 or t.late:
            t._delete(extra_l0 + sorted(t.late), extra_gens)
            t.refresh()
        return None
    tables: list[TableFile] = []
    try:
        for g in gens:
            for i in range(g.nbuckets):
                data = None
                if g.v >= 2 or (g.id, i) not in t._buckets:
                    key = t._bucket_key(g.id, i)
                    data = t.backend.get(key)
                    if data is None:
                        raise _Vanished(key)
                tfs, damaged = t._file_tables(g, i, False, data)
                if damaged:
                    return None  # the next merge leaves this generation alone
                tables.extend(tfs)
        tables.extend(l0_files[n] for n in l0)
    except _Vanished:
        return None  # someone else merged these meanwhile
    entries = Columns.of_tables(tables).sorted_unique()  # each (key, value) once
    del tables
    if keep is not None:
        import numpy as np  # merges use numpy (Columns); lookups do not

        kept = [i for i, (k, v) in enumerate(entries.entries()) if keep(k, v)]
        entries = entries.take(np.array(kept, dtype=np.int64))
    contains = ranges_union(*(g.contains for g in gens), ranges_of_names(l0))
    covers = ["l0:" + x for x in l0 + extra_l0] + ["gen:" + g.id for g in gens + extra_gens]
    for g in gens:  # what merged generations covered and is not deleted yet stays covered
        covers.extend(c for c in g.covers if c in t._visible)
    marks: dict[str, int] = {}
    for g in gens:
        for w, v in g.marks.items():
            marks[w] = max(marks.get(w, 0), v)
    gid = t._write_generation(entries, list(dict.fromkeys(covers)), contains, all(g.exact for g in gens), marks)
    # The new generation is visible: what it holds can go, and late files, which are not records.
    t._delete(l0 + extra_l0 + sorted(t.late), gens + extra_gens)
    t.refresh()
    return gid


def write_generation(t: Table, entries: list[tuple[bytes, bytes]] | Columns, covers: list[str], contains: Ranges,
                     exact: bool, marks: dict[str, int]) -> str:
    """:meth:`Table._write_generation` of ``t``: buckets, then the manifest (fault points between); the generation's id."""
    from casmon import faultpoints  # a write's: a hit loads none

    n = len(entries)
    v2 = table.GEN_FORMAT >= 2 and (t.format_gate is None or t.format_gate())
    nb = 1
    while nb < MAX_BUCKETS and n / nb > (FILE_ENTRIES if v2 else BUCKET_ENTRIES):
        nb *= 2
    with t._lock:
        t._gen_seq += 1
        gid = f"{time.time_ns():016x}-{t.writer}g-{t._gen_seq:06x}"  # "g": not in the level-0 numbering
    items = []
    binary = b""
    extra: dict[str, int] = {}
    if v2:
        files, binary, extra = encode_v2(entries, nb)
        items = [(t._bucket_key(gid, i), f) for i, f in enumerate(files)]
    else:
        by_bucket: list[list[tuple[bytes, bytes]]] = [[] for _ in range(nb)]
        for kv in entries.entries() if isinstance(entries, Columns) else entries:
            by_bucket[_bucket_of(kv[0], nb)].append(kv)
        for i, b in enumerate(by_bucket):
            _, frame = encode_frame(encode_table_file(b), KIND_TABLE, _ZSTD)
            items.append((t._bucket_key(gid, i), frame))
    t.backend.create_many(items)
    faultpoints.point("merge.after_buckets")
    marks = dict(marks)
    for w, spans in contains.items():
        if spans:
            marks[w] = max(marks.get(w, 0), spans[-1][1])
    m = {"count": n, "nbuckets": nb, "covers": covers, "marks": marks, "contains": ranges_json(contains), **extra}
    if not exact:
        m["exact"] = False
    import json  # a write's: a hit loads no json
    payload = json.dumps(m).encode() + (b"\0" + binary if v2 else b"")
    digest, frame = encode_frame(payload, KIND_TABLE, _ZSTD)
    if len(frame) > 0.9 * len(payload):  # mostly a bloom filter (random bits): every fresh reader would decompress it for nothing
        _, frame = encode_frame(payload, KIND_TABLE, _RAW)
    t.backend.create(t.prefix + "gens/" + gid, frame)
    faultpoints.point("merge.after_manifest")
    if v2 and t.lookasides and len(payload) >= table.LOOKASIDE_MIN:
        from casmon.store.table import lookaside  # derived: a fresh reader's lookup reads a few chunks of it

        lookaside.write(t, gid, digest, payload)
    return gid


def delete_files(t: Table, l0_names: list[str], gens: list[Generation], more_gen_ids: Iterable[str] = (),
                 more_keys: Iterable[str] = ()) -> None:
    """:meth:`Table._delete` of ``t``: level-0 files and generations, manifests first, then their buckets."""
    gen_ids = [g.id for g in gens] + list(more_gen_ids)
    t.backend.delete_many([t.prefix + "l0/" + x for x in l0_names] + [t.prefix + "gens/" + g for g in gen_ids])
    buckets = list(more_keys)
    for g in gen_ids:
        buckets.extend(t.backend.list(f"{t.prefix}buckets/{g}/"))
    t.backend.delete_many(list(dict.fromkeys(buckets)))
