"""The store: values, records and refs on one zarr store.

Layers below: :mod:`casmon.store.backend` (zarr I/O), :mod:`casmon.store.objects` (blobs,
packs, the pack index), :mod:`casmon.store.table` (append-only multimaps). This
module adds the three things features use:

*Values*
    ``put(value) -> Digest`` serializes a value (:mod:`casmon.store.serialize`),
    splits its buffers into chunks, stores each chunk once, and stores a small
    *manifest* that lists them. The value's digest is the manifest's digest.
*Records*
    Small JSON entries of a *kind* (``call``, ``cache``, ``run`` …), each under
    a 16-byte key, in one table per kind (``records/{kind}/``). A record lists
    the values it needs (``refs``); gc keeps exactly what records and refs reach.
*Refs*
    ``refs/{name}``: the only mutable keys, small named pointers.

Write protocol: chunks are written when a value is put (large ones at once,
small ones with the next flush); a flush writes the pack, then its index
entries, then the records. So anything a visible record points at is already
stored; a writer killed mid-way leaves only unreferenced objects, which gc
removes.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import signal
import struct
import sys
import threading
import time
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from casmon import faultpoints
from casmon.store import condemned
from casmon.store import serialize
from casmon.store.backend import Backend, open_backend
from casmon.store.codec import KIND_CHUNK, KIND_REF, KIND_VALUE, decode_frame, encode_frame, get_codec
from casmon.keys.digest import Digest
from casmon.errors import DamagedObjectError, MissingObjectError, StoreError, StoreFormatError, UntrustedStoreError
from casmon.store.marker import FORMAT_KEY
from casmon.store.objects import LOOSE_MIN, PACK_MAX, ObjectStore
from casmon.store.table import Table, writer_id

__all__ = ["Store", "open", "FORMAT_VERSION", "Ref", "Manifest"]

#: 2: tables' generations are written as blocks with a bloom filter (casmon.store.table); format-1 stores
#: are read as they are and marked format 2 before the first such generation is written.
FORMAT_VERSION = 2
#: Top-level names a casmon store may hold; anything else means "not a casmon store".
LAYOUT = ("casmon.json", "objects", "packs", "index", "records", "refs", "gc")
DEFAULT_CHUNK = 4 << 20
_KIND_RE = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
_REF_RE = re.compile(r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$")
_U32 = struct.Struct("<I")
#: A value part this large, read from an untrusted store, has its chunks' sizes checked before it is allocated.
_CHECK_BEFORE_ALLOCATING = 64 << 20
#: Flush once this many records wait in memory.
RECORDS_MAX = 50_000
#: A pool worker's flush after each call merges tables at most once in this many seconds (a merge costs
#: many requests; the level-0 files a worker writes meanwhile are merged by the next one).
CALL_MERGE_EVERY = 5.0


@dataclass
class Manifest:
    """A stored value's description: its form, metadata, chunks and children."""

    digest: Digest
    tag: str  # json | pickle | array | bytes | handler
    meta: dict
    parts: list[dict]  # {"n", "cb", "rb", "c": [hex, ...]}
    children: list[Digest]
    inline: bytes
    nbytes: int

    def chunk_digests(self) -> Iterator[Digest]:
        for p in self.parts:
            for h in p["c"]:
                yield Digest(h)


@dataclass(frozen=True)
class Ref:
    name: str
    target: Digest | None
    data: dict


def encode_manifest(tag: str, meta: dict, parts: list[dict], children: list[Digest], inline: bytes, nbytes: int) -> bytes:
    if tag == "json":
        return b"j" + inline
    if tag == "pickle" and not parts and not children:
        return b"p" + inline
    head = {"t": tag, "meta": meta, "parts": parts, "n": nbytes}
    if children:
        head["children"] = [c.hex() for c in children]
    h = json.dumps(head, separators=(",", ":")).encode()
    return b"m" + _U32.pack(len(h)) + h + inline


def decode_manifest(d: Digest, raw) -> Manifest:
    raw = bytes(raw)
    t = raw[:1]
    try:
        if t == b"j":
            return Manifest(d, "json", {}, [], [], raw[1:], len(raw) - 1)
        if t == b"p":
            return Manifest(d, "pickle", {"oob": 0}, [], [], raw[1:], len(raw) - 1)
        if t == b"m":
            (n,) = _U32.unpack_from(raw, 1)
            if 5 + n > len(raw):
                raise ValueError(f"header of {n} bytes in a manifest of {len(raw)}")
            head = json.loads(raw[5 : 5 + n])
            if not isinstance(head, dict):
                raise ValueError("header is not an object")
            inline = raw[5 + n :]
            # Every length, count and shape is checked before anything is allocated from it.
            serialize.check_manifest(f"value {d.hex()}", head.get("t"), head.get("meta"), head.get("parts"),
                                     head.get("children", []), len(inline), head.get("n"))
            children = [Digest(c) for c in head.get("children", [])]
            return Manifest(d, head["t"], head["meta"], head["parts"], children, inline, int(head["n"]))
    except (ValueError, KeyError, TypeError, struct.error, RecursionError) as e:
        raise DamagedObjectError(f"value {d.hex()}", f"not a valid manifest: {e}") from None
    raise DamagedObjectError(f"value {d.hex()}", f"not a value manifest (tag {t!r})")


@contextlib.contextmanager
def _signals_deferred():
    """Hold SIGINT and SIGTERM in this thread for a step that must not be cut in half; they arrive after it."""
    if not hasattr(signal, "pthread_sigmask") or threading.current_thread() is not threading.main_thread():
        yield  # other threads never receive KeyboardInterrupt
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


open_stores: weakref.WeakSet = weakref.WeakSet()
_hooks_installed = False
_hooks_lock = threading.Lock()


