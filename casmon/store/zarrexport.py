"""``store.export_zarr(out, *what)``: the store's zarr view (or part of it) written as a real zarr v3 hierarchy.

The export is what :mod:`casmon.store.zarrview` presents, made by zarr itself
(``zarr.create_group`` / ``zarr.create_array``), so zarr-python, xarray and
tensorstore open it without casmon: ``zarr.json`` files, chunks compressed
with Blosc-LZ4, zarr's sharding where an array's chunks are many and small,
and the root's consolidated metadata. Values zarr cannot present (pickles,
dicts) are groups whose attributes describe them; nothing is unpickled.

Media: a local folder (chunks with equal bytes are one file, hard-linked), a
``.zip`` file, or an object store URL (``s3://...``, through the same client
casmon's stores use). A folder or zip is written beside its target and moved
into place when complete, so a killed export leaves no half hierarchy under
the target's name (and the next export to it removes the dead one's copy); on an object store every object is written only where
none is (a prefix that holds anything is refused, and one that gains an
object while exporting fails the export, overwriting nothing), and the root's
``zarr.json`` is written last, so a killed export leaves no hierarchy a
reader opens.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import shutil
import tempfile
import warnings
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import zarr
from zarr.codecs import BloscCodec
from zarr.storage import LocalStore, WrapperStore

from casmon.errors import CasmonError, StoreError
from casmon.keys.digest import digest_bytes
from casmon.store.arrayview import ChunkView
from casmon.store.zarrchunks import copy_chunks
from casmon.store.zarrview import Tree, ZarrView, node_name, open_view

if TYPE_CHECKING:
    from zarr.abc.buffer import Buffer
    from zarr.abc.store import Store as ZarrStore

    from casmon.store.store import Store

__all__ = ["ExportError", "Exported", "export_zarr", "layout", "select"]

#: Past this many chunks of at most :data:`SMALL_CHUNK` bytes, an array is sharded.
SHARD_PAST = 64
SMALL_CHUNK = 1 << 20
#: A shard holds at most this many chunks and bytes (write-once data: zarr rewrites a shard whole).
SHARD_CHUNKS = 1024
SHARD_BYTES = 64 << 20
#: Rows copied at a time hold about this many bytes (memory stays bounded for any array).
BLOCK_BYTES = 64 << 20


class ExportError(CasmonError, ValueError):
    """An export that cannot start: a target that exists, or something to export the store does not hold."""


@dataclass
class Exported:
    """What an export wrote."""

    url: str
    groups: int = 0
    arrays: int = 0
    nbytes: int = 0  # of the arrays' values, uncompressed
    linked: int = 0  # chunk files that are hard links to an equal one


def layout(shape: tuple[int, ...], chunks: tuple[int, ...], itemsize: int) -> tuple[tuple[int, ...], tuple[int, ...] | None]:
    """The chunks and shards an exported array gets: the view's chunks, sharded where they are many and small."""
    chunks = tuple(max(1, min(c, s)) if s else max(1, c) for c, s in zip(chunks, shape))
    if not shape or 0 in shape:
        return chunks, None
    counts = [-(-s // c) for s, c in zip(shape, chunks)]
    nbytes = math.prod(chunks) * itemsize
    if math.prod(counts) <= SHARD_PAST or nbytes >= SMALL_CHUNK:
        return chunks, None
    per = [1] * len(shape)
    for axis in range(len(shape)):  # grow the shard along the first axes (the rows) first
        room = min(SHARD_CHUNKS // math.prod(per), SHARD_BYTES // (nbytes * math.prod(per)))
        per[axis] = max(1, min(counts[axis], room))
        if per[axis] < counts[axis]:
            break
    if math.prod(per) == 1:
        return chunks, None
    return chunks, tuple(c * k for c, k in zip(chunks, per))


def select(tree: Tree, what: tuple[str, ...], url: str) -> set[str] | None:
    """The node paths ``what`` names (runs by name, cached or logged functions by name, cache entries by key or a
    unique key prefix of at least 8 hex digits, or node paths), or None for everything."""
    if not what:
        return None
    chosen: set[str] = set()
    runs = tree.listing("runs")
    functions = tree.listing("cache")
    for item in what:
        if not isinstance(item, str) or not item:
            raise ExportError(f"cannot export {item!r} from {url}: name a run, a cached function or a cache entry")
        found = set()
        tree.ensure(item.strip("/"))
        if item.strip("/") in tree.meta:
            found.add(item.strip("/"))
        name = node_name(item)
        if name in runs:
            found.add(f"runs/{name}")
        if name in functions:
            found.add(f"cache/{name}")
        if name in tree.listing("calls"):
            found.add(f"calls/{name}")
        key = item.lower()
        if not found and len(key) >= 8 and all(c in "0123456789abcdef" for c in key):
            for f in functions:
                tree.ensure(f"cache/{f}")
            found = {f"cache/{f}/{e}" for f in functions for e in tree.listing(f"cache/{f}") if e.startswith(key)}
            if len(found) > 1 and not any(p.endswith("/" + key) for p in found):
                raise ExportError(f"{item!r} names {len(found)} cache entries of {url}: give more of the key")
        if not found:  # a run by the name in its manifest, where that differs from its ref's
            tree.expand("runs")
            found = {f"runs/{r}" for r in runs if tree.meta.get(f"runs/{r}", {}).get("attributes", {}).get("name") == item}
        if not found:
            raise ExportError(f"{item!r} is not a run, a cached or logged function or a cache entry key of {url}")
        chosen |= found
    return chosen


def _wanted(path: str, chosen: set[str] | None) -> bool:
    if chosen is None:
        return True
    return any(path == c or path.startswith(c + "/") or c.startswith(path + "/") for c in chosen)


class _LinkingStore(LocalStore):
    """A ``LocalStore`` that writes a chunk (or shard) equal to one it wrote before as a hard link to it."""

    def __init__(self, root: Path | str, *, read_only: bool = False) -> None:
        super().__init__(root, read_only=read_only)
        self._first: dict[bytes, tuple[Path, asyncio.Event]] = {}
        self._named: dict[str, bytes] = {}
        self.linked = 0

    def name(self, key: str, name: bytes) -> None:
        """The bytes written next at ``key`` are those ``name`` names (a stored chunk copied as stored): equal
        names, equal bytes, so they need not be hashed to be linked."""
        self._named[key] = name

    async def set(self, key: str, value: Buffer) -> None:
        if key.rpartition("/")[2] == "zarr.json":
            await super().set(key, value)
            return
        seen = self._named.pop(key, None)
        if seen is None:
            data = value.as_numpy_array()
            seen = b"h" + bytes(digest_bytes(data.view("u1").reshape(-1))) + len(data).to_bytes(8, "little")
        path = Path(str(self.root)) / key
        first = self._first.get(seen)
        if first is None:  # the first of its bytes: written, and the equal ones written meanwhile wait for it
            written = asyncio.Event()
            self._first[seen] = (path, written)
            try:
                await super().set(key, value)
            except BaseException:
                del self._first[seen]
                raise
            finally:
                written.set()
            return
        await first[1].wait()
        if first[0] != path and self._first.get(seen) is first:
            path.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            try:
                os.link(first[0], path)
            except OSError:  # a folder without links, or one file linked to its limit: a copy
                pass
            else:
                self.linked += 1
                return
        await super().set(key, value)


def _blank_local(path: Path, what: str) -> None:
    if path.is_dir() and any(path.iterdir()) or path.exists() and not path.is_dir():
        raise ExportError(f"cannot export to {path}: it exists ({what}); name a new {what.split()[-1]}")


@contextlib.contextmanager
def _target(out: str | os.PathLike[str], inside: Path | None) -> Iterator[tuple[ZarrStore, Exported, Any]]:
    """The zarr store to write, an :class:`Exported` to fill, and what reports the links made; on a clean exit
    the hierarchy is moved into place (a folder, a zip), on an error what was written is removed."""
    text = os.fspath(out)
    if "://" in text and not text.startswith(("file://", "zip://")):
        yield from from_remote(text)
        return
    zipped = text.startswith("zip://") or text.endswith(".zip")
    path = Path(text.removeprefix("file://").removeprefix("zip://")).expanduser().absolute()
    if inside is not None and path.resolve().is_relative_to(inside.resolve()):
        raise ExportError(f"cannot export to {path}: it is inside the store being exported ({inside})")
    _blank_local(path, "a zip file" if zipped else "a non-empty folder")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _clear_dead(path)
        work = Path(tempfile.mkdtemp(prefix=_partial_prefix(path) + f"{os.getpid()}.", suffix=".partial",
                                     dir=path.parent))
    except OSError as e:
        raise StoreError(f"cannot export to {path}: {e.strerror or e}") from None
    try:
        zs = _LinkingStore(work / "z")
        done = Exported(str(path))
        yield zs, done, zs
        if zipped:
            done.linked = 0  # the links were in the folder zipped: the zip holds each file's bytes again
            part = work / "z.zip"
            with zipfile.ZipFile(part, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
                for f in sorted((work / "z").rglob("*")):
                    if f.is_file():
                        zf.write(f, f.relative_to(work / "z").as_posix())
            try:
                os.link(part, path)  # never over a file that appeared meanwhile (another export's, say)
            except FileExistsError:
                raise ExportError(f"cannot export to {path}: it exists (a zip file); name a new zip file") from None
        else:
            _blank_local(path, "a non-empty folder")
            os.rename(work / "z", path)  # onto an empty folder too
    except OSError as e:
        raise StoreError(f"cannot export to {path}: {e.strerror or e}") from None
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _partial_prefix(path: Path) -> str:
    """How the hidden copies of exports to ``path`` made on this host are named, before the exporter's pid."""
    import socket
    import zlib

    return f".{path.name}.{zlib.crc32(socket.gethostname().encode('utf-8', 'replace')):08x}-"


def _clear_dead(path: Path) -> None:
    """Remove the hidden copies that exports to ``path`` killed on this host left (their process is gone): each
    could hold the whole store's bytes. A copy of a running export, another host's or an unnamed one stays."""
    if os.name != "posix":  # no signal-0 probe of a process
        return
    prefix = _partial_prefix(path)
    try:
        names = os.listdir(path.parent)
    except OSError:
        return
    for name in names:
        pid = name[len(prefix):].partition(".")[0]
        if not name.startswith(prefix) or not name.endswith(".partial") or not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(path.parent / name, ignore_errors=True)
        except (OSError, OverflowError):  # alive under another user, or no pid at all: left alone
            continue


def from_remote(url: str) -> Iterator[tuple[ZarrStore, Exported, Any]]:
    """An object store URL as an export target: refused unless nothing is stored under it yet."""
    from zarr.core.sync import sync

    from casmon.store.backend import open_backend

    backend = open_backend(url)
    if backend.list_dir(""):
        raise ExportError(f"cannot export to {backend.url}: something is stored there already; name a new prefix")
    from casmon.store.backend import loop

    loop.guard(sync(_running_loop()))  # zarr's loop gets obstore's results: the exit waits for them as for casmon's
    zs = _Staged(backend.zstore, backend.url)
    yield zs, Exported(backend.url), None
    sync(zs.publish())


async def _running_loop() -> asyncio.AbstractEventLoop:
    return asyncio.get_running_loop()


class _Staged(WrapperStore[Any]):
    """An object store target that writes each key only where nothing is, and holds the root's ``zarr.json``
    until :meth:`publish`: until then no reader sees a hierarchy, and nothing another writer put is replaced."""

    ROOT = "zarr.json"

    def __init__(self, store: Any, url: str) -> None:
        super().__init__(store)
        self._url = url
        self._root: Buffer | None = None
        self._ours: set[str] = set()

    async def _create(self, key: str, value: Buffer) -> None:
        client = getattr(self._store, "store", None)
        if client is None:  # not obstore: no conditional put, so the best is to look first
            if await self._store.exists(key):
                self._appeared(key)
            await self._store.set(key, value)
        else:
            import obstore

            try:
                await obstore.put_async(client, key, value.as_buffer_like(), mode="create")
            except obstore.exceptions.AlreadyExistsError:
                self._appeared(key)
        self._ours.add(key)

    def _appeared(self, key: str) -> NoReturn:
        raise ExportError(f"cannot export to {self._url}: {key} was stored there by someone else while exporting; "
                          "name a new prefix")

    async def get(self, key: str, prototype: Any, byte_range: Any = None) -> Buffer | None:
        if key == self.ROOT and byte_range is None:
            return self._root
        got: Buffer | None = await self._store.get(key, prototype, byte_range)
        return got

    async def exists(self, key: str) -> bool:
        return self._root is not None if key == self.ROOT else await self._store.exists(key)

    async def set(self, key: str, value: Buffer) -> None:
        if key == self.ROOT:
            self._root = value
        elif key in self._ours:
            await self._store.set(key, value)
        else:
            await self._create(key, value)

    async def set_if_not_exists(self, key: str, value: Buffer) -> None:
        if key == self.ROOT:
            self._root = self._root or value
        elif key not in self._ours:
            await self._create(key, value)

    async def _set_many(self, values: Any) -> None:
        for key, value in values:
            await self.set(key, value)

    async def publish(self) -> None:
        """Write the root's ``zarr.json`` (with the consolidated metadata): the hierarchy now opens."""
        if self._root is not None:
            await self._create(self.ROOT, self._root)


def _copy(src: zarr.Array[Any], dst: zarr.Array[Any]) -> None:
    if not src.shape:
        dst[...] = src[...]
        return
    if 0 in src.shape:
        return
    unit = (dst.shards or dst.chunks)[0]
    row = max(1, math.prod(src.shape[1:]) * src.dtype.itemsize)
    step = unit * max(1, BLOCK_BYTES // (row * unit))
    for lo in range(0, src.shape[0], step):
        dst[lo : lo + step] = src[lo : lo + step]


def _array(dst: ZarrStore, path: str, src: zarr.Array[Any], meta: dict[str, Any], store: Store | None = None,
           stored: Any = None, linking: _LinkingStore | None = None) -> int:
    """Write the view's array ``src`` at ``path``: from its stored chunks where they are its chunks (``stored``, a
    :class:`ChunkView`) and need no sharding, else through zarr (read, compressed, written); its bytes."""
    chunks, shards = layout(src.shape, src.chunks, src.dtype.itemsize)
    if store is not None and isinstance(stored, ChunkView) and shards is None and \
            copy_chunks(store, dst, path, meta, stored, linking.name if linking is not None else None):
        return int(src.nbytes)
    compressors = [BloscCodec(cname="lz4", clevel=5, shuffle="shuffle")] if src.dtype.itemsize else None
    out = zarr.create_array(store=dst, name=path, shape=src.shape, dtype=src.dtype, chunks=chunks, shards=shards,
                            compressors=compressors, fill_value=src.fill_value, zarr_format=3,
                            dimension_names=meta.get("dimension_names"), attributes=meta.get("attributes") or {})
    _copy(src, out)
    return int(src.nbytes)


def export_zarr(store: Store, out: str | os.PathLike[str], *what: str, view: ZarrView | None = None) -> Exported:
    """Write ``store``'s zarr view, or the runs, cached functions and cache entries ``what`` names, as a zarr v3
    hierarchy at ``out`` (a new folder, a ``.zip`` file, or an object store URL); see the module's doc."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zarr's notes on consolidated metadata and unstable dtypes: not the user's
        view = view if view is not None else open_view(store)
        tree = view.tree
        chosen = select(tree, what, store.url)
        for path in sorted(chosen) if chosen is not None else [""]:
            tree.expand(path)
        src_root = zarr.open_group(view, mode="r")
        with _target(out, store.objects.backend.local_root) as (dst, done, linking):
            attrs = {"casmon": {"exported_from": store.url, **({"selected": list(what)} if what else {})}}
            zarr.create_group(store=dst, attributes=attrs, zarr_format=3)
            for path in sorted(tree.meta):
                if not _wanted(path, chosen):
                    continue
                meta = tree.meta[path]
                if meta["node_type"] == "array":
                    src = src_root[path]
                    assert isinstance(src, zarr.Array)
                    done.nbytes += _array(dst, path, src, meta, store, tree.arrays.get(path), linking)
                    done.arrays += 1
                else:
                    zarr.create_group(store=dst, path=path, attributes=meta.get("attributes") or {}, zarr_format=3)
                    done.groups += 1
            zarr.consolidate_metadata(dst)
            if linking is not None:
                done.linked = linking.linked
    return done

