"""The store's zarr view lists the cache's entries through the derived lineage index (one file read, not one
record parsed per entry): loaded by name when a view is opened (:data:`casmon.store.zarrview.SECTION_MODULES`)."""

from __future__ import annotations

from casmon.caching.zarrtree import use_entry_reader
from casmon.lineage.derived import read_entries

__all__: list[str] = []

use_entry_reader(read_entries)
