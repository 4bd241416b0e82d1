"""A cached function's code versions in the store, and what it says when its code changes.

Each version a process first meets is recorded once (a ``cachefn`` record with
its parts, see :func:`casmon.caching.explain.version_parts`). When the code is
not the version cached last, the decorator warns once per change which entries
are used now, how many of other versions stay, and what changed (the message is
:func:`casmon.caching.explain.code_change_message`'s, loaded only by a change).
"""

from __future__ import annotations

import time
TYPE_CHECKING = False  # typing's flag without importing typing (~2 ms of a first hit)
if TYPE_CHECKING:
    from typing import Any

from casmon.caching.entries import KIND_FN, name_digest
from casmon.keys.digest import Digest

if TYPE_CHECKING:
    from casmon.caching.memoize import CacheState

__all__ = ["VERSION_COUNT_MAX", "VERSION_WARNINGS_MAX", "check_version"]

#: The code-change warning counts entries per version only in cache tables up to this size (it reads them all).
VERSION_COUNT_MAX = 1_000_000
#: Code-change warnings per function and process; the last one says no more follow.
VERSION_WARNINGS_MAX = 5
_version_warnings: dict[str, int] = {}
_checked_versions: dict[tuple[int, str], Digest] = {}  # (id(store), name) -> the version last checked in this process


def check_version(state: CacheState, version: Digest) -> str | None:
    """Record ``version`` if the store has not seen it last; the warning to give, if any (once per change)."""
    store = state.store
    done = (id(store), state.name)
    if _checked_versions.get(done) == version:
        return None
    nd = name_digest(state.name)
    seen = store.lookup(KIND_FN, nd)
    latest = max(seen, key=lambda r: r.get("time", 0)) if seen else None
    msg = None
    # What the version is made of is read (sources, globals, libraries) only where it is recorded or compared.
    stale = latest is None or latest.get("version") != version.hex() or "parts" not in latest
    parts = state.current_parts() if stale else {}
    if (latest is not None and latest.get("version") != version.hex() and state.version_pin is None
            and "<lambda>" not in state.name):
        n = _version_warnings[state.name] = _version_warnings.get(state.name, 0) + 1
        if n <= VERSION_WARNINGS_MAX:  # code that changes at every call (a global it mutates) would flood
            from casmon.caching import explain  # only a change of code loads it

            msg = explain.code_change_message(state, version, seen, latest, parts)
            if n == VERSION_WARNINGS_MAX:
                msg += " Further changes of its code in this process are not reported."
    if stale:
        store.append(KIND_FN, {"fn": state.name, "version": version.hex(), "time": time.time(), "parts": parts}, key=nd)
    _checked_versions[done] = version
    return msg
