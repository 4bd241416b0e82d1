"""A condemned list's format (see :mod:`casmon.store.condemned` for the protocol): a frame (kind ``table``) whose
payload is::

    "CDL1" | u32 header length | JSON header | digests (16 bytes each, sorted) | loose flags (1 byte each)
          | pack entries: u32 digest index, u32 pack index (8 bytes each)

The JSON header holds ``time`` (wall clock when written), ``count``, ``entries`` and ``packs`` (the pack names
the entries refer to). Reached as ``casmon.store.condemned.encode``, ``decode``, ``CondemnedList``, ``new_name``.
"""

from __future__ import annotations

import os
import time
TYPE_CHECKING = False  # typing's flag without importing typing (~2 ms of a first hit)
if TYPE_CHECKING:
    import struct
else:  # struct.py re-exports _struct: the same names, one module less on a hit
    import _struct as struct

from casmon.errors import DamagedObjectError
from casmon.keys.digest import Digest
from casmon.plain import Plain
from casmon.store import metafile
from casmon.store.codec import KIND_TABLE, decode_frame, encode_frame, get_codec
from casmon.store.condemned import PREFIX

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = ["CondemnedList", "encode", "decode", "new_name"]

_MAGIC = b"CDL1"
_U32 = struct.Struct("<I")
_PAIR = struct.Struct("<II")
_ZSTD = get_codec("zstd")


class CondemnedList(Plain):
    """One published list: condemned digests, and where each lived when condemned."""

    FIELDS = ("name", "time", "digests", "loose", "packed")
    name: str
    time: float  # wall clock when gc wrote it
    digests: list[Digest]
    loose: set[Digest]  # condemned loose files
    packed: dict[Digest, set[str]]  # digest -> condemned pack entries (pack names)

    def __init__(self, name: str, time: float, digests: list[Digest], loose: set[Digest] | None = None,
                 packed: dict[Digest, set[str]] | None = None) -> None:
        self.name, self.time, self.digests = name, time, digests
        self.loose = set() if loose is None else loose
        self.packed = {} if packed is None else packed

    def age(self, now: float | None = None) -> float:
        return (time.time() if now is None else now) - self.time


def new_name() -> str:
    return f"{time.time_ns():016x}-{os.getpid():x}{os.urandom(4).hex()}"


def encode(lst: CondemnedList) -> bytes:
    order = sorted(range(len(lst.digests)), key=lambda i: lst.digests[i])
    digests = [lst.digests[i] for i in order]
    packs = sorted({p for ps in lst.packed.values() for p in ps})
    pack_ix = {p: i for i, p in enumerate(packs)}
    pairs = []
    for i, d in enumerate(digests):
        for p in sorted(lst.packed.get(d, ())):
            pairs.append((i, pack_ix[p]))
    import json  # a write's: a hit loads no json
    head = json.dumps({"time": lst.time, "count": len(digests), "entries": len(pairs), "packs": packs}).encode()
    loose = bytes(1 if d in lst.loose else 0 for d in digests)
    pair_bytes = b"".join(_PAIR.pack(i, j) for i, j in pairs)
    payload = _MAGIC + _U32.pack(len(head)) + head + b"".join(digests) + loose + pair_bytes
    return encode_frame(payload, KIND_TABLE, _ZSTD)[1]


def decode(name: str, data: bytes | memoryview | npt.NDArray[np.uint8]) -> CondemnedList:
    """Parse a list; :class:`DamagedObjectError` naming it if anything is off."""
    key = PREFIX + name
    raw = decode_frame(data, key)[1]
    mv = memoryview(raw).cast("B") if not isinstance(raw, bytes) else memoryview(raw)
    try:
        if bytes(mv[:4]) != _MAGIC:
            raise ValueError("bad magic")
        (hn,) = _U32.unpack_from(mv, 4)
        if 8 + hn > len(mv):
            raise ValueError("header longer than the list")
        head = metafile.load_object(mv[8 : 8 + hn], key)
        n, m, packs = head["count"], head["entries"], head["packs"]
        if type(n) is not int or type(m) is not int or type(packs) is not list or not all(type(x) is str for x in packs):
            raise TypeError("its header's count, entries or packs are of the wrong type")
        t = metafile.number(head, "time", key, 0.0, 1e11)  # never float(): "nan" as text is NaN, never due
        p = 8 + hn
        if n < 0 or m < 0 or len(mv) != p + 17 * n + 8 * m:
            raise ValueError(f"{len(mv)} bytes for {n} digests and {m} pack entries")
        digests = [Digest.from_raw(bytes(mv[p + 16 * i : p + 16 * i + 16])) for i in range(n)]
        p += 16 * n
        flags = bytes(mv[p : p + n])
        p += n
        pairs = list(_PAIR.iter_unpack(mv[p : p + 8 * m]))
        if m and (max(i for i, _ in pairs) >= n or max(j for _, j in pairs) >= len(packs)):
            raise ValueError("pack entry out of range")
    except (ValueError, KeyError, TypeError, struct.error) as e:
        raise DamagedObjectError(key, f"not a valid condemned list: {e}") from None
    loose = {d for d, f in zip(digests, flags) if f}
    packed: dict[Digest, set[str]] = {}
    for i, j in pairs:
        packed.setdefault(digests[i], set()).add(str(packs[j]))
    return CondemnedList(name, t, digests, loose, packed)
