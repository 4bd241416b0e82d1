"""The pickle of a small mutable value: what a code version compares to see that value unchanged."""

from __future__ import annotations

import pickle
from typing import Any

__all__ = ["small_pickle", "PICKLE_CHECK_LIMIT"]

#: Mutable values whose pickle is at most this long are re-checked by comparing pickles (a C-speed
#: serialization, exact for the same content) instead of fingerprinting them again.
PICKLE_CHECK_LIMIT = 1 << 16


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


def small_pickle(v: Any) -> bytes | None:
    """The pickle of ``v`` if it is small (the content check of a mutable value), else None."""
    sink = _LimitedSink()
    try:
        pickle.Pickler(sink, 5).dump(v)
    except Exception:  # noqa: BLE001 - too big or not picklable: fingerprint it
        return None
    b = b"".join(sink.parts)
    return b if b == pickle.dumps(v, 5) else None  # the check compares pickle.dumps output
