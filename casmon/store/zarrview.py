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

import importlib
import json
import math
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
SECTION_MODULES = ("casmon.caching.zarrtree", "casmon.calllog.zarrtree", "casmon.runs.zarrtree")

_sections: dict[str, Callable[[Store, Tree], None]] = {}


def install_section(name: str, build: Callable[[Store, Tree], None]) -> None:
    """Make ``build(store, tree)`` add the nodes under ``name/`` to every view opened from now on."""
    _sections[name] = build


class ChunkSource(Protocol):
    """What serves an array's chunk keys (``c/0``, ``c/1/0``, ``c`` for 0-d), relative to the array."""

    async def get(self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None) -> Buffer | None: ...


def node_name(text: str) -> str:
    """``text`` as one zarr node name: ``/`` and ``%`` escaped, and the names zarr reserves (empty, ``.``,
    ``..``, starting ``__``) escaped too, so every name is one node and none collide."""
    out = text.replace("%", "%25").replace("/", "%2F")
    if out in ("", ".", ".."):
        return "%2E" * len(out) or "%"
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
    """The nodes of a view while it is built: groups with attributes, arrays with their chunk sources."""

    def __init__(self) -> None:
        self.meta: dict[str, dict[str, Any]] = {}  # path -> the node's zarr.json
        self.arrays: dict[str, ChunkSource] = {}
        self.children: dict[str, set[str]] = {"": set()}

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


def open_view(store: Store) -> ZarrView:
    """The read-only zarr v3 view of ``store`` as it is now (see the module's doc)."""
    for name in SECTION_MODULES:
        importlib.import_module(name)
    tree = Tree()
    for section in sorted(_sections):
        tree.group(section)
        _sections[section](store, tree)
    return ZarrView(store, tree)


def zarr_view(store: Store | str | None = None) -> ZarrView:
    """The read-only zarr v3 view of a store, given as a :class:`~casmon.store.Store` or its URL (the default
    store if None): ``zarr.open_group(casmon.zarr_view(url), mode="r")``."""
    from casmon.store.store import Store as _Store, default_store

    return open_view(store if isinstance(store, _Store) else default_store(store, create=False))


def _dumps(meta: dict[str, Any]) -> bytes:
    return json.dumps(meta, allow_nan=False, separators=(",", ":")).encode()


class ZarrView(ZarrStore):
    """A read-only zarr v3 store presenting a casmon store as a hierarchy (see the module's doc)."""

    supports_writes = False
    supports_deletes = False
    supports_partial_writes = False
    supports_listing = True

    def __init__(self, store: Store, tree: Tree) -> None:
        super().__init__(read_only=True)
        self._store = store
        self._tree = tree
        root = {"zarr_format": 3, "node_type": "group", "attributes": {"casmon": {"store": store.url}},
                "consolidated_metadata": {"kind": "inline", "must_understand": False, "metadata": {
                    p: (m if m["node_type"] == "array" else
                        {**m, "consolidated_metadata": {"kind": "inline", "must_understand": False, "metadata": {}}})
                    for p, m in sorted(tree.meta.items())}}}
        self._docs: dict[str, bytes] = {"zarr.json": _dumps(root)}
        for p, m in tree.meta.items():
            self._docs[f"{p}/zarr.json"] = _dumps(m)

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

    def _chunk(self, key: str) -> tuple[ChunkSource, str] | None:
        """The array a chunk key belongs to, and the key within it."""
        parts = key.split("/")
        for i, p in enumerate(parts):
            if p == "c":
                src = self._tree.arrays.get("/".join(parts[:i]))
                if src is not None:
                    return src, "/".join(parts[i:])
        return None

    async def get(self, key: str, prototype: BufferPrototype | None = None,
                  byte_range: ByteRequest | None = None) -> Buffer | None:
        if prototype is None:
            from zarr.buffer import default_buffer_prototype

            prototype = default_buffer_prototype()
        doc = self._docs.get(key)
        if doc is not None:
            return prototype.buffer.from_bytes(byte_slice(doc, byte_range))
        found = self._chunk(key)
        if found is None:
            return None
        return await found[0].get(found[1], prototype, byte_range)

    async def get_partial_values(self, prototype: BufferPrototype,
                                 key_ranges: Iterable[tuple[str, ByteRequest | None]]) -> list[Buffer | None]:
        return [await self.get(k, prototype, r) for k, r in key_ranges]

    async def exists(self, key: str) -> bool:
        if key in self._docs:
            return True
        found = self._chunk(key)
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

    async def list(self) -> AsyncIterator[str]:  # chunk keys are computed; zarr does not need them listed
        for k in self._docs:
            yield k

    async def list_prefix(self, prefix: str) -> AsyncIterator[str]:
        for k in self._docs:
            if k.startswith(prefix):
                yield k

    async def list_dir(self, prefix: str) -> AsyncIterator[str]:
        path = prefix.strip("/")
        if path and path not in self._tree.meta:
            return
        yield "zarr.json"
        for name in sorted(self._tree.children.get(path, ())):
            yield name

