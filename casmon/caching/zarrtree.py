"""The cache's part of the store's zarr view: ``cache/{function}/{entry}``, one node per live entry, its
result as :func:`casmon.store.zarrvalues.value_node` presents a stored value (an array, a group of a frame's
arrays, or a group describing it; nothing is unpickled)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from casmon.caching.entries import KIND, KIND_CLEAR, newest_per_key
from casmon.store.zarrvalues import value_node
from casmon.store.zarrview import Tree, install_section, node_name

if TYPE_CHECKING:
    from casmon.store.store import Store

__all__ = ["build"]


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
        about: dict[str, Any] = {"function": fn, "key": kb.hex(), "time": r.get("time"), "result": r.get("result")}
        value_node(store, tree, f"cache/{node_name(fn)}/{kb.hex()}", r.get("result"), about,
                   f"cache entry {kb.hex()} of {fn}")


install_section("cache", build)
