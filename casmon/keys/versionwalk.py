"""What keeps a code-version walk bounded on a thread: the versions it is computing now (a cycle back
to one gets its name, never a re-entry), and a fresh stack when versions nest deep (a chain of classes
each holding an instance of the next), so no chain meets the recursion limit."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["busy", "nested", "NEST_PER_STACK"]

T = TypeVar("T")

#: Versions computed one inside another on one thread's stack before the walk goes on on a new thread's
#: (each level is about 15 frames).
NEST_PER_STACK = 16

_local = threading.local()


def busy() -> set[int]:
    """Ids of the objects (and their trackers) whose versions this thread's walk is computing now."""
    b: set[int] | None = getattr(_local, "busy", None)
    if b is None:
        b = _local.busy = set()
    return b


def nested(fn: Callable[[], T]) -> T:
    """``fn()`` one level deeper in the walk: on this thread while its stack has room, else on a new thread
    that shares this walk's :func:`busy` set (this one waits for it: the walk is the same, on another stack)."""
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
    shared = busy()
    box: dict[str, Any] = {}

    def run() -> None:
        _local.busy = shared
        _local.depth = 1
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - raised again on the waiting thread
            box["error"] = e

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
