"""Condemned lists: what gc will delete, published before it deletes, so writers can keep away from it.

gc never deletes an object the moment it finds it unreachable. It first
*condemns* it: it writes a list ``gc/condemned/{name}`` of every unreachable
object and where it lives (its loose file, its pack entries). Only a later gc
run, at least ``grace`` seconds after the list was written, deletes what the
list names and is still unreachable, and only at the locations the list names;
then it deletes the list.

A writer lists ``gc/condemned/`` at least every :data:`VIEW_MAX` seconds while
it writes. It never deduplicates against a condemned object: it writes a new
copy at a new location (a new pack entry), which no list names. That, and the
rule that a record becomes visible at most :data:`MIN_GRACE` seconds after the
writer last checked the objects it names, is what makes gc safe beside writers;
docs/RELIABILITY.md gives the argument.

A list's format is :mod:`casmon.store.condemnedlist`'s (reached here as ``encode``, ``decode``,
``CondemnedList``, ``new_name``); this module holds the protocol's time bounds.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing's flag without importing typing (~2 ms of a first hit)

from casmon.errors import env_seconds

if TYPE_CHECKING:
    from typing import Any

    from casmon.store.condemnedlist import _MAGIC, _U32, CondemnedList, decode, encode, new_name

__all__ = ["MIN_GRACE", "VIEW_MAX", "RELY_MAX", "LATE_MAX", "PREFIX", "CondemnedList", "encode", "decode", "new_name"]

#: The shortest grace period ``gc`` accepts, in seconds (``gc --now`` aside, which is for stores no one
#: else writes to). Writers keep their side of the protocol within it. Tests shorten it through the
#: environment; every process that writes to one store must agree on it.
MIN_GRACE = env_seconds("CASMON_MIN_GRACE", 60.0)
#: A writer lists the condemned objects at least this often while it writes (seconds).
VIEW_MAX = MIN_GRACE / 6
#: When a flush seals a record, every object it names was checked (stored, not condemned) at most
#: this long ago, or it is checked again then; and the record is written at most ``WRITE_MAX`` after
#: it was sealed, or checked again. RELY_MAX + WRITE_MAX + VIEW_MAX < MIN_GRACE.
RELY_MAX = MIN_GRACE / 3
WRITE_MAX = MIN_GRACE / 6
#: A writer that has not looked for longer than this may have missed a whole list: it forgets
#: everything it believed stored.
GAP_MAX = MIN_GRACE / 2
#: A record file sealed more than this long before a gc's mark that the mark did not see is not a
#: record (:mod:`casmon.store.table.fence`); a writer whose write took over half of it writes the records
#: again. RELY_MAX + LATE_MAX < MIN_GRACE, with the rest to spare for the clocks of writers and gc.
LATE_MAX = MIN_GRACE / 3


def configure(min_grace: float) -> None:
    """Set :data:`MIN_GRACE` and the writer bounds derived from it (tests; every process of a store must agree)."""
    global MIN_GRACE, VIEW_MAX, RELY_MAX, WRITE_MAX, GAP_MAX, LATE_MAX
    MIN_GRACE = float(min_grace)
    VIEW_MAX, RELY_MAX, WRITE_MAX, GAP_MAX = MIN_GRACE / 6, MIN_GRACE / 3, MIN_GRACE / 6, MIN_GRACE / 2
    LATE_MAX = MIN_GRACE / 3


PREFIX = "gc/condemned/"

#: A list's format (:mod:`casmon.store.condemnedlist`), loaded by the first list read or written: a writer
#: needs only the bounds above until gc has published a list, and a hit none of it.
_LIST_NAMES = frozenset({"CondemnedList", "encode", "decode", "new_name", "_MAGIC", "_U32"})


def __getattr__(name: str) -> Any:
    if name in _LIST_NAMES:
        from casmon.store import condemnedlist

        value = getattr(condemnedlist, name)
        globals()[name] = value  # the next lookup is a plain attribute
        return value
    raise AttributeError(f"module 'casmon.store.condemned' has no attribute {name!r}")
