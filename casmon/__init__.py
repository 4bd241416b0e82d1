"""casmon: remember function calls in a content-addressed, deduplicating store on zarr.

Importing casmon configures no logging, prints nothing and writes nothing.
"""

from casmon.keys.digest import Digest
from casmon.errors import CasmonError, DamagedObjectError, MissingObjectError, StoreError, StoreFormatError, UnpicklableError, UntrustedStoreError
from casmon.keys.fingerprint import fingerprint, register_hasher, unregister_hasher
from casmon.store.serialize import Handler, handlers, register_handler, unregister_handler
from casmon.store.store import Store, open
from casmon.store.table import StoreDamageWarning

__version__ = "0.1.0"

__all__ = [
    "StoreDamageWarning",
    "Digest",
    "fingerprint",
    "register_hasher",
    "unregister_hasher",
    "Handler",
    "register_handler",
    "handlers",
    "unregister_handler",
    "Store",
    "open",
    "CasmonError",
    "DamagedObjectError",
    "MissingObjectError",
    "StoreError",
    "StoreFormatError",
    "UnpicklableError",
    "UntrustedStoreError",
]

from casmon.caching.memoize import CacheInfo, CacheWarning, cache  # noqa: E402
from casmon.store.store import default_store  # noqa: E402

__all__ += ["cache", "CacheInfo", "CacheWarning", "default_store"]

from casmon.calllog.log import Args, CallLog, CallLogWarning, NotStored, flush, intercept, load  # noqa: E402

__all__ += ["intercept", "load", "flush", "CallLog", "Args", "NotStored", "CallLogWarning"]

from casmon.runs.recorder import RunInfo, RunWarning, diff, export, list_runs, load_run, record, record_context, restore  # noqa: E402

__all__ += ["record", "record_context", "RunInfo", "RunWarning", "list_runs", "load_run", "diff", "restore", "export"]
