"""The store: values, records and refs on one zarr store (:class:`Store`, :func:`open`, :func:`default_store`).

Layers below: :mod:`casmon.store.backend` (zarr I/O), :mod:`casmon.store.objects` (blobs,
packs, the pack index), :mod:`casmon.store.table` (append-only multimaps). This
module adds the three things features use:

*Values*
    ``put(value) -> Digest`` serializes a value (:mod:`casmon.store.serialize`),
    splits its buffers into chunks, stores each chunk once, and stores a small
    *manifest* (:mod:`casmon.store.manifest`) that lists them. The value's digest
    is the manifest's digest.
*Records*
    Small JSON entries of a *kind* (``call``, ``cache``, ``run`` …), each under
    a 16-byte key, in one table per kind (``records/{kind}/``). A record lists
    the values it needs (``refs``); gc keeps exactly what records and refs reach
    (their formats: :mod:`casmon.store.records`).
*Refs*
    ``refs/{name}``: the only mutable keys, small named pointers.

Write protocol: chunks are written when a value is put (large ones at once,
small ones with the next flush); a flush writes the pack, then its index
entries, then the records. So anything a visible record points at is already
stored; a writer killed mid-way leaves only unreferenced objects, which gc
removes. What happens at exit, in forked children and in pool workers is
:mod:`casmon.store.lifecycle`'s.

``stats``, ``verify`` and ``gc`` belong to the maintenance layer, which builds
on this one: it installs itself with :func:`install_maintenance` when
``casmon.maintenance`` is imported (``import casmon`` does), and the store
calls it through the :class:`Maintenance` protocol.
"""

from __future__ import annotations

import os
import _thread  # threading's locks, without loading threading on a hit
import time
import warnings
from _weakref import ref as weak_ref  # weakref's own, without loading weakref.py on a hit
from collections.abc import Callable, Iterable, Iterator
TYPE_CHECKING = False  # typing's flag without importing typing (~2 ms of a first hit)
if TYPE_CHECKING:
    import threading

from casmon.keys.names import keep_flat_names
from casmon.errors import (MAX_SECONDS, CasmonError, DamagedObjectError, MissingObjectError, StoreError,
                           UntrustedStoreError, warn_damage)
from casmon.keys.digest import Digest
from casmon.store import lifecycle, serialize
from casmon.store.backend import Backend, open_backend
from casmon.store.backend.base import fault_points
from casmon.store.codec import CODECS, get_codec
from casmon.store.manifest import Manifest, decode_manifest
from casmon.store.marker import FORMAT_KEY, FORMAT_VERSION, marker_bytes, parse_marker, read_format
from casmon.store.objects import LOOSE_MIN, PACK_MAX, ObjectStore, gc_bounds
from casmon.store.records import KIND_PATTERN, Ref, decode_ref, encode_record, is_kind_name, is_ref_name, parse_record, ref_key, refs_of
from casmon.store.table import LateWrite, Table, writer_id

if TYPE_CHECKING:
    import logging
    from typing import Any, Protocol

    import numpy as np
    import zarr
    from casmon.store.manifest import PartRef

__all__ = ["Store", "open", "default_store", "default_store_if_open", "FORMAT_VERSION", "Ref", "Manifest",
           "Progress", "install_maintenance"]

DEFAULT_CHUNK = 4 << 20
#: Flush once this many records wait in memory.
RECORDS_MAX = 50_000
#: A pool worker's flush after each call merges tables at most once in this many seconds (a merge costs
#: many requests; the level-0 files a worker writes meanwhile are merged by the next one).
CALL_MERGE_EVERY = 5.0
#: A flush writes a slow record file again (sealed anew) at most this many times in a row, then fails.
LATE_TRIES = 4

#: ``progress(phase, done, total)``, called as maintenance goes.
Progress = Callable[[str, int, int], None]
#: ``hook(store)``, called at the start of every flush.
FlushHook = Callable[["Store"], None]


if TYPE_CHECKING:  # a protocol for the type checker alone: typing is not loaded at run time
    class Maintenance(Protocol):
        """What :meth:`Store.stats`, :meth:`Store.verify` and :meth:`Store.gc` run.

        The maintenance layer (``casmon.maintenance``) implements it and installs
        itself with :func:`install_maintenance`; the store layer, below it, never
        imports it. The reports are the maintenance layer's own types.
        """

        def stats(self, store: Store, progress: Progress | None = None) -> dict[str, Any]: ...
        def verify(self, store: Store, progress: Progress | None = None) -> Any: ...
        def gc(self, store: Store, grace: float = 3600.0, dry_run: bool = False, progress: Progress | None = None,
               break_lock: bool = False) -> Any: ...


