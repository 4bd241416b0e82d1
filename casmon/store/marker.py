"""The store's format marker, ``casmon.json``: format number, creation time, and a check.

Every open reads it (:func:`read_format`) and every new store writes it, so it
lives here, apart from ``maintenance`` (verify, repair, stats), which is too
heavy to import for that. It also decides what a location must look like to
be taken for a casmon store (:data:`LAYOUT`).
"""

from __future__ import annotations

import time
TYPE_CHECKING = False  # typing's flag without importing typing (~2 ms of a first hit)
if TYPE_CHECKING:
    from typing import Any

from casmon.keys.digest import xxhash

from casmon.errors import DamagedObjectError, StoreError, StoreFormatError
from casmon.keys import jsonlite
from casmon.store import metafile
from casmon.store.backend import Backend
from casmon.errors import warn_damage

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = ["marker_bytes", "parse_marker", "read_format", "top_level", "FORMAT_KEY", "FORMAT_VERSION", "LAYOUT"]

FORMAT_KEY = "casmon.json"
#: 2: tables' generations are written as blocks with a bloom filter (casmon.store.table); format-1 stores
#: are read as they are and marked format 2 before the first such generation is written.
FORMAT_VERSION = 2
_MARKER_MAX = 1 << 20
#: Top-level names a casmon store may hold (``runs-index`` and ``derived`` hold derived data: indexes a reader
#: rebuilds); anything else means "not a casmon store".
LAYOUT = ("casmon.json", "objects", "packs", "index", "records", "refs", "gc", "runs-index", "derived")


def _marker_check(info: dict[str, Any]) -> str:
    body = {k: v for k, v in info.items() if k != "check"}
    return xxhash.xxh3_64_hexdigest(jsonlite.dumps(body, sort_keys=True, separators=(",", ":")).encode())


def marker_bytes(extra: dict[str, Any] | None = None) -> bytes:
    """A new ``casmon.json``: format, creation time, and a check of both (so damage is told from a newer format)."""
    info = {"casmon": "content-addressed call store", "format": FORMAT_VERSION, "created": time.time(), **(extra or {})}
    info["check"] = _marker_check(info)
    import json  # a new store's: opening one reads only

    return json.dumps(info, indent=1).encode()


def parse_marker(data: bytes | bytearray | memoryview | npt.NDArray[np.uint8]) -> tuple[dict[str, Any], str | None]:
    """``(info, None)`` for a sound marker, ``({}, what is wrong)`` for a damaged one.

    Markers written before the check field are accepted as they are.
    """
    try:
        info = metafile.load_object(data, FORMAT_KEY, limit=_MARKER_MAX, numbers=False)
        if type(info.get("format")) is not int or info["format"] < 1:
            raise DamagedObjectError(FORMAT_KEY, "no format number")
    except DamagedObjectError as e:
        return {}, f"not a casmon store marker: {e.reason}"
    if "check" in info and info["check"] != _marker_check(info):
        return {}, "its content does not match its check"
    return info, None


def top_level(backend: Backend) -> list[str]:
    """What a location holds at its top, less hidden names and the ``*.partial`` files writers
    link or rename into place: a store another process is creating holds only
    ``casmon.json.<uuid>.partial`` for a moment, and that is no foreign file."""
    return [k for k in backend.list_dir("") if not k.startswith(".") and not k.endswith(".partial")]


def read_format(backend: Backend, url: str, create: bool = True) -> dict[str, Any]:
    """Read ``casmon.json`` (or write it in a new store; ``create=False``: an empty location raises
    :class:`StoreError`) and check the store's format.

    A damaged or missing marker in a folder that holds only a casmon store's
    layout does not stop anyone: the store opens as format
    ``FORMAT_VERSION`` with a warning, ``format["damaged"]`` says what is
    wrong, ``verify`` reports it and ``verify --repair`` writes a new
    marker. A marker that is sound and names a newer format is refused.
    """
    data = backend.get(FORMAT_KEY)
    top = None
    if data is None:
        top = top_level(backend)
        foreign = [k for k in top if k.rstrip("/") not in LAYOUT]
        if foreign:
            raise StoreFormatError(
                f"{url} is not a casmon store: it holds {', '.join(sorted(foreign)[:5])} "
                f"and no {FORMAT_KEY}; choose an empty folder or an existing store"
            )
        if not top and not create:
            raise StoreError(f"no casmon store at {url}: it is empty")
        if backend.read_only:
            if not top:
                raise StoreFormatError(f"{url} is not a casmon store (no {FORMAT_KEY}) and is opened read-only")
            missing = f"{FORMAT_KEY} is missing"
            warn_damage(url, FORMAT_KEY, missing)
            return {"format": FORMAT_VERSION, "damaged": missing}
        try:
            backend.create(FORMAT_KEY, marker_bytes())
        except OSError as e:
            raise StoreError(f"cannot write to store {url}: {e.strerror or e}") from None
        data = backend.get(FORMAT_KEY)
        if data is None:
            raise StoreError(f"cannot write to store {url}: {FORMAT_KEY} did not persist")
        from casmon.store import reserve  # a new store's: opening one never loads it

        reserve.ensure(backend)  # room for gc on a full disk
    info, problem = parse_marker(data)
    if problem is not None:
        if top is None:
            top = top_level(backend)
        if any(k.rstrip("/") not in LAYOUT for k in top):
            raise StoreFormatError(f"{url}: {FORMAT_KEY} is damaged or not a casmon store marker ({problem})")
        warn_damage(url, FORMAT_KEY, problem)
        return {"format": FORMAT_VERSION, "damaged": problem}
    version = info["format"]
    if version > FORMAT_VERSION:
        raise StoreFormatError(
            f"{url} was written in casmon store format {version}; this casmon reads format "
            f"{FORMAT_VERSION} and older. Upgrade casmon to open it."
        )
    return info
