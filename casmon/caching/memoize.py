"""``@casmon.cache``: memoize expensive functions on the store.

The key of a call is one fingerprint of: the function's name, its version
(:mod:`casmon.keys.codeversion`, or ``version=``), and its arguments bound to its
signature with defaults applied, in parameter order, so ``f(1)``, ``f(x=1)``
and ``f(1, y=<default>)`` share one key. ``**kwargs`` count by name, not order.

A cache entry is a record of kind ``cache`` under that key, pointing at the result's digest: no file per
entry, and a result that is already stored (the same array returned by many calls) is not stored again.

Concurrency: a slow call (see :mod:`~casmon.caching.claims`) is computed once across processes and
threads: a process that misses a key another live process is computing waits for its result, and takes
the computation over if that process dies. No lock is held across calls, and no result depends on a claim:
where two processes compute one key anyway, both entries point at equal results, and either is used.

Failures never cost the caller a result: an argument that cannot be hashed, a result that cannot be
pickled, a full disk or a damaged stored result each give one warning, and the function's own result is returned.

This module only memoizes (after joblib's ``memory.py``): a miss's storing of its result and entry is in
:mod:`~casmon.caching.saving` (loaded by the first miss), file digests are in
:mod:`~casmon.caching.files`, pickling for worker processes in
:mod:`~casmon.caching.workers`, entries, eviction and admin in
:mod:`~casmon.caching.entries`, compute claims in :mod:`~casmon.caching.claims`,
why a call missed in :mod:`~casmon.caching.explain`.
"""

from __future__ import annotations

import functools
import os
import _thread  # threading's locks, without loading threading on a hit
import time
import types
import warnings
from collections import OrderedDict, deque, namedtuple
from collections.abc import Callable, Hashable, Iterable, Mapping
TYPE_CHECKING = False  # typing's flag without importing typing (~2 ms of a first hit)
if TYPE_CHECKING:
    import threading
    from typing import Any, NamedTuple

from casmon.caching import hot, versions
from casmon.caching.binder import EMPTY, Binder, is_async, is_generator, unwrap
from casmon.caching.versions import VERSION_WARNINGS_MAX  # noqa: F401 - part of this module's names
from casmon.caching.entries import (KIND, KIND_CLEAR, KIND_FN, expires_option, name_digest, newest_per_key,
                                     result_of)
from casmon.caching.usage import usage_of
from casmon.errors import CasmonError, DamagedObjectError, MissingObjectError, stacklevel_outside
from casmon.keys.codeversion import VersionedFingerprinter, function_name, unwrap_callable, version_tracker
from casmon.keys.digest import Digest
from casmon.keys.fingerprint import encoded_name, fingerprint
from casmon.keys.names import keep_flat_names
from casmon.store.lifecycle import WeakObjects

if TYPE_CHECKING:  # the store is loaded at the first call, not when a function is decorated
    from casmon.caching.resultref import ResultRef
    from datetime import timedelta

    from casmon.caching import claims, explain
    from casmon.store.store import Store
    from casmon.view import display

__all__ = ["cache", "cache_with", "CacheInfo", "CacheWarning", "CachedFunction", "CacheState", "KEY_FORMAT", "observers"]

#: Part of every call key; raised when what a key means changes, so old entries are never misread.
KEY_FORMAT = 2


#: Old pickles name ``casmon.cache._rebuild`` (serialize.MOVED_MODULES sends them here): these names resolve,
#: loaded from casmon.caching.workers when asked for (a hit never is).
_FROM_WORKERS = frozenset({"_by_name", "_rebuild", "_rebuild_state", "reduce_cached", "reduce_state"})


def __getattr__(name: str) -> Any:
    if name == "CacheInfo":
        return cache_info_type()
    if name in _FROM_WORKERS:
        from casmon.caching import workers

        return getattr(workers, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: Called as ``observer(store, fn_name, key, result_digest, hit)`` on every hit and stored miss
#: (runs use it to record which cache entries they used).
observers: list = []


class CacheWarning(UserWarning):
    """Something kept a call from being cached or a hit from being used; the result is still returned."""


#: ``hits`` and ``misses`` in this process; ``entries`` in the store, of all processes, and ``stored_bytes``, the
#: logical size of their results, each stored value once (entries that return one value share it).
if TYPE_CHECKING:
    CacheInfo = NamedTuple("CacheInfo", [("hits", int), ("misses", int), ("entries", int), ("stored_bytes", int)])
_cache_info_lock = _thread.allocate_lock()


def cache_info_type() -> Any:
    """:class:`CacheInfo`, made at its first use (a namedtuple's class is built from source: ~80 µs of a first
    hit that never asks): one class however it is reached, named ``casmon.cache.CacheInfo`` as always."""
    with _cache_info_lock:
        made: Any = globals().get("CacheInfo")
        if made is None:
            make: Any = namedtuple  # untyped: the type checker sees the NamedTuple above
            made = make("CacheInfo", ["hits", "misses", "entries", "stored_bytes"], module=__name__)
            keep_flat_names([made])
            globals()["CacheInfo"] = made  # the next lookup is a plain attribute
    return made


_EMPTY = EMPTY


_states: WeakObjects[CacheState] = WeakObjects()  # a WeakSet without loading _weakrefset on a hit
_recent_by_name: dict[str, deque[float]] = {}


def _forget_inflight_in_child() -> None:
    # The threads computing those keys are the parent's: a child waiting for them would wait forever.
    for st in list(_states):
        st._inflight = {}
        st._usage = None  # the child counts hits anew, in its store's own flush hook


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_inflight_in_child)


