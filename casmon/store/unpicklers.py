"""The real unpicklers :func:`casmon.store.serialize.decode` loads a pickle with, where
:mod:`casmon.store.plainpickle` declines it: loaded on first use, so a hit of a plain value loads no pickle module.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing's flag without importing typing
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import IO, Any

    import numpy as np

from casmon.errors import UntrustedStoreError
from casmon.keys.cpickle import pickle
from casmon.store.serialize import MOVED_CLASSES, MOVED_MODULES

__all__ = ["SafeUnpickler", "ChildUnpickler", "DECODE_ERRORS", "UnpicklingError"]

UnpicklingError = pickle.UnpicklingError


class SafeUnpickler(pickle.Unpickler):
    """Loads only pickles that name no global: builtin containers and scalars.

    Without ``find_class`` (and ``persistent_load``) a pickle cannot reach any
    callable, so it cannot run code (see "Restricting Globals" in the pickle docs).
    The ``EXT`` opcodes go through ``find_class`` as well. Both are methods of
    the class (Python 3.13 makes ``persistent_load`` read-only on instances).
    """

    def find_class(self, module: str, name: str) -> Any:
        raise UntrustedStoreError(
            f"this value is a pickle that needs {module}.{name} to load, and loading it could run code; "
            "the store was opened with trust=False. Open it with trust=True if you trust who wrote it."
        )

    def persistent_load(self, pid: Any) -> Any:
        raise UntrustedStoreError("this value refers to other values through its pickle; the store was opened with trust=False")


class ChildUnpickler(pickle.Unpickler):
    """The trusted unpickler; registered handler values nested in the pickle load through ``load_child``."""

    def __init__(self, file: IO[bytes], buffers: list[np.ndarray[Any, np.dtype[np.uint8]]],
                 load_child: Callable[[int], Any] | None) -> None:
        super().__init__(file, buffers=buffers)
        self._load_child = load_child
        self._loaded: dict[int, Any] = {}  # a child named twice is one object, as it was when saved

    def find_class(self, module: str, name: str) -> Any:
        return super().find_class(MOVED_CLASSES.get((module, name)) or MOVED_MODULES.get(module, module), name)

    def persistent_load(self, pid: Any) -> Any:
        if self._load_child is None or type(pid) is not int:
            raise pickle.UnpicklingError(f"unexpected persistent id {pid!r}")
        if pid not in self._loaded:
            self._loaded[pid] = self._load_child(pid)
        return self._loaded[pid]


#: Errors a malformed (crafted or damaged) stream or manifest raises while it is decoded.
DECODE_ERRORS = (pickle.UnpicklingError, EOFError, ValueError, TypeError, KeyError, IndexError, AttributeError,
                 OverflowError, MemoryError, RecursionError, SyntaxError, UnicodeDecodeError, LookupError)
