"""The whole store as a read-only zarr v3 hierarchy: ``store.zarr()`` and ``casmon.zarr_view(url)``.

:class:`ZarrView` is a zarr ``Store`` whose keys are computed, not stored. It is
a snapshot of the store when opened: a tree of groups and arrays, each node's
``zarr.json`` made here, and the root's ``zarr.json`` carrying all of them as
consolidated metadata, so ``zarr.open_group(view)`` walks the tree without one
read per node. Chunk reads go to the content-addressed chunks through the
same digest checks as ``get`` (damage raises, never wrong bytes); nothing is
copied and nothing is unpickled.

What the tree holds comes from the layers above, which know their records:
each installs a *section* builder with :func:`install_section` (the cache puts
``cache/{function}/{entry}``, the runs ``runs/{name}/metrics/{metric}``). They
are loaded by name when a view is opened, as the maintenance layer is.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import math
import threading
from collections.abc import AsyncIterator, Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

from zarr.abc.store import ByteRequest, Store as ZarrStore

from casmon.store.arrayview import byte_slice

if TYPE_CHECKING:
    from zarr.abc.buffer import Buffer, BufferPrototype

    from casmon.store.store import Store

__all__ = ["ZarrView", "Tree", "ChunkSource", "install_section", "open_view", "zarr_view", "node_name", "json_attrs",
           "array_metadata"]

#: The modules whose import installs the sections a view shows (loaded by name: they are layers above this one).
SECTION_MODULES = ("casmon.caching.zarrtree", "casmon.calllog.zarrtree", "casmon.runs.zarrtree", "casmon.lineage.zarrentries")

_sections: dict[str, Callable[[Store, Tree], None]] = {}


def install_section(name: str, build: Callable[[Store, Tree], None]) -> None:
    """Make ``build(store, tree)`` add the nodes under ``name/`` to every view opened from now on."""
    _sections[name] = build


class ChunkSource(Protocol):
    """What serves an array's chunk keys (``c/0``, ``c/1/0``, ``c`` for 0-d), relative to the array."""

    async def get(self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None) -> Buffer | None: ...


def node_name(text: str) -> str:
    """``text`` as one zarr node name: ``/`` and ``%`` escaped, and the names zarr reserves (empty, ``.``,
    ``..``, starting ``__``, and ``zarr.json``, which is the parent's own metadata on a file system) escaped too,
    so every name is one node and none collide."""
    out = text.replace("%", "%25").replace("/", "%2F")
    if out in ("", ".", ".."):
        return "%2E" * len(out) or "%"
    if out == "zarr.json":
        return "zarr%2Ejson"
    return "%5F" + out[1:] if out.startswith("__") else out


def json_attrs(v: Any, depth: int = 0) -> Any:
    """``v`` as JSON attributes hold it: NaN and infinities as casmon's JSON writes them (``"NaN"``,
    ``"Infinity"``, ``"-Infinity"``), tuples as lists, keys as text, anything else as its ``str``."""
    if v is None or type(v) in (bool, int, str):
        return v
    if type(v) is float:
        return v if math.isfinite(v) else ("NaN" if v != v else ("Infinity" if v > 0 else "-Infinity"))
    if depth > 50:
        return "<too deep>"
    if isinstance(v, dict):
        return {str(k): json_attrs(x, depth + 1) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [json_attrs(x, depth + 1) for x in v]
    if isinstance(v, (int, float)):  # numpy scalars, bools as numbers
        return json_attrs(v.item() if hasattr(v, "item") else float(v), depth + 1)
    return str(v)


def array_metadata(dtype: str, shape: tuple[int, ...], chunks: tuple[int, ...], fill_value: Any,
                   dimension_names: list[str] | None = None, attributes: dict[str, Any] | None = None) -> dict[str, Any]:
    """A little-endian, uncompressed zarr v3 array's ``zarr.json`` (numeric ``dtype`` names zarr knows)."""
    meta: dict[str, Any] = {
        "zarr_format": 3, "node_type": "array", "shape": list(shape), "data_type": dtype,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(chunks)}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": fill_value, "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
        "attributes": attributes or {},
    }
    if dimension_names is not None:
        meta["dimension_names"] = dimension_names
    return meta


