"""Changing a table's sealed batches: rare steps of a writer, loaded on first use.

A batch written too slowly is sealed again under new names (:mod:`.fence`), a flush drops records whose values
are gone, tools take the waiting entries: none of this runs on a cached call's hit or an ordinary flush.
"""

from __future__ import annotations

import time
TYPE_CHECKING = False  # typing's flag without importing typing
if TYPE_CHECKING:
    from casmon.store.table.table import Table

from casmon.store.table import fence

__all__ = ["replace_sealed", "reseal", "take_pending"]


def take_pending(t: Table) -> list[tuple[bytes, bytes]]:
    """Remove and return the entries not assigned to a batch (tests and tools)."""
    with t._lock:
        entries, t._pending = t._pending, []
        t._reindex_pending()
        return entries


def replace_sealed(t: Table, name: str, entries: list[tuple[bytes, bytes]]) -> None:
    """Change a sealed batch before it is written (a flush dropping records whose values are gone)."""
    with t._lock:
        t._batches = [(n, entries if n == name else e) for n, e in t._batches]
        t._reindex_pending()


def reseal(t: Table) -> None:
    """Seal the waiting batches again now (their values were just checked again): the same numbers,
    new seal times. A batch that may have landed under its old name is superseded by the new one."""
    with t._lock:
        now = time.time_ns()
        renamed = [(fence.renamed(n, now), e) for n, e in t._batches]
        for (old, _), (new, _) in zip(t._batches, renamed):
            t._sealed_at.pop(old, None)
            t._sealed_at[new] = time.monotonic()
        t._batches = renamed
