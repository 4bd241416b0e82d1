"""``@casmon.cache``: memoize expensive functions on the store.

The key of a call is one fingerprint of: the function's name, its version
(:mod:`casmon.keys.codeversion`, or ``version=``), and its arguments bound to its
signature with defaults applied, in parameter order, so ``f(1)``, ``f(x=1)``
and ``f(1, y=<default>)`` share one key. ``**kwargs`` count by name, not order.

A cache entry is a record of kind ``cache`` under that key, pointing at the
result's digest: no file per entry, and a result that is already stored (the
same array returned by many calls) is not stored again.

Concurrency: no locks. Two processes that miss the same key at once both
compute it and both store it; the second does not wait for the first. Both
entries point at equal results, and either is used.

Failures never cost the caller a result: an argument that cannot be hashed, a
result that cannot be pickled, a full disk or a damaged stored result each give
one warning, and the function's own result is returned.

This module only memoizes (after joblib's ``memory.py``): file digests are in
:mod:`~casmon.caching.files`, pickling for worker processes in
:mod:`~casmon.caching.workers`, entries, eviction and admin in
:mod:`~casmon.caching.entries`.
"""

from __future__ import annotations

import base64
import functools
import inspect
import os
import sys
import threading
import time
import types
import warnings
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any, NamedTuple

from casmon.caching.entries import KIND, KIND_CLEAR, KIND_FN, KIND_USE, ResultRef, name_digest, newest_per_key
from casmon.caching.files import files_key_value
# Old pickles name ``casmon.cache._rebuild`` (serialize.MOVED_MODULES sends them here): these names must resolve.
from casmon.caching.workers import _by_name, _rebuild, _rebuild_state, reduce_cached, reduce_state  # noqa: F401
from casmon.errors import CasmonError, DamagedObjectError, MissingObjectError
from casmon.keys.codeversion import VersionedFingerprinter, function_name, unwrap_callable, version_tracker
from casmon.keys.digest import Digest
from casmon.keys.fingerprint import Fingerprinter, fingerprint
from casmon.store.store import Store, default_store
from casmon.view import display
from casmon.view.text import plural

__all__ = ["cache", "cache_with", "CacheInfo", "CacheWarning", "CachedFunction", "CacheState", "KEY_FORMAT", "observers"]

#: Part of every call key; raised when what a key means changes, so old entries are never misread.
KEY_FORMAT = 2


#: Called as ``observer(store, fn_name, key, result_digest, hit)`` on every hit and stored miss
#: (runs use it to record which cache entries they used).
observers: list = []


class CacheWarning(UserWarning):
    """Something kept a call from being cached or a hit from being used; the result is still returned."""


class CacheInfo(NamedTuple):
    hits: int  # in this process
    misses: int  # in this process
    entries: int  # in the store, all processes
    stored_bytes: int  # logical size of those entries' results


class _Param(NamedTuple):
    name: str
    kind: Any
    default: Any


_EMPTY = inspect.Parameter.empty


class _Usage:
    """Hit counts since the last flush, written as one record per flush."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.hits: dict[str, list] = {}

    def hit(self, key: Digest, fn: str) -> None:
        h = key.hex()
        now = time.time()
        with self.lock:
            e = self.hits.get(h)
            if e is None:
                self.hits[h] = [fn, 1, now]
            else:
                e[1] += 1
                e[2] = now

    def flush_into(self, store: Store) -> None:
        with self.lock:
            hits, self.hits = self.hits, {}
        if hits:
            store.append(KIND_USE, {"hits": hits, "time": time.time()})


_usage_by_store: dict[int, _Usage] = {}
_usage_lock = threading.Lock()
if hasattr(os, "register_at_fork"):
    # A forked child's store forgets the parent's flush hooks; its hit counts start over with it.
    os.register_at_fork(after_in_child=_usage_by_store.clear)


def _usage(store: Store) -> _Usage:
    u = _usage_by_store.get(id(store))
    if u is None:
        with _usage_lock:
            u = _usage_by_store.get(id(store))
            if u is None:
                u = _Usage()
                _usage_by_store[id(store)] = u
                store.add_flush_hook(u.flush_into)
    return u


#: At most this many files of one call are listed in its cache entry (folders count as a whole beyond).
FILES_RECORDED = 1000
#: A result whose manifest is at most this long (a small JSON or pickle value, no chunks) is copied
#: into its cache entry: a hit in a fresh process then reads one table block, not the index and a pack.
INLINE_MAX = 256


# -- the state behind one cached function ---------------------------------------------------------------
_NO_SELF = object()
_PKG_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _user_stacklevel() -> int:
    """The ``stacklevel`` that points a warning at the caller's line, outside casmon."""
    f: types.FrameType | None = sys._getframe(1)
    level = 1
    while f is not None and f.f_code.co_filename.startswith(_PKG_DIR):
        f = f.f_back
        level += 1
    return level


