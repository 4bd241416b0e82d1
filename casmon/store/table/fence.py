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

A fence is checked (an xxh3 checksum of its body, :mod:`casmon.store.metafile`): one flipped bit in its
time or a name would hide records that were acknowledged. A fence that cannot be trusted fences nothing
(hiding no record is the safe side), gc refuses to sweep while the newest is damaged, ``verify`` names it and
``verify --repair`` supersedes it with a fence that fences nothing.

A record file that reaches the storage within ``LATE_MAX`` of its seal is never
late. A writer whose write took longer (by its own monotonic clock) writes the
same records again under a new name -- the same sequence number, a new seal
time -- after checking their values again; of the files that share a writer and
a number, readers take the newest only, so the records are never counted twice,
whichever of the two a gc fenced.
"""

from __future__ import annotations

import re
import time
from _weakref import ref as weak_ref  # weakref's own, without loading weakref.py on a hit
TYPE_CHECKING = False  # typing's flag without importing typing (~2 ms of a first hit)

from casmon.errors import DamagedObjectError, warn_damage
from casmon.plain import Plain
from casmon.store import metafile
from casmon.store.table.ranges import parse_name

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from casmon.store.backend import Backend

__all__ = ["FENCE_PREFIX", "Fence", "read", "read_all", "publish", "supersede", "sealed_at", "renamed", "visible"]


def __getattr__(name: str) -> object:
    if name in ("read_all", "publish", "supersede", "FENCES_KEPT"):  # gc, verify and repair: a reader never runs them
        from casmon.store.table import fence_gc

        return getattr(fence_gc, name)
    raise AttributeError(f"module 'casmon.store.table.fence' has no attribute {name!r}")


if TYPE_CHECKING:  # what type checkers see: the names loaded on first use, imported for real
    from casmon.store.table.fence_gc import FENCES_KEPT, publish, read_all, supersede

#: One fence per sweeping gc, ``gc/fence/{mark time ns:016x}-{id}``, written once: readers take the newest
#: name, so a fence whose PUT lands late (after a newer one) changes nothing.
FENCE_PREFIX = "gc/fence/"
#: The largest fence read: it names the old level-0 files of every table (about 40 bytes each).
FENCE_MAX = 16 << 20
_L0_NAME = re.compile(r"^[0-9a-f]{16}-")


class Fence(Plain):
    """What the last gc saw: its mark's start (seconds since the epoch), and the old files it saw, by table.

    ``damaged`` (``"key: reason"``) where the newest fence cannot be trusted: it then fences nothing (no
    record is hidden for it), and gc refuses to sweep until ``verify --repair`` supersedes it."""

    FIELDS = ("time", "seen", "damaged")
    time: float
    seen: dict[str, set[str]]
    damaged: str

    def __init__(self, time: float = 0.0, seen: dict[str, set[str]] | None = None, damaged: str = "") -> None:
        self.time, self.seen, self.damaged = time, {} if seen is None else seen, damaged

    def late(self, prefix: str, name: str) -> bool:
        """True if level-0 file ``name`` of table ``prefix`` landed after the gc that wrote this fence marked."""
        if self.time <= 0:  # no gc fenced (a seal time is never negative, nor LATE_MAX): gc's bounds stay unloaded
            return False
        from casmon.store import condemned  # gc's time bounds: only where a gc left a fence

        return sealed_at(name) < self.time - condemned.LATE_MAX and name not in self.seen.get(prefix, ())


def sealed_at(name: str) -> float:
    """The seal time in a level-0 file's name, in seconds since the epoch."""
    return int(name[:16], 16) / 1e9


def renamed(name: str, now_ns: int) -> str:
    """``name`` sealed again at ``now_ns``: the same writer and sequence number, a new time."""
    return f"{now_ns:016x}{name[16:]}"


def parse(key: str, data: bytes | bytearray | memoryview | npt.NDArray[np.uint8]) -> Fence:
    """The fence stored at ``key``; :class:`DamagedObjectError` naming it if it cannot be trusted.

    A fence carries an xxh3 checksum of its body: one flipped bit in its time or a name would hide every
    newer record, or one it saw. A fence without one (written by casmon before checksums) is read as
    fencing nothing -- the files it made late are read again (verify reports what they name that gc
    removed) -- until the next gc publishes a checked one."""
    # The newest name decides: a name that is not one gc writes, or is ahead of this host's clock, would go
    # on deciding whatever fences later gcs publish.
    tail = key[len(FENCE_PREFIX):] if key.startswith(FENCE_PREFIX) else ""
    if not _L0_NAME.match(tail):
        raise DamagedObjectError(key, "not a fence's name ({time_ns:016x}-{id})")
    named = sealed_at(tail)
    from casmon.store import condemned  # gc's time bounds: only where a gc left a fence

    if named > time.time() + condemned.MIN_GRACE:
        raise DamagedObjectError(key, f"its name's time ({named:.0f}) is ahead of this host's clock: it would "
                                      f"decide instead of every later gc's fence")
    body = metafile.load_object(data, key, limit=FENCE_MAX)
    if not metafile.checked(body, key):
        return Fence()
    t = metafile.number(body, "time", key, 0.0, 1e11)
    if t > time.time() + condemned.MIN_GRACE:
        raise DamagedObjectError(key, f"its time ({t:.0f}) is ahead of this host's clock: it would hide every "
                                      f"newer record")
    if t > 0 and abs(named - t) > 1e-3:  # gc names its fence by its time; a fence of 0 fences nothing
        raise DamagedObjectError(key, f"its time ({t:.3f}) is not its name's ({named:.3f})")
    seen_raw = body.get("seen", {})
    if not isinstance(seen_raw, dict):
        raise DamagedObjectError(key, "its 'seen' is not an object")
    seen: dict[str, set[str]] = {}
    for p, ns in seen_raw.items():
        if not isinstance(ns, list) or not all(isinstance(n, str) and _L0_NAME.match(n) for n in ns):
            raise DamagedObjectError(key, f"its 'seen' of {p[:80]!r} is not a list of level-0 file names")
        seen[p] = set(ns)
    return Fence(t, seen)


#: The newest fence read of a backend (fences are written once: a name is its content).
_cache: dict[int, tuple[weak_ref[Backend], str, Fence]] = {}


def _names(backend: Backend) -> list[str]:
    return sorted(k for k in backend.list(FENCE_PREFIX) if ".partial" not in k)


def read(backend: Backend) -> Fence:
    """The newest published fence; an empty one if there is none. A damaged one (see :func:`parse`) fences
    nothing -- hiding no record is the safe side -- and says so in ``damaged``, with a warning."""
    names = _names(backend)
    if not names:
        return Fence()
    newest = names[-1]
    got = _cache.get(id(backend))
    if got is not None and got[0]() is backend and got[1] == newest:
        return got[2]
    data = backend.get(newest)
    if data is None:
        return Fence()  # superseded and deleted meanwhile: the next listing finds the newer one
    try:
        fence = parse(newest, data)
    except DamagedObjectError as e:
        warn_damage(backend.url, newest, e.reason)
        fence = Fence(damaged=f"{newest}: {e.reason}")
    if len(_cache) > 64:
        _cache.clear()
    _cache[id(backend)] = (weak_ref(backend), newest, fence)
    return fence


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
