"""A value written to a store: encoded, its buffers cut into chunks and stored once each, then its manifest
(:meth:`Store.put <casmon.store.store.Store.put>`'s work).

Loaded by the first value put (a miss, a run's artifact): a hit reads values and never loads it.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing's flag without importing typing (~2 ms of a first hit)
if TYPE_CHECKING:
    from typing import Any

    from casmon.store.manifest import PartRef
    from casmon.store.serialize import Encoded, Part
    from casmon.store.store import Store

from casmon.errors import StoreError
from casmon.keys.digest import Digest
from casmon.store import serialize
from casmon.store.backend.base import fault_points
from casmon.store.codec import KIND_CHUNK, KIND_VALUE
from casmon.store.manifest import encode_manifest

__all__ = ["put_sized", "put_encoded", "put_part", "put_whole"]


def _mapped() -> Any:
    """:mod:`casmon.store.mapped`, loaded by the first value laid out for mapping (``mmap=True``)."""
    from casmon.store import mapped

    return mapped


def put_sized(store: Store, value: Any, mmap: bool = False) -> tuple[Digest, int]:
    """:meth:`Store.put_sized <casmon.store.store.Store.put_sized>`."""
    store._check_writable()
    enc = serialize.encode(value)
    try:
        d = store.put_encoded(enc, mmap)
    except OSError as e:  # a full disk, no permission: say which store, keep the cause
        raise StoreError(f"cannot write to store {store.url}: {e.strerror or e}") from e
    held = store._held
    held.pop(d, None)
    held[d] = None
    if len(held) > 100_000:
        for k in list(held)[:50_000]:
            held.pop(k, None)
    return d, enc.nbytes


def put_encoded(store: Store, enc: Encoded, mmap: bool = False) -> Digest:
    """:meth:`Store.put_encoded <casmon.store.store.Store.put_encoded>`."""
    faultpoints = fault_points()
    objects = store.objects

    children = [store.put(c, mmap) for c in enc.children]
    t0 = objects.view()
    try:
        parts = [put_whole(store, p) if mmap and _mapped().lays_out_whole(store, p) else store._put_part(p)
                 for p in enc.parts]
    finally:
        objects.wait_writes()  # chunks are stored before the manifest can be
    if objects.view() != t0:
        # The condemned lists were read again while the chunks went in: a chunk relied on under
        # the older view may be condemned now. Store those again, so every chunk of the value is
        # checked under the view the manifest is put under.
        for p, part in zip(parts, enc.parts):
            data = part.data
            for i, h in enumerate(p["c"]):
                if objects.is_condemned(Digest(h)):
                    codec = store.array_codec if part.numeric else store.codec
                    objects.put(data[i * p["cb"] : (i + 1) * p["cb"]], KIND_CHUNK, codec, part.typesize)
    faultpoints.point("put.after_chunks")
    manifest = encode_manifest(enc.tag, enc.meta, parts, children, enc.inline, enc.nbytes)
    d = objects.put(manifest, KIND_VALUE, store.manifest_codec, size=enc.nbytes)
    objects.wait_writes()  # a large manifest is written like a chunk: done before put returns
    store._after_write()
    return d


def put_whole(store: Store, part: Part) -> PartRef:
    """A part as one raw object, so ``get(mmap=True)`` maps it (:mod:`casmon.store.mapped`)."""
    d = store.objects.put(part.data, KIND_CHUNK, _mapped().RAW, part.typesize)
    return {"n": part.data.nbytes, "cb": part.data.nbytes, "rb": max(1, part.row_bytes), "c": [d.hex()]}


def put_part(store: Store, part: Part) -> PartRef:
    """A part cut into chunks of whole rows (of at most the store's chunk size), each stored once."""
    data = part.data
    n = data.nbytes
    row = max(1, part.row_bytes)
    cs = store.chunk_size
    if row <= cs:
        cb = (cs // row) * row
    else:  # one row is larger than a chunk: cut rows, aligned to elements
        cb = max(part.typesize, cs - cs % part.typesize)
    codec = store.array_codec if part.numeric else store.codec
    chunks = [d.hex() for d in store.objects.put_chunks(data, cb, KIND_CHUNK, codec, part.typesize)]
    return {"n": n, "cb": cb, "rb": row, "c": chunks}
