"""Backends: synchronous access to any zarr v3 store.

zarr's :class:`zarr.abc.store.Store` is asynchronous. casmon's features are
synchronous, so a :class:`Backend` drives the zarr store from one event loop
running on a daemon thread of casmon's own (zarr's private ``sync`` helper is
not used). One loop per process: after a ``fork`` the child starts a new loop
and re-opens stores whose clients are bound to the parent's loop.

A local folder is the exception: :class:`LocalFolder` keeps zarr's ``LocalStore``
layout and write protocol, and the backend serves it with plain system calls in
the calling thread (no zarr import, no event loop).

``open_backend(location)`` maps a location to a zarr store:

=====================  ==========================================
``None`` / a path      :class:`LocalFolder` (default ``./.casmon``), laid out as ``LocalStore``
``memory://[name]``    ``MemoryStore``; the same name is the same store in a process
``*.zip``              ``ZipStore`` (one writer at a time; nothing is ever deleted)
``s3://``, ``gs://``,   ``ObjectStore`` (obstore): conditional puts make create-if-absent race-free;
``az://``              credentials from the environment or ``storage_options``
other URLs             ``FsspecStore.from_url`` (its create-if-absent is check-then-set: one writer at a time)
a ``Store`` instance   used as it is
=====================  ==========================================
"""

from __future__ import annotations

import os
import re
import threading
import uuid
from collections.abc import Callable, Coroutine, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from casmon import faultpoints
from casmon.errors import CasmonError, StoreError

if TYPE_CHECKING:
    import asyncio

    from zarr.abc.store import Store as ZarrStore
    from zarr.buffer.cpu import Buffer

# zarr (a third of a second to import) and asyncio are imported when the first store is opened,
# not with casmon: a module that only decorates functions with @casmon.cache or @casmon.intercept
# pays for them at its first call that needs a store. _load_zarr() binds these names.
RangeByteRequest = ZarrStore = default_buffer_prototype = Buffer = LocalStore = MemoryStore = ZipStore = None
_zarr_loaded = False


def _load_zarr() -> None:
    """Import zarr and asyncio and bind the names this module uses (once; thread-safe by the import lock)."""
    global asyncio, RangeByteRequest, ZarrStore, default_buffer_prototype, Buffer, LocalStore, MemoryStore, ZipStore
    global _zarr_loaded
    if _zarr_loaded:
        return
    import asyncio as _asyncio

    from zarr.abc.store import RangeByteRequest as _RBR, Store as _ZS
    from zarr.buffer import default_buffer_prototype as _dbp
    from zarr.buffer.cpu import Buffer as _Buf
    from zarr.storage import LocalStore as _LS, MemoryStore as _MS, ZipStore as _ZpS

    asyncio, RangeByteRequest, ZarrStore, default_buffer_prototype = _asyncio, _RBR, _ZS, _dbp
    Buffer, LocalStore, MemoryStore, ZipStore = _Buf, _LS, _MS, _ZpS
    _zarr_loaded = True

__all__ = ["Backend", "LocalFolder", "open_backend", "run"]

T = TypeVar("T")

DEFAULT_PATH = ".casmon"


