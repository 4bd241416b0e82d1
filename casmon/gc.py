"""Garbage collection: remove what no record or ref reaches, safely beside writers.

See docs/RELIABILITY.md for the protocol and why it is safe.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .codec import KIND_VALUE, decode_frame
from .digest import Digest
from .errors import CasmonError
from .maintenance import Progress, _noop, _table_prefixes, inventory
from .objects import Location, pack_key

if TYPE_CHECKING:
    from .store import Store

__all__ = ["gc", "GcReport"]


@dataclass
class GcReport:
    live_values: int = 0
    unreachable: int = 0
    deleted_objects: int = 0
    deleted_bytes: int = 0
    repacked_packs: int = 0
    deleted_packs: int = 0
    waiting: int = 0  # unreachable, but not for long enough yet
    partial_files: int = 0
    dry_run: bool = False

    def as_dict(self) -> dict:
        return dict(self.__dict__)


GC_STATE_REF = "gc/state"


def _mark(store: Store) -> set[Digest]:
    """Every object reachable from records and refs."""
    roots: set[Digest] = set()
    for kind in store.record_kinds():
        for _k, rec in store.records(kind):
            for h in rec.get("_refs", []):
                roots.add(Digest(h))
    for name in store.refs():
        ref = store.get_ref(name)
        if ref is not None and ref.target is not None:
            roots.add(ref.target)
    live: set[Digest] = set()
    todo = list(roots)
    while todo:
        d = todo.pop()
        if d in live:
            continue
        live.add(d)
        try:
            m = store.manifest(d)
        except CasmonError:
            continue  # missing or damaged: verify reports it
        for c in m.chunk_digests():
            live.add(c)
        todo.extend(m.children)
    return live


def gc(store: Store, grace: float = 3600.0, dry_run: bool = False, progress: Progress | None = None) -> GcReport:
    """Remove objects no record or ref reaches; repack packs that are mostly dead.

    Writers store objects before the records that point at them, so an object
    may be unreachable for a moment while a writer is busy. gc therefore
    deletes an object only once it has been seen unreachable, by an earlier gc
    run, at least ``grace`` seconds ago (the first sightings are kept in the
    ref ``gc/state``). ``grace=0`` deletes at once: only safe while nothing
    else writes to the store.
    """
    progress = progress or _noop
    rep = GcReport(dry_run=dry_run)
    store.flush()
    progress("mark", 0, 1)
    live = _mark(store)
    progress("mark", 1, 1)
    inv = inventory(store)
    rep.live_values = sum(1 for d in live if d in inv.packed and inv.packed[d].kind == KIND_VALUE)
    unreachable = (set(inv.loose) | set(inv.packed)) - live
    rep.unreachable = len(unreachable)
    now = time.time()
    state_ref = store.get_ref(GC_STATE_REF)
    seen: dict[str, float] = {}
    if state_ref is not None and state_ref.target is not None:
        try:
            seen = dict(store.get(state_ref.target))
        except CasmonError:
            seen = {}
    if grace <= 0:
        doomed = set(unreachable)
    else:
        doomed = {d for d in unreachable if now - seen.get(d.hex(), now) >= grace}
    rep.waiting = len(unreachable) - len(doomed)
    if dry_run:
        rep.deleted_objects = len(doomed)
        return rep

    # Loose objects go at once.
    doomed_loose = [inv.loose[d] for d in doomed if d in inv.loose]
    if doomed_loose:
        rep.deleted_bytes += sum(store.backend.getsize_many(doomed_loose))
        store.backend.delete_many(doomed_loose)
    # Packs: drop those with nothing live, repack those mostly dead.
    by_pack: dict[str, list[tuple[Digest, Location]]] = defaultdict(list)
    for d, loc in inv.packed.items():
        by_pack[loc.pack].append((d, loc))
    dropped: set[str] = set()
    for name, entries in by_pack.items():
        dead = [e for e in entries if e[0] in doomed]
        if not dead:
            continue
        dead_bytes = sum(loc.length for _, loc in dead)
        all_bytes = sum(loc.length for _, loc in entries)
        if len(dead) == len(entries) or dead_bytes * 2 >= all_bytes:
            keep = [e for e in entries if e[0] not in doomed]
            if keep:
                data = store.backend.get(pack_key(name))
                if data is None:
                    continue
                for d, loc in keep:
                    frame = bytes(data[loc.offset : loc.offset + loc.length])
                    decode_frame(frame, f"{pack_key(name)}@{loc.offset}", expect=d)  # never copy damage
                    store.objects.adopt(d, frame, loc.kind, loc.size)
                rep.repacked_packs += 1
            dropped.add(name)
            rep.deleted_bytes += dead_bytes
    rep.deleted_objects = len(doomed)
    store.objects.flush()
    # The index forgets doomed objects and dropped packs, then the packs go.
    store.objects.index.consolidate(
        force=True,
        keep=lambda k, v: Digest(k) not in doomed and Location.decode(v).pack not in dropped,
    )
    store.backend.delete_many([pack_key(p) for p in dropped if p in inv.packs])
    rep.deleted_packs = len(dropped)
    store.objects.clear_caches()
    # Remember when each still-unreachable object was first seen.
    new_seen = {d.hex(): seen.get(d.hex(), now) for d in unreachable - doomed}
    if new_seen or seen:
        state = store.put(new_seen)
        store.set_ref(GC_STATE_REF, state, {"time": now})
        store.flush()
    rep.partial_files = _remove_partials(store, max(60.0, grace))
    for prefix in _table_prefixes(store)[1:]:
        store.table(prefix.split("/")[1]).consolidate()
    return rep


def _remove_partials(store: Store, older_than: float) -> int:
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