_maintenance: Maintenance | None = None


def install_maintenance(impl: Maintenance) -> None:
    """Make ``impl`` what :meth:`Store.stats`, :meth:`Store.verify` and :meth:`Store.gc` call (the last one wins)."""
    global _maintenance
    _maintenance = impl


def _installed_maintenance() -> Maintenance:
    if _maintenance is None:  # the layer above, by name, as a plugin: a program that never verifies never loads it
        __import__("casmon.maintenance")
    if _maintenance is None:
        raise StoreError("casmon's maintenance layer did not install itself: import casmon.maintenance")
    return _maintenance


#: The flush in progress in this thread runs the features' hooks: records they append are written by it.
_in_hooks = _thread._local()


#: A value's write (:mod:`casmon.store.valuewrite`), loaded by the first put: a hit puts none.
_valuewrite: Any = None


def _value_writing() -> Any:
    global _valuewrite
    if _valuewrite is None:
        from casmon.store import valuewrite

        _valuewrite = valuewrite
    return _valuewrite


def _logger() -> logging.Logger:
    """casmon's logger, for what a background thread cannot raise; imported on first use (a hit needs none)."""
    import logging

    return logging.getLogger("casmon")



_reliance_module: Any = None


def _reliance() -> Any:
    """:mod:`casmon.store.reliance`, loaded by the first flush with values to check (a hit's needs none)."""
    global _reliance_module
    if _reliance_module is None:
        from casmon.store import reliance

        _reliance_module = reliance
    return _reliance_module


