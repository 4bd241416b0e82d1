"""Cached functions across processes: how a :class:`~casmon.caching.memoize.CachedFunction` pickles.

By reference when its module names it (``mod.f`` is this object), otherwise as "cache this
function with these options", with the source texts its version was computed from when
cloudpickle ships a main script's function by value -- so ``Pool.map``, ``joblib.Parallel``
and Dask workers use the same store and the same keys. Both ends run the same casmon, so
the names pickles hold here (``casmon.caching.workers._rebuild``) may move between versions.
"""

from __future__ import annotations

import sys
import threading
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from casmon.keys.codeversion import register_texts, texts_for_workers
from casmon.keys.fingerprint import canonical_module

if TYPE_CHECKING:
    from casmon.caching.memoize import CachedFunction, CacheState

__all__ = ["reduce_cached", "reduce_state"]


def reduce_cached(obj: CachedFunction) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """``CachedFunction.__reduce__``: by name when its module names it, else by function and options."""
    state = obj.__casmon_cache__
    mod = getattr(obj, "__module__", None)
    qn = getattr(obj, "__qualname__", None)
    if canonical_module(mod) == "__main__" and _cloudpickling():
        # cloudpickle ships the main script's functions by value: so must we, the worker has no __main__.f.
        # The source texts go along (the worker's copy of the code has no file name), so the version,
        # and the keys, are the same there.
        if state.tracker is not None:
            try:
                state.tracker.current()
            except Exception:  # noqa: BLE001 - the worker computes it from bytecode then
                pass
        return (_rebuild, (state.fn, state.options(), texts_for_workers()))
    if isinstance(mod, str) and isinstance(qn, str) and "<" not in qn and _lookup(mod, qn) is obj:
        return (_by_name, (canonical_module(mod), qn))
    return (_rebuild, (state.fn, state.options()))


def reduce_state(state: CacheState) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """``CacheState.__reduce__``: reached when something pickles the state itself (an outer wrapper's copy
    of our attributes)."""
    return (_rebuild_state, (state.fn, state.options()))


def _lookup(mod: str, qualname: str) -> Any:
    m = sys.modules.get(mod)
    if m is None and mod == "__main__":
        m = sys.modules.get("__mp_main__")
    obj = m
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def _cloudpickling() -> bool:
    """True if a cloudpickle pickler (cloudpickle's own, or joblib's, srsly's or Ray's copy) is what pickles us now."""
    found: list[type] = []
    for modname in ("cloudpickle", "joblib.externals.cloudpickle", "srsly.cloudpickle", "ray.cloudpickle"):
        cp = sys.modules.get(modname)
        p = getattr(cp, "Pickler", None) or getattr(cp, "CloudPickler", None)
        if isinstance(p, type):
            found.append(p)
    if not found:
        return False
    picklers = tuple(found)
    f: types.FrameType | None = sys._getframe(3)  # past reduce_cached and CachedFunction.__reduce__
    for _ in range(12):
        if f is None:
            return False
        if isinstance(f.f_locals.get("self"), picklers):
            return True
        f = f.f_back
    return False


_rebuilt: dict = {}
_rebuilt_lock = threading.Lock()


def _by_name(mod: str, qualname: str) -> CachedFunction:
    """Unpickle a cached function by the name its module gives it."""
    obj = _lookup(mod, qualname)
    if obj is None:
        import importlib

        obj = _lookup(importlib.import_module(mod).__name__, qualname)
    if obj is None:
        raise AttributeError(f"casmon: cannot find the cached function {mod}.{qualname} to unpickle it")
    return obj


def _rebuild(fn: Callable, options: dict, texts: dict | None = None) -> CachedFunction:
    """Unpickle a cached function as "cache ``fn`` with ``options``" (once per function object and options)."""
    from casmon.caching.memoize import cache  # the decorator imports this module

    register_texts(texts)
    try:
        memo_key = (id(fn), repr(sorted((k, repr(v)) for k, v in options.items())))
    except Exception:  # noqa: BLE001
        memo_key = None
    if memo_key is not None:
        hit = _rebuilt.get(memo_key)
        if hit is not None and hit.__casmon_cache__.fn is fn:
            return hit
    w = cache(fn, **options)
    if memo_key is not None:
        with _rebuilt_lock:
            _rebuilt[memo_key] = w
    return w


def _rebuild_state(fn: Callable, options: dict) -> CacheState:
    return _rebuild(fn, options).__casmon_cache__
