"""Writing blobs: deduplicating against what is stored, loose writes on the chunk pool, packs, and the
condemned-list view a writer keeps (:class:`~casmon.store.objects.ObjectStore`'s writing half).

Loaded by the first write (a hit process's exit flush with nothing waiting loads none): each function
takes the :class:`~casmon.store.objects.ObjectStore` it works for, whose methods call it.
"""

from __future__ import annotations

import os
import time
TYPE_CHECKING = False  # typing's flag without importing typing (~2 ms of a first hit)
if TYPE_CHECKING:
    from collections.abc import Callable
    from concurrent.futures import Future
    from typing import Any, TypeVar

    from casmon.store.objects import ObjectStore, Raw, Waiting

    _R = TypeVar("_R")

from casmon.errors import DamagedObjectError, MissingObjectError
from casmon.keys.digest import Digest
from casmon.store import chunkio, condemned, objects
from casmon.store.backend.base import fault_points
from casmon.store.codec import Codec, decode_frame, encode_frame, encode_frame_parts
from casmon.store.objects import _INF, LOOSE_MIN, RAW_KEEP, Location, loose_key, pack_key

__all__ = ["put", "put_chunks", "refresh_view", "copy", "check_stored", "wait_writes", "write_pack"]

#: Large chunks in flight (hashed, compressed or written by the chunk pool) per ``put``.
INFLIGHT_MAX = 16


def put(self: ObjectStore, raw: Raw, kind: int, codec: Codec, typesize: int = 1, size: int | None = None,
        digest: Digest | None = None) -> Digest:
    """:meth:`ObjectStore.put <casmon.store.objects.ObjectStore.put>`."""
    d = digest if digest is not None else objects._hash(raw)
    if d in self._pending:
        return d
    vt = self.view()
    n = len(raw) if not isinstance(raw, memoryview) else raw.nbytes
    size = n if size is None else size
    if d in self._suspect:
        return _rewrite(self, d, raw, kind, codec, typesize, size, vt)
    if d in self._condemned:
        self.revived += 1
        _, frame = encode_frame(raw, kind, codec, typesize, digest=d)
        _queue(self, d, frame, kind, size, vt)
        return d
    if d in self._known:
        self._known[d] = vt
        return d
    if n >= LOOSE_MIN:
        # Check, compress and write on the chunk pool while the caller goes on with the next
        # chunk; wait_writes() is called before anything can point at this object.
        fut = _submit(self._write_loose, d, raw, kind, codec, typesize)
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
    _queue(self, d, frame, kind, size, vt)
    if n <= RAW_KEEP:  # a small result's bytes, for peek_raw (a cache entry copies them)
        self._put_raw.put(d, bytes(raw))
    return d


def put_chunks(self: ObjectStore, data: memoryview, cb: int, kind: int, codec: Codec, typesize: int = 1) -> list[Digest]:
    """:meth:`ObjectStore.put_chunks <casmon.store.objects.ObjectStore.put_chunks>`."""
    views = [data[o : o + cb] for o in range(0, data.nbytes, cb)]
    if len(views) <= 1 or cb < LOOSE_MIN:
        return [self.put(v, kind, codec, typesize) for v in views]
    vt = self.view()
    # Each chunk is hashed and, when new, compressed and written by one job on the pool, while its bytes
    # are still in the CPU's cache: no pass over the whole value for its digests before the writes begin.
    # On the pool's threads, never the caller's: blosc compresses differently on the main thread (its
    # global context), and a chunk's stored bytes do not depend on which thread wrote it.
    chunkio.chunk_pool()
    done = chunkio.map_chunks(lambda v: _hash_and_write(self, v, kind, codec, typesize), views)
    out = []
    for v, r in zip(views, done):
        assert r is not None  # map_chunks raised if a job failed
        d, written = r
        if written:
            self._remember(d, vt)
        else:  # stored, waiting, condemned or damaged: put decides, with the digest already known
            self.put(v, kind, codec, typesize, digest=d)
        out.append(d)
    return out


def _hash_and_write(self: ObjectStore, raw: memoryview, kind: int, codec: Codec, typesize: int) -> tuple[Digest, bool]:
    """A large chunk's digest, and whether this job wrote it as a new loose object (any thread); one not
    written is left to :func:`put`: known stored, waiting for a pack, condemned or found damaged."""
    d = objects._hash(raw)
    if raw.nbytes < LOOSE_MIN or d in self._pending or d in self._suspect or d in self._condemned or d in self._known:
        return d, False  # a short last chunk goes to a pack
    self._write_loose(d, raw, kind, codec, typesize)
    return d, True


def _submit(fn: Callable[..., _R], *args: Any) -> Future[_R]:
    pool = chunkio.chunk_pool()
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


