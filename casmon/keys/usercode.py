"""Which modules are the user's own: the code a code version follows (not the standard library,
installed packages or casmon)."""

from __future__ import annotations

import os
import site
import sys
from functools import lru_cache

__all__ = ["is_user_module"]


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
    try:
        # Its own __file__, never a module __getattr__'s answer (a lazy module answers every name).
        f = vars(mod).get("__file__") if mod is not None else None
    except Exception:  # noqa: BLE001 - no __dict__, or one whose lookup raises
        return False
    if not f or not isinstance(f, str):
        return False  # built-in, namespace or made at run time
    path = os.path.realpath(f)
    return not any(path.startswith(p) for p in _library_paths())
