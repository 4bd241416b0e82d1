"""Small value classes without :mod:`dataclasses`: what ``@dataclass`` gives, for the classes a first hit loads.

``@dataclass`` generates each class's methods from source text at import (0.2-0.9 ms a class here, and
``dataclasses`` imports ``inspect``, ``ast`` and ``dis``): 16 such classes made a fresh process's first
cache hit load in 10 ms more than the hit itself. A class here lists its fields in ``FIELDS`` and writes
its own ``__init__`` (plain assignments, the quickest there is); :class:`Plain` adds the ``__repr__`` and
``__eq__`` a dataclass has (unhashable, as ``@dataclass`` with ``eq=True``), :class:`Frozen` those of
``@dataclass(frozen=True)`` (hashable, and fields that cannot be assigned after ``__init__``).

Instances keep a ``__dict__`` holding exactly the fields, as a dataclass's do, so their pickles and the
keys made from them are those of the dataclass they replace.
"""

from __future__ import annotations

__all__ = ["Plain", "Frozen"]


class Plain:
    """A class whose value is its ``FIELDS``: compared and shown by them, in order."""

    __slots__ = ()
    FIELDS: tuple[str, ...] = ()
    __hash__ = None  # type: ignore[assignment]  # mutable, compared by value: as a dataclass with eq=True

    def __repr__(self) -> str:
        inner = ", ".join(f"{f}={getattr(self, f)!r}" for f in self.FIELDS)
        return f"{type(self).__qualname__}({inner})"

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._values() == other._values()

    def _values(self) -> tuple[object, ...]:
        return tuple(getattr(self, f) for f in self.FIELDS)


class Frozen(Plain):
    """A :class:`Plain` class whose fields are set once, in ``__init__`` (through ``self.__dict__``)."""

    __slots__ = ()

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"cannot assign to field {name!r} of a {type(self).__qualname__}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"cannot delete field {name!r} of a {type(self).__qualname__}")

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(self._values())
