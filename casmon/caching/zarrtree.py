"""The cache's part of the store's zarr view: ``cache/{function}/{entry}``, one node per live entry.

An entry whose result is an array (numpy, or a handler's array of elements) is a
zarr array over its stored chunks (:func:`casmon.store.arrayview.chunk_view`; a library's array, a tensor
say, only once the program has imported the library);
any other result is an empty group whose attributes say what it is and its
size, read from its manifest alone (a pickle is described, never unpickled).
"""

from __future__ import annotations

import json
import sys
import time
from typing import TYPE_CHECKING, Any

from casmon.caching.entries import KIND, KIND_CLEAR, newest_per_key
from casmon.errors import CasmonError
from casmon.store import libraries
from casmon.store.arrayview import chunk_view
from casmon.store.serialize import handler_named
from casmon.store.peek import as_digest, describe
from casmon.store.serialize import describe_pickle
from casmon.store.zarrview import Tree, install_section, node_name

if TYPE_CHECKING:
    from casmon.store.manifest import Manifest
    from casmon.store.store import Store

__all__ = ["build"]


def _type_of(tag: str, meta: dict[str, Any], inline: bytes) -> str:
    if tag == "pickle":
        return describe_pickle(inline).type
    if tag == "bytes":
        return str(meta.get("type", "bytes"))
    if tag == "handler":
        return str(meta.get("handler"))
    return tag


def _frame(store: Store, tree: Tree, path: str, m: Manifest, about: dict[str, Any]) -> bool:
    """A value of several arrays (an xarray Dataset, a DataFrame) as a group of them, as its handler lays it out;
    False where its handler has no such layout (or the manifest does not fit it: described instead)."""
    name = str(m.meta.get("handler"))
    libraries.ensure_named(name)  # its library is imported (checked above): its handler is then known
    try:
        nodes = getattr(handler_named(name), "zarr_nodes", None)
    except LookupError:
        return False
    if nodes is None:
        return False
    try:
        attrs, arrays = nodes(m.meta["meta"])
        if not all(isinstance(d, str) for a in arrays for d in a["dims"]):
            return False
        views = [(a, chunk_view(store, m, lazy=True, part=int(a["part"]), layout=a["array"])) for a in arrays]
    except (TypeError, ValueError, LookupError, AttributeError, CasmonError):
        return False
    tree.group(path, {**attrs, "casmon": {**about, "type": name}})
    for a, view in views:
        meta = json.loads(view.metadata)
        meta["attributes"] = a["attrs"]
        meta["dimension_names"] = list(a["dims"])
        tree.array(f"{path}/{node_name(str(a['name']))}", meta, view)
    return True


def build(store: Store, tree: Tree) -> None:
    """Add every live cache entry of ``store`` under ``cache/`` (as ``CachedFunction.entries`` sees them)."""
    cleared: dict[str, float] = {}
    for _k, r in store.records(KIND_CLEAR, strict=False):
        if isinstance(r.get("fn"), str):
            cleared[r["fn"]] = max(cleared.get(r["fn"], 0.0), r.get("time", 0.0))
    now = time.time()
    for kb, (_k, r) in sorted(newest_per_key(store.records(KIND, strict=False)).items()):
        fn = r.get("fn")
        exp = r.get("expires")
        if not isinstance(fn, str) or r.get("time", 0) <= cleared.get(fn, 0.0) or \
                (isinstance(exp, (int, float)) and exp <= now):
            continue
        path = f"cache/{node_name(fn)}/{kb.hex()}"
        about: dict[str, Any] = {"function": fn, "key": kb.hex(), "time": r.get("time"), "result": r.get("result")}
        try:
            d = as_digest(r.get("result"), f"cache entry {kb.hex()} of {fn}")
            m = store.manifest(d)
        except CasmonError as e:
            tree.group(path, {"casmon": {**about, "error": str(e)[:500]}})
            continue
        about.update(size=m.nbytes, tag=m.tag)
        library = str(m.meta.get("handler", "")).partition(".")[0] if m.tag == "handler" else ""
        if library and library not in sys.modules:
            # Its library's elements are described by the library: a view never imports one the program has not.
            about["note"] = f"import {library} before opening the view to see it as an array"
        elif m.tag == "handler" and _frame(store, tree, path, m, about):
            continue
        elif m.tag in ("array", "handler"):
            try:
                view = chunk_view(store, m, lazy=True)
            except (TypeError, ValueError, LookupError, CasmonError):
                pass  # an array zarr cannot describe, or a handler's value that is not one: described below
            else:
                meta = json.loads(view.metadata)
                meta["attributes"] = {"casmon": about}
                tree.array(path, meta, view)
                continue
        about.update(type=_type_of(m.tag, m.meta, m.inline), description=describe(store, d, 200))
        tree.group(path, {"casmon": about})


install_section("cache", build)
