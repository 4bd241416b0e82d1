"""A survey: every file of one table read and checked, for ``verify`` and ``repair``, and the rewrite that repairs it.

:meth:`Table.survey <casmon.store.table.table.Table.survey>` fills it; what is
damaged, missing or lost is listed by key, and :meth:`Survey.entries` is what
``repair`` salvages (everything readable, when the table is damaged).
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, TypeVar

from casmon.errors import DamagedObjectError
from casmon.plain import Plain
from casmon.store.codec import FRAME_HEADER, MAGIC, decode_frame, read_header
from casmon.store.table.format import (BUCKET_RE, LOOKASIDE, NAME_RE, Generation, TableFile, byte_view,
                                       encode_table_file, gen_time, parse_generation)
from casmon.store.table.plan import View, resolve
from casmon.store.table.ranges import gaps_of, ranges_of_names, ranges_union
from casmon.store.table.table import ORPHAN_AGE

if TYPE_CHECKING:
    from casmon.store.table.format import Payload
    from casmon.store.table.table import Table

__all__ = ["Survey", "rewrite_table", "split_bucket", "survey_table"]

T = TypeVar("T")


def split_bucket(data: Payload, key: str) -> tuple[list[TableFile], str | None]:
    """The tables in a bucket file (one frame in format 1, its blocks' frames in format 2), found
    without the manifest; ``(readable ones, what was wrong or None)``. Past a damaged header the
    next frame is found again by its magic, so one damaged block costs only its own entries."""
    out: list[TableFile] = []
    problem = None
    mv = byte_view(data)
    n, off = len(mv), 0
    while off < n:
        where = f"{key}@{off}" if off else key
        try:
            h = read_header(mv, where, off)
            ln = FRAME_HEADER + h.stored_len
            if off + ln > n:
                raise DamagedObjectError(where, f"frame runs past the end of the file ({off + ln} > {n})")
            out.append(TableFile(where, decode_frame(mv[off : off + ln], where)[1]))
            off += ln
        except DamagedObjectError as e:
            problem = problem or e.reason
            nxt = bytes(mv[off + 1 :]).find(MAGIC)
            if nxt < 0:
                break
            off += 1 + nxt
    return out, problem


class Survey(Plain):
    """Every file of one table, each read and checked (:meth:`Table.survey`)."""

    FIELDS = ("prefix", "l0_names", "gen_ids", "bucket_keys", "l0", "gens", "bad_gens", "buckets", "damaged", "missing",
              "gaps", "view", "checked", "vanished")
    prefix: str
    l0_names: list[str]  # every level-0 file listed
    gen_ids: list[str]  # every manifest listed
    bucket_keys: dict[str, dict[int, str]]  # generation id -> bucket number -> key, as listed (or {}: a copy alone)
    l0: dict[str, TableFile]  # readable level-0 files (if kept)
    gens: dict[str, Generation]  # readable manifests
    bad_gens: set[str]  # damaged manifests
    buckets: dict[tuple[str, int], TableFile]  # readable buckets (if kept)
    damaged: dict[str, str]  # key -> reason, every file that fails its checks
    missing: dict[str, str]  # key -> what needs it (buckets of active generations)
    gaps: list[str]  # level-0 numbers deleted (or in a damaged manifest)
    view: View | None
    checked: int
    vanished: bool

    def __init__(self, prefix: str, l0_names: list[str], gen_ids: list[str], bucket_keys: dict[str, dict[int, str]]) -> None:
        self.prefix, self.l0_names, self.gen_ids, self.bucket_keys = prefix, l0_names, gen_ids, bucket_keys
        self.l0, self.gens, self.bad_gens, self.buckets = {}, {}, set(), {}
        self.damaged, self.missing, self.gaps = {}, {}, []
        self.view, self.checked, self.vanished = None, 0, False

    @property
    def ok(self) -> bool:
        return not self.damaged and not self.missing and not self.gaps

    def entries(self) -> list[tuple[bytes, bytes]]:
        """The table's entries, each once. A sound table: what readers read. A damaged one: everything
        readable in any file (covered, redundant and leftover generations too), the salvage."""
        if self.ok:
            return self.visible_entries()
        out: list[tuple[bytes, bytes]] = []
        for (_gid, _i), tf in sorted(self.buckets.items()):
            out.extend(tf.items())
        for _n, tf in sorted(self.l0.items()):
            out.extend(tf.items())
        return list(dict.fromkeys(out))

    def visible_entries(self) -> list[tuple[bytes, bytes]]:
        """What a reader reads: the active generations and level-0 files (kept files only)."""
        out: list[tuple[bytes, bytes]] = []
        if self.view is None:
            return out
        for g in self.view.active:
            for i in range(g.nbuckets):
                tf = self.buckets.get((g.id, i))
                if tf is not None:
                    out.extend(tf.items())
        for n in self.view.active_l0:
            tf = self.l0.get(n)
            if tf is not None:
                out.extend(tf.items())
        return list(dict.fromkeys(out))


def survey_table(t: Table, keep: bool, orphans: bool = True) -> Survey:
    """:meth:`Table.survey` of ``t``: read three times at most while files vanish under it (merges)."""
    for attempt in range(3):
        sv = _survey_once(t, keep, orphans)
        if not sv.vanished or attempt == 2:
            return sv
    raise AssertionError("unreachable")


def _survey_once(t: Table, keep: bool, orphans: bool = True) -> Survey:
    l0_names = t._list("l0/")
    gen_ids = t._list("gens/")
    bucket_keys: dict[str, dict[int, str]] = {}
    for k in t.backend.list(t.prefix + "buckets/"):
        parts = k[len(t.prefix) :].split("/")
        if len(parts) == 3 and NAME_RE.match(parts[1]) and re.match(BUCKET_RE, parts[2]):
            bucket_keys.setdefault(parts[1], {})[int(parts[2], 16)] = k
        elif len(parts) == 3 and NAME_RE.match(parts[1]) and parts[2] == LOOKASIDE:
            bucket_keys.setdefault(parts[1], {})  # a copy alone (its writer killed as a merge took its generation)
    from casmon.store.table.survey import Survey, split_bucket  # verify and repair: never on a reader's or writer's path

    sv = Survey(t.prefix, l0_names, gen_ids, bucket_keys)
    for key, payload in _read_all(t, [t.prefix + "l0/" + n for n in l0_names], sv):
        tf = _check(key, payload, sv, lambda k, raw: TableFile(k, raw))
        if tf is not None and keep:
            sv.l0[key.rsplit("/", 1)[-1]] = tf
    for key, payload in _read_all(t, [t.prefix + "gens/" + g for g in gen_ids], sv):
        gid = key.rsplit("/", 1)[-1]
        g = _check(key, payload, sv, functools.partial(parse_generation, gid))
        if g is not None:
            sv.gens[gid] = g
        else:
            sv.bad_gens.add(gid)
    flat = [(gid, i, k) for gid, bs in sorted(bucket_keys.items()) for i, k in sorted(bs.items())]
    keys = [k for _, _, k in flat]
    where = {k: (gid, i) for gid, i, k in flat}
    for key, payload in _read_all(t, keys, sv):
        tfs, problem = split_bucket(payload, key)
        if problem is not None:
            sv.damaged[key] = problem
        if keep and (tfs or problem is None):
            sv.buckets[where[key]] = tfs[0] if len(tfs) == 1 else TableFile(
                key, encode_table_file([kv for tf in tfs for kv in tf.items()]))
    sv.view = resolve(sv.gens, l0_names)
    for g in sv.view.active:
        have = bucket_keys.get(g.id, {})
        for i in range(g.nbuckets):
            if i not in have:
                sv.missing[t._bucket_key(g.id, i)] = f"generation {t.prefix}gens/{g.id}"
    if sv.missing and any(not t.backend.exists(t.prefix + "gens/" + g.id) for g in sv.view.active):
        sv.vanished = True  # merged meanwhile: look again
    accounted = ranges_union(ranges_of_names(l0_names), *(g.accounted() for g in sv.gens.values()))
    sv.gaps = [t._gap_name(w, lo, hi) for w, lo, hi in gaps_of(accounted)]
    lone = sorted(g for g in set(bucket_keys) - set(gen_ids) if bucket_keys[g])  # a copy alone holds no entries
    if orphans and lone:
        if not keep:
            return _survey_once(t, True, orphans)  # the check needs the entries (rare: orphans are)
        visible = set(sv.visible_entries())
        for gid in lone:
            unseen = {kv for (g, _i), tf in sv.buckets.items() if g == gid for kv in tf.items()} - visible
            if unseen:
                sv.missing[f"{t.prefix}gens/{gid}"] = (
                    f"its buckets hold {len(unseen)} entries no listed file shows (the manifest is lost)")
    return sv

def _read_all(t: Table, keys: list[str], sv: Survey, batch: int = 256) -> Iterator[tuple[str, Payload]]:
    for i in range(0, len(keys), batch):
        part = keys[i : i + batch]
        for key, data in zip(part, t.backend.get_many(part)):
            if data is None:
                sv.vanished = True  # deleted since it was listed (a merge): the survey is read again
                continue
            sv.checked += 1
            yield key, data

def _check(key: str, data: Payload, sv: Survey, parse: Callable[[str, bytes | memoryview], T]) -> T | None:
    try:
        return parse(key, decode_frame(data, key)[1])
    except DamagedObjectError as e:
        sv.damaged[key] = e.reason
        return None

def rewrite_table(t: Table, sv: Survey, entries: Iterable[tuple[bytes, bytes]]) -> str:
    """:meth:`Table.rewrite` of ``t``: replace every file ``sv`` saw by one generation that holds exactly ``entries`` (repair).

    Its provenance is every level-0 number the survey saw or a generation
    held, from 1 up for each writer, lost numbers included: what they held
    is in ``entries`` or is lost, so the table has no gap afterwards. Files
    written after the survey stay. Leftover buckets (and lookaside copies) of no
    generation are deleted once older than :data:`ORPHAN_AGE` (they may belong to a merge in
    progress), damaged ones at once.
    """
    seen = ranges_union(ranges_of_names(sv.l0_names), *(g.accounted() for g in sv.gens.values()))
    contains = {w: [(1, spans[-1][1])] for w, spans in seen.items() if spans}
    covers = ["l0:" + n for n in sv.l0_names] + ["gen:" + g for g in sv.gen_ids]
    gid = t._write_generation(list(dict.fromkeys(entries)), covers, contains, True, {})
    listed = set(sv.gen_ids)
    now = time.time()
    orphans = [g for g in sv.bucket_keys if g not in listed and now - gen_time(g) > ORPHAN_AGE]
    t._delete(sv.l0_names, [], more_gen_ids=sv.gen_ids + orphans,
                 more_keys=[k for k in sv.damaged if "/buckets/" in k])
    with t._lock:
        t._buckets.clear()
        t._bad_buckets.clear()
        t._bad_gens.clear()
        t._bad_l0.clear()
        t.damaged.clear()
    t.refresh()
    return gid
