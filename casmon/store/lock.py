"""The store lock: one process at a time rewrites tables (gc, repair, eviction, merges); nothing waits for it.

Appending never needs it: writers add files of their own. But rewriting a
table -- merging its files into a generation, with or without dropping entries
-- must not run beside another rewrite of the same table: a merge that read the
files before gc dropped entries, and wrote its generation after, would bring the
dropped entries back. So every rewrite holds ``gc/lock``. gc, repair and cache
eviction wait for a writer's merge (a moment) and otherwise fail with an error
naming the holder. A writer's routine merge simply skips its turn when the lock
is held.

The lock is a file created with create-if-absent (race-free on local folders
and S3) holding who took it; the taker reads it back to know it won. A holder
that died is taken over: at once when it ran on this host and its process is
gone, otherwise once the lock is older than its kind's limit. Of the takers
that find the same dead lock, only the one that creates
``gc/lock-broken/<hash of the dead lock>-<n>`` deletes it, and only while
``gc/lock`` still holds those bytes: a taker that deleted whatever ``gc/lock``
held by the time it got round to it could delete a lock another taker had just
taken, and two processes would hold it. The claim is deleted once the lock is
broken; ``n`` is 0, or one more than a claim whose taker died or is more than a
minute old (a taker killed mid-break leaves its claim: gc deletes it after a day).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Iterator
from typing import Any

import xxhash

from casmon.store.backend import Backend
from casmon.errors import StoreError

__all__ = ["LOCK_KEY", "StoreLock", "held", "forget_old_breaks"]

LOCK_KEY = "gc/lock"
#: Claims to break a dead lock; one a killed taker left is deleted by gc after a day.
BREAK_PREFIX = "gc/lock-broken/"
BREAK_KEEP = 24 * 3600.0
#: A claim to break a dead lock older than this (seconds) is a dead taker's: breaking takes milliseconds.
CLAIM_STALE = 60.0
_CLAIMS_MAX = 64
#: After this many seconds a lock of that kind is taken over even if its host cannot tell the holder died.
STALE_AFTER = {"merge": 600.0}
STALE_DEFAULT = 6 * 3600.0
#: gc, repair and eviction wait this long (seconds) for a writer's merge to finish before giving up.
MERGE_WAIT = 120.0


class StoreLock:
    """``gc/lock`` on one backend, taken for ``what`` (``"gc"``, ``"repair"``, ``"merge"``, ...)."""

    def __init__(self, backend: Backend, what: str) -> None:
        self.backend = backend
        self.what = what
        self._mine: bytes | None = None
        self.holder: dict[str, Any] = {}

    def acquire(self, break_lock: bool = False) -> bool:
        """Take the lock if it is free (or its holder died); never waits. False if someone holds it."""
        mine = json.dumps({"what": self.what, "host": socket.gethostname(), "pid": os.getpid(),
                           "time": time.time(), "nonce": os.urandom(8).hex()}).encode()
        for _attempt in range(40):
            self.backend.create(LOCK_KEY, mine)
            got = self.backend.get(LOCK_KEY)
            if got is not None and bytes(got) == mine:
                self._mine = mine
                return True
            if got is None:
                continue  # released meanwhile: try again
            taken = bytes(got)
            try:
                info = json.loads(taken)
                if not isinstance(info, dict):
                    raise ValueError("not an object")
            except ValueError:
                info = {}
            self.holder = info
            if break_lock:  # the user said the holder is dead
                self.backend.delete(LOCK_KEY)
                continue
            if not info or _dead(info):
                if not self._break(taken, mine):
                    time.sleep(0.01)  # another taker is breaking it: see what it leaves
                continue
            return False
        return False

    def _break(self, dead: bytes, mine: bytes) -> bool:
        """Delete the dead lock ``dead`` if this taker is the one to break it (see the module doc).
        False while another live taker is breaking it."""
        base = BREAK_PREFIX + xxhash.xxh3_128_hexdigest(dead)
        for n in range(_CLAIMS_MAX):
            key = f"{base}-{n}"
            self.backend.create(key, mine)
            got = self.backend.get(key)
            if got is None:
                continue  # forgotten meanwhile (gc): claim the next number
            won = bytes(got)
            if won != mine:
                if _claim_dead(won):
                    continue
                return False
            now = self.backend.get(LOCK_KEY)
            if now is not None and bytes(now) == dead:  # only this claim's taker deletes these bytes now
                self.backend.delete(LOCK_KEY)
            # Done: a taker that claims this number later finds gc/lock no longer holds ``dead``
            # (a live lock's bytes are unique; the same garbage again is dead again).
            self.backend.delete(key)
            return True
        return False

    def release(self) -> None:
        if self._mine is None:
            return
        got = self.backend.get(LOCK_KEY)
        if got is not None and bytes(got) == self._mine:
            self.backend.delete(LOCK_KEY)
        self._mine = None

    def describe(self) -> str:
        h = self.holder
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(h.get("time", 0) or 0)))
        return f"{h.get('what', 'gc')} (pid {h.get('pid')} on {h.get('host')}, since {since})"


def _dead(info: dict[str, Any]) -> bool:
    return _gone(info, STALE_AFTER.get(str(info.get("what")), STALE_DEFAULT))


def _claim_dead(data: bytes) -> bool:
    """A claim to break a lock whose taker died (on this host) or that is older than CLAIM_STALE."""
    try:
        info = json.loads(data)
    except ValueError:
        return True
    return not isinstance(info, dict) or _gone(info, CLAIM_STALE)


def _gone(info: dict[str, Any], limit: float) -> bool:
    """Older than ``limit`` seconds, or taken by a process of this host that is gone."""
    try:
        if time.time() - float(info.get("time", 0)) > limit:
            return True
    except (TypeError, ValueError):
        return True
    if info.get("host") == socket.gethostname():
        try:
            os.kill(int(info["pid"]), 0)
        except ProcessLookupError:
            return True
        except (PermissionError, KeyError, ValueError, TypeError, OverflowError):
            return False
    return False


def forget_old_breaks(backend: Backend, keep: float = BREAK_KEEP) -> int:
    """Delete claims killed takers left, once older than ``keep`` seconds (call it holding the lock)."""
    keys = [k for k in backend.list(BREAK_PREFIX) if ".partial" not in k]
    gone = 0
    for k, data in zip(keys, backend.get_many(keys) if keys else []):
        try:
            t = float(json.loads(bytes(data)).get("time", 0)) if data is not None else 0.0
        except (ValueError, TypeError, AttributeError):
            t = 0.0
        if time.time() - t > keep:
            backend.delete(k)
            gone += 1
    return gone


@contextlib.contextmanager
def held(backend: Backend, what: str, url: str = "", break_lock: bool = False) -> Iterator[StoreLock]:
    """Hold the store lock for ``what``; :class:`StoreError` naming the holder if another live process has it."""
    lock = StoreLock(backend, what)
    deadline = time.monotonic() + MERGE_WAIT
    while not lock.acquire(break_lock=break_lock):
        if lock.holder.get("what") == "merge" and time.monotonic() < deadline:
            time.sleep(0.05)  # a writer's merge takes a moment: wait for it rather than fail
            continue
        raise StoreError(f"{url or backend.url}: another {lock.describe()} is rewriting the store; "
                         f"try again later, or, if it died, `casmon gc --break-lock`")
    try:
        yield lock
    finally:
        lock.release()
