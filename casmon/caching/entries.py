"""Cache entries in the store: their record kinds and fields (handles to results are
:mod:`casmon.caching.resultref`'s, loaded on first use of ``ResultRef``).

What a call reads and writes of an entry; the listing, eviction and admin that ``casmon cache``,
``casmon gc`` and ``casmon ui`` run over entries are :mod:`casmon.caching.eviction` (loaded on first use
of one of its names, here or in :mod:`casmon.caching`: a call never loads it).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable
TYPE_CHECKING = False  # typing's flag without importing typing (~2 ms of a first hit)
if TYPE_CHECKING:
    from typing import Any

from casmon.errors import MAX_SECONDS
from casmon.keys.digest import Digest
from casmon.keys.fingerprint import fingerprint
from casmon.store.metafile import register_fields

if TYPE_CHECKING:
    from casmon.caching.resultref import ResultRef

__all__ = ["KIND", "KIND_FN", "KIND_CLEAR", "KIND_USE", "ResultRef", "name_digest", "newest_per_key", "expires_option",
           "result_of"]
#: Names that live in :mod:`casmon.caching.eviction`, loaded from there on first use.
MOVED = frozenset({"cache_entries", "AmbiguousName", "resolve_function", "clear_function", "evict", "eviction_plan", "Eviction",
                   "freed_bytes", "duplicates_plan", "superseded_entries", "drop_duplicates", "results_total", "use_hits",
                   "held_elsewhere"})


def __getattr__(name: str) -> Any:
    if name == "ResultRef":  # a handle is made by ref() and listings, never by a call: loaded on first use
        from casmon.caching.resultref import ResultRef

        return ResultRef
    if name in MOVED:
        from casmon.caching import eviction

        return getattr(eviction, name)
    raise AttributeError(f"module 'casmon.caching.entries' has no attribute {name!r}")

KIND = "cache"  # cache entries, keyed by call key
KIND_FN = "cachefn"  # one record per function version seen, keyed by the function's name digest
KIND_CLEAR = "cacheclear"  # cache_clear() tombstones, keyed by the function's name digest
KIND_USE = "cacheuse"  # hit counts and last use, written at flushes

#: How far ahead of this host's clock a record's time may be: further is damage (a clear from the far future
#: would hide every entry stored after it, an entry from there would outrank every refresh).
_AHEAD_MAX = 86400.0


def _text(v: Any) -> str:
    if type(v) is not str:
        raise TypeError("not text")
    return v


def _hex(v: Any) -> str:
    if type(v) is not str or len(v) != 32 or v.strip("0123456789abcdef"):
        raise ValueError("not a digest")
    return v


def _number(v: Any, hi: float) -> float:
    if type(v) not in (int, float) or not 0 <= v <= hi:  # NaN fails the comparison
        raise ValueError("out of range")
    return float(v)


def _time(v: Any) -> float:
    return _number(v, time.time() + _AHEAD_MAX)


def _count(v: Any) -> int:
    if type(v) is not int or not 0 <= v < 1 << 62:
        raise ValueError("not a count")
    return v


def _args(v: Any) -> dict[str, str]:
    if type(v) is not dict or not all(type(x) is str for x in v.values()):
        raise TypeError("not parameter digests")
    return v


def _parts(v: Any) -> dict[str, Any]:
    if type(v) is not dict or not all(type(x) is dict for x in v.values()):
        raise TypeError("not code parts")
    return v


# Lineage's fields (casmon.caching.edges) are read for every entry by `stale` and `used-by`: checked by type and
# length alone (a digest that is not hex matches nothing, and reading it as a key is a miss).
def _digests(v: Any) -> dict[str, str]:
    if type(v) is not dict or len(v) > 4096 or not all(type(x) is str and len(x) == 32 for x in v.values()):
        raise TypeError("not content digests")
    return v


def _keys(v: Any) -> dict[str, list[str]]:
    if type(v) is not dict or len(v) > 4096 or not all(
            type(ks) is list and len(ks) <= 4096 and all(type(x) is str and len(x) == 32 for x in ks)
            for ks in v.values()):
        raise TypeError("not entry keys")
    return v


def _hits(v: Any) -> dict[str, list[Any]]:
    if type(v) is not dict:
        raise TypeError("not hits")
    out = {}
    for k, e in v.items():  # one crafted hit is left out, not the flush's others
        try:
            fn, n, last = e
            out[_hex(k)] = [_text(fn), _count(n), _time(last)]
        except (ValueError, TypeError):
            pass
    return out


# Every record field these readers use, checked as it is read (casmon.store.metafile.register_fields): a cache
# record that is crafted or damaged stops no call, listing or gc with a TypeError, and hides no entry.
register_fields(KIND, {"fn": _text, "result": _hex, "time": _time, "seconds": lambda v: _number(v, 1e12),
                       "size": _count, "expires": lambda v: _number(v, 1e11), "v": _hex,
                       "a": _args, "inline": _text, "rf": _hex, "pc": _digests, "up": _keys})
register_fields(KIND_FN, {"fn": _text, "version": _hex, "time": _time, "parts": _parts})
register_fields(KIND_CLEAR, {"fn": _text, "time": _time})
register_fields(KIND_USE, {"hits": _hits, "time": _time})


def name_digest(name: str) -> Digest:
    """The key of a function's own records (its versions, its clears): a digest of its full name."""
    return fingerprint(("casmon.fn", name))


def expires_option(expires: Any, name: str) -> float | None:
    """``expires_after=`` of ``@casmon.cache`` in seconds (a ``timedelta`` or a number), checked."""
    if expires is None:
        return None
    dt = sys.modules.get("datetime")  # a timedelta exists only once datetime is imported
    if dt is not None and isinstance(expires, dt.timedelta):
        expires = expires.total_seconds()
    if isinstance(expires, bool) or not isinstance(expires, (int, float)) or not 0 < expires <= MAX_SECONDS:
        raise ValueError(f"@cache of {name}: expires_after= is a timedelta or a number of seconds above 0 and at "
                         f"most 100 years, got {expires!r}")
    return float(expires)


def newest_per_key(items: Iterable[tuple[Digest, dict]]) -> dict[bytes, tuple[Digest, dict]]:
    """One entry per key: a key can hold several records (a damaged result recomputed, two
    processes that missed at once); they count once, as the newest."""
    out: dict[bytes, tuple[Digest, dict]] = {}
    for k, r in items:
        kb = bytes(k)
        old = out.get(kb)
        if old is None or r.get("time", 0) >= old[1].get("time", 0):
            out[kb] = (k, r)
    return out


def result_of(key: bytes, record: dict) -> str:
    """The stored value an entry holds (its digest hex): what totals count once however many entries share it.
    A record naming none (a crafted or foreign one) counts as a value of its own."""
    d = record.get("result")
    return d if isinstance(d, str) and d else "entry:" + key.hex()
