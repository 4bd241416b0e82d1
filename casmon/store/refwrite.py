"""Refs written beside gc: a ref's target is stored and safe from a sweep before the ref names it, and a ref
whose write was slow enough for gc to have swept its target is checked and written again
(:meth:`Store.set_ref <casmon.store.store.Store.set_ref>`, ``create_ref``'s work).

Loaded by the first ref written: a hit reads no ref and writes none.
"""

from __future__ import annotations

import os
import time
TYPE_CHECKING = False  # typing's flag without importing typing (~2 ms of a first hit)
if TYPE_CHECKING:
    from typing import Any

    from casmon.store.store import Store

from casmon.errors import MissingObjectError
from casmon.keys.digest import Digest
from casmon.store import condemned, reliance
from casmon.store.records import ref_frame, ref_key
from casmon.store.store import LATE_TRIES

__all__ = ["set_ref", "create_ref", "ensure_stored"]


def set_ref(store: Store, name: str, target: Digest | None = None, data: dict[str, Any] | None = None,
            same_target: bool = False) -> None:
    """:meth:`Store.set_ref <casmon.store.store.Store.set_ref>`."""
    store._check_writable()
    key = ref_key(name)
    frame = ref_frame(target, data)
    if same_target:
        return store.backend.set(key, frame)
    for _attempt in range(LATE_TRIES):
        t0 = time.monotonic()
        ensure_stored(store, target, force=_attempt > 0)
        store.backend.set(key, frame)
        if not _slow_ref(store, target, t0):
            return
    _release(store, target)


def _slow_ref(store: Store, target: Digest | None, t0: float) -> bool:
    """After a ref's write: False once it is done; True if the write took so long that gc may have swept
    its target meanwhile (:mod:`casmon.store.table.fence`), so it is checked and written again."""
    if target is None:
        return False
    if time.monotonic() - t0 <= condemned.LATE_MAX / 2:
        _release(store, target)
        return False
    store.late_writes += 1
    return True


def _release(store: Store, target: Digest | None) -> None:
    if target is not None:
        store._held.pop(Digest(target), None)  # the ref holds it now


def ensure_stored(store: Store, target: Digest | bytes | str | None, force: bool = False) -> None:
    """Before a ref names ``target``: it and its chunks are written, and safe from a gc sweep. It stays
    held (copied if gc condemns it) until the ref is written."""
    if target is None:
        return
    d = Digest(target)
    held = store._held
    held.pop(d, None)
    held[d] = None
    store._after_write()  # while the ref's write is in flight, held values are looked after
    with store._flush_lock:
        if force or reliance.needs_check(store, d) or store.objects.pending_bytes:
            bad = reliance.check_values(store, {d}, force=force)
            if bad:
                held.pop(d, None)
                raise MissingObjectError(f"cannot point a ref at value {d.hex()}: it is not in {store.url}")
            store._write_objects()


def create_ref(store: Store, name: str, target: Digest | None = None, data: dict[str, Any] | None = None) -> bool:
    """:meth:`Store.create_ref <casmon.store.store.Store.create_ref>`."""
    store._check_writable()
    key = ref_key(name)
    t0 = time.monotonic()
    ensure_stored(store, target)
    nonce = os.urandom(8).hex()
    frame = ref_frame(target, data, nonce)
    store.backend.create(key, frame)
    got = store.backend.get(key)
    mine = got is not None and bytes(got) == frame
    if mine and _slow_ref(store, target, t0):
        ensure_stored(store, target, force=True)  # slow: its target may be condemned now; keep it stored
        _release(store, target)
    return mine
