"""The store: immutable blobs by hash, packed records, refs, on any medium.

One module a job: ``backend`` (media), ``codec`` (frames and compression),
``serialize`` (value to manifest and buffers), ``objects`` (loose objects, packs,
the pack index), ``table`` (append-only multimaps), ``condemned`` and ``lock``
(what gc publishes and holds), ``marker`` (``casmon.json``, the format),
``manifest`` (a value's manifest), ``records`` (records and refs as bytes,
salvagers), ``lifecycle`` (exit flush, forks, pool workers), ``store``
(:class:`Store`: put/get, records, refs, flushing), ``arrayview`` and ``peek``
(reading without running code).
"""

from __future__ import annotations

import importlib
TYPE_CHECKING = False  # typing's flag without importing typing (~2 ms of a first hit)
if TYPE_CHECKING:
    from typing import Any

__all__ = ["Store", "Manifest", "Ref", "open", "default_store"]

#: Loaded on first use, so that ``casmon.store.lock`` or ``casmon.store.backend`` alone does not load the whole store.
_HOMES = {"Store": "casmon.store.store", "open": "casmon.store.store", "default_store": "casmon.store.store",
          "Manifest": "casmon.store.manifest", "Ref": "casmon.store.records"}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'casmon.store' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:
    from casmon.store.manifest import Manifest
    from casmon.store.records import Ref
    from casmon.store.store import Store, default_store, open
