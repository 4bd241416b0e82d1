"""The cache: ``@casmon.cache`` memoizes a function in a store.

``memoize`` holds the decorator, its keys and hits; ``files`` the digests of the
files and folders a call reads; ``workers`` how a cached function pickles for
worker processes; ``entries`` what an entry's records are; ``eviction`` their
listing, eviction and admin (loaded on first use: a call never needs it). The
package is ``caching`` so that ``casmon.cache`` stays the decorator.
"""

TYPE_CHECKING = False  # typing's flag without importing typing (~2 ms of a first hit)

from casmon.caching.entries import KIND, KIND_CLEAR, KIND_FN, KIND_USE, name_digest, newest_per_key, result_of
from casmon.caching import entries as _entries
from casmon.keys.names import keep_flat_names as _keep_flat_names
from casmon.caching.memoize import CachedFunction, CacheState, CacheWarning, cache, cache_with, observers

__all__ = [
    "cache", "cache_with", "observers", "CachedFunction", "CacheState", "CacheInfo", "CacheWarning", "ResultRef",
    "file_digest", "path_digest",
    "KIND", "KIND_FN", "KIND_CLEAR", "KIND_USE", "name_digest", "newest_per_key", "cache_entries", "resolve_function",
    "AmbiguousName",
    "clear_function", "evict", "eviction_plan", "Eviction", "freed_bytes", "duplicates_plan", "superseded_entries", "drop_duplicates",
    "result_of", "results_total",
]


def __getattr__(name: str) -> object:
    if name == "ResultRef":  # a handle: made by ref() and listings, never by a call
        from casmon.caching.resultref import ResultRef

        return ResultRef
    if name == "CacheInfo":  # made at its first use (casmon.caching.memoize.cache_info_type)
        from casmon.caching import memoize

        return memoize.cache_info_type()
    if name in ("file_digest", "path_digest"):  # loaded on first use: a cached call reads files only with files=
        from casmon.caching import files

        return getattr(files, name)
    if name in _entries.MOVED:  # listing, eviction and admin: loaded on first use, never by a call
        from casmon.caching import eviction

        return getattr(eviction, name)
    raise AttributeError(f"module 'casmon.caching' has no attribute {name!r}")


# Pickles and keys name these types where they were before the packages (casmon/keys/names.py).
_keep_flat_names([CachedFunction, CacheWarning])  # and CacheInfo and ResultRef, when they are made

if TYPE_CHECKING:  # what type checkers see: the names loaded on first use, imported for real
    from casmon.caching.memoize import CacheInfo
    from casmon.caching.resultref import ResultRef
    from casmon.caching.eviction import (AmbiguousName, Eviction, cache_entries, clear_function, drop_duplicates, duplicates_plan, evict,
                                         eviction_plan, freed_bytes, resolve_function, results_total, superseded_entries)
    from casmon.caching.files import file_digest, path_digest
