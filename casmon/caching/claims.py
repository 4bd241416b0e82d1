"""Compute claims: a process that misses a key another live process is computing waits for its result.

A sweep of 64 workers that all miss one expensive key would otherwise compute
it 64 times. Before computing a slow call (see :data:`CLAIM_MIN_S`), a process
*claims* its key: it creates the ref ``claims/<key>`` (create-if-absent, so
one process wins on a local folder, a shared file system or S3), holding who
it is and a heartbeat counter. The winner computes, stores the entry, flushes
it, and deletes the claim. The others watch the claim and the store: once the
claim is gone they look the key up again and return the stored result (within
about a second: polls back off to at most one a second); if the winner failed
(an exception, a result that cannot be stored) they compute it themselves, all
at once, as without claims.

**Takeover.** The winner's heartbeat thread rewrites the claim every
``CASMON_HEARTBEAT_S`` seconds (default 15). A waiter that sees the counter
stand still for :data:`STALE_AFTER` heartbeats (by its own monotonic clock,
so clocks of different machines never matter), or whose claim names a process
of this machine that is gone, takes the claim over: of all the waiters, only
the one that creates ``claims/<key>.break-<token>`` deletes the dead claim, and
only while it still holds the dead holder's token and counter; then each waiter
tries to claim the key again and one computes.

**What claims never do.** Nothing is locked across calls and no result depends
on a claim: they only save work. A holder stopped for longer than the stale
time (SIGSTOP, a paused VM) and taken over computes too; both store equal
entries and either is used, as when two processes missed at once without claims.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from casmon.errors import MAX_SECONDS, CasmonError
from casmon.keys.digest import Digest
from casmon.plain import Plain
if TYPE_CHECKING:
    from casmon.caching.memoize import CacheState
    from casmon.store import lock
    from casmon.store.store import Store

__all__ = ["Held", "wait_option", "CLAIM_MIN_S", "CLAIM_MIN_S_REMOTE", "STALE_AFTER", "Claim", "ClaimBook", "claim_book",
           "compute_once", "Outcome", "wait_or_hold", "release"]

#: A function whose recent calls in this process all took less than this (seconds) neither claims nor waits:
#: computing again is cheaper than a claim's writes and reads.
CLAIM_MIN_S = 0.1
#: The same on a remote store (S3), where a claim is four requests.
CLAIM_MIN_S_REMOTE = 1.0
#: A claim whose heartbeat counter stood still for this many heartbeats (plus twice its last write's time) is
#: dead. With the first poll after a beat at most a quarter heartbeat late, a killed holder is taken over
#: within three heartbeats of its last one.
STALE_AFTER = 2.5
#: A claim first seen with a heartbeat this many stale times old by the wall clock is dead at once
#: (left by a process killed long ago: its age by the clocks is beyond any clock difference of a cluster).
STALE_WALL = 10
#: A call that has waited this long (seconds) for another process says once what it waits on.
WAIT_NOTICE_S = 2.0
#: The longest wait between two looks at a claim.
POLL_MAX = 1.0
POLL_MIN = 0.02


def _lock() -> Any:
    """The store's process and lock helpers, loaded at the first claim: decorating a function needs none of them."""
    from casmon.store import lock

    return lock


def claim_name(key: Digest) -> str:
    return f"claims/{key.hex()}"


class Claim(Plain):
    """A claim this process holds: its ref's name and the data its heartbeats rewrite."""

    FIELDS = ("name", "data", "lock", "lost", "failed")

    def __init__(self, name: str, data: dict[str, Any]) -> None:
        self.name, self.data = name, data
        self.lock = threading.Lock()
        self.lost = False  # another process took it over (this one was stopped for longer than the stale time)
        self.failed = False  # the call raised: the claim says so until the next heartbeat deletes it


