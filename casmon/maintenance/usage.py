"""``stats``: what a store holds, counted and sized, from one listing of its files.

Read-only, and tolerant of damage: damaged files are skipped and counted
(``casmon verify`` names them).
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

from casmon.errors import CasmonError, DamagedObjectError
from casmon.keys.digest import Digest
from casmon.maintenance import inventory, reach
from casmon.maintenance.phases import Progress, quiet
from casmon.store.codec import FRAME_HEADER, KIND_CHUNK, KIND_VALUE, read_header
from casmon.store.reserve import RESERVE_KEY
from casmon.view.display import StoreStats

if TYPE_CHECKING:
    from casmon.store.store import Store

__all__ = ["stats"]


def stats(store: Store, progress: Progress | None = None) -> StoreStats:
    """Counts and sizes of what the store holds.

    ``logical_bytes``: the sizes of all distinct values added up.
    ``chunk_bytes``: the distinct chunks' raw sizes (what is left after dedup);
    ``compression_ratio``: those bytes over the bytes the chunks take on disk (1.0 with no chunks).
    ``stored_bytes``: bytes on the backend, every file counted; ``reserve_bytes`` of them are the gc
    reserve (:mod:`casmon.store.reserve`: room for gc on a full disk, not data).
    ``records``: entries per kind, each counted once. Damaged files are skipped
    (``damaged_files`` counts them; ``casmon verify`` names them).
    """
    progress = progress or quiet
    store.flush()
    inv = inventory.take(store, strict=False)
    values = {d: loc for d, loc in inv.packed.items() if loc.kind == KIND_VALUE}
    packed_chunks = {d: loc for d, loc in inv.packed.items() if loc.kind == KIND_CHUNK}
    loose = list(inv.loose.items())
    headers = store.backend.get_ranges([(k, 0, FRAME_HEADER) for _d, k in loose]) if loose else []
    loose_raw = 0
    loose_values: list[Digest] = []  # large manifests are written loose, like chunks
    loose_chunk_keys: list[str] = []
    for (d, k), h in zip(loose, headers):
        try:
            frame = read_header(h, k) if h is not None else None
        except DamagedObjectError:
            continue
        if frame is None:
            continue
        if frame.kind == KIND_VALUE:
            loose_values.append(d)
        else:
            loose_raw += frame.raw_len
            loose_chunk_keys.append(k)
    sizes: list[int] = []
    step = 4096  # batches, so that a bar moves on a store of a million files
    for i in range(0, max(len(inv.all_keys), 1), step):
        progress("sizes", i, len(inv.all_keys))
        sizes += store.backend.getsize_many(inv.all_keys[i : i + step])
    progress("sizes", len(inv.all_keys), len(inv.all_keys))
    by_area: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for k, n in zip(inv.all_keys, sizes):
        area = k.split("/", 1)[0] if "/" in k else "(top)"
        by_area[area][0] += 1
        by_area[area][1] += n
    logical = sum(loc.size for loc in values.values())
    for d in loose_values:
        try:
            logical += store.manifest(d).nbytes
        except CasmonError:
            pass
    chunk_bytes = sum(loc.size for loc in packed_chunks.values()) + loose_raw
    object_bytes = by_area["objects"][1] + by_area["packs"][1]
    # Compression is of the chunks alone: small values, manifests and pack overhead are no compressed data.
    on_disk = dict(zip(inv.all_keys, sizes))
    chunks_stored = sum(loc.length for loc in packed_chunks.values()) + sum(on_disk.get(k, 0) for k in loose_chunk_keys)
    records = {kind: store.table(kind).count() for kind in store.record_kinds()}
    damaged = sum(len(t.damaged) for _prefix, t in reach.tables(store))
    return StoreStats({  # a dict that shows itself (sizes in MiB, ratios rounded)
        "store": store.url,
        "values": len(values) + len(loose_values),
        "chunks": len(packed_chunks) + len(inv.loose) - len(loose_values),
        "loose_objects": len(inv.loose),
        "packs": len(inv.packs),
        "logical_bytes": logical,
        "chunk_bytes": chunk_bytes,
        "stored_bytes": sum(sizes),
        "reserve_bytes": sum(n for k, n in zip(inv.all_keys, sizes) if k == RESERVE_KEY),
        "object_bytes": object_bytes,
        "dedup_ratio": (logical / chunk_bytes) if chunk_bytes else 1.0,
        "compression_ratio": (chunk_bytes / chunks_stored) if chunks_stored else 1.0,
        "files": len(inv.all_keys),
        "files_by_area": {a: v[0] for a, v in sorted(by_area.items())},
        "bytes_by_area": {a: v[1] for a, v in sorted(by_area.items())},
        "records": records,
        "refs": len(store.refs()),
        "damaged_files": damaged,
    })