def _keep_while_waiting(store: Store) -> None:
    from casmon.store import reliance  # a write's and a check's: a hit loads none

    reliance.keep_while_waiting(store)

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
        create: bool = True,
    ) -> None:
        check_options(trust=trust, chunk_size=chunk_size, array_codec=array_codec, codec=codec, autoflush=autoflush,
                      durable=durable, create=create)
        self.backend = backend
        self.trust = trust
        self.chunk_size = int(chunk_size)
        self.array_codec = get_codec(array_codec)
        self.codec = get_codec(codec)
        # Manifests in lz4 (the lz4 package): a fresh process reading one (an array's, a large pickle's) need not
        # import numcodecs, 40-100 ms that its first hit would pay. The digests are of raw bytes: any codec reads.
        self.manifest_codec = self.codec if self.codec.id == 0 else get_codec("lz4")
        self.autoflush = autoflush
        self.durable = durable
        backend.fsync = durable
        self.writer = writer_id()
        self._lock = _thread.RLock()
        self._flush_lock = _thread.allocate_lock()
        self._tables: dict[str, Table] = {}
        self._table_list: tuple[Table, ...] = ()
        self._closed = False
        self._flusher: threading.Thread | None = None
        self._keeper: threading.Thread | None = None
        self._flush_hooks: list[FlushHook] = []
        self._after_flush: list[FlushHook] = []
        self._manifests: dict[Digest, Manifest] = {}  # small manifests, immutable
        self._record_refs: set[bytes] = set()  # digests of values named by records appended since the last seal
        # Values put and not yet named by a record or ref (a running call's arguments): if gc condemns
        # one meanwhile, the next flush copies it, so it is still there when its record is written.
        self._held: dict[Digest, None] = {}
        self._held_lists: frozenset[str] = frozenset()  # the condemned lists _held was checked against
        self.dropped_records = 0  # records a flush could not write because a value they name was gone
        self.late_writes = 0  # record files (and refs) slow enough to be written again (casmon.store.table.fence)
        # Records are flushed before the call that wrote them returns: durable stores, and pool workers.
        self._flush_each_call = lifecycle.flushes_each_call(durable)
        self._flush_warned = False
        self._io_ready = False  # casmon's I/O threads run (see _start_io)
        self._merged_at = 0.0  # when a flush last merged tables (a worker's flush per call merges less often)
        lifecycle.watch_for_pool_child(self)
        self.format = read_format(backend, self.url, create)
        self.objects = ObjectStore(backend, self.writer)
        self._in_flight: set[bytes] = set()  # values the records a flush is writing name (see reliance.keep_while_waiting)
        self._keeping = False
        backend.while_waiting = lambda: _keep_while_waiting(self)
        if not backend.is_local:  # only a remote medium's writes wait (a local folder's bounds load with its first write)
            from casmon.store import condemned

            backend.wait_tick = condemned.VIEW_MAX
        self.objects.index.format_gate = self._format2
        lifecycle.register(self)

    # -- format -------------------------------------------------------------------
    def _format2(self) -> bool:
        """Called before a table writes its first format-2 generation: the marker must say format 2
        first, so an older casmon refuses the store rather than take the new files for damage.
        False (keep writing format 1) while the marker is damaged: ``verify --repair`` writes one."""
        if self.format.get("damaged"):
            return False
        if self.format.get("format", 1) >= 2:
            return True
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
        """Where the store is (a path or a URL), as shown in messages."""
        return self.backend.url

    def __repr__(self) -> str:
        return f"<casmon.Store {self.url!r}{' read-only' if self.read_only else ''}>"

    @property
    def read_only(self) -> bool:
        """True if the store was opened read-only."""
        return self.backend.read_only

    @property
    def closed(self) -> bool:
        """True once :meth:`close` (or :meth:`abandon`) ran: nothing more is written."""
        return self._closed

    @property
    def flush_each_call(self) -> bool:
        """True where what a call writes is flushed before it returns: durable stores, pool workers."""
        return self._flush_each_call

    # -- values -------------------------------------------------------------------
    def put(self, value: Any, mmap: bool = False) -> Digest:
        """Store ``value`` and return its digest. Storing it again costs no space.

        Raises :class:`~casmon.errors.UnpicklableError` (a ``TypeError``) naming
        the part of the value that cannot be stored; nothing is half-written.
        ``mmap``: lay large incompressible arrays out so ``get(mmap=True)`` maps them (:mod:`casmon.store.mapped`).
        """
        return self.put_sized(value, mmap)[0]

    def put_sized(self, value: Any, mmap: bool = False) -> tuple[Digest, int]:
        """:meth:`put`, also returning the value's logical size in bytes."""
        return _value_writing().put_sized(self, value, mmap)  # type: ignore[no-any-return]

    def put_encoded(self, enc: serialize.Encoded, mmap: bool = False) -> Digest:
        """Store a value already encoded (:func:`casmon.store.serialize.encode`, or built by an importer)."""
        return _value_writing().put_encoded(self, enc, mmap)  # type: ignore[no-any-return]

    def _put_part(self, part: serialize.Part) -> PartRef:
        return _value_writing().put_part(self, part)  # type: ignore[no-any-return]

    def manifest(self, digest: Digest | str) -> Manifest:
        """The manifest of a stored value (what it is, how large, which chunks); small ones are kept in memory."""
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

    def get(self, digest: Digest | str, mmap: bool = False) -> Any:
        """A fresh copy of a stored value; :class:`MissingObjectError` if unknown, :class:`DamagedObjectError` if damaged.

        ``mmap``: large arrays put with ``mmap=True`` come back as read-only maps of the stored bytes, checked
        (tensors copy-on-write); anything else, or on a store that is not a local folder, loads as a copy
        (:mod:`casmon.store.mapped`).
        """
        m = self.manifest(digest)
        buffers: list[Any] = []
        if m.parts:  # arrays and large buffers; a small value is its manifest's inline bytes
            from casmon.store import reading

            buffers = reading.read_parts(self, m, mmap)
        enc = serialize.Encoded(m.tag, m.meta, m.inline, children=m.children)
        try:
            return serialize.decode(enc, buffers, load_child=lambda pid: self.get(m.children[pid], mmap), trusted=self.trust)
        except UntrustedStoreError as e:
            raise UntrustedStoreError(f"value {m.digest.hex()} in {self.url}: {e}") from None

    def read_chunk(self, digest: Digest, out: np.ndarray[Any, np.dtype[np.uint8]]) -> None:
        """Read one chunk into ``out``, checked (lazy array views): a large loose one straight into it, not via bytes."""
        self.objects.get_into_many([(digest, out)]) if len(out) >= LOOSE_MIN else self.objects.get(digest, out=out)

    def __contains__(self, digest: object) -> bool:
        try:
            d = Digest(digest)  # type: ignore[arg-type]  # any object may be asked about: Digest refuses what is not one
        except (ValueError, TypeError):
            return False
        return self.objects.contains(d)

    def open_array(self, digest: Digest | str) -> zarr.Array[Any]:
        """A read-only, lazy ``zarr.Array`` over a stored numpy array.

        Reading a slice reads only the chunks it touches.
        """
        from casmon.store.arrayview import open_array

        return open_array(self, self.manifest(digest))

    def zarr(self, consolidated: bool = False) -> Any:
        """This store as a read-only zarr v3 store presenting ``cache/``, ``calls/`` and ``runs/``, read as asked
        for (``consolidated=True``: all read now, in the root's metadata) (:mod:`casmon.store.zarrview`)."""
        from casmon.store.zarrview import open_view

        return open_view(self, consolidated)

    def export_zarr(self, out: str | os.PathLike[str], *what: str) -> Any:
        """Write this store's zarr view (or the runs, functions and entries ``what`` names) as a zarr v3 hierarchy
        at ``out``: a new folder, ``.zip`` or ``s3://`` prefix (:mod:`casmon.store.zarrexport`); an ``Exported``."""
        from casmon.store.zarrexport import export_zarr

        return export_zarr(self, out, *what)

    # -- records ------------------------------------------------------------------
    def table(self, kind: str) -> Table:
        """The table holding the records of ``kind`` (made on first use)."""
        t = self._tables.get(kind)
        if t is None:
            if not is_kind_name(kind):
                raise ValueError(f"record kind must match {KIND_PATTERN}, got {kind!r}")
            with self._lock:
                t = self._tables.get(kind)
                if t is None:
                    t = Table(self.backend, f"records/{kind}/", self.writer)
                    t.format_gate = self._format2
                    t.fenced = True  # a record that lands late is not a record (casmon.store.table.fence)
                    self._tables[kind] = t
                    # A tuple, replaced whole: read without the lock on every write (copying the dict
                    # there could meet another thread's insert, see test_table_scale's snapshot test).
                    self._table_list = tuple(self._tables.values())
        return t

    def record_kinds(self) -> list[str]:
        """Every kind of record in the store, or appended in this process."""
        on_disk = [k.rstrip("/") for k in self.backend.list_dir("records")]
        return sorted(set(on_disk) | set(self._tables))

    def append(self, kind: str, record: dict[str, Any], key: bytes | None = None, refs: Iterable[Digest] = (),
               encoded: str | bytes | list[bytes] | None = None) -> Digest:
        """Add a record; it becomes visible to other processes at the next flush.

        ``refs`` are the digests of values the record needs: gc keeps them.
        ``encoded``: the record already encoded as a JSON object (the call log encodes
        its rows while calls run), used instead of ``record``; text, UTF-8 bytes, or
        pieces of UTF-8 whose concatenation is the object (joined once, here).
        Returns the record's key (random unless given).
        """
        self._check_writable()
        rs = [Digest(r) for r in refs]
        data = encode_record(kind, record, rs, encoded)
        k = Digest(key) if key is not None else Digest(os.urandom(16))
        t = self.table(kind)
        with self._lock:  # one step with respect to a flush sealing the tables
            t.add(k, data)
            if rs:
                self._record_refs.update(map(bytes, rs))  # plain bytes: not walked by the garbage collector
                # Its values stay held (copied if gc condemns them) until the flush that writes the record.
        try:
            if self._flush_each_call and not self.durable:
                self.flush_for_call()
            else:
                self._after_write()
        except BaseException as e:
            # The record is added (it waits for the next flush): a caller that keeps its own copy for a
            # retry must not add it again.
            e.record_added = True  # type: ignore[attr-defined]
            raise
        return k

    def records(self, kind: str, strict: bool = True) -> Iterator[tuple[Digest, dict[str, Any]]]:
        """Every record of ``kind`` from every writer, with its key.

        ``strict`` (the default, what gc and verify need): a damaged table file
        raises :class:`DamagedObjectError`. ``strict=False``: what can be read,
        skipping damaged files and malformed records with one :class:`StoreDamageWarning` each.
        """
        for k, v in self.table(kind).items(strict=strict):
            if strict:
                yield Digest(k), parse_record(kind, k, v)
                continue
            try:
                rec = parse_record(kind, k, v)
            except DamagedObjectError as e:  # one malformed record hides no other (verify names it)
                warn_damage(self.url, e.key, e.reason)
                continue
            yield Digest(k), rec

    def prefetch(self, kinds: Iterable[str]) -> None:
        """List the tables of ``kinds`` that are not listed yet, all at once, on a remote medium: a fresh process's
        first cache hit reads three tables (versions, clears, entries), and waits for one's round trips, not
        three's. A local folder lists each as it is first read. Errors are left to the reads that follow."""
        if self.backend.is_local:
            return
        tables = [t for t in {self.table(k) for k in kinds} if not t.listed]
        if len(tables) < 2:
            return

        def refresh(t: Table) -> None:
            try:
                t.refresh()
            except (CasmonError, OSError):
                pass  # the table is not listed: its first read lists it, and says what is wrong

        import threading  # a thread's: a hit starts none

        started: list[threading.Thread] = []
        for t in tables[1:]:
            th = threading.Thread(target=refresh, args=(t,), name="casmon-prefetch", daemon=True)
            try:
                th.start()
            except RuntimeError:  # the interpreter is exiting: no new thread; the reads list the tables
                break
            started.append(th)
        refresh(tables[0])
        for th in started:
            th.join()

    def lookup(self, kind: str, key: bytes, refresh: bool = True) -> list[dict[str, Any]]:
        """The records of ``kind`` stored under ``key`` (usually one)."""
        k = Digest(key)
        return [parse_record(kind, k, v) for v in self.table(kind).lookup(k, refresh_on_miss=refresh)]

    # -- refs ---------------------------------------------------------------------
    def set_ref(self, name: str, target: Digest | None = None, data: dict[str, Any] | None = None,
                same_target: bool = False) -> None:
        """Point ref ``name`` at ``target`` (replacing what it pointed at). ``same_target``: the ref names ``target``
        already and only its data changes (a heartbeat): no check, the ref held the target all along."""
        from casmon.store import refwrite  # a ref's write: a hit writes none

        refwrite.set_ref(self, name, target, data, same_target)

    def create_ref(self, name: str, target: Digest | None = None, data: dict[str, Any] | None = None) -> bool:
        """Create ref ``name`` unless it exists; True if this call created it.

        Safe between processes on backends with a race-free create (local
        folders, object stores with conditional writes).
        """
        from casmon.store import refwrite

        return refwrite.create_ref(self, name, target, data)

    def get_ref(self, name: str) -> Ref | None:
        """Ref ``name``, or None if there is none."""
        key = ref_key(name)
        data = self.backend.get(key)
        if data is None:
            return None
        return decode_ref(name, key, data)

    def refs(self, prefix: str = "") -> list[str]:
        """The names of the refs under ``prefix``, sorted (a file there whose name no ref has is no ref)."""
        base = "refs/" + (prefix.strip("/") + "/" if prefix else "")
        return sorted(n for n in (k[len("refs/") :] for k in self.backend.list(base) if ".partial" not in k)
                      if is_ref_name(n))

    def delete_ref(self, name: str) -> None:
        """Remove ref ``name`` (what it pointed at stays until gc finds nothing else reaches it)."""
        self._check_writable()
        self.backend.delete(ref_key(name))

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
            self.start_flusher()
        if self._keeper is None and self._held:
            if self.autoflush is None or self.autoflush > gc_bounds().VIEW_MAX:
                self._start_keeper()

    def _start_io(self) -> None:
        """Start casmon's I/O threads at the first write, if reads have not: the exit flush needs them,
        and Python 3.12 refuses to start a thread while the interpreter exits (a process that read a
        local folder without them and wrote only at exit lost its writes)."""
        if not self.backend.is_local:  # a local folder is written in the calling thread
            from casmon.store.backend import loop

            loop.get_loop()
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
                warnings.warn(f"casmon: could not flush {self.url} in this worker process: {e}; what was not written "
                              "waits for the next flush, and is lost if the pool ends this process first",
                              RuntimeWarning, stacklevel=3)
        else:
            self._after_write()  # the background flusher still writes what no call flushes (hit counts)
        finally:
            _in_hooks.call = False

    def start_flusher(self) -> None:
        """Start the thread that flushes every ``autoflush`` seconds, unless it runs (or the process exits)."""
        with self._lock:
            if self._flusher is not None or lifecycle.exiting():
                return
            ref = weak_ref(self)
            interval = self.autoflush
            stop = lifecycle.stop_flushers

            def loop() -> None:
                while not stop.wait(interval):
                    s = ref()
                    if s is None or s._closed:
                        return
                    try:
                        s.flush()
                    except Exception as e:  # noqa: BLE001 - keep pending, retry next round
                        if not stop.is_set():
                            _logger().warning("background flush of %s failed: %s", s.url, e)
                    del s

            # Not a daemon where the exit hook can stop it: a daemon thread still flushing (or
            # writing a warning) while the interpreter tears down can abort the process.
            import threading

            lifecycle.exit_flush_before_threads()  # before a thread that only the exit flush stops
            if lifecycle.exiting():  # too late to hook it: each write flushes itself (see lifecycle)
                return
            self._flusher = threading.Thread(target=loop, name="casmon-flush", daemon=not lifecycle.exit_hook_stops_threads)
            self._flusher.start()

    def _start_keeper(self) -> None:
        """Keep held values from gc while no flush runs for longer than ``VIEW_MAX`` (``autoflush=None``, or
        a long one): :func:`casmon.store.reliance.start_keeper`."""
        from casmon.store import reliance

        reliance.start_keeper(self)

    def flush(self) -> None:
        """Make everything written so far visible to other processes.

        Order: set the waiting records aside (*seal*); check that every value
        they name is stored and safe from gc (see :mod:`casmon.store.condemned`); write
        the waiting small objects (one pack) and the pack's index entries; then
        the records. So a record is never visible before the values it names.
        If a step fails, what was not written stays waiting for the next flush
        and the error is raised.
        """
        faultpoints = fault_points()
        if self.read_only:
            return
        # A hook moves a feature's waiting rows into a record: Ctrl-C in the middle would lose them.
        with lifecycle.signals_deferred():
            nested, _in_hooks.on = getattr(_in_hooks, "on", False), True  # a hook's record is written by this flush
            try:
                for hook in list(self._flush_hooks):
                    try:
                        hook(self)
                    except Exception as e:  # noqa: BLE001 - a feature's bookkeeping must not stop a flush
                        _logger().warning("flush hook %r failed: %s", hook, e)
            finally:
                _in_hooks.on = nested
        with self._flush_lock:
            refs: set[bytes] = set()  # plain bytes, as appended
            try:
                with lifecycle.signals_deferred(), self._lock:  # no record is added while the tables are sealed
                    tables = list(self._tables.items())
                    for _kind, t in tables:
                        t.seal()
                    refs, self._record_refs = self._record_refs, set()
                faultpoints.point("flush.sealed")
                self._in_flight = refs
                sealed_at = time.monotonic()
                # The checks' module loads only where there is something to check: a hit's exit flush (one
                # usage record, naming no value, nothing waiting) loads none.
                stale = {Digest.from_raw(d) for d in refs if _reliance().needs_check(self, d)} if refs else set()
                bad = _reliance().check_values(self, stale) if stale else set()
                if self.objects.pending_bytes:
                    bad |= _reliance().check_pending_values(self)
                if bad:
                    _reliance().drop_records_needing(self, bad, tables)
                self._write_objects()
                faultpoints.point("flush.after_index")
                from casmon.store import condemned  # gc's time bounds: no part of a hit

                for kind, t in tables:
                    again = t.sealed() and time.monotonic() - sealed_at > condemned.WRITE_MAX
                    for _attempt in range(LATE_TRIES):
                        if again:
                            # Slow (a retried network write, a stopped process), or a record write slow enough
                            # that a gc may fence it: check the values again, under a fresh view.
                            bad = _reliance().check_values(self, refs_of(t), force=True)
                            if bad:
                                _reliance().drop_records_needing(self, bad, [(kind, t)])
                            self._write_objects()
                            t.reseal()  # checked just now: sealed now (casmon.store.table.fence)
                        try:
                            t.write_sealed()
                            faultpoints.point("flush.table_written")
                            break
                        except LateWrite as late:
                            self.late_writes += 1
                            _logger().info("%s was slow to write; written again", late)
                            again = True
                    else:
                        raise StoreError(f"cannot write to store {self.url}: writing record files took longer than "
                                         f"{condemned.LATE_MAX / 2:g} s {LATE_TRIES} times in a row; they are "
                                         f"written again at the next flush")
                faultpoints.point("flush.after_records")
                self._in_flight = set()
                if refs and self._held:
                    held = self._held  # written: the records hold their values now
                    for r in refs:
                        held.pop(Digest.from_raw(r), None)
                if not getattr(_in_hooks, "call", False) or time.monotonic() - self._merged_at >= CALL_MERGE_EVERY:
                    self._merged_at = time.monotonic()  # a worker's flush per call merges at most this often
                    try:
                        self._merge_tables()
                    except (OSError, CasmonError) as e:  # a merge only tidies: everything is written; a later flush merges
                        _logger().info("casmon: %s: tables not merged now: %s", self.url, e)
            except BaseException as e:
                self._in_flight = set()
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
                _reliance().protect_held(self)
            except Exception:  # noqa: BLE001 - the next flush looks again; the seal check still guards
                pass
        if self._after_flush and not getattr(_in_hooks, "after", False):
            _in_hooks.after = True  # a callback's own flush does not call the callbacks again
            try:
                for cb in list(self._after_flush):
                    try:
                        cb(self)
                    except Exception as e:  # noqa: BLE001 - a feature's retry must not fail the flush that worked
                        _logger().warning("after-flush callback %r failed: %s", cb, e)
            finally:
                _in_hooks.after = False

    def _merge_tables(self) -> None:
        """Merge tables that have many files, holding the store lock (skipped when gc or another merge has it)."""
        merges = [t for t in [self.objects.index, *self._tables.values()] if t.wants_merge()]
        if not merges or not self.backend.supports_deletes:
            return
        from casmon.store.lock import StoreLock  # a merge's first use: opening and reading never take it

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

    def add_flush_hook(self, hook: FlushHook) -> None:
        """Call ``hook(store)`` at the start of every flush (features add their bookkeeping records)."""
        self._flush_hooks.append(hook)

    def remove_flush_hook(self, hook: FlushHook) -> None:
        """Stop calling ``hook`` (a feature whose bookkeeping is done: a run that ended)."""
        self._flush_hooks[:] = [h for h in self._flush_hooks if h != hook]

    def add_after_flush(self, callback: FlushHook) -> None:
        """Call ``callback(store)`` after every flush that wrote everything (features write again what an
        earlier flush could not: a run's end while the store was away). Added once per callback."""
        if callback not in self._after_flush:
            self._after_flush.append(callback)

    def close(self) -> None:
        """Flush and stop using the store."""
        if self._closed:
            return
        try:
            self.flush()
        finally:
            self._closed = True
            lifecycle.forget(self)
            if self.backend.needs_close:
                self.backend.close()

    def abandon(self) -> None:
        """Stop using the store without flushing: what it holds pending is dropped (its location was deleted)."""
        self._closed = True
        lifecycle.forget(self)

    def forget_manifests(self) -> None:
        """Drop the manifests kept in memory (repair rewrote the index: read them from the store again)."""
        self._manifests.clear()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _reset_after_fork(self) -> None:  # the parent flushes what it had pending; the child is a new writer
        self.writer = writer_id()
        self._flush_each_call = lifecycle.flushes_each_call(self.durable)  # multiprocessing's child: set again at its start
        self._io_ready = False  # the parent's threads do not exist here
        self._flusher = None  # the parent's thread does not exist here
        self._keeper = None
        self._flush_lock = _thread.allocate_lock()
        self._lock = _thread.RLock()
        self.objects = ObjectStore(self.backend, self.writer)
        self._tables = {}
        self._table_list = ()
        self._flush_hooks = []
        # The values the parent's waiting records name, and those it holds, are the parent's to write:
        # checked here they look lost, and a child would warn that gc removed them.
        self._record_refs = set()
        self._held = {}
        self._held_lists = frozenset()

    # -- maintenance (the layer above, installed: see Maintenance) -----------------
    def stats(self, progress: Progress | None = None) -> dict[str, Any]:
        """Counts and sizes: values, chunks, bytes, dedup ratio, files."""
        return _installed_maintenance().stats(self, progress)

    def verify(self, progress: Progress | None = None) -> Any:
        """Re-hash every object; report what is damaged or missing and what depends on it.

        What this store object wrote and has not flushed is flushed first: its records would name values
        not yet stored, and it is what the caller means to check."""
        if not self.read_only and not self._closed:
            try:
                self.flush()
            except (CasmonError, OSError):  # verify reports on what is stored; what could not be written stays pending
                pass
        return _installed_maintenance().verify(self, progress)

    def gc(self, grace: float = 3600.0, dry_run: bool = False, progress: Progress | None = None,
           break_lock: bool = False) -> Any:
        """Remove what no record or ref reaches (condemned at least ``grace`` seconds ago); repack sparse packs."""
        return _installed_maintenance().gc(self, grace=grace, dry_run=dry_run, progress=progress, break_lock=break_lock)


