"""Content keys for the ML libraries' types, loaded only once the user has imported the library.

A module here registers hashers (:func:`casmon.keys.fingerprint.register_library_hasher`)
for one library's types. :func:`ensure` loads it the first time a value whose type
comes from that library is keyed: the value exists, so the library is imported
already, and casmon never imports one itself. A hasher the user registered for the
same type wins.

What counts in each key is listed in the README ("Supported types").
"""

from __future__ import annotations

import importlib
import sys
import threading

__all__ = ["ensure", "ADAPTERS"]

#: A type's top-level module -> the module here that keys that library's types.
ADAPTERS = {
    "torch": "torch", "jax": "jax", "jaxlib": "jax", "scipy": "scipy", "pyarrow": "arrow", "polars": "polars",
    "xarray": "xarray", "PIL": "pil", "datasets": "hf", "dask": "dask",
}
_loaded: set[str] = set()
_lock = threading.Lock()


def ensure(t: type) -> bool:
    """Load the hashers of the library ``t`` comes from, once; True if one was loaded now."""
    top = (t.__module__ or "").partition(".")[0]
    name = ADAPTERS.get(top)
    if name is None or name in _loaded or top not in sys.modules:
        return False
    with _lock:
        if name in _loaded:
            return False
        _loaded.add(name)
        _load(name)
    return True


def ensure_module(top: str) -> None:
    """Load the hashers for library ``top`` (an already imported top-level module), once."""
    name = ADAPTERS.get(top)
    if name is not None and name not in _loaded and top in sys.modules:
        with _lock:
            if name not in _loaded:
                _loaded.add(name)
                _load(name)


def _load(name: str) -> None:
    try:
        importlib.import_module(f"casmon.keys.libraries.{name}")
    except Exception:  # noqa: BLE001 - a library version these hashers do not fit: its values key as pickle sees them
        pass
