"""What keeps a code-version walk bounded and its versions the same whatever asks first.

A version that reaches a version being computed now (a class whose values hold its instances, two
classes holding each other's) gets its name there, never a re-entry. Versions that reach each other
form a cycle (a strongly connected component, found as Tarjan's algorithm finds them): each member's
own digest names its cycle mates, and its version is that digest with all the members' own digests,
so no member's version depends on which one the walk met first. A member records its mates' final
versions, so one computed again alone (the cycle since broken, then edited) makes the others computed
again too, never kept with the cycle's old digest. Versions nested deep (a chain of
classes each holding an instance of the next) go on on a fresh thread's stack, so no chain meets the
recursion limit.
"""

from __future__ import annotations

import sys
import _thread  # threading's locks, without loading threading on a hit
from collections.abc import Callable
TYPE_CHECKING = False  # typing's flag without importing typing (~2 ms of a first hit)
if TYPE_CHECKING:
    from typing import Any, TypeVar

from casmon.keys.digest import Digest
from casmon.keys.fingerprint import fingerprint

__all__ = ["Walk", "current", "nested", "final_versions", "NEST_PER_STACK"]

if TYPE_CHECKING:
    T = TypeVar("T")

#: Versions computed one inside another on one thread's stack before the walk goes on on a new thread's
#: (each level is about 15 frames).
NEST_PER_STACK = 16

_local = _thread._local()


class Walk:
    """One thread's versions being computed, and those computed whose cycle is still open."""

    __slots__ = ("busy", "index", "low", "path", "pending", "count")

    def __init__(self) -> None:
        self.busy: set[int] = set()  # ids of their trackers: a version depending on one is computed again here
        self.index: dict[int, int] = {}  # id of the object -> its order on the walk
        self.low: dict[int, int] = {}  # id of the object -> the earliest version on the walk it reaches
        self.path: list[int] = []  # ids of the objects being computed, innermost last
        self.pending: list[tuple[int, Any, Any]] = []  # (id of object, tracker, result) of open cycles
        self.count = 0

    def seen(self, oid: int) -> bool:
        return oid in self.index

    def met(self, oid: int) -> None:
        """The version being computed reaches ``oid``'s, which is on the walk: they are one cycle."""
        if self.path:
            top = self.path[-1]
            self.low[top] = min(self.low[top], self.index[oid])

    def enter(self, oid: int, tracker: Any) -> int:
        self.index[oid] = self.low[oid] = self.count
        self.count += 1
        self.path.append(oid)
        self.busy.add(id(tracker))
        return len(self.pending)

    def leave(self, oid: int, tracker: Any, mark: int, result: Any) -> list[tuple[Any, Any]] | None:
        """``[(tracker, result)]`` of the cycle ``oid`` closes (itself alone if it is in none); None while its
        cycle is open (a version further up reaches it and it reaches that one)."""
        self.path.pop()
        low = self.low[oid]
        if self.path:
            up = self.path[-1]
            self.low[up] = min(self.low[up], low)
        if low < self.index[oid]:
            self.pending.append((oid, tracker, result))
            return None
        members = [(oid, tracker, result)] + self.pending[mark:]
        del self.pending[mark:]
        for m_oid, m_tracker, _r in members:
            self._forget(m_oid, m_tracker)
        return [(t, r) for _o, t, r in members]

    def abandon(self, oid: int, tracker: Any, mark: int) -> None:
        """The walk of ``oid`` failed: it and the open versions it started are off the walk."""
        if self.path and self.path[-1] == oid:
            self.path.pop()
        for m_oid, m_tracker, _r in self.pending[mark:]:
            self._forget(m_oid, m_tracker)
        del self.pending[mark:]
        self._forget(oid, tracker)

    def _forget(self, oid: int, tracker: Any) -> None:
        self.index.pop(oid, None)
        self.low.pop(oid, None)
        self.busy.discard(id(tracker))


def final_versions(cycle: list[tuple[Any, Digest]]) -> dict[int, Digest]:
    """``{id(tracker): version}`` of a closed cycle's ``(tracker, own digest)``: a version is its own digest; in
    a cycle of several, with all the members' own digests (in no order the walk chose)."""
    if len(cycle) == 1:
        return {id(cycle[0][0]): cycle[0][1]}
    mates = sorted(bytes(own) for _t, own in cycle)
    return {id(t): fingerprint(("casmon.version.scc", bytes(own), mates)) for t, own in cycle}


def current() -> Walk:
    """This thread's walk."""
    w: Walk | None = getattr(_local, "walk", None)
    if w is None:
        w = _local.walk = Walk()
    return w


def nested(fn: Callable[[], T]) -> T:
    """``fn()`` one level deeper in the walk: on this thread while its stack has room, else on a new thread
    that shares this walk (this one waits for it: the walk is the same, on another stack)."""
    depth: int = getattr(_local, "depth", 0)
    if depth < NEST_PER_STACK and (depth or _stack_depth() < sys.getrecursionlimit() // 2):
        _local.depth = depth + 1
        try:
            return fn()
        finally:
            _local.depth = depth
    return _on_fresh_stack(fn)


def _stack_depth() -> int:
    n = 0
    f: Any = sys._getframe()
    while f is not None:
        n += 1
        f = f.f_back
    return n


def _on_fresh_stack(fn: Callable[[], T]) -> T:
    shared = current()
    box: dict[str, Any] = {}

    def run() -> None:
        _local.walk = shared
        _local.depth = 1
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - raised again on the waiting thread
            box["error"] = e

    import threading  # a thread's: a hit starts none

    t = threading.Thread(target=run, name="casmon-version-walk", daemon=True)
    try:
        t.start()
    except RuntimeError:  # no new threads (the interpreter is shutting down): this stack it is
        return fn()
    t.join()
    if "error" in box:
        raise box["error"]
    result: T = box["value"]
    return result
