"""An exported array written from its stored chunks: each chunk's payload copied as it is stored where its
encoding is one zarr reads (raw, Blosc, Zstd), checked against its digest while it is copied; zarr writes
only the array's ``zarr.json``.

A stored chunk is a casmon frame: a header, then the payload, raw or compressed.
A raw payload is exactly zarr's ``bytes`` codec output, a Blosc one is
``BloscCodec``'s (a Blosc frame describes itself: any Blosc reader decodes it),
a Zstd one is ``ZstdCodec``'s. So the export needs neither to decompress nor
to compress again. An array takes the encoding of its first chunk; a chunk
stored otherwise (compressed where the first was raw, LZ4 blocks zarr has no
codec for, a packed or short last chunk) is decoded and encoded to it.
"""

from __future__ import annotations

import asyncio
import json
import math
from typing import TYPE_CHECKING, Any

import numpy as np

from casmon.keys.digest import Digest

if TYPE_CHECKING:
    from zarr.abc.store import Store as ZarrStore

    from casmon.store.arrayview import ChunkView
    from casmon.store.store import Store

__all__ = ["FAMILY", "copy_chunks"]

#: casmon's codec ids by the zarr encoding their payloads are (LZ4 blocks, id 3, are no zarr codec's).
FAMILY = {0: "raw", 1: "blosc", 4: "blosc", 2: "zstd"}
#: Chunks read and written at once (memory stays a few chunks).
IN_FLIGHT = 4


def _codecs(family: str, itemsize: int) -> list[dict[str, Any]]:
    """The compressor of an array whose chunks are of ``family``, as its ``zarr.json`` lists it."""
    if family == "raw":
        return []
    from zarr.codecs import BloscCodec, ZstdCodec

    codec = BloscCodec(cname="lz4", clevel=5, shuffle="shuffle", typesize=max(1, itemsize), blocksize=0) \
        if family == "blosc" else ZstdCodec(level=1)
    return [codec.to_dict()]


def _encode(family: str, raw: np.ndarray[Any, np.dtype[np.uint8]], itemsize: int) -> Any:
    if family == "raw":
        return raw
    import numcodecs

    if family == "blosc":
        return numcodecs.Blosc(cname="lz4", clevel=5, shuffle=numcodecs.Blosc.SHUFFLE,
                               typesize=max(1, itemsize)).encode(raw)
    return numcodecs.Zstd(level=1).encode(raw)


class _Chunks:
    """Reads chunk ``i`` of one array as the bytes its export holds."""

    def __init__(self, store: Store, src: ChunkView, itemsize: int) -> None:
        self.store, self.itemsize = store, itemsize
        self.n, self.cb, self.cn, self.fortran = src.layout
        self.stored = src.stored_chunks()
        self.whole = src.whole_bytes() if self.stored is None else None
        self.count = -(-self.n // self.cb) if self.n else 0
        self.family = "raw"

    def first_family(self) -> str:
        """The encoding the first chunk is stored in: the array's."""
        if self.stored:
            got = self.store.objects.stored_payload(self.stored[0], np.empty(min(self.n, self.cb), np.uint8))
            if got is not None and got[0] in FAMILY:
                return FAMILY[got[0]]
        return "raw"

    def read(self, i: int) -> tuple[Any, bytes | None]:
        """Chunk ``i``'s bytes in the array's encoding, and, where they are a stored payload copied as it is, what
        names them (equal names, equal bytes: an export links them)."""
        lo, hi = i * self.cb, min(self.n, (i + 1) * self.cb)
        name = None
        if self.whole is not None:
            raw: Any = self.whole[lo:hi]
            codec: int | None = 0
        else:
            d: Digest = self.stored[i]  # type: ignore[index]
            scratch = np.empty(hi - lo, np.uint8)
            got = self.store.objects.stored_payload(d, scratch)
            if got is None:  # packed: read (and checked) the ordinary way
                self.store.read_chunk(d, scratch)
                raw, codec = scratch, 0
            else:
                codec, payload = got
                raw = payload if codec == 0 else scratch
                if hi - lo == self.cn and FAMILY.get(codec) == self.family:
                    return payload, b"d" + bytes(d) + bytes([codec])
        if hi - lo == self.cn and self.family == "raw" and codec == 0:
            return raw, name
        if hi - lo < self.cn:  # the last chunk: zarr's is whole, padded with zeros
            full = np.zeros(self.cn, np.uint8)
            full[: hi - lo] = np.frombuffer(raw, np.uint8)
            raw = full
        return _encode(self.family, np.frombuffer(raw, np.uint8), self.itemsize), name


def _key(path: str, i: int, ndim: int, fortran: bool) -> str:
    coords = [0] * ndim
    coords[-1 if fortran else 0] = i
    return f"{path}/c/" + "/".join(map(str, coords))


def copy_chunks(store: Store, dst: ZarrStore, path: str, meta: dict[str, Any], src: ChunkView,
                hint: Any = None) -> bool:
    """Write the array at ``path`` of the view (its ``zarr.json`` ``meta``, its chunks ``src``) into ``dst`` from
    its stored chunks; False (nothing written) for an array this does not write (zero-dimensional or empty).
    ``hint(key, name)``: told the name of bytes copied as stored before they are written."""
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.sync import sync

    shape = meta["shape"]
    chunk_shape = meta["chunk_grid"]["configuration"]["chunk_shape"]
    if not shape or 0 in shape:
        return False
    chunks = _Chunks(store, src, src.layout[2] // max(1, math.prod(chunk_shape)))
    chunks.family = chunks.first_family()
    buffer = default_buffer_prototype().buffer

    todo = iter(range(chunks.count))
    failed: list[BaseException] = []

    async def worker() -> None:
        for i in todo:  # shared by the workers: each chunk taken once
            if failed:
                return
            data, name = await asyncio.to_thread(chunks.read, i)
            key = _key(path, i, len(shape), chunks.fortran)
            if hint is not None and name is not None:
                hint(key, name)
            await dst.set(key, buffer.from_array_like(np.frombuffer(data, np.uint8)))

    async def guarded() -> None:
        try:
            await worker()
        except BaseException as e:
            failed.append(e)

    async def run() -> None:
        # Every worker ends before an error is raised: none writes into a target the caller then removes.
        await asyncio.gather(*(guarded() for _ in range(min(IN_FLIGHT, chunks.count))))
        if failed:
            raise failed[0]
        out = {**meta, "codecs": [*meta["codecs"], *_codecs(chunks.family, chunks.itemsize)]}
        await dst.set(f"{path}/zarr.json", buffer.from_bytes(json.dumps(out, allow_nan=False).encode()))

    sync(run())
    return True
