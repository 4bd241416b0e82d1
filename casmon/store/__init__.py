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

from casmon.store.manifest import Manifest
from casmon.store.records import Ref
from casmon.store.store import Store, default_store, open

__all__ = ["Store", "Manifest", "Ref", "open", "default_store"]