#: At most this many files of one call are listed in its cache entry (folders count as a whole beyond).
FILES_RECORDED = 1000
#: A result whose manifest is at most this long (a small JSON or pickle value, no chunks) is copied
#: into its cache entry: a hit in a fresh process then reads one table block, not the index and a pack.
INLINE_MAX = 256
#: A process sees a `cache clear` made by another within this many seconds (its hits re-read the clears).
CLEAR_CHECK_S = 1.0


_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_B64_VALUES = bytes.maketrans(_B64.encode(), bytes(range(64)))
_B64_CHECK = {ord(c): None for c in _B64}


_B64_IN_PYTHON = [8]  # a fresh process's first hits decode in Python; later ones load binascii, ~30x faster


def _unbase64(text: str) -> bytes:
    """``binascii.a2b_base64(text, strict_mode=True)``: an entry's inline value. A process's first few are decoded
    without loading binascii (a C extension: ~0.2 ms of a script's first hit) where they are as ``b2a_base64``
    writes them; anything else, and every later one, is binascii's to decode or refuse."""
    if _B64_IN_PYTHON[0] > 0:
        body = text.rstrip("=")
        if not (len(text) % 4 or len(text) - len(body) > 2 or body.translate(_B64_CHECK) or not text.isascii()):
            _B64_IN_PYTHON[0] -= 1
            return _unbase64_plain(body)
    import binascii

    return binascii.a2b_base64(text, strict_mode=True)


def _unbase64_plain(body: str) -> bytes:
    """Base64 text of whole quads less its "=" padding (at most two), checked by the caller, decoded."""
    v = body.encode().translate(_B64_VALUES)
    out = bytearray()
    for i in range(0, len(v) - 3, 4):
        out += (v[i] << 18 | v[i + 1] << 12 | v[i + 2] << 6 | v[i + 3]).to_bytes(3, "big")
    tail = v[len(v) - len(v) % 4 :]
    if len(tail) == 3:
        out += ((tail[0] << 18 | tail[1] << 12 | tail[2] << 6) >> 8).to_bytes(2, "big")
    elif len(tail) == 2:  # (one left over cannot be: the text is whole quads with at most two "=")
        out += ((tail[0] << 18 | tail[1] << 12) >> 16).to_bytes(1, "big")
    return bytes(out)


# -- the state behind one cached function ---------------------------------------------------------------
_NO_SELF = object()


def _inner_function(fn: Any) -> Any:
    """The function whose code and defaults ``inspect`` reads ``fn``'s parameters from: the end of its
    ``__wrapped__`` chain, through partials too."""
    for _ in range(100):
        fn = unwrap(fn)
        if not isinstance(fn, functools.partial):
            break
        fn = fn.func
    return fn


def _defaults(fn: Any) -> tuple[Any, Any, Any, Any]:
    """What a function's parameters are read from: its defaults, keyword-only defaults (a dict, changed in place
    too: its items), and code."""
    if fn is None:
        return None, None, None, None
    kd = fn.__kwdefaults__
    return fn.__defaults__, kd, fn.__code__, tuple(kd.items()) if type(kd) is dict else None


_saving: Any = None


def _saving_module() -> Any:
    """:mod:`casmon.caching.saving`, bound by the first miss: decorating a function and its hits need none of it."""
    global _saving
    from casmon.caching import saving

    _saving = saving
    return saving


def _claims() -> Any:
    """:mod:`casmon.caching.claims`, loaded by the first miss: decorating a function and its hits need none of it."""
    from casmon.caching import claims

    return claims
_ANY = object()
_PKG_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


#: The first misses of a function whose key is computed again, to find arguments that never hash the same.
STABILITY_CHECKS = 2


