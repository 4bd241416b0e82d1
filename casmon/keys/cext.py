"""A package's C extension loaded without its package's Python wrapper.

A fresh process's first hit needs only a few C functions of lz4 and xxhash, but their packages' ``__init__``
modules load version modules (lz4 a second shared library too) that the hit never uses. The extension alone
is loaded under its full dotted name, from where the import system would find it, so a later import of the
package (by the user or casmon) reuses the same extension module and gets the same functions."""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # typing's flag without importing typing (~2 ms of a first hit)
if TYPE_CHECKING:
    from typing import Any

__all__ = ["extension_alone"]


def extension_alone(name: str, needs: tuple[str, ...], package: str) -> Any:
    """The C extension ``name`` (``"xxhash._xxhash"``), with every attribute in ``needs``. Where neither it nor
    ``package`` (the module whose import would load it, ``"xxhash"``) is loaded with them yet, it is loaded
    alone; anything unexpected on that short way falls back to ``import package``, whose ImportError (the
    package not installed) is raised as that import would raise it."""
    mods = sys.modules
    for have in (package, name):  # one another thread is still importing lacks its names yet
        mod = mods.get(have)
        if _has(mod, needs):
            return mod
    try:
        mod = _load_alone(name)
    except Exception:  # the short way is an optimisation: the import below is the truth
        mod = None
    if _has(mod, needs):
        return mod
    __import__(package)  # waits for another thread's import of it, as the import system does
    return mods[package]


def _has(mod: Any, needs: tuple[str, ...]) -> bool:
    return mod is not None and all(getattr(mod, n, None) is not None for n in needs)


def _load_alone(name: str) -> Any:
    """Extension module ``name`` loaded from where its import would find it (None where not found there, or
    found as anything but a C extension); its parent packages are searched, not run."""
    import _frozen_importlib  # importlib._bootstrap, always loaded: importlib.util's functions

    bootstrap: Any = _frozen_importlib  # its private helpers: a change in them lands in the caller's fallback
    from _frozen_importlib_external import ExtensionFileLoader

    parts = name.split(".")
    path = None
    for i in range(1, len(parts)):
        spec = bootstrap._find_spec(".".join(parts[:i]), path)
        if spec is None or not spec.submodule_search_locations:
            return None
        path = spec.submodule_search_locations
    spec = bootstrap._find_spec(name, path)
    if spec is None or not isinstance(spec.loader, ExtensionFileLoader):
        return None
    with bootstrap._ModuleLockManager(name):  # as an import of it would: one thread loads it
        mod = sys.modules.get(name)
        if mod is None:
            mod = bootstrap.module_from_spec(spec)
            spec.loader.exec_module(mod)
            sys.modules[name] = mod
    return mod
