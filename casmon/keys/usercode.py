"""Which code is the user's own, and what casmon calls a function: the names code versions walk by.

A code version follows only the user's own modules (not the standard library, installed packages
or casmon); a function is recorded and keyed as ``module.qualname``.
"""

from __future__ import annotations

import functools
import inspect
import os
import site
import sys
import types
from functools import lru_cache
from typing import Any

from casmon.keys.fingerprint import canonical_module

__all__ = ["function_name", "unwrap_callable", "is_user_module"]


def function_name(fn: Any) -> str:
    """``module.qualname`` of a function: what casmon records, keys and looks up.

    The main script's functions are ``__main__.f`` wherever they run (also in
    ``spawn`` workers, where the script is imported as ``__mp_main__``).
    ``functools.partial`` objects are named after their function; other
    callable objects after their class (``mod.Class.__call__``).
    """
    fn = _unwrap(fn)
    if isinstance(fn, functools.partial):
        return function_name(fn.func)
    if isinstance(fn, types.MethodType):
        fn = fn.__func__
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    if not isinstance(name, str):
        t = type(fn)
        return f"{canonical_module(t.__module__)}.{t.__qualname__}.__call__"
    return f"{canonical_module(getattr(fn, '__module__', None)) or '?'}.{name}"


def _unwrap(fn: Any) -> Any:
    try:
        return inspect.unwrap(fn)
    except ValueError:  # a __wrapped__ cycle
        return fn


def unwrap_callable(fn: Any) -> Any:
    """Follow ``__wrapped__`` through wrapper objects (cached functions, lru_cache), not through
    wrapper *functions*, whose own code counts (a decorator that doubles the result)."""
    for _ in range(100):
        if isinstance(fn, types.FunctionType) and _is_user_obj(fn):
            return fn
        w = getattr(fn, "__wrapped__", None)
        if w is None or not callable(w):
            return fn
        fn = w
    return fn


@lru_cache(maxsize=1)
def _library_paths() -> tuple[str, ...]:
    # What sysconfig.get_paths() names (stdlib, platstdlib, purelib, platlib), without its
    # millisecond of loading the build configuration on the first call.
    paths = set()
    ver = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    for prefix in {sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix}:
        paths.add(os.path.realpath(os.path.join(prefix, "Lib" if os.name == "nt" else f"lib/{ver}")))
    try:
        paths.update(os.path.realpath(p) for p in site.getsitepackages())
    except AttributeError:  # pragma: no cover - virtualenv's old site module
        pass
    try:
        paths.add(os.path.realpath(site.getusersitepackages()))
    except Exception:  # noqa: BLE001
        pass
    paths.add(os.path.realpath(os.path.dirname(os.__file__)))
    return tuple(sorted(p.rstrip(os.sep) + os.sep for p in paths))


@lru_cache(maxsize=4096)
def is_user_module(modname: str | None) -> bool:
    """True for the user's own code: not the standard library, not an installed package, not casmon."""
    if not modname:
        return False
    if modname in ("__main__", "__mp_main__"):
        return True
    if modname == "casmon" or modname.startswith("casmon."):
        return False
    mod = sys.modules.get(modname)
    f = getattr(mod, "__file__", None)
    if not f:
        return False  # built-in or namespace
    path = os.path.realpath(f)
    return not any(path.startswith(p) for p in _library_paths())


def _is_user_obj(obj: Any) -> bool:
    try:
        return is_user_module(getattr(obj, "__module__", None))
    except TypeError:  # an unhashable __module__
        return False
