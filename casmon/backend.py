"""Backends: synchronous access to any zarr v3 store.

zarr's :class:`zarr.abc.store.Store` is asynchronous. casmon's features are
synchronous, so a :class:`Backend` drives the zarr store from one event loop
running on a daemon thread of casmon's own (zarr's private ``sync`` helper is
not used). One loop per process: after a ``fork`` the child starts a new loop
and re-opens stores whose clients are bound to the parent's loop.

``open_backend(location)`` maps a location to a zarr store:

=====================  ==========================================
``None`` / a path      ``LocalStore`` (default ``./.casmon``)
``memory://[name]``    ``MemoryStore``; the same name is the same store in a process
``*.zip``              ``ZipStore`` (one writer at a time; nothing is ever deleted)
``s3://``, ``gs://`` …  ``FsspecStore.from_url`` (credentials from the environment or ``storage_options``)
a ``Store`` instance   used as it is
=====================  ==========================================
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Coroutine, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from zarr.abc.store import RangeByteRequest, Store as ZarrStore
from zarr.buffer import default_buffer_prototype
from zarr.buffer.cpu import Buffer
from zarr.storage import LocalStore, MemoryStore, ZipStore

from .errors import StoreError

__all__ = ["Backend", "open_backend", "run"]

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
        with cls._lock:
            if cls._loop is None or cls._pid != os.getpid():
                loop = asyncio.new_event_loop()
                loop.set_default_executor(_started_executor(cls.WORKERS))
                t = threading.Thread(target=loop.run_forever, name="casmon-io", daemon=True)
                t.start()
                cls._loop, cls._pid = loop, os.getpid()
            return cls._loop


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


def _np(buf: Buffer | None):
    return None if buf is None else buf.as_numpy_array()


class Backend:
    """Synchronous key/value access to one zarr store.

    Values come back as read-only ``numpy.uint8`` arrays (no copy); values go in
    as any bytes-like object. All keys are relative, ``/``-separated.
    """

    def __init__(self, zstore: ZarrStore, url: str, reopen: Callable[[], ZarrStore] | None = None,
                 concurrency: int = 16) -> None:
        self.zstore = zstore
        self.url = url
        self._reopen = reopen
        self._pid = os.getpid()
        self.concurrency = concurrency
        self._proto = default_buffer_prototype()

    # -- lifecycle -------------------------------------------------------------
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

    @property
    def supports_deletes(self) -> bool:
        return bool(self.zstore.supports_deletes) and not isinstance(self.zstore, ZipStore)

    @property
    def needs_close(self) -> bool:
        """A zip file must be closed for its entries to be readable by others."""
        return isinstance(self.zstore, ZipStore) and not self.read_only

    @property
    def is_local(self) -> bool:
        return isinstance(self.zstore, LocalStore)

    @property
    def local_root(self) -> Path | None:
        return Path(self.zstore.root) if isinstance(self.zstore, LocalStore) else None

    def close(self) -> None:
        try:
            self.zstore.close()
        except Exception:  # noqa: BLE001 - closing is best effort
            pass

    # -- reads -------------------------------------------------------------------
    def get(self, key: str):
        z = self._z()
        return _np(run(z.get(key, self._proto)))

    def get_range(self, key: str, start: int, end: int):
        z = self._z()
        return _np(run(z.get(key, self._proto, byte_range=RangeByteRequest(start, end))))

    def get_many(self, keys: list[str]) -> list:
        z = self._z()

        async def go():
            return await _gather_limited((z.get(k, self._proto) for k in keys), self.concurrency)

        return [_np(b) for b in run(go())]

    def get_ranges(self, requests: list[tuple[str, int, int]]) -> list:
        z = self._z()

        async def go():
            return await _gather_limited(
                (z.get(k, self._proto, byte_range=RangeByteRequest(s, e)) for k, s, e in requests), self.concurrency
            )

        return [_np(b) for b in run(go())]

    def exists(self, key: str) -> bool:
        return run(self._z().exists(key))

    def exists_many(self, keys: list[str]) -> list[bool]:
        z = self._z()

        async def go():
            return await _gather_limited((z.exists(k) for k in keys), self.concurrency)

        return run(go())

    def getsize(self, key: str) -> int:
        return run(self._z().getsize(key))

    def getsize_many(self, keys: list[str]) -> list[int]:
        z = self._z()

        async def one(k):
            try:
                return await z.getsize(k)
            except FileNotFoundError:
                return 0

        async def go():
            return await _gather_limited((one(k) for k in keys), self.concurrency)

        return run(go())

    def list(self, prefix: str) -> list[str]:
        """Every key under ``prefix`` (a folder, ending in ``/``)."""
        z = self._z()

        async def go():
            return [k async for k in z.list_prefix(prefix)]

        return run(go())

    def list_dir(self, prefix: str) -> list[str]:
        z = self._z()

        async def go():
            return [k async for k in z.list_dir(prefix)]

        return run(go())

    # -- writes ------------------------------------------------------------------
    def set(self, key: str, data) -> None:
        run(self._z().set(key, Buffer.from_bytes(data)))

    def create(self, key: str, data) -> None:
        """Write ``key`` unless it exists. Content-addressed writers do not care who won."""
        run(self._z().set_if_not_exists(key, Buffer.from_bytes(data)))

    def create_async(self, key: str, data):
        """Start a create and return a ``concurrent.futures.Future`` for it."""
        z = self._z()
        return asyncio.run_coroutine_threadsafe(z.set_if_not_exists(key, Buffer.from_bytes(data)), _Loop.get())

    def create_many(self, items: list[tuple[str, Any]]) -> None:
        z = self._z()

        async def go():
            return await _gather_limited(
                (z.set_if_not_exists(k, Buffer.from_bytes(d)) for k, d in items), self.concurrency
            )

        run(go())

    def delete(self, key: str) -> None:
        if not self.supports_deletes:
            return
        run(self._z().delete(key))

    def delete_many(self, keys: list[str]) -> None:
        if not self.supports_deletes or not keys:
            return
        z = self._z()

        async def go():
            return await _gather_limited((z.delete(k) for k in keys), self.concurrency)

        run(go())

    def __repr__(self) -> str:
        return f"Backend({self.url!r})"


_memory_stores: dict[str, dict] = {}
_memory_lock = threading.Lock()


def open_backend(location: Any = None, *, read_only: bool = False, storage_options: dict | None = None) -> Backend:
    """Open (creating if needed) the zarr store at ``location``; see the module docstring."""
    if isinstance(location, Backend):
        return location
    if isinstance(location, ZarrStore):
        return Backend(location, str(location))
    if location is None:
        location = DEFAULT_PATH
    if isinstance(location, os.PathLike):
        location = os.fspath(location)
    if not isinstance(location, str):
        raise TypeError(f"store location must be a path, a URL or a zarr Store, got {type(location).__name__}")
    if location.startswith("memory://"):
        name = location[len("memory://") :]
        with _memory_lock:
            d = _memory_stores.setdefault(name, {}) if name else {}
        return Backend(MemoryStore(d, read_only=read_only), location)
    if "://" in location and not location.startswith("file://"):
        return _open_fsspec(location, read_only, storage_options or {})
    if location.startswith("file://"):
        location = location[len("file://") :]
    path = Path(location).expanduser()
    if path.suffix == ".zip":
        return _open_zip(path, read_only)
    return _open_local(path, read_only)


def _open_local(path: Path, read_only: bool) -> Backend:
    if path.exists() and not path.is_dir():
        raise StoreError(f"cannot open store at {path}: it is a file, not a folder")
    if read_only:
        if not path.is_dir():
            raise StoreError(f"cannot open store at {path}: no such folder")
    else:
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StoreError(f"cannot create store folder {path}: {e.strerror or e}") from None
        if not os.access(path, os.W_OK | os.X_OK):
            raise StoreError(f"cannot write to store folder {path}: permission denied")
    z = LocalStore(path.resolve(), read_only=read_only)
    return Backend(z, str(path))


def _open_zip(path: Path, read_only: bool) -> Backend:
    if path.exists() and path.is_dir():
        raise StoreError(f"cannot open zip store at {path}: it is a folder")
    if read_only and not path.exists():
        raise StoreError(f"cannot open zip store at {path}: no such file")
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

    try:
        z = make()
    except ImportError as e:
        raise StoreError(f"cannot open {url}: {e} (install the fsspec driver for this scheme, e.g. s3fs)") from None
    except Exception as e:  # noqa: BLE001
        raise StoreError(f"cannot open {url}: {type(e).__name__}: {e}") from None
    return Backend(z, url, reopen=make)
