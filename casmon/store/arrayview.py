"""Lazy array views: a stored numpy array opened as a read-only ``zarr.Array``.

:class:`ChunkView` is a read-only zarr store whose keys are computed, not
stored: ``zarr.json`` is metadata made for the value, and ``c/{i}/0/…`` is
chunk ``i`` of the value, read from casmon's content-addressed chunks. A slice
of the zarr array reads exactly the chunks it touches.

A C-ordered array is chunked by rows (first axis). A Fortran-ordered one is
chunked along its last axis and described with zarr's ``transpose`` codec, so
the stored bytes are used as they are.
"""

from __future__ import annotations

import asyncio
import functools
import math
import json
import threading
from collections.abc import AsyncIterator, Callable, Iterable
from typing import TYPE_CHECKING, Any

import numpy as np
import zarr
from zarr.abc.store import ByteRequest, OffsetByteRequest, RangeByteRequest, Store as ZarrStore, SuffixByteRequest
from zarr.storage import MemoryStore

from casmon.view import display
from casmon.keys.digest import Digest
from casmon.store import bufferpool, libraries
from casmon.store.objects import loose_key
from casmon.store.serialize import MAX_NDIM, dtype_from_meta, handler_named

if TYPE_CHECKING:
    from zarr.core.buffer import Buffer, BufferPrototype

    from casmon.store.manifest import Manifest, PartRef
    from casmon.store.store import Store

__all__ = ["ChunkView", "StoredArray", "open_array", "chunk_view", "byte_slice", "WHOLE_VIEW_CHUNK"]

#: The chunk size (bytes, rounded down to whole rows) a value laid out whole for mapping is read in.
WHOLE_VIEW_CHUNK = 4 << 20
#: An element larger than this is no array zarr presents (zarr builds its fill value, and a crafted void dtype of
#: gigabytes would stall it).
MAX_VIEW_ITEMSIZE = 1 << 20


def byte_slice(data: bytes, byte_range: ByteRequest | None) -> bytes:
    """The part of ``data`` a zarr byte range asks for (all of it for None)."""
    if byte_range is None:
        return data
    if isinstance(byte_range, RangeByteRequest):
        return data[byte_range.start : byte_range.end]
    if isinstance(byte_range, OffsetByteRequest):
        return data[byte_range.offset :]
    if isinstance(byte_range, SuffixByteRequest):
        return data[-byte_range.suffix :] if byte_range.suffix else b""
    raise TypeError(f"unexpected byte range {byte_range!r}")


