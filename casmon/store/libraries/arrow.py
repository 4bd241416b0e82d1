"""pyarrow: tables, record batches, arrays and chunked arrays in Arrow's IPC stream form.

The stream holds the buffers as Arrow lays them out (a slice writes only its own
values), so equal tables are stored once and loading maps the stored buffers without
a copy. An array's chunks are kept; a table's columns come back cut at the same rows
(IPC record batches cut every column alike). Loading parses an IPC stream, so a store opened with
``trust=False`` refuses these values.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from casmon.store.serialize import Part

__all__ = ["ArrowHandler", "ipc_bytes", "ipc_table"]


def ipc_bytes(table: Any) -> Any:
    """``table`` (a ``pa.Table``) as an IPC stream buffer. A one-column table is written a batch per chunk,
    so a chunked array keeps its chunks, empty ones too (a table's batches cut every column alike)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        if table.num_columns == 1:
            for chunk in table.column(0).chunks:
                w.write_batch(pa.record_batch([chunk], schema=table.schema))
        else:
            w.write_table(table)
    return sink.getvalue()


def ipc_table(buf: np.ndarray[Any, np.dtype[np.uint8]]) -> Any:
    """The table an IPC stream buffer holds, its columns over ``buf`` itself."""
    return pa.ipc.open_stream(pa.py_buffer(buf)).read_all()


def ipc_part(buf: Any) -> Part:
    return Part(memoryview(buf).cast("B"), numeric=True, typesize=8)


class ArrowHandler:
    name = "pyarrow.Table"

    def encode(self, v: Any) -> tuple[dict[str, Any], list[Any]] | None:
        if isinstance(v, pa.Table):
            kind, table = "table", v
        elif isinstance(v, pa.RecordBatch):
            kind, table = "batch", pa.Table.from_batches([v])
        elif isinstance(v, pa.ChunkedArray):
            kind, table = "chunked", pa.table({"_": v})
        elif isinstance(v, pa.Array):
            kind, table = "array", pa.table({"_": v})
        else:
            return None
        return {"kind": kind}, [ipc_part(ipc_bytes(table))]

    def decode(self, meta: dict[str, Any], buffers: list[np.ndarray[Any, np.dtype[np.uint8]]]) -> Any:
        table = ipc_table(buffers[0])
        kind = meta.get("kind")
        if kind == "table":
            return table
        if kind == "batch":
            batches = table.combine_chunks().to_batches()
            if not batches:  # no rows: IPC wrote no batch
                return pa.record_batch([pa.array([], type=f.type) for f in table.schema], schema=table.schema)
            return batches[0]
        col = table.column(0)
        if kind == "chunked":
            return col
        if kind == "array":
            if col.num_chunks == 0:
                return pa.array([], type=col.type)
            return col.chunk(0) if col.num_chunks == 1 else pa.concat_arrays(col.chunks)
        raise ValueError(f"unknown Arrow value kind {kind!r}")


HANDLER = ArrowHandler()


def handles(t: type) -> bool:
    """Whether :data:`HANDLER` saves values of exactly type ``t``."""
    return issubclass(t, (pa.Table, pa.RecordBatch, pa.ChunkedArray, pa.Array))
