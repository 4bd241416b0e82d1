"""pickle's C implementation, loaded without ``pickle.py``.

``pickle.py`` re-exports ``_pickle``'s ``Pickler``, ``Unpickler``, ``PickleBuffer``, ``dumps``, ``loads`` and
errors (the very same objects) after defining its pure-Python pickler, which costs a script's first cache
hit about half a millisecond to load. casmon uses only those names, so it takes them from ``_pickle`` where
the interpreter has it (CPython), and from ``pickle`` elsewhere.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing's flag without importing typing (~2 ms of a first hit)

if TYPE_CHECKING:
    import pickle as pickle
else:
    try:
        import _pickle as pickle
    except ImportError:  # an interpreter without the C pickler
        import pickle

__all__ = ["pickle"]
