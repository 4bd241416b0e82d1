"""The pickle check of a mutable value: what a code version compares to see that value unchanged.

A small value's pickle is kept and compared whole; a larger one's is streamed into a hash (C speed,
never the whole pickle in memory), so a hit over a class holding 10,000 instances costs one pickle,
not a fingerprint of each instance.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing's flag without importing typing (~2 ms of a first hit)
if TYPE_CHECKING:
    from typing import Any

from casmon.keys.cpickle import pickle

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


def _hashed(v: Any) -> bytes:
    sink = _HashSink()
    pickle.Pickler(sink, 5).dump(v)
    return _HASHED + sink.h.digest()


def small_pickle(v: Any) -> bytes | None:
    """What :func:`pickle_matches` compares: the pickle of ``v`` if it is small, else a hash of it; None if
    ``v`` cannot be pickled, or pickles differently each time (then it is fingerprinted)."""
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


def pickle_matches(v: Any, pk: bytes) -> bool:
    """``v`` pickles as it did when ``pk`` (from :func:`small_pickle`) was taken. Raises what pickling raises."""
    if pk[:1] == _HASHED:
        return _hashed(v) == pk
    return pickle.dumps(v, 5) == pk
