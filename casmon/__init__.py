"""casmon: remember function calls in a content-addressed, deduplicating store on zarr.

The public API, grouped by layer; each name also lives in its package
(``casmon.keys``, ``casmon.store``, ``casmon.maintenance``, ``casmon.caching``,
``casmon.calllog``, ``casmon.runs``), and docs/ARCHITECTURE.md maps the tree.

Importing casmon configures no logging, prints nothing and writes nothing. It
imports almost nothing either: each name below is loaded from its package on
first use (``casmon.cache`` loads the cache, ``casmon.open`` the store), so a
script pays only for what it uses, and a program that never touches an array
never imports numpy.
"""

from __future__ import annotations

import gc
import importlib
TYPE_CHECKING = False  # typing's flag without importing typing (~2 ms of a first hit)
if TYPE_CHECKING:
    from typing import Any

from casmon.keys.names import install_flat_namespaces as _install_flat_namespaces

__version__ = "0.1.0"

#: Where each public name lives: loaded from there on first use.
_HOMES = {
    # keys: content hashes
    "Digest": "casmon.keys.digest", "fingerprint": "casmon.keys.fingerprint",
    "register_hasher": "casmon.keys.fingerprint", "unregister_hasher": "casmon.keys.fingerprint",
    # the store
    "Store": "casmon.store", "open": "casmon.store", "default_store": "casmon.store", "Manifest": "casmon.store",
    "Ref": "casmon.store", "zarr_view": "casmon.store.zarrview", "Handler": "casmon.store.serialize", "handlers": "casmon.store.serialize",
    "register_handler": "casmon.store.serialize", "unregister_handler": "casmon.store.serialize",
    # maintenance reports (Store.verify, Store.gc)
    "VerifyReport": "casmon.maintenance", "GcReport": "casmon.maintenance", "StoreStats": "casmon.view.display",
    # the cache
    "cache": "casmon.caching", "CachedFunction": "casmon.caching", "CacheInfo": "casmon.caching",
    "ResultRef": "casmon.caching", "CacheEntries": "casmon.view.display", "CacheWarning": "casmon.caching",
    # the call log
    "intercept": "casmon.calllog", "load": "casmon.calllog", "flush": "casmon.calllog", "CallLog": "casmon.calllog",
    "Call": "casmon.calllog", "Args": "casmon.calllog", "NotStored": "casmon.calllog", "Sessions": "casmon.view.display",
    "CallLogWarning": "casmon.calllog",
    # experiment records
    "record": "casmon.runs", "record_context": "casmon.runs", "log": "casmon.runs", "Run": "casmon.runs",
    "RunInfo": "casmon.runs", "Series": "casmon.runs", "RunList": "casmon.view.display", "RunDiff": "casmon.view.display",
    "RunWarning": "casmon.runs", "list_runs": "casmon.runs", "load_run": "casmon.runs", "diff": "casmon.runs",
    "restore": "casmon.runs", "export": "casmon.runs", "delete_run": "casmon.runs", "start_run": "casmon.runs",
    "end_run": "casmon.runs", "active_run": "casmon.runs",
    # lineage: joins over the records above (``casmon.lineage`` is the package, callable as its query)
    "lineage": "casmon.lineage", "used_by": "casmon.lineage", "stale": "casmon.lineage",
    "first_difference": "casmon.lineage",
    # errors and warnings
    "CasmonError": "casmon.errors", "StoreError": "casmon.errors", "StoreFormatError": "casmon.errors",
    "MissingObjectError": "casmon.errors", "DamagedObjectError": "casmon.errors", "UntrustedStoreError": "casmon.errors",
    "UnpicklableError": "casmon.errors", "StoreDamageWarning": "casmon.errors", "NoActiveRunError": "casmon.errors",
    "RunSignal": "casmon.errors",
}

__all__ = list(_HOMES)


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'casmon' has no attribute {name!r}")
    # The garbage collector paused: a first use loads dozens of modules (a package, then the module its own
    # lazy name loads), and the collector would walk their fresh objects, none of them garbage, a dozen
    # times: ~1 ms of a script's first cached call. Its state is restored as it was.
    was = gc.isenabled()
    gc.disable()
    try:
        module = importlib.import_module(home)
        value = module if home == f"casmon.{name}" else getattr(module, name)
    finally:
        if was:
            gc.enable()
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOMES))


# Pickles name casmon's public types where they were before the packages (casmon/keys/names.py).
_install_flat_namespaces()

if TYPE_CHECKING:  # what type checkers and IDEs see: the same names, imported for real
    from casmon.errors import (CasmonError, DamagedObjectError, MissingObjectError, NoActiveRunError, RunSignal,
                               StoreDamageWarning, StoreError, StoreFormatError, UnpicklableError, UntrustedStoreError)
    from casmon.keys.digest import Digest
    from casmon.keys.fingerprint import fingerprint, register_hasher, unregister_hasher
    from casmon.store import Manifest, Ref, Store, default_store, open
    from casmon.store.zarrview import zarr_view
    from casmon.store.serialize import Handler, handlers, register_handler, unregister_handler
    from casmon.maintenance import GcReport, VerifyReport
    from casmon import lineage
    from casmon.lineage import first_difference, stale, used_by
    from casmon.caching import CachedFunction, CacheInfo, CacheWarning, ResultRef, cache
    from casmon.calllog import Args, Call, CallLog, CallLogWarning, NotStored, flush, intercept, load
    from casmon.runs import (Run, RunInfo, RunWarning, Series, active_run, delete_run, diff, end_run, export,
                             list_runs, load_run, log, record, record_context, restore, start_run)
    from casmon.view.display import CacheEntries, RunDiff, RunList, Sessions, StoreStats
