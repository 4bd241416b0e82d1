"""dask: collections (arrays, frames, delayed values) are not keyed.

Their values exist only once computed, from a graph that may read files; a key of
the graph would not see those files change. The call runs uncached with one warning.
"""

from __future__ import annotations

from typing import Any

import dask.base

from casmon.errors import NotKeyable
from casmon.keys.fingerprint import register_library_hasher

__all__: list[str] = []


def _collection_key(v: Any) -> Any:
    raise NotKeyable("a dask collection computes its values (and reads its files) only when asked, so no key "
                     "can see them change; pass v.compute(), or name its files with files=")


register_library_hasher(dask.base.DaskMethodsMixin, _collection_key)