class ChunkView(ZarrStore):
    """A read-only zarr store presenting one stored array."""

    supports_writes = False
    supports_deletes = False
    supports_partial_writes = False
    supports_listing = True

    def __init__(self, store: Store, manifest: Manifest, metadata: bytes, chunk_nbytes: int, fortran: bool,
                 whole: np.ndarray[Any, np.dtype[np.uint8]] | Callable[[], np.ndarray[Any, np.dtype[np.uint8]]] | None = None,
                 cb: int | None = None, part_index: int = 0) -> None:
        super().__init__(read_only=True)
        self._store = store
        self._manifest = manifest
        self._metadata = metadata
        self._part_index = part_index
        part = manifest.parts[part_index] if manifest.parts else {"n": 0, "cb": 1, "c": []}
        self._chunks = [Digest(h) for h in part["c"]]
        self._n = int(part["n"])
        self._cb = int(part["cb"]) if cb is None else cb
        # A value laid out whole for mapping (one raw object): chunks are row ranges of its checked map.
        # Given as a function, it is mapped and checked at the first chunk read, not when the view is made.
        self._whole = whole if whole is None or isinstance(whole, np.ndarray) else None
        self._whole_fn = None if whole is None or isinstance(whole, np.ndarray) else whole
        self._whole_lock = threading.Lock()
        self._nchunks = len(self._chunks) if whole is None else -(-self._n // self._cb)
        self._chunk_nbytes = chunk_nbytes
        self._fortran = fortran
        self.chunks_read = 0  # how many chunks were read (for tests and benchmarks)

    @property
    def metadata(self) -> bytes:
        """The array's ``zarr.json``."""
        return self._metadata

    @property
    def layout(self) -> tuple[int, int, int, bool]:
        """``(value bytes, stored bytes a chunk, zarr bytes a chunk, chunked along the last axis)``: chunk ``i`` is
        bytes ``[i * stored, i * stored + stored)`` of the value, the last one padded with zeros to zarr's size."""
        return self._n, self._cb, self._chunk_nbytes, self._fortran

    def stored_chunks(self) -> list[Digest] | None:
        """The stored chunks that are this array's chunks, in order; None where the chunks are ranges of one
        object laid out whole (:meth:`whole_bytes`)."""
        return None if self._whole is not None or self._whole_fn is not None else list(self._chunks)

    def whole_bytes(self) -> np.ndarray[Any, np.dtype[np.uint8]]:
        """The checked bytes of a value laid out whole (mapped and checked once)."""
        if self._whole_fn is not None:
            with self._whole_lock:
                if self._whole is None:
                    self._whole = self._whole_fn()
        if self._whole is None:
            raise ValueError(f"value {self._manifest.digest.hex()} is not laid out whole")
        return self._whole

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ChunkView) and other._manifest.digest == self._manifest.digest and \
            other._part_index == self._part_index

    def __str__(self) -> str:  # zarr shows it in its own reprs (a path, for stores that have one)
        return f"casmon value {self._manifest.digest.hex()}"

    __repr__ = __str__

    def _chunk_index(self, key: str) -> int | None:
        if key == "c":  # zero-dimensional
            return 0
        if not key.startswith("c/"):
            return None
        try:
            idx = [int(x) for x in key[2:].split("/")]
        except ValueError:
            return None
        main = idx[-1] if self._fortran else idx[0]
        others = idx[:-1] if self._fortran else idx[1:]
        if any(others) or not 0 <= main < self._nchunks:
            return None
        return main

    def _read_chunk(self, i: int) -> np.ndarray[Any, np.dtype[np.uint8]]:
        lo = i * self._cb
        hi = min(self._n, lo + self._cb)
        # A buffer from the pool, read and checked here: zarr copies from private memory holding the checked
        # bytes, not from a map of the file (see casmon.store.bufferpool).
        out = bufferpool.lease(self._chunk_nbytes)
        if hi - lo < self._chunk_nbytes:
            out[hi - lo :] = 0  # only the last chunk's padding needs zeros: the rest is read over
        if self._whole_fn is not None:
            with self._whole_lock:
                if self._whole is None:
                    self._whole = self._whole_fn()
        with bufferpool.reading(self._store.backend.local_root is not None):
            if self._whole is not None:
                out[: hi - lo] = self._whole[lo:hi]
            else:
                self._store.read_chunk(self._chunks[i], out[: hi - lo])
        self.chunks_read += 1
        return out

    def read_bytes(self, lo: int, hi: int) -> np.ndarray[Any, np.dtype[np.uint8]]:
        """Bytes ``[lo, hi)`` of the value, read (and checked) from the chunks that hold them."""
        lo, hi = max(0, lo), min(self._n, hi)
        if hi <= lo:
            return np.empty(0, np.uint8)
        first, last = lo // self._cb, (hi - 1) // self._cb
        if first == last:
            return self._read_chunk(first)[lo - first * self._cb : hi - first * self._cb]
        out = np.empty(hi - lo, np.uint8)
        for i in range(first, last + 1):
            a, b = max(lo, i * self._cb), min(hi, (i + 1) * self._cb)
            out[a - lo : b - lo] = self._read_chunk(i)[a - i * self._cb : b - i * self._cb]
        return out

    async def get(self, key: str, prototype: BufferPrototype | None = None,
                  byte_range: ByteRequest | None = None) -> Buffer | None:
        if prototype is None:
            from zarr.buffer import default_buffer_prototype

            prototype = default_buffer_prototype()
        if key == "zarr.json":
            return prototype.buffer.from_bytes(byte_slice(self._metadata, byte_range))
        i = self._chunk_index(key)
        if i is None:
            return None
        data = await asyncio.to_thread(self._read_chunk, i)
        if byte_range is None:
            return prototype.buffer.from_array_like(data)  # the chunk as read: no copy
        return prototype.buffer.from_bytes(byte_slice(data.tobytes(), byte_range))

    async def get_partial_values(self, prototype: BufferPrototype,
                                 key_ranges: Iterable[tuple[str, ByteRequest | None]]) -> list[Buffer | None]:
        return [await self.get(k, prototype, r) for k, r in key_ranges]

    async def exists(self, key: str) -> bool:
        return key == "zarr.json" or self._chunk_index(key) is not None

    async def set(self, key: str, value: Any) -> None:
        raise PermissionError("a stored casmon array is read-only")

    async def set_if_not_exists(self, key: str, value: Any) -> None:
        raise PermissionError("a stored casmon array is read-only")

    async def delete(self, key: str) -> None:
        raise PermissionError("a stored casmon array is read-only")

    def _keys(self) -> list[str]:
        return ["zarr.json"]  # chunk keys are computed; zarr does not need them listed

    async def list(self) -> AsyncIterator[str]:
        for k in self._keys():
            yield k

    async def list_prefix(self, prefix: str) -> AsyncIterator[str]:
        for k in self._keys():
            if k.startswith(prefix):
                yield k

    async def list_dir(self, prefix: str) -> AsyncIterator[str]:
        if prefix in ("", "/"):
            for k in self._keys():
                yield k


