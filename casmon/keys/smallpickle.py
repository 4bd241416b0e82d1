"""The pickle check of a mutable value: what a code version compares to see that value unchanged.

A small value of builtin containers over scalars (a keyword-only default's dict, a constant list) is
checked by identity: each of its lists, dicts, sets and bytearrays kept with the very items it held, so
the check loads no pickle module on a fresh process's first call. Any other value's pickle is kept and
compared whole; a larger one's is streamed into a hash (C speed, never the whole pickle in memory), so a hit
over a class holding 10,000 instances costs one pickle, not a fingerprint of each instance.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing's flag without importing typing (~2 ms of a first hit)
if TYPE_CHECKING:
    from typing import Any

from _operator import is_

__all__ = ["small_pickle", "pickle_matches", "PICKLE_CHECK_LIMIT"]

#: Mutable values whose pickle is at most this long are re-checked by comparing pickles; longer ones by
#: a hash of their pickle.
PICKLE_CHECK_LIMIT = 1 << 16

_HASHED = b"#"  # a pickle (protocol 5) starts with b"\x80": this tag never begins one


class _TooBig(Exception):
    pass


class _LimitedSink:
    """A file that takes at most ``PICKLE_CHECK_LIMIT`` bytes: a large value is never pickled whole."""

    __slots__ = ("parts", "n")

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.n = 0

    def write(self, b: bytes | bytearray | memoryview) -> int:
        n = len(b) if not isinstance(b, memoryview) else b.nbytes
        self.n += n
        if self.n > PICKLE_CHECK_LIMIT:
            raise _TooBig
        self.parts.append(bytes(b))
        return n


class _HashSink:
    __slots__ = ("h",)

    def __init__(self) -> None:
        import hashlib  # loads OpenSSL (6 ms): only a large mutable value needs it, not every first call

        self.h = hashlib.blake2b(digest_size=16)

    def write(self, b: bytes | bytearray | memoryview) -> int:
        self.h.update(b)
        return len(b) if not isinstance(b, memoryview) else b.nbytes


#: Containers at most in a value checked by identity (a larger one is pickled).
IDENTITY_CHECK_LIMIT = 64
_SCALARS = frozenset({type(None), bool, int, float, complex, str, bytes, range, type(Ellipsis)})


class _Held(tuple):  # type: ignore[type-arg]
    """A value's containers, each with what it held: ``(container, length, items or bytes, dict values)``."""

    __slots__ = ()


def _held(v: Any) -> _Held | None:
    """``v``'s lists, dicts, sets and bytearrays with what they hold, if it is made of only those, tuples,
    frozensets and scalars, and is small; else None."""
    held: list[tuple[Any, int, Any, Any]] = []
    seen: set[int] = set()
    todo = [v]
    while todo:
        x = todo.pop()
        t = type(x)
        if t in _SCALARS or id(x) in seen:
            continue
        seen.add(id(x))
        if t in (list, dict, set, bytearray):
            if len(held) >= IDENTITY_CHECK_LIMIT:
                return None
            if t is bytearray:
                held.append((x, len(x), bytes(x), None))
                continue
            items = tuple(x)
            values = tuple(x.values()) if t is dict else None
            held.append((x, len(x), items, values))
            todo.extend(items)
            if values is not None:
                todo.extend(values)
        elif t in (tuple, frozenset):
            if len(seen) > 8 * IDENTITY_CHECK_LIMIT:
                return None
            todo.extend(x)
        else:
            return None
    return _Held(held)


def _unchanged(held: _Held) -> bool:
    for c, n, items, values in held:
        if len(c) != n:
            return False
        if values is None:
            if type(c) is bytearray:
                if c != items:
                    return False
            elif not all(map(is_, c, items)):
                return False
        elif not all(map(is_, c, items)) or not all(map(is_, c.values(), values)):
            return False
    return True


_pickle: Any = None  # pickle's C module, bound by the first value checked by its pickle


def _cpickle() -> Any:
    global _pickle
    from casmon.keys.cpickle import pickle

    _pickle = pickle
    return pickle


def _hashed(v: Any) -> bytes:
    pickle = _pickle or _cpickle()
    sink = _HashSink()
    pickle.Pickler(sink, 5).dump(v)
    return _HASHED + sink.h.digest()


def small_pickle(v: Any) -> bytes | _Held | None:
    """What :func:`pickle_matches` compares: the containers of a small value of builtins and the items they
    hold, the pickle of another ``v`` if it is small, else a hash of it; None if ``v`` cannot be pickled, or
    pickles differently each time (then it is fingerprinted)."""
    held = _held(v)
    if held is not None:
        return held
    pickle = _pickle or _cpickle()
    sink = _LimitedSink()
    try:
        pickle.Pickler(sink, 5).dump(v)
    except _TooBig:
        try:
            h = _hashed(v)
            return h if h == _hashed(v) else None
        except Exception:  # noqa: BLE001 - not picklable after all
            return None
    except Exception:  # noqa: BLE001 - not picklable: fingerprint it
        return None
    b = b"".join(sink.parts)
    return b if b == pickle.dumps(v, 5) else None  # the check compares pickle.dumps output


def pickle_matches(v: Any, pk: bytes | _Held) -> bool:
    """``v`` holds or pickles as it did when ``pk`` (from :func:`small_pickle`) was taken. Raises what pickling
    raises."""
    if type(pk) is _Held:
        return _unchanged(pk)
    if pk[:1] == _HASHED:
        return _hashed(v) == pk
    return bool((_pickle or _cpickle()).dumps(v, 5) == pk)
