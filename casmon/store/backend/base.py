"""The backend interface: synchronous key/value access to one storage medium.

Every layer above reads and writes the store through :class:`Backend`, never
through a medium's own API, so a local folder (:mod:`.local`) and any zarr v3
store (:mod:`.zarrstore`) behave the same. The public methods live here and do
what every medium shares: counting requests, refusing deletes where a medium
keeps everything, making writes durable (:meth:`Backend.sync`); a medium
implements the small protected hooks (``_get``, ``_write``, ...), as zarr's
``zarr.abc.store.Store`` has one class per medium.
"""

from __future__ import annotations

import abc
import builtins
import os
import sys
import _thread  # threading's locks, without loading threading on a hit
from collections.abc import Callable, Sequence
from pathlib import Path
TYPE_CHECKING = False  # typing's flag without importing typing (~2 ms of a first hit)
if TYPE_CHECKING:
    from typing import Any, TypeAlias, Union

if TYPE_CHECKING:
    from concurrent.futures import Future

    import numpy as np
    import numpy.typing as npt

    #: What a read returns: the bytes, read-only, without a copy: a memoryview from a local folder (a
    #: process whose values are not arrays never imports numpy), a uint8 array from zarr's stores.
    Data: TypeAlias = npt.NDArray[np.uint8] | memoryview
    #: What a write takes: any bytes-like object.
    BytesLike: TypeAlias = Union[bytes, bytearray, memoryview]

__all__ = ["Backend", "fault_points"]

#: casmon.faultpoints once a write needs it (a hit loads none): an import statement in each write
#: (a medium's, the object store's, the store's) cost it ~1 µs.
_faultpoints: Any = None


class _NoFaultPoints:
    """What :func:`fault_points` gives while no fault point can be asked for: ``point`` does nothing."""

    enabled = False

    @staticmethod
    def point(name: str) -> None:
        pass


_NONE_ASKED = _NoFaultPoints()


def fault_points() -> Any:
    """casmon.faultpoints where a point may be asked for: ``CASMON_FAULTPOINTS`` is set, or the module is loaded (a
    test configures points through it); else a stand-in whose points do nothing, so that a process's writes (a
    hit's exit flush, a first miss) do not load the module only to find no point asked for."""
    global _faultpoints
    fp = _faultpoints
    if fp is None:
        fp = sys.modules.get("casmon.faultpoints")
        if fp is None:
            if not os.environ.get("CASMON_FAULTPOINTS"):
                return _NONE_ASKED
            from casmon import faultpoints as fp
        _faultpoints = fp
    return fp


#: Range reads of one write-once file (:meth:`Backend.read_kept`) after which a remote medium fetches it whole,
#: files up to this many bytes, and how many bytes of such files a backend keeps in memory.
WHOLE_AFTER = 4
WHOLE_MAX = 16 << 20
WHOLE_KEPT_BYTES = 64 << 20


