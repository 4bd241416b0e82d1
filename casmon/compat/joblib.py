"""joblib.Memory's documented API on the casmon store: change ``from joblib import Memory`` to

    from casmon.compat.joblib import Memory

``Memory(location)`` keeps its results in a casmon store at ``{location}/casmon``
(as joblib keeps its own in ``{location}/joblib``; ``location`` may also be a URL
or a :class:`~casmon.store.store.Store`); ``location=None`` caches nothing, as
in joblib. ``memory.cache(func, ignore=[...], mmap_mode=...)`` (also as a
decorator, with or without arguments) is :func:`casmon.cache`; the function it
returns has joblib's ``call_and_shelve``, ``check_call_in_cache``, ``call`` and
``clear``.

Differences that are casmon's: a result is stored once by content however
many calls return it; a dict argument's key order counts (joblib sorts the
keys), an array's memory layout (a strided view, a copy) does not; editing the function (or a helper it calls) gives new
entries rather than joblib's whole-function reset; two different functions
with one name never share entries. ``mmap_mode="r"`` returns an array result
read-only (and every array in a dict, list or tuple result), as a map of the stored bytes where casmon maps (arrays of 1 MiB and
more on a local store: :mod:`casmon.store.mapped`), a read-only copy elsewhere;
its type is ``numpy.ndarray``, not ``numpy.memmap``. ``"c"``, ``"r+"`` and
``"w+"`` return writable copies: a write never reaches the store (joblib's
``"r+"``/``"w+"`` would change its cache). ``reduce_size`` is casmon's
least-recently-used eviction (:func:`casmon.caching.evict`) over the store
(``Memory(bytes_limit=)``, as joblib before 1.5 took it, is its default), and
``clear`` and a shelved result's ``clear`` forget entries at once; the stored
bytes go at the store's next ``casmon gc``. ``verbose`` and ``compress`` are
accepted and change nothing (casmon prints no trace and compresses by its own
codec).
"""

from __future__ import annotations

import datetime
import functools
import inspect
import math
import os
import re
import sys
import time
import types
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from casmon.caching import KIND, Eviction, cache, clear_function, evict, eviction_plan
from casmon.store.store import Store, default_store

__all__ = ["Memory", "MemorizedFunc", "NotMemorizedFunc", "MemorizedResult", "NotMemorizedResult", "expires_after"]

#: joblib's memory-mapping modes.
MMAP_MODES = (None, "r", "r+", "w+", "c")
_WHERE = "casmon.compat.joblib"


def expires_after(days: float = 0, seconds: float = 0, microseconds: float = 0, milliseconds: float = 0,
                  minutes: float = 0, hours: float = 0, weeks: float = 0) -> Callable[[dict[str, Any]], bool]:
    """joblib's ``cache_validation_callback`` helper: an entry older than this is computed again."""
    limit = datetime.timedelta(days=days, seconds=seconds, microseconds=microseconds, milliseconds=milliseconds,
                               minutes=minutes, hours=hours, weeks=weeks).total_seconds()

    def cache_validation_callback(metadata: dict[str, Any]) -> bool:
        return time.time() - metadata["time"] < limit

    return cache_validation_callback


def _mode(mmap_mode: Any, where: str) -> str | None:
    if mmap_mode not in MMAP_MODES or (mmap_mode is not None and type(mmap_mode) is not str):
        raise ValueError(f"{_WHERE}: {where}: mmap_mode must be one of None, 'r', 'r+', 'w+', 'c'; got {mmap_mode!r:.80}")
    return mmap_mode


_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def _bytes(limit: Any, where: str) -> int:
    """A byte count as joblib takes it: a number, or a string such as ``"10M"`` (K, M, G: powers of 1024)."""
    if isinstance(limit, str):
        m = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*([KMGT]?)B?\s*", limit, re.IGNORECASE)
        if m is None:
            raise ValueError(f"{_WHERE}: {where}: {limit!r:.80} is not a size such as 1000, '500K', '10M' or '2G'")
        return int(float(m.group(1)) * _UNITS[m.group(2).upper()])
    if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not math.isfinite(limit) or limit < 0:
        raise ValueError(f"{_WHERE}: {where}: a size must be a number of bytes (0 or more) or a string such as '10M', "
                         f"got {limit!r:.80}")
    return int(limit)