class _Loop:
    """An asyncio loop on a daemon thread, created on first use, per process."""

    _lock = threading.Lock()
    _loop: asyncio.AbstractEventLoop | None = None
    _pid: int = 0

    #: Worker threads for blocking I/O (zarr's LocalStore uses asyncio.to_thread).
    WORKERS = 8

    @classmethod
    def get(cls) -> asyncio.AbstractEventLoop:
        loop = cls._loop
        if loop is not None and cls._pid == os.getpid():
            return loop
        _load_zarr()
        with cls._lock:
            if cls._loop is None or cls._pid != os.getpid():
                loop = asyncio.new_event_loop()
                loop.set_default_executor(_started_executor(cls.WORKERS))
                t = threading.Thread(target=loop.run_forever, name="casmon-io", daemon=True)
                t.start()
                cls._loop, cls._pid, cls._thread = loop, os.getpid(), t
            return cls._loop

    @classmethod
    def shutdown(cls) -> None:
        """Stop the loop at interpreter exit, after the last flush.

        Clients with threads of their own (obstore's runtime) must not call back
        into a loop that Python is tearing down.
        """
        with cls._lock:
            loop, thread = cls._loop, getattr(cls, "_thread", None)
            if loop is None or cls._pid != os.getpid():
                return
            cls._loop = None

        async def drain() -> None:
            # Writes still under way (their waiter was interrupted by Ctrl-C) finish -- each is a
            # create-if-absent of a content-addressed object -- instead of being destroyed pending.
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            if tasks:
                await asyncio.wait(tasks, timeout=10)
                for t in tasks:
                    t.cancel()

        try:
            asyncio.run_coroutine_threadsafe(drain(), loop).result(timeout=15)
        except Exception:  # noqa: BLE001 - stopping the loop matters more than draining it
            pass
        loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join(timeout=5)
        if (thread is None or not thread.is_alive()) and not _remote_clients:
            # Closed here, not left to the loop's __del__: at teardown that can run after its
            # self-pipe socket was collected, and print a traceback ("Invalid file descriptor: -1").
            # Not where a remote client (obstore's runtime, fsspec) ran: its threads may still call
            # back into the loop, which a stopped loop tolerates and a closed one does not.
            try:
                loop.close()
            except Exception:  # noqa: BLE001 - exiting anyway
                pass


def _started_executor(n: int) -> ThreadPoolExecutor:
    """A thread pool whose threads all exist already.

    Python 3.12 refuses to start threads while the interpreter shuts down, and
    the flush at exit still needs file I/O; a pool that never has to grow keeps
    working then.
    """
    ex = ThreadPoolExecutor(max_workers=n, thread_name_prefix="casmon-io-worker")
    barrier = threading.Barrier(n + 1)
    for _ in range(n):
        ex.submit(barrier.wait)  # each waits for the others, so the pool starts n threads
    barrier.wait()
    return ex


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine on casmon's loop and wait for its result."""
    loop = _Loop.get()
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:  # pragma: no cover - would deadlock
        raise RuntimeError("casmon's synchronous API was called from its own I/O thread")
    return asyncio.run_coroutine_threadsafe(coro, loop).result()


async def _gather_limited(coros: Iterable[Coroutine], limit: int) -> list:
    sem = asyncio.Semaphore(limit)

    async def one(c):
        async with sem:
            return await c

    return await asyncio.gather(*(one(c) for c in coros))


_PREAD = hasattr(os, "pread")  # not on Windows
#: Files a local backend keeps open for :meth:`Backend.read_kept` (a table's bucket files): ``open`` and
#: ``close`` cost 3x a block's ``pread``. Few, so a user's own files never run short of descriptors.
KEEP_OPEN = 48


#: Bumped in a forked child: descriptors kept before the fork are not trusted there.
_fork_gen = 0


def _forked() -> None:
    global _fork_gen
    _fork_gen += 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


class _OpenFile:
    """A descriptor kept open for reads, and the file's size then (a file kept is never rewritten).

    It is closed when the last reference goes, never while a thread that took it from the cache
    still reads through it: a descriptor closed under a reader could be reused by another ``open``
    meanwhile, and the read would return another file's bytes. Not in a forked child: a child that
    daemonizes closes every descriptor and opens its own, which may get the same numbers (found by
    an attack: the child read its own file as a bucket, and a later close would have closed it).
    """

    __slots__ = ("fd", "size", "gen")

    def __init__(self, fd: int) -> None:
        self.fd, self.gen = fd, _fork_gen
        try:
            self.size = os.fstat(fd).st_size
        except OSError:
            os.close(fd)
            raise

    def __del__(self) -> None:
        if self.gen != _fork_gen:
            return  # the parent's number: in this child it may be somebody else's file
        try:
            os.close(self.fd)
        except OSError:
            pass


def _np(buf: Buffer | None):
    return None if buf is None else buf.as_numpy_array()


