"""The call log's record format: record kinds, the cells that hold values, and its repair.

One place for what a call record means, so the writer, the reader and
``casmon import`` (which writes callmonitor's calls as casmon's) agree on it: a
small JSON scalar is kept inline in a record (a *cell* is the value itself), any
other value is stored and the cell is ``{"$": digest}``, a value that could not be
stored is ``{"!": type name, "why": reason}``, and a result not recorded is
:data:`NOT_RECORDED`.
"""

from __future__ import annotations

from typing import Any

from casmon.keys.names import keep_flat_names
from casmon.keys.digest import Digest

__all__ = ["KIND_CALLS", "KIND_SESSION", "KIND_CALLFN", "SESSION_REFS", "INLINE_STR", "INLINE_INT_BITS", "SCALARS", "NOT_RECORDED",
           "NotStored", "type_name", "salvage_calls"]

KIND_CALLS = "calls"  # batches of calls, one record per flush and session
KIND_SESSION = "session"  # one record per session, keyed by its number
KIND_CALLFN = "callfn"  # a function's signature and defaults, per session
SESSION_REFS = "calllog/sessions"  # refs {SESSION_REFS}/{n:06d} claim session numbers
#: Strings up to this many characters are kept inline in a record; longer ones are stored.
INLINE_STR = 256
#: The types kept inline in a record (JSON scalars).
#: Ints of more bits than this are stored as values, not kept in the record: JSON writes an int of over 4,300
#: digits nowhere (Python's int-to-str limit), and the whole batch of calls would fail with it.
INLINE_INT_BITS = 4096
SCALARS = frozenset((type(None), bool, int, float, str))
NOT_RECORDED = {"-": "not recorded"}  # the result cell of intercept(result=False)


class NotStored:
    """Stands in for an argument or result that could not be stored."""

    def __init__(self, type_name: str, reason: str = "") -> None:
        self.type_name = type_name
        self.reason = reason

    def __repr__(self) -> str:
        return f"<not stored: {self.type_name}{' (' + self.reason + ')' if self.reason else ''}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NotStored) and (other.type_name, other.reason) == (self.type_name, self.reason)

    def __hash__(self) -> int:
        return hash((self.type_name, self.reason))


def type_name(v: Any) -> str:
    """A value's type as cells and warnings name it: ``int`` for builtins, else ``module.qualname``."""
    t = type(v)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


# -- repair: keep the calls whose values are intact ------------------------------------------


def salvage_calls(batch: dict, bad: set) -> dict | None:
    """A batch of calls without the calls that need a lost value (``bad``); None if none is left.

    ``verify --repair`` (and a flush that finds a value gone) use it, so one lost
    argument costs the calls that passed it, not the ~1,000 calls of its batch.
    """
    lost = {Digest(d).hex() for d in bad}

    def needs(cell: Any) -> bool:
        return isinstance(cell, dict) and cell.get("$") in lost

    def keep(row: Any) -> bool:
        if not isinstance(row, list) or len(row) != 9:
            return False
        a, k, res = row[5], row[6], row[7]
        cells = [*(a if isinstance(a, list) else [a]), *(k.values() if isinstance(k, dict) else [k]), res]
        return not any(needs(c) for c in cells)

    rows = batch.get("c")
    if not isinstance(rows, list):
        return None
    kept = [row for row in rows if keep(row)]
    if not kept:
        return None
    out = dict(batch, c=kept)
    refs = batch.get("_refs", [])
    out["_refs"] = [h for h in refs if h not in lost] if isinstance(refs, list) else []
    return out


# Pickles and keys name these types where they were before the packages (casmon/keys/names.py).
keep_flat_names([NotStored])