class Outcome(Plain):
    """What :func:`compute_once` decided: ``found`` (the result is stored now: look it up), else compute, holding
    ``claim`` (release it after storing the entry) or, where no claim could be had, without one."""

    FIELDS = ("found", "claim", "waited")

    def __init__(self, found: bool, claim: Claim | None = None, waited: float = 0.0) -> None:
        self.found, self.claim, self.waited = found, claim, waited


class Held:
    """What a computing call holds: its key in this process's in-flight map, and maybe a store claim."""

    __slots__ = ("key", "event", "claim")

    def __init__(self, key: bytes, event: threading.Event, claim: Claim | None) -> None:
        self.key, self.event, self.claim = key, event, claim


def wait_option(wait: Any, name: str) -> bool | float:
    """``wait=`` of ``@casmon.cache``, checked."""
    if isinstance(wait, bool):
        return wait
    if isinstance(wait, (int, float)) and 0 <= wait <= MAX_SECONDS:  # NaN fails too; True waits without a limit
        return float(wait)
    raise ValueError(f"@cache of {name}: wait= is True (no limit), False or a number of seconds to wait at most "
                     f"(up to 100 years), got {wait!r}")


class ClaimBook:
    """The claims this process holds on one store, and the one thread that beats for them all."""

    def __init__(self, store: Store, every: float) -> None:
        self.store = store
        self.every = every
        self.held: dict[str, Claim] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def take(self, key: Digest, fn: str) -> Claim | None:
        """Claim ``key``; None if another process holds it."""
        name = claim_name(key)
        now = time.time()
        data = {"fn": fn, "token": os.urandom(8).hex(), **_lock().machine(), "pid": os.getpid(),
                "start": _lock().process_start(os.getpid()), "since": now, "time": now, "beat": 0, "every": self.every, "lag": 0.0}
        if not self.store.create_ref(name, None, data):
            return None
        c = Claim(name, data)
        with self._lock:
            self.held[name] = c
            self._start()
        return c

    def fail(self, c: Claim) -> None:
        """The call raised: mark the claim failed, so its waiters compute at once (each for itself, as without
        claims, not one after another); the next heartbeat deletes it."""
        if c.data.get("pid") != os.getpid():
            return  # a forked child: the claim is its parent's
        with c.lock:
            if c.lost:
                return
            try:
                ref = self.store.get_ref(c.name)
                if ref is not None and ref.data.get("token") == c.data["token"]:
                    c.data = dict(c.data, failed=True, time=time.time())
                    self.store.set_ref(c.name, None, c.data, same_target=True)
                    c.failed = True
                    return
            except (CasmonError, OSError):
                pass
        self.release(c)

    def release(self, c: Claim) -> None:
        """Delete the claim (if it is still this process's): waiters look the key up now."""
        if c.data.get("pid") != os.getpid():
            return  # a forked child: the claim is its parent's, which still computes
        with self._lock:
            self.held.pop(c.name, None)
        with c.lock:  # never between a heartbeat's read and its write: the write would bring the claim back
            if c.lost:
                return
            try:
                ref = self.store.get_ref(c.name)
                if ref is not None and ref.data.get("token") == c.data["token"]:
                    self.store.delete_ref(c.name)
            except (CasmonError, OSError):
                pass  # the store is away: its heartbeat stops, and waiters take it over

    def _start(self) -> None:
        t = self._thread
        if t is not None and t.is_alive():
            return
        t = threading.Thread(target=self._beat_loop, name="casmon-claim-heartbeat", daemon=True)
        try:
            t.start()
        except RuntimeError:  # the interpreter is exiting
            return
        self._thread = t

    def _beat_loop(self) -> None:
        while True:
            time.sleep(self.every)
            with self._lock:
                claims = list(self.held.values())
                if not claims:
                    self._thread = None
                    return
            for c in claims:
                self._beat(c)

    def _beat(self, c: Claim) -> None:
        if c.failed:
            c.failed = False
            self.release(c)  # its waiters have seen it failed: the next miss claims the key again
            return
        with c.lock:
            if c.lost or c.name not in self.held:
                return
            t0 = time.monotonic()
            try:
                ref = self.store.get_ref(c.name)
                if ref is None or ref.data.get("token") != c.data["token"]:
                    c.lost = True  # taken over: never write over the new holder's claim
                    return
                d = dict(c.data, beat=int(c.data["beat"]) + 1, time=time.time())
                self.store.set_ref(c.name, None, d, same_target=True)
                c.data = d
                c.data["lag"] = round(time.monotonic() - t0, 3)
            except (CasmonError, OSError):
                pass  # the store is away: try at the next beat (waiters allow for a slow write)


