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
and S3) holding who took it and a random token; the taker reads it back to
know it won. A create whose reply was lost (the lock may have landed) is
followed by that read too, and a taker that cannot finish deletes the lock if
it holds its token: no lost reply leaves a lock nobody holds.

**Leases.** A holder renews a lease while it holds the lock: every
:data:`RENEW_EVERY` seconds it writes ``gc/lock-lease/<token>`` (its own key:
it never rewrites ``gc/lock``, which a taker may have replaced). A lock whose
lease was last renewed more than :data:`LEASE` seconds ago is dead, whatever
host, PID namespace or process wrote it; so is one whose process is gone when
the taker runs on the same machine -- same host name, same boot, same PID
namespace, and a process of that PID started at the same moment (a container
sharing the host's name, or a reused PID, is not "the same process"). A holder
that finds the lock no longer holds its token has lost it (:attr:`StoreLock.lost`):
gc checks before it deletes anything.

Of the takers that find the same dead lock, only the one that creates
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
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import xxhash

from casmon.errors import DamagedObjectError, StoreError, env_seconds
from casmon.store import metafile
from casmon.store.backend import Backend

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = ["LOCK_KEY", "StoreLock", "held", "forget_old_breaks", "machine", "process_gone", "process_start", "HEARTBEAT_S",
           "heartbeat_seconds"]

LOCK_KEY = "gc/lock"
#: A holder's lease, renewed while it holds the lock: ``gc/lock-lease/<token>``.
LEASE_PREFIX = "gc/lock-lease/"
#: A lock whose lease was not renewed for this many seconds is dead (``CASMON_LOCK_LEASE``; tests shorten it).
LEASE = env_seconds("CASMON_LOCK_LEASE", 120.0)
RENEW_EVERY = LEASE / 6
#: The longest lease a lock may name: a longer one (damage, a crafted lock) is cut to this.
LEASE_MAX = max(LEASE, 3600.0)
#: Claims to break a dead lock; one a killed taker left is deleted by gc after a day.
BREAK_PREFIX = "gc/lock-broken/"
BREAK_KEEP = 24 * 3600.0
#: A claim to break a dead lock older than this (seconds) is a dead taker's: breaking takes milliseconds.
CLAIM_STALE = 60.0
_CLAIMS_MAX = 64
_INFO_MAX = 64 << 10  # a lock, lease or claim: a few hundred bytes
#: Locks without a lease (written by casmon before leases): taken over after this many seconds.
STALE_AFTER = {"merge": 600.0}
STALE_DEFAULT = 6 * 3600.0
#: Seconds between the heartbeats of a live run or a compute claim unless ``CASMON_HEARTBEAT_S`` says otherwise.
HEARTBEAT_S = 15.0
#: gc, repair and eviction wait this long (seconds) for a writer's merge to finish before giving up.
MERGE_WAIT = 120.0


def heartbeat_seconds() -> float:
    """``CASMON_HEARTBEAT_S`` (seconds, at least 0.1), else :data:`HEARTBEAT_S`."""
    raw = os.environ.get("CASMON_HEARTBEAT_S", "").strip()
    if not raw:
        return HEARTBEAT_S
    try:
        v = float(raw)
    except ValueError:
        raise ValueError(f"CASMON_HEARTBEAT_S must be a number of seconds, got {raw!r}") from None
    if not 0.1 <= v <= 86400:
        raise ValueError(f"CASMON_HEARTBEAT_S must be between 0.1 and 86400 seconds, got {raw!r}")
    return v


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def _info(data: bytes | bytearray | memoryview | npt.NDArray[np.uint8], key: str) -> dict[str, Any]:
    """A lock, lease or claim as a dict; ``{}`` if it is damaged (see :func:`damaged_files`)."""
    try:
        return metafile.load_object(data, key, limit=_INFO_MAX)
    except DamagedObjectError:
        return {}


def damaged_files(backend: Backend) -> list[tuple[str, str]]:
    """``(key, reason)`` of the lock, leases and lock-break claims that are not readable (verify): each counts
    as a dead holder's (a lock's lease is over), never a live one's and never an error."""
    keys = [k for k in [LOCK_KEY, *backend.list(LEASE_PREFIX), *backend.list(BREAK_PREFIX)] if ".partial" not in k]
    out = []
    for k, data in zip(keys, backend.get_many(keys)):
        if data is None:
            continue
        try:
            metafile.load_object(data, k, limit=_INFO_MAX)
        except DamagedObjectError as e:
            out.append((k, e.reason))
    return out


def process_start(pid: int) -> str:
    """When process ``pid`` started (clock ticks since boot, from /proc), "" where that cannot be read."""
    stat = _read(f"/proc/{pid}/stat")
    try:
        return stat[stat.rindex(")") + 2 :].split()[19]
    except (ValueError, IndexError):
        return ""


def machine() -> dict[str, str]:
    """What tells this process's machine and PID namespace from others that share its host name."""
    try:
        ns = os.readlink("/proc/self/ns/pid")
    except OSError:
        ns = ""
    import socket  # 5-7 ms to import: only when a lock or claim is taken

    return {"host": socket.gethostname(), "boot": _read("/proc/sys/kernel/random/boot_id"), "pidns": ns}


class StoreLock:
    """``gc/lock`` on one backend, taken for ``what`` (``"gc"``, ``"repair"``, ``"merge"``, ...)."""

    def __init__(self, backend: Backend, what: str) -> None:
        self.backend = backend
        self.what = what
        self._mine: bytes | None = None
        self._token = ""
        self.holder: dict[str, Any] = {}
        #: True once this holder found the lock taken over (its lease ran out while it was stopped).
        self.lost = False
        self._renewer: threading.Thread | None = None
        self._stop = threading.Event()

    def acquire(self, break_lock: bool = False) -> bool:
        """Take the lock if it is free (or its holder died); never waits. False if someone holds it."""
        token = os.urandom(8).hex()
        mine = json.dumps({"what": self.what, **machine(), "pid": os.getpid(), "start": process_start(os.getpid()),
                           "time": time.time(), "lease": LEASE, "nonce": token}).encode()
        for _attempt in range(40):
            try:
                self.backend.create(LOCK_KEY, mine)
                got = self.backend.get(LOCK_KEY)
            except BaseException:
                self._undo(mine)  # a lost reply: the lock may be there, with this taker's token
                raise
            if got is not None and bytes(got) == mine:
                self._mine, self._token, self.lost = mine, token, False
                self._start_renewing()
                return True
            if got is None:
                continue  # released meanwhile: try again
            taken = bytes(got)
            info = _info(taken, LOCK_KEY)  # {} if damaged: a dead holder's, broken at once
            self.holder = info
            if break_lock:  # the user said the holder is dead
                self.backend.delete(LOCK_KEY)
                continue
            if not info or _dead(info, self.backend):
                if not self._break(taken, mine):
                    time.sleep(0.01)  # another taker is breaking it: see what it leaves
                continue
            return False
        return False

    def _undo(self, mine: bytes) -> None:
        """Delete ``gc/lock`` if it holds ``mine`` (best effort: else its lease runs out, unrenewed)."""
        try:
            got = self.backend.get(LOCK_KEY)
            if got is not None and bytes(got) == mine:
                self.backend.delete(LOCK_KEY)
        except Exception:  # noqa: BLE001 - the store is away: the lease ends the lock
            pass

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
                nonce = _info(dead, LOCK_KEY).get("nonce")
                if isinstance(nonce, str) and nonce.isalnum():
                    self.backend.delete(LEASE_PREFIX + nonce)
            # Done: a taker that claims this number later finds gc/lock no longer holds ``dead``
            # (a live lock's bytes are unique; the same garbage again is dead again).
            self.backend.delete(key)
            return True
        return False

    # -- the lease -----------------------------------------------------------------
    def _start_renewing(self) -> None:
        """Renew the lease every RENEW_EVERY seconds, from a thread started only then (a merge is over sooner)."""
        self._stop.clear()
        mine, token = self._mine, self._token

        def renew() -> None:
            n = 0
            while not self._stop.wait(RENEW_EVERY):
                n += 1
                try:
                    got = self.backend.get(LOCK_KEY)
                    if got is None or bytes(got) != mine:
                        self.lost = True  # taken over: this holder must stop rewriting
                        return
                    self.backend.set(LEASE_PREFIX + token, json.dumps({"time": time.time(), "n": n}).encode())
                except Exception:  # noqa: BLE001 - the store is away: try again; the lease may run out
                    continue

        t = threading.Thread(target=renew, name="casmon-lock-lease", daemon=True)
        try:
            t.start()
        except RuntimeError:  # the interpreter is exiting (the exit flush's merge): over before a lease ends
            return
        self._renewer = t

    def confirm(self) -> None:
        """Raise :class:`StoreError` unless this process still holds the lock (before a step that deletes)."""
        if self._mine is None:
            raise StoreError(f"{self.backend.url}: the store lock is not held")
        got = self.backend.get(LOCK_KEY)
        if self.lost or got is None or bytes(got) != self._mine:
            self.lost = True
            raise StoreError(f"{self.backend.url}: this {self.what} lost the store lock (it was stopped for longer "
                             f"than the {LEASE:g} s lease, and another process took it over); it stops here")

    def release(self) -> None:
        if self._mine is None:
            return
        self._stop.set()
        r = self._renewer
        if r is not None and r is not threading.current_thread():
            r.join(timeout=5)
        self._renewer = None
        try:
            got = self.backend.get(LOCK_KEY)
            if got is not None and bytes(got) == self._mine:
                self.backend.delete(LOCK_KEY)
            self.backend.delete(LEASE_PREFIX + self._token)
        finally:
            self._mine = None

    def describe(self) -> str:
        h = self.holder
        t = h.get("time")
        since = "?"
        if isinstance(t, (int, float)) and 0 <= t < 1e11:
            since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(t)))
        return f"{str(h.get('what', 'gc'))[:40]} (pid {str(h.get('pid'))[:20]} on {str(h.get('host'))[:80]}, since {since})"


