"""Where casmon's own modules and types are, as keys and pickles name them.

Keys and pickles name casmon's modules as they were when key format 2 was
fixed (the flat layout: ``casmon.digest``, ``casmon.cache``, ...), so moving
code inside casmon changes no key and no stored value's digest. This module
holds that table, and :func:`keep_flat_names`, which gives casmon's public
types those module names and makes the flat names importable for pickle.

It imports nothing but the standard library: every layer uses it, and
``import casmon`` loads it before anything else.
"""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Iterable
TYPE_CHECKING = False  # typing's flag without importing typing (~2 ms of a first hit)
if TYPE_CHECKING:
    from typing import Any

__all__ = ["canonical_module", "casmon_key_module", "qualified_name", "type_name", "key_class_module",
           "keep_flat_names", "install_flat_namespaces", "FLAT_NAMESPACES"]


def canonical_module(name: str | None) -> str:
    """The module name casmon records for ``name``: the main script is ``__main__`` wherever it runs.

    Under multiprocessing's ``spawn`` and ``forkserver`` start methods the main
    script is imported as ``__mp_main__`` in the workers; its functions and
    classes must keep the name they have in the parent, or their cache entries
    and call logs would split in two.
    """
    if name == "__mp_main__":
        return "__main__"
    if name and name.startswith("casmon."):
        return casmon_key_module(name)
    return name or ""


#: casmon's own modules by the names keys give them: the flat modules they were when key format 2 was
#: fixed (a version digest in every cache key is a ``casmon.digest.Digest``), so moving code inside
#: casmon changes no key. Exact names first, then the package a module now lives in.
_KEY_MODULES = {
    "casmon.keys.digest": "casmon.digest", "casmon.keys.fingerprint": "casmon.fingerprint",
    "casmon.keys.codeversion": "casmon.codeversion", "casmon.store.store": "casmon.store",
    "casmon.maintenance.collect": "casmon.gc", "casmon.view.display": "casmon.display",
    "casmon.view.progress": "casmon.progress", "casmon.runs.gitstate": "casmon.gitstate",
    "casmon.runs.capture": "casmon.capture", "casmon.cli.demo": "casmon.demo", "casmon.cli.ui": "casmon.ui.commands",
    "casmon.compat.importer": "casmon.importer", "casmon.store.manifest": "casmon.store",
    "casmon.store.records": "casmon.store", "casmon.store.lifecycle": "casmon.store",
    "casmon.maintenance.gclock": "casmon.gc", "casmon.keys.filedigest": "casmon.cache",
    "casmon.keys.smallpickle": "casmon.codeversion", "casmon.keys.sourcetree": "casmon.codeversion",
    "casmon.store.pickleinfo": "casmon.serialize", "casmon.store.encode": "casmon.serialize",
    "casmon.rare_errors": "casmon.errors", "casmon.keys.arrays": "casmon.fingerprint",
    "casmon.store.condemnedlist": "casmon.condemned", "casmon.store.chunkio": "casmon.objects",
    "casmon.store.manifestcheck": "casmon.serialize",
}
_KEY_PACKAGES = {"casmon.caching": "casmon.cache", "casmon.calllog": "casmon.calllog", "casmon.runs": "casmon.runs",
                 "casmon.maintenance": "casmon.maintenance", "casmon.cli": "casmon.cli", "casmon.view": "casmon.display"}


def casmon_key_module(name: str) -> str:
    """The name keys give casmon's own module ``name`` (see ``_KEY_MODULES``)."""
    exact = _KEY_MODULES.get(name)
    if exact is not None:
        return exact
    parts = name.split(".")
    if len(parts) >= 3 and parts[2] == "libraries":
        return name  # new since key format 2: keys name them as they are
    if len(parts) >= 3 and parts[1] == "store":  # casmon.store.table.format -> casmon.table
        return f"casmon.{parts[2]}"
    if len(parts) >= 3 and parts[1] == "keys":
        return f"casmon.{parts[2]}"
    return _KEY_PACKAGES.get(".".join(parts[:2]), name)


