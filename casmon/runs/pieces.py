"""Large files of a run, kept in content-defined pieces, streamed in and out.

A file of :data:`PIECED_MIN` bytes or more is read a block at a time and cut by
:mod:`casmon.store.cdc` (a gear hash, about 1 MiB pieces); each piece is stored as a bytes value, and a
*piece list* ``{"casmon_pieces": 1, "size": n, "pieces": [[digest, size], ...]}`` names them in order. A
file with bytes inserted or changed in one place shares every other piece with its earlier version, across
runs. The artifact record names the piece list and every piece (its ``_refs``), so gc keeps them all; a
smaller file is one bytes value, as before. Reading back streams the pieces in order, each checked by
the store against its digest; a piece list that does not add up is a :class:`DamagedObjectError`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import IO, TYPE_CHECKING, Any

from casmon import faultpoints
from casmon.errors import DamagedObjectError
from casmon.keys.digest import Digest
from casmon.store import cdc
from casmon.store.peek import load_data

if TYPE_CHECKING:
    from casmon.store.store import Store

__all__ = ["PIECED_MIN", "PIECES_TAG", "put_stream", "chunks", "read_all"]

#: Files at least this large are cut into content-defined pieces; smaller ones are one value.
PIECED_MIN = 4 << 20
PIECES_TAG = "casmon_pieces"
_READ = 4 << 20


def put_stream(store: Store, f: IO[bytes]) -> tuple[Digest, list[Digest], int]:
    """Store what the binary stream ``f`` (a buffered reader: ``read(n)`` returns ``n`` bytes until the end) holds:
    ``(digest, every digest it needs, bytes read)``. Holds about :data:`PIECED_MIN` plus a piece in memory."""
    first = f.read(PIECED_MIN)
    if len(first) < PIECED_MIN:
        d = store.put(first)
        return d, [d], len(first)
    cutter = cdc.Cutter()
    pieces: list[list[Any]] = []
    refs: list[Digest] = []
    block = first
    while block:
        for p in cutter.feed(block):
            _put(store, p, pieces, refs)
        block = f.read(_READ)
    for p in cutter.end():
        _put(store, p, pieces, refs)
    total = sum(n for _, n in pieces)
    listing = store.put({PIECES_TAG: 1, "size": total, "pieces": pieces})
    faultpoints.point("pieces.after_listing")
    return listing, [listing, *refs], total


def _put(store: Store, piece: bytes, pieces: list[list[Any]], refs: list[Digest]) -> None:
    d = store.put(piece)
    refs.append(d)
    pieces.append([d.hex(), len(piece)])
    faultpoints.point("pieces.after_piece")


def chunks(store: Store, digest: str, what: str, size: int | None = None) -> Iterator[bytes]:
    """The bytes of stored file value ``digest`` (one value, or its pieces in order), a piece at a time; a piece
    damaged, missing or of another size than listed raises (DamagedObjectError, MissingObjectError), and so
    does a file of another ``size`` than its record says, before any byte is given (a download announces
    that size first)."""
    got = load_data(store, digest, what, (bytes, bytearray, dict))
    if not isinstance(got, dict):
        _check_size(digest, what, len(got), size)
        yield bytes(got)
        return
    pieces, total = got.get("pieces"), got.get("size")
    if got.get(PIECES_TAG) != 1 or not isinstance(pieces, list) or type(total) is not int or not all(
            isinstance(p, list) and len(p) == 2 and isinstance(p[0], str) and type(p[1]) is int and p[1] >= 0
            for p in pieces) or sum(p[1] for p in pieces) != total:
        raise DamagedObjectError(f"value {digest}", f"{what}: not a list of a file's pieces")
    _check_size(digest, what, total, size)
    for i, (h, n) in enumerate(pieces):
        b = load_data(store, h, f"{what}, piece {i}", (bytes, bytearray))
        if len(b) != n:
            raise DamagedObjectError(f"value {h}", f"{what}, piece {i}: {len(b)} bytes, its list says {n}")
        yield bytes(b)


def _check_size(digest: str, what: str, has: int, said: int | None) -> None:
    if said is not None and has != said:
        raise DamagedObjectError(f"value {digest}", f"{what}: {has:,} bytes, its record says {said:,}")


def read_all(store: Store, digest: str, what: str, size: int | None = None) -> bytes:
    return b"".join(chunks(store, digest, what, size))