class CacheState:
    """The state behind one decorated function."""

    def __init__(self, fn, store, ignore, hashers, version, label, memory_entries, files=(), wait=True,
                 expires_after=None, mmap=False) -> None:
        self.fn = fn
        self.name = function_name(fn)
        self._store_arg = store
        self._store: Store | None = None
        # The parameters, read from the code of a plain function (inspect only for other callables): a fresh
        # process's first hit does not load inspect (casmon.caching.binder).
        self._set_binder(Binder(fn))
        names = self._names
        if isinstance(ignore, (str, int)):  # one parameter, not the letters of a name
            ignore = [ignore]
        if hashers is not None and not isinstance(hashers, Mapping):
            raise TypeError(f"@cache of {self.name}: hashers= must be a mapping of parameter (name or position) to "
                            f"a function, got {type(hashers).__name__}")
        if isinstance(memory_entries, bool) or not isinstance(memory_entries, int) or memory_entries < 0:
            raise ValueError(f"@cache of {self.name}: memory_entries must be a whole number >= 0, got {memory_entries!r}")
        if not isinstance(mmap, bool):
            raise TypeError(f"@cache of {self.name}: mmap must be True or False, got {mmap!r}")
        self.ignore = self._resolve(ignore or (), names, "ignore")
        self.hashers = {self._resolve([k], names, "hashers")[0]: h for k, h in (hashers or {}).items()}
        for pname, h in self.hashers.items():
            if not callable(h):
                raise TypeError(f"@cache of {self.name}: hasher for parameter {pname!r} is not callable")
        if isinstance(files, (str, int)):
            files = [files]
        self.files = self._resolve(files or (), names, "files")
        both = set(self.files) & (set(self.hashers) | set(self.ignore))
        if both:
            raise ValueError(f"@cache of {self.name}: parameter {sorted(both)[0]!r} is in files= and in ignore= or hashers=")
        self.version_pin = version
        self.label = label
        self.wait = wait if isinstance(wait, bool) else _claims().wait_option(wait, self.name)
        self.expires = expires_option(expires_after, self.name)
        self.mmap = bool(mmap)  # results stored laid out for mapping, and hits mapped (casmon.store.mapped)
        self._options = {"store": store, "ignore": list(ignore or ()), "hashers": dict(hashers or {}), "version": version,
                         "label": label, "memory_entries": memory_entries, "files": list(files or ()), "wait": wait,
                         "expires_after": expires_after}
        if self.mmap:  # only when set: a cached function passed as an argument keys as it did before the option
            self._options["mmap"] = True
        # A bound method (``casmon.cache(obj.method)``): its object counts like an argument, in every key.
        self._bound = fn.__self__ if isinstance(fn, types.MethodType) else _NO_SELF
        target = fn.__func__ if isinstance(fn, types.MethodType) else fn
        self.tracker = None if version is not None else version_tracker(unwrap_callable(target))
        # The function whose __defaults__/__kwdefaults__ the signature read: reassigned, they key calls anew.
        inner = _inner_function(target)
        self._defaults_of = inner if isinstance(inner, types.FunctionType) else None
        self._defaults = _defaults(self._defaults_of)
        self.version: Digest | None = None
        self._prefix: bytes | None = None
        self._mem: OrderedDict[bytes, bytes] = OrderedDict()  # key -> result digest
        self._mem_max = memory_entries
        self._lock = _thread.RLock()  # the version check, holding it, may read a clear that forgets what is remembered
        self._custom_key = type(self).key is not CacheState.key  # compat.finecache keys its own way
        self.hits = 0
        self.misses = 0
        self._warned: set = set()
        self._stability_checks = 0  # misses whose key was computed again (see _check_stable)
        self._cleared_at: float | None = None
        self._clears_seen = time.monotonic()
        # Seconds of the last computed calls: slow ones claim. Per function name, not per decoration: a worker that
        # rebuilds the function for every batch (loky) still knows it is quick.
        self._recent = _recent_by_name.setdefault(self.name, deque(maxlen=4))
        self._limit_of: Any = _NO_SELF  # the store self._limit is for (none yet)
        self._limit = 0.0
        self._inflight: dict[bytes, threading.Event] = {}  # keys a thread of this process computes now
        self._mem_expires: dict[bytes, float] = {}  # with expires_after: when each remembered entry expires
        self._hot = hot.HotCalls() if hot.eligible(self, _NO_SELF, _EMPTY) else None
        self._usage: Any = None  # the hit counts of the store last used (casmon.caching.usage)
        # Keys whose next record knowingly replaces a stored one (refresh, a damaged result recomputed): the record
        # says so, and the one it supersedes is not counted as a duplicate of a race.
        self._replacing: set[bytes] = set()
        _states.add(self)

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        from casmon.caching.workers import reduce_state

        return reduce_state(self)

    def options(self) -> dict:
        """The options to rebuild this cached function elsewhere (a worker process)."""
        opts = dict(self._options)
        s = opts["store"]
        from casmon.store.store import Store

        if isinstance(s, Store):
            opts["store"] = s.url
        elif isinstance(s, (str, os.PathLike)) and "://" not in str(s):
            opts["store"] = os.path.abspath(os.fspath(s))
        return opts

    @staticmethod
    def _resolve(items: Iterable, names: list[str], what: str) -> list[str]:
        out = []
        for it in items:
            if isinstance(it, int):
                if not 0 <= it < len(names):
                    raise ValueError(f"{what}: no parameter at position {it}; parameters are {names}")
                out.append(names[it])
            elif it in names:
                out.append(it)
            else:
                raise ValueError(f"{what}: no parameter named {it!r}; parameters are {names}")
        return out

    # -- the store and the version ------------------------------------------------------------
    @property
    def store(self) -> Store:
        s = self._store
        if s is None or s.closed:
            from casmon.store.store import default_store

            s = self._store = default_store(self._store_arg)
        return s

    def key_prefix(self) -> bytes:
        """The key's first part: the function's name and its version, re-checked at each call.

        A subclass that keys calls its own way (``compat.finecache``) starts its key with it.
        """
        t = self.tracker
        if t is None:  # pinned by hand
            p = self._prefix
            if self._defaults_moved():
                self._rebind_defaults()
            if p is None:
                self.version = fingerprint(("pinned", self.version_pin))
                self._check_version(self.version)
                p = self._prefix = bytes(fingerprint(("casmon.cache", KEY_FORMAT, self.name, self.version)))
            return p
        version = t.digest
        p = self._prefix
        if version is self.version and version is not None and t.valid() and p is not None:
            return p  # the hit path: nothing the version depends on changed
        version = t.current()
        with self._lock:
            if self._defaults_moved():
                self._rebind_defaults()
            p = self._prefix
            if version != self.version or p is None:
                self._check_version(version)
                self._warn_unhashable(t)
                p = self._prefix = bytes(fingerprint(("casmon.cache", KEY_FORMAT, self.name, version)))
                if self._hot is not None:
                    self._hot.clear()  # none of its calls stands for this version
            self.version = version
            return p

    def _defaults_moved(self) -> bool:
        f, (d, kd, code, items) = self._defaults_of, self._defaults
        if f is None:
            return False
        if f.__defaults__ is not d or f.__kwdefaults__ is not kd or f.__code__ is not code:
            return True
        return items is not None and kd is not None and (
            len(kd) != len(items) or any(kd.get(k, _ANY) is not v for k, v in items))

    def _rebind_defaults(self) -> None:
        """The function's defaults or code were reassigned (``f.__defaults__ = ...``): calls bind the new ones."""
        with self._lock:
            self._defaults = _defaults(self._defaults_of)
            self._set_binder(Binder(self.fn))
            self._hot = hot.HotCalls() if hot.eligible(self, _NO_SELF, _EMPTY) else None

    def _set_binder(self, b: Binder) -> None:
        """Bind calls by ``b``, and name each parameter's part of a key by its parameters."""
        self._binder = b
        self.params = b.params
        self._simple = b.simple
        self._names = [p.name for p in b.params]
        name_bytes = [encoded_name(p.name) for p in b.params]
        self._name_lens = {p.name: len(nb) for p, nb in zip(b.params, name_bytes)}  # a span's value starts after
        self._name_bytes = name_bytes

    def _warn_unhashable(self, t) -> None:
        for name, tname in t.unhashable:
            self.warn(("unhashable-global", name, tname),
                       f"casmon: {self.name} reads {name!r} ({tname}), which cannot be hashed: the cache counts it by "
                       "its type only and cannot see its state. Pass what matters as an argument, or pin version=.")

    def _check_version(self, version: Digest) -> None:
        """When this code is not the version cached last, say which results are used now (once per change)."""
        try:
            if self._prefix is None:  # the first call reads three tables: on a remote store, listed together
                self.store.prefetch((KIND_FN, KIND_CLEAR, KIND))
            msg = versions.check_version(self, version)
        except CasmonError as e:
            self.warn(("store",), f"casmon: cache of {self.name} cannot reach its store: {e}")
            return
        except Exception as e:  # noqa: BLE001 - a malformed version record in the store never fails a call
            self.warn(("version-record",), f"casmon: cache of {self.name}: a code-version record in its store cannot "
                                           f"be read ({type(e).__name__}: {e}); the call is cached as usual")
            return
        if msg:
            warnings.warn(msg, CacheWarning, stacklevel=stacklevel_outside(_PKG_DIR))

    def current_parts(self) -> dict[str, Any]:
        """What the current code version is made of (its functions, globals, libraries), as its record keeps it."""
        t = self.tracker
        from casmon.caching import explain
        return explain.version_parts(t.parts if t is not None else None,
                                     None if self.version_pin is None else str(self.version_pin),
                                     t.sources() if t is not None else None)

    # -- keys -------------------------------------------------------------------
    def bind(self, args: tuple, kwargs: dict) -> list:
        """Argument values in parameter order, defaults applied (:class:`~casmon.caching.binder.Binder`)."""
        return self._binder.bind(args, kwargs)

    def key(self, args: tuple, kwargs: dict) -> Digest | None:
        """The call's key, or None (with one warning) if an argument cannot be hashed."""
        return self.key_ctx(args, kwargs)[0]

    def key_ctx(self, args: tuple, kwargs: dict) -> tuple:
        """``(key or None, trackers consulted, files listing, spans)``: ``spans`` is ``(encoding, [(parameter, start,
        end)])``, where each parameter's part of the key's encoding is, for :func:`explain.arg_digests` (``start``
        None for a parameter that fed a large buffer straight to the hasher)."""
        prefix = self.key_prefix()
        vals = self.bind(args, kwargs)
        fp = VersionedFingerprinter()
        fp.out += prefix
        ignore = self.ignore
        hashers = self.hashers
        files = self.files
        listing: list[tuple[Any, ...]] | None = [] if files else None
        if self._bound is not _NO_SELF:
            try:
                fp.out += b"<self>"
                fp.feed_value(self._bound, "self")
            except Exception as e:  # noqa: BLE001
                t = type(self._bound)
                self.warn(("arg", "self", t), f"casmon: {self.name} is not cached for this call: its object "
                           f"({t.__module__}.{t.__qualname__}) cannot be hashed, so the call is skipped by the cache: {e}")
                return None, fp.trackers, None, None
        spans: list[tuple[str, int | None, int]] = []
        for p, nb, v in zip(self.params, self._name_bytes, vals):
            name = p.name
            if ignore and name in ignore:
                continue
            o0, f0 = len(fp.out), fp.fed
            try:
                if listing is not None and name in files:  # listing is a list exactly when files= names some
                    n0 = len(listing)
                    from casmon.caching.files import files_key_value  # files= is rare: loaded by its first call

                    v = files_key_value(v, listing)
                    for i in range(n0, len(listing)):
                        listing[i] = (name,) + listing[i]
                elif hashers and name in hashers:
                    v = hashers[name](v)
                fp.out += nb
                fp.feed_value(v, name)
                spans.append((name, o0, len(fp.out)) if fp.fed == f0 else (name, None, 0))
            except Exception as e:  # noqa: BLE001 - never a wrong hit: do not cache this call
                t = type(v)
                tname = t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"
                what = "cannot be read" if files and name in files else "cannot be hashed"
                remedy = "" if what == "cannot be read" else (
                    f" To cache it, leave it out of the key with @casmon.cache(ignore=[{name!r}]) or hash it yourself "
                    f"with hashers={{{name!r}: lambda v: ...}}.")
                self.warn(("arg", name, t), f"casmon: {self.name} is not cached for this call: parameter {name!r} "
                           f"({tname}) {what}, so the call is skipped by the cache: {e}.{remedy}")
                return None, fp.trackers, None, None
        out = fp.out
        fp.h.update(out)  # as fp.digest(), keeping the encoding: a miss takes each parameter's digest from it
        return Digest.from_raw(fp.h.digest()), fp.trackers, listing, (out, spans)

    def warn(self, what: Hashable, msg: str) -> None:
        """Warn ``msg`` as a :class:`CacheWarning` at the caller's line, once per ``what`` for this function."""
        what = hot.hashable(what)
        if what not in self._warned:
            self._warned.add(what)
            warnings.warn(msg, CacheWarning, stacklevel=stacklevel_outside(_PKG_DIR))

    # -- lookups ----------------------------------------------------------------
    def cleared_time(self, refresh: bool) -> float:
        if self._cleared_at is None or refresh:
            recs = self.store.lookup(KIND_CLEAR, name_digest(self.name), refresh=refresh)
            before = self._cleared_at or 0.0
            self._cleared_at = max((r.get("time", 0.0) for r in recs), default=0.0)
            if self._cleared_at > before:  # a clear made elsewhere: nothing remembered before it is an entry now
                self.forget()
        return self._cleared_at

    def find(self, key: Digest, refresh: bool = True) -> tuple[Digest, dict] | None:
        entries = self.store.lookup(KIND, key, refresh=refresh)
        if not entries:
            return None
        cleared = self.cleared_time(refresh=False)
        good = [e for e in entries if e.get("time", 0) > cleared and "result" in e]
        if self.expires is not None:  # older entries are misses, also those stored before expires_after was set
            oldest = time.time() - self.expires
            good = [e for e in good if e.get("time", 0) > oldest]
        if not good:
            return None
        e = max(good, key=lambda r: r.get("time", 0))
        return Digest(e["result"]), e

    def found_now(self, key: Digest) -> bool:
        """Whether the store holds a live entry for ``key`` now, after reading what other processes added."""
        try:
            self.store.table(KIND).refresh()
            return self.find(key, refresh=False) is not None
        except (CasmonError, OSError):
            return False

    def forget(self, key: Digest | None = None) -> None:  # its entry (None: every one) left the store: ask it next
        with self._lock:
            for remembered in (self._mem, self._mem_expires):
                remembered.clear() if key is None else remembered.pop(bytes(key), None)
        if key is None and self._hot is not None:
            self._hot.clear()

    def _remember(self, key: Digest, result: Digest, expires: float | None = None, seen: Any = _ANY) -> None:
        """Remember ``key``'s result; with ``seen``, only if what was remembered then is what is remembered now
        (a ``refresh`` that landed meanwhile stays the entry)."""
        with self._lock:
            # Plain bytes, not Digests: the garbage collector walks instances of Python classes at
            # every full collection (a 1M-entry build spent a sixth of its time there).
            kb = bytes(key)
            if seen is not _ANY and self._mem.get(kb) != seen:
                return
            self._mem[kb] = bytes(result)
            if expires is not None:
                self._mem_expires[kb] = expires
            if len(self._mem) > self._mem_max:
                old, _d = self._mem.popitem(last=False)
                self._mem_expires.pop(old, None)

    def _see_clears(self) -> None:
        """Every :data:`CLEAR_CHECK_S` seconds: a `cache clear` another process made since forgets what this one
        remembers (its table is re-read at most that often, however many functions hit)."""
        now = time.monotonic()
        self._clears_seen = now
        store = self.store
        t = store.table(KIND_CLEAR)
        if now - t.last_refresh >= CLEAR_CHECK_S:
            t.refresh()
        before = self._cleared_at or 0.0
        recs = store.lookup(KIND_CLEAR, name_digest(self.name), refresh=False)
        after = max((r.get("time", 0.0) for r in recs), default=0.0)
        if after > before:
            self._cleared_at = after
            self.forget()

    def lookup_result(self, key: Digest):
        """(found, value): a hit loads a fresh copy; damage gives a warning and a miss."""
        return self._lookup(key)[:2]

    def _lookup(self, key: Digest) -> tuple[bool, Any, Digest | None]:
        """(found, value, the result's digest)."""
        if time.monotonic() - self._clears_seen >= CLEAR_CHECK_S:
            self._see_clears()
        seen = d = self._mem.get(key)
        if d is not None and self.expires is not None and self._mem_expires.get(bytes(key), 0.0) <= time.time():
            d = None
        expires = None
        if d is not None:
            d = Digest.from_raw(d)
        else:
            found = self.find(key)
            if found is None:
                return False, None, None
            d = found[0]
            if self.expires is not None:
                expires = float(found[1].get("time", 0)) + self.expires
            inline = found[1].get("inline")
            if isinstance(inline, str):
                try:  # used only if it hashes to the result's digest
                    self.store.objects.prime(d, _unbase64(inline))
                except ValueError:
                    pass
        try:
            value = self.store.get(d, mmap=self.mmap)
        except MissingObjectError as e:
            with self._lock:
                remembered = self._mem.pop(key, None) == d
            if remembered:  # gc dropped what this process remembered (a duplicate, an evicted entry): ask the store
                return self._lookup(key)
            return self._unreadable(key, d, e) + (None,)
        except DamagedObjectError as e:
            return self._unreadable(key, d, e) + (None,)
        except CasmonError:
            raise
        except Exception as e:  # noqa: BLE001 - a handler or a class's __setstate__ cannot rebuild it here: compute
            return self._unreadable(key, d, f"it cannot be loaded: {type(e).__name__}: {e}") + (None,)
        self._remember(key, d, expires, seen=seen)
        self._counted_hit(key, d)
        return True, value, d

    def _counted_hit(self, key: Digest, d: Digest | bytes) -> None:
        self.hits += 1
        store = self.store
        u = self._usage
        if u is None or u.store is not store:
            u = self._usage = usage_of(store)
        u.hit(key, self.name)
        if observers:
            d = d if type(d) is Digest else Digest.from_raw(d)
            for ob in list(observers):
                ob(store, self.name, key, d, True)

    def _unreadable(self, key: Digest, d: Digest, why: Any) -> tuple[bool, None]:
        self.warn(("damaged", d), f"casmon: the cached result of {self.name} is damaged or missing; recomputing ({why})")
        with self._lock:
            self._mem.pop(key, None)
        self._replacing.add(bytes(key))
        return False, None

    def save(self, key: Digest, result: Any, seconds: float, args: tuple, kwargs: dict, files: list | None = None,
             spans: Any = None) -> None:
        """Store a computed result; a failure is a warning, never an exception (:mod:`casmon.caching.saving`)."""
        (_saving or _saving_module()).save(self, key, result, seconds, args, kwargs, files, spans)

    # -- the two halves of a call, around the function itself ---------------------
    def begin(self, args: tuple, kwargs: dict, waits: bool = True) -> tuple[Any, bool, Any]:
        """``(ctx, found, value)``: a hit returns the stored value; a miss counts and passes ``ctx`` to :meth:`end`
        (or, if the function raised, to :meth:`abort`). A slow miss first waits for a live process or thread that
        computes the same key (:mod:`~casmon.caching.claims`)."""
        hc = self._hot
        ck = None
        if hc is not None and (ck := hot.call_key(args, kwargs)) is not None:
            try:
                if time.monotonic() - self._clears_seen >= CLEAR_CHECK_S:
                    self._see_clears()
                answered = hc.answer(self, ck)
            except (CasmonError, OSError):  # the store cannot be read: the full path below says so, once
                answered = None
            if answered is not None:
                self._counted_hit(answered[0], answered[1])
                return None, True, answered[2]
        prefix = self.key_prefix() if ck is not None else None  # the version a warm hit learnt now stands for
        if self._custom_key:
            ctx: tuple[Any, ...] = (_safe_key(self, args, kwargs), (), None, None)
        else:
            try:
                ctx = self.key_ctx(args, kwargs)
            except TypeError:
                raise  # a bad call: the function would raise the same
            except CasmonError as e:
                self.warn(("store",), f"casmon: {self.name} runs uncached: {e}")
                ctx = (None, (), None, None)
        key = ctx[0]
        held = None
        if key is not None:
            try:
                found, value, d = self._lookup(key)
                if not found and waits and self.wait is not False and not self._quick():
                    found, value, held = _claims().wait_or_hold(self, key)
            except (CasmonError, OSError) as e:  # the store is unreachable or full: the function computes
                self.warn(("store-read", type(e)), f"casmon: {self.name} runs uncached while its store cannot be "
                                                   f"read: {e}")
                found, value = False, None
            if found:
                hot.served(value, key, getattr(self._store, "url", None))
                if ck is not None and d is not None and prefix is not None:
                    hc.learn(self, ck, key, d, value, prefix)  # type: ignore[union-attr]
                return ctx, True, value
        self.misses += 1
        return ctx + (held,), False, None

    def _quick(self) -> bool:
        """Its last calls here took under :data:`claims.CLAIM_MIN_S` (remote: ``CLAIM_MIN_S_REMOTE``): no claim, no wait."""
        r = self._recent
        if not r:
            return False
        s = self._store
        if s is not self._limit_of:  # is_local builds a path: once per store, not per call
            claims = _claims()
            self._limit = claims.CLAIM_MIN_S if s is None or s.backend.is_local else claims.CLAIM_MIN_S_REMOTE
            self._limit_of = s  # after the limit: another thread never sees this store with the limit unset
        return max(r) < self._limit

    def _done(self, held: claims.Held | None, failed: bool = False) -> None:
        if held is not None:  # a computing call held its key: release it (casmon.caching.claims)
            _claims().release(self, held, failed)

    def abort(self, ctx: Any) -> None:
        """The function raised: release the key for the threads and processes waiting for it."""
        self._done(ctx[4] if len(ctx) > 4 else None, failed=True)

    def end(self, ctx: Any, result: Any, t0: float, args: tuple, kwargs: dict) -> None:
        """The function returned ``result``: store it (:mod:`casmon.caching.saving`) and release its key."""
        (_saving or _saving_module()).end(self, ctx, result, t0, args, kwargs)

    # -- helpers ------------------------------------------------------------------
    def entries(self) -> list[tuple[Digest, dict]]:
        """This function's live entries, one per key (the newest record of each)."""
        cleared = self.cleared_time(refresh=True)
        if self.expires is not None:  # older ones are misses
            cleared = max(cleared, time.time() - self.expires)
        return list(newest_per_key((k, r) for k, r in self.store.records(KIND)
                                    if r.get("fn") == self.name and r.get("time", 0) > cleared).values())

    def not_cached(self, key: Digest | None, args: tuple, kwargs: dict) -> str:
        """Why ``lookup``/``ref`` found nothing: what differs from the nearest stored entry, and where the entries
        are if they are under another name."""
        if key is None:
            return f"{self.name}: this call cannot be keyed (see the warning), so it is never cached"
        try:
            from casmon.caching import explain
            return f"{self.name}: this call is not cached: {explain.explain_call(self, args, kwargs).why()}"
        except (CasmonError, OSError) as e:
            return f"{self.name}: this call is not cached (its store cannot be read to say why: {e})"

    def clear(self) -> None:
        now = time.time()
        self.store.append(KIND_CLEAR, {"fn": self.name, "time": now}, key=name_digest(self.name))
        self.store.flush()
        self._cleared_at = now
        self.forget()


