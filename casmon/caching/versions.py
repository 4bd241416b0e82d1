"""A cached function's code versions in the store, and what it says when its code changes.

Each version a process first meets is recorded once (a ``cachefn`` record with
its parts, see :func:`casmon.caching.explain.version_parts`). When the code is
not the version cached last, the decorator warns once per change which entries
are used now, how many of other versions stay, and what changed.
"""

from __future__ import annotations

import time
TYPE_CHECKING = False  # typing's flag without importing typing (~2 ms of a first hit)
if TYPE_CHECKING:
    from typing import Any

from casmon.caching.entries import KIND, KIND_FN, name_digest, newest_per_key
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
            msg = _version_message(state, version, seen, latest, parts)
            if n == VERSION_WARNINGS_MAX:
                msg += " Further changes of its code in this process are not reported."
    if stale:
        store.append(KIND_FN, {"fn": state.name, "version": version.hex(), "time": time.time(), "parts": parts}, key=nd)
    _checked_versions[done] = version
    return msg


def _what_changed(latest: dict[str, Any], parts: dict[str, Any]) -> str:
    old = latest.get("parts")
    if not isinstance(old, dict):
        return ""
    from casmon.caching import explain  # only a change of code loads it

    diffs = explain.compare_parts(old, parts)
    if not diffs:
        return ""
    names = [d.clause() for d in diffs[:4]]
    more = f" and {len(diffs) - 4} more" if len(diffs) > 4 else ""
    tail = " (`f.explain(...)` shows the source diff)" if any(d.diff for d in diffs) else ""
    return f" Since the version cached last: {', '.join(names)}{more}{tail}."


def _version_message(state: CacheState, version: Digest, seen: list[dict[str, Any]], latest: dict[str, Any],
                     parts: dict[str, Any]) -> str:
    """What happens now that the code is ``version``: which entries are used, how many other versions hold."""
    from casmon.view.text import plural  # a change of code loads it
    vh = version.hex()
    name = state.name
    first = min((r.get("time", 0) for r in seen if r.get("version") == vh), default=None)
    mine, others, other_versions, unknown = _entries_by_version(state, vh)
    if others is None:
        rest = "entries of other versions stay in the store, unused while the code is as it is now"
    elif others == 0:
        rest = "no entries of other versions remain"
    else:
        rest = (f"{plural(others, 'entry', 'entries')} of {plural(other_versions or 0, 'other version')} "
                f"{'stays' if others == 1 else 'stay'} in the store, unused while the code is as it is now")
    if unknown:
        rest += (f" ({plural(unknown, 'older entry', 'older entries')} {'does' if unknown == 1 else 'do'} not say "
                 "its version)")
    free = (f"`casmon cache clear {name}`, then two `casmon gc` an hour apart (or `casmon gc --now` while "
            "nothing else writes), frees the space of all of them.")
    changed = _what_changed(latest, parts)
    if first is not None:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(first))
        used = ("its entries are used" if not mine and (mine is None or unknown) else
                "none of its entries remain, so calls compute again" if not mine else
                f"its {plural(mine, 'entry', 'entries')} {'is' if mine == 1 else 'are'} used")
        return (f"casmon: the code of {name} matches a version cached before (first seen {when}), not the "
                f"one cached last: {used}; {rest}. {free}{changed}")
    return (f"casmon: the code of {name} (or of a function it calls, or a value it reads) changed since its "
            f"results were cached: this version has none yet, so calls compute again; {rest} (used again "
            f"if the code goes back). {free}{changed}")


def _entries_by_version(state: CacheState, vh: str) -> tuple[int | None, int | None, int | None, int]:
    """``(entries of version vh, entries of other versions, how many other versions, entries that do not
    say their version)``, one per key (entries written before casmon recorded versions say none);
    ``(None, None, None, 0)`` when the cache table is too large to read for a warning."""
    store = state.store
    if store.table(KIND).count() > VERSION_COUNT_MAX:
        return None, None, None, 0
    cleared = state.cleared_time(refresh=True)
    live = newest_per_key((k, r) for k, r in store.records(KIND, strict=False)
                          if r.get("fn") == state.name and r.get("time", 0) > cleared)
    mine, versions, others, unknown = 0, set(), 0, 0
    for _k, r in live.values():
        v = r.get("v")
        if v == vh:
            mine += 1
        elif v is None:
            unknown += 1
        else:
            others += 1
            versions.add(v)
    return mine, others, len(versions), unknown