def _dead(info: dict[str, Any], backend: Backend | None = None) -> bool:
    """The lock ``info`` was taken by a holder that is gone: its lease ran out, or its process is."""
    if "lease" not in info:  # written before leases: the old rules
        return _gone(info, STALE_AFTER.get(str(info.get("what")), STALE_DEFAULT))
    raw_lease, raw_time = info.get("lease"), info.get("time", 0)
    if not (isinstance(raw_lease, (int, float)) and isinstance(raw_time, (int, float))):
        return True
    # A lease or time no holder writes (damage, a crafted lock) must not hold the store for good.
    lease, renewed = min(float(raw_lease), LEASE_MAX), float(raw_time)
    now = time.time()
    if renewed > now + lease:
        return True
    nonce = info.get("nonce")
    if backend is not None and now - renewed > lease and isinstance(nonce, str) and nonce.isalnum():
        got = backend.get(LEASE_PREFIX + nonce)
        if got is not None:
            try:
                t = metafile.number(metafile.load_object(got, LEASE_PREFIX + nonce), "time", LEASE_PREFIX + nonce,
                                    0.0, now + lease)
                renewed = max(renewed, t)  # a damaged lease renews nothing: the lock's own time decides
            except DamagedObjectError:
                pass
    if now - renewed > lease:
        return True
    return _same_machine(info) and not _alive(info)


