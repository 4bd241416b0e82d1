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
from casmon.store.arrayview import chunk_view
from casmon.store.peek import as_digest, describe
from casmon.store.serialize import describe_pickle
from casmon.store.zarrview import Tree, install_section, node_name

if TYPE_CHECKING:
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