class Tree:
    """The nodes of a view: groups with attributes, arrays with their chunk sources, and *lazy* groups whose
    children are listed and built when first asked for (a store of 10,000 runs opens without reading one)."""

    def __init__(self) -> None:
        self.meta: dict[str, dict[str, Any]] = {}  # path -> the node's zarr.json
        self.arrays: dict[str, ChunkSource] = {}
        self.children: dict[str, set[str]] = {"": set()}
        self._lazy: dict[str, tuple[Callable[[], Iterable[str]], Callable[[str], None]]] = {}
        self._listed: set[str] = set()
        self._built: set[str] = set()
        self._building: set[str] = set()  # marked built, their build still running (another thread waits for it)
        self._unbuilt: dict[str, int] = {}  # a listed lazy group -> how many of its children are not built yet
        self._bulk: dict[str, Callable[[list[str]], None]] = {}
        self._lock = threading.RLock()
        # Lazy groups not yet listed or built whole, and how many of them are at or below each path: whether a
        # node is complete is asked once per zarr.json served, and a view of 10,000 runs has a lazy group each.
        self._open: set[str] = set()
        self._open_below: dict[str, int] = {}

    def _settle(self, path: str) -> None:
        """Count the lazy group at ``path`` as open or not, as it stands now."""
        now = path not in self._listed or self._unbuilt.get(path, 0) > 0
        if now == (path in self._open):
            return
        (self._open.add if now else self._open.discard)(path)
        step = 1 if now else -1
        parts = path.split("/") if path else []
        for i in range(len(parts) + 1):
            p = "/".join(parts[:i])
            self._open_below[p] = self._open_below.get(p, 0) + step

    def _parent(self, path: str) -> None:
        head, _, tail = path.rpartition("/")
        if path not in self.meta:
            self.children.setdefault(head, set()).add(tail)
            if head and head not in self.meta:
                self.group(head)

    def group(self, path: str, attrs: dict[str, Any] | None = None) -> None:
        """Add (or give attributes to) the group at ``path`` and any group above it."""
        self._parent(path)
        self.meta[path] = {"zarr_format": 3, "node_type": "group", "attributes": json_attrs(attrs or {})}
        self.children.setdefault(path, set())

    def array(self, path: str, meta: dict[str, Any], source: ChunkSource) -> None:
        """Add the array at ``path``: its ``zarr.json`` and what serves its chunks."""
        self._parent(path)
        meta = dict(meta)
        meta["attributes"] = json_attrs(meta.get("attributes") or {})
        self.meta[path] = meta
        self.arrays[path] = source

    def lazy(self, path: str, names: Callable[[], Iterable[str]], build: Callable[[str], None],
             attrs: dict[str, Any] | None = None, bulk: Callable[[list[str]], None] | None = None) -> None:
        """Add the group at ``path`` whose child node names ``names()`` lists and whose child ``name`` (with all
        below it) ``build(name)`` adds, each when first asked for. ``bulk(names)``: adds all those children at
        once, cheaper than one by one; used when the group's own metadata is asked for (:meth:`build_all`), so
        its ``zarr.json`` holds its whole subtree."""
        self.group(path, attrs)
        self._lazy[path] = (names, build)
        if bulk is not None:
            self._bulk[path] = bulk
        self._settle(path)

    def has_bulk(self, path: str) -> bool:
        """Whether the group at ``path`` builds its children all at once (:meth:`build_all`)."""
        return path in self._bulk

    def build_all(self, path: str) -> None:
        """Build every child of the lazy group at ``path`` not built yet, with its bulk builder where it has one."""
        with self._lock:
            kids = self._list(path)
            todo = [c for c in sorted(kids) if f"{path}/{c}" not in self._built]
            bulk = self._bulk.get(path)
            if not todo or bulk is None:
                for c in todo:
                    self.ensure(f"{path}/{c}")
                return
            full = [f"{path}/{c}" for c in todo]
            self._built.update(full)
            self._building.update(full)
            try:
                bulk(todo)
            except Exception as e:  # noqa: BLE001 - a crafted record: every child says so, none is hidden
                for c in todo:
                    if f"{path}/{c}" not in self.meta:
                        self.group(f"{path}/{c}", {"casmon": {"error": f"{type(e).__name__}: {e}"[:500]}})
            finally:  # counted built once built: complete() never answers for a group mid-build
                self._building.difference_update(full)
                self._unbuilt[path] -= len(todo)
                self._settle(path)
            kids.difference_update([c for c in todo if f"{path}/{c}" not in self.meta])  # gone since listed

    def _list(self, path: str) -> set[str]:
        """The children of the group at ``path``, listed now if it is lazy (the set itself: hold the lock)."""
        lazy = self._lazy.get(path)
        if lazy is not None and path not in self._listed:
            kids = self.children.setdefault(path, set())
            kids.update(lazy[0]())
            self._listed.add(path)
            self._unbuilt[path] = sum(1 for c in kids if f"{path}/{c}" not in self._built)
            self._settle(path)
        return self.children.get(path, set())

    def listing(self, path: str) -> set[str]:
        """The names of the children of the group at ``path`` (listed now if it is lazy)."""
        with self._lock:
            return set(self._list(path))  # a copy: another thread's build may add to it

    def pending(self, path: str) -> bool:
        """Whether a lazy group above ``path`` has yet to list or build the node there."""
        if not self._lazy:
            return False
        parts = path.split("/") if path else []
        for i in range(len(parts)):
            parent, full = "/".join(parts[:i]), "/".join(parts[: i + 1])
            if parent in self._lazy and (parent not in self._listed or full in self._building or
                                         (full not in self._built and parts[i] in self.children.get(parent, ()))):
                return True
            if full not in self.meta:
                return False
        return False

    def ensure(self, path: str) -> None:
        """Build whatever lazy group holds the node at ``path``, level by level (nothing if there is none)."""
        if path in self.meta and not self._lazy:
            return
        parts = path.split("/") if path else []
        with self._lock:
            for i in range(len(parts)):
                parent, full = "/".join(parts[:i]), "/".join(parts[: i + 1])
                if parent in self._lazy and full not in self._built:
                    if parts[i] not in self._list(parent):
                        return
                    self._built.add(full)
                    self._building.add(full)
                    try:
                        self._lazy[parent][1](parts[i])
                    except Exception as e:  # noqa: BLE001 - a crafted record: this node says so, the others stay
                        self.group(full, {"casmon": {"error": f"{type(e).__name__}: {e}"[:500]}})
                    finally:
                        self._building.discard(full)
                        self._unbuilt[parent] -= 1
                        self._settle(parent)
                elif full not in self.meta:
                    return

    def expand(self, path: str = "") -> None:
        """Build every lazy group at or below ``path``."""
        self.ensure(path)
        todo = [path]
        while todo:
            p = todo.pop()
            if p in self._lazy:
                self.build_all(p)
            for name in sorted(self.listing(p)):
                child = f"{p}/{name}" if p else name
                self.ensure(child)
                if self.meta.get(child, {}).get("node_type") == "group":
                    todo.append(child)

    def complete(self, path: str) -> bool:
        """Whether nothing lazy is left at or below ``path`` (its listing is final). Read without the lock: zarr's
        event loop asks, and a build holding the lock may be waiting on that loop (an array kind's template); a
        group counts as open until its builds have ended, so the count never answers for one mid-build."""
        return self._open_below.get(path, 0) == 0

    def below(self, path: str) -> dict[str, dict[str, Any]]:
        """The metadata of every node below ``path``, by path relative to it."""
        out, todo = {}, [path]
        while todo:
            p = todo.pop()
            for name in self.children.get(p, ()):
                child = f"{p}/{name}" if p else name
                if child in self.meta:
                    out[child[len(path) + 1 :] if path else child] = self.meta[child]
                    todo.append(child)
        return out


