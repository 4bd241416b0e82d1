"""Hit counts: which cache entries were used since the last flush, for least-recently-used eviction.

One :class:`Usage` per open store collects the hits of every cached function in
this process and writes them as one ``cacheuse`` record per flush.
"""

from __future__ import annotations

import os
import _thread  # threading's locks, without loading threading on a hit
import time
TYPE_CHECKING = False  # typing's flag without importing typing (~2 ms of a first hit)

from casmon.caching.entries import KIND_USE

if TYPE_CHECKING:
    from casmon.keys.digest import Digest
    from casmon.store.store import Store

__all__ = ["Usage", "usage_of"]


class Usage:
    """Hit counts since the last flush, written as one record per flush."""

    def __init__(self, store: Store) -> None:
        self.store = store  # ids are reused once a store is gone: a new store at the same id gets its own
        self.lock = _thread.allocate_lock()
        self.hits: dict[bytes, list] = {}  # key -> [function, hits, last]; hex only when written

    def hit(self, key: Digest, fn: str) -> None:
        now = time.time()
        with self.lock:
            e = self.hits.get(key)
            if e is None:
                self.hits[bytes(key)] = [fn, 1, now]
            else:
                e[1] += 1
                e[2] = now

    def flush_into(self, store: Store) -> None:
        with self.lock:
            hits, self.hits = self.hits, {}
        if hits:
            store.append(KIND_USE, {"hits": {k.hex(): e for k, e in hits.items()}, "time": time.time()})


_usage_by_store: dict[int, Usage] = {}
_usage_lock = _thread.allocate_lock()

if hasattr(os, "register_at_fork"):
    # A forked child's store forgets the parent's flush hooks; its hit counts start over with it.
    os.register_at_fork(after_in_child=_usage_by_store.clear)


def usage_of(store: Store) -> Usage:
    u = _usage_by_store.get(id(store))
    if u is None or u.store is not store:
        with _usage_lock:
            u = _usage_by_store.get(id(store))
            if u is None or u.store is not store:
                u = Usage(store)
                _usage_by_store[id(store)] = u
                store.add_flush_hook(u.flush_into)
    return u
