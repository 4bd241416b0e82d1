"""Any zarr v3 ``Store`` (memory, zip, fsspec, or a store object the user made) behind the :class:`Backend` interface.

Each request is one of the zarr store's coroutines, run by :class:`~.remote.RemoteBackend` on casmon's
event loop. This is the only module of casmon that imports zarr, and only when such a store is opened: a
local folder (:mod:`.local`) and S3, GCS or Azure through obstore (:mod:`.objstore`) never need it.
"""

from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from casmon.errors import StoreError
from casmon.scrub import scrub, scrub_url
from casmon.store.backend import loop
from casmon.store.backend.base import Backend
from casmon.store.backend.local import LocalBackend
from casmon.store.backend.remote import RemoteBackend, client_error
from casmon.store.backend.retry import Retrier

if TYPE_CHECKING:
    from pathlib import Path

    from zarr.abc.store import Store as ZarrStore
    from zarr.core.buffer import Buffer as ZarrBuffer

    from casmon.store.backend.base import BytesLike, Data

__all__ = ["ZarrBackend", "from_store_object", "open_fsspec", "open_memory", "open_zip"]


def _np(buf: ZarrBuffer | None) -> Data | None:
    return None if buf is None else buf.as_numpy_array()


class ZarrBackend(RemoteBackend):
    """One zarr store, driven from casmon's event loop.

    ``reopen`` makes the store again in a forked child, whose clients cannot use
    the parent's loop.
    """

    def __init__(self, zstore: ZarrStore, url: str, reopen: Callable[[], ZarrStore] | None = None,
                 concurrency: int = 16) -> None:
        from zarr.abc.store import RangeByteRequest
        from zarr.buffer import default_buffer_prototype
        from zarr.buffer.cpu import Buffer
        from zarr.storage import ZipStore

        self._zip = isinstance(zstore, ZipStore)
        # Memory and zip stores do not fail the way remote media do: no retries.
        super().__init__(url, None if self._zip or type(zstore).__name__ == "MemoryStore" else Retrier(), concurrency)
        self._zstore = zstore
        self._zip_key: tuple[int, str] | None = None  # set by open_zip for a writer (see _zip_writers)
        self._reopen = reopen
        self._proto = default_buffer_prototype()
        self._range = RangeByteRequest
        self._buffer = Buffer

    @property
    def zstore(self) -> ZarrStore:
        return self._zstore

    def _forked(self) -> None:
        if self._reopen is not None:
            self._zstore = self._reopen()

    def _obstore_client(self) -> Any:
        z = self._zstore
        return getattr(z, "store", None) if type(z).__name__ == "ObjectStore" else None

    @property
    def read_only(self) -> bool:
        return bool(self._zstore.read_only)

    @property
    def supports_deletes(self) -> bool:
        return bool(self._zstore.supports_deletes) and not self._zip

    @property
    def needs_close(self) -> bool:
        """A zip file must be closed for its entries to be readable by others."""
        return self._zip and not self.read_only

    def _close(self) -> None:
        try:
            self._zstore.close()
        finally:
            if self._zip_key is not None:
                with _zip_lock:
                    if _zip_writers.get(self._zip_key) is self:
                        del _zip_writers[self._zip_key]

    # -- one request each ------------------------------------------------------------
    async def _aget(self, key: str) -> Data | None:
        return _np(await self._zstore.get(key, self._proto))

    async def _aget_range(self, key: str, start: int, end: int) -> Data | None:
        return _np(await self._zstore.get(key, self._proto, byte_range=self._range(start, end)))

    async def _aexists(self, key: str) -> bool:
        return await self._zstore.exists(key)

    async def _agetsize(self, key: str) -> int:
        return await self._zstore.getsize(key)

    async def _aset(self, key: str, data: BytesLike) -> None:
        if not self._zip:
            await self._zstore.set(key, self._buffer.from_bytes(data))
            return
        # A ref written again is a second entry in the archive (a zip is append-only; readers take the last):
        # zipfile warns of each, which is not the user's to see.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "Duplicate name", UserWarning)
            await self._zstore.set(key, self._buffer.from_bytes(data))

    async def _acreate(self, key: str, data: BytesLike) -> None:
        await self._zstore.set_if_not_exists(key, self._buffer.from_bytes(data))

    async def _adelete(self, key: str) -> None:
        await self._zstore.delete(key)

    async def _alist(self, prefix: str) -> list[str]:
        return [k async for k in self._zstore.list_prefix(prefix)]

    async def _alist_dir(self, prefix: str) -> list[str]:
        return [k async for k in self._zstore.list_dir(prefix)]