def write_loose(self: ObjectStore, d: Digest, raw: Raw, kind: int, codec: Codec, typesize: int) -> None:
    """Write a large blob as a loose object unless it is there (create-if-absent); any thread."""
    key = loose_key(d)
    path = self.backend.local_path(key)
    if path.exists() if path is not None else self.backend.exists(key):
        return
    _, header, payload = encode_frame_parts(raw, kind, codec, typesize, digest=d)
    self.backend.create_frame(key, header, payload)


def _queue(self: ObjectStore, d: Digest, frame: bytes, kind: int, size: int, vt: float) -> None:
    with self._lock:
        if d not in self._pending:
            # Keyed by plain bytes (equal to the Digest): thousands wait for a pack, and the garbage
            # collector would walk every Digest (an instance of a Python class) at each full collection.
            self._pending[bytes(d)] = (frame, kind, size, vt)
            self._pending_bytes += len(frame)


def _rewrite(self: ObjectStore, d: Digest, raw: Raw, kind: int, codec: Codec, typesize: int, size: int,
             vt: float) -> Digest:
    """Store a good copy of a blob that was found damaged (self-healing on recompute)."""
    _, frame = encode_frame(raw, kind, codec, typesize, digest=d)
    if (len(raw) if not isinstance(raw, memoryview) else raw.nbytes) >= LOOSE_MIN and d not in self._condemned:
        self.backend.set(loose_key(d), frame)  # overwrite the damaged file in place (atomic rename)
        self._remember(d, vt)
    else:
        _queue(self, d, frame, kind, size, vt)  # a new pack entry; the newest index entry wins
    self._suspect.discard(d)
    self._raw.d.pop(d, None)
    self._put_raw.d.pop(d, None)
    return d


def refresh_view(self: ObjectStore) -> float:
    """:meth:`ObjectStore.refresh_view <casmon.store.objects.ObjectStore.refresh_view>`."""
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


def copy(self: ObjectStore, d: Digest, vt: float | None = None) -> None:
    """:meth:`ObjectStore.copy <casmon.store.objects.ObjectStore.copy>`."""
    if d in self._pending:
        return
    vt = self.view() if vt is None else vt
    key = loose_key(d)
    data = self.backend.get(key)
    if data is not None:
        frame = bytes(data)
        h = decode_frame(frame, key, expect=d)[0]
        _queue(self, d, frame, h.kind, h.raw_len, vt)
        self.revived += 1
        return
    for loc in self.locations(d):
        pk = pack_key(loc.pack)
        data = self.backend.get_range(pk, loc.offset, loc.offset + loc.length)
        if data is None:
            continue
        frame = bytes(data)
        self._decode(frame, f"{pk}@{loc.offset} (object {d.hex()})", d)
        _queue(self, d, frame, loc.kind, loc.size, vt)
        self.revived += 1
        return
    raise MissingObjectError(f"object {d.hex()} is not in the store")


def check_stored(self: ObjectStore, d: Digest, vt: float) -> bool:
    """:meth:`ObjectStore.check_stored <casmon.store.objects.ObjectStore.check_stored>`."""
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


def wait_writes(self: ObjectStore, keep: int = 0) -> None:
    """:meth:`ObjectStore.wait_writes <casmon.store.objects.ObjectStore.wait_writes>`."""
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


def write_pack(self: ObjectStore, pending: dict[bytes, Waiting]) -> str:
    """Write ``pending`` (taken from the waiting blobs by :meth:`ObjectStore.flush`) as one pack, then its index
    entries; the pack's name."""
    faultpoints = fault_points()
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
        _keep_waiting(self, pending)  # nothing half-written is indexed
        raise
    self._packs.put(name, data)
    try:
        faultpoints.point("flush.after_pack")
        for d, o, ln, k, s in entries:
            self.index.add(d, Location(name, o, ln, k, s).encode())
    except BaseException:  # Ctrl-C between the pack and its index: the pack alone finds nothing
        _keep_waiting(self, pending)
        raise
    with self._lock:  # indexed (the index's waiting entries are searched): found through it now
        self._flushing = {}
    # The pack is written; its index entries are this table's to write, and to retry if this fails.
    self.index.flush()
    for d, v in pending.items():
        self._remember(d, v[3])  # relied on since it was put, not since it was written
    return name


def _keep_waiting(self: ObjectStore, pending: dict[bytes, Waiting]) -> None:
    """A failed pack's objects wait again, for the next flush's pack (a copy already indexed is harmless)."""
    with self._lock:
        for d, v in pending.items():
            if d not in self._pending:
                self._pending[d] = v
                self._pending_bytes += len(v[0])
        self._flushing = {}
