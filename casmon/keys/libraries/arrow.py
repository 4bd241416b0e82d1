"""pyarrow: arrays, chunked arrays, record batches and tables by their values, not their layout.

A column counts by its type (with field names, nullability and metadata), its length,
its nulls and its values (what sits under a null does not count), read from its
buffers at the slice's own offset: a slice
costs its own size and never counts its parent's bytes, and how a column is cut into
chunks does not count. Fixed-width and string/binary columns are hashed in place;
other types (nested, dictionary, view types) through Arrow's IPC form of the column
combined into one chunk, which writes exactly the slice's values.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from casmon.errors import NotKeyable
from casmon.keys.fingerprint import Concat, register_library_hasher

__all__ = ["column_key", "table_key"]

_u8 = np.uint8


def type_key(t: Any) -> Any:
    """An Arrow type by its text form and, for nested types, each field's name, nullability and metadata."""
    fields = []
    for i in range(getattr(t, "num_fields", 0)):
        f = t.field(i)
        fields.append((f.name, f.nullable, dict(f.metadata or {}), type_key(f.type)))
    return (str(t), tuple(fields))


def _valid(c: Any) -> np.ndarray[Any, Any]:
    return np.asarray(c.is_valid().to_numpy(zero_copy_only=False), dtype=bool)


def _validity(chunks: list[Any]) -> Any:
    return Concat([_valid(c).view(_u8) for c in chunks])


def _fixed(chunks: list[Any], width: int) -> Concat:
    out = []
    for c in chunks:
        buf = c.buffers()[1]
        data = np.frombuffer(buf, _u8, count=len(c) * width, offset=c.offset * width) if len(c) else np.empty(0, _u8)
        if c.null_count:  # what sits under a null is not part of the value: zeros
            rows = data.reshape(len(c), width).copy()
            rows[~_valid(c)] = 0
            data = rows.reshape(-1)
        out.append(data)
    return Concat(out)


def _binary(chunks: list[Any], large: bool) -> tuple[Concat, Concat]:
    dt = np.int64 if large else np.int32
    offsets: list[Any] = []
    data: list[Any] = []
    base = 0
    for i, c in enumerate(chunks):
        if not len(c):
            continue
        bufs = c.buffers()
        off = np.frombuffer(bufs[1], dt, count=len(c) + 1, offset=c.offset * dt().itemsize)
        first, last = int(off[0]), int(off[-1])
        rebased = off - (first - base)
        offsets.append(rebased if not offsets else rebased[1:])
        data.append(np.frombuffer(bufs[2], _u8, count=last - first, offset=first) if bufs[2] is not None and last > first
                    else np.empty(0, _u8))
        base += last - first
    if not offsets:
        offsets.append(np.zeros(1, dt))
    return Concat(offsets), Concat(data)


def column_key(col: Any) -> Any:
    """A ``pa.Array`` or ``pa.ChunkedArray`` by type, length, nulls and values, chunking not counted."""
    chunks = list(col.chunks) if isinstance(col, pa.ChunkedArray) else [col]
    t = col.type
    head = (type_key(t), len(col), col.null_count)
    nulls = _validity(chunks) if col.null_count else None
    view = _VIEWS.get(str(t))
    if view is not None:  # views lay the same strings out many ways: key them as the plain large type
        chunks = [c.cast(view) for c in chunks]
        t = view
    if nulls is not None and (pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_large_string(t)
                              or pa.types.is_large_binary(t)):
        chunks = [pc.if_else(c.is_valid(), c, pa.scalar(b"" if "binary" in str(t) else "", t)) for c in chunks]
    if (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_temporal(t) or pa.types.is_decimal(t)
            or pa.types.is_fixed_size_binary(t)) and t.bit_width % 8 == 0:
        return head + (nulls, _fixed(chunks, t.bit_width // 8))
    if pa.types.is_string(t) or pa.types.is_binary(t):
        return head + (nulls, *_binary(chunks, False))
    if pa.types.is_large_string(t) or pa.types.is_large_binary(t):
        return head + (nulls, *_binary(chunks, True))
    whole = pa.concat_arrays(chunks) if chunks else pa.array([], type=t)
    sink = pa.BufferOutputStream()
    batch = pa.record_batch([whole], names=["_"])
    with pa.ipc.new_stream(sink, batch.schema) as w:
        w.write_batch(batch)
    return head + ("ipc", np.frombuffer(sink.getvalue(), _u8))


def table_key(tab: Any) -> Any:
    """A ``pa.Table`` or ``pa.RecordBatch`` by its schema (fields and metadata) and columns."""
    schema = tab.schema
    return (tuple((f.name, f.nullable, dict(f.metadata or {})) for f in schema), dict(schema.metadata or {}),
            tab.num_rows, tuple(column_key(c) for c in tab.columns))


def _file_backed(v: Any) -> Any:
    raise NotKeyable("an Arrow dataset or Parquet file reads its files only when asked, so no key can see them "
                     "change; pass what it reads (.to_table(), .read()), or name its files with files=")


def register_for(t: type) -> bool:
    """File-backed Arrow types, from modules the user may import after this one was loaded."""
    lazy = []
    ds = sys.modules.get("pyarrow.dataset")
    if ds is not None:
        lazy.append(ds.Dataset)
    pq = sys.modules.get("pyarrow.parquet")
    if pq is not None:
        lazy += [getattr(pq, n) for n in ("ParquetDataset", "ParquetFile") if hasattr(pq, n)]
    for cls in lazy:
        if issubclass(t, cls):
            register_library_hasher(cls, _file_backed)
            return True
    return False


_VIEWS = {"string_view": pa.large_string(), "binary_view": pa.large_binary()}

register_library_hasher(pa.Array, column_key)
register_library_hasher(pa.ChunkedArray, column_key)
register_library_hasher(pa.Table, table_key)
register_library_hasher(pa.RecordBatch, table_key)
