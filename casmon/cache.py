"""``@casmon.cache``: memoize expensive functions on the store.

The key of a call is one fingerprint of: the function's name, its version
(:mod:`casmon.codeversion`, or ``version=``), and its arguments bound to its
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
"""

from __future__ import annotations

import functools
import inspect
import os
import threading
import time
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from .codeversion import function_name, function_version
from .digest import Digest
from .errors import CasmonError, DamagedObjectError, MissingObjectError
from .fingerprint import Fingerprinter, fingerprint
from .store import Store, default_store

__all__ = ["cache", "CacheInfo", "ResultRef", "CacheWarning", "cache_entries"]

KIND = "cache"  # cache entries, keyed by call key
KIND_FN = "cachefn"  # one record per function version seen, keyed by the function's name digest
KIND_CLEAR = "cacheclear"  # cache_clear() tombstones, keyed by the function's name digest
KIND_USE = "cacheuse"  # hit counts and last use, written at flushes


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


def name_digest(name: str) -> Digest:
    return fingerprint(("casmon.fn", name))


@dataclass
class ResultRef:
    """A handle to a stored result; nothing is loaded until you ask."""

    store: Store
    digest: Digest
    key: Digest
    entry: dict

    def load(self) -> Any:
        return self.store.get(self.digest)

    def open_array(self):
        """A lazy, read-only ``zarr.Array`` over an array result."""
        return self.store.open_array(self.digest)

    @property
    def nbytes(self) -> int:
        return int(self.entry.get("size", 0))


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


