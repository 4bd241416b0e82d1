"""Backends: synchronous access to one store medium, whatever it is.

One module a job: ``base`` (the :class:`Backend` interface and what every
medium shares), ``local`` (a local folder served with plain system calls, in
zarr's ``LocalStore`` layout, without zarr), ``remote`` (what asynchronous
media share: requests on the event loop, retried and batched), ``objstore``
(S3, GCS and Azure through obstore, without zarr), ``zarrstore`` (any zarr v3
store: memory, zip, fsspec, a store object; the only module importing zarr),
``loop`` (the event-loop thread remote media run on), ``retry`` (their
retries), ``urls`` (opening memory, zip and URL media). :func:`open_backend`,
here, turns a location into a backend: a local folder's without loading ``urls``.

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
from pathlib import Path
TYPE_CHECKING = False  # typing's flag without importing typing (~2 ms of a first hit)
if TYPE_CHECKING:
    from typing import Any

from casmon.errors import StoreError
from casmon.store.backend.base import Backend
from casmon.store.backend.local import KEEP_OPEN, LocalBackend, LocalFolder

__all__ = ["KEEP_OPEN", "Backend", "LocalBackend", "LocalFolder", "ZarrBackend", "DEFAULT_PATH", "open_backend"]

DEFAULT_PATH = ".casmon"


def __getattr__(name: str) -> Any:
    if name == "ZarrBackend":  # loaded when asked for: it imports zarr's adapters
        from casmon.store.backend.zarrstore import ZarrBackend

        return ZarrBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
        from casmon.store.backend import urls

        return urls.open_memory(location, read_only)
    given = location
    if location.startswith("zip://"):  # a local archive, whatever its name: fsspec's zip:// reads the current folder
        from casmon.store.backend import urls

        return urls.open_zip(Path(location[len("zip://"):]).expanduser(), read_only, create, given)
    if "://" in location and not location.startswith("file://"):
        from casmon.store.backend import urls

        return urls.open_url(location, read_only, storage_options, probe)
    if location.startswith("file://"):
        location = location[len("file://") :]
    path = Path(location).expanduser()
    if path.suffix == ".zip":
        from casmon.store.backend import urls

        return urls.open_zip(path, read_only, create, given)
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


if TYPE_CHECKING:
    from casmon.store.backend.zarrstore import ZarrBackend
