"""The media :func:`casmon.store.backend.open_backend` opens other than a local folder: memory, zip archives,
URLs and zarr ``Store`` objects (a local folder's store never loads this module).

Which location opens which medium, and how an error names a location: the table in the package's
docstring (:mod:`casmon.store.backend`), beside :func:`open_backend`.
"""

from __future__ import annotations

import _thread  # threading's locks, without loading threading on a hit
TYPE_CHECKING = False  # typing's flag without importing typing (~2 ms of a first hit)
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any

from casmon.errors import StoreError
from casmon.store.backend import named
from casmon.store.backend.base import Backend

__all__ = ["open_memory", "open_zip", "open_url"]

_memory_stores: dict[str, dict[str, Any]] = {}
_memory_lock = _thread.allocate_lock()

#: URL schemes opened through obstore when it is installed (else through fsspec).
_OBSTORE_SCHEMES = ("s3", "s3a", "gs", "gcs", "az", "azure", "abfs", "abfss", "adl")


def open_memory(location: str, read_only: bool) -> Backend:
    """``memory://[name]``: the same name is the same store in this process; no name, a new one."""
    from casmon.store.backend import zarrstore

    name = location[len("memory://") :]
    with _memory_lock:
        d = _memory_stores.setdefault(name, {}) if name else {}
    return zarrstore.open_memory(d, location, read_only)


def open_url(location: str, read_only: bool, storage_options: dict[str, Any] | None, probe: str | None) -> Backend:
    """A URL's store: S3, GCS and Azure through obstore where it is installed, anything else through fsspec."""
    from casmon.store.backend import loop

    loop.note_remote_client()
    scheme = location.split("://", 1)[0]
    if scheme in _OBSTORE_SCHEMES and _has_obstore():
        from casmon.store.backend import objstore  # S3, GCS and Azure without zarr

        return objstore.open_object_store(location, read_only, storage_options or {}, probe)
    from casmon.store.backend import zarrstore

    return zarrstore.open_fsspec(location, read_only, storage_options or {})


def open_zip(path: Path, read_only: bool, create: bool = True, given: str = "") -> Backend:
    """A zip archive's store (``*.zip``, ``zip://``)."""
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
