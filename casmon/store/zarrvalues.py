"""One stored value as a node of the zarr view: what the cache's entries, the call log's arguments and results
share.

An array (numpy, or a handler's array of elements) is a zarr array over its
stored chunks (:func:`casmon.store.arrayview.chunk_view`; a library's array, a
tensor say, only once the program has imported the library); a value of several
arrays (an xarray Dataset, a DataFrame) is a group of them as its handler lays
it out; any other value is an empty group whose attributes say what it is and
its size, read from its manifest alone (a pickle is described, never unpickled).
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

from casmon.errors import CasmonError
from casmon.store import libraries
from casmon.store.arrayview import chunk_view
from casmon.store.peek import as_digest, describe
from casmon.store.pickleinfo import describe_pickle
from casmon.store.serialize import handler_named
from casmon.store.zarrtext import text_view
from casmon.store.zarrview import Tree, node_name

if TYPE_CHECKING:
    from casmon.store.manifest import Manifest
    from casmon.store.store import Store

__all__ = ["value_node"]


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
    libraries.ensure_named(name)  # its library is imported (checked by the caller): its handler is then known
    try:
        nodes = getattr(handler_named(name), "zarr_nodes", None)
    except LookupError:
        return False
    if nodes is None:
        return False
    try:
        attrs, arrays = nodes(m.meta["meta"])
        if not all(isinstance(d, str) for a in arrays for d in a["dims"]) or \
                len({node_name(str(a["name"])) for a in arrays}) < len(arrays):
            return False  # two arrays of one name: one would hide the other
        views = [(a, text_view(store, m, int(a["strings"]["offsets"]), int(a["strings"]["data"])) if "strings" in a
                  else chunk_view(store, m, lazy=True, part=int(a["part"]), layout=a["array"])) for a in arrays]
    except (TypeError, ValueError, LookupError, AttributeError, CasmonError):
        return False
    tree.group(path, {**attrs, "casmon": {**about, "type": name}})
    for a, view in views:
        meta = json.loads(view.metadata)
        meta["attributes"] = a["attrs"]
        meta["dimension_names"] = list(a["dims"])
        tree.array(f"{path}/{node_name(str(a['name']))}", meta, view)
    return True


def value_node(store: Store, tree: Tree, path: str, ref: Any, about: dict[str, Any], where: str) -> None:
    """Add the stored value ``ref`` (a digest's text) at ``path``, with ``about`` in its ``casmon`` attribute;
    a reference that is no value, or one not stored, is a group saying so (``where`` names it)."""
    try:
        d = as_digest(ref, where)
        m = store.manifest(d)
    except CasmonError as e:
        tree.group(path, {"casmon": {**about, "error": str(e)[:500]}})
        return
    about = {**about, "size": m.nbytes, "tag": m.tag}
    library = str(m.meta.get("handler", "")).partition(".")[0] if m.tag == "handler" else ""
    if library and library not in sys.modules:
        # A view never imports a library the program has not: its elements are an array where the manifest alone
        # says how numpy reads them (a tensor's), else described.
        layout = libraries.element_layout(str(m.meta.get("handler")), m.meta.get("meta"))
        if layout is not None and len(m.parts) == 1:
            try:
                view = chunk_view(store, m, lazy=True, part=0, layout=layout)
            except (TypeError, ValueError, LookupError, CasmonError):
                pass
            else:
                meta = json.loads(view.metadata)
                meta["attributes"] = {"casmon": about}  # as when the library is imported: one view either way
                tree.array(path, meta, view)
                return
        about["note"] = f"import {library} before opening the view to see it as an array"
    elif m.tag == "handler" and _frame(store, tree, path, m, about):
        return
    elif m.tag in ("array", "handler"):
        try:
            view = chunk_view(store, m, lazy=True)
        except (TypeError, ValueError, LookupError, CasmonError):
            pass  # an array zarr cannot describe, or a handler's value that is not one: described below
        else:
            meta = json.loads(view.metadata)
            meta["attributes"] = {"casmon": about}
            tree.array(path, meta, view)
            return
    about.update(type=_type_of(m.tag, m.meta, m.inline), description=describe(store, d, 200))
    tree.group(path, {"casmon": about})
