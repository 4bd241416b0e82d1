"""Maintenance: what reads a whole store and keeps it sound (``stats``, ``verify``, ``repair``, ``gc``).

One module a job: :mod:`~casmon.maintenance.reach` (the walk of what records and refs
reach, shared by all four), :mod:`~casmon.maintenance.inventory` (the listing of objects
and the second listing for latecomers), :mod:`~casmon.maintenance.usage` (stats),
:mod:`~casmon.maintenance.check` (verify), :mod:`~casmon.maintenance.salvage` (repair),
:mod:`~casmon.maintenance.collect` (gc: mark, sweep, condemn) and
:mod:`~casmon.maintenance.gclock` (the gc lock). They depend on the store layer and below
only; the store reaches them through :func:`casmon.store.store.install_maintenance`.
"""

from typing import Any as _Any

from casmon.maintenance.check import VerifyReport, verify
from casmon.maintenance.collect import GcReport, gc, mark, read_lists, remove_partials
from casmon.maintenance.gclock import LOCK_KEY, gc_lock
from casmon.maintenance.inventory import Inventory, Latecomers
from casmon.maintenance.phases import Progress
from casmon.maintenance.salvage import repair, salvage_frames
from casmon.maintenance.usage import stats
from casmon.keys.names import keep_flat_names as _keep_flat_names
from casmon.store.store import Store as _Store, install_maintenance as _install_maintenance

__all__ = ["stats", "verify", "repair", "gc", "gc_lock", "mark", "read_lists", "remove_partials", "salvage_frames",
           "GcReport", "VerifyReport", "Inventory", "Latecomers", "Progress", "LOCK_KEY"]


class _StoreMaintenance:
    """``Store.stats``, ``Store.verify`` and ``Store.gc``: the store layer calls up into this one through it."""

    def stats(self, store: _Store, progress: Progress | None = None) -> dict[str, _Any]:
        return stats(store, progress)

    def verify(self, store: _Store, progress: Progress | None = None) -> _Any:
        return verify(store, progress)

    def gc(self, store: _Store, grace: float = 3600.0, dry_run: bool = False, progress: Progress | None = None,
           break_lock: bool = False) -> _Any:
        return gc(store, grace=grace, dry_run=dry_run, progress=progress, break_lock=break_lock)


_install_maintenance(_StoreMaintenance())

# Pickles and keys name these types where they were before the packages (casmon/keys/names.py).
_keep_flat_names([VerifyReport, GcReport])
