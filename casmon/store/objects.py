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

import io
import os
import _thread  # threading's locks, without loading threading on a hit
import time
from collections import OrderedDict
from collections.abc import Callable
TYPE_CHECKING = False  # typing's flag without importing typing (~2 ms of a first hit)
if TYPE_CHECKING:
    import struct


else:  # struct.py re-exports _struct: the same names, one module less on a hit
    import _struct as struct
if TYPE_CHECKING:
    from typing import Any, TypeVar

import xxhash

from casmon.store import condemned
from casmon.store.backend import Backend
from casmon.store.backend.base import fault_points
from casmon.store.codec import (FRAME_HEADER, KIND_CHUNK, KIND_VALUE, Codec, Frame, decode_body, decode_frame, encode_frame,
                               encode_frame_parts, is_ndarray, read_header)
from casmon.keys.digest import Digest
from casmon.errors import DamagedObjectError, MissingObjectError
from casmon.plain import Frozen
from casmon.store.table import Table

if TYPE_CHECKING:
    from concurrent.futures import Future, ThreadPoolExecutor

    import numpy as np
    import numpy.typing as npt
    from typing_extensions import TypeAlias

    #: A blob's raw bytes as a caller hands them in.
    Raw: TypeAlias = bytes | bytearray | memoryview
    #: A buffer a read fills in place (a slice of a value's buffer).
    Out: TypeAlias = npt.NDArray[np.uint8] | bytearray | memoryview
    #: A blob waiting for a pack: (frame, kind, logical size, the view it was checked under).
    Waiting: TypeAlias = tuple[bytes, int, int, float]

if TYPE_CHECKING:
    _T = TypeVar("_T")
    _R = TypeVar("_R")

__all__ = ["ObjectStore", "Location", "loose_key", "pack_key", "LOOSE_MIN"]

#: Blobs with at least this many raw bytes are stored loose, one file each.
LOOSE_MIN = 256 << 10
#: A flush is forced once this many bytes of small blobs are waiting.
PACK_MAX = 8 << 20
_INF = float("inf")  # math.inf, without loading math
_LOC = struct.Struct("<16sQIBQ")
#: Large chunks in flight (hashed, compressed or written by the chunk pool) per ``put``.
INFLIGHT_MAX = 16


_pool_lock = _thread.allocate_lock()
_pool_state: tuple[int, ThreadPoolExecutor] | None = None  # (pid, pool)


def chunk_pool() -> ThreadPoolExecutor | None:
    """The thread pool that hashes, compresses, writes and reads large chunks, or None.

    xxhash, blosc and zstd release the GIL, as do file reads and writes, so the
    pool's threads use every core on one value. One pool per process, started
    on first use (a forked child starts its own); None while the interpreter
    exits (Python 3.12 refuses new threads then), and callers do the work in
    their own thread.
    """
    global _pool_state
    st = _pool_state
    if st is not None and st[0] == os.getpid():
        return st[1]
    with _pool_lock:
        st = _pool_state
        if st is not None and st[0] == os.getpid():
            return st[1]
        from concurrent.futures import ThreadPoolExecutor  # loaded by the first large value, not by a hit

        try:
            pool = ThreadPoolExecutor(max_workers=max(2, min(8, os.cpu_count() or 2)), thread_name_prefix="casmon-chunk")
            pool.submit(int).result()  # start a thread now: fails here, not later, if threads cannot start
        except RuntimeError:
            return None
        _pool_state = (os.getpid(), pool)
        return pool


def _map(fn: Callable[[_T], _R], items: list[_T]) -> list[_R | None]:
    """``[fn(x) for x in items]`` on the chunk pool (in order; the first error is raised after all ended).

    Before the pool has started (a script's first hit) the items are spread over a few plain threads
    instead: starting the pool imports ``concurrent.futures`` and ``logging``, which cost a fresh
    process more than reading a 32 MB value does.
    """
    if len(items) <= 1:
        return [fn(x) for x in items]
    st = _pool_state
    if st is None or st[0] != os.getpid():
        return _spread(fn, items)
    pool = chunk_pool()
    if pool is None:
        return [fn(x) for x in items]
    try:
        futs = [pool.submit(fn, x) for x in items]
    except RuntimeError:  # the interpreter began to exit meanwhile
        return [fn(x) for x in items]
    out: list[_R | None] = []
    error: BaseException | None = None
    for f in futs:
        try:
            out.append(f.result())
        except BaseException as e:  # noqa: BLE001 - wait for every job, then raise the first error
            error = error or e
            out.append(None)
    if error is not None:
        raise error
    return out