def _install_process_hooks() -> None:
    """At exit flush every open store; in a forked child forget the parent's pending writes."""
    global _hooks_installed
    with _hooks_lock:
        if _hooks_installed:
            return
        _hooks_installed = True
    # Flush before the interpreter stops thread pools: zarr's LocalStore does its file I/O in
    # asyncio's default executor, which refuses work once concurrent.futures has shut down.
    # threading's exit hooks run in reverse order of registration, so ours (registered after
    # concurrent.futures.thread's) runs first. Fall back to atexit where the hook is missing.
    import concurrent.futures.thread  # noqa: F401 - make sure its exit hook is registered first

    register = getattr(threading, "_register_atexit", None)
    if register is not None:
        register(_flush_all_at_exit)
    else:  # pragma: no cover
        atexit.register(_flush_all_at_exit)
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_after_fork_in_child)


_exiting = False
_stop_flushers = threading.Event()
#: True when the exit flush runs before Python joins threads (threading's exit hooks), so
#: background flush threads can be ordinary threads that the hook stops.
_exit_hook_stops_threads = hasattr(threading, "_register_atexit")


def _flush_all_at_exit() -> None:
    global _exiting
    _exiting = True  # no new threads from here on: Python 3.12 refuses them at shutdown
    _stop_flushers.set()  # background flushers end; the flush below writes what they would have
    for s in list(open_stores):
        t = s._flusher
        if t is not None and t is not threading.current_thread():
            t.join(timeout=30)
    for s in list(open_stores):
        try:
            if s.backend.needs_close:
                s.close()  # a zip file is only readable once its directory is written
            else:
                s.flush()
        except Exception as e:  # noqa: BLE001 - report, never crash interpreter exit
            import warnings

            warnings.warn(f"casmon: could not flush {s.url} at exit: {e}", RuntimeWarning, stacklevel=1)
    from casmon.store.backend import _Loop

    _Loop.shutdown()


def _after_fork_in_child() -> None:
    for s in list(open_stores):
        s._reset_after_fork()


def _watch_for_pool_child(store: Store) -> None:
    """Have multiprocessing tell ``store`` when a child it forks (a fork pool's worker) starts as its child.

    ``os.fork`` alone does not make a worker: a server that forks its workers after
    importing the app (or a test's zygote) runs them as main processes.
    multiprocessing calls its after-fork hooks once the child knows its parent.
    """
    try:
        from multiprocessing import util
    except ImportError:  # pragma: no cover - a platform without multiprocessing
        return
    util.register_after_fork(store, _started_as_pool_child)


def _started_as_pool_child(store: Store) -> None:
    store._flush_each_call = store.durable or in_worker_process()


#: The flush in progress in this thread runs the features' hooks: records they append are written by it.
_in_hooks = threading.local()


def in_worker_process() -> bool:
    """Whether this process is a child that its parent may end at any moment: flush after every call here.

    A pool ends its workers when it is done with them -- ``with multiprocessing.Pool()``
    terminates them (SIGTERM), loky and Dask keep them for later tasks, any pool may kill
    them -- so what a decorated call wrote must be visible before the call returns, not
    at the next background flush. True in every multiprocessing child (fork, spawn,
    forkserver: ``multiprocessing.Pool``, ``ProcessPoolExecutor``, joblib's loky and
    multiprocessing backends, Dask's worker processes), also while a spawned child still
    imports its parent's main module; not in a child of a plain ``os.fork``. ``CASMON_FLUSH_EACH_CALL``
    (``1``/``0``) forces it either way, e.g. ``0`` for a worker that makes many tiny calls
    and is always ended cleanly (``close()`` and ``join()``).
    """
    forced = os.environ.get("CASMON_FLUSH_EACH_CALL", "").strip().lower()
    if forced in ("1", "true", "yes", "on"):
        return True
    if forced in ("0", "false", "no", "off"):
        return False
    mp = sys.modules.get("multiprocessing")  # a multiprocessing child has imported it before anything else
    if mp is None:
        return False
    try:
        if mp.parent_process() is not None:
            return True
        # A spawned (or loky, or forkserver) child importing the parent's main module, before it knows its parent.
        return bool(getattr(mp.current_process(), "_inheriting", False))
    except Exception:  # noqa: BLE001 - an odd multiprocessing (a stub, a frozen app): not a worker
        return False


