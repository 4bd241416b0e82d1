"""The listing of a store's objects: loose objects, packs and the pack index; and the second
listing that verify and repair read latecomers from.

stats, verify and repair start from this listing. Writers go on while they run and a writer
stores a value's objects before the record or ref that names it, so what a record or ref names
that the first listing lacks may have been written since: :class:`Latecomers` looks it up in one
second listing and reads it from the store, checked whole, before anyone calls it missing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from casmon.errors import CasmonError
from casmon.keys.digest import Digest
from casmon.maintenance import reach
from casmon.store.codec import decode_frame
from casmon.store.objects import Location, pack_key
from casmon.store.manifest import decode_manifest

if TYPE_CHECKING:
    from casmon.store.store import Store

__all__ = ["Inventory", "take", "is_object_name", "Latecomers"]

_HEX = re.compile(r"^[0-9a-f]{32}$")


def is_object_name(name: str) -> bool:
    """True if ``name`` (the last part of a key under ``objects/`` or ``packs/``) is 32 hex digits."""
    return _HEX.match(name) is not None


@dataclass
class Inventory:
    """What one listing of the store found."""

    loose: dict[Digest, str]  # digest -> key
    packs: set[str]
    packed: dict[Digest, Location]  # digest -> newest location
    all_keys: list[str]


def take(store: Store, strict: bool = True) -> Inventory:
    """Every loose object, pack and indexed object. ``strict``: raise if an index file is damaged.

    The files are listed before the index is read, so the index may name a pack
    written after the listing (verify reads such a pack rather than call it missing).
    """
    keys = store.backend.list("")
    loose: dict[Digest, str] = {}
    packs: set[str] = set()
    for k in keys:
        parts = k.split("/")
        if parts[0] == "objects" and len(parts) == 3 and is_object_name(parts[2]):
            loose[Digest(parts[2])] = k
        elif parts[0] == "packs" and len(parts) == 2 and is_object_name(parts[1]):
            packs.add(parts[1])
    packed: dict[Digest, Location] = {}
    for d, v in store.objects.index.items(strict=strict):
        try:
            packed[Digest(d)] = Location.decode(v)
        except Exception:  # noqa: BLE001 - an entry that does not decode is no location (its file passed its checks)
            continue
    return Inventory(loose, packs, packed, keys)


class Latecomers:
    """Objects a record, ref or value names that the first listing lacks, checked against the store now.

    ``verify`` and ``repair`` list objects before they read records and refs, and writers go on
    meanwhile; a writer stores a value's objects before the record or ref naming it, so what it
    wrote after the listing is read here rather than called missing (else verify calls a sound
    store damaged, and repair deletes a ref and drops a cache entry a writer has just written).
    One second inventory, taken at the first such object after the records were read, answers
    for all of them (not a listing per object), and every object is read from the store and
    checked whole -- never from this process's memory, which may hold a value the store has
    lost. Call :meth:`reread` before reading the next batch of records or refs.
    """

    def __init__(self, store: Store, present: set[Digest]) -> None:
        self.store = store
        self.present = present
        self.found = 0  # objects the first listing lacked that are sound now
        self._fresh: Inventory | None = None
        self._batch = 0  # batches of records or refs read so far
        self._fresh_batch = -1  # the last batch read before _fresh was listed
        self._sound: dict[Digest, bool] = {}

    def reread(self) -> None:
        """A new batch of records or refs is read next: the next miss lists the store again."""
        self._batch += 1

    def __call__(self, d: Digest, value: bool = True) -> bool:
        """True if ``d`` is stored and sound (a ``value``: its chunks and children too)."""
        if d in self.present or self._sound.get(d):
            return True
        if self._fresh is None or self._fresh_batch < self._batch:
            self._fresh = take(self.store, strict=False)
            self._fresh_batch = self._batch
            self._sound = {k: v for k, v in self._sound.items() if v}  # a miss may be found now
        return self._check(self._fresh, d, value)

    def _check(self, inv: Inventory, d: Digest, value: bool) -> bool:
        if d in self.present:
            return True
        if d in self._sound:
            return self._sound[d]
        self._sound[d] = False  # while it is being checked: a cycle proves nothing
        ok = False
        try:
            raw = self._read(inv, d)
            if raw is not None:
                ok = True
                if value:
                    parts = reach.parts_of(decode_manifest(d, raw))
                    ok = all(self._check(inv, c, False) for c in parts.chunks) and all(
                        self._check(inv, c, True) for c in parts.children)
        except CasmonError:
            ok = False
        self._sound[d] = ok
        self.found += ok
        return ok

    def _read(self, inv: Inventory, d: Digest) -> bytes | memoryview | None:
        """``d``'s payload as the second inventory places it, checked against ``d``; None if absent."""
        key = inv.loose.get(d)
        if key is not None:
            data = self.store.backend.get(key)
            if data is not None:
                return decode_frame(data, key, expect=d)[1]
        loc = inv.packed.get(d)
        if loc is None:
            return None
        key = pack_key(loc.pack)
        frame = self.store.backend.get_range(key, loc.offset, loc.offset + loc.length)
        if frame is None or len(frame) != loc.length:
            return None
        return decode_frame(frame, f"{key}@{loc.offset}", expect=d)[1]
