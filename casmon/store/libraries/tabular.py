"""What the frame handlers (pandas, xarray) share: a column or variable as one stored numeric part, with the
numpy layout the array handler keeps, and attributes kept only where they are plain JSON."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from casmon.keys.dtypes import dtype_extras
from casmon.store.serialize import Part, dtype_from_meta

__all__ = ["as_part", "from_part", "plain_json", "MAX_PARTS"]

#: A frame of more columns (variables) than this is pickled whole: one part each would cost more than it saves.
MAX_PARTS = 1024


def as_part(a: Any) -> tuple[dict[str, Any], Part] | None:
    """``(layout, part)`` for a numpy array stored as one part (chunked on its rows, so the zarr view presents
    it), or None if it is not one (objects, dtype extras)."""
    if not isinstance(a, np.ndarray) or a.dtype.hasobject or dtype_extras(a.dtype) is not None:
        return None
    if not a.flags.c_contiguous:
        a = a.copy(order="C")  # np.ascontiguousarray would make a 0-d array 1-d
    row = a.nbytes // a.shape[0] if a.ndim and a.shape[0] else max(1, a.nbytes)
    ts = a.dtype.itemsize if a.dtype.itemsize in (1, 2, 4, 8, 16) else 1
    flat = a.reshape(-1).view(np.uint8) if a.size and a.dtype.itemsize else np.empty(0, np.uint8)
    layout = {"dtype": repr(np.lib.format.dtype_to_descr(a.dtype)), "shape": list(a.shape), "order": "C"}
    return layout, Part(flat.data, row_bytes=max(1, row), typesize=ts, numeric=True)


def from_part(layout: dict[str, Any], buf: np.ndarray[Any, np.dtype[np.uint8]]) -> np.ndarray[Any, Any]:
    """The array a part holds, as :func:`as_part` described it."""
    dtype = dtype_from_meta(layout["dtype"])
    shape = tuple(int(n) for n in layout["shape"])
    if dtype.itemsize == 0 or not buf.size:
        return np.zeros(shape, dtype=dtype)
    return buf.view(dtype).reshape(shape)


def _plain(v: Any, depth: int = 0) -> bool:
    if v is None or type(v) in (bool, int, str):
        return True
    if type(v) is float:
        return math.isfinite(v)
    if depth > 20:
        return False
    if type(v) is list:
        return all(_plain(x, depth + 1) for x in v)
    if type(v) is dict:
        return all(type(k) is str and _plain(x, depth + 1) for k, x in v.items())
    return False


def plain_json(v: Any) -> bool:
    """Whether ``v`` comes back from JSON as it was (str keys, finite floats, lists not tuples)."""
    if not _plain(v):
        return False
    try:
        json.dumps(v, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return True