def _metadata(dtype: np.dtype[Any], shape: tuple[int, ...], chunks: tuple[int, ...], fortran: bool) -> bytes:
    """This array's ``zarr.json``: zarr's own for its dtype, layout and number of dimensions (made once), with its
    shape and chunk shape (the view of a store describes thousands of arrays; zarr takes a millisecond each)."""
    meta = json.loads(_template(dtype, len(shape), fortran))
    meta["shape"] = list(shape)
    meta["chunk_grid"]["configuration"]["chunk_shape"] = list(chunks)
    return json.dumps(meta).encode()


@functools.lru_cache(maxsize=1024)
def _template(dtype: np.dtype[Any], ndim: int, fortran: bool) -> bytes:
    """Let zarr write the metadata for an array of this kind into a scratch store, and take it."""
    shape = chunks = (1,) * ndim
    scratch: dict[str, Buffer] = {}
    kwargs: dict[str, Any] = {"compressors": None, "fill_value": np.zeros((), dtype=dtype).item() if dtype.kind not in "SUVO" else None}
    if fortran and len(shape) > 1:
        from zarr.codecs import TransposeCodec

        kwargs["filters"] = [TransposeCodec(order=tuple(reversed(range(len(shape)))))]
    else:
        kwargs["filters"] = None
    if dtype.byteorder == ">":
        from zarr.codecs import BytesCodec

        kwargs["serializer"] = BytesCodec(endian="big")
    zarr.create_array(MemoryStore(scratch), shape=shape, chunks=chunks, dtype=dtype, zarr_format=3, **kwargs)
    return scratch["zarr.json"].to_bytes()


def _whole(store: Store, part: PartRef) -> np.ndarray[Any, np.dtype[np.uint8]]:
    """The bytes of a value laid out whole: its checked map, or read once where it cannot be mapped now."""
    from casmon.store import mapped

    got = mapped.map_part(store.objects, part)
    if got is None:
        got = np.empty(int(part["n"]), np.uint8)
        store.read_chunk(Digest(part["c"][0]), got)
    return got


def _big_endian_inside(dt: np.dtype[Any]) -> bool:
    """Whether ``dt``, or a field or sub-array of it, is stored big-endian."""
    if dt.fields is not None:
        return any(_big_endian_inside(f[0]) for f in dt.fields.values())
    if dt.subdtype is not None:
        return _big_endian_inside(dt.subdtype[0])
    return dt.byteorder == ">"


def open_array(store: Store, manifest: Manifest) -> zarr.Array[Any]:
    """A lazy read-only ``zarr.Array`` over the stored array ``manifest`` describes (reads only the chunks a slice touches)."""
    arr = zarr.open_array(chunk_view(store, manifest), mode="r", zarr_format=3)
    try:
        return StoredArray(arr.async_array)
    except Exception:  # noqa: BLE001 - a zarr whose Array cannot be subclassed so: the plain array still works
        return arr