_books: dict[int, ClaimBook] = {}
_books_lock = threading.Lock()


def _forget_in_child() -> None:
    _books.clear()  # a forked child holds none of its parent's claims


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


def claim_book(store: Store) -> ClaimBook:
    b = _books.get(id(store))
    if b is None or b.store is not store:
        with _books_lock:
            b = _books.get(id(store))
            if b is None or b.store is not store:
                b = _books[id(store)] = ClaimBook(store, _lock().heartbeat_seconds())
    return b


def _well_formed(d: dict[str, Any]) -> bool:
    every, beat, token = d.get("every"), d.get("beat"), d.get("token")
    return (isinstance(token, str) and type(beat) is int and isinstance(every, (int, float))
            and 0.1 <= every <= 86400 and type(d.get("pid")) is int)


def _num(v: Any, default: float) -> float:
    return float(v) if type(v) in (int, float) and v == v and abs(v) < 1e12 else default


def compute_once(store: Store, key: Digest, fn: str, found: Callable[[], bool], timeout: float | None = None,
                 sleep: Callable[[float], None] = time.sleep,
                 waiting: Callable[[dict[str, Any]], None] | None = None) -> Outcome:
    """Decide how this process gets the result of ``key``: claim it and compute, or wait for the live process that
    computes it and look it up (``found()`` forces a fresh look at the store, True when the entry is there).

    ``timeout``: the longest wait (seconds) before computing anyway; None waits as long as the holder lives.
    ``waiting(claim data)``: called once, when the wait has lasted :data:`WAIT_NOTICE_S`.
    """
    book = claim_book(store)
    t0 = time.monotonic()
    deadline = None if timeout is None else t0 + timeout
    notice = _Notice(t0 + WAIT_NOTICE_S, waiting)
    for _attempt in range(20):
        c = book.take(key, fn)
        if c is not None:
            if found():  # stored between this process's miss and its claim
                book.release(c)
                return Outcome(True, None, time.monotonic() - t0)
            return Outcome(False, c, time.monotonic() - t0)
        how = _watch(store, claim_name(key), found, deadline, sleep, notice)
        if how == "found":
            return Outcome(True, None, time.monotonic() - t0)
        if how not in ("broken", "free"):  # the holder failed, or waited long enough
            return Outcome(False, None, time.monotonic() - t0)
    return Outcome(False, None, time.monotonic() - t0)  # never won nor saw a claim: compute


class _Notice:
    """Says once, from ``at`` (monotonic) on, what a wait waits on."""

    __slots__ = ("at", "say")

    def __init__(self, at: float, say: Callable[[dict[str, Any]], None] | None) -> None:
        self.at, self.say = at, say

    def check(self, now: float, d: dict[str, Any]) -> None:
        say = self.say
        if say is not None and now >= self.at:
            self.say = None
            try:
                say(d)
            except Exception:  # noqa: BLE001 - a notice (of a crafted claim, say) never ends the wait
                pass