def _spread(fn: Callable[[_T], _R], items: list[_T]) -> list[_R | None]:
    """``[fn(x) for x in items]`` on short-lived threads, the caller's among them; in order, and the first
    error (in item order) is raised once every item has ended."""
    out: list[_R | None] = [None] * len(items)
    errors: list[BaseException | None] = [None] * len(items)
    todo = iter(range(len(items)))  # next() on a range iterator is atomic under the GIL
    lock = _thread.allocate_lock()

    def drain() -> None:
        while True:
            with lock:
                i = next(todo, None)
            if i is None:
                return
            try:
                out[i] = fn(items[i])
            except BaseException as e:  # noqa: BLE001 - every item runs; the first error is raised below
                errors[i] = e

    import threading  # a thread's: a hit starts none

    threads: list[threading.Thread] = []
    for _ in range(min(len(items), max(2, min(8, os.cpu_count() or 2))) - 1):
        t = threading.Thread(target=drain, name="casmon-read", daemon=True)
        try:
            t.start()
        except RuntimeError:  # no new threads while the interpreter exits: the caller does the rest
            break
        threads.append(t)
    drain()
    for t in threads:
        t.join()
    for e in errors:
        if e is not None:
            raise e
    return out


def _readinto(f: io.RawIOBase, mv: memoryview) -> int:
    """Fill ``mv`` from file ``f`` (unbuffered reads may return less than asked); the bytes read."""
    got = 0
    while got < mv.nbytes:
        n = f.readinto(mv[got:])
        if not n:
            break
        got += n
    return got


#: Raw chunks are read and hashed in pieces this large, so the hash reads what was just copied
#: while it is still in the CPU's cache instead of reading the whole chunk from memory again.
_PIECE = 1 << 20


