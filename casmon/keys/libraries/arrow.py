"""pyarrow: arrays, chunked arrays, record batches and tables by their values, not their layout.

A column counts by its type (with field names, nullability and metadata), its length,
its nulls and its values, read from its buffers at the slice's own offset: a slice
costs its own size and never counts its parent's bytes, and how a column is cut into
chunks does not count. Fixed-width and string/binary columns are hashed in place;
other types (nested, dictionary, view types) through Arrow's IPC form of the column
combined into one chunk, which writes exactly the slice's values.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

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


def _validity(chunks: list[Any]) -> Any:
    return Concat([np.asarray(c.is_valid().to_numpy(zero_copy_only=False)).view(_u8) for c in chunks])


def _fixed(chunks: list[Any], width: int) -> Concat:
    out = []
    for c in chunks:
        buf = c.buffers()[1]
        out.append(np.frombuffer(buf, _u8, count=len(c) * width, offset=c.offset * width) if len(c) else np.empty(0, _u8))
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


register_library_hasher(pa.Array, column_key)
register_library_hasher(pa.ChunkedArray, column_key)
register_library_hasher(pa.Table, table_key)
register_library_hasher(pa.RecordBatch, table_key)