class Backend(abc.ABC):
    """Synchronous key/value access to one store.

    Values come back as read-only ``numpy.uint8`` arrays (no copy), None where a
    key is absent; values go in as any bytes-like object. All keys are relative,
    ``/``-separated.
    """

    #: fsync every file written (and its folder) before a write returns; local folders only.
    fsync = False
    #: Called every ``wait_tick`` seconds while a write to a remote medium is in flight (the store keeps
    #: the values its waiting records name safe from gc meanwhile); it must not write.
    while_waiting: Callable[[], None] | None = None
    wait_tick = 10.0

    def __init__(self, url: str, concurrency: int = 16) -> None:
        #: The location as shown and kept: credentials are never part of it (see casmon.scrub).
        self.url = url
        #: Operations sent to the medium (a batch counts each key), for benchmarks and tests.
        self.requests = 0
        #: Requests a batch keeps in flight at once (remote media).
        self.concurrency = concurrency
        # read_kept on remote media: range reads per write-once file, and the files read often enough to be
        # fetched whole (oldest first, at most WHOLE_KEPT_BYTES in all).
        self._range_reads: dict[str, int] = {}
        self._whole: dict[str, bytes] = {}
        self._whole_bytes = 0
        self._whole_lock = _thread.allocate_lock()
        self._reached: tuple[str, Data | None] | None = None  # what reach() read, for the next get() of it

    # -- what the medium is -------------------------------------------------------
    @property
    @abc.abstractmethod
    def zstore(self) -> Any:
        """The medium's own object: a :class:`~casmon.store.backend.local.LocalFolder` or a zarr ``Store``."""

    @property
    @abc.abstractmethod
    def read_only(self) -> bool:
        """Opened read-only: every write raises."""

    @property
    def supports_deletes(self) -> bool:
        """False where nothing is ever deleted (a zip file): :meth:`delete` then does nothing."""
        return True

    @property
    def needs_close(self) -> bool:
        """The store must be closed for what was written to be readable by others (a zip file)."""
        return False

    @property
    def local_root(self) -> Path | None:
        """The folder of a local store, else None."""
        return None

    @property
    def is_local(self) -> bool:
        """Served in the calling thread with plain system calls (no event loop)."""
        return self.local_root is not None

    def local_path(self, key: str) -> Path | None:
        """The file behind ``key`` in a local folder store (writable or not), else None.

        Large chunks are read straight into their destination buffer through it
        (no intermediate bytes object), from any thread, without the event loop.
        """
        root = self.local_root
        return None if root is None else root / key

    def close(self) -> None:
        """Close kept files and the medium's client (best effort)."""
        self.forget("")
        try:
            self._close()
        except Exception:  # noqa: BLE001 - closing is best effort
            pass

    def __repr__(self) -> str:
        return f"Backend({self.url!r})"

    def reach(self, key: str) -> None:
        """Reach the medium now, so a wrong endpoint, bucket or credential is said at open, not at the first write.

        Reads ``key`` (the store's marker, which opening reads next anyway) and keeps it for the next :meth:`get`,
        which is then no request; where it is absent, lists the top as well, since a missing bucket answers a
        read as a missing key. Opening an existing store on S3 is so one GET, not a LIST, a HEAD and a GET.
        """
        data = self.get(key)
        if data is None:
            self.list_dir("")
        self._reached = (key, data)

    # -- reads -------------------------------------------------------------------
    def get(self, key: str) -> Data | None:
        """The bytes of ``key``; None if it is absent."""
        reached = self._reached
        if reached is not None:  # once, right after open: the key reach() read
            self._reached = None
            if reached[0] == key:
                return reached[1]
        self.requests += 1
        return self._get(key)

    def get_range(self, key: str, start: int, end: int) -> Data | None:
        """Bytes ``[start, end)`` of ``key`` (never past its end); None if it is absent."""
        self.requests += 1
        return self._get_range(key, start, end)

    def get_many(self, keys: builtins.list[str]) -> builtins.list[Data | None]:
        """:meth:`get` of each key, in order (concurrently where the medium is remote)."""
        self.requests += len(keys)
        return self._get_many(keys)

    def get_ranges(self, requests: builtins.list[tuple[str, int, int]]) -> builtins.list[Data | None]:
        """:meth:`get_range` of each ``(key, start, end)``, in order."""
        self.requests += len(requests)
        return self._get_ranges(requests)

    def read_kept(self, key: str, start: int, end: int) -> bytes | Data | None:
        """Bytes ``[start, end)`` of a file that is written once and never rewritten (a table's bucket
        file); None if it is absent. A medium may keep such a file open between reads (see
        :meth:`forget`); elsewhere it is :meth:`get_range`, until :data:`WHOLE_AFTER` ranges of one file
        were read: then, if it is at most :data:`WHOLE_MAX` bytes, it is fetched once and read from memory
        (a writer that misses many keys reads a block of one bucket file per miss: hundreds of requests
        for a file of a few megabytes)."""
        whole = self._whole.get(key)
        if whole is not None:
            return whole[start:end]
        with self._whole_lock:
            n = self._range_reads[key] = self._range_reads.get(key, 0) + 1
            if len(self._range_reads) > 4096:
                self._range_reads.clear()
        if n <= WHOLE_AFTER:
            return self.get_range(key, start, end)
        try:
            size = self.getsize(key)
        except FileNotFoundError:
            return None
        if size > WHOLE_MAX:
            return self.get_range(key, start, end)
        data = self.get(key)
        if data is None:
            return None
        whole = bytes(data)
        with self._whole_lock:
            if key not in self._whole:
                self._whole[key] = whole
                self._whole_bytes += len(whole)
                while self._whole_bytes > WHOLE_KEPT_BYTES and len(self._whole) > 1:
                    self._whole_bytes -= len(self._whole.pop(next(iter(self._whole))))
        return whole[start:end]

    def forget(self, prefix: str) -> None:
        """Close files kept open for :meth:`read_kept` whose keys start with ``prefix`` (a generation merged away)."""
        with self._whole_lock:
            for k in [k for k in self._whole if k.startswith(prefix)]:
                self._whole_bytes -= len(self._whole.pop(k))
            for k in [k for k in self._range_reads if k.startswith(prefix)]:
                del self._range_reads[k]

    def exists(self, key: str) -> bool:
        self.requests += 1
        return self._exists_many([key])[0]

    def exists_many(self, keys: builtins.list[str]) -> builtins.list[bool]:
        self.requests += len(keys)
        return self._exists_many(keys)

    def getsize(self, key: str) -> int:
        """The size of ``key`` in bytes; raises ``FileNotFoundError`` if it is absent."""
        self.requests += 1
        return self._getsize(key)

    def getsize_many(self, keys: builtins.list[str]) -> builtins.list[int]:
        """:meth:`getsize` of each key, 0 for an absent one."""
        self.requests += len(keys)
        return self._getsize_many(keys)

    def list(self, prefix: str) -> builtins.list[str]:
        """Every key under ``prefix`` (a folder, ending in ``/``; ``""``: the whole store)."""
        self.requests += 1
        return self._list(prefix)

    def list_dir(self, prefix: str) -> builtins.list[str]:
        """The names of the files and folders right under ``prefix``."""
        self.requests += 1
        return self._list_dir(prefix)

    def landed(self, keys: builtins.list[str]) -> builtins.list[float | None] | None:
        """When each key was written, by the medium's own clock (seconds since the epoch; None for an
        absent key); None where the medium cannot tell (memory, zip). Late writes are fenced by it
        (:mod:`casmon.store.table.fence`)."""
        self.requests += len(keys)
        return self._landed(keys)

    def list_landed(self, prefix: str) -> dict[str, float] | None:
        """The keys right under folder ``prefix`` with when each was written (:meth:`landed`): one listing."""
        self.requests += 1
        return self._list_landed(prefix)

    def list_stamped(self, prefix: str) -> dict[str, str] | None:
        """The files right under folder ``prefix``, each with a *stamp* that changes whenever the file is written
        again (derived data checks it is still current without reading the file); None where the medium cannot
        give one in a listing."""
        self.requests += 1
        return self._list_stamped(prefix)

    def _list_stamped(self, prefix: str) -> dict[str, str] | None:
        return None

    def stamp(self, key: str) -> str | None:
        """The stamp :meth:`list_stamped` gives ``key`` (None: absent, or a medium that gives none)."""
        self.requests += 1
        return self._stamp(key)

    def _stamp(self, key: str) -> str | None:
        return None

    def folder_stamp(self, prefix: str) -> str | None:
        """A stamp of folder ``prefix`` itself that changes whenever a file is added to it, renamed into it or
        removed from it (every write of a file here renames a new one in); None where the medium gives none.
        Trusted alone, as a file's stamp is, only once :meth:`stamp_settled`."""
        self.requests += 1
        return self._folder_stamp(prefix)

    def _folder_stamp(self, prefix: str) -> str | None:
        return None

    def stamp_settled(self, stamp: str, at: float) -> bool:
        """True if no later write of the file can have ``stamp``, which was taken at time ``at`` (Unix seconds):
        the file was written more than its clock's tick before. Two writes within one tick of a coarse file
        clock, the inode reused, can share a stamp; derived data trusts a stamp alone only once it is settled
        (as git does with racy index entries). False where the stamp does not say."""
        return False

    # -- writes ------------------------------------------------------------------
    def set(self, key: str, data: BytesLike) -> None:
        """Write ``key``, replacing what it held (atomically: a reader sees the old bytes or the new)."""
        self.requests += 1
        self._write(key, (data,), exclusive=False)
        self.sync([key])

    def create(self, key: str, data: BytesLike) -> None:
        """Write ``key`` unless it exists. Content-addressed writers do not care who won."""
        self.requests += 1
        self._write(key, (data,), exclusive=True)
        self.sync([key])

    def create_frame(self, key: str, header: bytes, payload: BytesLike) -> None:
        """:meth:`create` of ``header + payload``; a local folder writes the two without joining them
        (a large raw chunk is not copied). Safe to call from any thread."""
        self.requests += 1
        self._write(key, (header, payload), exclusive=True)
        self.sync([key])

    def create_many(self, items: Sequence[tuple[str, BytesLike]]) -> None:
        """:meth:`create` of each ``(key, data)`` (concurrently where the medium is remote)."""
        self.requests += len(items)
        self._write_many(items)
        self.sync([k for k, _ in items])

    def create_async(self, key: str, data: BytesLike) -> Future[None]:
        """Start a :meth:`create` and return a ``concurrent.futures.Future`` for it (on a local folder,
        done by the time it returns)."""
        return self._create_async(key, data)

    def sync(self, keys: Sequence[str]) -> None:
        """Make written keys durable where the medium can (fsync on a local folder with :attr:`fsync`)."""

    def delete(self, key: str) -> None:
        """Delete ``key`` (absent is fine; a folder goes whole). Nothing where deletes are not supported."""
        if not self.supports_deletes:
            return
        self.requests += 1
        self._delete_many([key])

    def delete_many(self, keys: builtins.list[str]) -> None:
        if not self.supports_deletes or not keys:
            return
        self.requests += len(keys)
        self._delete_many(keys)

    # -- what a medium implements --------------------------------------------------
    @abc.abstractmethod
    def _get(self, key: str) -> Data | None: ...

    @abc.abstractmethod
    def _get_range(self, key: str, start: int, end: int) -> Data | None: ...

    @abc.abstractmethod
    def _get_many(self, keys: builtins.list[str]) -> builtins.list[Data | None]: ...

    @abc.abstractmethod
    def _get_ranges(self, requests: builtins.list[tuple[str, int, int]]) -> builtins.list[Data | None]: ...

    @abc.abstractmethod
    def _exists_many(self, keys: builtins.list[str]) -> builtins.list[bool]: ...

    @abc.abstractmethod
    def _getsize(self, key: str) -> int: ...

    @abc.abstractmethod
    def _getsize_many(self, keys: builtins.list[str]) -> builtins.list[int]: ...

    @abc.abstractmethod
    def _list(self, prefix: str) -> builtins.list[str]: ...

    @abc.abstractmethod
    def _list_dir(self, prefix: str) -> builtins.list[str]: ...

    @abc.abstractmethod
    def _write(self, key: str, parts: Sequence[BytesLike], exclusive: bool) -> None:
        """Write ``parts`` back to back as ``key``; ``exclusive``: only if ``key`` is absent."""

    @abc.abstractmethod
    def _write_many(self, items: Sequence[tuple[str, BytesLike]]) -> None:
        """Create-if-absent of each ``(key, data)``."""

    @abc.abstractmethod
    def _create_async(self, key: str, data: BytesLike) -> Future[None]: ...

    @abc.abstractmethod
    def _delete_many(self, keys: builtins.list[str]) -> None: ...

    def _landed(self, keys: builtins.list[str]) -> builtins.list[float | None] | None:
        return None

    def _list_landed(self, prefix: str) -> dict[str, float] | None:
        return None

    def _close(self) -> None:
        """Close the medium's client."""