def open_view(store: Store, consolidated: bool = False) -> ZarrView:
    """The read-only zarr v3 view of ``store`` (see the module's doc). Its nodes are read when first asked for;
    ``consolidated=True`` reads them all now and puts their metadata in the root's ``zarr.json``."""
    for name in SECTION_MODULES:
        importlib.import_module(name)
    tree = Tree()
    for section in sorted(_sections):
        tree.group(section)
        _sections[section](store, tree)
    if consolidated:
        tree.expand()
    return ZarrView(store, tree, consolidated)


def zarr_view(store: Store | str | None = None, consolidated: bool = False) -> ZarrView:
    """The read-only zarr v3 view of a store, given as a :class:`~casmon.store.Store` or its URL (the default
    store if None): ``zarr.open_group(casmon.zarr_view(url), mode="r")`` (``consolidated``: see :func:`open_view`)."""
    from casmon.store.store import Store as _Store, default_store

    return open_view(store if isinstance(store, _Store) else default_store(store, create=False), consolidated)


def _dumps(meta: dict[str, Any]) -> bytes:
    return json.dumps(meta, allow_nan=False, separators=(",", ":")).encode()


class ZarrView(ZarrStore):
    """A read-only zarr v3 store presenting a casmon store as a hierarchy (see the module's doc)."""

    supports_writes = False
    supports_deletes = False
    supports_partial_writes = False
    supports_listing = True

    def __init__(self, store: Store, tree: Tree, consolidated: bool = False) -> None:
        super().__init__(read_only=True)
        self._store = store
        self._tree = tree
        self._root: dict[str, Any] = {"zarr_format": 3, "node_type": "group",
                                      "attributes": {"casmon": {"store": store.url}}}
        self._docs: dict[str, bytes] = {}
        if consolidated:
            self._docs["zarr.json"] = self._doc("", self._root)

    def _doc(self, path: str, meta: dict[str, Any]) -> bytes:
        """A node's ``zarr.json``: a group whose subtree is all built carries it as consolidated metadata, so
        ``zarr.open_group`` and ``xr.open_zarr`` walk it without one read per node."""
        if meta["node_type"] == "group" and self._tree.complete(path):
            meta = {**meta, "consolidated_metadata": {"kind": "inline", "must_understand": False, "metadata": {
                p: (m if m["node_type"] == "array" else
                    {**m, "consolidated_metadata": {"kind": "inline", "must_understand": False, "metadata": {}}})
                for p, m in sorted(self._tree.below(path).items())}}}
        return _dumps(meta)

    async def _doc_at(self, key: str) -> bytes | None:
        """The ``zarr.json`` at ``key``, made (and its lazy group built) when first asked for."""
        doc = self._docs.get(key)
        if doc is not None or key.rpartition("/")[2] != "zarr.json":
            return doc
        path = key[: -len("zarr.json")].rstrip("/")
        await self._ensure(path)
        if self._tree.has_bulk(path) and not self._tree.complete(path):
            await asyncio.to_thread(self._tree.build_all, path)  # its zarr.json then holds its whole subtree
        meta = self._root if not path else self._tree.meta.get(path)
        if meta is None:
            return None
        doc = self._doc(path, meta)
        if self._tree.complete(path):
            self._docs[key] = doc
        return doc

    async def _ensure(self, path: str) -> None:
        # Off zarr's event loop: building a node reads the store and may ask zarr for metadata templates.
        if self._tree.pending(path):
            await asyncio.to_thread(self._tree.ensure, path)

    @property
    def store(self) -> Store:
        """The casmon store this view presents."""
        return self._store

    @property
    def tree(self) -> Tree:
        """The nodes this view presents (its snapshot of the store)."""
        return self._tree

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ZarrView) and other._store is self._store and other._tree is self._tree

    def __hash__(self) -> int:
        return id(self._tree)

    def __str__(self) -> str:
        return f"casmon zarr view of {self._store.url}"

    __repr__ = __str__

    async def _chunk(self, key: str) -> tuple[ChunkSource, str] | None:
        """The array a chunk key belongs to, and the key within it."""
        parts = key.split("/")
        for i, p in enumerate(parts):
            if p == "c":
                await self._ensure("/".join(parts[:i]))
                src = self._tree.arrays.get("/".join(parts[:i]))
                if src is not None:
                    return src, "/".join(parts[i:])
        return None

    async def get(self, key: str, prototype: BufferPrototype | None = None,
                  byte_range: ByteRequest | None = None) -> Buffer | None:
        if prototype is None:
            from zarr.buffer import default_buffer_prototype

            prototype = default_buffer_prototype()
        doc = await self._doc_at(key)
        if doc is not None:
            return prototype.buffer.from_bytes(byte_slice(doc, byte_range))
        found = await self._chunk(key)
        if found is None:
            return None
        return await found[0].get(found[1], prototype, byte_range)

    async def get_partial_values(self, prototype: BufferPrototype,
                                 key_ranges: Iterable[tuple[str, ByteRequest | None]]) -> list[Buffer | None]:
        return [await self.get(k, prototype, r) for k, r in key_ranges]

    async def exists(self, key: str) -> bool:
        if await self._doc_at(key) is not None:
            return True
        found = await self._chunk(key)
        if found is None:
            return False
        exists = getattr(found[0], "exists", None)
        return bool(await exists(found[1])) if exists is not None else True

    async def set(self, key: str, value: Any) -> None:
        raise PermissionError(f"casmon's zarr view is read-only: cannot write {key!r}")

    async def set_if_not_exists(self, key: str, value: Any) -> None:
        raise PermissionError(f"casmon's zarr view is read-only: cannot write {key!r}")

    async def delete(self, key: str) -> None:
        raise PermissionError(f"casmon's zarr view is read-only: cannot delete {key!r}")

    def _keys(self, prefix: str) -> list[str]:
        """Every ``zarr.json`` key under ``prefix`` (the lazy groups there built: a whole listing reads all)."""
        path = prefix.strip("/")
        path = path[: -len("zarr.json")].rstrip("/") if path.endswith("zarr.json") else path
        self._tree.expand(path if path in self._tree.meta else path.rpartition("/")[0])
        return ["zarr.json"] + [f"{p}/zarr.json" for p in sorted(self._tree.meta)]

    async def list(self) -> AsyncIterator[str]:  # chunk keys are computed; zarr does not need them listed
        for k in await asyncio.to_thread(self._keys, ""):
            yield k

    async def list_prefix(self, prefix: str) -> AsyncIterator[str]:
        for k in await asyncio.to_thread(self._keys, prefix):
            if k.startswith(prefix):
                yield k

    async def list_dir(self, prefix: str) -> AsyncIterator[str]:
        path = prefix.strip("/")
        await self._ensure(path)
        if path and path not in self._tree.meta:
            return
        yield "zarr.json"
        for name in sorted(await asyncio.to_thread(self._tree.listing, path)):
            yield name