_checked_versions: dict = {}  # (id(store), name) -> the version last checked against the store in this process
#: The code-change warning counts entries per version only in cache tables up to this size (it reads them all).
VERSION_COUNT_MAX = 1_000_000
#: The first misses of a function whose key is computed again, to find arguments that never hash the same.
STABILITY_CHECKS = 2
#: Code-change warnings per function and process; the last one says no more follow.
VERSION_WARNINGS_MAX = 5
_version_warnings: dict[str, int] = {}


class CacheState:
    """The state behind one decorated function."""

    def __init__(self, fn, store, ignore, hashers, version, label, memory_entries, files=()) -> None:
        self.fn = fn
        self.name = function_name(fn)
        self._store_arg = store
        self._store: Store | None = None
        self.sig = inspect.signature(fn)
        self.params = [_Param(p.name, p.kind, p.default) for p in self.sig.parameters.values()]
        names = [p.name for p in self.params]
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
        self._options = {"store": store, "ignore": list(ignore or ()), "hashers": dict(hashers or {}), "version": version,
                         "label": label, "memory_entries": memory_entries, "files": list(files or ())}
        self._simple = all(p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.KEYWORD_ONLY) for p in self.params)
        self._npos = sum(1 for p in self.params if p.kind != inspect.Parameter.KEYWORD_ONLY)
        self._names = names
        self._index = {p.name: i for i, p in enumerate(self.params) if p.kind != inspect.Parameter.POSITIONAL_ONLY}
        self._name_bytes = []
        for p in self.params:
            nfp = Fingerprinter()
            nfp.str_(p.name)
            self._name_bytes.append(bytes(nfp.out))
        # A bound method (``casmon.cache(obj.method)``): its object counts like an argument, in every key.
        self._bound = fn.__self__ if isinstance(fn, types.MethodType) else _NO_SELF
        target = fn.__func__ if isinstance(fn, types.MethodType) else fn
        self.tracker = None if version is not None else version_tracker(unwrap_callable(target))
        self.version: Digest | None = None
        self._prefix: bytes | None = None
        self._mem: OrderedDict[bytes, bytes] = OrderedDict()  # key -> result digest
        self._mem_max = memory_entries
        self._lock = threading.Lock()
        self._custom_key = type(self).key is not CacheState.key  # compat.finecache keys its own way
        self.hits = 0
        self.misses = 0
        self._warned: set = set()
        self._stability_checks = 0  # misses whose key was computed again (see _check_stable)
        self._cleared_at: float | None = None

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        return reduce_state(self)

    def options(self) -> dict:
        """The options to rebuild this cached function elsewhere (a worker process)."""
        opts = dict(self._options)
        s = opts["store"]
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
            s = self._store = default_store(self._store_arg)
        return s

    def key_prefix(self) -> bytes:
        """The key's first part: the function's name and its version, re-checked at each call.

        A subclass that keys calls its own way (``compat.finecache``) starts its key with it.
        """
        t = self.tracker
        if t is None:  # pinned by hand
            p = self._prefix
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
            p = self._prefix
            if version != self.version or p is None:
                self._check_version(version)
                self._warn_unhashable(t)
                p = self._prefix = bytes(fingerprint(("casmon.cache", KEY_FORMAT, self.name, version)))
            self.version = version
            return p

    def _warn_unhashable(self, t) -> None:
        for name, tname in t.unhashable:
            self.warn(("unhashable-global", name, tname),
                       f"casmon: {self.name} reads {name!r} ({tname}), which cannot be hashed: the cache counts it by "
                       "its type only and cannot see its state. Pass what matters as an argument, or pin version=.")

    def _check_version(self, version: Digest) -> None:
        """When this code is not the version cached last, say which results are used now (once per change)."""
        try:
            store = self.store
            done = (id(store), self.name)
            if _checked_versions.get(done) == version:
                return
            nd = name_digest(self.name)
            seen = store.lookup(KIND_FN, nd)
            latest = max(seen, key=lambda r: r.get("time", 0)) if seen else None
            if (latest is not None and latest.get("version") != version.hex() and self.version_pin is None
                    and "<lambda>" not in self.name):
                n = _version_warnings[self.name] = _version_warnings.get(self.name, 0) + 1
                if n <= VERSION_WARNINGS_MAX:  # code that changes at every call (a global it mutates) would flood
                    msg = self._version_message(version, seen)
                    if n == VERSION_WARNINGS_MAX:
                        msg += " Further changes of its code in this process are not reported."
                    warnings.warn(msg, CacheWarning, stacklevel=_user_stacklevel())
            if latest is None or latest.get("version") != version.hex():
                store.append(KIND_FN, {"fn": self.name, "version": version.hex(), "time": time.time()}, key=nd)
            _checked_versions[done] = version
        except CasmonError as e:
            self.warn(("store",), f"casmon: cache of {self.name} cannot reach its store: {e}")

    def _version_message(self, version: Digest, seen: list[dict]) -> str:
        """What happens now that the code is ``version``: which entries are used, how many other versions hold."""
        vh = version.hex()
        first = min((r.get("time", 0) for r in seen if r.get("version") == vh), default=None)
        mine, others, other_versions, unknown = self._entries_by_version(vh)
        if others is None:
            rest = "entries of other versions stay in the store, unused while the code is as it is now"
        elif others == 0:
            rest = "no entries of other versions remain"
        else:
            rest = (f"{plural(others, 'entry', 'entries')} of {plural(other_versions or 0, 'other version')} stay in the store, "
                    "unused while the code is as it is now")
        if unknown:
            rest += f" ({plural(unknown, 'older entry', 'older entries')} {'does' if unknown == 1 else 'do'} not say its version)"
        free = (f"`casmon cache clear {self.name}`, then two `casmon gc` an hour apart (or `casmon gc --now` while "
                "nothing else writes), frees the space of all of them.")
        if first is not None:
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(first))
            used = ("its entries are used" if not mine and (mine is None or unknown) else
                    "none of its entries remain, so calls compute again" if not mine else
                    f"its {plural(mine, 'entry', 'entries')} {'is' if mine == 1 else 'are'} used")
            return (f"casmon: the code of {self.name} matches a version cached before (first seen {when}), not the "
                    f"one cached last: {used}; {rest}. {free}")
        return (f"casmon: the code of {self.name} (or of a function it calls, or a value it reads) changed since its "
                f"results were cached: this version has none yet, so calls compute again; {rest} (used again if the "
                f"code goes back). {free}")

    def _entries_by_version(self, vh: str) -> tuple[int | None, int | None, int | None, int]:
        """``(entries of version vh, entries of other versions, how many other versions, entries that do not
        say their version)``, one per key (entries written before casmon recorded versions say none);
        ``(None, None, None, 0)`` when the cache table is too large to read for a warning."""
        store = self.store
        if store.table(KIND).count() > VERSION_COUNT_MAX:
            return None, None, None, 0
        cleared = self._cleared_time(refresh=True)
        live = newest_per_key((k, r) for k, r in store.records(KIND, strict=False)
                               if r.get("fn") == self.name and r.get("time", 0) > cleared)
        mine, versions, others, unknown = 0, set(), 0, 0
        for _k, r in live.values():
            v = r.get("v")
            if v == vh:
                mine += 1
            elif v is None:
                unknown += 1
            else:
                others += 1
                versions.add(v)
        return mine, others, len(versions), unknown

    # -- keys -------------------------------------------------------------------
    def bind(self, args: tuple, kwargs: dict) -> list:
        """Argument values in parameter order, defaults applied."""
        vals: list[Any] | None
        if self._simple and len(args) <= self._npos:
            vals = list(args)
            params = self.params
            n = len(args)
            if kwargs:
                idx = self._index
                vals.extend([_EMPTY] * (len(params) - n))
                for k, v in kwargs.items():
                    i = idx.get(k)
                    if i is None or i < n:
                        vals = None  # unknown or duplicate argument: let inspect say so
                        break
                    vals[i] = v
                if vals is not None:
                    for i in range(n, len(params)):
                        if vals[i] is _EMPTY:
                            if params[i].default is _EMPTY:
                                vals = None
                                break
                            vals[i] = params[i].default
                    if vals is not None:
                        return vals
            else:
                for p in params[n:]:
                    if p.default is _EMPTY:
                        break
                    vals.append(p.default)
                else:
                    return vals
        ba = self.sig.bind(*args, **kwargs)  # raises the usual TypeError for a bad call
        ba.apply_defaults()
        vals = []
        for p in self.params:
            v = ba.arguments[p.name]
            if p.kind == inspect.Parameter.VAR_KEYWORD:
                v = dict(sorted(v.items()))
            vals.append(v)
        return vals

    def key(self, args: tuple, kwargs: dict) -> Digest | None:
        """The call's key, or None (with one warning) if an argument cannot be hashed."""
        return self._key_ctx(args, kwargs)[0]

    def _key_ctx(self, args: tuple, kwargs: dict) -> tuple:
        """``(key or None, trackers consulted, files listing)``."""
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
                return None, fp.trackers, None
        for p, nb, v in zip(self.params, self._name_bytes, vals):
            name = p.name
            if ignore and name in ignore:
                continue
            try:
                if listing is not None and name in files:  # listing is a list exactly when files= names some
                    n0 = len(listing)
                    v = files_key_value(v, listing)
                    for i in range(n0, len(listing)):
                        listing[i] = (name,) + listing[i]
                elif hashers and name in hashers:
                    v = hashers[name](v)
                fp.out += nb
                fp.feed_value(v, name)
            except Exception as e:  # noqa: BLE001 - never a wrong hit: do not cache this call
                t = type(v)
                tname = t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"
                what = "cannot be read" if files and name in files else "cannot be hashed"
                remedy = "" if what == "cannot be read" else (
                    f" To cache it, leave it out of the key with @casmon.cache(ignore=[{name!r}]) or hash it yourself "
                    f"with hashers={{{name!r}: lambda v: ...}}.")
                self.warn(("arg", name, t), f"casmon: {self.name} is not cached for this call: parameter {name!r} "
                           f"({tname}) {what}, so the call is skipped by the cache: {e}.{remedy}")
                return None, fp.trackers, None
        return fp.digest(), fp.trackers, listing

    def warn(self, what: Hashable, msg: str) -> None:
        """Warn ``msg`` as a :class:`CacheWarning` at the caller's line, once per ``what`` for this function."""
        if what not in self._warned:
            self._warned.add(what)
            warnings.warn(msg, CacheWarning, stacklevel=_user_stacklevel())

    # -- lookups ----------------------------------------------------------------
    def _cleared_time(self, refresh: bool) -> float:
        if self._cleared_at is None or refresh:
            recs = self.store.lookup(KIND_CLEAR, name_digest(self.name), refresh=refresh)
            self._cleared_at = max((r.get("time", 0.0) for r in recs), default=0.0)
        return self._cleared_at

    def find(self, key: Digest, refresh: bool = True) -> tuple[Digest, dict] | None:
        entries = self.store.lookup(KIND, key, refresh=refresh)
        if not entries:
            return None
        cleared = self._cleared_time(refresh=False)
        good = [e for e in entries if e.get("time", 0) > cleared and "result" in e]
        if not good:
            return None
        e = max(good, key=lambda r: r.get("time", 0))
        return Digest(e["result"]), e

    def _remember(self, key: Digest, result: Digest) -> None:
        with self._lock:
            # Plain bytes, not Digests: the garbage collector walks instances of Python classes at
            # every full collection (a 1M-entry build spent a sixth of its time there).
            self._mem[bytes(key)] = bytes(result)
            if len(self._mem) > self._mem_max:
                self._mem.popitem(last=False)

    def lookup_result(self, key: Digest):
        """(found, value): a hit loads a fresh copy; damage gives a warning and a miss."""
        d = self._mem.get(key)
        if d is not None:
            d = Digest.from_raw(d)
        else:
            found = self.find(key)
            if found is None:
                return False, None
            d = found[0]
            inline = found[1].get("inline")
            if isinstance(inline, str):
                try:  # used only if it hashes to the result's digest
                    self.store.objects.prime(d, base64.b64decode(inline, validate=True))
                except ValueError:
                    pass
        try:
            value = self.store.get(d)
        except MissingObjectError as e:
            with self._lock:
                remembered = self._mem.pop(key, None) == d
            if remembered:  # gc dropped what this process remembered (a duplicate, an evicted entry): ask the store
                return self.lookup_result(key)
            return self._unreadable(key, d, e)
        except DamagedObjectError as e:
            return self._unreadable(key, d, e)
        except CasmonError:
            raise
        except Exception as e:  # noqa: BLE001 - a handler or a class's __setstate__ cannot rebuild it here: compute
            return self._unreadable(key, d, f"it cannot be loaded: {type(e).__name__}: {e}")
        self._remember(key, d)
        self.hits += 1
        _usage(self.store).hit(key, self.name)
        if observers:
            for ob in list(observers):
                ob(self.store, self.name, key, d, True)
        return True, value

    def _unreadable(self, key: Digest, d: Digest, why: Any) -> tuple[bool, None]:
        self.warn(("damaged", d), f"casmon: the cached result of {self.name} is damaged or missing; recomputing ({why})")
        with self._lock:
            self._mem.pop(key, None)
        return False, None

    def save(self, key: Digest, result: Any, seconds: float, args: tuple, kwargs: dict, files: list | None = None) -> None:
        """Store a computed result; a failure is a warning, never an exception."""
        try:
            store = self.store  # opened at first use: a store away then is a warning too
            d, size = store.put_sized(result)
        except TypeError as e:
            self.warn(("result", type(result)), f"casmon: the result of {self.name} is returned but not cached: {e}")
            return
        except Exception as e:  # noqa: BLE001 - a storage error must not lose the result
            self.warn(("store-error", type(e)), f"casmon: the result of {self.name} is returned but not cached: {e}")
            return
        entry = {"fn": self.name, "result": d.hex(), "time": time.time(), "seconds": round(seconds, 6), "size": size}
        raw = store.objects.peek_raw(d, INLINE_MAX)
        if raw is not None and raw[:1] in (b"j", b"p"):  # self-contained forms: no chunks, no children
            entry["inline"] = base64.b64encode(raw).decode()
        if self.version is not None:
            entry["v"] = self.version.hex()  # which code version made it: the code-change warning counts them
        if files:
            # The input files' digests, so `casmon show` and run diffs can say which input changed.
            entry["files"] = [list(f) for f in files[:FILES_RECORDED]]
            if len(files) > FILES_RECORDED:
                entry["files_truncated"] = len(files)
        if self.label is not None:
            try:
                entry["label"] = self.label(*args, **kwargs) if callable(self.label) else str(self.label)
            except Exception as e:  # noqa: BLE001
                entry["label"] = f"<label failed: {e}>"
        try:
            store.append(KIND, entry, key=key, refs=[d])
        except Exception as e:  # noqa: BLE001
            self.warn(("store-error", type(e)), f"casmon: the result of {self.name} is returned but not cached: {e}")
            return
        self._remember(key, d)
        if observers:
            for ob in list(observers):
                ob(store, self.name, key, d, False)

    # -- the two halves of a call, around the function itself ---------------------
    def begin(self, args: tuple, kwargs: dict) -> tuple[Any, bool, Any]:
        """``(ctx, found, value)``: a hit returns the stored value; a miss counts and passes ``ctx`` to :meth:`end`."""
        if self._custom_key:
            ctx = (_safe_key(self, args, kwargs), (), None)
        else:
            try:
                ctx = self._key_ctx(args, kwargs)
            except TypeError:
                raise  # a bad call: the function would raise the same
            except CasmonError as e:
                self.warn(("store",), f"casmon: {self.name} runs uncached: {e}")
                ctx = (None, (), None)
        key = ctx[0]
        if key is not None:
            try:
                found, value = self.lookup_result(key)
            except (CasmonError, OSError) as e:  # the store is unreachable or full: the function computes
                self.warn(("store-read", type(e)), f"casmon: {self.name} runs uncached while its store cannot be "
                                                   f"read: {e}")
                found, value = False, None
            if found:
                return ctx, True, value
        self.misses += 1
        return ctx, False, None

    def end(self, ctx: Any, result: Any, t0: float, args: tuple, kwargs: dict) -> None:
        key, trackers, files = ctx
        seconds = time.perf_counter() - t0
        # What the function changed itself while it ran is not an edit of the values it reads.
        if self.tracker is not None:
            self.tracker.observe()
        for t in trackers:
            t.observe()
        if key is not None:
            if files:
                self.save(key, result, seconds, args, kwargs, files=files)
            else:
                self.save(key, result, seconds, args, kwargs)
            if self._stability_checks < STABILITY_CHECKS and not self._custom_key:
                self._check_stable(key, args, kwargs)

    def _check_stable(self, key: Digest, args: tuple, kwargs: dict) -> None:
        """After the first misses: the key again. An argument that hashes differently each time (a
        ``__reduce__`` with a counter, a fresh id) makes every call a miss; say which, once."""
        self._stability_checks += 1
        try:
            again = self._key_ctx(args, kwargs)[0]
        except Exception:  # noqa: BLE001 - the first key was computed: nothing new to say
            return
        if again is None or again == key:
            return
        unstable = []
        for p, v in zip(self.params, self.bind(args, kwargs)):
            if p.name in self.ignore:
                continue
            try:
                if fingerprint(v) != fingerprint(v):
                    unstable.append(p.name)
            except Exception:  # noqa: BLE001
                continue
        if not unstable:
            return  # the arguments are stable: the code's version changed meanwhile (the code-change warning's job)
        which = f"parameter {', '.join(map(repr, unstable))} hashes"
        self.warn(("unstable",), f"casmon: {self.name} will never be a cache hit: {which} differently each time "
                                 f"(a value whose pickle is not the same twice, or one the call changed). Hash it "
                                 f"yourself with hashers={{name: lambda v: ...}}, or leave it out with ignore=[...]")

    # -- helpers ------------------------------------------------------------------
    def entries(self) -> list[tuple[Digest, dict]]:
        """This function's live entries, one per key (the newest record of each)."""
        cleared = self._cleared_time(refresh=True)
        return list(newest_per_key((k, r) for k, r in self.store.records(KIND)
                                    if r.get("fn") == self.name and r.get("time", 0) > cleared).values())

    def clear(self) -> None:
        now = time.time()
        self.store.append(KIND_CLEAR, {"fn": self.name, "time": now}, key=name_digest(self.name))
        self.store.flush()
        self._cleared_at = now
        with self._lock:
            self._mem.clear()


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

    def __call__(self, *args, **kwargs):
        state = self.__casmon_cache__
        ctx, found, value = state.begin(args, kwargs)
        if found:
            return value
        t0 = time.perf_counter()
        result = state.fn(*args, **kwargs)
        state.end(ctx, result, t0, args, kwargs)
        return result

    def __get__(self, obj, objtype=None):
        if obj is None:
            return self
        return types.MethodType(self, obj)

    def __repr__(self) -> str:
        return f"<casmon.cache of {self.__casmon_cache__.name}>"

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        return reduce_cached(self)

    # helpers
    def cache_info(self) -> CacheInfo:
        """Hits and misses in this process; entries and their results' bytes in the store (one per key)."""
        state = self.__casmon_cache__
        entries = state.entries()
        return CacheInfo(state.hits, state.misses, len(entries), sum(int(r.get("size", 0)) for _, r in entries))

    def entries(self) -> display.CacheEntries:
        """This function's entries in the store, newest first, as :class:`ResultRef` handles (nothing loaded).

        A list that shows itself as a table; ``.to_pandas()`` gives a DataFrame.
        """
        from casmon.store.peek import as_digest

        state = self.__casmon_cache__
        refs = [ResultRef(state.store, as_digest(r.get("result"), f"cache entry {k.hex()} of {state.name}"), k, r)
                for k, r in state.entries()]
        refs.sort(key=lambda x: x.entry.get("time", 0), reverse=True)
        return display.CacheEntries(refs)

    def cache_clear(self) -> None:
        """Forget every cached result of this function (in every process using the store)."""
        self.__casmon_cache__.clear()

    def is_cached(self, *args, **kwargs) -> bool:
        state = self.__casmon_cache__
        key = state.key(args, kwargs)
        return key is not None and (key in state._mem or state.find(key) is not None)

    def ref(self, *args, **kwargs) -> ResultRef:
        """A handle to the stored result of this call, without loading it; KeyError if not cached."""
        state = self.__casmon_cache__
        key = state.key(args, kwargs)
        found = state.find(key) if key is not None else None
        if key is None or found is None:
            raise KeyError(f"{state.name}: this call is not cached")
        return ResultRef(state.store, found[0], key, found[1])


