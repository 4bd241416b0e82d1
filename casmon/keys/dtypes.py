"""What a numpy dtype is beyond its ``.npy`` descriptor.

``numpy.lib.format.dtype_to_descr`` (what keys and stored arrays name a dtype by)
drops a dtype's ``metadata`` (also on its fields and subarray base), the
aligned-struct flag, a record array's ``numpy.record`` scalar type, and says
``"|O"`` for every dtype that is not one of numpy's legacy ones (``StringDType``).
Dtypes differing only there compare equal, yet a function sees the difference,
so keys count it and stored arrays keep it.
"""

from __future__ import annotations

import sys
TYPE_CHECKING = False  # typing's flag without importing typing (~2 ms of a first hit)
if TYPE_CHECKING:
    from typing import Any

__all__ = ["dtype_extras", "descr_of", "layout_of", "has_padding"]


def dtype_extras(dt: Any) -> tuple[Any, ...] | None:
    """What ``dt`` holds that its descriptor does not, or None if nothing (most dtypes)."""
    legacy = getattr(type(dt), "_legacy", True)
    md = dt.metadata
    names = dt.names
    sub = dt.subdtype
    np = sys.modules["numpy"]
    if md is None and names is None and sub is None and legacy and dt.type is not np.record:
        return None  # the common case, in a few attribute reads
    fields: list[Any] = []
    if names is not None:
        for name in names:
            extra = dtype_extras(dt.fields[name][0])
            if extra is not None:
                fields.append((name, extra))
    base = dtype_extras(sub[0]) if sub is not None else None
    aligned = bool(dt.isalignedstruct)
    record = dt.type is np.record
    if md is None and not fields and base is None and not aligned and not record and legacy:
        return None
    return (None if md is None else dict(md), aligned, record, fields, base, None if legacy else repr(dt))


def descr_of(dt: Any) -> Any:
    """``numpy.lib.format.dtype_to_descr(dt)`` without its warnings: a dtype with metadata gets its
    descriptor without it (the caller keeps it), a non-legacy dtype ``"|O"``."""
    if not getattr(type(dt), "_legacy", True):
        return "|O"
    if dt.names is None:
        return dt.str
    try:
        return dt.descr
    except ValueError:  # fields out of order or overlapping: numpy has no descriptor for them
        return layout_of(dt)


def layout_of(dt: Any) -> Any:
    """A structured dtype whose fields are out of order or overlap, which ``dt.descr`` refuses: each field by name,
    dtype, offset and title, and the item size. The same bytes under fields named in another order are another
    value (``tolist()`` differs)."""
    fields = []
    for name in dt.names:
        f = dt.fields[name]
        sub = f[0].subdtype
        kind = (descr_of(sub[0]), sub[1]) if sub is not None else descr_of(f[0])
        fields.append((name, kind, int(f[1]), f[2] if len(f) > 2 else None))
    return ("fields", int(dt.itemsize), fields)


_padded: dict[Any, bool] = {}


def has_padding(dt: Any) -> bool:
    """Whether a structured dtype has bytes no field covers (alignment gaps, explicit offsets): their content is
    whatever memory held, so keys read the fields, not those bytes. Equal dtypes have equal layouts: cached."""
    if dt.names is None and dt.subdtype is None:
        return False
    try:
        return _padded[dt]
    except KeyError:
        pass
    if dt.subdtype is not None:
        padded = has_padding(dt.subdtype[0])
    else:
        spans = sorted((int(f[1]), int(f[1]) + f[0].itemsize) for f in (dt.fields[n] for n in dt.names))
        covered, end = 0, 0
        for start, stop in spans:
            if stop > end:
                covered += stop - max(start, end)
                end = stop
        padded = covered < dt.itemsize or any(has_padding(dt.fields[n][0]) for n in dt.names)
    _padded[dt] = padded
    return padded