def _seconds(age: Any, where: str) -> float:
    if isinstance(age, datetime.timedelta):
        age = age.total_seconds()
    if isinstance(age, bool) or not isinstance(age, (int, float)) or not math.isfinite(age) or age < 0:
        raise ValueError(f"{_WHERE}: {where}: age_limit must be a datetime.timedelta or seconds (0 or more), "
                         f"got {age!r:.80}")
    return float(age)


def _read_only(value: Any, mmap_mode: str | None) -> Any:
    """A result as ``mmap_mode="r"`` gives it: every array in it read-only, in dicts, lists and tuples too, as
    joblib's memmaps are (views: the caller's own arrays are left as they are)."""
    np = sys.modules.get("numpy")
    if mmap_mode != "r" or np is None:
        return value
    return _arrays_read_only(value, np, 0)


#: Containers nested deeper than this are handed back as they are (a result is rarely deeper; cycles stop here).
_READ_ONLY_DEPTH = 32


def _arrays_read_only(value: Any, np: Any, depth: int) -> Any:
    if isinstance(value, np.ndarray):
        if not value.flags.writeable:
            return value
        view = value.view()
        view.flags.writeable = False
        return view
    if depth >= _READ_ONLY_DEPTH:
        return value
    t = type(value)
    if t is dict:
        items = {k: _arrays_read_only(v, np, depth + 1) for k, v in value.items()}
        return value if all(items[k] is v for k, v in value.items()) else items
    if t not in (list, tuple) and not (issubclass(t, tuple) and isinstance(getattr(t, "_fields", None), tuple)):
        return value
    got = [_arrays_read_only(v, np, depth + 1) for v in value]
    if all(a is b for a, b in zip(got, value)):
        return value  # no array in it: the object itself
    if t is list:
        return got
    try:
        return tuple(got) if t is tuple else t(*got)  # a namedtuple keeps its type
    except Exception:  # noqa: BLE001 - a tuple subclass that takes other arguments: as it is
        return value