def _async_wrapper(state: CacheState) -> Callable:
    """``@casmon.cache`` of an ``async def`` function: an ``async def`` function itself, so
    ``inspect.iscoroutinefunction`` (and the frameworks that ask it) see a coroutine function."""

    @functools.wraps(state.fn)
    async def async_cached(*args, **kwargs):
        ctx, found, value = state.begin(args, kwargs)
        if found:
            return value
        t0 = time.perf_counter()
        result = await state.fn(*args, **kwargs)
        state.end(ctx, result, t0, args, kwargs)
        return result

    # The helpers of a CachedFunction, as attributes of the coroutine function (read by duck typing).
    wrapper: Any = async_cached
    wrapper.__casmon_cache__ = state
    wrapper.cache_info = functools.partial(CachedFunction.cache_info, wrapper)
    wrapper.cache_clear = functools.partial(CachedFunction.cache_clear, wrapper)
    wrapper.is_cached = functools.partial(CachedFunction.is_cached, wrapper)
    wrapper.ref = functools.partial(CachedFunction.ref, wrapper)
    return wrapper


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

    The wrapped function gains ``cache_info()``, ``cache_clear()``,
    ``is_cached(*args, **kwargs)`` and ``ref(*args, **kwargs)``.
    """
    if fn is None:
        return functools.partial(cache, store=store, ignore=ignore, hashers=hashers, version=version, label=label,
                                 memory_entries=memory_entries, files=files, _state_class=_state_class)
    if isinstance(fn, (staticmethod, classmethod)):
        return type(fn)(cache(fn.__func__, store=store, ignore=ignore, hashers=hashers, version=version, label=label,
                              memory_entries=memory_entries, files=files, _state_class=_state_class))
    if not callable(fn):
        raise TypeError(f"@cache expects a function, got {type(fn).__name__}")
    if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
        raise TypeError(f"@cache cannot cache generator {function_name(fn)}: it returns an iterator, not a value")
    state = (_state_class or CacheState)(fn, store, ignore, hashers, version, label, memory_entries, files=files)
    if inspect.iscoroutinefunction(fn):
        return _async_wrapper(state)
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