def qualified_name(obj: Any) -> str:
    """``module.qualname`` of a function or class, with :func:`canonical_module` applied."""
    name: str | None = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    if name is None:
        raise TypeError(f"{type(obj).__name__} object has no name to identify it by")
    return key_class_module(canonical_module(getattr(obj, '__module__', None)), name) + "." + name


def type_name(t: type) -> bytes:
    return f"{key_class_module(canonical_module(t.__module__), t.__qualname__)}.{t.__qualname__}".encode()


#: casmon's classes and functions that moved to another module than their old module's new home.
_KEY_CLASSES = {("casmon.errors", "StoreDamageWarning"): "casmon.table", ("casmon.errors", "warn_damage"): "casmon.table",
                ("casmon.scrub", "scrub_url"): "casmon.backend",
                ("casmon.importer", "handler_value_name"): "casmon.compat.callmonitor",
                **{("casmon.names", f): "casmon.fingerprint" for f in ("canonical_module", "casmon_key_module",
                                                                        "qualified_name", "type_name", "key_class_module")}}


def key_class_module(module: str, qualname: str) -> str:
    """The module keys name for casmon's ``module.qualname`` (``module`` already through :func:`casmon_key_module`)."""
    return _KEY_CLASSES.get((module, qualname), module) if module.startswith("casmon") else module


#: The flat modules that are no longer modules: the module that holds their types now, and the names they serve.
FLAT_NAMESPACES: dict[str, tuple[str, frozenset[str]]] = {
    "casmon.digest": ("casmon.keys.digest", frozenset({"Digest"})),
    "casmon.serialize": ("casmon.store.serialize", frozenset({"Handler"})),
    "casmon.gc": ("casmon.maintenance.collect", frozenset({"GcReport"})),
    "casmon.display": ("casmon.view.display", frozenset({"StoreStats", "CacheEntries", "Sessions", "RunList", "RunDiff"})),
    "casmon.cache": ("casmon.caching", frozenset({"CachedFunction", "CacheInfo", "ResultRef", "CacheWarning"})),
    "casmon.table": ("casmon.errors", frozenset({"StoreDamageWarning"})),
}


class _FlatNamespace(types.ModuleType):
    """A flat module name kept for pickles (``casmon.digest``): a lookup of one of its types imports the module
    the type is in now, so ``import casmon`` need not import them all up front. Any other name is simply
    missing, without importing anything (pickle, cloudpickle and debuggers look names up in every module)."""

    def __getattr__(self, name: str) -> Any:
        home, names = FLAT_NAMESPACES[self.__name__]
        if name not in names:
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")
        return getattr(importlib.import_module(home), name)


def install_flat_namespaces() -> None:
    """Put the flat names in ``sys.modules`` (``import casmon.digest`` and pickle's lookups find them)."""
    for name in FLAT_NAMESPACES:
        if name not in sys.modules:
            sys.modules[name] = _FlatNamespace(name, f"Where casmon's {name.rpartition('.')[2]} types were: kept for "
                                                     "their pickles.")


def keep_flat_names(kinds: Iterable[type]) -> None:
    """Give each of ``kinds`` the module name it had in the flat layout, so pickles and keys name it as before.

    Each package calls it for its public types once they are defined, so the names hold however a type is
    reached. A flat name that is a real package now (``casmon.store``) must export the type by then.
    """
    for t in kinds:
        old = key_class_module(casmon_key_module(t.__module__), t.__qualname__)
        if old == t.__module__:
            continue
        flat = FLAT_NAMESPACES.get(old)
        if flat is not None and t.__qualname__ not in flat[1]:
            raise RuntimeError(f"the namespace {old} does not serve {t.__qualname__}: pickles naming it would not load")
        if flat is None and getattr(sys.modules.get(old), t.__qualname__, None) is not t:
            raise RuntimeError(f"{old} does not export {t.__qualname__}: pickles naming it would not load")
        t.__module__ = old
