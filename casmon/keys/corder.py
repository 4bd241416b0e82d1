"""A non-contiguous array's C-order bytes, made a block at a time: the key of a transposed, Fortran-ordered or
strided array is its C-order copy's, so those bytes are made before they are hashed.

Loaded by the first such array (numpy is imported by then).

A matrix whose columns lie closer together than its rows (``a.T``, Fortran order), wider than a few columns and
higher than a few rows, is copied in two steps a tile at a time: its column runs (2 KiB) into a staging tile
whose rows are padded by a cache line, then the tile's transpose out of it, both within L2, where a direct
strided copy reads each element from a different source row, 32 KiB apart in a 4096-column float64 matrix
(docs/BENCHMARKS.md, "ML values").
"""

from __future__ import annotations

import threading

import numpy as np

__all__ = ["TILE_RUN", "TILE_BYTES", "STAGE_BYTES", "NARROW", "NARROW_COLUMNS", "SHORT_ROWS", "tiled_copy",
           "c_order_bytes"]

#: A tile's height in bytes of one source column: the run the first step reads in one go.
TILE_RUN = 2048
#: A tile's size in bytes: it and its staged copy stay in a core's L2 (2 MiB here). 256 × 128 float64 copied a
#: transposed 4096² array fastest of 128 KiB-1 MiB (docs/BENCHMARKS.md, "ML values").
TILE_BYTES = 256 << 10
#: The most scratch a tile is staged in (short, wide tiles stage more than TILE_BYTES: each row is padded).
STAGE_BYTES = 2 * TILE_BYTES
#: Bytes after each staged row, so rows a power of two apart do not share cache sets.
_STAGE_PAD = 64
#: Rows this many bytes or columns wide or narrower are copied straight, in strips of :data:`_STRIP` bytes: a tile
#: of a few columns holds too few elements to repay two numpy calls (3 float64 columns took 3x as long, 40
#: complex128 ones 1.35x; 200 float32 ones half as long staged).
NARROW = 512
NARROW_COLUMNS = 64
_STRIP = 256
#: Blocks this many rows high or lower are copied straight too, in strips of :data:`_WIDE_STRIP` bytes: their runs
#: are a few elements long (3 rows of a 20 × 400,000 float64 Fortran array took 2.2x as long staged).
SHORT_ROWS = 3
_WIDE_STRIP = 32 << 10


def tiled_copy(out: np.ndarray, block: np.ndarray, stage: np.ndarray | None = None) -> None:
    """``out[...] = block`` for a C-ordered ``out``; a matrix whose columns lie closer together than its rows is
    copied through ``stage`` (uint8 scratch of :data:`STAGE_BYTES`, or None for a new one)."""
    if (block.ndim != 2 or abs(block.strides[0]) >= abs(block.strides[1]) or block.size == 0
            or block.dtype.itemsize == 0 or block.dtype.hasobject):  # no bytes to stage, or references
        np.copyto(out, block)
        return
    rows, cols = block.shape
    size = block.dtype.itemsize
    if cols * size <= NARROW or cols <= NARROW_COLUMNS or rows <= SHORT_ROWS:
        strip = max(1, (_WIDE_STRIP if rows <= SHORT_ROWS else _STRIP) // size)
        for c in range(0, cols, strip):
            np.copyto(out[:, c : c + strip], block[:, c : c + strip])
        return
    th = max(1, min(rows, TILE_RUN // size))
    span = th * size + max(1, _STAGE_PAD // size) * size  # bytes between staged rows: a whole number of elements
    tw = max(1, min(cols, TILE_BYTES // (th * size), STAGE_BYTES // span))
    if stage is None or stage.nbytes < tw * span:
        stage = np.empty(tw * span, np.uint8)
    tile = stage[: tw * span].view(block.dtype).reshape(tw, span // size)[:, :th]
    for r in range(0, rows, th):
        part = block[r : r + th]
        for c in range(0, cols, tw):
            src = part[:, c : c + tw]
            staged = tile[: src.shape[1], : src.shape[0]]
            np.copyto(staged, src.T)  # the source's runs, read in order
            np.copyto(out[r : r + th, c : c + tw], staged.T)  # the transpose, within L2


def c_order_bytes(a: np.ndarray, scratch: dict[int, tuple[np.ndarray, np.ndarray]], start: int,
                  stop: int) -> memoryview:
    """Bytes ``start:stop`` of ``a``'s C-order copy, made from the rows that hold them alone, in buffers each
    thread keeps in ``scratch`` for the run (new memory costs a page fault per 4 KiB, as much as the copy)."""
    row = a[0].nbytes
    r0, r1 = start // row, -(-stop // row)
    mine = scratch.get(threading.get_ident())
    if mine is None or mine[0].nbytes < (r1 - r0) * row:
        rows = -(-(stop - start) // row) + 1  # the most rows any stop - start bytes straddle
        mine = scratch[threading.get_ident()] = (np.empty(rows * row, np.uint8), np.empty(STAGE_BYTES, np.uint8))
    buf, stage = mine
    out = buf[: (r1 - r0) * row].view(a.dtype).reshape((r1 - r0,) + a.shape[1:])
    tiled_copy(out, a[r0:r1], stage)
    return buf.data[start - r0 * row : stop - r0 * row]