# -- the wrapper --------------------------------------------------------------------------------------------
class CachedFunction:
    """A function memoized by ``@casmon.cache``: call it like the function.

    It keeps the function's name, docstring and signature, binds as a method,
    and pickles: by reference when its module names it (``mod.f`` is this
    object), otherwise as "cache this function with these options" — so
    ``Pool.map(casmon.cache(f), ...)``, ``joblib.Parallel`` and Dask can ship it
    to workers, where it uses the same store and the same keys.
    """

    __slots__ = ("__casmon_cache__", "__dict__", "__weakref__")

    def __init__(self, state: CacheState) -> None:
        self.__casmon_cache__ = state
        functools.update_wrapper(self, state.fn)

    def __call__(self, /, *args, **kwargs):  # positional-only: a parameter named self is given by keyword
        state = self.__casmon_cache__
        ctx, found, value = state.begin(args, kwargs)
        if found:
            return value
        t0 = time.perf_counter()
        try:
            result = state.fn(*args, **kwargs)
        except BaseException:
            state.abort(ctx)
            raise
        state.end(ctx, result, t0, args, kwargs)
        return result

    def __get__(self, obj, objtype=None):
        if obj is None:
            return self
        return types.MethodType(self, obj)

    def __repr__(self) -> str:
        return f"<casmon.cache of {self.__casmon_cache__.name}>"

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        from casmon.caching.workers import reduce_cached

        return reduce_cached(self)

    # helpers
    def cache_info(self) -> CacheInfo:
        """Hits and misses in this process; entries (one per key) and their results' bytes in the store, each
        stored value once."""
        state = self.__casmon_cache__
        entries = state.entries()
        values = {result_of(bytes(k), r): int(r.get("size", 0)) for k, r in entries}
        return cache_info_type()(state.hits, state.misses, len(entries), sum(values.values()))

    def entries(self) -> display.CacheEntries:
        """This function's entries in the store, newest first, as :class:`ResultRef` handles (nothing loaded).

        A list that shows itself as a table; ``.to_pandas()`` gives a DataFrame.
        """
        from casmon.store.peek import as_digest

        state = self.__casmon_cache__
        from casmon.caching.resultref import ResultRef  # a handle: never made by a call

        refs = [ResultRef(state.store, as_digest(r.get("result"), f"cache entry {k.hex()} of {state.name}"), k, r)
                for k, r in state.entries()]
        refs.sort(key=lambda x: x.entry.get("time", 0), reverse=True)
        from casmon.view import display

        return display.CacheEntries(refs)

    def cache_clear(self) -> None:
        """Forget every cached result of this function (in every process using the store)."""
        self.__casmon_cache__.clear()

    def is_cached(self, /, *args, **kwargs) -> bool:
        state = self.__casmon_cache__
        key = state.key(args, kwargs)
        if key is None:
            return False
        state.cleared_time(refresh=True)  # a clear elsewhere, and expiry, count: as a call would see them
        return state.find(key) is not None

    def ref(self, /, *args, **kwargs) -> ResultRef:
        """A handle to the stored result of this call, without loading it; KeyError if not cached."""
        state = self.__casmon_cache__
        key = state.key(args, kwargs)
        found = state.find(key) if key is not None else None
        if key is None or found is None:
            raise KeyError(state.not_cached(key, args, kwargs))
        from casmon.caching.resultref import ResultRef

        return ResultRef(state.store, found[0], key, found[1])

    def lookup(self, /, *args, **kwargs) -> Any:
        """The stored result of this call, never computing it; ``KeyError`` saying why if it is not stored."""
        state = self.__casmon_cache__
        key = state.key(args, kwargs)
        found, value = state.lookup_result(key) if key is not None else (False, None)
        if not found:
            raise KeyError(state.not_cached(key, args, kwargs))
        return value

    def refresh(self, /, *args, **kwargs) -> Any:
        """Compute this call again, whatever is stored, and make its result the entry; returns it."""
        state = self.__casmon_cache__
        ctx = state.key_ctx(args, kwargs) if not state._custom_key else (state.key(args, kwargs), (), None, None)
        t0 = time.perf_counter()
        result = state.fn(*args, **kwargs)
        if ctx[0] is not None:
            state._replacing.add(bytes(ctx[0]))
        state.end(ctx, result, t0, args, kwargs)
        return result

    def explain(self, /, *args, **kwargs) -> explain.Explanation:
        """Whether this call is a hit, and if not, what differs between it and the nearest stored entries:
        which parameters (by name), which code (the function or a helper, with a source diff), globals, files."""
        from casmon.caching import explain
        return explain.explain_call(self.__casmon_cache__, args, kwargs)