class LocalFolder:
    """A store in a local folder, laid out exactly as zarr's ``LocalStore`` lays it out (each key a
    file under ``root``, written through a ``*.partial`` file), and served without zarr.

    :class:`Backend` reads and writes it with plain system calls in the calling thread: no event
    loop, no thread hops, and no zarr import (a third of a second, and 40 ms at interpreter exit).
    The folder stays a valid zarr store; a ``LocalStore`` passed in is served the same way.
    """

    supports_deletes = True

    def __init__(self, root: Path, read_only: bool = False) -> None:
        self.root = Path(root)
        self.read_only = read_only

    def close(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"file://{self.root}"


class Backend:
    """Synchronous key/value access to one zarr store.

    Values come back as read-only ``numpy.uint8`` arrays (no copy); values go in
    as any bytes-like object. All keys are relative, ``/``-separated.
    """

    def __init__(self, zstore: ZarrStore | LocalFolder, url: str, reopen: Callable[[], ZarrStore] | None = None,
                 concurrency: int = 16) -> None:
        if not isinstance(zstore, LocalFolder):
            _load_zarr()
        self.zstore = zstore
        self.url = url
        self._reopen = reopen
        self._pid = os.getpid()
        self.concurrency = concurrency
        self._proto = default_buffer_prototype() if _zarr_loaded else None
        self.requests = 0  # operations sent to the store (a batch counts each key), for benchmarks
        # A local folder is read and written in the calling thread: a table lookup is one small read,
        # and a round trip through the event loop (two thread hops) would cost more than the read itself.
        local = isinstance(zstore, LocalFolder) or (LocalStore is not None and isinstance(zstore, LocalStore))
        self._root = str(zstore.root) if local else None
        self._made_dirs: set[str] = set()  # folders known to exist (a write need not make them again)
        self._kept: dict[str, _OpenFile] = {}  # key -> open file, least recently used first
        self._kept_lock = threading.Lock()

    # -- lifecycle -------------------------------------------------------------
    def _call(self, coro, n: int = 1):
        """Run one operation; errors that are not about a local file become a :class:`StoreError`."""
        self.requests += n
        try:
            return run(coro)
        except (OSError, CasmonError, ValueError, TypeError, KeyError):
            raise
        except Exception as e:  # noqa: BLE001 - e.g. obstore's errors: name the store, keep the cause
            raise StoreError(f"{self.url}: {_short_error(e)}") from e

    def _z(self) -> ZarrStore:
        if self._pid != os.getpid():
            # Forked: clients bound to the parent's loop cannot be used here.
            if self._reopen is not None:
                self.zstore = self._reopen()
            self._pid = os.getpid()
        return self.zstore

    @property
    def read_only(self) -> bool:
        return bool(self.zstore.read_only)

    def _is_zip(self) -> bool:
        return ZipStore is not None and isinstance(self.zstore, ZipStore)

    @property
    def supports_deletes(self) -> bool:
        return bool(self.zstore.supports_deletes) and not self._is_zip()

    @property
    def needs_close(self) -> bool:
        """A zip file must be closed for its entries to be readable by others."""
        return self._is_zip() and not self.read_only

    @property
    def is_local(self) -> bool:
        return self._root is not None

    @property
    def local_root(self) -> Path | None:
        return Path(self._root) if self._root is not None else None

    def close(self) -> None:
        self.forget("")
        try:
            self.zstore.close()
        except Exception:  # noqa: BLE001 - closing is best effort
            pass

    # -- reads -------------------------------------------------------------------
    def get(self, key: str):
        if self._root is not None:
            return self._read_local(key, 0, None)
        z = self._z()
        return _np(self._call(z.get(key, self._proto)))

    def _read_local(self, key: str, start: int, end: int | None):
        """A local file's bytes ``[start, end)`` (None: to its end), read in this thread; None if it is absent."""
        import numpy as np

        self.requests += 1
        path = os.path.join(self._root, key)
        try:
            if _PREAD:  # open, pread, close: the fewest system calls
                fd = os.open(path, os.O_RDONLY)
                try:
                    size = os.fstat(fd).st_size  # never read (allocate) past the end, whatever was asked
                    end = size if end is None else min(end, size)
                    parts, pos = [], start
                    while pos < end:
                        part = os.pread(fd, min(end - pos, 1 << 30), pos)
                        if not part:
                            break
                        parts.append(part)
                        pos += len(part)
                    data = parts[0] if len(parts) == 1 else b"".join(parts)
                finally:
                    os.close(fd)
            else:
                with open(path, "rb") as f:
                    f.seek(start)
                    data = f.read() if end is None else f.read(max(0, end - start))
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None
        return np.frombuffer(data, dtype=np.uint8)

    def read_kept(self, key: str, start: int, end: int):
        """Bytes ``[start, end)`` of a file that is written once and never rewritten (a table's bucket
        file); None if it is absent. A local file stays open between reads (:data:`KEEP_OPEN` files,
        least recently used closed first), so a read is one ``pread``. A kept file deleted meanwhile
        still reads as it was written, which is what it holds; :meth:`forget` closes it."""
        if self._root is None or not _PREAD:
            return self.get_range(key, start, end)
        self.requests += 1
        kept = self._kept
        f = kept.get(key)
        if f is not None and f.gen != _fork_gen:  # kept by the parent of this forked process
            with self._kept_lock:
                self._kept = kept = {}
            f = None
        if f is None:
            try:
                f = _OpenFile(os.open(os.path.join(self._root, key), os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)))
            except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
                return None
            except OSError:  # e.g. out of descriptors: read it the ordinary way
                return self._read_local(key, start, end)
            with self._kept_lock:
                kept[key] = f
                while len(kept) > KEEP_OPEN:
                    del kept[next(iter(kept))]
        elif len(kept) > KEEP_OPEN // 2:  # near full: keep the order of use (a dict's is insertion order)
            with self._kept_lock:
                if kept.pop(key, None) is not None:
                    kept[key] = f
        # Never past the end: a crafted manifest could ask for 4 GiB, which pread would allocate first.
        # A short read is what the caller's frame check then reports as damage.
        end = min(end, f.size)
        return os.pread(f.fd, end - start, start) if end > start else b""

    def forget(self, prefix: str) -> None:
        """Close kept files whose keys start with ``prefix`` (a generation merged away)."""
        with self._kept_lock:
            for k in [k for k in self._kept if k.startswith(prefix)]:
                del self._kept[k]

    def get_range(self, key: str, start: int, end: int):
        if self._root is not None:
            return self._read_local(key, start, end)
        z = self._z()
        return _np(self._call(z.get(key, self._proto, byte_range=RangeByteRequest(start, end))))

    def get_many(self, keys: list[str]) -> list:
        if self._root is not None:
            return [self._read_local(k, 0, None) for k in keys]
        z = self._z()

        async def go():
            return await _gather_limited((z.get(k, self._proto) for k in keys), self.concurrency)

        return [_np(b) for b in self._call(go(), len(keys))]

    def get_ranges(self, requests: list[tuple[str, int, int]]) -> list:
        if self._root is not None:
            return [self._read_local(k, st, e) for k, st, e in requests]
        z = self._z()

        async def go():
            return await _gather_limited(
                (z.get(k, self._proto, byte_range=RangeByteRequest(s, e)) for k, s, e in requests), self.concurrency
            )

        return [_np(b) for b in self._call(go(), len(requests))]

    def exists(self, key: str) -> bool:
        if self._root is not None:
            self.requests += 1
            return os.path.isfile(os.path.join(self._root, key))
        return self._call(self._z().exists(key))

    def exists_many(self, keys: list[str]) -> list[bool]:
        if self._root is not None:
            return [self.exists(k) for k in keys]
        z = self._z()

        async def go():
            return await _gather_limited((z.exists(k) for k in keys), self.concurrency)

        return self._call(go(), len(keys))

    def getsize(self, key: str) -> int:
        if self._root is not None:
            self.requests += 1
            return os.path.getsize(os.path.join(self._root, key))
        return self._call(self._z().getsize(key))

    def getsize_many(self, keys: list[str]) -> list[int]:
        if self._root is not None:
            out = []
            for k in keys:
                try:
                    out.append(self.getsize(k))
                except (FileNotFoundError, NotADirectoryError):
                    out.append(0)
            return out
        z = self._z()

        async def one(k):
            try:
                return await z.getsize(k)
            except FileNotFoundError:
                return 0

        async def go():
            return await _gather_limited((one(k) for k in keys), self.concurrency)

        return self._call(go(), len(keys))

    def list(self, prefix: str) -> list[str]:
        """Every key under ``prefix`` (a folder, ending in ``/``)."""
        if self._root is not None:  # as zarr's LocalStore lists, without starting the event loop
            self.requests += 1
            top = os.path.join(self._root, prefix.rstrip("/"))
            out = []
            for folder, _dirs, files in os.walk(top):
                rel = os.path.relpath(folder, self._root).replace(os.sep, "/")
                out.extend(f"{rel}/{f}" if rel != "." else f for f in files)
            return out
        z = self._z()

        async def go():
            return [k async for k in z.list_prefix(prefix)]

        return self._call(go())

    def list_dir(self, prefix: str) -> list[str]:
        if self._root is not None:  # what LocalStore.list_dir yields: the names of files and folders
            self.requests += 1
            try:
                return os.listdir(os.path.join(self._root, prefix))
            except (FileNotFoundError, NotADirectoryError):
                return []
        z = self._z()

        async def go():
            return [k async for k in z.list_dir(prefix)]

        return self._call(go())

    # -- writes ------------------------------------------------------------------
    #: fsync every file written (and its folder) before a write returns; local folders only.
    fsync = False

    def sync(self, keys) -> None:
        """fsync files and their folders, so a power loss cannot take back what was written."""
        root = self.local_root
        if root is None or not self.fsync:
            return
        dirs = set()
        for key in keys:
            path = root / key
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                continue
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            dirs.add(path.parent)
        for d in dirs:
            try:
                fd = os.open(d, os.O_RDONLY)
            except OSError:
                continue
            try:
                os.fsync(fd)
            except OSError:
                pass
            finally:
                os.close(fd)

    def _write_local(self, key: str, parts, exclusive: bool) -> None:
        """What zarr's ``LocalStore`` does for ``set`` (``exclusive=False``: write ``*.partial``,
        rename over) and ``set_if_not_exists`` (``True``: write ``*.partial``, ``os.link`` it into
        place, which fails if the key exists; race-free across processes), in this thread."""
        if self.zstore.read_only:
            raise ValueError("store was opened in read-only mode")  # zarr's words
        self.requests += 1
        path = os.path.join(self._root, key)
        folder = os.path.dirname(path)
        if folder not in self._made_dirs:
            os.makedirs(folder, exist_ok=True)
            self._made_dirs.add(folder)
        for attempt in range(3):
            try:
                self._write_file(path, folder, parts, exclusive)
                return
            except FileNotFoundError:
                # The *.partial file (or its folder) vanished before it was linked into place: gc
                # removes old temp files of killed writers, and this writer may have been stalled.
                # The bytes are still here: write them again.
                if attempt == 2:
                    raise
                self._made_dirs.discard(folder)

    @staticmethod
    def _write_file(path: str, folder: str, parts, exclusive: bool) -> None:
        tmp = f"{path}.{uuid.uuid4().hex}.partial"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
        try:
            fd = os.open(tmp, flags, 0o666)
        except FileNotFoundError:  # the folder was removed meanwhile (gc, a user): make it again
            os.makedirs(folder, exist_ok=True)
            fd = os.open(tmp, flags, 0o666)
        try:
            try:
                for part in parts:
                    mv = memoryview(part)
                    if mv.ndim != 1 or mv.format not in ("B", "b", "c"):
                        mv = mv.cast("B")
                    off, n = 0, mv.nbytes
                    while off < n:
                        off += os.write(fd, mv[off : off + (1 << 30)])
            finally:
                os.close(fd)
            faultpoints.point("local.partial_written")
            if exclusive:
                try:
                    os.link(tmp, path)
                except FileExistsError:
                    pass  # someone wrote it first; create-if-absent leaves it
            else:
                os.replace(tmp, path)
                tmp = None
        finally:
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except FileNotFoundError:
                    pass

    def set(self, key: str, data) -> None:
        if self._root is not None:
            self._write_local(key, (data,), exclusive=False)
        else:
            self._call(self._z().set(key, Buffer.from_bytes(data)))
        self.sync([key])

    def create(self, key: str, data) -> None:
        """Write ``key`` unless it exists. Content-addressed writers do not care who won."""
        if self._root is not None:
            self._write_local(key, (data,), exclusive=True)
        else:
            self._call(self._z().set_if_not_exists(key, Buffer.from_bytes(data)))
        self.sync([key])

    def create_async(self, key: str, data):
        """Start a create and return a ``concurrent.futures.Future`` for it (on a local folder,
        done by the time it returns)."""
        if self._root is not None:
            from concurrent.futures import Future

            fut: Future = Future()
            try:
                self.create(key, data)
                fut.set_result(None)
            except BaseException as e:  # noqa: BLE001 - the caller's result() raises it
                fut.set_exception(e)
            return fut
        z = self._z()
        self.requests += 1
        return asyncio.run_coroutine_threadsafe(z.set_if_not_exists(key, Buffer.from_bytes(data)), _Loop.get())

    def local_path(self, key: str) -> Path | None:
        """The file behind ``key`` in a writable-or-not local folder store, else None.

        Large chunks are read straight into their destination buffer through it
        (no intermediate bytes object), from any thread, without the event loop.
        """
        root = self.local_root
        return None if root is None else root / key

    def create_frame(self, key: str, header: bytes, payload) -> None:
        """:meth:`create` of ``header + payload`` without joining them (a large raw chunk is not copied).

        Safe to call from any thread. On a local folder it does what zarr's
        ``LocalStore.set_if_not_exists`` does -- write a ``*.partial`` file, then
        ``os.link`` it into place (create-if-absent) -- with two writes and no
        event loop; elsewhere it joins the two and calls :meth:`create`.
        """
        if self._root is None or self.read_only:
            self.create(key, header + payload)
            return
        self._write_local(key, (header, payload), exclusive=True)
        self.sync([key])

    def create_many(self, items: list[tuple[str, Any]]) -> None:
        if self._root is not None:
            for k, d in items:
                self._write_local(k, (d,), exclusive=True)
            self.sync([k for k, _ in items])
            return
        z = self._z()

        async def go():
            return await _gather_limited(
                (z.set_if_not_exists(k, Buffer.from_bytes(d)) for k, d in items), self.concurrency
            )

        self._call(go(), len(items))
        self.sync([k for k, _ in items])

    def _delete_local(self, key: str) -> None:
        """What ``LocalStore.delete`` does: a file is unlinked (missing is fine), a folder removed whole."""
        if self.zstore.read_only:
            raise ValueError("store was opened in read-only mode")
        self.requests += 1
        path = os.path.join(self._root, key)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except (IsADirectoryError, PermissionError):
            if not os.path.isdir(path):
                raise
            import shutil

            shutil.rmtree(path)
            self._made_dirs = {d for d in self._made_dirs if not (d + os.sep).startswith(path + os.sep)}

    def delete(self, key: str) -> None:
        if not self.supports_deletes:
            return
        if self._root is not None:
            self._delete_local(key)
            return
        self._call(self._z().delete(key))

    def delete_many(self, keys: list[str]) -> None:
        if not self.supports_deletes or not keys:
            return
        if self._root is not None:
            for k in keys:
                self._delete_local(k)
            return
        z = self._z()

        async def go():
            return await _gather_limited((z.delete(k) for k in keys), self.concurrency)

        self._call(go(), len(keys))

    def __repr__(self) -> str:
        return f"Backend({self.url!r})"


