"""The cache's part of the store's zarr view: ``cache/{function}/{entry}``, one node per live entry, its
result as :func:`casmon.store.zarrvalues.value_node` presents a stored value (an array, a group of a frame's
arrays, or a group describing it; nothing is unpickled)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from casmon.caching.entries import KIND, KIND_CLEAR, newest_per_key
from casmon.errors import CasmonError
from casmon.store.zarrvalues import value_node
from casmon.store.zarrview import Tree, install_section, node_name

if TYPE_CHECKING:
    from casmon.store.store import Store

__all__ = ["build", "use_entry_reader"]


#: What reads every entry's newest record at once, by key hex: installed by a layer above with a faster way
#: (the lineage layer's derived index, :mod:`casmon.lineage.zarrentries`); else the records are read.
_bulk: list[Callable[[Store], dict[str, dict[str, Any]]]] = []


def use_entry_reader(read: Callable[[Store], dict[str, dict[str, Any]]]) -> None:
    """Make the view list the cache's entries with ``read(store)``: every entry's newest record (its ``fn``,
    ``time``, ``expires`` and ``result`` at least) by key hex, checked as records are."""
    _bulk[:] = [read]


def _newest(store: Store) -> dict[str, dict[str, Any]]:
    if _bulk:
        try:
            return _bulk[0](store)
        except CasmonError:  # the index cannot be read or made: the records, each as it can be read
            pass
    return {kb.hex(): r for kb, (_k, r) in newest_per_key(store.records(KIND, strict=False)).items()}


def _live(store: Store) -> dict[str, dict[str, dict[str, Any]]]:
    """The live entries' records by function node name and key (as ``CachedFunction.entries`` sees them)."""
    cleared: dict[str, float] = {}
    for _k, r in store.records(KIND_CLEAR, strict=False):
        if isinstance(r.get("fn"), str):
            cleared[r["fn"]] = max(cleared.get(r["fn"], 0.0), r.get("time", 0.0))
    now = time.time()
    out: dict[str, dict[str, dict[str, Any]]] = {}
    names: dict[str, str] = {}
    for key, r in sorted(_newest(store).items()):
        fn = r.get("fn")
        exp = r.get("expires")
        if not isinstance(fn, str) or r.get("time", 0) <= cleared.get(fn, 0.0) or \
                (isinstance(exp, (int, float)) and exp <= now):
            continue
        name = names.get(fn)
        if name is None:
            name = names[fn] = node_name(fn)
        out.setdefault(name, {})[key] = r
    return out


def build(store: Store, tree: Tree) -> None:
    """Add the live cache entries of ``store`` under ``cache/``: the entry records read when ``cache/`` is first
    listed, an entry's manifest when its node is first asked for."""
    live: list[dict[str, dict[str, dict[str, Any]]]] = []

    def entries() -> dict[str, dict[str, dict[str, Any]]]:
        if not live:
            live.append(_live(store))
        return live[0]

    def function(fn: str) -> None:
        def one(key: str) -> None:
            r = entries()[fn][key]
            about: dict[str, Any] = {"function": r["fn"], "key": key, "time": r.get("time"), "result": r.get("result")}
            value_node(store, tree, f"cache/{fn}/{key}", r.get("result"), about, f"cache entry {key} of {r['fn']}")

        tree.lazy(f"cache/{fn}", lambda: entries()[fn], one)

    tree.lazy("cache", entries, function)


install_section("cache", build)