class Memory:
    """joblib's ``Memory``: ``Memory(location, verbose=0).cache(func)``; see the module's notes."""

    def __init__(self, location: str | os.PathLike[str] | Store | None = None, backend: str = "local",
                 mmap_mode: str | None = None, compress: Any = False, verbose: int = 1,
                 backend_options: dict[str, Any] | None = None, bytes_limit: int | str | None = None) -> None:
        if backend != "local":
            raise ValueError(f"{_WHERE}: Memory: backend {backend!r:.80} is not supported: casmon keeps results in "
                             "its own store (pass a folder, a URL such as s3://bucket/prefix, or a casmon Store)")
        if location is not None and not isinstance(location, (str, os.PathLike, Store)):
            raise TypeError(f"{_WHERE}: Memory: location must be a folder, a URL, a casmon Store or None, got "
                            f"{type(location).__name__}")
        self.location = os.fspath(location) if isinstance(location, os.PathLike) else location
        self.backend = backend
        self.mmap_mode = _mode(mmap_mode, "Memory")
        self.compress = compress
        self.verbose = verbose
        self.backend_options = dict(backend_options or {})
        # joblib took it here before 1.5 (reduce_size() keeps within it), and code written then still passes it.
        self.bytes_limit = None if bytes_limit is None else _bytes(bytes_limit, "Memory")
        # Weakly: memory.eval and memory.cache(f)(x) in a loop make one per call.
        self._funcs: weakref.WeakSet[MemorizedFunc] = weakref.WeakSet()

    @property
    def store_location(self) -> str | Store | None:
        """Where the results are: the store ``{location}/casmon``, the Store given, or None (no caching)."""
        loc = self.location
        if loc is None or isinstance(loc, Store):
            return loc
        if "://" in loc:
            return loc.rstrip("/") + "/casmon"
        return os.path.join(loc, "casmon")

    @property
    def store(self) -> Store | None:
        loc = self.store_location
        return None if loc is None else default_store(loc)

    def cache(self, func: Callable | None = None, ignore: Iterable[str] | None = None, verbose: int | None = None,
              mmap_mode: str | None | bool = False,
              cache_validation_callback: Callable[[dict[str, Any]], bool] | None = None) -> Any:
        """Cache ``func`` (decorator with or without arguments): ``ignore`` names parameters that do not count;
        ``mmap_mode`` (False: the Memory's); ``cache_validation_callback(metadata) -> bool``: False computes a stored
        call again (``metadata``: ``time`` it was stored, ``duration`` it took, ``input_args``)."""
        if func is None:
            return functools.partial(self.cache, ignore=ignore, verbose=verbose, mmap_mode=mmap_mode,
                                     cache_validation_callback=cache_validation_callback)
        if ignore is not None and (isinstance(ignore, str) or not all(isinstance(n, str) for n in ignore)):
            raise TypeError(f"{_WHERE}: cache: ignore must be a list of parameter names, got {ignore!r:.80}")
        if cache_validation_callback is not None and not callable(cache_validation_callback):
            raise TypeError(f"{_WHERE}: cache: cache_validation_callback must be callable, got "
                            f"{type(cache_validation_callback).__name__}")
        mode = self.mmap_mode if mmap_mode is False else _mode(mmap_mode, "cache")
        if isinstance(func, (MemorizedFunc, NotMemorizedFunc)):
            func = func.func
        if isinstance(func, staticmethod):  # @memory.cache over @staticmethod in a class body: its function
            func = func.__func__
        if isinstance(func, classmethod):
            raise TypeError(f"{_WHERE}: cache: a classmethod object cannot be cached (it is called through its "
                            "class): put @classmethod over @memory.cache, or cache the function")
        if not callable(func):
            raise TypeError(f"{_WHERE}: cache: expects a function, got {type(func).__name__} {func!r:.80}")
        loc = self.store_location
        if loc is None:
            return NotMemorizedFunc(func)
        f = MemorizedFunc(func, loc, list(ignore or ()), mode, cache_validation_callback)
        self._funcs.add(f)
        return f

    def eval(self, func: Callable, *args: Any, **kwargs: Any) -> Any:
        """``func(*args, **kwargs)``, cached."""
        return self.cache(func)(*args, **kwargs)

    def clear(self, warn: bool = True) -> None:
        """Forget every cached result in this Memory's store."""
        store = self.store
        if store is None:
            return
        names = {str(r.get("fn")) for _k, r in store.records(KIND) if isinstance(r.get("fn"), str)}
        for name in sorted(names):
            clear_function(store, name)
        for f in list(self._funcs):
            f.clear(warn=False)  # also forgets what this process remembers of them

    def reduce_size(self, bytes_limit: int | str | None = None, items_limit: int | None = None,
                    age_limit: datetime.timedelta | float | None = None) -> None:
        """Drop entries unused for ``age_limit``, then the least recently used until the results left take at most
        ``bytes_limit`` bytes (default: the Memory's; casmon's eviction, :func:`casmon.caching.evict`; the bytes go
        at the next gc)."""
        if items_limit is not None:
            raise ValueError(f"{_WHERE}: reduce_size: items_limit is not supported (casmon evicts by size and age): "
                             "use bytes_limit or age_limit")
        limit = self.bytes_limit if bytes_limit is None else _bytes(bytes_limit, "reduce_size")
        age = None if age_limit is None else _seconds(age_limit, "reduce_size")
        store = self.store
        if store is None or (limit is None and age is None):
            return
        plan = eviction_plan(store, limit, age)
        if plan:
            evict(store, plan=plan)
            for f in list(self._funcs):
                f.forget(plan)

    def __repr__(self) -> str:
        return f"Memory(location={self.location!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        args = (self.backend, self.mmap_mode, self.compress, self.verbose, self.backend_options, self.bytes_limit)
        if isinstance(self.location, Store):  # it holds locks and threads: reopened by its URL, as that store itself
            return (_memory_on_store, (self.location.url, *args))
        return (Memory, (self.location, *args))


