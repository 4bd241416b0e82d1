"""A column of text as two stored arrays: its UTF-8 bytes end to end (``uint8``) and where each value starts
(``int64``, one more than the values), as Arrow lays out a large string array, so the zarr view builds zarr's
variable-length string chunks from them and a load rebuilds the strings without unpickling anything.

Values that are not exactly ``str`` (subclasses, ``None``, numbers) and text UTF-8 cannot hold (a lone surrogate)
are declined: such a column stays pickled. pyarrow, where the program has it loaded (pandas 3 loads it), does
the work in C; without it the same layout is made and read in Python.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from casmon.store.serialize import Part

__all__ = ["encode_text", "decode_text", "check_offsets"]


def _arrow() -> Any:
    return sys.modules.get("pyarrow")  # used where loaded: never imported for the user


def encode_text(values: Any) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]] | None:
    """``(offsets, data)`` for ``values`` (a sequence of exactly ``str``, or a pyarrow string array without
    nulls); None where a value is not exactly ``str`` or not UTF-8 (a lone surrogate)."""
    pa = _arrow()
    if pa is not None and isinstance(values, pa.ChunkedArray):  # a column concatenated or read in pieces
        values = values.combine_chunks() if values.num_chunks != 1 else values.chunk(0)
    if pa is not None and isinstance(values, pa.Array):
        arr = values
    else:
        if len(values) and set(map(type, values)) != {str}:
            return None
        if pa is None:
            try:
                encoded = [s.encode("utf-8") for s in values]
            except UnicodeEncodeError:
                return None
            offsets = np.zeros(len(encoded) + 1, np.int64)
            np.cumsum(np.fromiter(map(len, encoded), np.int64, len(encoded)), out=offsets[1:])
            return offsets, np.frombuffer(b"".join(encoded), np.uint8)
        try:
            arr = pa.array(values, type=pa.large_string(), from_pandas=False)
        except (UnicodeError, ValueError, TypeError, pa.ArrowException):
            return None
    if arr.null_count:
        return None
    if arr.type != pa.large_string():
        arr = arr.cast(pa.large_string())
    n = len(arr)
    bufs = arr.buffers()
    offsets = np.frombuffer(bufs[1], np.int64, count=n + 1, offset=arr.offset * 8)
    data = np.frombuffer(bufs[2], np.uint8) if bufs[2] is not None else np.empty(0, np.uint8)
    lo, hi = int(offsets[0]), int(offsets[-1])
    return (offsets - lo if lo else offsets), data[lo:hi]


def check_offsets(offsets: np.ndarray[Any, Any], nbytes: int) -> None:
    """ValueError unless ``offsets`` start at 0, never fall and end at ``nbytes`` (a crafted or damaged layout)."""
    if not offsets.size or offsets[0] != 0 or offsets[-1] != nbytes or (offsets.size > 1 and bool((np.diff(offsets) < 0).any())):
        raise ValueError(f"string offsets do not span {nbytes} bytes in order")


def text_parts(offsets: np.ndarray[Any, Any], data: np.ndarray[Any, Any]) -> list[Part]:
    """The two stored parts: offsets chunked on whole values, the bytes as text (the general codec)."""
    off = np.ascontiguousarray(offsets, np.int64)
    raw = np.ascontiguousarray(data, np.uint8)
    return [Part(off.view(np.uint8).data if off.size else memoryview(b""), row_bytes=8, typesize=8, numeric=True),
            Part(raw.data if raw.size else memoryview(b""), row_bytes=1, typesize=1, numeric=False)]


def decode_text(offsets: np.ndarray[Any, Any], data: np.ndarray[Any, Any],
                missing: np.ndarray[Any, Any] | None = None) -> Any:
    """The strings the layout holds: a pyarrow large string array (nulls where ``missing``) where pyarrow is
    loaded, else an object array (None where ``missing``). ValueError for a layout that is no strings."""
    check_offsets(offsets, data.size)
    n = offsets.size - 1
    pa = _arrow()
    if pa is not None:
        validity = None
        nulls = 0
        if missing is not None and missing.any():
            nulls = int(missing.sum())
            validity = pa.py_buffer(np.packbits(~missing.astype(bool), bitorder="little"))
        arr = pa.LargeStringArray.from_buffers(n, pa.py_buffer(np.ascontiguousarray(offsets)),
                                               pa.py_buffer(np.ascontiguousarray(data)), validity, nulls)
        arr.validate(full=True)  # UTF-8 and offsets: a crafted layout is an error here, not a crash later
        return arr
    raw = data.tobytes()
    bounds = offsets.tolist()
    if raw.isascii():
        text = raw.decode("ascii")
        out = [text[a:b] for a, b in zip(bounds, bounds[1:])]
    else:
        out = [raw[a:b].decode("utf-8") for a, b in zip(bounds, bounds[1:])]
    objs = np.empty(n, object)
    objs[:] = out
    if missing is not None and missing.any():
        objs[missing.astype(bool)] = None
    return objs


def as_objects(strings: Any) -> np.ndarray[Any, Any]:
    """:func:`decode_text`'s result as an object array of ``str`` (None where missing)."""
    if isinstance(strings, np.ndarray):
        return strings
    out: np.ndarray[Any, Any] = strings.to_numpy(zero_copy_only=False)
    return out
