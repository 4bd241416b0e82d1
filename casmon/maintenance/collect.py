"""Garbage collection: remove what no record or ref reaches, safely beside writers that take no locks.

One gc runs at a time (the lock ``gc/lock``); writers never wait for it. A run:

1. *marks* what records and refs reach (through manifests to chunks and children);
2. *sweeps* every condemned list (:mod:`casmon.store.condemned`) written at least
   ``grace`` seconds before the mark began: of what such a list names, it
   deletes what is still unreachable, and only at the locations the list names
   (a loose file, entries of given packs), then deletes the list;
3. *condemns* what is unreachable now and on no list yet, in a new list.

So nothing is deleted less than ``grace`` seconds after it was published as
condemned, and writers, which check the published lists before they rely on an
object and make their records visible soon after, never see an object they rely
on deleted. docs/RELIABILITY.md gives the argument and its assumptions.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from casmon import faultpoints
from casmon.errors import DamagedObjectError, StoreError, checked_number
from casmon.keys.digest import Digest
from casmon.maintenance import reach
from casmon.maintenance.gclock import gc_lock
from casmon.maintenance.phases import Progress, quiet
from casmon.store import condemned, lock, reserve
from casmon.store.codec import KIND_VALUE, decode_frame
from casmon.store.objects import PACK_MAX, Location, loose_key, pack_key
from casmon.store.table import fence

if TYPE_CHECKING:
    from casmon.store.store import Store

__all__ = ["gc", "GcReport", "read_lists", "remove_partials", "mark"]

#: The ref where casmon 0.1 kept gc state (a pickle): removed unread.
_LEGACY_STATE_REF = "refs/gc/state"
SMALL_PACK = 256 << 10  # a pack whose entries add up to less is merged with the others like it...
SMALL_PACKS_MERGED = 16  # ...once there are at least this many
#: Unreachable values whose pack landed this recently are counted apart (``GcReport.recent_values``).
RECENT = 86400.0


@dataclass
class GcReport:
    """What ``gc`` did, or with ``dry_run`` would do."""

    live_values: int = 0
    unreachable: int = 0
    deleted_objects: int = 0
    deleted_bytes: int = 0
    repacked_packs: int = 0
    deleted_packs: int = 0
    waiting: int = 0  # unreachable, but not condemned long enough ago yet
    condemned: int = 0  # newly condemned by this run
    lists_swept: int = 0
    partial_files: int = 0
    recent_values: int = 0  # unreachable values put within RECENT seconds: most likely a `store.put` nothing names
    dry_run: bool = False

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def read_lists(store: Store) -> tuple[list[condemned.CondemnedList], list[str]]:
    """The published condemned lists, oldest first, and the keys of damaged ones."""
    keys = [k for k in store.backend.list(condemned.PREFIX) if ".partial" not in k]
    lists, damaged = [], []
    for k, data in zip(keys, store.backend.get_many(keys)):
        if data is None:
            continue
        try:
            lists.append(condemned.decode(k.rsplit("/", 1)[-1], data))
        except DamagedObjectError:
            damaged.append(k)
    lists.sort(key=lambda lst: lst.time)
    return lists, damaged


def mark(store: Store, without: reach.Without | None = None, progress: Progress = quiet) -> set[Digest]:
    """Every object reachable from records and refs (:mod:`casmon.maintenance.reach`). Raises if
    any of them cannot be read: a gc that cannot see everything that is reachable must not delete anything.

    ``without``: records (kind -> keys, or ``(key, time)`` for one record of a key)
    to treat as gone -- what an eviction or the dropping of duplicate cache entries
    previewed with ``--dry-run`` would drop, so the preview matches the real run.
    """
    roots = reach.strict_roots(store, without, progress)
    return reach.closure(roots, reach.open_through_store(store), progress, "mark values").everything


def gc(store: Store, grace: float = 3600.0, dry_run: bool = False, progress: Progress | None = None,
       break_lock: bool = False, without: reach.Without | None = None) -> GcReport:
    """Remove objects no record or ref reaches; repack packs that are mostly dead.

    An unreachable object is first *condemned* (published in a list writers
    read) and deleted by a later run at least ``grace`` seconds after that, if it
    is still unreachable. ``grace`` must be at least ``condemned.MIN_GRACE``
    (60 s); ``grace=0`` deletes what is unreachable at once and is only safe
    while nothing else writes to the store (``casmon gc --now``).

    ``dry_run``: report exactly what a real run would remove, condemn and
    repack, and change nothing; ``without`` (records to treat as gone, kind ->
    keys) lets it preview a gc that follows an eviction.
    """
    if without and not dry_run:
        raise ValueError("gc(without=...) previews a gc after an eviction; it needs dry_run=True")
    grace = checked_number(grace, "gc grace")  # NaN would never be due, and a negative one at once
    if 0 < grace < condemned.MIN_GRACE:
        raise ValueError(f"gc grace must be at least {condemned.MIN_GRACE:g} seconds (or 0, only when nothing "
                         f"else writes to the store), got {grace:g}")
    progress = progress or quiet
    rep = GcReport(dry_run=dry_run)
    if dry_run:
        return _collect(store, grace, rep, progress, dry_run=True, without=without)
    if not store.backend.supports_deletes or store.read_only:
        raise StoreError(f"cannot gc {store.url}: it cannot delete (a zip file, or opened read-only); "
                         f"`casmon gc --dry-run` shows what gc would remove")
    store.flush()
    try:
        reserve.release_if_full(store.backend)  # the lock needs a little room: a full disk gives up the ballast
        with gc_lock(store, "gc", break_lock=break_lock) as held:
            faultpoints.point("gc.locked")
            rep = _collect(store, grace, rep, progress, dry_run=False, held=held)
            lock.forget_old_breaks(store.backend)
    except OSError as e:  # a full disk, no permission: name the store, not a traceback
        raise StoreError(f"cannot gc {store.url}: {e.strerror or e}") from e
    reserve.restore(store.backend)
    return rep


def _collect(store: Store, grace: float, rep: GcReport, progress: Progress, dry_run: bool,
             without: reach.Without | None = None, held: lock.StoreLock | None = None) -> GcReport:
    damaged = fence.read(store.backend).damaged
    if damaged:
        # It fences nothing now, so a late record file (naming what a sweep deletes) would count as a record.
        raise StoreError(f"cannot gc {store.url}: gc's fence {damaged}; gc deletes nothing until "
                         f"`casmon verify --repair` replaces it")
    lists, damaged_lists = read_lists(store)
    mark_start = time.time()
    live = mark(store, without, progress)
    faultpoints.point("gc.after_mark")
    entries: dict[Digest, list[Location]] = defaultdict(list)  # every index entry, not just the newest
    for k, v in store.objects.index.items():
        entries[Digest(k)].append(Location.decode(v))
    loose: set[Digest] = set()
    packs_present: set[str] = set()
    for key in store.backend.list("objects/") + store.backend.list("packs/"):
        parts = key.split("/")
        if parts[0] == "objects" and len(parts) == 3 and len(parts[2]) == 32:
            loose.add(Digest(parts[2]))
        elif parts[0] == "packs" and len(parts) == 2 and len(parts[1]) == 32:
            packs_present.add(parts[1])
    present = loose | set(entries)
    unreachable = present - live
    rep.unreachable = len(unreachable)
    rep.live_values = sum(1 for d in live if any(loc.kind == KIND_VALUE for loc in entries.get(d, ())))
    rep.recent_values = _recent_values(store, unreachable, entries)

    # What is due: named by a list published at least `grace` before this mark began.
    if grace <= 0:
        due = list(lists)
        doomed_loose = {d for d in unreachable if d in loose}
        doomed_packed = {(d, loc.pack) for d in unreachable for loc in entries.get(d, ())}
    else:
        due = _due(store, lists, grace, mark_start, held)
        doomed_loose, doomed_packed = set(), set()
        for lst in due:
            doomed_loose.update(d for d in lst.loose if d in unreachable and d in loose)
            for d, ps in lst.packed.items():
                if d in unreachable:
                    doomed_packed.update((d, p) for p in ps)
    doomed = doomed_loose | {d for d, _ in doomed_packed}
    listed = {d for lst in lists if lst not in due for d in lst.digests}
    # The plan, computed the same way for a dry run and a real one (so the preview is exact):
    # the doomed entries leave the index; packs at least half dead are rewritten without them.
    doomed_keys = [loose_key(d) for d in doomed_loose]
    loose_bytes = sum(store.backend.getsize_many(doomed_keys)) if doomed_keys else 0
    by_pack: dict[str, list[tuple[Digest, Location]]] = defaultdict(list)
    for d, locs in entries.items():
        for loc in locs:
            by_pack[loc.pack].append((d, loc))
    rewrite: dict[str, list[tuple[Digest, Location]]] = {}  # pack -> the entries it keeps (empty: deleted whole)
    packed_bytes = 0
    for name, es in by_pack.items():
        dead = [e for e in es if (e[0], name) in doomed_packed]
        if not dead:
            continue
        dead_bytes = sum(loc.length for _, loc in dead)
        if len(dead) == len(es) or dead_bytes * 2 >= sum(loc.length for _, loc in es):
            rewrite[name] = [e for e in es if (e[0], name) not in doomed_packed]
        packed_bytes += dead_bytes
    # Small packs are merged, as restic's prune repacks small packs: a process that flushes after every
    # call (a pool's worker) leaves a pack per call. Their objects move to new packs through the same
    # path as a half-dead pack's survivors (written and indexed before the old pack goes).
    small = [name for name, es in by_pack.items() if name not in rewrite and name in packs_present
             and sum(loc.length for _, loc in es) < SMALL_PACK]
    merging = set(small) if len(small) >= SMALL_PACKS_MERGED else set()
    for name in merging:
        rewrite[name] = by_pack[name]
    if dry_run:
        rep.deleted_objects = len(doomed)
        rep.deleted_bytes = loose_bytes + packed_bytes
        rep.repacked_packs = sum(1 for keep in rewrite.values() if keep)
        rep.deleted_packs = len(rewrite)
        rep.waiting = len(unreachable - doomed)
        rep.condemned = len(unreachable - doomed - listed) if grace > 0 else 0
        rep.lists_swept = len(due)
        return rep

    # The fence: a record file sealed well before this mark that the mark did not see landed after it, and
    # names values this sweep may delete: readers list past it from now on (casmon.store.table.fence).
    if doomed:
        fence.publish(store.backend, mark_start, {f"records/{kind}/": store.table(kind).l0_listed()
                                                  for kind in store.record_kinds()})
    faultpoints.point("gc.before_sweep")
    if held is not None:
        held.confirm()  # a gc stopped for longer than its lease may have lost the lock: then it deletes nothing
    # What goes whole goes first, before anything is written: on a full disk that is what makes room.
    if doomed_keys:
        rep.deleted_bytes += loose_bytes
        store.backend.delete_many(doomed_keys)
    dropped: set[str] = set()
    whole = [name for name, keep in rewrite.items() if not keep and name not in merging and name in packs_present]
    if whole:
        # An index entry whose pack is gone is read past and dropped below (``stale``), as after a killed gc.
        store.backend.delete_many([pack_key(p) for p in whole])
        dropped.update(whole)
        packs_present.difference_update(whole)
    for i, (name, keep) in enumerate(rewrite.items()):
        progress("sweep packs", i, len(rewrite))
        if name in dropped:
            continue
        if keep:
            data = store.backend.get(pack_key(name))
            if data is None:
                continue
            frames = []
            try:
                for d, loc in keep:
                    frame = bytes(data[loc.offset : loc.offset + loc.length])
                    decode_frame(frame, f"{pack_key(name)}@{loc.offset}", expect=d)  # never copy damage
                    frames.append((d, frame, loc))
            except DamagedObjectError:
                if name in merging:
                    continue  # merging is optional: a damaged small pack stays for `casmon verify --repair`
                raise
            for d, frame, loc in frames:
                store.objects.adopt(d, frame, loc.kind, loc.size)
            if store.objects.pending_bytes >= PACK_MAX:
                store.objects.flush()  # new packs of about the usual size, whatever the number merged
            rep.repacked_packs += 1
        dropped.add(name)
    progress("sweep packs", len(rewrite), len(rewrite))
    rep.deleted_bytes += packed_bytes
    rep.deleted_objects = len(doomed)
    store.objects.flush()
    # Entries whose pack was gone when listed after they were read are stale: a pack is always written
    # before its index entries, so its absence means gc removed it (and a writer's merge that raced an
    # earlier gc carried the entry over). Entries written after that listing are not judged here.
    stale = {(d, loc.pack) for d, locs in entries.items() for loc in locs
             if loc.pack not in packs_present and loc.pack not in dropped}
    gone = doomed_packed | stale
    store.objects.index.consolidate(
        force=True,
        keep=lambda k, v: (Location.decode(v).pack not in dropped
                           and (Digest(k), Location.decode(v).pack) not in gone),
    )
    store.backend.delete_many([pack_key(p) for p in dropped if p in packs_present])
    rep.deleted_packs = len(dropped)
    store.objects.clear_caches()
    faultpoints.point("gc.after_sweep")
    # The swept lists go last: while a list is visible, writers keep away from what it names.
    store.backend.delete_many([condemned.PREFIX + lst.name for lst in due] + damaged_lists)
    rep.lists_swept = len(due)

    # Condemn what is unreachable now and on no list yet, where it lives now (after repacking).
    fresh = unreachable - doomed - listed
    if fresh and grace > 0:
        where: dict[Digest, set[str]] = defaultdict(set)
        for k, v in store.objects.index.items():
            d = Digest(k)
            if d in fresh:
                where[d].add(Location.decode(v).pack)
        lst = condemned.CondemnedList(condemned.new_name(), time.time(), sorted(fresh),
                                      {d for d in fresh if d in loose}, dict(where))
        store.backend.create(condemned.PREFIX + lst.name, condemned.encode(lst))
        faultpoints.point("gc.after_condemn")
    rep.condemned = len(fresh) if grace > 0 else 0
    rep.waiting = len(unreachable - doomed)
    if store.backend.exists(_LEGACY_STATE_REF):
        store.backend.delete(_LEGACY_STATE_REF)  # casmon 0.1's state was a pickle: never read it
    rep.partial_files = remove_partials(store, max(60.0, grace))
    for _prefix, table in reach.tables(store)[1:]:
        table.consolidate()
    return rep


def _recent_values(store: Store, unreachable: set[Digest], entries: dict[Digest, list[Location]]) -> int:
    """How many unreachable values sit in packs written within :data:`RECENT` seconds (0 where the medium
    cannot tell when): values put lately that no record or ref names, which gc will remove."""
    values = [d for d in unreachable if any(loc.kind == KIND_VALUE for loc in entries.get(d, ()))]
    if not values:
        return 0
    try:
        landed = store.backend.list_landed("packs/")
    except (OSError, StoreError):
        return 0
    if not landed:
        return 0
    since = time.time() - RECENT
    recent = {k.rsplit("/", 1)[-1] for k, t in landed.items() if t >= since}
    return sum(1 for d in values if any(loc.kind == KIND_VALUE and loc.pack in recent for loc in entries[d]))


def _due(store: Store, lists: list[condemned.CondemnedList], grace: float, mark_start: float,
         held: lock.StoreLock | None) -> list[condemned.CondemnedList]:
    """The lists published at least ``grace`` before the mark began.

    By the lists' times and this host's clock; on remote storage, whose clients are many hosts with
    clocks of their own, also by the storage's clock: the list's landing time against the landing time
    of this gc's lock, written just before the mark. So a gc whose clock runs ahead (or another gc's,
    which wrote the list) cannot sweep early. A local folder's processes share one clock.
    """
    due = [lst for lst in lists if lst.time + grace <= mark_start]
    if held is None or not due or store.backend.is_local:
        return due
    now = store.backend.landed([lock.LOCK_KEY])
    landed = store.backend.list_landed(condemned.PREFIX)
    if now is None or now[0] is None or landed is None:
        return due  # the medium cannot tell (memory): one process, one clock
    lock_landed = now[0]
    return [lst for lst in due if (t := landed.get(condemned.PREFIX + lst.name)) is not None and t + grace <= lock_landed]


def remove_partials(store: Store, older_than: float) -> int:
    """Remove temporary files of killed writers (local folders only)."""
    root = store.backend.local_root
    if root is None:
        return 0
    n = 0
    now = time.time()
    for p in Path(root).rglob("*.partial"):
        try:
            if now - p.stat().st_mtime >= older_than:
                os.unlink(p)
                n += 1
        except OSError:
            pass
    return n
