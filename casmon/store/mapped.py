"""Memory-mapped results: a large array's stored bytes handed back as a read-only map, not a copy.

``Store.put(value, mmap=True)`` (what ``@casmon.cache(mmap=True)`` stores its
results with) lays out every numeric part -- an array's data, a tensor's
elements, the array buffers of a pickled object -- of at least :data:`MAP_MIN`
bytes and at most :data:`~casmon.store.serialize.MAX_CHUNK` (1 GiB) that does
not compress (:func:`casmon.store.codec.worth_compressing`) as **one raw loose
object**: a 40-byte frame header, then the part's bytes as they are. Its
manifest names it as a part of one chunk (``cb == n``), a form every reader of
the format already understands, so nothing else changes: plain ``get``, gc,
verify and repair read it like any chunk. ``Store.get(digest, mmap=True)``
then maps that file once and returns the array over the bytes after its header
(:func:`map_part`). Equal arrays have one digest, so one file: stored once.

Why this layout and not ordered chunks in one file: a part's chunks are
shared by content with other values (a changed row adds one chunk), so the
chunks of an edited array are spread over several files and could not be
mapped as one range anyway; one object per part keeps the content address,
needs no new kind of file and no index entry, and needs no new format. The
price is that a part laid out whole is deduplicated whole (an array with one
element changed is a second copy, not one new chunk), is read whole by
``open_array``, and is stored twice if it is also put without ``mmap``
(the chunked layout gives other digests): hence opt-in.

What is not mapped loads as a normal copy, silently: values stored without the
layout (older, put without ``mmap``, compressible, or parts over 1 GiB), parts
below :data:`MAP_MIN`, ``bytes`` values (they are copied into ``bytes``
anyway), and a copy of the object that gc's protocol put into a pack. Only a
local folder has files to map: on S3, zip and memory stores ``mmap=True``
loads normally and warns once per store (:class:`MapFallbackWarning`).

The digest is checked when the part is mapped: the whole map is hashed once
with xxh3-128, at memory speed (about 40 ms a GiB here, a fifth of copying
it), before anything is returned. Not on first touch: numpy hands out plain
memory, with no hook on a page's first read, so a check there would let
damaged bytes reach the caller before anything could say so. Not in parallel
halves: the object has one digest (its content address), and two threads
hashing halves of a mapped GiB measured no faster on this machine (memory
bound). A mismatch raises :class:`~casmon.errors.DamagedObjectError` and marks
the object suspect, so the recomputed value's put rewrites it.

Arrays (``array`` and ``pickle`` values) map ``PROT_READ``: they are read-only
and a write raises. A handler's buffers (torch tensors) map copy-on-write
(``MAP_PRIVATE``): a handler may keep and write its buffers, and torch has no
read-only tensors, so an in-place write changes this process's copy of the
touched pages only, never the store (a shared read-only map would kill the
process with SIGSEGV instead). Either way the map keeps the file's inode: the
array stays valid after the store is closed, and after gc unlinks the object
(Linux, macOS); casmon never rewrites an object in place (a damaged one is
replaced by a rename), so a map never sees its bytes change.
"""

from __future__ import annotations

import os
import threading
import warnings
import weakref
from typing import TYPE_CHECKING, Any

import xxhash

from casmon.errors import DamagedObjectError, stacklevel_outside
from casmon.keys.digest import Digest
from casmon.store import serialize
from casmon.store.codec import CODECS, FRAME_HEADER, read_header, worth_compressing
from casmon.store.objects import loose_key

if TYPE_CHECKING:
    import numpy as np

    from casmon.store.manifest import PartRef
    from casmon.store.objects import ObjectStore
    from casmon.store.store import Store

__all__ = ["MAP_MIN", "MapFallbackWarning", "lays_out_whole", "map_part", "mappable_tag", "note_fallback", "RAW"]