class Store:
    """A casmon store. Open one with :func:`casmon.open`.

    Thread-safe; one instance per process and location is enough (features
    share it). Use it as a context manager, or call :meth:`close`, to flush.
    """

    def __init__(
        self,
        backend: Backend,
        *,
        trust: bool = True,
        chunk_size: int = DEFAULT_CHUNK,
        array_codec: str = "blosc-lz4",
        codec: str = "zstd",
        autoflush: float | None = 5.0,
        durable: bool = False,
    ) -> None:
        if not 4096 <= chunk_size <= serialize.MAX_CHUNK:
            raise ValueError(f"chunk_size must be between 4096 bytes and {serialize.MAX_CHUNK} (1 GiB), got {chunk_size}")
        self.backend = backend
        self.trust = trust
        self.chunk_size = int(chunk_size)
        self.array_codec = get_codec(array_codec)
        self.codec = get_codec(codec)
        self.autoflush = autoflush
        self.durable = durable
        backend.fsync = durable
        self.writer = writer_id()
        self._lock = threading.RLock()
        self._flush_lock = threading.Lock()
        self._tables: dict[str, Table] = {}
        self._table_list: tuple[Table, ...] = ()
        self._closed = False
        self._flusher: threading.Thread | None = None
        self._flush_hooks: list = []
        self._manifests: dict[Digest, Manifest] = {}  # small manifests, immutable
        self._record_refs: set[bytes] = set()  # digests of values named by records appended since the last seal
        # Values put and not yet named by a record or ref (a running call's arguments): if gc condemns
        # one meanwhile, the next flush copies it, so it is still there when its record is written.
        self._held: dict[Digest, None] = {}
        self._held_lists: frozenset = frozenset()  # the condemned lists _held was checked against
        self.dropped_records = 0  # records a flush could not write because a value they name was gone
        # Records are flushed before the call that wrote them returns: durable stores, and pool workers.
        self._flush_each_call = durable or in_worker_process()
        self._flush_warned = False
        self._io_ready = False  # casmon's I/O threads run (see _start_io)
        self._merged_at = 0.0  # when a flush last merged tables (a worker's flush per call merges less often)
        _watch_for_pool_child(self)
        self.format = self._check_format()
        self.objects = ObjectStore(backend, self.writer)
        self.objects.index.format_gate = self._format2
        _install_process_hooks()
        open_stores.add(self)

    # -- format -------------------------------------------------------------------
    def _check_format(self) -> dict:
        """Read ``casmon.json`` (or write it in a new store) and check the store's format.

        A damaged or missing marker in a folder that holds only a casmon store's
        layout does not stop anyone: the store opens as format
        ``FORMAT_VERSION`` with a warning, ``format["damaged"]`` says what is
        wrong, ``verify`` reports it and ``verify --repair`` writes a new
        marker. A marker that is sound and names a newer format is refused.
        """
        from casmon.store.marker import marker_bytes, parse_marker
        from casmon.store.table import warn_damage

        data = self.backend.get(FORMAT_KEY)
        top = None
        if data is None:
            top = _top_level(self.backend)
            foreign = [k for k in top if k.rstrip("/") not in LAYOUT]
            if foreign:
                raise StoreFormatError(
                    f"{self.url} is not a casmon store: it holds {', '.join(sorted(foreign)[:5])} "
                    f"and no {FORMAT_KEY}; choose an empty folder or an existing store"
                )
            if self.backend.read_only:
                if not top:
                    raise StoreFormatError(f"{self.url} is not a casmon store (no {FORMAT_KEY}) and is opened read-only")
                problem = f"{FORMAT_KEY} is missing"
                warn_damage(self.url, FORMAT_KEY, problem)
                return {"format": FORMAT_VERSION, "damaged": problem}
            try:
                self.backend.create(FORMAT_KEY, marker_bytes())
            except OSError as e:
                raise StoreError(f"cannot write to store {self.url}: {e.strerror or e}") from None
            data = self.backend.get(FORMAT_KEY)
            if data is None:
                raise StoreError(f"cannot write to store {self.url}: {FORMAT_KEY} did not persist")
        info, problem = parse_marker(data)
        if problem is not None:
            if top is None:
                top = _top_level(self.backend)
            if any(k.rstrip("/") not in LAYOUT for k in top):
                raise StoreFormatError(f"{self.url}: {FORMAT_KEY} is damaged or not a casmon store marker ({problem})")
            warn_damage(self.url, FORMAT_KEY, problem)
            return {"format": FORMAT_VERSION, "damaged": problem}
        version = info["format"]
        if version > FORMAT_VERSION:
            raise StoreFormatError(
                f"{self.url} was written in casmon store format {version}; this casmon reads format "
                f"{FORMAT_VERSION} and older. Upgrade casmon to open it."
            )
        return info

    def _format2(self) -> bool:
        """Called before a table writes its first format-2 generation: the marker must say format 2
        first, so an older casmon refuses the store rather than take the new files for damage.
        False (keep writing format 1) while the marker is damaged: ``verify --repair`` writes one."""
        if self.format.get("damaged"):
            return False
        if self.format.get("format", 1) >= 2:
            return True
        from casmon.store.marker import marker_bytes, parse_marker

        with self._lock:
            if self.format.get("format", 1) < 2:
                extra = {k: self.format[k] for k in ("created",) if k in self.format}
                data = marker_bytes({**extra, "upgraded": time.time()})
                try:
                    self.backend.set(FORMAT_KEY, data)
                except OSError:
                    return False
                self.format = parse_marker(data)[0]
        return True

    @property
    def url(self) -> str:
        return self.backend.url

    def __repr__(self) -> str:
        return f"<casmon.Store {self.url!r}{' read-only' if self.read_only else ''}>"

    @property
    def read_only(self) -> bool:
        return self.backend.read_only

    # -- values -------------------------------------------------------------------
    def put(self, value: Any) -> Digest:
        """Store ``value`` and return its digest. Storing it again costs no space.

        Raises :class:`~casmon.errors.UnpicklableError` (a ``TypeError``) naming
        the part of the value that cannot be stored; nothing is half-written.
        """
        return self.put_sized(value)[0]

    def put_sized(self, value: Any) -> tuple[Digest, int]:
        """:meth:`put`, also returning the value's logical size in bytes."""
        self._check_writable()
        enc = serialize.encode(value)
        try:
            d = self._put_encoded(enc)
        except OSError as e:  # a full disk, no permission: say which store, keep the cause
            raise StoreError(f"cannot write to store {self.url}: {e.strerror or e}") from e
        held = self._held
        held.pop(d, None)
        held[d] = None
        if len(held) > 100_000:
            for k in list(held)[:50_000]:
                held.pop(k, None)
        return d, enc.nbytes

    def _put_encoded(self, enc: serialize.Encoded) -> Digest:
        children = [self.put(c) for c in enc.children]
        t0 = self.objects.view()
        try:
            parts = [self._put_part(p) for p in enc.parts]
        finally:
            self.objects.wait_writes()  # chunks are stored before the manifest can be
        if self.objects.view() != t0:
            # The condemned lists were read again while the chunks went in: a chunk relied on under
            # the older view may be condemned now. Store those again, so every chunk of the value is
            # checked under the view the manifest is put under.
            for p, part in zip(parts, enc.parts):
                data = part.data
                for i, h in enumerate(p["c"]):
                    if self.objects.is_condemned(Digest(h)):
                        codec = self.array_codec if part.numeric else self.codec
                        self.objects.put(data[i * p["cb"] : (i + 1) * p["cb"]], KIND_CHUNK, codec, part.typesize)
        faultpoints.point("put.after_chunks")
        manifest = encode_manifest(enc.tag, enc.meta, parts, children, enc.inline, enc.nbytes)
        d = self.objects.put(manifest, KIND_VALUE, self.codec, size=enc.nbytes)
        self.objects.wait_writes()  # a large manifest is written like a chunk: done before put returns
        self._after_write()
        return d

    def _put_part(self, part: serialize.Part) -> dict:
        data = part.data
        n = data.nbytes
        row = max(1, part.row_bytes)
        cs = self.chunk_size
        if row <= cs:
            cb = (cs // row) * row
        else:  # one row is larger than a chunk: cut rows, aligned to elements
            cb = max(part.typesize, cs - cs % part.typesize)
        codec = self.array_codec if part.numeric else self.codec
        chunks = [d.hex() for d in self.objects.put_chunks(data, cb, KIND_CHUNK, codec, part.typesize)]
        return {"n": n, "cb": cb, "rb": row, "c": chunks}

    def manifest(self, digest: Digest | str) -> Manifest:
        """The manifest of a stored value (what it is, how large, which chunks)."""
        d = digest if type(digest) is Digest else Digest(digest)
        m = self._manifests.get(d)
        if m is not None:
            return m
        try:
            raw = self.objects.get(d)
        except MissingObjectError:
            raise MissingObjectError(f"no value {d.hex()} in store {self.url}") from None
        m = decode_manifest(d, raw)
        if len(m.inline) <= 4096 and len(m.parts) <= 4:
            if len(self._manifests) > 10_000:
                self._manifests.clear()
            self._manifests[d] = m
        return m

    def get(self, digest: Digest | str) -> Any:
        """Load a stored value: a fresh copy equal to what was put.

        Raises :class:`MissingObjectError` for an unknown digest and
        :class:`DamagedObjectError` naming the object if any byte is wrong.
        """
        m = self.manifest(digest)
        buffers = [self._read_part(p) for p in m.parts]
        enc = serialize.Encoded(m.tag, m.meta, m.inline, children=m.children)
        try:
            return serialize.decode(enc, buffers, load_child=lambda pid: self.get(m.children[pid]), trusted=self.trust)
        except UntrustedStoreError as e:
            raise UntrustedStoreError(f"value {m.digest.hex()} in {self.url}: {e}") from None

    def _read_part(self, part: dict) -> np.ndarray:
        n, cb = int(part["n"]), int(part["cb"])
        chunks = [Digest(h) for h in part["c"]]
        if len(chunks) != (n + cb - 1) // cb if cb else 0:
            raise DamagedObjectError("value part", f"{len(chunks)} chunks for {n} bytes of {cb}")
        if not self.trust and n >= _CHECK_BEFORE_ALLOCATING:
            self._check_chunk_sizes(chunks, n, cb)  # a crafted manifest must not make us allocate a terabyte
        buf = np.empty(n, dtype=np.uint8)
        large = []
        for i, d in enumerate(chunks):
            lo = i * cb
            hi = min(n, lo + cb)
            if hi - lo >= LOOSE_MIN:
                large.append((d, buf[lo:hi]))
            else:
                self.objects.get(d, out=buf[lo:hi])
        self.objects.get_into_many(large)
        return buf

    def _check_chunk_sizes(self, chunks: list[Digest], n: int, cb: int) -> None:
        """Every chunk exists and has the size the manifest claims (headers only), before the buffer is allocated."""
        for i, d in enumerate(chunks):
            want = min(cb, n - i * cb)
            h = self.objects.loose_header(d) if want >= LOOSE_MIN else None
            if h is not None:
                size = h.raw_len
            else:
                loc = self.objects.locate(d)
                if loc is None:
                    raise MissingObjectError(f"chunk {d.hex()} of a value is not in {self.url}")
                size = loc.size
            if size != want:
                raise DamagedObjectError(f"object {d.hex()}", f"chunk of {size} bytes where its value's manifest says {want}")

    def read_chunk(self, digest: Digest, out) -> None:
        """Read one chunk into ``out`` (used by lazy array views)."""
        self.objects.get(digest, out=out, loose_hint=len(out) >= LOOSE_MIN)

    def __contains__(self, digest: object) -> bool:
        try:
            d = Digest(digest)  # type: ignore[arg-type]
        except (ValueError, TypeError):
            return False
        return self.objects.contains(d)

    def open_array(self, digest: Digest | str):
        """A read-only, lazy ``zarr.Array`` over a stored numpy array.

        Reading a slice reads only the chunks it touches.
        """
        from casmon.store.arrayview import open_array

        return open_array(self, self.manifest(digest))

    # -- records ------------------------------------------------------------------
    def table(self, kind: str) -> Table:
        t = self._tables.get(kind)
        if t is None:
            if not _KIND_RE.match(kind):
                raise ValueError(f"record kind must match {_KIND_RE.pattern}, got {kind!r}")
            with self._lock:
                t = self._tables.get(kind)
                if t is None:
                    t = Table(self.backend, f"records/{kind}/", self.writer)
                    t.format_gate = self._format2
                    self._tables[kind] = t
                    # A tuple, replaced whole: read without the lock on every write (copying the dict
                    # there could meet another thread's insert, see test_table_scale's snapshot test).
                    self._table_list = tuple(self._tables.values())
        return t

    def record_kinds(self) -> list[str]:
        on_disk = [k.rstrip("/") for k in self.backend.list_dir("records")]
        return sorted(set(on_disk) | set(self._tables))

    def append(self, kind: str, record: dict, key: bytes | None = None, refs: Iterable[Digest] = (),
               encoded: str | bytes | list[bytes] | None = None) -> Digest:
        """Add a record; it becomes visible to other processes at the next flush.

        ``refs`` are the digests of values the record needs: gc keeps them.
        ``encoded``: the record already encoded as a JSON object (the call log encodes
        its rows while calls run), used instead of ``record``; text, UTF-8 bytes, or
        pieces of UTF-8 whose concatenation is the object (joined once, here).
        Returns the record's key (random unless given).
        """
        self._check_writable()
        if encoded is not None:
            pieces = [encoded.encode()] if isinstance(encoded, str) else [encoded] if isinstance(encoded, bytes) else list(encoded)
            if refs:
                last = pieces[-1]
                if last[-1:] != b"}":
                    raise ValueError("encoded record does not end with '}'")
                pieces[-1] = last[:-1] + b',"_refs":' + json.dumps([Digest(r).hex() for r in refs]).encode() + b"}"
            data = pieces[0] if len(pieces) == 1 else b"".join(pieces)
        else:
            if refs:
                record = dict(record)
                record["_refs"] = [Digest(r).hex() for r in refs]
            try:
                data = json.dumps(record, separators=(",", ":"), allow_nan=True).encode()
            except (TypeError, ValueError) as e:
                raise TypeError(f"record of kind {kind!r} is not JSON-serializable: {e}") from None
        k = Digest(key) if key is not None else Digest(os.urandom(16))
        t = self.table(kind)
        with self._lock:  # one step with respect to a flush sealing the tables
            t.add(k, data)
            if refs:
                rs = [Digest(r) for r in refs]
                self._record_refs.update(map(bytes, rs))  # plain bytes: not walked by the garbage collector
                held = self._held
                for r in rs:
                    held.pop(r, None)
        if self._flush_each_call and not self.durable:
            self.flush_for_call()
        else:
            self._after_write()
        return k

    def records(self, kind: str, strict: bool = True) -> Iterator[tuple[Digest, dict]]:
        """Every record of ``kind`` from every writer, with its key.

        ``strict`` (the default, what gc and verify need): a damaged table file
        raises :class:`DamagedObjectError`. ``strict=False``: what can be read,
        skipping damaged files with one :class:`StoreDamageWarning` each.
        """
        for k, v in self.table(kind).items(strict=strict):
            yield Digest(k), _parse_record(kind, k, v)

    def lookup(self, kind: str, key: bytes, refresh: bool = True) -> list[dict]:
        """The records of ``kind`` stored under ``key`` (usually one)."""
        k = Digest(key)
        return [_parse_record(kind, k, v) for v in self.table(kind).lookup(k, refresh_on_miss=refresh)]

    # -- refs ---------------------------------------------------------------------
    def _ref_key(self, name: str) -> str:
        if not isinstance(name, str) or not _REF_RE.match(name) or ".." in name.split("/"):
            raise ValueError(f"ref names are letters, digits, '_', '.', '-' and '/': got {name!r}")
        return "refs/" + name

    def set_ref(self, name: str, target: Digest | None = None, data: dict | None = None) -> None:
        """Point ref ``name`` at ``target`` (replacing what it pointed at)."""
        self._check_writable()
        key = self._ref_key(name)
        self._ensure_stored(target)
        self.backend.set(key, self._ref_frame(target, data))

    def _ensure_stored(self, target) -> None:
        """Before a ref names ``target``: it and its chunks are written, and safe from a gc sweep."""
        if target is None:
            return
        d = Digest(target)
        self._held.pop(d, None)
        with self._flush_lock:
            if self._needs_check(d) or self.objects.pending_bytes:
                bad = self._check_values({d})
                if bad:
                    raise MissingObjectError(f"cannot point a ref at value {d.hex()}: it is not in {self.url}")
                self._write_objects()

    def create_ref(self, name: str, target: Digest | None = None, data: dict | None = None) -> bool:
        """Create ref ``name`` unless it exists; True if this call created it.

        Safe between processes on backends with a race-free create (local
        folders, object stores with conditional writes).
        """
        self._check_writable()
        key = self._ref_key(name)
        self._ensure_stored(target)
        nonce = os.urandom(8).hex()
        frame = self._ref_frame(target, data, nonce)
        self.backend.create(key, frame)
        got = self.backend.get(key)
        return got is not None and bytes(got) == frame

    def _ref_frame(self, target, data, nonce: str | None = None) -> bytes:
        body = {"target": None if target is None else Digest(target).hex(), "data": data or {}}
        if nonce:
            body["nonce"] = nonce
        return encode_frame(json.dumps(body).encode(), KIND_REF, get_codec("none"))[1]

    def get_ref(self, name: str) -> Ref | None:
        key = self._ref_key(name)
        data = self.backend.get(key)
        if data is None:
            return None
        raw = decode_frame(data, key)[1]
        try:
            body = json.loads(bytes(raw))
            if not isinstance(body, dict):
                raise ValueError("not a JSON object")
            target = Digest(body["target"]) if body.get("target") else None
            data = body.get("data") or {}
            if not isinstance(data, dict):
                raise ValueError("its data is not a JSON object")
            return Ref(name, target, data)
        except (ValueError, KeyError, TypeError, RecursionError) as e:
            raise DamagedObjectError(key, f"not a valid ref: {e}") from None

    def refs(self, prefix: str = "") -> list[str]:
        base = "refs/" + (prefix.strip("/") + "/" if prefix else "")
        return sorted(k[len("refs/") :] for k in self.backend.list(base) if ".partial" not in k)

    def delete_ref(self, name: str) -> None:
        self._check_writable()
        self.backend.delete(self._ref_key(name))

    # -- flushing -----------------------------------------------------------------
    def _check_writable(self) -> None:
        if self.read_only:
            raise StoreError(f"store {self.url} is opened read-only")
        if self._closed:
            raise StoreError(f"store {self.url} is closed")

    def _after_write(self) -> None:
        if not self._io_ready:
            self._start_io()
        if self.durable:
            self.flush()  # written, and fsynced where the backend can, before the call returns
            return
        if self.objects.pending_bytes > PACK_MAX or any(t.pending > RECORDS_MAX for t in self._table_list):
            self.flush()
        elif self.autoflush and self._flusher is None:
            self._start_flusher()

    def _start_io(self) -> None:
        """Start casmon's I/O threads at the first write, if reads have not: the exit flush needs them,
        and Python 3.12 refuses to start a thread while the interpreter exits (a process that read a
        local folder without them and wrote only at exit lost its writes)."""
        if not self.backend.is_local:  # a local folder is written in the calling thread
            from casmon.store.backend import _Loop

            _Loop.get()
        self._io_ready = True

    def flush_for_call(self) -> None:
        """Flush now so that what a call wrote outlives this process (a pool worker; see :func:`in_worker_process`).

        A durable store flushes and raises like :meth:`flush`. Otherwise a failure is one
        warning, never the caller's error: what was not written stays pending for the
        next flush. Records a flush hook appends are written by that flush itself.
        """
        if getattr(_in_hooks, "on", False):
            return
        if self.durable:
            self.flush()
            return
        _in_hooks.call = True
        try:
            self.flush()
        except Exception as e:  # noqa: BLE001 - a computed result is never lost to a storage error
            if not self._flush_warned:
                self._flush_warned = True
                import warnings

                warnings.warn(f"casmon: could not flush {self.url} in this worker process: {e}; what was not written "
                              "waits for the next flush, and is lost if the pool ends this process first",
                              RuntimeWarning, stacklevel=3)
        else:
            self._after_write()  # the background flusher still writes what no call flushes (hit counts)
        finally:
            _in_hooks.call = False

    def _start_flusher(self) -> None:
        with self._lock:
            if self._flusher is not None or _exiting:
                return
            ref = weakref.ref(self)
            interval = self.autoflush
            stop = _stop_flushers

            def loop() -> None:
                while not stop.wait(interval):
                    s = ref()
                    if s is None or s._closed:
                        return
                    try:
                        s.flush()
                    except Exception as e:  # noqa: BLE001 - keep pending, retry next round
                        if not stop.is_set():
                            import logging

                            logging.getLogger("casmon").warning("background flush of %s failed: %s", s.url, e)
                    del s

            # Not a daemon where the exit hook can stop it: a daemon thread still flushing (or
            # writing a warning) while the interpreter tears down can abort the process.
            self._flusher = threading.Thread(target=loop, name="casmon-flush", daemon=not _exit_hook_stops_threads)
            self._flusher.start()

    def flush(self) -> None:
        """Make everything written so far visible to other processes.

        Order: set the waiting records aside (*seal*); check that every value
        they name is stored and safe from gc (see :mod:`casmon.store.condemned`); write
        the waiting small objects (one pack) and the pack's index entries; then
        the records. So a record is never visible before the values it names.
        If a step fails, what was not written stays waiting for the next flush
        and the error is raised.
        """
        if self.read_only:
            return
        # A hook moves a feature's waiting rows into a record: Ctrl-C in the middle would lose them.
        with _signals_deferred():
            nested, _in_hooks.on = getattr(_in_hooks, "on", False), True  # a hook's record is written by this flush
            try:
                for hook in list(self._flush_hooks):
                    try:
                        hook(self)
                    except Exception as e:  # noqa: BLE001 - a feature's bookkeeping must not stop a flush
                        import logging

                        logging.getLogger("casmon").warning("flush hook %r failed: %s", hook, e)
            finally:
                _in_hooks.on = nested
        with self._flush_lock:
            refs: set[Digest] = set()
            try:
                with _signals_deferred(), self._lock:  # no record is added while the tables are sealed
                    tables = list(self._tables.items())
                    for _kind, t in tables:
                        t.seal()
                    refs, self._record_refs = self._record_refs, set()
                faultpoints.point("flush.sealed")
                sealed_at = time.monotonic()
                stale = {Digest.from_raw(d) for d in refs if self._needs_check(d)}
                bad = self._check_values(stale) if stale else set()
                bad |= self._check_pending_values()
                if bad:
                    self._drop_records_needing(bad, tables)
                self._write_objects()
                faultpoints.point("flush.after_index")
                for kind, t in tables:
                    if t.sealed() and time.monotonic() - sealed_at > condemned.WRITE_MAX:
                        # Slow (a retried network write, a stopped process): check the values again.
                        bad = self._check_values(self._refs_of(t), force=True)
                        if bad:
                            self._drop_records_needing(bad, [(kind, t)])
                        self._write_objects()
                    t.write_sealed()
                faultpoints.point("flush.after_records")
                if not getattr(_in_hooks, "call", False) or time.monotonic() - self._merged_at >= CALL_MERGE_EVERY:
                    self._merged_at = time.monotonic()  # a worker's flush per call merges at most this often
                    self._merge_tables()
            except BaseException as e:
                with self._lock:  # the sealed records are written by a later flush: check their values then
                    self._record_refs.update(refs)
                if isinstance(e, OSError):
                    raise StoreError(f"cannot write to store {self.url}: {e.strerror or e}") from e
                if isinstance(e, StoreError) or not isinstance(e, Exception):
                    raise
                # e.g. a network error: what was not written stays pending
                raise StoreError(f"cannot write to store {self.url}: {type(e).__name__}: {e}") from e
        if self._held:
            try:
                self._protect_held()
            except Exception:  # noqa: BLE001 - the next flush looks again; the seal check still guards
                pass

    def _protect_held(self) -> None:
        """Copy values put and not yet named by any record (a running call's arguments) that gc condemned."""
        vt = self.objects.view()
        lists = frozenset(self.objects._lists)
        if lists == self._held_lists:
            return
        self._held_lists = lists
        if not self.objects._condemned:
            return
        for d in list(self._held):
            self._check_value(d, vt, set())  # copies what is condemned into the next pack

    def _merge_tables(self) -> None:
        """Merge tables that have many files, holding the store lock (skipped when gc or another merge has it)."""
        merges = [t for t in [self.objects.index, *self._tables.values()] if t.wants_merge()]
        if not merges or not self.backend.supports_deletes:
            return
        from casmon.store.lock import StoreLock

        lk = StoreLock(self.backend, "merge")
        if not lk.acquire():
            return  # the next flush tries again
        try:
            for t in merges:
                t.consolidate()
        finally:
            lk.release()

    def _write_objects(self) -> None:
        self.objects.flush()

    def _check_pending_values(self) -> set[Digest]:
        """Waiting manifests put longer than ``RELY_MAX`` ago: their chunks are checked again before they are written.

        A value whose chunk gc removed meanwhile is not written at all (it would be a manifest naming a
        missing object); returns such values, so records naming them are kept out too.
        """
        now = time.monotonic()
        # Under the lock that puts take: a garbage collection inside the copy runs Python code (gc
        # callbacks, finalizers), where another thread's put would change the dict under the copy.
        with self.objects._lock:
            pending = list(self.objects._pending.items())
        old = [Digest.from_raw(d) for d, p in pending if p[1] == KIND_VALUE and now - p[3] > condemned.RELY_MAX]
        if not old:
            return set()
        vt = self.objects.refresh_view()
        lost: set[Digest] = set()
        for d in old:
            try:
                m = self.manifest(d)
                ok = all(self.objects.check_stored(c, vt) for c in m.chunk_digests())
                ok = ok and all(self._check_value(c, vt, set()) for c in m.children)
            except (MissingObjectError, DamagedObjectError):
                ok = False
            with self.objects._lock:
                p = self.objects._pending.get(d)
                if p is None:
                    continue
                if ok:
                    self.objects._pending[d] = (*p[:3], vt)
                else:
                    del self.objects._pending[d]
                    self.objects._pending_bytes -= len(p[0])
                    lost.add(d)
        return lost

    def _needs_check(self, d: Digest) -> bool:
        return time.monotonic() - self.objects.reliance(d) > condemned.RELY_MAX

    def _check_values(self, digests, force: bool = False) -> set[Digest]:
        """Check values (manifest, chunks, children) stored and not condemned, under a fresh view.

        Condemned objects are copied to the next pack. Returns the values that
        are not stored (whole or in part): no record may name them.
        """
        todo = [d for d in digests if force or self._needs_check(d)]
        if not todo:
            return set()
        vt = self.objects.refresh_view()
        return {d for d in todo if not self._check_value(d, vt, set())}

    def _check_value(self, d: Digest, vt: float, seen: set) -> bool:
        if d in seen:
            return True
        seen.add(d)
        try:
            if not self.objects.check_stored(d, vt):
                return False
            m = self.manifest(d)
        except (MissingObjectError, DamagedObjectError):
            return False
        for c in m.chunk_digests():
            try:
                if not self.objects.check_stored(c, vt):
                    return False
            except (MissingObjectError, DamagedObjectError):
                return False
        return all(self._check_value(c, vt, seen) for c in m.children)

    def _refs_of(self, t: Table) -> set[Digest]:
        out: set[Digest] = set()
        for _name, entries in t.sealed():
            for _k, v in entries:
                try:
                    out.update(Digest(h) for h in json.loads(v).get("_refs", ()))
                except (ValueError, TypeError, AttributeError):
                    pass
        return out

    def _drop_records_needing(self, bad: set[Digest], tables) -> None:
        """Keep sealed records from naming lost values: trim them (a salvager) or drop them, and warn."""
        bad_hex = {d.hex() for d in bad}
        dropped = 0
        for kind, t in tables:
            for name, entries in t.sealed():
                kept = []
                changed = False
                for k, v in entries:
                    try:
                        rec = json.loads(v)
                        refs = rec.get("_refs", ())
                    except (ValueError, TypeError, AttributeError):
                        kept.append((k, v))
                        continue
                    if not bad_hex.intersection(refs):
                        kept.append((k, v))
                        continue
                    changed = True
                    fixed = salvage(kind, rec, bad)
                    if fixed is None:
                        dropped += 1
                    else:
                        kept.append((k, json.dumps(fixed, separators=(",", ":"), allow_nan=True).encode()))
                if changed:
                    t.replace_sealed(name, kept)
        self.dropped_records += dropped
        import warnings

        warnings.warn(
            f"casmon: {len(bad)} value(s) were removed from {self.url} (by gc, or lost to damage) while this "
            f"process still needed them; {dropped} record(s) that named them were not written",
            RuntimeWarning, stacklevel=3)

    def add_flush_hook(self, hook) -> None:
        """Call ``hook(store)`` at the start of every flush (features add their bookkeeping records)."""
        self._flush_hooks.append(hook)

    def close(self) -> None:
        """Flush and stop using the store."""
        if self._closed:
            return
        try:
            self.flush()
        finally:
            self._closed = True
            open_stores.discard(self)
            if self.backend.needs_close:
                self.backend.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _reset_after_fork(self) -> None:
        # The parent flushes what it had pending; the child starts as a new writer.
        self.writer = writer_id()
        self._flush_each_call = self.durable or in_worker_process()  # multiprocessing's child: set again at its start
        self._io_ready = False  # the parent's threads do not exist here
        self._flusher = None  # the parent's thread does not exist here
        self._flush_lock = threading.Lock()
        self._lock = threading.RLock()
        self.objects = ObjectStore(self.backend, self.writer)
        self._tables = {}
        self._table_list = ()
        self._flush_hooks = []
        # The values the parent's waiting records name, and those it holds, are the parent's to write:
        # checked here they look lost (found by an attack: a false "removed by gc" warning in children).
        self._record_refs = set()
        self._held = {}
        self._held_lists = frozenset()

    # -- maintenance --------------------------------------------------------------
    def stats(self, progress=None) -> dict:
        """Counts and sizes: values, chunks, bytes, dedup ratio, files."""
        from casmon.maintenance.verify import stats

        return stats(self, progress)

    def verify(self, progress=None):
        """Re-hash every object; report what is damaged or missing and what depends on it."""
        from casmon.maintenance.verify import verify

        return verify(self, progress)

    def gc(self, grace: float = 3600.0, dry_run: bool = False, progress=None, break_lock: bool = False):
        """Remove what no record or ref reaches (condemned at least ``grace`` seconds ago); repack sparse packs."""
        from casmon.maintenance.gc import gc

        return gc(self, grace=grace, dry_run=dry_run, progress=progress, break_lock=break_lock)


def _parse_record(kind: str, key: bytes, v: bytes) -> dict:
    try:
        r = json.loads(v)
        if not isinstance(r, dict):
            raise ValueError("not an object")
        return r
    except ValueError as e:
        raise DamagedObjectError(f"record {kind}/{bytes(key).hex()}", f"not valid JSON: {e}") from None


def open(
    location: Any = None,
    *,
    read_only: bool = False,
    trust: bool = True,
    storage_options: dict | None = None,
    create: bool = True,
    **options: Any,
) -> Store:
    """Open (or create) a casmon store.

    ``location``: a folder (default ``./.casmon``), ``memory://name``, a
    ``.zip`` file, a URL such as ``s3://bucket/prefix``, or a zarr store.
    ``trust=False`` refuses to unpickle anything from the store (arrays,
    JSON-like values, records and refs still load). Other options:
    ``chunk_size``, ``array_codec``, ``codec``, ``autoflush`` (seconds, or
    None for flushes only at :meth:`Store.flush`, at close and at exit),
    ``durable`` (every put, record and logged call is written -- and fsynced on
    a local folder -- before the call returns: safer, and much slower).
    ``create=False`` opens only an existing store: a missing or empty location
    raises :class:`StoreError` instead of becoming a new store (for readers, and
    for maintenance that must not act on a mistyped path).
    """
    backend = open_backend(location, read_only=read_only, storage_options=storage_options, create=create)
    if not create and not backend.exists(FORMAT_KEY) and not _top_level(backend):
        backend.close()
        raise StoreError(f"no casmon store at {backend.url}: it is empty")
    return Store(backend, trust=trust, **options)


def _top_level(backend: Backend) -> list[str]:
    """What a location holds at its top, less hidden names and the ``*.partial`` files writers
    link or rename into place: a store another process is creating holds only
    ``casmon.json.<uuid>.partial`` for a moment, and that is no foreign file."""
    return [k for k in backend.list_dir("") if not k.startswith(".") and not k.endswith(".partial")]


_default: dict[tuple[int, str], Store] = {}
_default_lock = threading.Lock()


def default_store(location: Any = None, create: bool = True) -> Store:
    """The store features use when none is given, opened on first use and shared in the process.

    ``location`` defaults to ``$CASMON_STORE``, then ``./.casmon`` (resolved
    against the working directory at first use). A :class:`Store` passes through.
    ``create=False`` (readers such as ``casmon.load``): a store not open in this
    process must exist; nothing is created at a mistyped path.
    """
    if isinstance(location, Store):
        return location
    if location is None:
        location = os.environ.get("CASMON_STORE") or ".casmon"
    if isinstance(location, (str, os.PathLike)) and "://" not in str(location):
        location = os.path.abspath(os.fspath(location))
    key = (os.getpid(), str(location))
    s = _default.get(key)
    if s is not None and not s._closed:
        return s
    with _default_lock:
        s = _default.get(key)
        if s is None or s._closed:
            s = open(location, create=create)
            _default[key] = s
    return s


#: kind -> salvager: ``fn(record, bad) -> record | None`` keeps what a record can keep when some of the
#: values it names (``bad``, a set of Digests) are lost: a trimmed record (its ``_refs`` updated), or
#: None to drop it. Used by ``verify --repair`` and by a flush that finds a value gone before its record
#: is written. Kinds without one lose the whole record.
SALVAGERS: dict[str, Any] = {}


def register_salvager(kind: str, fn) -> None:
    """Teach repair and flush how to keep the intact part of a ``kind`` record whose values are partly lost."""
    SALVAGERS[kind] = fn


def salvage(kind: str, record: dict, bad: set) -> dict | None:
    """The part of ``record`` that does not need a value in ``bad`` (None: nothing)."""
    fn = SALVAGERS.get(kind)
    if fn is None:
        return None
    try:
        return fn(record, bad)
    except Exception:  # noqa: BLE001 - a salvager that fails keeps nothing, never stops a flush or repair
        return None