def open(
    location: Any = None,
    *,
    read_only: bool = False,
    trust: bool = True,
    storage_options: dict[str, Any] | None = None,
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
    check_options(read_only=read_only, trust=trust, create=create, **options)  # before anything is created
    if storage_options and not (isinstance(location, str) and "://" in location
                                and not location.startswith(("memory://", "file://", "zip://"))):
        raise ValueError(f"storage_options apply to remote stores (s3://, gs://, az://, other URLs), "
                         f"not to {location if location is not None else 'the default folder'}")
    backend = open_backend(location, read_only=read_only, storage_options=storage_options, create=create,
                           probe=FORMAT_KEY)
    try:
        return Store(backend, trust=trust, create=create, **options)
    except BaseException:
        backend.close()
        raise


def check_options(**options: Any) -> None:
    """Refuse an option of the wrong kind at open, naming it: a string where a bool belongs is true (``trust="no"``
    would unpickle), and a bad number fails later in a thread (``autoflush=-1`` flushes in a tight loop)."""
    for name, v in options.items():
        if name in ("trust", "read_only", "create", "durable"):
            if not isinstance(v, bool):
                raise TypeError(f"{name} must be True or False, got {v!r}")
        elif name == "chunk_size":
            if isinstance(v, bool) or not hasattr(type(v), "__index__"):
                raise TypeError(f"chunk_size must be a whole number of bytes, got {v!r}")
            if not 4096 <= v <= serialize.MAX_CHUNK:
                raise ValueError(f"chunk_size must be between 4096 bytes and {serialize.MAX_CHUNK} (1 GiB), got {v}")
        elif name in ("codec", "array_codec"):
            try:
                get_codec(v)
            except (ValueError, TypeError):
                raise ValueError(f"{name}: unknown codec {v!r}; choose one of {', '.join(CODECS)}") from None
        elif name == "autoflush":
            if v is not None and (isinstance(v, (bool, str, bytes)) or not hasattr(type(v), "__float__")
                                  or not 0 < float(v) <= MAX_SECONDS):  # a longer wait overflows the clock
                raise ValueError(f"autoflush must be a number of seconds over 0, or None (flush at close and "
                                 f"exit only), got {v!r}")
        else:
            raise TypeError(f"unknown option {name}={v!r}: casmon.open takes read_only, trust, storage_options, create, "
                            f"chunk_size, array_codec, codec, autoflush and durable")


_default: dict[tuple[int, str], Store] = {}
_default_lock = _thread.allocate_lock()


def _default_key(location: Any) -> tuple[int, Any]:
    """The key of the default store at ``location`` in this process: a local path is made absolute."""
    if location is None:
        location = os.environ.get("CASMON_STORE") or ".casmon"
    if isinstance(location, (str, os.PathLike)) and "://" not in str(location):
        location = os.path.abspath(os.fspath(location))
    return os.getpid(), location


def default_store(location: Any = None, create: bool = True) -> Store:
    """The store features use when none is given, opened on first use and shared in the process.

    ``location`` defaults to ``$CASMON_STORE``, then ``./.casmon`` (resolved
    against the working directory at first use). A :class:`Store` passes through.
    ``create=False`` (readers such as ``casmon.load``): a store not open in this
    process must exist; nothing is created at a mistyped path.
    """
    if isinstance(location, Store):
        return location
    pid, location = _default_key(location)
    key = (pid, str(location))
    s = _default.get(key)
    if s is not None and not s._closed:
        return s
    with _default_lock:
        s = _default.get(key)
        if s is None or s._closed:
            s = open(location, create=create)
            _default[key] = s
    return s


def default_store_if_open(location: Any = None) -> Store | None:
    """The store :func:`default_store` would return for ``location`` if this process opened it already, else
    None; never opens or creates one (a caller that only asks whether something was written)."""
    pid, location = _default_key(location)
    return _default.get((pid, str(location)))
keep_flat_names([Store])  # pickles and keys name it where it was before the packages (casmon/keys/names.py)
