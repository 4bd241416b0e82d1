"""Fencing late writes: a record file that lands after gc marked without it is not a record.

A writer checks the values a record names (stored, condemned by no list) and
then writes the record; gc's protocol (docs/RELIABILITY.md, I3) needs the record
visible soon after that check. Nothing bounds how long a request spends in
flight: a PUT held by a proxy, a retry that lands after the client gave up, a
writer stopped between writing a file and linking it into place. Such a file
can land after gc swept a value it names.

So each level-0 file carries its seal time in its name
(``{time_ns:016x}-{writer}-{seq}``), and every gc, after its mark and before it
sweeps, publishes a **fence** (``gc/fence/{time}-{id}``, written once; readers
take the newest): the time its mark began, and the
names of the level-0 files it saw that were sealed more than
:data:`~casmon.store.condemned.LATE_MAX` before that. A level-0 file sealed more
than ``LATE_MAX`` before the fence's time that the fence does not name landed
after that gc's mark: it is **late**, and every reader (gc's mark, verify,
repair, merges) lists past it as if it were not there; merges delete it. The
judgement uses only names and the fence's contents, so it survives copying a
store (which resets every file's times).

A record file that reaches the storage within ``LATE_MAX`` of its seal is never
late. A writer whose write took longer (by its own monotonic clock) writes the
same records again under a new name -- the same sequence number, a new seal
time -- after checking their values again; of the files that share a writer and
a number, readers take the newest only, so the records are never counted twice,
whichever of the two a gc fenced.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

from casmon.plain import Plain
from casmon.store import condemned
from casmon.store.table.ranges import parse_name

if TYPE_CHECKING:
    from casmon.store.backend import Backend

__all__ = ["FENCE_PREFIX", "Fence", "read", "publish", "sealed_at", "renamed", "visible"]

#: One fence per sweeping gc, ``gc/fence/{mark time ns:016x}-{id}``, written once: readers take the newest
#: name, so a fence whose PUT lands late (after a newer one) changes nothing.
FENCE_PREFIX = "gc/fence/"
#: Older fences gc keeps (the newest always decides).
FENCES_KEPT = 4


class Fence(Plain):
    """What the last gc saw: its mark's start (seconds since the epoch), and the old files it saw, by table."""

    FIELDS = ("time", "seen")
    time: float
    seen: dict[str, set[str]]

    def __init__(self, time: float = 0.0, seen: dict[str, set[str]] | None = None) -> None:
        self.time, self.seen = time, {} if seen is None else seen

    def late(self, prefix: str, name: str) -> bool:
        """True if level-0 file ``name`` of table ``prefix`` landed after the gc that wrote this fence marked."""
        return sealed_at(name) < self.time - condemned.LATE_MAX and name not in self.seen.get(prefix, ())


def sealed_at(name: str) -> float:
    """The seal time in a level-0 file's name, in seconds since the epoch."""
    return int(name[:16], 16) / 1e9


def renamed(name: str, now_ns: int) -> str:
    """``name`` sealed again at ``now_ns``: the same writer and sequence number, a new time."""
    return f"{now_ns:016x}{name[16:]}"


_cache: dict[tuple[int, str], Fence] = {}


def read(backend: Backend) -> Fence:
    """The newest published fence; an empty one if there is none or it cannot be parsed (nothing is late then)."""
    names = sorted(k for k in backend.list(FENCE_PREFIX) if ".partial" not in k)
    if not names:
        return Fence()
    newest = names[-1]
    got = _cache.get((id(backend), newest))
    if got is not None:
        return got
    data = backend.get(newest)
    if data is None:
        return Fence()
    try:
        raw = json.loads(bytes(data))
        fence = Fence(float(raw["time"]), {str(p): set(map(str, ns)) for p, ns in dict(raw.get("seen", {})).items()})
    except (ValueError, TypeError, KeyError, AttributeError):
        return Fence()  # damaged: fence nothing rather than hide records
    if len(_cache) > 64:
        _cache.clear()
    _cache[(id(backend), newest)] = fence
    return fence


def publish(backend: Backend, mark_time: float, listed: dict[str, list[str]]) -> None:
    """Write the fence of a gc whose mark began at ``mark_time`` and listed ``listed`` (table -> level-0
    names), and delete fences older than the last few."""
    limit = mark_time - condemned.LATE_MAX
    seen = {p: sorted(n for n in names if sealed_at(n) < limit) for p, names in listed.items()}
    body = {"time": mark_time, "seen": {p: ns for p, ns in seen.items() if ns}}
    name = f"{FENCE_PREFIX}{int(mark_time * 1e9):016x}-{os.urandom(6).hex()}"
    backend.create(name, json.dumps(body, separators=(",", ":")).encode())
    old = sorted(k for k in backend.list(FENCE_PREFIX) if ".partial" not in k and k < name)
    if len(old) > FENCES_KEPT:
        backend.delete_many(old[:-FENCES_KEPT])


def visible(prefix: str, names: list[str], fence: Fence) -> tuple[list[str], list[str]]:
    """``(visible, hidden)``: the level-0 names readers read, and those they list past (late, or superseded by
    a newer file of the same writer and number)."""
    newest: dict[tuple[str, int], str] = {}
    for n in names:
        if fence.late(prefix, n):
            continue
        k = parse_name(n)
        if k not in newest or n > newest[k]:  # the time prefix is fixed-width hex: later sorts higher
            newest[k] = n
    keep = set(newest.values())
    shown = [n for n in names if n in keep]
    return shown, [n for n in names if n not in keep]