def cache(
    fn: Callable | None = None,
    *,
    store: Store | str | None = None,
    ignore: Iterable[str | int] = (),
    hashers: Mapping[str | int, Callable[[Any], Any]] | None = None,
    version: str | None = None,
    label: str | Callable[..., str] | None = None,
    memory_entries: int = 100_000,
    files: Iterable[str | int] | str | int = (),
    wait: bool | float = True,
    expires_after: timedelta | float | None = None,
    mmap: bool = False,
    _state_class: type | None = None,
):
    """Memoize ``fn`` on a casmon store.

    ``store``: a :class:`Store` or location (default: :func:`casmon.store.store.default_store`).
    ``ignore``: parameters (names or positions) that do not count, like ``verbose``.
    ``hashers``: per parameter (name or position), a function turning the value
    into what counts for the key, e.g. ``{"df": lambda df: df.shape}``.
    ``files``: parameters (names or positions) holding paths -- a ``str`` or
    ``os.PathLike``, a list of them, or None -- that count by the **content** of
    the file or folder they name (and by the path as passed). A file is hashed
    once and then remembered by its stat (device, inode, size, mtime, ctime),
    so a hit on a large file costs one ``stat``; the digests of the files are
    recorded in the cache entry.
    ``version``: pin the function's version by hand; without it, editing the
    function, a helper it calls or a value it reads from your own modules
    invalidates its results (re-checked at every call).
    ``label``: a name (or a function of the call's arguments) shown in ``casmon cache``.
    ``wait``: a slow miss (its function's recent calls took 0.1 s or more, or
    it has not run yet here) of a key another live process or thread is
    computing waits for that result instead of computing it again, taking over
    if that process dies (:mod:`casmon.caching.claims`); False never waits, a
    number waits at most that many seconds.
    ``expires_after``: a ``timedelta`` or seconds; older entries are misses, and
    ``casmon gc`` drops them. ``mmap``: hits return large arrays as read-only maps of the stored bytes
    on a local store (tensors copy-on-write), not copies (:mod:`casmon.store.mapped`).

    The wrapped function gains ``cache_info()``, ``cache_clear()``,
    ``is_cached(...)``, ``ref(...)``, ``lookup(...)`` (the stored result or
    ``KeyError``, never computing), ``refresh(...)`` (compute again and replace
    the entry) and ``explain(...)`` (why a call misses).
    """
    if fn is None:
        return functools.partial(cache, store=store, ignore=ignore, hashers=hashers, version=version, label=label,
                                 memory_entries=memory_entries, files=files, wait=wait, expires_after=expires_after,
                                 mmap=mmap, _state_class=_state_class)
    if isinstance(fn, (staticmethod, classmethod)):
        return type(fn)(cache(fn.__func__, store=store, ignore=ignore, hashers=hashers, version=version, label=label,
                              memory_entries=memory_entries, files=files, wait=wait, expires_after=expires_after,
                              mmap=mmap, _state_class=_state_class))
    if not callable(fn):
        raise TypeError(f"@cache expects a function, got {type(fn).__name__}")
    if is_generator(fn):
        raise TypeError(f"@cache cannot cache generator {function_name(fn)}: it returns an iterator, not a value")
    state = (_state_class or CacheState)(fn, store, ignore, hashers, version, label, memory_entries, files=files,
                                         wait=wait, expires_after=expires_after, mmap=mmap)
    if is_async(fn):
        from casmon.caching.asyncwrap import async_wrapper

        return async_wrapper(state, CachedFunction)
    return CachedFunction(state)


def _safe_key(state: CacheState, args: tuple, kwargs: dict) -> Digest | None:
    try:
        return state.key(args, kwargs)
    except TypeError:
        raise  # a bad call: the function would raise the same
    except CasmonError as e:
        state.warn(("store",), f"casmon: {state.name} runs uncached: {e}")
        return None


def cache_with(state_class: type[CacheState], fn: Callable, **options: Any) -> Any:
    """``cache(fn, **options)`` with calls keyed by ``state_class``: a :class:`CacheState` subclass that
    overrides :meth:`CacheState.key` (``compat.finecache`` keys calls by FineCache's per-position hashers)."""
    return cache(fn, _state_class=state_class, **options)