_memory_stores: dict[str, dict] = {}
_memory_lock = threading.Lock()


def open_backend(location: Any = None, *, read_only: bool = False, storage_options: dict | None = None,
                 create: bool = True) -> Backend:
    """Open (creating if needed) the zarr store at ``location``; see the module docstring.

    ``create=False``: a local folder or zip file that does not exist is refused, not made.
    A file that is not a zip archive is never opened as a zip store (it would be appended to).
    """
    if isinstance(location, Backend):
        return location
    global _remote_clients
    if location is None:
        location = DEFAULT_PATH
    if isinstance(location, os.PathLike):
        location = os.fspath(location)
    if not isinstance(location, str):
        _load_zarr()  # zarr only now: a local folder is served without it
        if isinstance(location, ZarrStore):
            if not isinstance(location, (LocalStore, MemoryStore, ZipStore)):
                _remote_clients = True  # someone else's client: its threads are not ours to outlive
            return Backend(location, str(location))
        raise TypeError(f"store location must be a path, a URL or a zarr Store, got {type(location).__name__}")
    if not (location.startswith("file://") or "://" not in location) or location.endswith(".zip"):
        _load_zarr()
    if location.startswith("memory://"):
        name = location[len("memory://") :]
        with _memory_lock:
            d = _memory_stores.setdefault(name, {}) if name else {}
        return Backend(MemoryStore(d, read_only=read_only), location)
    if "://" in location and not location.startswith("file://"):
        _remote_clients = True
        scheme = location.split("://", 1)[0]
        if scheme in _OBSTORE_SCHEMES and _has_obstore():
            return _open_object_store(location, read_only, storage_options or {})
        return _open_fsspec(location, read_only, storage_options or {})
    if location.startswith("file://"):
        location = location[len("file://") :]
    path = Path(location).expanduser()
    if path.suffix == ".zip":
        return _open_zip(path, read_only, create)
    return _open_local(path, read_only, create)


