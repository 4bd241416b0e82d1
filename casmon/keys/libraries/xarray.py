"""xarray: variables, data arrays and datasets by dims, values, coords, indexes (which, of what type) and attrs.

``attrs`` of None and ``{}`` are one value (xarray makes one into the other on first
use). A variable read lazily from a file counts by the values it reads: they are
loaded (and kept, as xarray does) to be hashed, so a changed file is a new key. A
variable backed by dask is not keyed (see :mod:`.dask`). ``encoding`` does not count:
it says how a value was read or is to be written (file name, chunking), not what it is.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import xarray as xr

from casmon.errors import NotKeyable
from casmon.keys.fingerprint import register_library_hasher

__all__: list[str] = []


def _values(v: Any) -> Any:
    data = v._data
    if isinstance(data, np.ndarray):
        return data
    if hasattr(data, "__dask_graph__"):
        raise NotKeyable("a variable backed by dask computes its values only when asked; pass ds.load(), "
                         "or name its files with files=")
    index = getattr(data, "array", None)
    if type(index).__module__.startswith("pandas") and hasattr(index, "dtype"):
        return (index, getattr(data, "level", None))  # a pandas index: with its dtype (zone, categories)
    return v.values  # a lazily indexed file: its values, as the call would see them


def _variable_key(v: Any) -> Any:
    return (tuple(v.dims), dict(v.attrs or {}), _values(v))


def _indexes(obj: Any) -> Any:
    return tuple((name, type(index).__qualname__) for name, index in obj.xindexes.items())


def _dataarray_key(a: Any) -> Any:
    coords = tuple((name, type(c.variable).__qualname__, _variable_key(c.variable)) for name, c in a.coords.items())
    return (a.name, _variable_key(a.variable), coords, _indexes(a))


def _dataset_key(ds: Any) -> Any:
    names = set(ds.coords)
    return (tuple((name, name in names, type(var).__qualname__, _variable_key(var)) for name, var in ds.variables.items()),
            dict(ds.attrs or {}), _indexes(ds))


register_library_hasher(xr.Variable, _variable_key)
register_library_hasher(xr.DataArray, _dataarray_key)
register_library_hasher(xr.Dataset, _dataset_key)