class MemorizedFunc:
    """A function ``Memory.cache`` returns: call it like the function."""

    def __init__(self, func: Callable, store: str | Store, ignore: list[str], mmap_mode: str | None,
                 cache_validation_callback: Callable[[dict[str, Any]], bool] | None = None) -> None:
        self.func = func
        self.ignore = ignore
        self.mmap_mode = mmap_mode
        self.cache_validation_callback = cache_validation_callback
        self.location = store
        target, self.bound = _unbound(func, ignore)
        self.cached = cache(target, store=store, ignore=ignore, mmap=mmap_mode == "r")
        try:
            functools.update_wrapper(self, func)
        except (AttributeError, TypeError):  # a callable without a name (numpy ufuncs have one)
            pass

    def __call__(self, /, *args: Any, **kwargs: Any) -> Any:
        args = self.bound + args
        cf = self.cached
        check = self.cache_validation_callback
        if check is not None:
            try:
                ref = cf.ref(*args, **kwargs)
            except KeyError:
                ref = None
            if ref is not None and not check(_metadata(ref.entry, args, kwargs)):
                return _read_only(cf.refresh(*args, **kwargs), self.mmap_mode)
        state = cf.__casmon_cache__
        misses = state.misses
        value = cf(*args, **kwargs)
        if self.mmap_mode == "r" and state.misses != misses:  # computed now: hand back the stored, mapped form
            try:
                value = cf.lookup(*args, **kwargs)
            except KeyError:  # not stored (said by a warning): the computed value is the answer
                pass
        return _read_only(value, self.mmap_mode)

    def call(self, /, *args: Any, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        """Compute the call again, whatever is stored, and store it: ``(result, metadata)``."""
        args = self.bound + args
        value = self.cached.refresh(*args, **kwargs)
        try:
            entry = self.cached.ref(*args, **kwargs).entry
        except KeyError:
            entry = {}
        return value, _metadata(entry, args, kwargs)

    def call_and_shelve(self, /, *args: Any, **kwargs: Any) -> MemorizedResult | NotMemorizedResult:
        """Compute the call (or find it stored) and return a reference to its stored result, not the result."""
        value = self(*args, **kwargs)
        args = self.bound + args
        state = self.cached.__casmon_cache__
        key = state.key(args, kwargs)
        if key is None or state.find(key) is None:
            return NotMemorizedResult(value)  # could not be stored: the value itself stands in
        state.store.flush()  # a reference is made to be sent: a worker reading it must find the entry now
        return MemorizedResult(self, key, args, kwargs)

    def check_call_in_cache(self, /, *args: Any, **kwargs: Any) -> bool:
        """Whether the call's result is stored (nothing is computed or loaded)."""
        return self.cached.is_cached(*self.bound, *args, **kwargs)

    def clear(self, warn: bool = True) -> None:
        """Forget every stored result of this function."""
        self.cached.cache_clear()

    def __reduce__(self) -> tuple[Any, ...]:
        # The cached function pickles as casmon's do: a main script's code keeps its version in a worker, and a
        # Store (it holds locks and threads) goes as its URL, which the worker opens again.
        loc = self.location.url if isinstance(self.location, Store) else self.location
        return (_rebuild, (self.func, self.cached, loc, self.ignore, self.mmap_mode, self.cache_validation_callback))

    def forget(self, plan: dict[bytes, Eviction]) -> None:
        state = self.cached.__casmon_cache__
        for key, e in plan.items():
            if e.fn == state.name:
                state.forget(key)

    def __repr__(self) -> str:
        return f"MemorizedFunc(func={self.func!r}, location={self.location!r})"


def _unbound(func: Callable, ignore: list[str]) -> tuple[Callable, tuple[Any, ...]]:
    """What to cache, and the arguments bound before the caller's: a method whose object ``ignore`` names
    (joblib's ``memory.cache(self.method, ignore=["self"])``) is cached as its function, the object passed first."""
    if isinstance(func, types.MethodType) and ignore:
        first = next(iter(inspect.signature(func.__func__).parameters), None)
        if first in ignore:
            return func.__func__, (func.__self__,)
    return func, ()


def _memory_on_store(url: str, *args: Any) -> Memory:
    return Memory(default_store(url), *args)


def _rebuild(func: Callable, cached: Any, location: str, ignore: list[str], mmap_mode: str | None,
             callback: Callable[[dict[str, Any]], bool] | None) -> MemorizedFunc:
    f = MemorizedFunc.__new__(MemorizedFunc)
    f.__dict__.update(func=func, location=location, ignore=ignore, mmap_mode=mmap_mode,
                      cache_validation_callback=callback, cached=cached, bound=_unbound(func, ignore)[1])
    try:
        functools.update_wrapper(f, func)
    except (AttributeError, TypeError):
        pass
    return f


def _metadata(entry: dict[str, Any], args: tuple, kwargs: dict[str, Any]) -> dict[str, Any]:
    """A stored call as joblib's ``cache_validation_callback`` sees it."""
    return {"time": float(entry.get("time", 0.0)), "duration": float(entry.get("seconds", 0.0)),
            "input_args": {**{str(i): repr(a) for i, a in enumerate(args)}, **{k: repr(v) for k, v in kwargs.items()}}}


class MemorizedResult:
    """A reference to a stored result (``call_and_shelve``): ``get()`` loads it, ``clear()`` forgets it."""

    def __init__(self, func: MemorizedFunc, key: Any, args: tuple, kwargs: dict[str, Any]) -> None:
        self.func, self.key, self.args, self.kwargs = func, key, args, kwargs

    @property
    def args_id(self) -> str:
        return bytes(self.key).hex()

    def get(self) -> Any:
        state = self.func.cached.__casmon_cache__
        found, value = False, None
        if not state.found_now(self.key):  # read afresh: made by another process, or cleared by another holder
            state.forget(self.key)
        else:
            found, value = state.lookup_result(self.key)
        if not found:
            raise KeyError(f"Non-existing cache value (may have been cleared): {state.name} call {self.args_id}")
        return _read_only(value, self.func.mmap_mode)

    def clear(self) -> None:
        """Forget this call's stored result (the next call computes it again)."""
        state = self.func.cached.__casmon_cache__
        found = state.find(self.key)
        if found is not None:
            d, entry = found
            state.store.flush()  # the entry may still wait in this process's buffer, out of eviction's reach
            evict(state.store, plan={bytes(self.key): Eviction(state.name, d.hex(), int(entry.get("size", 0)), False,
                                                               float(entry.get("time", 0.0)))})
        state.forget(self.key)

    def __repr__(self) -> str:
        state = self.func.cached.__casmon_cache__
        return f'MemorizedResult(location="{state.store.url}", func="{state.name}", args_id="{self.args_id}")'


class NotMemorizedFunc:
    """What ``Memory(None).cache`` returns: the function itself, uncached, with the same methods."""

    def __init__(self, func: Callable) -> None:
        self.func = func
        try:
            functools.update_wrapper(self, func)
        except (AttributeError, TypeError):
            pass

    def __call__(self, /, *args: Any, **kwargs: Any) -> Any:
        return self.func(*args, **kwargs)

    def call(self, /, *args: Any, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        return self.func(*args, **kwargs), {}

    def call_and_shelve(self, /, *args: Any, **kwargs: Any) -> NotMemorizedResult:
        return NotMemorizedResult(self.func(*args, **kwargs))

    def check_call_in_cache(self, /, *args: Any, **kwargs: Any) -> bool:
        return False

    def clear(self, warn: bool = True) -> None:
        pass

    def __repr__(self) -> str:
        return f"NotMemorizedFunc(func={self.func!r})"


class NotMemorizedResult:
    """A shelved result where nothing is cached: it holds the value."""

    def __init__(self, value: Any) -> None:
        self.value, self.valid = value, True

    def get(self) -> Any:
        if not self.valid:
            raise KeyError("No value stored.")
        return self.value

    def clear(self) -> None:
        self.valid, self.value = False, None

    def __repr__(self) -> str:
        return f"NotMemorizedResult({self.value!r})" if self.valid else "NotMemorizedResult(<cleared>)"
