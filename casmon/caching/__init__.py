"""The cache: ``@casmon.cache`` memoizes a function in a store.

``memoize`` holds the decorator, its keys and hits, entries and eviction.
The package is ``caching`` so that ``casmon.cache`` stays the decorator.
"""

from casmon.caching.memoize import CacheInfo, CacheWarning, cache

__all__ = ["cache", "CacheInfo", "CacheWarning"]