def waiting_message(fn: str, d: dict[str, Any]) -> str:
    """What a waiting call says: the function, and the process that computes it (from its claim, maybe crafted)."""
    host, pid, since = d.get("host"), d.get("pid"), _num(d.get("since"), 0.0)
    who = f"process {pid if type(pid) is int else '?'} on {str(host)[:80] if isinstance(host, str) else '?'}"
    when = f" since {time.strftime('%H:%M:%S', time.localtime(since))}" if since > 0 else ""
    return (f"casmon: {fn} waits for {who}, which computes the same call{when}; it returns that result once "
            "stored (wait=False, or a number of seconds, computes here instead)")


#: ``.keys``: ``(id(state), key)`` of the calls this thread computes now.
_holding = threading.local()


def wait_or_hold(state: CacheState, key: Digest) -> tuple[bool, Any, Held | None]:
    """A missed call of ``state``'s function on ``key``: ``(found, value, held)``, the result another thread or
    process computed meanwhile, or what this call holds while it computes (an in-process mark, and the store
    claim if it could be had; :func:`release` it)."""
    kb = bytes(key)
    mine_now = getattr(_holding, "keys", None)
    if mine_now is None:
        mine_now = _holding.keys = set()
    if (id(state), kb) in mine_now:
        return False, None, None  # this thread computes the key already (a call that reaches its own key again)
    timeout = None if state.wait is True else float(state.wait)
    with state._lock:
        other = state._inflight.get(kb)
        if other is None:
            mine = state._inflight[kb] = threading.Event()
    if other is not None:  # a thread of this process computes it: no store traffic
        if not other.wait(WAIT_NOTICE_S if timeout is None else min(timeout, WAIT_NOTICE_S)):
            if timeout is None or timeout > WAIT_NOTICE_S:
                _say(state, ("waiting", "thread"), f"casmon: {state.name} waits for another thread of this process, "
                                                  "which computes the same call")
                other.wait(None if timeout is None else timeout - WAIT_NOTICE_S)
        found, value = state.lookup_result(key)
        return found, value, None
    held = Held(kb, mine, None)
    mine_now.add((id(state), kb))
    try:
        store = state.store
        if (store.read_only or not store.backend.supports_deletes or store.url.startswith("memory:")
                or store.autoflush is None):
            return False, None, held  # no other process sees the entry soon: the in-process mark is enough
        out = compute_once(store, key, state.name, lambda: state.found_now(key), timeout,
                           waiting=lambda d: _say(state, ("waiting", str(d.get("token"))[:64]), waiting_message(state.name, d)))
    except BaseException:
        release(state, held)
        raise
    if out.found:
        try:
            found, value = state.lookup_result(key)
        except BaseException:
            release(state, held)
            raise
        if found:
            release(state, held)
            return True, value, None
    if out.claim is None and timeout is not None and out.waited >= timeout:
        state.warn(("wait-timeout",), f"casmon: {state.name} waited {timeout:g} s (wait=) for another process "
                                      "computing the same key, and computes it here too")
    held.claim = out.claim
    return False, None, held


def _say(state: CacheState, what: Any, msg: str) -> None:
    """A waiter's notice, as every casmon cache warning: a :class:`CacheWarning` at the caller's line, once.
    Only a notice: warnings made errors never end the wait (the call would fail for waiting)."""
    try:
        state.warn(what, msg)
    except Exception:  # noqa: BLE001
        pass


def release(state: CacheState, held: Held, failed: bool = False) -> None:
    """Release what a computing call held: waiting threads and processes look the key up now (``failed``: the
    call raised, and they compute it themselves)."""
    try:
        c = held.claim
        if c is not None and c.data.get("pid") == os.getpid():  # never a forked child for its parent
            book = claim_book(state.store)
            if failed:
                book.fail(c)
            else:
                try:
                    state.store.flush()  # the entry is visible to other processes before the claim goes
                except (CasmonError, OSError):
                    pass  # kept for a later flush; the waiters compute it meanwhile
                book.release(c)
    finally:
        keys = getattr(_holding, "keys", None)
        if keys is not None:
            keys.discard((id(state), held.key))
        with state._lock:
            if state._inflight.get(held.key) is held.event:
                del state._inflight[held.key]
        held.event.set()