#: Parts smaller than this are stored and loaded as usual even with ``mmap=True``: a copy costs less
#: than a map's system calls and page faults there.
MAP_MIN = 1 << 20
#: The codec a part laid out whole is stored with: none, so the file holds the part's bytes as they are.
RAW = CODECS["none"]
#: More samples than a chunk's probe: one verdict decides the layout of up to a GiB.
_PROBE_SLICES = 16
#: casmon's own files: the fallback warning points at the first frame outside them, the user's line.
_CASMON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
#: Forms whose parts come back through numpy buffers that can be a map (``bytes`` values are copied
#: into ``bytes`` by their decoding, and ``json`` values have no parts).
_MAPPABLE_TAGS = frozenset({"array", "pickle", "handler"})


class MapFallbackWarning(UserWarning):
    """``mmap=True`` on a store that has no files to map (S3, zip, memory): values load as normal copies."""


def lays_out_whole(store: Store, part: serialize.Part) -> bool:
    """Whether ``part``, put with ``mmap=True``, is stored as one raw object that :func:`map_part` can map."""
    n = part.data.nbytes
    if not part.numeric or not MAP_MIN <= n <= serialize.MAX_CHUNK or store.backend.local_root is None:
        return False
    return not worth_compressing(part.data, store.array_codec, part.typesize, slices=_PROBE_SLICES)


def mappable_tag(tag: str) -> bool:
    """Whether a value of form ``tag`` can come back over mapped buffers."""
    return tag in _MAPPABLE_TAGS


def map_part(objects: ObjectStore, part: PartRef, copy_on_write: bool = False) -> np.ndarray[Any, np.dtype[np.uint8]] | None:
    """The bytes of ``part`` as a checked map of its one raw loose object; None where it is not laid out so.

    None sends the caller to the normal read, which finds a packed copy, or says
    the object is missing: a part of several chunks, one below :data:`MAP_MIN`,
    one whose object is compressed or is no loose file. Raises
    :class:`DamagedObjectError` if the file is there and damaged (header, size,
    length, digest). ``copy_on_write``: a writable private map (see the module).
    """
    import mmap  # loaded by the first mapped read only

    import numpy as np

    n = int(part["n"])
    chunks = part["c"]
    if n < MAP_MIN or len(chunks) != 1:
        return None
    d = Digest(chunks[0])
    key = loose_key(d)
    path = objects.backend.local_path(key)
    if path is None:
        return None
    try:
        f = open(path, "rb", buffering=0)
    except FileNotFoundError:
        return None
    objects.backend.requests += 1
    with f:
        try:
            frame = read_header(f.read(FRAME_HEADER), key)
            if frame.digest != d:
                raise DamagedObjectError(key, f"header names digest {frame.digest.hex()}, expected {d.hex()}")
            size = os.fstat(f.fileno()).st_size
            if size != FRAME_HEADER + frame.stored_len:
                raise DamagedObjectError(key, f"payload is {size - FRAME_HEADER} bytes, header says "
                                              f"{frame.stored_len} (truncated or extended)")
            if frame.codec != 0:
                return None  # compressed: decoded into a copy by the normal read
            if frame.raw_len != n or frame.stored_len != n:
                raise DamagedObjectError(key, f"raw length {frame.raw_len} does not fit the {n} bytes its value's "
                                              "manifest says")
            # The map holds the file (its inode), not this descriptor: closing f below leaves it valid.
            m = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY if copy_on_write else mmap.ACCESS_READ)
        except DamagedObjectError:
            objects.found_damaged(d)
            raise
    # Over the map itself (its ``base`` is the mmap, as with ``np.memmap``), read-only unless copy-on-write.
    buf: np.ndarray[Any, np.dtype[np.uint8]] = np.ndarray((n,), dtype=np.uint8, buffer=m, offset=FRAME_HEADER)
    if xxhash.xxh3_128_digest(buf.data) != bytes(d):
        objects.found_damaged(d)
        raise DamagedObjectError(key, "content does not match its digest")
    return buf


_warned: weakref.WeakSet[Store] = weakref.WeakSet()
_warned_lock = threading.Lock()


def note_fallback(store: Store) -> None:
    """Warn, once per store, that ``mmap=True`` loads copies here (the store is not a local folder)."""
    with _warned_lock:
        if store in _warned:
            return
        _warned.add(store)
    warnings.warn(f"casmon: {store.url} is not a local folder, so mmap=True cannot map its values; "
                  "they load as normal copies", MapFallbackWarning, stacklevel=stacklevel_outside(_CASMON_DIR))