class _CachedFunction:
    """The state behind one decorated function."""

    def __init__(self, fn, store, ignore, hashers, version, label, memory_entries) -> None:
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
        self.version_pin = version
        self.label = label
        self._simple = all(p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.KEYWORD_ONLY) for p in self.params)
        self._npos = sum(1 for p in self.params if p.kind != inspect.Parameter.KEYWORD_ONLY)
        self._names = names
        self._index = {p.name: i for i, p in enumerate(self.params) if p.kind != inspect.Parameter.POSITIONAL_ONLY}
        self._name_bytes = []
        for p in self.params:
            nfp = Fingerprinter()
            nfp.str_(p.name)
            self._name_bytes.append(bytes(nfp.out))
        self._prefix: bytes | None = None
        self._mem: OrderedDict[Digest, Digest] = OrderedDict()
        self._mem_max = memory_entries
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self._warned: set = set()
        self._cleared_at: float | None = None

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

    # -- the store and the version, both resolved on first call -------------------
    @property
    def store(self) -> Store:
        s = self._store
        if s is None or s._closed:
            s = self._store = default_store(self._store_arg)
        return s

    def _key_prefix(self) -> bytes:
        p = self._prefix
        if p is None:
            if self.version_pin is not None:
                version = fingerprint(("pinned", self.version_pin))
            else:
                version = function_version(self.fn)
            self.version = version
            self._check_version(version)
            fp = Fingerprinter()
            fp.feed(("casmon.cache", 1, self.name, version))
            p = self._prefix = bytes(fp.digest())
        return p

    def _check_version(self, version: Digest) -> None:
        """Warn once if cached results exist for another version of this function's code."""
        try:
            store = self.store
            nd = name_digest(self.name)
            seen = store.lookup(KIND_FN, nd)
            latest = max(seen, key=lambda r: r.get("time", 0)) if seen else None
            if latest is not None and latest.get("version") != version.hex() and self.version_pin is None:
                warnings.warn(
                    f"casmon: the code of {self.name} (or of a function it calls) changed since its results were "
                    "cached; they will not be used. `casmon cache clear` or `casmon gc` frees their space.",
                    CacheWarning,
                    stacklevel=4,
                )
            if latest is None or latest.get("version") != version.hex():
                store.append(KIND_FN, {"fn": self.name, "version": version.hex(), "time": time.time()}, key=nd)
        except CasmonError as e:
            self._warn(("store",), f"casmon: cache of {self.name} cannot reach its store: {e}")

    # -- keys -------------------------------------------------------------------
    def bind(self, args: tuple, kwargs: dict) -> list:
        """Argument values in parameter order, defaults applied."""
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
        prefix = self._key_prefix()
        vals = self.bind(args, kwargs)
        fp = Fingerprinter()
        fp.out += prefix
        ignore = self.ignore
        hashers = self.hashers
        for p, nb, v in zip(self.params, self._name_bytes, vals):
            name = p.name
            if ignore and name in ignore:
                continue
            try:
                if hashers and name in hashers:
                    v = hashers[name](v)
                fp.out += nb
                fp.feed_value(v, name)
            except Exception as e:  # noqa: BLE001 - never a wrong hit: do not cache this call
                t = type(v)
                tname = t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"
                self._warn(("arg", name, t), f"casmon: {self.name} is not cached for this call: parameter {name!r} "
                           f"({tname}) cannot be hashed, so the call is skipped by the cache: {e}")
                return None
        return fp.digest()

    def _warn(self, what, msg: str) -> None:
        if what not in self._warned:
            self._warned.add(what)
            warnings.warn(msg, CacheWarning, stacklevel=4)

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
            self._mem[key] = result
            if len(self._mem) > self._mem_max:
                self._mem.popitem(last=False)

    def lookup_result(self, key: Digest):
        """(found, value): a hit loads a fresh copy; damage gives a warning and a miss."""
        d = self._mem.get(key)
        if d is None:
            found = self.find(key)
            if found is None:
                return False, None
            d = found[0]
        try:
            value = self.store.get(d)
        except (DamagedObjectError, MissingObjectError) as e:
            self._warn(("damaged", d), f"casmon: the cached result of {self.name} is damaged or missing; recomputing ({e})")
            with self._lock:
                self._mem.pop(key, None)
            return False, None
        self._remember(key, d)
        self.hits += 1
        _usage(self.store).hit(key, self.name)
        if observers:
            for ob in list(observers):
                ob(self.store, self.name, key, d, True)
        return True, value

    def save(self, key: Digest, result: Any, seconds: float, args: tuple, kwargs: dict) -> None:
        """Store a computed result; a failure is a warning, never an exception."""
        store = self.store
        try:
            d, size = store.put_sized(result)
        except TypeError as e:
            self._warn(("result", type(result)), f"casmon: the result of {self.name} is returned but not cached: {e}")
            return
        except Exception as e:  # noqa: BLE001 - a storage error must not lose the result
            self._warn(("store-error", type(e)), f"casmon: the result of {self.name} is returned but not cached: {e}")
            return
        entry = {"fn": self.name, "result": d.hex(), "time": time.time(), "seconds": round(seconds, 6), "size": size}
        if self.label is not None:
            try:
                entry["label"] = self.label(*args, **kwargs) if callable(self.label) else str(self.label)
            except Exception as e:  # noqa: BLE001
                entry["label"] = f"<label failed: {e}>"
        try:
            store.append(KIND, entry, key=key, refs=[d])
        except Exception as e:  # noqa: BLE001
            self._warn(("store-error", type(e)), f"casmon: the result of {self.name} is returned but not cached: {e}")
            return
        self._remember(key, d)
        if observers:
            for ob in list(observers):
                ob(store, self.name, key, d, False)

    # -- the two halves of a call, around the function itself ---------------------
    def begin(self, args: tuple, kwargs: dict) -> tuple[Digest | None, bool, Any]:
        """``(key, found, value)``: a hit returns the stored value; a miss counts."""
        key = _safe_key(self, args, kwargs)
        if key is not None:
            found, value = self.lookup_result(key)
            if found:
                return key, True, value
        self.misses += 1
        return key, False, None

    def end(self, key: Digest | None, result: Any, t0: float, args: tuple, kwargs: dict) -> None:
        if key is not None:
            self.save(key, result, time.perf_counter() - t0, args, kwargs)

    # -- helpers ------------------------------------------------------------------
    def entries(self) -> list[tuple[Digest, dict]]:
        cleared = self._cleared_time(refresh=True)
        return [(k, r) for k, r in self.store.records(KIND) if r.get("fn") == self.name and r.get("time", 0) > cleared]

    def clear(self) -> None:
        now = time.time()
        self.store.append(KIND_CLEAR, {"fn": self.name, "time": now}, key=name_digest(self.name))
        self.store.flush()
        self._cleared_at = now
        with self._lock:
            self._mem.clear()


