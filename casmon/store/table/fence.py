"""Fencing late writes: a record file that lands long after it was sealed is not a record.

A writer checks the values a record names (stored, condemned by no list) and
then writes the record; gc's protocol (docs/RELIABILITY.md, I3) needs the record
visible soon after that check. But nothing bounds how long a request spends in
flight: a PUT held by a proxy, a retry that lands after the client gave up, a
writer stopped between writing a file and renaming it into place. Such a file
can land after gc swept a value it names.

So a level-0 file carries its seal time in its name (``{time_ns:016x}-...``)
and the medium says when it landed (a local file's ctime, S3's LastModified).
A file that landed more than :data:`~casmon.store.condemned.LATE_MAX` after its
seal is **late**: every reader lists past it, as if it were not there, and
merges delete it. Its writer either never saw its write succeed (the flush
failed or the process died: the records were never acknowledged) or sees it
now: after a slow write it reads the landing time back, and if the file is
late it checks the values again under a fresh view and writes the same
records under a new name (same sequence number, new seal time). Writer and
readers judge by the same two stored times, so they agree on every file.
"""

from __future__ import annotations

from casmon.store import condemned

__all__ = ["sealed_at", "is_late", "renamed"]


def sealed_at(name: str) -> float:
    """The seal time in a level-0 file's name, in seconds since the epoch."""
    return int(name[:16], 16) / 1e9


def is_late(name: str, landed: float) -> bool:
    """True if a level-0 file that landed at ``landed`` is late (see the module doc)."""
    return landed - sealed_at(name) > condemned.LATE_MAX


def renamed(name: str, now_ns: int) -> str:
    """``name`` sealed again at ``now_ns``: the same writer and sequence number, a new time."""
    return f"{now_ns:016x}{name[16:]}"
