"""Where the time of a whole read through the zarr view goes, against ``ref.load()`` (issue 45's 1.2x goal).

    python -m benchmarks.zarr_read_breakdown --keep /work/benchstores/zarrread/g1 --rounds 8

One cached float64 array of ``--mib`` MiB (random: stored raw, in 4 MiB chunks)
in a local store, built once at ``--keep``. Each round measures, one after the
other (alternating, so a busy machine slows all alike):

* ``ref.load()``: casmon's threads read each chunk straight into the output;
* the view now: ``zarr.open_array(view)[:]``, chunks read into pooled buffers;
* the view as before: each chunk handed to zarr as its checked map;
* zarr's floor: the same array over a store that hands zarr one chunk already
  in memory for every key, reading nothing: what zarr's own work costs (its
  fresh output, its copy of each chunk on its event-loop thread, its overhead);
* the parts of that floor on one thread: first touch of a fresh output
  (page faults, the kernel zeroing it), and a copy into one already touched.

For each: the fastest and the median wall time, the ratio to ``ref.load()`` in
the same round, the process's CPU time, and the CPU time of zarr's event-loop
thread (its serial part: the view's wall time cannot go below it).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def build(path: Path, mib: int) -> None:
    import numpy as np

    import casmon

    s = casmon.open(path)
    a = np.random.default_rng(0).random(mib * (1 << 20) // 8 // 1024 * 1024).reshape(-1, 1024)

    @casmon.cache(store=s)
    def big():
        return a

    big()
    s.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keep", type=Path, required=True, help="the store (built here if missing)")
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=8)
    args = ap.parse_args()

    import numpy as np
    import zarr
    from zarr.abc.store import Store as ZarrStore

    import casmon
    from casmon.store import arrayview

    if not (args.keep / "casmon.json").exists():
        t0 = time.perf_counter()
        build(args.keep, args.mib)
        print(f"built {args.keep} in {time.perf_counter() - t0:.1f} s", flush=True)
    s = casmon.open(args.keep, read_only=True, create=False, autoflush=None)
    view = s.zarr()
    cache = zarr.open_group(view, mode="r")["cache"]
    fn = next(iter(cache.keys()))  # the store's one function, its one entry
    entry = next(iter(cache[fn].keys()))
    path = f"cache/{fn}/{entry}"
    z = cache[fn][entry]
    src = view.tree.arrays[path]
    digest = src._manifest.digest
    nbytes = z.nbytes

    def as_before(self, i):  # the read this branch replaced: the chunk's checked map
        from casmon.store import mapped

        got = mapped.map_part(self._store.objects, {"n": self._cb, "cb": self._cb, "c": [self._chunks[i].hex()]})
        if got is None or self._cb != self._chunk_nbytes:
            raise SystemExit("the array's chunks are not raw loose objects of one zarr chunk each")
        return got

    one = s.get(digest).reshape(-1).view(np.uint8)[: src._chunk_nbytes].copy()

    class Floor(ZarrStore):
        """Every chunk key: the same chunk, already in memory (nothing read)."""

        supports_writes = supports_deletes = supports_partial_writes = False
        supports_listing = True

        def __init__(self) -> None:
            super().__init__(read_only=True)

        def __eq__(self, other: object) -> bool:
            return other is self

        async def get(self, key, prototype=None, byte_range=None):
            if key == "zarr.json":
                return prototype.buffer.from_bytes(src.metadata)
            if not key.startswith("c/"):
                return None
            await asyncio.to_thread(int)  # as the view: the chunk comes from another thread
            return prototype.buffer.from_array_like(one)

        async def get_partial_values(self, prototype, key_ranges):
            return [await self.get(k, prototype, r) for k, r in key_ranges]

        async def exists(self, key):
            return key == "zarr.json"

        async def set(self, key, value):
            raise PermissionError(key)

        async def delete(self, key):
            raise PermissionError(key)

        async def list(self):
            yield "zarr.json"

        async def list_prefix(self, prefix):
            yield "zarr.json"

        async def list_dir(self, prefix):
            yield "zarr.json"

    floor = zarr.open_array(Floor(), mode="r")
    touched = np.empty(nbytes, np.uint8)
    touched[:] = 0
    whole = s.get(digest).reshape(-1).view(np.uint8)

    def fresh_touch():
        out = np.empty(nbytes, np.uint8)
        out[:: 4096] = 0

    def copy_touched():
        touched[:] = whole

    def before():
        real = arrayview.ChunkView._read_chunk
        arrayview.ChunkView._read_chunk = as_before
        try:
            z[:]
        finally:
            arrayview.ChunkView._read_chunk = real

    cases = {
        "`ref.load()`": lambda: s.get(digest),
        "the view now: `zarr.open_array(view)[:]`, pooled buffers": lambda: z[:],
        "the view as before: each chunk handed to zarr as its checked map": before,
        "zarr's floor: the same array over a store that reads nothing": lambda: floor[:],
        "one thread: first touch of a fresh output (faults, zeroing)": fresh_touch,
        "one thread: copy into an output already touched": copy_touched,
    }
    z[:1]  # zarr's event loop is started
    loop_thread = next(t for t in threading.enumerate() if t.name == "zarr_io")
    loop_clock = time.pthread_getcpuclockid(loop_thread.ident)
    wall: dict[str, list[float]] = {k: [] for k in cases}
    cpu: dict[str, list[float]] = {k: [] for k in cases}
    loop: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(args.rounds):
        for label, case in cases.items():
            l0, c0, t0 = time.clock_gettime(loop_clock), time.process_time(), time.perf_counter()
            case()
            wall[label].append(time.perf_counter() - t0)
            cpu[label].append(time.process_time() - c0)
            loop[label].append(time.clock_gettime(loop_clock) - l0)
    base = wall["`ref.load()`"]
    print(f"\n{args.mib} MiB, {args.rounds} rounds, load average {' '.join(f'{x:.1f}' for x in __import__('os').getloadavg())}")
    print("\n| measured | fastest | median | ratio to `ref.load()` (median of rounds) | CPU | zarr loop thread CPU |")
    print("|---|---|---|---|---|---|")
    for label in cases:
        ratio = statistics.median(w / b for w, b in zip(wall[label], base))
        print(f"| {label} | {min(wall[label]) * 1000:.0f} ms | {statistics.median(wall[label]) * 1000:.0f} ms | "
              f"{ratio:.2f}x | {statistics.median(cpu[label]) * 1000:.0f} ms | {statistics.median(loop[label]) * 1000:.0f} ms |")


if __name__ == "__main__":
    main()
