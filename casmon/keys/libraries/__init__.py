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
import _thread  # threading's locks, without loading threading on a hit
TYPE_CHECKING = False  # typing's flag without importing typing (~2 ms of a first hit)
if TYPE_CHECKING:
    from typing import Any

__all__ = ["ensure", "ADAPTERS"]

#: A type's top-level module -> the module here that keys that library's types.
ADAPTERS = {
    "torch": "torch", "jax": "jax", "jaxlib": "jax", "scipy": "scipy", "pyarrow": "arrow", "polars": "polars",
    "xarray": "xarray", "PIL": "pil", "datasets": "hf", "dask": "dask",
}
_loaded: dict[str, Any] = {}
_lock = _thread.allocate_lock()


def _module(name: str) -> tuple[Any, bool]:
    """``(module or None, loaded just now)``."""
    with _lock:
        if name in _loaded:
            return _loaded[name], False
        try:
            _loaded[name] = importlib.import_module(f"casmon.keys.libraries.{name}")
        except Exception:  # noqa: BLE001 - a library version these hashers do not fit: its values key as pickle sees them
            _loaded[name] = None
        return _loaded[name], True


def ensure(t: type) -> bool:
    """Load the hashers of the library ``t`` comes from; True if a hasher may have been added now.

    Called once per type. A module's ``register_for(t)`` adds hashers for types of parts of its
    library the user imported after the module was loaded (``pyarrow.dataset``).
    """
    top = (t.__module__ or "").partition(".")[0]
    name = ADAPTERS.get(top)
    if name is None or top not in sys.modules:
        return False
    mod, now = _module(name)
    hook = getattr(mod, "register_for", None)
    added = bool(hook is not None and hook(t))
    return now or added


def ensure_module(top: str) -> None:
    """Load the hashers for library ``top`` (an already imported top-level module), once."""
    name = ADAPTERS.get(top)
    if name is not None and top in sys.modules:
        _module(name)
