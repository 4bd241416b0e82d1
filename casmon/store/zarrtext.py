"""A stored text column (offsets and UTF-8 bytes, :mod:`casmon.store.libraries.strings`) as a zarr v3 array of
zarr's variable-length strings (``data_type: "string"``, codec ``vlen-utf8``, what ``zarr.create_array(...,
dtype=str)`` writes), readable by zarr-python and xarray without casmon.

The view is computed: a zarr chunk of rows is built from the offsets and bytes those rows span, read through the
stored chunks' digest checks (damage raises :class:`~casmon.errors.DamagedObjectError`, never wrong text).
``vlen-utf8``'s encoding: the number of items (``uint32``), then each item's byte length (``uint32``) and its
bytes; the last chunk's missing rows are the fill value, the empty string.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np

from casmon.errors import DamagedObjectError
from casmon.store.arrayview import ChunkView, byte_slice, chunk_view

if TYPE_CHECKING:
    from zarr.abc.store import ByteRequest
    from zarr.core.buffer import Buffer, BufferPrototype

    from casmon.store.manifest import Manifest
    from casmon.store.store import Store

__all__ = ["TextView", "text_view", "TEXT_CHUNK_BYTES"]

#: A zarr chunk of text holds about this many bytes (whole rows; at least one).
TEXT_CHUNK_BYTES = 1 << 20
_U32 = 1 << 32


def text_metadata(rows: int, chunk_rows: int) -> dict[str, Any]:
    """The ``zarr.json`` of a 1-D array of variable-length strings, as zarr writes it for ``dtype=str``."""
    return {"zarr_format": 3, "node_type": "array", "shape": [rows], "data_type": "string",
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [chunk_rows]}},
            "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
            "fill_value": "", "codecs": [{"name": "vlen-utf8", "configuration": {}}], "attributes": {}}


class TextView:
    """Serves the chunks (``c/{j}``) of one stored text column as zarr's ``vlen-utf8`` bytes."""

    def __init__(self, manifest: Manifest, offsets: ChunkView, data: ChunkView, rows: int) -> None:
        self._key = manifest.digest.hex()
        self._off, self._data, self.rows = offsets, data, rows
        self._nbytes = data.layout[0]
        avg = self._nbytes // max(1, rows)
        # rows of about a stored chunk of offsets, and at most about TEXT_CHUNK_BYTES of text: a slice reads
        # the stored chunks near it, not the column
        self.chunk_rows = max(1, min(max(1, rows), offsets.layout[1] // 8, TEXT_CHUNK_BYTES // (avg + 4)))
        self.metadata = json.dumps(text_metadata(rows, self.chunk_rows)).encode()
        self._lock = threading.Lock()
        self.chunks_read = 0

    def _bad(self, why: str) -> DamagedObjectError:
        return DamagedObjectError(self._key, f"its text column cannot be read: {why}")

    def chunk(self, j: int) -> bytes:
        """Chunk ``j``: rows ``[j * chunk_rows, ...)`` in ``vlen-utf8``'s encoding."""
        r0 = j * self.chunk_rows
        r1 = min(self.rows, r0 + self.chunk_rows)
        off = self._off.read_bytes(8 * r0, 8 * (r1 + 1)).view("<i8")
        k = r1 - r0
        if off.size != k + 1 or off[0] < 0 or off[-1] > self._nbytes or bool((np.diff(off) < 0).any()):
            raise self._bad(f"offsets of rows {r0} to {r1} do not fit its {self._nbytes} bytes")
        lens = np.diff(off)
        if lens.size and int(lens.max()) >= _U32:
            raise self._bad("a string of 4 GiB or more")
        text = self._data.read_bytes(int(off[0]), int(off[-1]))
        try:
            text.tobytes().decode("utf-8")
        except UnicodeDecodeError as e:
            raise self._bad(f"not UTF-8 ({e.reason})") from None
        total = text.size
        # each row is decoded alone: a row may not start inside a character (a continuation byte, 10xxxxxx)
        inner = off[1:-1] - off[0]
        inner = inner[inner < total]
        if inner.size and bool(((text[inner] & 0xC0) == 0x80).any()):
            raise self._bad(f"not UTF-8 (a character split between rows {r0} to {r1})")
        out = np.zeros(4 + 4 * self.chunk_rows + total, np.uint8)
        out[:4] = np.array([self.chunk_rows], "<u4").view(np.uint8)
        # item i's length sits after the i earlier items' lengths and bytes; its bytes right after it
        starts = 4 + 4 * np.arange(k, dtype=np.int64) + (off[:-1] - off[0])
        out[(starts[:, None] + np.arange(4)).reshape(-1)] = lens.astype("<u4").view(np.uint8)
        if total:
            item = np.repeat(np.arange(k, dtype=np.int64), lens)
            out[np.arange(total, dtype=np.int64) + 4 + 4 * (item + 1)] = text
        with self._lock:
            self.chunks_read += 1
        return out.tobytes()

    def _index(self, key: str) -> int | None:
        if not key.startswith("c/"):
            return None
        try:
            j = int(key[2:])
        except ValueError:
            return None
        return j if 0 <= j < max(1, -(-self.rows // self.chunk_rows)) else None

    async def get(self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None) -> Buffer | None:
        if key == "zarr.json":
            return prototype.buffer.from_bytes(byte_slice(self.metadata, byte_range))
        j = self._index(key)
        if j is None:
            return None
        data = await asyncio.to_thread(self.chunk, j)
        return prototype.buffer.from_bytes(byte_slice(data, byte_range))

    async def get_partial_values(self, prototype: BufferPrototype,
                                 key_ranges: Iterable[tuple[str, ByteRequest | None]]) -> list[Buffer | None]:
        return [await self.get(k, prototype, r) for k, r in key_ranges]

    async def exists(self, key: str) -> bool:
        return key == "zarr.json" or self._index(key) is not None


def text_view(store: Store, manifest: Manifest, offsets: int, data: int) -> TextView:
    """The text column whose offsets and bytes are parts ``offsets`` and ``data`` of ``manifest``'s value;
    ValueError where they are no such column."""
    parts = manifest.parts
    if not (0 <= offsets < len(parts) and 0 <= data < len(parts)):
        raise ValueError(f"value {manifest.digest.hex()} has no parts {offsets} and {data}")
    n_off, n_data = int(parts[offsets]["n"]), int(parts[data]["n"])
    if n_off < 8 or n_off % 8:
        raise ValueError(f"value {manifest.digest.hex()}'s part {offsets} is no offsets of a text column")

    def raw(part: int, n: int) -> ChunkView:
        return chunk_view(store, manifest, lazy=True, part=part, layout={"dtype": "'|u1'", "shape": [n], "order": "C"})

    return TextView(manifest, raw(offsets, n_off), raw(data, n_data), n_off // 8 - 1)