# -- opening: every zarr store casmon makes is made here ------------------------------
def open_memory(d: dict[str, Any], url: str, read_only: bool) -> ZarrBackend:
    """A ``MemoryStore`` over ``d`` (the same dict is the same store)."""
    from zarr.storage import MemoryStore

    return ZarrBackend(MemoryStore(d, read_only=read_only), url)


#: Zip stores open for writing in this process, by (pid, real path): a zip archive has one writer, and what it
#: wrote is readable only once it is closed, so a second handle on it (reading or writing) is refused.
_zip_writers: dict[tuple[int, str], ZarrBackend] = {}
_zip_lock = threading.Lock()


def check_no_zip_writer(path: Path) -> None:
    """Raise :class:`StoreError` if this process has the zip store at ``path`` open for writing."""
    if (os.getpid(), os.path.realpath(path)) in _zip_writers:
        raise StoreError(f"zip store {path} is already open for writing in this process: a zip archive has one "
                         f"writer, and what it wrote is readable once it is closed; use that store, or close it first")


def open_zip(path: Path, read_only: bool) -> ZarrBackend:
    """A ``ZipStore`` on ``path`` (checked by the caller to be a zip archive, an empty file, or absent)."""
    from zarr.storage import ZipStore

    with _zip_lock:
        key = (os.getpid(), os.path.realpath(path))
        check_no_zip_writer(path)
        try:
            z = loop.run(ZipStore.open(path, mode="r" if read_only else "a"))
        except Exception as e:  # noqa: BLE001 - zipfile raises many kinds
            raise StoreError(f"cannot open zip store at {path}: {e}") from None
        b = ZarrBackend(z, str(path))
        if not read_only:
            _zip_writers[key] = b
            b._zip_key = key
    return b


def from_store_object(location: object) -> Backend:
    """A zarr ``Store`` instance, used as it is (zarr imported only now: a local folder is served without it)."""
    from zarr.abc.store import Store as ZarrStore
    from zarr.storage import LocalStore, MemoryStore, ZipStore

    if not isinstance(location, ZarrStore):
        raise TypeError(f"store location must be a path, a URL or a zarr Store, got {type(location).__name__}")
    if isinstance(location, LocalStore):  # served with plain system calls, as a LocalFolder is
        return LocalBackend(location, scrub(str(location)))
    if not isinstance(location, (MemoryStore, ZipStore)):
        loop.note_remote_client()  # someone else's client: its threads are not ours to outlive
    return ZarrBackend(location, scrub(str(location)))


def open_fsspec(url: str, read_only: bool, storage_options: dict[str, Any]) -> ZarrBackend:
    """Any other URL through fsspec, which may take credentials from the URL itself: it gets the URL
    whole, and only the scrubbed URL is shown or kept."""
    from zarr.storage import FsspecStore

    opts = dict(storage_options)
    if url.startswith("s3://"):
        opts.setdefault("skip_instance_cache", True)
        opts.setdefault("asynchronous", True)

    def make() -> ZarrStore:
        async def go() -> ZarrStore:
            return FsspecStore.from_url(url, storage_options=opts, read_only=read_only)

        return loop.run(go())

    clean = scrub_url(url)
    try:
        z = make()
    except ImportError as e:
        raise StoreError(f"cannot open {clean}: {scrub(str(e))} (install obstore, or the fsspec driver for this scheme)") from None
    except Exception as e:  # noqa: BLE001
        raise StoreError(f"cannot open {clean}: {client_error(e)}") from None
    return ZarrBackend(z, clean, reopen=make)
