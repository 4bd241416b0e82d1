"""Storage for the ML libraries' values as chunked numeric buffers, loaded once the user has the library.

A module here holds one library's :class:`casmon.store.serialize.Handler` (``HANDLER``)
and says which types it saves (``handles``). Tensors, jax arrays, Arrow tables, polars
frames, pandas frames, xarray datasets, PIL images and HF datasets go into the chunked, deduplicated path numpy arrays take, so an equal value is stored
once and a checkpoint shares its unchanged tensors. :func:`ensure` loads a module the
first time a value of its library is saved; :func:`ensure_named` the first time a
value it saved is loaded (which imports the library: the value is one of its objects).
A handler the user registered for the same type wins.
"""

from __future__ import annotations

import importlib
import sys
import threading
TYPE_CHECKING = False  # typing's flag without importing typing (~2 ms of a first hit)
if TYPE_CHECKING:
    from typing import Any

__all__ = ["ensure", "ensure_named", "import_view_libraries", "MODULES", "VIEW_LIBRARIES"]

#: A type's top-level module -> the module here that stores that library's values.
MODULES = {"torch": "torch", "jax": "jax", "jaxlib": "jax", "pyarrow": "arrow", "polars": "polars", "PIL": "pil",
           "datasets": "hf", "pandas": "pandas", "xarray": "xarray"}
#: A handler name's first component -> its module (handler names are stored in manifests).
_BY_HANDLER = {"torch": "torch", "jax": "jax", "pyarrow": "arrow", "polars": "polars", "PIL": "pil", "datasets": "hf",
               "pandas": "pandas", "xarray": "xarray"}
#: The libraries whose values the zarr view lays out as arrays only once the library is imported (their handlers'
#: ``zarr_nodes``).
VIEW_LIBRARIES = ("pandas", "xarray")
_loaded: dict[str, Any] = {}
_lock = threading.Lock()


def _module(name: str) -> Any:
    """The module ``name``, loaded once; its ``HANDLER`` is then loadable by its stored name."""
    from casmon.store.serialize import register_library_handler_name  # serialize imports this package

    with _lock:
        if name not in _loaded:
            try:
                _loaded[name] = importlib.import_module(f"casmon.store.libraries.{name}")
                register_library_handler_name(_loaded[name].HANDLER)  # a process that loads before it saves
            except Exception:  # noqa: BLE001 - a library version these handlers do not fit: its values are pickled
                _loaded[name] = None
        return _loaded[name]


def ensure(t: type) -> bool:
    """Register the handler for ``t`` if a module here stores its library's values; True if one was added."""
    top = (t.__module__ or "").partition(".")[0]
    name = MODULES.get(top)
    if name is None or top not in sys.modules:
        return False
    mod = _module(name)
    if mod is None or not mod.handles(t):
        return False
    from casmon.store.serialize import register_library_handler

    register_library_handler(t, mod.HANDLER)
    return True


def ensure_named(handler: str) -> None:
    """Load the module whose handler is named ``handler`` (read from a manifest), if there is one."""
    name = _BY_HANDLER.get(handler.partition(".")[0])
    if name is not None:
        try:
            importlib.import_module(handler.partition(".")[0])
        except ImportError:
            return
        _module(name)


def import_view_libraries() -> None:
    """Import the installed :data:`VIEW_LIBRARIES`, for casmon's own processes (``casmon export --zarr``): a user's
    program imports what it wants, but an export from the CLI would otherwise describe every frame, not write it."""
    for name in VIEW_LIBRARIES:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - missing or broken: its values are described, as without it
            continue


#: A tensor's element types by their torch names, as numpy describes the same bytes (bfloat16 and the float8 types
#: have no numpy type).
_TORCH_ELEMENTS = {"float16": "<f2", "float32": "<f4", "float64": "<f8", "int8": "|i1", "int16": "<i2",
                   "int32": "<i4", "int64": "<i8", "uint8": "|u1", "uint16": "<u2", "uint32": "<u4",
                   "uint64": "<u8", "bool": "|b1", "complex64": "<c8", "complex128": "<c16"}


def element_layout(handler: str, meta: Any) -> dict[str, Any] | None:
    """The numpy form (``dtype``, ``shape``, ``order``) of the elements a library's handler stored as one array, read
    from its manifest's ``meta`` without importing the library (a program that has not imported torch sees its
    tensors through the zarr view as arrays all the same); None where it cannot be told so."""
    if handler.partition(".")[0] != "torch" or not isinstance(meta, dict):
        return None
    name = meta.get("dtype")
    code = _TORCH_ELEMENTS.get(name) if isinstance(name, str) else None
    shape = meta.get("shape")
    if code is None or not isinstance(shape, list):
        return None
    return {"dtype": repr(code), "shape": shape, "order": "C"}
