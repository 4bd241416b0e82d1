"""Metric compaction: an ended run's many small metric batches become one record.

A run flushes its points as they come, so a day-long run writes tens of thousands of small ``metrics``
records, and reading a metric back would parse every one. When a run ends (and from ``casmon gc`` for runs
that ended without it: killed, lost), :func:`compact_run` writes one *compacted* record holding every
point, in order, with ``covers``: the seqs of the batches it holds. Then, under the store lock, the tables
are rewritten without the batches it covers.

Crash safety rests on the reading rule of :func:`~casmon.runs.metrics.live_batches`: a batch whose seq a
compacted record covers is skipped, so between the two steps (or after a kill at either) every point is
read exactly once; the compacted record is written before anything is retired, so none is lost. A second
compaction folds the first one's record in and covers a superset; the smaller one is then retired too.

A run that has not ended (``lost``: it may wake) is compacted only up to its first missing seq: its batches
can land out of order (a live flush and the script's, a stalled writer), and a batch landing in a gap a
compaction spanned would be read before the points it follows. Batches past the gap stay, read after.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from casmon import faultpoints
from casmon.errors import CasmonError
from casmon.keys.digest import Digest
from casmon.runs.manifest import RUN_REFS
from casmon.runs.metrics import KIND_METRICS, covers_of, live_batches, metrics_key, points_cell, read_series
from casmon.store.records import parse_record

if TYPE_CHECKING:
    from casmon.store.store import Store

__all__ = ["COMPACT_OVER", "compact_run", "compact_runs"]

#: A run whose metrics are in more records than this is compacted.
COMPACT_OVER = 8


def compact_run(store: Store, ref: str, over: int = COMPACT_OVER, share: int | None = None,
                ended: bool = True) -> bool:
    """Compact the metric records of run ``ref`` if there are more than ``over`` (or a compaction cut short
    left records to retire); True if anything changed. :class:`~casmon.errors.StoreError` if the store lock
    is held by another process (gc or a deletion): nothing is lost, a later gc compacts it.

    Retiring rewrites the whole metrics table; with ``share`` (a run's end) it is done only when the
    batches retired are at least 1/``share`` of the table's records, so the end of a short run in a store
    of many runs costs no rewrite of all of them: its few covered batches wait for gc (readers skip them).
    ``ended=False`` (a lost run): only the batches up to its first missing seq are folded (module docstring)."""
    from casmon.store.lock import held

    key = bytes(metrics_key(ref))
    where = f"run {ref}"
    store.flush()
    records = store.lookup(KIND_METRICS, key)
    use, _taken = live_batches(records, ref, where)
    mine = sum(1 for r in records if r.get("run") == ref)
    if len(use) <= over and mine == len(use):
        return False
    fold = use if ended else _up_to_a_gap(use, where)
    if len(use) > over and len(fold) > 1:
        covers = _merge_covers(fold, where)
        series = read_series(store, ref, where, records=[r for _i, r in fold])  # exactly the batches covered
        cells: dict[str, Any] = {}
        refs: list[Digest] = []
        for name, s in series.items():
            data = (s.steps.astype("<i8", copy=False).tobytes() + s.values.astype("<f8", copy=False).tobytes()
                    + s.times.astype("<f8", copy=False).tobytes())
            cells[name] = points_cell(store, data, len(s), refs)
        top = max(hi for _lo, hi in covers)
        store.append(KIND_METRICS, {"run": ref, "seq": top, "s": cells, "covers": covers}, key=key, refs=refs)
        faultpoints.point("compact.appended")
        store.flush()
        faultpoints.point("compact.written")
    with held(store.backend, "metric compaction", store.url):  # no gc marks, no merge brings the batches back
        table = store.table(KIND_METRICS)
        table.refresh()
        stale = _skipped(table.lookup(key), ref, where)
        if stale and (share is None or len(stale) * share >= table.count()):
            table.consolidate(force=True, keep=lambda k, v: bytes(k) != key or bytes(v) not in stale)
        faultpoints.point("compact.retired")
    return True


def _merge_covers(use: list[tuple[int, dict[str, Any]]], where: str) -> list[list[int]]:
    ranges: list[list[int]] = []
    for i, r in use:
        c = covers_of(r, where, i)
        ranges.extend([[lo, hi] for lo, hi in c] if c is not None else [[r["seq"], r["seq"]]])
    out: list[list[int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return out


def _up_to_a_gap(use: list[tuple[int, dict[str, Any]]], where: str) -> list[tuple[int, dict[str, Any]]]:
    """The records of ``use`` whose seqs lie in the unbroken range that starts at the lowest seq."""
    merged = _merge_covers(use, where)
    if not merged:
        return []
    lo, hi = merged[0]

    def inside(i: int, r: dict[str, Any]) -> bool:
        c = covers_of(r, where, i)
        return all(lo <= a and b <= hi for a, b in (c if c is not None else [(r["seq"], r["seq"])]))

    return [(i, r) for i, r in use if inside(i, r)]


def _skipped(raws: list[bytes], ref: str, where: str) -> set[bytes]:
    """The stored bytes of the records of ``ref`` a reader skips (batches a compaction covers, compactions a
    larger one holds), never those of one it reads."""
    recs = [parse_record(KIND_METRICS, b"", bytes(raw)) for raw in raws]
    used = {i for i, _r in live_batches(recs, ref, where)[0]}
    read = {bytes(raws[i]) for i in used}
    return {bytes(raw) for i, raw in enumerate(raws) if i not in used and recs[i].get("run") == ref} - read


def compact_runs(store: Store, over: int = COMPACT_OVER) -> list[str]:
    """Compact every run that is no longer written (ended, or lost) and has more than ``over`` metric
    records: those killed or lost before their end compacted them. The refs compacted."""
    from casmon.runs.listing import list_runs

    counts: dict[bytes, int] = {}
    if KIND_METRICS not in store.record_kinds():
        return []
    for k, _v in store.table(KIND_METRICS).items():
        counts[bytes(k)] = counts.get(bytes(k), 0) + 1
    busy = {k for k, n in counts.items() if n > over}
    if not busy:
        return []
    done = []
    for r in list_runs(store):
        if r.ref.startswith(RUN_REFS + "/") and bytes(metrics_key(r.ref)) in busy and r.status not in ("running",
                                                                                                          "claimed"):
            try:
                if compact_run(store, r.ref, over, ended=r.status != "lost"):
                    done.append(r.ref)
            except CasmonError:
                continue  # a damaged run's records, or the lock held: the next gc tries again
    return done

