"""A local folder served with plain system calls: zarr's ``LocalStore`` layout, without zarr.

A table lookup is one small read; a round trip through the event loop (two
thread hops) would cost more than the read itself, and importing zarr costs a
third of a second (and 40 ms at interpreter exit). So a local folder is read and
written in the calling thread, exactly as ``LocalStore`` lays it out and writes
it (each key a file under the root, written through a ``*.partial`` file), and
stays a valid zarr store. This module never imports zarr or asyncio.
"""

from __future__ import annotations

import os
import stat
import _thread  # threading's locks, without loading threading on a hit
from collections.abc import Sequence
from pathlib import Path
TYPE_CHECKING = False  # typing's flag without importing typing (~2 ms of a first hit)
if TYPE_CHECKING:
    from typing import Protocol

from casmon.store.backend.base import Backend, fault_points

if TYPE_CHECKING:
    from concurrent.futures import Future

    from casmon.store.backend.base import BytesLike, Data

__all__ = ["KEEP_OPEN", "LocalBackend", "LocalFolder"]

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


#: Reads open without blocking: a named pipe put where a file should be (a crafted store) opens at once and reads
#: as empty (its size is 0), where a plain open would wait for a writer forever. No effect on a regular file.
_READ_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)


class _OpenFile:
    """A descriptor kept open for reads, and the file's size then (a file kept is never rewritten).

    It is closed when the last reference goes, never while a thread that took it from the cache
    still reads through it: a descriptor closed under a reader could be reused by another ``open``
    meanwhile, and the read would return another file's bytes. Not in a forked child: a child that
    daemonizes closes every descriptor and opens its own, which may get the same numbers (the child
    would read its own file as a bucket, and a later close would close it).
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


if TYPE_CHECKING:  # a protocol for the type checker alone: typing is not loaded at run time
    class Folder(Protocol):
        """What :class:`LocalBackend` needs of a folder store: :class:`LocalFolder`, or zarr's ``LocalStore``."""

        @property
        def root(self) -> Path: ...

        @property
        def read_only(self) -> bool: ...

        def close(self) -> None: ...


