"""Backends: synchronous access to one store medium, whatever it is.

One module a job: ``base`` (the :class:`Backend` interface and what every
medium shares), ``local`` (a local folder served with plain system calls, in
zarr's ``LocalStore`` layout, without zarr), ``remote`` (what asynchronous
media share: requests on the event loop, retried and batched), ``objstore``
(S3, GCS and Azure through obstore, without zarr), ``zarrstore`` (any zarr v3
store: memory, zip, fsspec, a store object; the only module importing zarr),
``loop`` (the event-loop thread remote media run on), ``retry`` (their
retries), ``urls`` (:func:`open_backend`: a location to a backend).
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing's flag without importing typing (~2 ms of a first hit)
if TYPE_CHECKING:
    from typing import Any

from casmon.store.backend.base import Backend
from casmon.store.backend.local import KEEP_OPEN, LocalBackend, LocalFolder
from casmon.store.backend.urls import open_backend

__all__ = ["KEEP_OPEN", "Backend", "LocalBackend", "LocalFolder", "ZarrBackend", "open_backend"]


def __getattr__(name: str) -> Any:
    if name == "ZarrBackend":  # loaded when asked for: it imports zarr's adapters
        from casmon.store.backend.zarrstore import ZarrBackend

        return ZarrBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if TYPE_CHECKING:
    from casmon.store.backend.zarrstore import ZarrBackend
