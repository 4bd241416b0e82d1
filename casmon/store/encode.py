"""Encoding: a value turned into an :class:`~casmon.store.serialize.Encoded` (:func:`encode`), the write half of
:mod:`casmon.store.serialize`, which holds the forms, the handlers and decoding. A hit decodes, never encodes:
this module is loaded by the first value stored.
"""

from __future__ import annotations

import io
import sys
TYPE_CHECKING = False  # typing's flag without importing typing
if TYPE_CHECKING:
    from typing import IO, Any

from casmon.errors import UnpicklableError, locate_unpicklable
from casmon.keys.cpickle import pickle
from casmon.store import serialize
from casmon.store.codec import is_ndarray
from casmon.store.serialize import (_PLAIN, BYTES_MIN, JSON_MAX, OOB_MIN, ArrayHandler, Encoded, Part, _handlers, _see_numpy,
                                    handler_for)

__all__ = ["as_part", "encode"]


def as_part(buf: Any, numeric: bool, row_bytes: int = 1, typesize: int | None = None) -> Part:
    """``buf`` (an array, bytes, or any buffer) as one flat :class:`Part` of bytes, without a copy where it can."""
    if is_ndarray(buf):
        import numpy as np

        ts = buf.dtype.itemsize if buf.dtype.itemsize in (1, 2, 4, 8, 16) else 1
        flat = buf.reshape(-1, order="A").view(np.uint8) if buf.size else np.empty(0, np.uint8)
        return Part(flat.data, row_bytes=max(1, row_bytes), typesize=ts, numeric=numeric)
    mv = memoryview(buf)
    ts = typesize or mv.itemsize
    ts = ts if ts in (1, 2, 4, 8, 16) else 1
    if not mv.c_contiguous:
        mv = memoryview(mv.tobytes())
    return Part(mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv, row_bytes=max(1, row_bytes), typesize=ts, numeric=numeric)


def _jsonable(v: Any, budget: list[int], depth: int = 0) -> bool:
    """Small, shallow, acyclic JSON-like values only (a bounded walk: deep or recursive values are pickled)."""
    budget[0] -= 1
    if budget[0] < 0 or depth > 64:
        return False
    t = type(v)
    if t in (str, int, float, bool) or v is None:
        return True
    if t is list:
        return all(_jsonable(x, budget, depth + 1) for x in v)
    if t is dict:
        return all(type(k) is str and _jsonable(x, budget, depth + 1) for k, x in v.items())
    return False


class _Pickler(pickle.Pickler):
    def __init__(self, file: IO[bytes], children: list[Any], buffers: list[pickle.PickleBuffer], root: Any) -> None:
        super().__init__(file, protocol=5, buffer_callback=self._oob)
        self._children = children
        self._buffers = buffers
        self._root = root  # a value its handler declined is pickled itself, not made its own child
        self._child_ids: dict[int, int] = {}  # one child per object: a tensor a module and its optimizer share stays one

    def _oob(self, pb: pickle.PickleBuffer) -> bool:
        raw = pb.raw()
        if raw.nbytes < OOB_MIN:
            return True  # in-band
        self._buffers.append(pb)
        return False

    def persistent_id(self, obj: Any) -> int | None:
        t = type(obj)
        if t in _PLAIN:
            return None
        if serialize._NDARRAY is None:
            _see_numpy()
        if t is serialize._NDARRAY:
            # A strided array would be copied into the stream: it is stored as an array of its own
            # (unless it is that array, pickled because the array form declined it).
            if obj is self._root or obj.flags.c_contiguous or obj.flags.f_contiguous or obj.nbytes < OOB_MIN or obj.dtype.hasobject:
                return None
        elif obj is self._root or handler_for(t) is None:
            return None
        known = self._child_ids.get(id(obj))
        if known is not None:
            return known
        self._children.append(obj)  # holds obj, so its id is not reused while pickling
        self._child_ids[id(obj)] = len(self._children) - 1
        return len(self._children) - 1


def encode(value: Any, root: str = "value") -> Encoded:
    """Turn ``value`` into an :class:`Encoded`; raises :class:`UnpicklableError` naming the bad part."""
    t = type(value)
    h = _handlers.get(t) or handler_for(t)
    if h is not None:
        res = h.encode(value)
        if res is not None:
            meta, bufs = res
            if isinstance(h, ArrayHandler):
                a = bufs[0]
                if a.ndim == 0 or a.size == 0:
                    row = max(1, a.nbytes)
                elif meta["order"] == "C":
                    row = a.nbytes // a.shape[0]
                else:
                    row = a.nbytes // a.shape[-1]
                return Encoded("array", meta, parts=[as_part(a, True, row)], nbytes=a.nbytes)
            parts = [b if isinstance(b, Part) else as_part(b, False) for b in bufs]
            return Encoded("handler", {"handler": h.name, "meta": meta}, parts=parts, nbytes=sum(p.data.nbytes for p in parts))
    if t in (bytes, bytearray) and len(value) >= BYTES_MIN:
        return Encoded("bytes", {"type": t.__name__}, parts=[as_part(value, False)], nbytes=len(value))
    if t in (dict, list):  # containers: readable as JSON; scalars are faster to load as pickles
        if _jsonable(value, [10_000]):
            try:
                import json  # a write's: a hit loads no json
                text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
            except (ValueError, TypeError):
                text = None
            if text is not None and len(text) <= JSON_MAX:
                data = text.encode("utf-8", "surrogatepass")
                return Encoded("json", inline=data, nbytes=len(data))
    children: list[Any] = []
    buffers: list[pickle.PickleBuffer] = []
    f = io.BytesIO()
    try:
        _Pickler(f, children, buffers, value).dump(value)
    except RecursionError:
        raise TypeError(f"{root} is nested too deeply to pickle (Python's recursion limit, {sys.getrecursionlimit()})") from None
    except Exception as e:  # noqa: BLE001 - find and name the part that failed
        found = locate_unpicklable(value, root)
        raise (found or UnpicklableError(root, value, e)) from e
    stream = f.getbuffer()
    # An array inside an object gets the bare array's codec: byte shuffle by its element size
    # (the buffer's own format; pb.raw() would flatten it to bytes). Chunk boundaries stay as
    # they were, so manifests and digests of values stored before are unchanged.
    parts = [as_part(pb.raw(), True, typesize=memoryview(pb).itemsize) for pb in buffers]
    nbytes = stream.nbytes + sum(p.data.nbytes for p in parts)
    return Encoded("pickle", {"oob": len(parts)}, inline=bytes(stream), parts=parts, children=children, nbytes=nbytes)
