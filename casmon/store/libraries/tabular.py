"""What the frame handlers (pandas, xarray) share: a column or variable as one stored numeric part, with the
numpy layout the array handler keeps, and attributes kept only where they are plain JSON."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from casmon.keys.dtypes import dtype_extras
from casmon.store.serialize import Part, dtype_from_meta

__all__ = ["as_part", "from_part", "plain_json", "MAX_PARTS", "tagged", "untagged"]

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


#: How deep :func:`tagged` follows nested values (an encoding is a flat dict of a few numbers and names).
_TAG_DEPTH = 20


def tagged(v: Any, depth: int = 0) -> Any:
    """``v`` as JSON that :func:`untagged` turns back into an equal value of the same types: what an xarray
    variable's encoding from a netCDF file holds (numpy scalars such as ``scale_factor`` and ``_FillValue``, NaN
    included, numpy dtypes, tuples such as ``original_shape``, sets of names such as ``unlimited_dims``). Raises
    ValueError for anything else."""
    if v is None or type(v) in (bool, int, str):
        return v
    if type(v) is float:
        return v if math.isfinite(v) else {"$float": repr(v)}
    if depth > _TAG_DEPTH:
        raise ValueError("nested too deep")
    if type(v) is list:
        return [tagged(x, depth + 1) for x in v]
    if type(v) is tuple:
        return {"$tuple": [tagged(x, depth + 1) for x in v]}
    if type(v) is set and all(type(x) in (str, int) for x in v):  # netCDF's unlimited_dims
        return {"$set": sorted(v, key=lambda x: (type(x).__name__, x))}
    if type(v) is dict:
        if not all(type(k) is str for k in v):
            raise ValueError("a key that is not text")
        items = {k: tagged(x, depth + 1) for k, x in v.items()}
        return {"$dict": items} if any(k.startswith("$") for k in v) else items
    if isinstance(v, np.dtype) and not v.hasobject and v.fields is None:
        return {"$dtype": repr(np.lib.format.dtype_to_descr(v))}
    if isinstance(v, np.generic) and v.dtype.kind in "biufcSUmM" and dtype_extras(v.dtype) is None:
        # The scalar's bytes: NaN payloads and the exact type come back as they were.
        return {"$numpy": repr(np.lib.format.dtype_to_descr(v.dtype)), "bytes": v.tobytes().hex()}
    raise ValueError(f"a {type(v).__name__} value")


def untagged(v: Any) -> Any:
    """The value :func:`tagged` wrote as ``v``; ValueError for what it did not write (a crafted manifest)."""
    try:
        return _untagged(v, 0)
    except (TypeError, AttributeError, KeyError, IndexError, SyntaxError, OverflowError, RecursionError) as e:
        raise ValueError(f"not a tagged value: {type(e).__name__}") from None


def _untagged(v: Any, depth: int) -> Any:
    if depth > _TAG_DEPTH + 1:
        raise ValueError("nested too deep")
    if type(v) is list:
        return [_untagged(x, depth + 1) for x in v]
    if type(v) is not dict:
        return v
    if "$float" in v:
        return float(v["$float"])
    if "$set" in v:
        return set(v["$set"])
    if "$tuple" in v:
        return tuple(_untagged(x, depth + 1) for x in v["$tuple"])
    if "$dict" in v:
        return {k: _untagged(x, depth + 1) for k, x in v["$dict"].items()}
    if "$dtype" in v:
        return dtype_from_meta(v["$dtype"])
    if "$numpy" in v:
        dt = dtype_from_meta(v["$numpy"])
        raw = bytes.fromhex(v["bytes"])
        if len(raw) != dt.itemsize:
            raise ValueError(f"{len(raw)} bytes for a {dt} scalar")
        return np.frombuffer(raw, dt)[0]
    return {k: _untagged(x, depth + 1) for k, x in v.items()}