def _open_local(path: Path, read_only: bool, create: bool = True) -> Backend:
    if path.exists() and not path.is_dir():
        raise StoreError(f"cannot open store at {path}: it is a file, not a folder")
    if read_only or not create:
        if not path.is_dir():
            raise StoreError(f"cannot open store at {path}: no such folder")
    else:
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StoreError(f"cannot create store folder {path}: {e.strerror or e}") from None
        if not os.access(path, os.W_OK | os.X_OK):
            raise StoreError(f"cannot write to store folder {path}: permission denied")
    return Backend(LocalFolder(path.resolve(), read_only=read_only), str(path))


def _open_zip(path: Path, read_only: bool, create: bool = True) -> Backend:
    import zipfile

    if path.exists() and path.is_dir():
        raise StoreError(f"cannot open zip store at {path}: it is a folder")
    if (read_only or not create) and not path.exists():
        raise StoreError(f"cannot open zip store at {path}: no such file")
    # zipfile's append mode adds an archive to the end of any file: only a zip archive (or an empty file) is ours to open.
    if path.is_file() and path.stat().st_size > 0 and not zipfile.is_zipfile(path):
        raise StoreError(f"cannot open zip store at {path}: the file is not a zip archive (left untouched)")
    if not create and path.is_file() and path.stat().st_size == 0:
        raise StoreError(f"no casmon store at {path}: the file is empty")
    if not read_only:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StoreError(f"cannot create folder for {path}: {e.strerror or e}") from None

    try:
        z = run(ZipStore.open(path, mode="r" if read_only else "a"))
    except Exception as e:  # noqa: BLE001 - zipfile raises many kinds
        raise StoreError(f"cannot open zip store at {path}: {e}") from None
    return Backend(z, str(path))