class LocalFolder:
    """A store in a local folder, laid out exactly as zarr's ``LocalStore`` lays it out (each key a
    file under ``root``, written through a ``*.partial`` file), and served without zarr by
    :class:`LocalBackend`. A ``LocalStore`` passed in is served the same way."""

    supports_deletes = True

    def __init__(self, root: Path, read_only: bool = False) -> None:
        self.root = Path(root)
        self.read_only = read_only

    def close(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"file://{self.root}"


def _as_bytes(part: BytesLike) -> memoryview:
    mv = memoryview(part)
    if mv.ndim != 1 or mv.format not in ("B", "b", "c"):
        mv = mv.cast("B")
    return mv


class LocalBackend(Backend):
    """A local folder (a :class:`LocalFolder`, or a zarr ``LocalStore``) read and written in the calling thread."""

    def __init__(self, folder: Folder, url: str, concurrency: int = 16) -> None:
        super().__init__(url, concurrency)
        self._folder = folder
        self._root = str(folder.root)
        self._made_dirs: set[str] = set()  # folders known to exist (a write need not make them again)
        self._kept: dict[str, _OpenFile] = {}  # key -> open file, least recently used first
        self._kept_lock = _thread.allocate_lock()

    @property
    def zstore(self) -> Folder:
        return self._folder

    @property
    def read_only(self) -> bool:
        return bool(self._folder.read_only)

    @property
    def local_root(self) -> Path:
        return Path(self._root)

    def _close(self) -> None:
        self._folder.close()

    # -- reads -------------------------------------------------------------------
    def _read(self, key: str, start: int, end: int | None) -> Data | None:
        """A file's bytes ``[start, end)`` (None: to its end), read in this thread; None if it is absent."""
        path = os.path.join(self._root, key)
        try:
            if _PREAD:  # open, pread, close: the fewest system calls
                fd = os.open(path, _READ_FLAGS)
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
        return memoryview(data)

    def _get(self, key: str) -> Data | None:
        return self._read(key, 0, None)

    def _get_range(self, key: str, start: int, end: int) -> Data | None:
        return self._read(key, start, end)

    def _get_many(self, keys: list[str]) -> list[Data | None]:
        return [self._read(k, 0, None) for k in keys]

    def _get_ranges(self, requests: list[tuple[str, int, int]]) -> list[Data | None]:
        return [self._read(k, s, e) for k, s, e in requests]

    def read_kept(self, key: str, start: int, end: int) -> bytes | Data | None:
        """Bytes ``[start, end)`` of a file written once and never rewritten, through a descriptor kept
        open between reads (:data:`KEEP_OPEN` files, least recently used closed first), so a read is
        one ``pread``. A kept file deleted meanwhile still reads as it was written, which is what it
        holds; :meth:`forget` closes it."""
        if not _PREAD:
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
                f = _OpenFile(os.open(os.path.join(self._root, key), _READ_FLAGS | getattr(os, "O_CLOEXEC", 0)))
            except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
                return None
            except OSError:  # e.g. out of descriptors: read it the ordinary way
                return self._read(key, start, end)
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
        with self._kept_lock:
            for k in [k for k in self._kept if k.startswith(prefix)]:
                del self._kept[k]

    def _exists_many(self, keys: list[str]) -> list[bool]:
        return [os.path.isfile(os.path.join(self._root, k)) for k in keys]

    def _getsize(self, key: str) -> int:
        return os.path.getsize(os.path.join(self._root, key))

    def _getsize_many(self, keys: list[str]) -> list[int]:
        out = []
        for k in keys:
            try:
                out.append(self._getsize(k))
            except (FileNotFoundError, NotADirectoryError):
                out.append(0)
        return out

    def _list(self, prefix: str) -> list[str]:
        """As zarr's ``LocalStore`` lists (``os.walk``'s files, keyed relative to the root), without starting the
        event loop. A plain prefix (casmon's own) is walked with ``scandir`` and its keys joined as text: each
        folder's ``os.path.relpath`` cost a fresh process's first hit more than listing its files did."""
        base = prefix.rstrip("/")
        if not _plain_prefix(base):
            return self._walk_list(base)
        out: list[str] = []
        self._scan(base, out)
        return out

    def _scan(self, rel: str, out: list[str]) -> None:
        """``rel``'s files (``rel/name``), then each subfolder's in turn, as ``os.walk`` visits them (a link to a
        folder is a folder, never entered; a folder that cannot be read has nothing)."""
        try:
            it = os.scandir(os.path.join(self._root, rel) if rel else self._root)
        except OSError:
            return
        dirs: list[str] = []
        with it:
            for e in it:
                try:
                    is_dir = e.is_dir()
                except OSError:
                    is_dir = False
                if not is_dir:
                    out.append(f"{rel}/{e.name}" if rel else e.name)
                elif not e.is_symlink():
                    dirs.append(e.name)
        for d in dirs:
            self._scan(f"{rel}/{d}" if rel else d, out)

    def _walk_list(self, base: str) -> list[str]:
        top = os.path.join(self._root, base)
        out: list[str] = []
        for folder, _dirs, files in os.walk(top):
            rel = os.path.relpath(folder, self._root).replace(os.sep, "/")
            out.extend(f"{rel}/{f}" if rel != "." else f for f in files)
        return out

    def _list_dir(self, prefix: str) -> list[str]:
        """What ``LocalStore.list_dir`` yields: the names of files and folders."""
        try:
            return os.listdir(os.path.join(self._root, prefix))
        except (FileNotFoundError, NotADirectoryError):
            return []

    def _landed(self, keys: list[str]) -> list[float | None]:
        # ctime: a file is linked or renamed into place, which sets it; its mtime is when the bytes went
        # into the temporary file, which a writer stopped before the rename would leave early.
        out: list[float | None] = []
        for k in keys:
            try:
                out.append(os.stat(os.path.join(self._root, k)).st_ctime)
            except (FileNotFoundError, NotADirectoryError):
                out.append(None)
        return out

    def _list_stamped(self, prefix: str) -> dict[str, str]:
        # Every write renames a new file into place: a new inode while the old one is still linked, so
        # (inode, change time, size) differs from the stamp of any earlier content of the same name.
        base = prefix if prefix.endswith("/") or not prefix else prefix + "/"
        out: dict[str, str] = {}
        try:
            with os.scandir(os.path.join(self._root, base)) as it:
                for e in it:
                    try:
                        st = e.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue  # removed meanwhile
                    if stat.S_ISREG(st.st_mode):
                        out[base + e.name] = _stamp_of(st)
        except (FileNotFoundError, NotADirectoryError):
            pass
        return out

    def _stamp(self, key: str) -> str | None:
        try:
            st = os.stat(os.path.join(self._root, key), follow_symlinks=False)
        except (FileNotFoundError, NotADirectoryError):
            return None
        return _stamp_of(st) if stat.S_ISREG(st.st_mode) else None

    def _folder_stamp(self, prefix: str) -> str | None:
        # A rename into a folder, or an unlink from it, sets the folder's change and modification times.
        try:
            st = os.stat(os.path.join(self._root, prefix), follow_symlinks=False)
        except (FileNotFoundError, NotADirectoryError):
            return None
        return _stamp_of(st) if stat.S_ISDIR(st.st_mode) else None

    def stamp_settled(self, stamp: str, at: float) -> bool:
        parts = stamp.split(".")
        try:
            times = [int(parts[1], 16), int(parts[2], 16)] if len(parts) == 4 else []
        except ValueError:
            return False
        if not times:
            return False
        # The tick, read off the times: whole seconds (FAT's 2 s, ext3, some NFS servers) or 10 ms (exFAT)
        # end in zeros; the margin is three ticks, at least 50 ms (a kernel's coarse clock, HZ=100).
        tick = 1
        while tick < 10**9 and all(t % (tick * 10) == 0 for t in times):
            tick *= 10
        return max(times) / 1e9 < at - max(0.05, 3 * tick / 1e9)

    def _list_landed(self, prefix: str) -> dict[str, float]:
        base = prefix if prefix.endswith("/") or not prefix else prefix + "/"
        out: dict[str, float] = {}
        try:
            with os.scandir(os.path.join(self._root, base)) as it:
                for e in it:
                    try:
                        if e.is_file(follow_symlinks=False):
                            out[base + e.name] = e.stat(follow_symlinks=False).st_ctime
                    except FileNotFoundError:
                        continue  # removed meanwhile
        except (FileNotFoundError, NotADirectoryError):
            pass
        return out

    # -- writes ------------------------------------------------------------------
    def sync(self, keys: Sequence[str]) -> None:
        """fsync files and their folders, so a power loss cannot take back what was written."""
        if not self.fsync:
            return
        root = self.local_root
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

    def _write(self, key: str, parts: Sequence[BytesLike], exclusive: bool) -> None:
        """What zarr's ``LocalStore`` does for ``set`` (``exclusive=False``: write ``*.partial``,
        rename over) and ``set_if_not_exists`` (``True``: write ``*.partial``, ``os.link`` it into
        place, which fails if the key exists; race-free across processes), in this thread."""
        if self.read_only:
            raise ValueError("store was opened in read-only mode")  # zarr's words
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
    def _write_file(path: str, folder: str, parts: Sequence[BytesLike], exclusive: bool) -> None:
        faultpoints = fault_points()

        tmp = f"{path}.{os.urandom(16).hex()}.partial"
        left: str | None = tmp  # the *.partial file to remove at the end, if any
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
        try:
            fd = os.open(tmp, flags, 0o666)
        except FileNotFoundError:  # the folder was removed meanwhile (gc, a user): make it again
            os.makedirs(folder, exist_ok=True)
            fd = os.open(tmp, flags, 0o666)
        try:
            try:
                for part in parts:
                    mv = _as_bytes(part)
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
                left = None
        finally:
            if left is not None:
                try:
                    os.unlink(left)
                except FileNotFoundError:
                    pass

    def _write_many(self, items: Sequence[tuple[str, BytesLike]]) -> None:
        for k, d in items:
            self._write(k, (d,), exclusive=True)

    def _create_async(self, key: str, data: BytesLike) -> Future[None]:
        from concurrent.futures import Future  # a write's first use: a read-only process never loads it

        fut: Future[None] = Future()
        try:
            self.create(key, data)
            fut.set_result(None)
        except BaseException as e:  # noqa: BLE001 - the caller's result() raises it
            fut.set_exception(e)
        return fut

    def _delete_many(self, keys: list[str]) -> None:
        """What ``LocalStore.delete`` does: a file is unlinked (missing is fine), a folder removed whole."""
        if self.read_only:
            raise ValueError("store was opened in read-only mode")
        for key in keys:
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


def _plain_prefix(base: str) -> bool:
    """Whether ``base`` names a folder below the root as it is written: no empty, ``.`` or ``..`` part, no
    separator but ``/``, not absolute (what ``os.path.relpath`` would leave as it is)."""
    if not base:
        return True
    if base[0] == "/" or "\\" in base or ":" in base:
        return False
    return all(part not in ("", ".", "..") for part in base.split("/"))


def _stamp_of(st: os.stat_result) -> str:
    return f"{st.st_ino:x}.{st.st_ctime_ns:x}.{st.st_mtime_ns:x}.{st.st_size:x}"
