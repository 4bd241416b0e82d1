"""The value read path: a stored value's parts back as numpy byte buffers, copied or mapped.

:func:`read_part` fills a fresh buffer from a part's chunks (every chunk checked
against its digest), the way :meth:`casmon.store.store.Store.get` always has;
:func:`read_parts` with ``mmap=True`` maps the parts laid out for it instead
(:mod:`casmon.store.mapped`) and copies the rest. Apart from the store module
so that module stays one job (values, records and refs on a backend).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeAlias

from casmon.errors import DamagedObjectError, MissingObjectError
from casmon.keys.digest import Digest
from casmon.store.objects import LOOSE_MIN

if TYPE_CHECKING:
    import numpy as np

    from casmon.store.manifest import Manifest, PartRef
    from casmon.store.store import Store

__all__ = ["read_part", "read_parts", "check_chunk_sizes", "CHECK_BEFORE_ALLOCATING"]

#: A value part this large, read from an untrusted store, has its chunks' sizes checked before it is allocated.
CHECK_BEFORE_ALLOCATING = 64 << 20

Buffer: TypeAlias = "np.ndarray[Any, np.dtype[np.uint8]]"


def read_parts(store: Store, m: Manifest, mmap: bool = False) -> list[Buffer]:
    """The buffers of every part of value ``m``: fresh copies, or with ``mmap`` maps where the layout allows."""
    if not mmap or not m.parts:
        return [read_part(store, p) for p in m.parts]
    from casmon.store import mapped  # loaded by the first mapped read

    if not mapped.mappable_tag(m.tag):
        return [read_part(store, p) for p in m.parts]
    if store.backend.local_root is None:
        mapped.note_fallback(store)
        return [read_part(store, p) for p in m.parts]
    cow = m.tag == "handler"  # a handler may write the buffers it keeps (see casmon.store.mapped)
    out = []
    for p in m.parts:
        buf = mapped.map_part(store.objects, p, copy_on_write=cow)
        out.append(read_part(store, p) if buf is None else buf)
    return out


def read_part(store: Store, part: PartRef) -> Buffer:
    """A fresh buffer holding ``part``'s bytes, read from its chunks and checked."""
    n, cb = int(part["n"]), int(part["cb"])
    chunks = [Digest(h) for h in part["c"]]
    if len(chunks) != (n + cb - 1) // cb if cb else 0:
        raise DamagedObjectError("value part", f"{len(chunks)} chunks for {n} bytes of {cb}")
    if not store.trust and n >= CHECK_BEFORE_ALLOCATING:
        check_chunk_sizes(store, chunks, n, cb)  # a crafted manifest must not make us allocate a terabyte
    import numpy as np  # only values with parts (arrays, large buffers) are read here: a pickled dict is not

    buf = np.empty(n, dtype=np.uint8)
    large: list[tuple[Digest, Buffer]] = []
    for i, d in enumerate(chunks):
        lo = i * cb
        hi = min(n, lo + cb)
        if hi - lo >= LOOSE_MIN:
            large.append((d, buf[lo:hi]))
        else:
            store.objects.get(d, out=buf[lo:hi])
    store.objects.get_into_many(large)
    return buf


def check_chunk_sizes(store: Store, chunks: list[Digest], n: int, cb: int) -> None:
    """Every chunk exists and has the size the manifest claims (headers only), before the buffer is allocated."""
    for i, d in enumerate(chunks):
        want = min(cb, n - i * cb)
        h = store.objects.loose_header(d) if want >= LOOSE_MIN else None
        if h is not None:
            size = h.raw_len
        else:
            loc = store.objects.locate(d)
            if loc is None:
                raise MissingObjectError(f"chunk {d.hex()} of a value is not in {store.url}")
            size = loc.size
        if size != want:
            raise DamagedObjectError(f"object {d.hex()}", f"chunk of {size} bytes where its value's manifest says {want}")