_OBSTORE_SCHEMES = ("s3", "s3a", "gs", "gcs", "az", "azure", "abfs", "abfss", "adl")
#: storage_options names as s3fs spells them -> obstore's
_ALIASES = {"key": "access_key_id", "secret": "secret_access_key", "token": "session_token",
            "endpoint_url": "endpoint", "region_name": "region", "aws_access_key_id": "access_key_id",
            "aws_secret_access_key": "secret_access_key"}
_URL_CREDENTIALS = re.compile(r"(?<=://)[^/@\s]+@")


def scrub_url(url: str) -> str:
    """A URL without user:password@ (never stored, never printed)."""
    return _URL_CREDENTIALS.sub("", url)


def _has_obstore() -> bool:
    try:
        import obstore  # noqa: F401
    except ImportError:
        return False
    return True


def _short_error(e: BaseException) -> str:
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    low = str(e)
    if "NoSuchBucket" in low:
        return "the bucket does not exist"
    if "InvalidAccessKeyId" in low or "SignatureDoesNotMatch" in low or "403" in low and "Forbidden" in low:
        return "access denied: check the credentials (environment or storage_options)"
    if "error sending request" in low or "Connection refused" in low or "dns error" in low:
        return "cannot reach the endpoint (" + text[:200] + ")"
    return f"{type(e).__name__}: {text[:300]}"