def chunk_view(store: Store, manifest: Manifest, lazy: bool = False, part: int = 0,
               layout: dict[str, Any] | None = None) -> ChunkView:
    """The read-only zarr store presenting the stored array ``manifest`` describes; TypeError or ValueError for a
    value zarr cannot present (not an array, or a dtype or layout zarr has no description for).

    ``lazy``: a value laid out whole for mapping is mapped and checked at its first chunk read, not now (the view
    of a whole store describes many values and reads none). ``part`` and ``layout``: one array of a value of
    several (a frame's column), its part and its ``dtype``/``shape``/``order`` as its handler says."""
    meta = manifest.meta
    if layout is not None:
        meta = layout
        if not 0 <= part < len(manifest.parts):
            raise ValueError(f"value {manifest.digest.hex()} has no part {part}")
    elif manifest.tag == "handler" and len(manifest.parts) == 1:
        # A handler whose value is one array of elements (a tensor) says how numpy sees them.
        name = str(meta.get("handler"))
        libraries.ensure_named(name)
        try:
            as_array = getattr(handler_named(name), "array_meta", None)
        except LookupError:
            as_array = None
        if as_array is None:
            raise TypeError(f"value {manifest.digest.hex()} was saved by handler {name!r}, not as an array")
        meta = as_array(meta["meta"])
    elif manifest.tag != "array":
        raise TypeError(f"value {manifest.digest.hex()} is a {manifest.tag} value, not a numpy array")
    dtype = dtype_from_meta(meta["dtype"])
    if dtype.fields is not None and _big_endian_inside(dtype):
        # zarr describes a structured type's byte order as a whole: such a field would read byte-swapped.
        raise TypeError(f"array {manifest.digest.hex()} has a structured dtype with a big-endian field ({dtype}), "
                        "which zarr cannot describe; load it with get()")
    raw_shape = meta["shape"]
    # Whoever described the layout (the manifest, a handler, a frame's column), it must be one the stored part
    # holds exactly: a shape beyond the stored bytes would read zarr's fill value, not damage.
    if not isinstance(raw_shape, list) or len(raw_shape) > MAX_NDIM or \
            not all(type(x) is int and x >= 0 for x in raw_shape) or meta.get("order") not in ("C", "F"):
        raise ValueError(f"value {manifest.digest.hex()}'s part {part} has no array layout (shape {str(raw_shape)[:80]}, "
                         f"order {str(meta.get('order'))[:10]})")
    if dtype.itemsize > MAX_VIEW_ITEMSIZE:
        raise TypeError(f"array {manifest.digest.hex()} has elements of {dtype.itemsize} bytes, more than a zarr view "
                        "presents; load it with get()")
    shape = tuple(raw_shape)
    fortran = meta["order"] == "F" and len(shape) > 1
    index = part
    stored = manifest.parts[index] if manifest.parts else {"n": 0, "cb": 1, "c": []}
    if int(stored["n"]) != math.prod(shape) * dtype.itemsize:
        raise ValueError(f"value {manifest.digest.hex()}'s part {part} holds {stored['n']} bytes, not an array of "
                         f"{shape} {dtype}")
    rb = max(1, int(stored.get("rb", 1)))
    cb = int(stored["cb"])
    whole: np.ndarray[Any, np.dtype[np.uint8]] | Callable[[], np.ndarray[Any, np.dtype[np.uint8]]] | None = None
    if len(stored["c"]) == 1 and cb > WHOLE_VIEW_CHUNK:
        # Laid out whole for mmap=True: one object of up to a GiB. Mapped and checked once here, then read in
        # chunks of whole rows, so a slice copies what it touches and not the whole value.
        from casmon.store import mapped

        if lazy:
            path = store.objects.backend.local_path(loose_key(Digest(stored["c"][0])))
            if path is not None and path.is_file():
                whole = functools.partial(_whole, store, stored)
        else:
            whole = mapped.map_part(store.objects, stored)
        if whole is not None:
            cb = max(rb, WHOLE_VIEW_CHUNK // rb * rb)
    # A chunk must hold whole rows (the stored row size a multiple of the shape's): else a zarr chunk of rows
    # would not be one stored chunk, and the view would present wrong values.
    row = max(1, math.prod(shape[:-1] if fortran else shape[1:]) * dtype.itemsize) if shape else max(1, dtype.itemsize)
    if cb % rb or (int(stored["n"]) > cb and rb % row):
        raise ValueError(f"array {manifest.digest.hex()} is not stored in chunks of whole rows; load it with get()")
    rows = max(1, cb // row)
    if not shape:
        chunks: tuple[int, ...] = ()
    elif fortran:
        chunks = (*shape[:-1], min(rows, shape[-1]) or 1)
    else:
        chunks = (min(rows, shape[0]) or 1, *shape[1:])
    chunks = tuple(max(1, c) for c in chunks)
    try:
        md = _metadata(dtype, shape, chunks, fortran)
    except Exception as e:  # noqa: BLE001 - zarr has no type for this dtype
        raise TypeError(f"array {manifest.digest.hex()} of dtype {dtype} cannot be opened with zarr: {e}") from None
    chunk_nbytes = int(np.prod(chunks, dtype=np.int64)) * dtype.itemsize if chunks else dtype.itemsize
    return ChunkView(store, manifest, md, chunk_nbytes, fortran, whole, cb if whole is not None else None, index)


class StoredArray(zarr.Array[Any]):
    """A stored array opened lazily: a read-only ``zarr.Array`` that says what it is (shape, dtype, chunks, digest)."""

    @display.guarded_text("array")
    def __repr__(self) -> str:
        return display.array_text(self)

    @display.guarded_html("array")
    def _repr_html_(self) -> str:
        return display.array_html(self)
