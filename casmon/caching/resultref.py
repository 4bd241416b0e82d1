"""``ResultRef``: a handle to a cache entry's stored result, made by ``f.ref(...)`` and listings, never by a call
(:mod:`casmon.caching.entries` and :mod:`casmon.caching` load it on first use of the name)."""

from __future__ import annotations

TYPE_CHECKING = False  # typing's flag without importing typing (~2 ms of a first hit)
if TYPE_CHECKING:
    from typing import Any

    from casmon.keys.digest import Digest
    from casmon.store.store import Store

from casmon.keys.names import keep_flat_names
from casmon.plain import Plain

__all__ = ["ResultRef"]


class ResultRef(Plain):
    """A handle to a stored result; nothing is loaded until you ask."""

    FIELDS = ("store", "digest", "key", "entry")

    def __init__(self, store: Store, digest: Digest, key: Digest, entry: dict) -> None:
        self.store, self.digest, self.key, self.entry = store, digest, key, entry

    def load(self, mmap: bool = False) -> Any:
        """The stored result, a fresh copy; ``mmap``: large arrays as read-only maps where it was stored laid out
        for them (``@casmon.cache(mmap=True)``) on a local store (:mod:`casmon.store.mapped`)."""
        return self.store.get(self.digest, mmap=mmap)

    def open_array(self):
        """A lazy, read-only ``zarr.Array`` over an array result."""
        return self.store.open_array(self.digest)

    @property
    def nbytes(self) -> int:
        return int(self.entry.get("size", 0))

    def lineage(self) -> Any:
        """This entry's upstream graph (``casmon.lineage.lineage``). The lineage layer is above this one: named
        here, not imported."""
        import importlib

        return importlib.import_module("casmon.lineage").lineage(self, self.store)

    def describe(self) -> str:
        """The stored result in one line, from its manifest alone (nothing is loaded or unpickled)."""
        from casmon.store.peek import describe

        return describe(self.store, self.digest, 80)

    def __repr__(self) -> str:
        from casmon.view.guards import guarded_text  # loaded when a handle is shown: a hit never is

        return str(guarded_text("cached result")(_ref_text)(self))

    def _repr_html_(self) -> str:
        from casmon.view.guards import guarded_html

        return str(guarded_html("cached result")(_ref_html)(self))


def _ref_text(ref: ResultRef) -> str:
    from casmon.view import display

    return display.result_ref_text(ref, display.described(ref.describe))


def _ref_html(ref: ResultRef) -> str:
    from casmon.view import display

    return display.result_ref_html(ref, display.described(ref.describe))


# Pickles and keys name it where it was before the packages (casmon/keys/names.py).
keep_flat_names([ResultRef])