def _readinto_hashed(f: io.RawIOBase, mv: memoryview) -> tuple[int, bytes]:
    """Fill ``mv`` from file ``f`` piece by piece, hashing each piece as it lands: (bytes read, xxh3-128)."""
    h = xxhash.xxh3_128()
    got = 0
    while got < mv.nbytes:
        piece = mv[got : got + _PIECE]
        n = _readinto(f, piece)
        if n:
            h.update(piece[:n])
        got += n
        if n < piece.nbytes:
            break
    return got, h.digest()


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
        return _LOC.pack(bytes.fromhex(self.pack), self.offset, self.length, self.kind, self.size)

    @classmethod
    def decode(cls, b: bytes) -> Location:
        try:
            p, off, ln, kind, size = _LOC.unpack(b)
        except struct.error:
            raise DamagedObjectError("index", f"an index entry is {len(b)} bytes, not {_LOC.size}") from None
        return cls(p.hex(), off, ln, kind, size)


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
        d = digest if digest is not None else _hash(raw)
        if d in self._pending:
            return d
        vt = self.view()
        n = len(raw) if not isinstance(raw, memoryview) else raw.nbytes
        size = n if size is None else size
        if d in self._suspect:
            return self._rewrite(d, raw, kind, codec, typesize, size, vt)
        if d in self._condemned:
            self.revived += 1
            _, frame = encode_frame(raw, kind, codec, typesize, digest=d)
            self._queue(d, frame, kind, size, vt)
            return d
        if d in self._known:
            self._known[d] = vt
            return d
        if n >= LOOSE_MIN:
            # Check, compress and write on the chunk pool while the caller goes on with the next
            # chunk; wait_writes() is called before anything can point at this object.
            fut = self._submit(self._write_loose, d, raw, kind, codec, typesize)
            with self._inflight_lock:
                self._inflight.append((d, fut, vt))
                full = len(self._inflight) >= INFLIGHT_MAX
            if full:
                self.wait_writes(keep=INFLIGHT_MAX // 2)
            return d
        found = self.index.lookup_cached(d)
        if found and not (self._cut_packs and all(Location.decode(v).pack in self._cut_packs for v in found)):
            self._remember(d, vt)
            return d
        _, frame = encode_frame(raw, kind, codec, typesize, digest=d)
        self._queue(d, frame, kind, size, vt)
        if n <= RAW_KEEP:  # a small result's bytes, for peek_raw (a cache entry copies them)
            self._put_raw.put(d, bytes(raw))
        return d

    def put_chunks(self, data: memoryview, cb: int, kind: int, codec: Codec, typesize: int = 1) -> list[Digest]:
        """:meth:`put` each ``cb``-byte piece of ``data``; the pieces are hashed on the chunk pool first."""
        views = [data[o : o + cb] for o in range(0, data.nbytes, cb)]
        if len(views) <= 1 or cb < LOOSE_MIN:
            return [self.put(v, kind, codec, typesize) for v in views]
        vt = self.view()
        # Each chunk is hashed and, when new, compressed and written by one job on the pool, while its bytes
        # are still in the CPU's cache: no pass over the whole value for its digests before the writes begin.
        # On the pool's threads, never the caller's: blosc compresses differently on the main thread (its
        # global context), and a chunk's stored bytes do not depend on which thread wrote it.
        chunk_pool()
        done = _map(lambda v: self._hash_and_write(v, kind, codec, typesize), views)
        out = []
        for v, r in zip(views, done):
            assert r is not None  # _map raised if a job failed
            d, written = r
            if written:
                self._remember(d, vt)
            else:  # stored, waiting, condemned or damaged: put decides, with the digest already known
                self.put(v, kind, codec, typesize, digest=d)
            out.append(d)
        return out

    def _hash_and_write(self, raw: memoryview, kind: int, codec: Codec, typesize: int) -> tuple[Digest, bool]:
        """A large chunk's digest, and whether this job wrote it as a new loose object (any thread); one not
        written is left to :meth:`put`: known stored, waiting for a pack, condemned or found damaged."""
        d = _hash(raw)
        if raw.nbytes < LOOSE_MIN or d in self._pending or d in self._suspect or d in self._condemned or d in self._known:
            return d, False  # a short last chunk goes to a pack
        self._write_loose(d, raw, kind, codec, typesize)
        return d, True

    @staticmethod
    def _submit(fn: Callable[..., _R], *args: Any) -> Future[_R]:
        pool = chunk_pool()
        if pool is not None:
            try:
                return pool.submit(fn, *args)
            except RuntimeError:  # the interpreter began to exit meanwhile
                pass
        from concurrent.futures import Future

        fut: Future[_R] = Future()
        try:
            fut.set_result(fn(*args))
        except BaseException as e:  # noqa: BLE001 - raised by wait_writes, like a pool job's
            fut.set_exception(e)
        return fut

    def _write_loose(self, d: Digest, raw: Raw, kind: int, codec: Codec, typesize: int) -> None:
        """Write a large blob as a loose object unless it is there (create-if-absent); any thread."""
        key = loose_key(d)
        path = self.backend.local_path(key)
        if path.exists() if path is not None else self.backend.exists(key):
            return
        _, header, payload = encode_frame_parts(raw, kind, codec, typesize, digest=d)
        self.backend.create_frame(key, header, payload)

    def _queue(self, d: Digest, frame: bytes, kind: int, size: int, vt: float) -> None:
        with self._lock:
            if d not in self._pending:
                # Keyed by plain bytes (equal to the Digest): thousands wait for a pack, and the garbage
                # collector would walk every Digest (an instance of a Python class) at each full collection.
                self._pending[bytes(d)] = (frame, kind, size, vt)
                self._pending_bytes += len(frame)

    def _rewrite(self, d: Digest, raw: Raw, kind: int, codec: Codec, typesize: int, size: int, vt: float) -> Digest:
        """Store a good copy of a blob that was found damaged (self-healing on recompute)."""
        _, frame = encode_frame(raw, kind, codec, typesize, digest=d)
        if (len(raw) if not isinstance(raw, memoryview) else raw.nbytes) >= LOOSE_MIN and d not in self._condemned:
            self.backend.set(loose_key(d), frame)  # overwrite the damaged file in place (atomic rename)
            self._remember(d, vt)
        else:
            self._queue(d, frame, kind, size, vt)  # a new pack entry; the newest index entry wins
        self._suspect.discard(d)
        self._raw.d.pop(d, None)
        self._put_raw.d.pop(d, None)
        return d

    # -- the condemned-list view ---------------------------------------------------
    def view(self) -> float:
        """The time of a view of the condemned lists no older than ``VIEW_MAX`` (listing again if needed)."""
        if time.monotonic() - self._view_at < condemned.VIEW_MAX:
            return self._view_at
        return self.refresh_view()

    def refresh_view(self) -> float:
        """List ``gc/condemned/`` now; return the time of this view.

        A list that vanished was swept by gc, and a writer that has not looked for
        ``GAP_MAX`` may have missed one: either way this writer forgets what it
        believed stored and reads the index again.
        """
        with self._view_lock:
            t = time.monotonic()
            names = {k.rsplit("/", 1)[-1] for k in self.backend.list(condemned.PREFIX) if ".partial" not in k}
            gone = [n for n in self._lists if n not in names]
            new = [n for n in names if n not in self._lists]
            forget = bool(gone) or (t - self._view_at > condemned.GAP_MAX and self._view_at > -_INF)
            for n in gone:
                del self._lists[n]
            if new:
                for n, data in zip(new, self.backend.get_many([condemned.PREFIX + n for n in new])):
                    if data is None:
                        continue  # swept meanwhile
                    try:
                        lst = condemned.decode(n, data)
                    except DamagedObjectError:
                        continue  # gc cannot sweep a list it cannot read: nothing of it will be deleted
                    self._lists[n] = lst.digests
            if gone or new:
                self._condemned = {d for ds in self._lists.values() for d in ds}
            if forget:
                self._known.clear()
                self._raw.clear()
                self._put_raw.clear()
                self.index.refresh()
            self._view_at = t
            return t

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
        if d in self._pending:
            return
        vt = self.view() if vt is None else vt
        key = loose_key(d)
        data = self.backend.get(key)
        if data is not None:
            frame = bytes(data)
            h = decode_frame(frame, key, expect=d)[0]
            self._queue(d, frame, h.kind, h.raw_len, vt)
            self.revived += 1
            return
        for loc in self.locations(d):
            pk = pack_key(loc.pack)
            data = self.backend.get_range(pk, loc.offset, loc.offset + loc.length)
            if data is None:
                continue
            frame = bytes(data)
            self._decode(frame, f"{pk}@{loc.offset} (object {d.hex()})", d)
            self._queue(d, frame, loc.kind, loc.size, vt)
            self.revived += 1
            return
        raise MissingObjectError(f"object {d.hex()} is not in the store")

    def check_stored(self, d: Digest, vt: float) -> bool:
        """Check (under view ``vt``) that ``d`` is stored and not condemned; copy it if condemned.

        False if it is not stored at all.
        """
        if d in self._pending:
            return True
        if d in self._condemned:
            self.copy(d, vt)
            return True
        if d in self._known:
            # Still believed stored: every belief is dropped when a swept list vanishes or the
            # writer stopped looking for GAP_MAX, and only a swept list's objects are ever deleted.
            self._known[d] = vt
            return True
        if self.locate(d) is not None or self.backend.exists(loose_key(d)):
            self._remember(d, vt)
            return True
        return False

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
        # Writes stay on the list until they are done: another thread's put waiting at the same time
        # must wait for them too, not find the list empty and return before its chunks are written
        # (its caller could then change the array while the pool still writes it).
        with self._inflight_lock:
            if len(self._inflight) <= keep:
                return
            waiting = self._inflight[: len(self._inflight) - keep]
        error = None
        for d, fut, vt in waiting:
            try:
                fut.result()
                self._remember(d, vt)
            except BaseException as e:  # noqa: BLE001 - wait for all, then raise
                error = error or e
        with self._inflight_lock:
            done = {id(w) for w in waiting}
            self._inflight = [w for w in self._inflight if id(w) not in done]
        if error is not None:
            raise error

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
        faultpoints = fault_points()

        with self._lock:
            if not self._pending:
                self.index.flush()  # index entries of an earlier pack whose index write failed
                return None
            pending, self._pending = self._pending, {}
            self._pending_bytes = 0
            # Still readable while the pack is written and indexed: a get() in another thread would
            # otherwise find it nowhere (a cache hit beside a flush would call it missing and recompute).
            self._flushing = pending
        try:
            frames = []
            entries = []
            off = 0
            for d, (frame, kind, size, _vt) in pending.items():
                frames.append(frame)
                entries.append((d, off, len(frame), kind, size))
                off += len(frame)
            data = b"".join(frames)
            # A fresh random name, never the digest of the bytes: a new copy of a condemned object must
            # land at a location no condemned list names, even when the pack's bytes are the same.
            name = os.urandom(16).hex()
            self.backend.create(pack_key(name), data)
        except BaseException:
            self._keep_waiting(pending)  # nothing half-written is indexed
            raise
        self._packs.put(name, data)
        try:
            faultpoints.point("flush.after_pack")
            for d, o, ln, k, s in entries:
                self.index.add(d, Location(name, o, ln, k, s).encode())
        except BaseException:  # Ctrl-C between the pack and its index: the pack alone finds nothing
            self._keep_waiting(pending)
            raise
        with self._lock:  # indexed (the index's waiting entries are searched): found through it now
            self._flushing = {}
        # The pack is written; its index entries are this table's to write, and to retry if this fails.
        self.index.flush()
        for d, v in pending.items():
            self._remember(d, v[3])  # relied on since it was put, not since it was written
        return name

    def _keep_waiting(self, pending: dict[bytes, Waiting]) -> None:
        """A failed pack's objects wait again, for the next flush's pack (a copy already indexed is harmless)."""
        with self._lock:
            for d, v in pending.items():
                if d not in self._pending:
                    self._pending[d] = v
                    self._pending_bytes += len(v[0])
            self._flushing = {}

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
        key = loose_key(d)
        data = self.backend.get(key)
        if data is None:
            return None
        try:
            codec = read_header(data, key).codec
        except DamagedObjectError:
            self.found_damaged(d)
            raise
        self._decode(data, key, d, None if codec == 0 else scratch)
        return codec, _bytes_of(data)[FRAME_HEADER:]

    def get_into_many(self, jobs: list[tuple[Digest, npt.NDArray[np.uint8]]], window: int = 8) -> None:
        """Read many large blobs into their buffers, on the chunk pool.

        From a local folder each loose object is read straight into its buffer
        (a raw payload is never copied again) and checked there; from other
        stores ``window`` objects are fetched at a time and decoded on the pool.
        """
        if not jobs:
            return
        if self.backend.local_root is not None:
            missing = [j for j, ok in zip(jobs, _map(self._read_local_into, jobs)) if not ok]
        else:
            missing = []
            for i in range(0, len(jobs), window):
                batch = jobs[i : i + window]
                keys = [loose_key(d) for d, _ in batch]
                got = [(d, out, key, data) for (d, out), key, data in zip(batch, keys, self.backend.get_many(keys))]
                missing += [(d, out) for d, out, _, data in got if data is None]
                found = [(d, out, key, data) for d, out, key, data in got if data is not None]
                _map(lambda g: self._decode(g[3], g[2], g[0], g[1]), found)
        for d, out in missing:
            self.get(d, out=out, loose_hint=False)  # not loose after all: packed, or missing

    def _read_local_into(self, job: tuple[Digest, npt.NDArray[np.uint8]]) -> bool:
        """Read loose object ``d`` from a local folder into ``out`` and check it; False if there is no such file."""
        d, out = job
        key = loose_key(d)
        path = self.backend.local_path(key)
        if path is None:  # not a local folder after all: read it the ordinary way
            return False
        try:
            f = open(path, "rb", buffering=0)
        except FileNotFoundError:
            return False
        self.backend.requests += 1
        try:
            with f:
                head = f.read(FRAME_HEADER)
                try:
                    frame = read_header(head, key)
                    if frame.digest != d:
                        raise DamagedObjectError(key, f"header names digest {frame.digest.hex()}, expected {d.hex()}")
                    size = os.fstat(f.fileno()).st_size
                    if size != FRAME_HEADER + frame.stored_len:
                        raise DamagedObjectError(key, f"payload is {size - FRAME_HEADER} bytes, header says "
                                                      f"{frame.stored_len} (truncated or extended)")
                    mv = _bytes_of(out)
                    if frame.codec == 0 and frame.raw_len == mv.nbytes == frame.stored_len:
                        got, digest = _readinto_hashed(f, mv)
                        if got != mv.nbytes:
                            raise DamagedObjectError(key, f"payload is {got} bytes, header says {frame.stored_len} (truncated)")
                        if digest != frame.digest:
                            raise DamagedObjectError(key, "content does not match its digest")
                    else:
                        decode_body(frame, f.read(), key, out)
                except DamagedObjectError:
                    self.found_damaged(d)
                    raise
        except FileNotFoundError:
            return False
        return True

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
