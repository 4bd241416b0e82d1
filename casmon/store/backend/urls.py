"""``open_backend(location)``: a store location (a path, a URL or a zarr ``Store``) to a :class:`Backend`.

=====================  ==========================================
``None`` / a path      :class:`LocalFolder` (default ``./.casmon``), laid out as ``LocalStore``
``memory://[name]``    ``MemoryStore``; the same name is the same store in a process
``*.zip``, ``zip://``   ``ZipStore`` (one writer at a time; nothing is ever deleted)
``s3://``, ``gs://``,   ``ObjectStore`` (obstore): conditional puts make create-if-absent race-free;
``az://``              credentials from the environment or ``storage_options``
other URLs             ``FsspecStore.from_url`` (its create-if-absent is check-then-set: one writer at a time)
a ``Store`` instance   used as it is
=====================  ==========================================

A URL's credentials are never shown or kept: the backend's ``url`` and every
error name the location through :func:`casmon.scrub.scrub_url`. An error about a
local path names it as it was given (``zip:///x``, ``~/s``), and the path it
means where that differs.
"""

from __future__ import annotations

import os
import _thread  # threading's locks, without loading threading on a hit
from pathlib import Path
TYPE_CHECKING = False  # typing's flag without importing typing (~2 ms of a first hit)
if TYPE_CHECKING:
    from typing import Any

from casmon.errors import StoreError
from casmon.store.backend.base import Backend
from casmon.store.backend.local import LocalBackend, LocalFolder

__all__ = ["DEFAULT_PATH", "open_backend"]

DEFAULT_PATH = ".casmon"

_memory_stores: dict[str, dict[str, Any]] = {}
_memory_lock = _thread.allocate_lock()

#: URL schemes opened through obstore when it is installed (else through fsspec).
_OBSTORE_SCHEMES = ("s3", "s3a", "gs", "gcs", "az", "azure", "abfs", "abfss", "adl")


def open_backend(location: Any = None, *, read_only: bool = False, storage_options: dict[str, Any] | None = None,
                 create: bool = True, probe: str | None = None) -> Backend:
    """Open (creating if needed) the store at ``location``; see the module docstring.

    ``create=False``: a local folder or zip file that does not exist is refused, not made.
    A file that is not a zip archive is never opened as a zip store (it would be appended to).
    ``probe``: a key the caller reads next; a remote medium is reached by reading it (:meth:`Backend.reach`).
    """
    if isinstance(location, Backend):
        return location
    if location is None:
        location = DEFAULT_PATH
    if isinstance(location, os.PathLike):
        location = os.fspath(location)
    # zarr's adapters load only for the media that need them: a local folder never imports zarr or asyncio.
    if not isinstance(location, str):
        from casmon.store.backend import zarrstore

        return zarrstore.from_store_object(location)
    if location.startswith("memory://"):
        from casmon.store.backend import zarrstore

        name = location[len("memory://") :]
        with _memory_lock:
            d = _memory_stores.setdefault(name, {}) if name else {}
        return zarrstore.open_memory(d, location, read_only)
    given = location
    if location.startswith("zip://"):  # a local archive, whatever its name: fsspec's zip:// reads the current folder
        return _open_zip(Path(location[len("zip://"):]).expanduser(), read_only, create, given)
    if "://" in location and not location.startswith("file://"):
        from casmon.store.backend import loop

        loop.note_remote_client()
        scheme = location.split("://", 1)[0]
        if scheme in _OBSTORE_SCHEMES and _has_obstore():
            from casmon.store.backend import objstore  # S3, GCS and Azure without zarr

            return objstore.open_object_store(location, read_only, storage_options or {}, probe)
        from casmon.store.backend import zarrstore

        return zarrstore.open_fsspec(location, read_only, storage_options or {})
    if location.startswith("file://"):
        location = location[len("file://") :]
    path = Path(location).expanduser()
    if path.suffix == ".zip":
        return _open_zip(path, read_only, create, given)
    return _open_local(path, read_only, create, given)


def named(path: Path, given: str) -> str:
    """A local store's path as the user gave it, with the path it means when that reads otherwise."""
    return given if given == str(path) else f"{given} ({path})"


def _open_local(path: Path, read_only: bool, create: bool = True, given: str = "") -> Backend:
    at = named(path, given or str(path))
    if path.exists() and not path.is_dir():
        raise StoreError(f"cannot open store at {at}: it is a file, not a folder")
    if read_only or not create:
        if not path.is_dir():
            raise StoreError(f"cannot open store at {at}: no such folder")
    else:
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StoreError(f"cannot create store folder {at}: {e.strerror or e}") from None
        if not os.access(path, os.W_OK | os.X_OK):
            raise StoreError(f"cannot write to store folder {at}: permission denied")
    return LocalBackend(LocalFolder(path.resolve(), read_only=read_only), str(path))


def _open_zip(path: Path, read_only: bool, create: bool = True, given: str = "") -> Backend:
    import zipfile

    at = named(path, given or str(path))
    if path.exists() and path.is_dir():
        raise StoreError(f"cannot open zip store at {at}: it is a folder")
    if (read_only or not create) and not path.exists():
        raise StoreError(f"cannot open zip store at {at}: no such file")
    from casmon.store.backend import zarrstore

    zarrstore.check_no_zip_writer(path)  # its archive has no directory until it is closed: not "not a zip archive"
    # zipfile's append mode adds an archive to the end of any file: only a zip archive (or an empty file) is ours to open.
    if path.is_file() and path.stat().st_size > 0 and not zipfile.is_zipfile(path):
        raise StoreError(f"cannot open zip store at {at}: the file is not a zip archive (left untouched)")
    if not create and path.is_file() and path.stat().st_size == 0:
        raise StoreError(f"no casmon store at {at}: the file is empty")
    if not read_only:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StoreError(f"cannot create folder for {at}: {e.strerror or e}") from None
    return zarrstore.open_zip(path, read_only)


def _has_obstore() -> bool:
    try:
        import obstore  # noqa: F401
    except ImportError:
        return False
    return True