def cache(
    fn: Callable | None = None,
    *,
    store: Store | str | None = None,
    ignore: Iterable[str | int] = (),
    hashers: Mapping[str | int, Callable[[Any], Any]] | None = None,
    version: str | None = None,
    label: str | Callable[..., str] | None = None,
    memory_entries: int = 100_000,
    _state_class: type | None = None,
):
    """Memoize ``fn`` on a casmon store.

    ``store``: a :class:`Store` or location (default: :func:`casmon.store.default_store`).
    ``ignore``: parameters (names or positions) that do not count, like ``verbose``.
    ``hashers``: per parameter (name or position), a function turning the value
    into what counts for the key, e.g. ``{"df": lambda df: df.shape}``.
    ``version``: pin the function's version by hand; without it, editing the
    function or a helper it calls from your own modules invalidates its results.
    ``label``: a name (or a function of the call's arguments) shown in ``casmon cache``.

    The wrapped function gains ``cache_info()``, ``cache_clear()``,
    ``is_cached(*args, **kwargs)`` and ``ref(*args, **kwargs)``.
    """
    if fn is None:
        return functools.partial(cache, store=store, ignore=ignore, hashers=hashers, version=version, label=label,
                                 memory_entries=memory_entries, _state_class=_state_class)
    if isinstance(fn, (staticmethod, classmethod)):
        return type(fn)(cache(fn.__func__, store=store, ignore=ignore, hashers=hashers, version=version, label=label,
                              memory_entries=memory_entries, _state_class=_state_class))
    if not callable(fn):
        raise TypeError(f"@cache expects a function, got {type(fn).__name__}")
    if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
        raise TypeError(f"@cache cannot cache generator {function_name(fn)}: it returns an iterator, not a value")
    state = (_state_class or _CachedFunction)(fn, store, ignore, hashers, version, label, memory_entries)

    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def async_wrapper(*args, **kwargs):
            key, found, value = state.begin(args, kwargs)
            if found:
                return value
            t0 = time.perf_counter()
            result = await fn(*args, **kwargs)
            state.end(key, result, t0, args, kwargs)
            return result

        wrapper = async_wrapper
    else:

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            key, found, value = state.begin(args, kwargs)
            if found:
                return value
            t0 = time.perf_counter()
            result = fn(*args, **kwargs)
            state.end(key, result, t0, args, kwargs)
            return result

    def cache_info() -> CacheInfo:
        entries = state.entries()
        return CacheInfo(state.hits, state.misses, len(entries), sum(int(r.get("size", 0)) for _, r in entries))

    def cache_clear() -> None:
        """Forget every cached result of this function (in every process using the store)."""
        state.clear()

    def is_cached(*args, **kwargs) -> bool:
        key = state.key(args, kwargs)
        return key is not None and (key in state._mem or state.find(key) is not None)

    def ref(*args, **kwargs) -> ResultRef:
        """A handle to the stored result of this call, without loading it; KeyError if not cached."""
        key = state.key(args, kwargs)
        found = state.find(key) if key is not None else None
        if found is None:
            raise KeyError(f"{state.name}: this call is not cached")
        return ResultRef(state.store, found[0], key, found[1])

    wrapper.cache_info = cache_info
    wrapper.cache_clear = cache_clear
    wrapper.is_cached = is_cached
    wrapper.ref = ref
    wrapper.__casmon_cache__ = state
    return wrapper


def _safe_key(state: _CachedFunction, args: tuple, kwargs: dict) -> Digest | None:
    try:
        return state.key(args, kwargs)
    except TypeError:
        raise  # a bad call: the function would raise the same
    except CasmonError as e:
        state._warn(("store",), f"casmon: {state.name} runs uncached: {e}")
        return None