#: A remote store's client was opened in this process (see :meth:`_Loop.shutdown`).
_remote_clients = False


def _open_object_store(url: str, read_only: bool, storage_options: dict) -> Backend:
    """S3, GCS or Azure through obstore: conditional writes, so create-if-absent is race-free.

    Credentials and endpoint come from the environment (``AWS_ACCESS_KEY_ID``,
    ``AWS_ENDPOINT_URL``, ...) or ``storage_options``; they are never written to the store.
    """
    import datetime as _dt

    from obstore.store import from_url
    from zarr.storage import ObjectStore

    opts = {_ALIASES.get(k, k): v for k, v in storage_options.items()}
    client_options = dict(opts.pop("client_options", {}) or {})
    retry_config = opts.pop("retry_config", None) or {
        "max_retries": 5, "retry_timeout": _dt.timedelta(seconds=30),
        "backoff": {"init_backoff": _dt.timedelta(milliseconds=100), "max_backoff": _dt.timedelta(seconds=5), "base": 2},
    }
    endpoint = opts.get("endpoint") or os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT_URL_S3")
    if endpoint and str(endpoint).startswith("http://"):
        client_options.setdefault("allow_http", True)
    if endpoint and url.startswith(("s3://", "s3a://")):
        opts.setdefault("virtual_hosted_style_request", False)
    clean = scrub_url(url)

    def make() -> ZarrStore:
        return ObjectStore(from_url(clean, client_options=client_options or None, retry_config=retry_config, **opts),
                           read_only=read_only)

    try:
        z = make()
    except Exception as e:  # noqa: BLE001
        raise StoreError(f"cannot open {clean}: {_short_error(e)}") from None
    b = Backend(z, clean, reopen=make)
    try:
        b.list_dir("")  # reach the store now: a clear error at open, before anything is written
    except Exception as e:  # noqa: BLE001
        cause = e.__cause__ or e
        raise StoreError(f"cannot open {clean}: {_short_error(cause)}") from None
    return b


def _open_fsspec(url: str, read_only: bool, storage_options: dict) -> Backend:
    from zarr.storage import FsspecStore

    opts = dict(storage_options)
    if url.startswith("s3://"):
        opts.setdefault("skip_instance_cache", True)
        opts.setdefault("asynchronous", True)

    def make() -> ZarrStore:
        async def go():
            return FsspecStore.from_url(url, storage_options=opts, read_only=read_only)

        return run(go())

    clean = scrub_url(url)
    try:
        z = make()
    except ImportError as e:
        raise StoreError(f"cannot open {clean}: {e} (install obstore, or the fsspec driver for this scheme)") from None
    except Exception as e:  # noqa: BLE001
        raise StoreError(f"cannot open {clean}: {_short_error(e)}") from None
    return Backend(z, clean, reopen=make)
