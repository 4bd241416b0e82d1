"""Fences as gc publishes them and verify and repair check and supersede them (:mod:`.fence` says what a
fence is; readers load only that module).
"""

from __future__ import annotations

import os
import time
TYPE_CHECKING = False  # typing's flag without importing typing

from casmon.errors import DamagedObjectError
from casmon.store import condemned, metafile
from casmon.store.table.fence import FENCE_PREFIX, _names, parse, sealed_at

if TYPE_CHECKING:
    from casmon.store.backend import Backend

__all__ = ["FENCES_KEPT", "publish", "read_all", "supersede"]

#: Older fences gc keeps (the newest always decides).
FENCES_KEPT = 4


def read_all(backend: Backend) -> list[tuple[str, str]]:
    """``(key, reason)`` of every damaged fence (verify)."""
    names = _names(backend)
    out = []
    for k, data in zip(names, backend.get_many(names) if names else []):
        if data is None:
            continue
        try:
            parse(k, data)
        except DamagedObjectError as e:
            out.append((k, e.reason))
    return out


def _write(backend: Backend, mark_time: float, body: dict[str, object], after: str = "") -> str:
    """Publish ``body`` as a fence named by ``mark_time`` (or just after ``after``, if that sorts later)."""
    ns = int(mark_time * 1e9)
    if after:
        try:
            later = int(after[len(FENCE_PREFIX) :][:16], 16) + 1
        except ValueError:
            later = 0
        if later / 1e9 <= time.time() + condemned.MIN_GRACE:  # never after one named in the future (damaged)
            ns = max(ns, later)
    name = f"{FENCE_PREFIX}{ns:016x}-{os.urandom(6).hex()}"
    backend.create(name, metafile.seal(body))
    return name


def publish(backend: Backend, mark_time: float, listed: dict[str, list[str]]) -> None:
    """Write the fence of a gc whose mark began at ``mark_time`` and listed ``listed`` (table -> level-0
    names), and delete fences older than the last few."""
    limit = mark_time - condemned.LATE_MAX
    seen = {p: sorted(n for n in names if sealed_at(n) < limit) for p, names in listed.items()}
    name = _write(backend, mark_time, {"time": mark_time, "seen": {p: ns for p, ns in seen.items() if ns}})
    old = sorted(k for k in backend.list(FENCE_PREFIX) if ".partial" not in k and k < name)
    if len(old) > FENCES_KEPT:
        backend.delete_many(old[:-FENCES_KEPT])


def supersede(backend: Backend, damaged: list[str]) -> str | None:
    """(Repair, holding the lock.) Delete the ``damaged`` fences; where the newest is one of them, first publish
    a newer fence that fences nothing -- what the damaged one already meant, made sound. Returns its key."""
    names = _names(backend)
    name = None
    if names and names[-1] in damaged:
        name = _write(backend, time.time(), {"time": 0.0, "seen": {}}, after=names[-1])
    backend.delete_many([k for k in damaged if k != name])  # an older one decides nothing
    return name