def cache_entries(store: Store) -> dict[str, dict]:
    """Per function: entries, bytes, hits, last use (for ``casmon cache``)."""
    cleared: dict[str, float] = {}
    for _k, r in store.records(KIND_CLEAR):
        cleared[r["fn"]] = max(cleared.get(r["fn"], 0.0), r.get("time", 0.0))
    out: dict[str, dict] = {}
    live_keys: dict[str, str] = {}
    for k, r in store.records(KIND):
        fn = r.get("fn", "?")
        if r.get("time", 0) <= cleared.get(fn, 0.0):
            continue
        s = out.setdefault(fn, {"entries": 0, "bytes": 0, "hits": 0, "last_used": 0.0, "seconds_saved": 0.0})
        s["entries"] += 1
        s["bytes"] += int(r.get("size", 0))
        s["last_used"] = max(s["last_used"], r.get("time", 0))
        live_keys[k.hex()] = fn
    for _k, r in store.records(KIND_USE):
        for h, (fn, n, last) in r.get("hits", {}).items():
            if live_keys.get(h) == fn:
                s = out[fn]
                s["hits"] += n
                s["last_used"] = max(s["last_used"], last)
    return out


def resolve_function(names: Iterable[str], name: str) -> str:
    """Find a function by full name, or by a short name or suffix that only one has."""
    names = sorted(set(names))
    if name in names:
        return name
    matches = [n for n in names if n.endswith("." + name) or n.rsplit(".", 1)[-1] == name]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise LookupError(f"no cached function {name!r}; there are: {', '.join(names) or 'none'}")
    raise LookupError(f"{name!r} is ambiguous: {', '.join(matches)}")


def clear_function(store: Store, name: str) -> str:
    """Forget every cached result of function ``name``; returns its full name."""
    full = resolve_function(cache_entries(store), name)
    store.append(KIND_CLEAR, {"fn": full, "time": time.time()}, key=name_digest(full))
    store.flush()
    return full


def evict(store: Store, max_size: int | None = None, older_than: float | None = None) -> tuple[int, int]:
    """Drop cache entries: unused for ``older_than`` seconds, then least recently used until
    their results add up to at most ``max_size`` bytes. Also drops cleared entries.

    Returns ``(entries dropped, bytes of their results)``. The results' data is
    removed by the gc that follows (subject to its grace period).
    """
    store.flush()
    cleared: dict[str, float] = {}
    for _k, r in store.records(KIND_CLEAR):
        cleared[r["fn"]] = max(cleared.get(r["fn"], 0.0), r.get("time", 0.0))
    entries: dict[bytes, list] = {}  # key -> [last_use, size, dropped]
    for k, r in store.records(KIND):
        e = entries.setdefault(bytes(k), [0.0, 0, False])
        e[0] = max(e[0], r.get("time", 0.0))
        e[1] = max(e[1], int(r.get("size", 0)))
        if r.get("time", 0.0) <= cleared.get(r.get("fn", ""), 0.0):
            e[2] = True
    for _k, r in store.records(KIND_USE):
        for h, (_fn, _n, last) in r.get("hits", {}).items():
            e = entries.get(bytes.fromhex(h))
            if e is not None:
                e[0] = max(e[0], last)
    now = time.time()
    if older_than is not None:
        for e in entries.values():
            if now - e[0] >= older_than:
                e[2] = True
    if max_size is not None:
        alive = sorted((e for e in entries.values() if not e[2]), key=lambda e: e[0])
        total = sum(e[1] for e in alive)
        for e in alive:
            if total <= max_size:
                break
            e[2] = True
            total -= e[1]
    doomed = {k for k, e in entries.items() if e[2]}
    if not doomed:
        return 0, 0
    dropped_bytes = sum(entries[k][1] for k in doomed)
    store.table(KIND).consolidate(force=True, keep=lambda k, v: bytes(k) not in doomed)
    return len(doomed), dropped_bytes
