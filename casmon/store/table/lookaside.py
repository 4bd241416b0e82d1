"""Writing a generation's lookaside copy (:data:`.format.LOOKASIDE`, read by :class:`.format.Lookaside`): the merge
that writes the generation writes it, and so does a reader that read the manifest whole for want of a sound one
(at its next flush). Derived data: a write that fails is ignored, and readers read the manifest whole. Also a
copy's rarer reads, which a first lookup never makes: the rest read at once (:func:`settle`), and a copy that
failed a check served from its manifest instead (:func:`recover`).
"""

from __future__ import annotations

import xxhash

TYPE_CHECKING = False  # typing's flag without importing typing
if TYPE_CHECKING:
    from casmon.store.table.format import Payload
    from casmon.store.table.table import Table
else:  # struct.py re-exports _struct: the same names
    import _struct as struct
if TYPE_CHECKING:
    import struct

from casmon.errors import DamagedObjectError
from casmon.store.table.format import (_LA_SUM, LA_HEAD, LA_MAGIC, LA_MAX_CHUNKS, LOOKASIDE, Lookaside, _parse_v2,
                                       _Vanished, byte_view)

__all__ = ["CHUNK", "encode", "recover", "settle", "write", "write_derived"]

#: Bytes a chunk of the copy holds at least (a lookup reads one per probe of the bloom filter): larger only where the
#: manifest would otherwise need more than :data:`~.format.LA_MAX_CHUNKS` of them.
CHUNK = 4096


def encode(digest: bytes, payload: Payload) -> bytes:
    """The lookaside copy of a format-2 manifest whose payload is ``payload`` and whose frame names ``digest``."""
    mv = byte_view(payload)
    size = len(mv)
    head = bytes(mv).find(b"\0")
    if head <= 0:
        raise ValueError("not a format-2 manifest: no zero byte after its JSON part")
    chunk = CHUNK
    while -(-size // chunk) > LA_MAX_CHUNKS:
        chunk *= 2
    n = -(-size // chunk)
    sums = struct.pack(f"<{n}Q", *(xxhash.xxh3_64_intdigest(mv[i : i + chunk]) for i in range(0, size, chunk)))
    header = LA_HEAD.pack(LA_MAGIC, 1, 0, bytes(digest), size, chunk, head)
    body = bytes(mv)
    return header + _LA_SUM.pack(xxhash.xxh3_64_intdigest(header + sums + body[: head + 1])) + sums + body


def write(t: Table, gid: str, digest: bytes, payload: Payload) -> None:
    """Write (or replace: a damaged or stale one) the copy of generation ``gid``; never raises."""
    key = f"{t.prefix}buckets/{gid}/{LOOKASIDE}"
    try:
        t.backend.set(key, encode(digest, payload))  # atomic: a reader sees the old copy or the new
        t.backend.forget(key)
        if not t.backend.exists(t.prefix + "gens/" + gid):  # merged away meanwhile: its folder goes with it
            t.backend.delete(key)
    except Exception:  # noqa: BLE001 - derived data: without it, readers read the manifest whole
        pass


def write_derived(t: Table) -> None:
    """:meth:`Table.write_lookasides`: the copies of the manifests ``t`` read whole for want of a sound one."""
    with t._lock:
        todo, t._derive = t._derive, {}
    if t.backend.read_only:
        return
    for gid, (digest, payload) in todo.items():
        write(t, gid, digest, payload)


def settle(la: Lookaside) -> None:
    """Read the rest at once and hand the generation its directory and bloom filter in memory: lookups
    then cost what they cost after a whole read."""
    g = la.gen
    missing = [c for c in range(len(la.sums)) if c not in la.chunks]
    if missing:
        a, b = la.at + missing[0] * la.chunk, min(la.at + (missing[-1] + 1) * la.chunk, la.at + la.size)
        try:
            data = la.read(a, b)
        except OSError:
            data = None
        raw = b"" if data is None else bytes(data)
        for c in missing:
            part = raw[(c - missing[0]) * la.chunk : (c - missing[0] + 1) * la.chunk]
            if len(part) != min(la.chunk, la.size - c * la.chunk) or \
                    xxhash.xxh3_64_intdigest(part) != la.sums[c]:
                la.recover()
                break
            la.chunks[c] = part
    if g is not None and g.lookaside is la:
        binary = memoryview(la.payload(la.head + 1, la.size))
        _parse_v2(g, {"blocks": g.blocks, "bloom_bits": g.nbits, "bloom_k": g.k}, binary)
        g.lookaside = None
    la.gen = None


def recover(la: Lookaside) -> None:
    """This copy failed a check: serve every chunk from the manifest read whole, or raise :class:`_Vanished`."""
    try:
        payload = la.whole()
    except (DamagedObjectError, OSError):
        payload = None
    if payload is None or len(payload) != la.size:
        la.failed = True
        raise _Vanished(la.key)
    raw = bytes(byte_view(payload))
    la.chunks = {c: raw[c * la.chunk : (c + 1) * la.chunk] for c in range(len(la.sums))}
    la.bad(payload)
    la.settle()  # all in memory now: hand it to the generation