def _watch(store: Store, name: str, found: Callable[[], bool], deadline: float | None,
           sleep: Callable[[float], None], notice: _Notice | None = None) -> str:
    """Watch another process's claim ``name`` until it ends: ``found``, ``released`` (the holder failed: compute),
    ``broken`` (dead, and this process deleted it: claim again), ``free`` (gone without a result: claim again; the
    moment between a takeover's delete and its new claim looks so) or ``timeout``."""
    token: Any = None
    beat: Any = None
    changed = time.monotonic()
    lost_break: float | None = None  # when this waiter first lost the race to break the claim
    poll = POLL_MIN
    first = True
    while True:
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            return "timeout"
        if not first:
            sleep(min(poll, deadline - now) if deadline is not None else poll)
        try:
            ref = store.get_ref(name)
        except (CasmonError, OSError, ValueError):
            ref = None  # unreadable (the store is away, a crafted claim): decide by the store alone
        if ref is None:
            return "found" if found() else "free"
        d = ref.data
        if d.get("failed") is True:
            if found():
                return "found"
            if first and _well_formed(d) and _break(store, name, d.get("token"), d.get("beat")):
                return "broken"  # failed before this process came (its holder may have exited): claim it anew
            return "released"  # failed while this process waited: compute now, beside the others
        if not _well_formed(d):
            dead = True  # not a claim casmon wrote: nothing would ever beat for it
            token, beat = d.get("token"), d.get("beat")
            if found():
                return "found"
            return "broken" if _break(store, name, token, beat) else "released"
        every = max(0.1, _num(d.get("every"), _lock().heartbeat_seconds()))
        poll = min(poll * 2, POLL_MAX, every / 4)
        now = time.monotonic()
        if notice is not None:
            notice.check(now, d)
        if d.get("token") != token or d.get("beat") != beat:
            wall_age = time.time() - _num(d.get("time"), time.time())
            dead = first and wall_age > STALE_WALL * STALE_AFTER * every
            token, beat, changed = d.get("token"), d.get("beat"), now
        else:
            lag = min(every, max(0.0, _num(d.get("lag"), 0.0)))  # a crafted lag never stretches the wait
            dead = now - changed > STALE_AFTER * every + 2 * lag
        first = False
        if not (dead or _lock().process_gone(d)):
            continue
        if found():  # it stored its entry before it died
            return "found"
        if _break(store, name, token, beat):
            return "broken"
        if lost_break is None:
            lost_break = now
        elif now - lost_break > STALE_AFTER * every:  # the waiter breaking it died too: let another try
            try:
                store.delete_ref(_marker(name, token))
            except (CasmonError, OSError, ValueError):
                pass
            lost_break = None


def _marker(name: str, token: Any) -> str:
    """The ref whose creator breaks the dead claim ``name`` holding ``token``."""
    if not isinstance(token, str) or not token.isalnum() or len(token) > 64:
        token = "crafted"  # a token that cannot name a ref: one fixed marker for it
    return f"{name}.break-{token}"


def _break(store: Store, name: str, token: Any, beat: Any) -> bool:
    """Delete the dead claim ``name`` (holding ``token`` and ``beat``) if this waiter is the one to break it."""
    marker = _marker(name, token)
    if marker.endswith(".break-crafted"):
        token = "crafted"
    try:
        if not store.create_ref(marker, None, {"pid": os.getpid(), "time": time.time(), **_lock().machine()}):
            return False
        try:
            ref = store.get_ref(name)
            same = token == "crafted" or ref is not None and ref.data.get("token") == token
            if ref is not None and same and ref.data.get("beat") == beat:
                store.delete_ref(name)  # still the dead holder's: no live claim is deleted here
        finally:
            store.delete_ref(marker)
    except (CasmonError, OSError, ValueError):
        return False
    return True
