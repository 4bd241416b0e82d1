"""Where a transposed 4096² float64 array's fingerprint spends its time, on one thread (CPU time, medians of 7,
every candidate interleaved in each repeat); prints one JSON line of milliseconds for all 16 segments.

``PYTHONPATH=TREE python -m benchmarks.transpose_breakdown`` (needs casmon.keys.corder). The rows
(docs/BENCHMARKS.md, "ML values"):

* ``hash_contiguous``: xxh3 of the contiguous array's segments in place, the figure the ratio is against;
* ``copy_and_hash``: what a transposed array's key costs (``corder.c_order_bytes`` then xxh3, per segment);
* ``stage_reads``: the tiles' first step alone (each column run copied into the staged tile);
* ``stage_transposes``: the second step alone (a staged tile's transpose into the segment buffer);
* ``hash_buffer``: xxh3 of the 8 MiB segment buffer, 16 times;
* ``memcpy_segments``: the contiguous array copied segment by segment into the same buffer (no transpose): the
  least any copy of the bytes costs;
* ``direct_tiles_256B`` (``_and_hash``, ``_and_hash_new_buffer``): the previous copy (a strided copy of
  256-byte-wide tiles, no staging), alone, with each segment hashed, and so into a new buffer each call as the
  previous key did;
* ``ascontiguousarray`` / ``copy_C`` / ``assign_reused``: the whole transpose in one numpy call (a new array,
  ``.copy(order='C')``, ``dst[...] = a.T`` into a reused, faulted-in array).
"""

from __future__ import annotations

import json
import statistics
import time

import numpy as np
import xxhash

from casmon.keys import corder
from casmon.keys.segments import SEGMENT


def main() -> None:
    n = 4096
    a = np.random.default_rng(0).random((n, n))
    t = a.T
    rows = SEGMENT // (n * 8)
    bounds = [(o, o + SEGMENT) for o in range(0, a.nbytes, SEGMENT)]
    out = np.empty((rows, n))
    whole = np.empty((n, n))
    whole[...] = 0
    stage = np.empty(corder.STAGE_BYTES, np.uint8)
    flat = a.reshape(-1).view(np.uint8)
    th = corder.TILE_RUN // 8
    span = th * 8 + 64
    tw = corder.TILE_BYTES // (th * 8)
    tile = stage[: tw * span].view(np.float64).reshape(tw, span // 8)[:, :th]

    def copy_and_hash() -> None:
        scratch: dict = {}
        for s, e in bounds:
            xxhash.xxh3_128_digest(corder.c_order_bytes(t, scratch, s, e))

    def stage_reads() -> None:
        for r in range(0, n, rows):
            for c in range(0, n, tw):
                np.copyto(tile, t[r : r + rows, c : c + tw].T)

    def stage_transposes() -> None:
        for _ in range(0, n, rows):
            for c in range(0, n, tw):
                np.copyto(out[:, c : c + tw], tile.T)

    def direct_tiles(hashed: bool = False) -> None:
        for r in range(0, n, rows):
            block = t[r : r + rows]
            for c in range(0, n, 32):
                np.copyto(out[:, c : c + 32], block[:, c : c + 32])
            if hashed:
                xxhash.xxh3_128_digest(out)

    def direct_tiles_new_buffer() -> None:  # as the previous key made it: a new segment buffer each call
        seg = np.empty((rows, n))
        for r in range(0, n, rows):
            block = t[r : r + rows]
            for c in range(0, n, 32):
                np.copyto(seg[:, c : c + 32], block[:, c : c + 32])
            xxhash.xxh3_128_digest(seg)

    def assign_reused() -> None:
        whole[...] = t

    cands = {
        "hash_contiguous": lambda: [xxhash.xxh3_128_digest(flat[s:e]) for s, e in bounds],
        "copy_and_hash": copy_and_hash,
        "stage_reads": stage_reads,
        "stage_transposes": stage_transposes,
        "hash_buffer": lambda: [xxhash.xxh3_128_digest(out) for _ in bounds],
        "memcpy_segments": lambda: [np.copyto(out, a[r : r + rows]) for r in range(0, n, rows)],
        "direct_tiles_256B": direct_tiles,
        "direct_tiles_256B_and_hash": lambda: direct_tiles(True),
        "direct_tiles_256B_and_hash_new_buffer": direct_tiles_new_buffer,
    }
    whole_copies = {  # timed after the rest: 128 MiB allocations would move the heap under them
        "ascontiguousarray": lambda: np.ascontiguousarray(t),
        "copy_C": lambda: t.copy(order="C"),
        "assign_reused": assign_reused,
    }
    got: dict[str, float] = {}
    for group in (cands, whole_copies):
        for fn in group.values():
            fn()
        cpu: dict[str, list[float]] = {k: [] for k in group}
        for _ in range(7):
            for k, fn in group.items():
                c = time.process_time()
                fn()
                cpu[k].append(time.process_time() - c)
        got.update({k: round(statistics.median(v) * 1e3, 2) for k, v in cpu.items()})
    print(json.dumps(got))


if __name__ == "__main__":
    main()
