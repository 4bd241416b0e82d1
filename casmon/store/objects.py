"""Objects: immutable blobs addressed by the digest of their content.

A blob is written once, framed (see :mod:`casmon.store.codec`) and never rewritten.
Where it lives depends on its size:

``objects/{hh}/{digest}``
    *Loose* objects: blobs of at least ``LOOSE_MIN`` raw bytes (array chunks).
    One file each, written with create-if-absent.
``packs/{id}``
    *Packs*: the small blobs (value manifests, small chunks) of one flush,
    concatenated frames, named by a random 128-bit id (never by content: a
    new copy of a condemned object must land where no condemned list points).
``index/``
    The pack index, a :class:`~casmon.store.table.Table` from blob digest to
    ``(pack, offset, length, kind, size)``.

Small blobs wait in memory until :meth:`ObjectStore.flush` writes them as a
pack and then their index entries, in that order: an index entry never
points at a pack that is not there. Every read checks the frame's digest.
"""

from __future__ import annotations

import _thread  # threading's locks, without loading threading on a hit
import time
from collections import OrderedDict
TYPE_CHECKING = False  # typing's flag without importing typing (~2 ms of a first hit)
if TYPE_CHECKING:
    from typing import Any


from casmon.store.backend import Backend
from casmon.store.codec import FRAME_HEADER, KIND_VALUE, Codec, Frame, decode_frame, is_ndarray, read_header
from casmon.keys.digest import Digest, xxhash
from casmon.errors import DamagedObjectError, MissingObjectError
from casmon.plain import Frozen
from casmon.store.table import Table

if TYPE_CHECKING:
    from concurrent.futures import Future

    import numpy as np
    import numpy.typing as npt
    from typing_extensions import TypeAlias

    #: A blob's raw bytes as a caller hands them in.
    Raw: TypeAlias = bytes | bytearray | memoryview
    #: A buffer a read fills in place (a slice of a value's buffer).
    Out: TypeAlias = npt.NDArray[np.uint8] | bytearray | memoryview
    #: A blob waiting for a pack: (frame, kind, logical size, the view it was checked under).
    Waiting: TypeAlias = tuple[bytes, int, int, float]

__all__ = ["ObjectStore", "Location", "loose_key", "pack_key", "LOOSE_MIN"]

#: Blobs with at least this many raw bytes are stored loose, one file each.
LOOSE_MIN = 256 << 10
#: A flush is forced once this many bytes of small blobs are waiting.
PACK_MAX = 8 << 20
_INF = float("inf")  # math.inf, without loading math
#: An index entry ("<16sQIBQ": pack digest, offset, length, kind, size), read and written with int.from_bytes and
#: int.to_bytes: a hit loads no _struct.
_LOC_SIZE = 37
#: A large value's I/O (the chunk pool, reads into buffers) and a write are loaded by their first use: a small
#: value's hit needs neither.
_chunkio: Any = None
_blobwrite: Any = None


def _chunk_io() -> Any:
    global _chunkio
    if _chunkio is None:
        from casmon.store import chunkio

        _chunkio = chunkio
    return _chunkio


_condemned: Any = None


def gc_bounds() -> Any:
    """:mod:`casmon.store.condemned` (gc's time bounds), bound on the first write: a hit loads none, and a write
    runs no import statement for it."""
    global _condemned
    if _condemned is None:
        from casmon.store import condemned

        _condemned = condemned
    return _condemned


def _writing() -> Any:
    global _blobwrite
    if _blobwrite is None:
        from casmon.store import blobwrite

        _blobwrite = blobwrite
    return _blobwrite


def _bytes_of(buf: Out) -> memoryview:
    """``buf`` as one flat view of bytes (numpy's type stubs give arrays the buffer protocol only from Python 3.12)."""
    return (buf.data if is_ndarray(buf) else memoryview(buf)).cast("B")


def _hash(mv: Raw) -> Digest:
    return Digest.from_raw(xxhash.xxh3_128_digest(mv))


#: Blobs up to this size that this writer puts are kept for :meth:`ObjectStore.peek_raw`.
RAW_KEEP = 4096


def loose_key(d: Digest) -> str:
    h = d.hex()
    return f"objects/{h[:2]}/{h}"


def pack_key(name: str) -> str:
    return f"packs/{name}"