def _same_machine(info: dict[str, Any]) -> bool:
    """The lock was taken on this machine, in this PID namespace: its PID means a process here."""
    me = machine()
    return all(info.get(k) == me[k] for k in ("host", "boot", "pidns")) and bool(me["boot"] and me["pidns"])


def process_gone(info: dict[str, Any]) -> bool:
    """``info`` (what :func:`machine` gave, plus ``pid`` and ``start``) names a process of this machine that is gone.
    False where that cannot be told (another machine, another PID namespace): only heartbeats tell then."""
    return _same_machine(info) and not _alive(info)


def _alive(info: dict[str, Any]) -> bool:
    try:
        pid = int(info["pid"])
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, KeyError, ValueError, TypeError, OverflowError):
        return True
    stat = _read(f"/proc/{pid}/stat")
    if stat[stat.rfind(")") + 2 : stat.rfind(")") + 3] in ("Z", "X"):
        return False  # killed, and not yet reaped by its parent: it runs no more
    start = str(info.get("start") or "")
    return not start or process_start(pid) in ("", start)  # another process under a reused PID: gone


def _claim_dead(data: bytes) -> bool:
    """A claim to break a lock whose taker died (on this host) or that is older than CLAIM_STALE."""
    info = _info(data, BREAK_PREFIX)
    if not info:
        return True  # damaged: its taker's, who is gone
    if "lease" in info:
        if _stale(info, CLAIM_STALE):
            return True
        return _same_machine(info) and not _alive(info)
    return _gone(info, CLAIM_STALE)


def _stale(info: dict[str, Any], limit: float) -> bool:
    """``info``'s time is older than ``limit`` seconds, or is none a taker writes: not a number, or more than a
    lease ahead of this clock (a crafted or flipped time would otherwise hold the store for good)."""
    t = info.get("time", 0)
    if type(t) not in (int, float):
        return True
    now = time.time()
    return not now - limit <= t <= now + LEASE


def _gone(info: dict[str, Any], limit: float) -> bool:
    """(A lock without a lease.) Older than ``limit`` seconds, or taken by a process of this host that is gone."""
    if _stale(info, limit):
        return True
    import socket

    if info.get("host") == socket.gethostname():
        try:
            os.kill(int(info["pid"]), 0)
        except ProcessLookupError:
            return True
        except (PermissionError, KeyError, ValueError, TypeError, OverflowError):
            return False
    return False


def forget_old_breaks(backend: Backend, keep: float = BREAK_KEEP) -> int:
    """Delete claims killed takers left, and leases dead holders left, once older than ``keep`` seconds
    (call it holding the lock)."""
    keys = [k for k in backend.list(BREAK_PREFIX) + backend.list(LEASE_PREFIX) if ".partial" not in k]
    gone = 0
    for k, data in zip(keys, backend.get_many(keys) if keys else []):
        raw = _info(data, k).get("time", 0.0) if data is not None else 0.0
        t = float(raw) if type(raw) in (int, float) else 0.0
        if t > time.time() + keep:
            t = 0.0  # damaged: forgotten as an old one
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
