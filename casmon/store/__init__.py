"""The store: immutable blobs by hash, packed records, refs, on any medium.

One module a job: ``backend`` (media), ``codec`` (frames and compression),
``serialize`` (value to manifest and buffers), ``objects`` (loose objects, packs,
the pack index), ``table`` (append-only multimaps), ``condemned`` and ``lock``
(what gc publishes and holds), ``marker`` (``casmon.json``), ``store``
(:class:`Store`: put/get, records, refs, flushing), ``arrayview`` and ``peek``
(reading without running code).
"""

from casmon.store.store import Manifest, Ref, Store, default_store, open

__all__ = ["Store", "Manifest", "Ref", "open", "default_store"]