class Location(Frozen):
    """Where a packed blob is: pack name, byte range, kind, and logical size."""

    FIELDS = ("pack", "offset", "length", "kind", "size")
    pack: str
    offset: int
    length: int
    kind: int
    size: int

    def __init__(self, pack: str, offset: int, length: int, kind: int, size: int) -> None:
        d = self.__dict__
        d["pack"], d["offset"], d["length"], d["kind"], d["size"] = pack, offset, length, kind, size

    def encode(self) -> bytes:
        p = bytes.fromhex(self.pack)[:16].ljust(16, b"\0")  # as struct's "16s" packs it
        return (p + self.offset.to_bytes(8, "little") + self.length.to_bytes(4, "little") + self.kind.to_bytes(1, "little")
                + self.size.to_bytes(8, "little"))

    @classmethod
    def decode(cls, b: bytes) -> Location:
        if len(b) != _LOC_SIZE:
            raise DamagedObjectError("index", f"an index entry is {len(b)} bytes, not {_LOC_SIZE}")
        return cls(bytes(b[:16]).hex(), int.from_bytes(b[16:24], "little"), int.from_bytes(b[24:28], "little"), b[28],
                   int.from_bytes(b[29:37], "little"))


class _LRU:
    """A byte-bounded LRU of immutable bytes."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.size = 0
        self.d: OrderedDict[object, bytes] = OrderedDict()
        self.lock = _thread.allocate_lock()

    def get(self, k: object) -> bytes | None:
        v = self.d.get(k)
        if v is not None:
            try:
                self.d.move_to_end(k)
            except KeyError:  # evicted by another thread meanwhile
                pass
        return v

    def put(self, k: object, v: bytes) -> None:
        n = len(v)
        if n > self.max_bytes // 4:
            return
        if type(k) is not bytes and isinstance(k, bytes):
            k = bytes(k)  # a Digest's plain bytes (same hash): the garbage collector walks Digests, not bytes
        with self.lock:
            if k in self.d:
                return
            self.d[k] = v
            self.size += n
            while self.size > self.max_bytes:
                _, old = self.d.popitem(last=False)
                self.size -= len(old)

    def clear(self) -> None:
        with self.lock:
            self.d.clear()
            self.size = 0


class ObjectStore:
    """Content-addressed blobs on a backend: loose objects, packs and the pack index."""

    def __init__(self, backend: Backend, writer: str, cache_bytes: int = 64 << 20) -> None:
        self.backend = backend
        self.index = Table(backend, "index/", writer)
        self._lock = _thread.RLock()
        # Keyed by a Digest's plain bytes (equal to it, same hash): see _queue.
        self._pending: dict[bytes, Waiting] = {}  # digest -> (frame, kind, size, view)
        self._flushing: dict[bytes, Waiting] = {}  # taken by a flush, not indexed yet
        self._pending_bytes = 0
        # Blobs this writer relies on as stored -> the time (monotonic) of the condemned-list view
        # under which it last checked them: stored, and condemned by no list it could see.
        self._known: dict[bytes, float] = {}
        self._condemned: set[Digest] = set()  # union of the visible condemned lists
        self._lists: dict[str, list[Digest]] = {}  # visible condemned lists -> their digests
        self._view_at = -_INF  # when the condemned lists were last listed (monotonic)
        self._view_lock = _thread.RLock()
        self.revived = 0  # condemned objects this writer stored again instead of relying on them
        self._packs = _LRU(cache_bytes)  # whole packs, by name
        self._pack_reads: dict[str, int] = {}  # packs read from by range, and how often
        self._raw = _LRU(cache_bytes // 2)  # decoded small blobs, by digest
        # Small blobs this writer just put, for peek_raw only: a get still reads the store, so a
        # value gc deleted is found missing (and the cache asks the store for the newest entry).
        self._put_raw = _LRU(1 << 20)
        self._suspect: set[Digest] = set()  # found damaged on read: the next put rewrites them
        self._cut_packs: set[str] = set()  # packs found shorter than the index says: a put does not rely on them
        self._inflight: list[tuple[Digest, Future[None], float]] = []  # loose writes under way
        self._inflight_lock = _thread.allocate_lock()

    # -- writing ---------------------------------------------------------------
    def put(self, raw: Raw, kind: int, codec: Codec, typesize: int = 1, size: int | None = None,
            digest: Digest | None = None) -> Digest:
        """Store a blob (if it is not stored yet) and return its digest.

        Deduplicates only against objects that are stored and condemned by no
        list this writer can see; a condemned object is written again, as a new
        pack entry that no condemned list names. ``digest``, if given, is the
        xxh3-128 of ``raw`` (computed by :meth:`put_chunks` on the chunk pool).
        """
        return _writing().put(self, raw, kind, codec, typesize, size, digest)  # type: ignore[no-any-return]

    def put_chunks(self, data: memoryview, cb: int, kind: int, codec: Codec, typesize: int = 1) -> list[Digest]:
        """:meth:`put` each ``cb``-byte piece of ``data``; the pieces are hashed on the chunk pool first."""
        return _writing().put_chunks(self, data, cb, kind, codec, typesize)  # type: ignore[no-any-return]

    def _write_loose(self, d: Digest, raw: Raw, kind: int, codec: Codec, typesize: int) -> None:
        """Write a large blob as a loose object unless it is there (create-if-absent); any thread."""
        _writing().write_loose(self, d, raw, kind, codec, typesize)

    # -- the condemned-list view ---------------------------------------------------
    def view(self) -> float:
        """The time of a view of the condemned lists no older than ``VIEW_MAX`` (listing again if needed)."""
        if time.monotonic() - self._view_at < gc_bounds().VIEW_MAX:
            return self._view_at
        return self.refresh_view()

    def refresh_view(self) -> float:
        """List ``gc/condemned/`` now; return the time of this view.

        A list that vanished was swept by gc, and a writer that has not looked for
        ``GAP_MAX`` may have missed one: either way this writer forgets what it
        believed stored and reads the index again.
        """
        return _writing().refresh_view(self)  # type: ignore[no-any-return]

    def is_condemned(self, d: Digest) -> bool:
        """Whether a condemned list this writer can see names ``d``."""
        return d in self._condemned

    def any_condemned(self) -> bool:
        """Whether any condemned list this writer can see names an object."""
        return bool(self._condemned)

    def condemned_lists(self) -> frozenset[str]:
        """The names of the condemned lists in this writer's view (it changes when gc publishes or sweeps one)."""
        return frozenset(self._lists)

    def reliance(self, d: bytes) -> float:
        """When this writer last checked ``d`` stored and not condemned (monotonic; -inf if never)."""
        p = self._pending.get(d)
        if p is not None:
            return p[3]
        return self._known.get(d, -_INF)

    def copy(self, d: Digest, vt: float | None = None) -> None:
        """Queue a new copy of stored blob ``d`` for the next pack (checked before it is copied)."""
        _writing().copy(self, d, vt)

    def check_stored(self, d: Digest, vt: float) -> bool:
        """Check (under view ``vt``) that ``d`` is stored and not condemned; copy it if condemned.

        False if it is not stored at all.
        """
        return _writing().check_stored(self, d, vt)  # type: ignore[no-any-return]

    def _decode(self, data: Raw | npt.NDArray[np.uint8], key: str, d: Digest, out: Out | None = None) -> bytes | memoryview:
        try:
            return decode_frame(data, key, expect=d, out=out)[1]
        except DamagedObjectError:
            self.found_damaged(d)
            raise

    def _found_cut(self, d: Digest, pack: str) -> None:
        """A pack cut short: ``d`` and whatever else it held past the cut are stored again when put (a recomputed
        value's chunks as well as its manifest), not taken as stored."""
        self.found_damaged(d)
        self._cut_packs.add(pack)

    def found_damaged(self, d: Digest) -> None:
        """Blob ``d`` was read damaged: no longer relied on as stored, and the next put of it rewrites it."""
        self._suspect.add(d)
        self._known.pop(d, None)

    def wait_writes(self, keep: int = 0) -> None:
        """Wait for background loose writes (all but ``keep`` of them); raise the first error."""
        if len(self._inflight) > keep:
            _writing().wait_writes(self, keep)

    def adopt(self, d: Digest, frame: bytes, kind: int, size: int) -> None:
        """Queue an already framed blob for the next pack (gc's repacking, repair)."""
        with self._lock:
            self._pending[bytes(d)] = (frame, kind, size, self._view_at)
            self._pending_bytes += len(frame)

    def _remember(self, d: bytes, vt: float) -> None:
        if len(self._known) > 500_000:
            self._known.clear()  # all at once: a value's chunks are never forgotten while it is remembered
        # Plain bytes (equal to the Digest, same hash): instances of a Python class are tracked by
        # the garbage collector, and every full collection would walk hundreds of thousands of them.
        self._known[bytes(d)] = vt

    @property
    def pending_bytes(self) -> int:
        """Bytes of small blobs waiting for the next pack."""
        return self._pending_bytes

    def stale_waiting_values(self, max_age: float) -> list[Digest]:
        """Value manifests waiting for a pack that this writer last checked more than ``max_age`` seconds ago."""
        now = time.monotonic()
        # Under the lock that puts take: a garbage collection inside the copy runs Python code (gc
        # callbacks, finalizers), where another thread's put would change the dict under the copy.
        with self._lock:
            pending = list(self._pending.items())
        return [Digest.from_raw(d) for d, p in pending if p[1] == KIND_VALUE and now - p[3] > max_age]

    def renew_waiting(self, d: Digest, vt: float) -> bool:
        """A waiting blob was checked again under view ``vt`` (its chunks are still stored); False if it no longer waits."""
        with self._lock:
            p = self._pending.get(d)
            if p is None:
                return False
            self._pending[d] = (*p[:3], vt)
            return True

    def drop_waiting(self, d: Digest) -> bool:
        """Never write waiting blob ``d`` (a manifest whose chunk gc removed); False if it no longer waits."""
        with self._lock:
            p = self._pending.pop(d, None)
            if p is None:
                return False
            self._pending_bytes -= len(p[0])
            return True

    def flush(self) -> str | None:
        """Write waiting small blobs as one pack, then their index entries."""
        with self._lock:
            if not self._pending:
                self.index.flush()  # index entries of an earlier pack whose index write failed
                return None
            pending, self._pending = self._pending, {}
            self._pending_bytes = 0
            # Still readable while the pack is written and indexed: a get() in another thread would
            # otherwise find it nowhere (a cache hit beside a flush would call it missing and recompute).
            self._flushing = pending
        return _writing().write_pack(self, pending)  # type: ignore[no-any-return]

    # -- reading ---------------------------------------------------------------
    def locate(self, d: Digest, refresh: bool = True) -> Location | None:
        vals = self.index.lookup(d, refresh_on_miss=refresh)
        return Location.decode(vals[-1]) if vals else None

    def locations(self, d: Digest, refresh: bool = True) -> list[Location]:
        """Every indexed location of ``d``, newest first (an entry may outlive a pack gc removed)."""
        return [Location.decode(v) for v in reversed(self.index.lookup(d, refresh_on_miss=refresh))]

    def _read_any(self, d: Digest, locs: list[Location], out: Out | None = None) -> bytes | memoryview:
        """Read ``d`` from the first of ``locs`` whose pack exists; read the index again once if none does."""
        for attempt in range(2):
            for loc in locs:
                try:
                    return self._read_packed(d, loc, out)
                except MissingObjectError:
                    continue  # gc repacked it: another entry (or a fresh index) has it
            if attempt == 0:
                self.index.refresh()
                fresh = self.locations(d, refresh=False)
                if not fresh or fresh == locs:
                    break
                locs = fresh
        raise MissingObjectError(f"object {d.hex()}: none of the packs the index names for it exists "
                                 f"({', '.join(sorted({loc.pack for loc in locs}))})")

    def _waiting(self, d: Digest) -> Waiting | None:
        """``(frame, kind, size, view)`` of ``d`` if it waits for a pack, or is in the one a flush is writing."""
        return self._pending.get(d) or self._flushing.get(d)

    def contains(self, d: Digest) -> bool:
        if self._waiting(d) is not None or (d in self._known and d not in self._condemned):
            return True
        if self.index.lookup(d):
            return True
        return self.backend.exists(loose_key(d))

    def get(self, d: Digest, out: Out | None = None, loose_hint: bool | None = None) -> bytes | memoryview | Out:
        """The raw bytes of blob ``d`` (into ``out`` if given), checked against ``d``."""
        cached = self._raw.get(d)
        if cached is not None:
            if out is not None:
                _bytes_of(out)[:] = cached
                return out
            return cached
        p = self._waiting(d)
        if p is not None:
            raw = decode_frame(p[0], f"pending {d.hex()}", expect=d, out=out)[1]
            if out is None and len(raw) <= 1 << 16:
                raw = bytes(raw)
                self._raw.put(d, raw)
            return raw
        order = (True, False) if loose_hint else (False, True)
        for loose in order:
            if loose:
                key = loose_key(d)
                data = self.backend.get(key)
                if data is not None:
                    return self._decode(data, key, d, out)
            else:
                locs = self.locations(d, refresh=not loose_hint)
                if locs:
                    raw = self._read_any(d, locs, out)
                    if out is None and len(raw) <= 1 << 16:
                        raw = bytes(raw)
                        self._raw.put(d, raw)
                    return raw
        # The index may be older than what named ``d`` (a record another process flushed after this
        # index was read; a miss reads the index again at most once a second): read it again before
        # calling ``d`` missing (another process's cache hit would otherwise recompute).
        self.index.refresh()
        locs = self.locations(d, refresh=False)
        if locs:
            return self._read_any(d, locs, out)
        raise MissingObjectError(f"object {d.hex()} is not in the store")

    def stored_payload(self, d: Digest, scratch: Out | None = None) -> tuple[int, bytes | memoryview] | None:
        """Loose blob ``d``'s payload as it is stored, with the id of the codec it is stored with, checked against
        ``d`` (a compressed one decoded into ``scratch``, of its raw length, to check it): what an export copies
        without compressing it again. None where ``d`` is no loose object (packed, or missing)."""
        return _chunk_io().stored_payload(self, d, scratch)  # type: ignore[no-any-return]

    def get_into_many(self, jobs: list[tuple[Digest, npt.NDArray[np.uint8]]], window: int = 8) -> None:
        """Read many large blobs into their buffers, on the chunk pool.

        From a local folder each loose object is read straight into its buffer
        (a raw payload is never copied again) and checked there; from other
        stores ``window`` objects are fetched at a time and decoded on the pool.
        """
        _chunk_io().get_into_many(self, jobs, window)

    def _read_packed(self, d: Digest, loc: Location, out: Out | None = None) -> bytes | memoryview:
        key = pack_key(loc.pack)
        where = f"{key}@{loc.offset} (object {d.hex()})"
        pack = self._packs.get(loc.pack)
        if pack is None and self._pack_reads.get(loc.pack, 0) < 2:
            # A pack not read from yet: read this object's frame alone (a cache hit is one small
            # read, not a whole pack); a pack read from again is read whole and kept.
            if len(self._pack_reads) > 100_000:
                self._pack_reads.clear()
            self._pack_reads[loc.pack] = self._pack_reads.get(loc.pack, 0) + 1
            data = self.backend.get_range(key, loc.offset, loc.offset + loc.length)
            if data is None:
                raise MissingObjectError(f"pack {loc.pack} holding object {d.hex()} is missing")
            if len(data) != loc.length:
                self._found_cut(d, loc.pack)
                raise DamagedObjectError(where, f"pack is truncated ({loc.offset + len(data)} bytes)")
            return self._decode(data, where, d, out)
        if pack is None:
            data = self.backend.get(key)
            if data is None:
                raise MissingObjectError(f"pack {loc.pack} holding object {d.hex()} is missing")
            pack = data.tobytes()
            self._packs.put(loc.pack, pack)
        frame = memoryview(pack)[loc.offset : loc.offset + loc.length]
        if len(frame) != loc.length:
            self._found_cut(d, loc.pack)
            raise DamagedObjectError(where, f"pack is truncated ({len(pack)} bytes)")
        return self._decode(frame, where, d, out)

    def loose_header(self, d: Digest) -> Frame | None:
        """The frame header of loose object ``d`` (one small read), or None if it is not stored loose."""
        data = self.backend.get_range(loose_key(d), 0, FRAME_HEADER)
        return None if data is None else read_header(data, loose_key(d))

    def peek_raw(self, d: Digest, limit: int) -> bytes | None:
        """The raw bytes of blob ``d`` if they are in memory (put by this writer, or read) and at
        most ``limit`` long; never any I/O (a cache entry copies a small result's manifest)."""
        raw = self._raw.get(d)
        if raw is None:
            raw = self._put_raw.get(d)
        if raw is None:
            p = self._waiting(d)
            if p is None or p[2] > limit:
                return None
            try:
                raw = bytes(decode_frame(p[0], f"pending {d.hex()}", expect=d)[1])
            except DamagedObjectError:
                return None
        return raw if len(raw) <= limit else None

    def prime(self, d: Digest, raw: bytes) -> bool:
        """Remember ``raw`` as blob ``d``'s bytes if it hashes to ``d`` (a copy kept in a record)."""
        if _hash(raw) != d:
            return False
        self._raw.put(d, raw)
        return True

    def clear_caches(self) -> None:
        self._packs.clear()
        self._raw.clear()
        self._put_raw.clear()
        self._known.clear()
        self._view_at = -_INF
