"""The gc lock: the store lock (:mod:`casmon.store.lock`) as gc and repair take it.

One process at a time rewrites what others read whole (gc, repair, a writer's
table merge); writers that only add never wait for it.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

from casmon.store import lock

if TYPE_CHECKING:
    from casmon.store.store import Store

__all__ = ["gc_lock", "LOCK_KEY"]

LOCK_KEY = lock.LOCK_KEY


def gc_lock(store: Store, what: str = "gc", break_lock: bool = False) -> AbstractContextManager[lock.StoreLock]:
    """Hold the store lock (:mod:`casmon.store.lock`) for ``what``; StoreError naming the holder if it is busy."""
    return lock.held(store.backend, what, store.url, break_lock=break_lock)
