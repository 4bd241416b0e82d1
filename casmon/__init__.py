"""casmon: remember function calls in a content-addressed, deduplicating store on zarr.

The public API, grouped by layer; each name also lives in its package
(``casmon.keys``, ``casmon.store``, ``casmon.maintenance``, ``casmon.caching``,
``casmon.calllog``, ``casmon.runs``), and docs/ARCHITECTURE.md maps the tree.

Importing casmon configures no logging, prints nothing and writes nothing.
"""

from casmon.errors import (
    CasmonError,
    DamagedObjectError,
    MissingObjectError,
    NoActiveRunError,
    RunSignal,
    StoreDamageWarning,
    StoreError,
    StoreFormatError,
    UnpicklableError,
    UntrustedStoreError,
)
from casmon.keys.digest import Digest
from casmon.keys.fingerprint import fingerprint, register_hasher, unregister_hasher
from casmon.store import Manifest, Ref, Store, default_store, open
from casmon.store.serialize import Handler, handlers, register_handler, unregister_handler
from casmon.maintenance import GcReport, VerifyReport  # importing it installs Store.stats, verify and gc
from casmon.caching import CachedFunction, CacheInfo, CacheWarning, ResultRef, cache
from casmon.calllog import Args, Call, CallLog, CallLogWarning, NotStored, flush, intercept, load
from casmon.runs import Run, RunInfo, RunWarning, Series, diff, export, list_runs, load_run, log, record, record_context, restore
from casmon.view.display import CacheEntries, RunDiff, RunList, Sessions, StoreStats
from casmon.compat.legacy_names import keep_flat_names as _keep_flat_names

__version__ = "0.1.0"

__all__ = [
    # keys: content hashes
    "Digest", "fingerprint", "register_hasher", "unregister_hasher",
    # the store
    "Store", "open", "default_store", "Manifest", "Ref",
    "Handler", "handlers", "register_handler", "unregister_handler",
    # maintenance reports (Store.verify, Store.gc)
    "VerifyReport", "GcReport", "StoreStats",
    # the cache
    "cache", "CachedFunction", "CacheInfo", "ResultRef", "CacheEntries", "CacheWarning",
    # the call log
    "intercept", "load", "flush", "CallLog", "Call", "Args", "NotStored", "Sessions", "CallLogWarning",
    # experiment records
    "record", "record_context", "log", "Run", "RunInfo", "Series", "RunList", "RunDiff", "RunWarning",
    "list_runs", "load_run", "diff", "restore", "export",
    # errors and warnings
    "CasmonError", "StoreError", "StoreFormatError", "MissingObjectError", "DamagedObjectError",
    "UntrustedStoreError", "UnpicklableError", "StoreDamageWarning", "NoActiveRunError", "RunSignal",
]

# Pickles and messages name these types where they were before the packages (casmon/compat/legacy_names.py).
_keep_flat_names(t for n in __all__ if isinstance(t := globals()[n], type))
