"""Hugging Face ``datasets``: a ``Dataset`` by features, split, format, rows and index mapping.

The rows count by content (see :mod:`.arrow`), also when they are memory-mapped from
cache files: they are read through the mapping, so an edit of the files in place is a
new key. Neither the file names nor HF's own fingerprint (a hash of how the dataset
was made, not of what it holds) count.
"""

from __future__ import annotations

from typing import Any

import datasets

from casmon.errors import NotKeyable
from casmon.keys.fingerprint import register_library_hasher
from casmon.keys.libraries.arrow import table_key

__all__: list[str] = []


def _dataset_key(ds: Any) -> Any:
    indices = ds._indices
    return (ds.features.to_dict(), None if ds.split is None else str(ds.split), dict(sorted(ds.format.items())),
            table_key(ds.data.table), None if indices is None else table_key(indices.table))


def _streaming_key(ds: Any) -> Any:
    raise NotKeyable("an IterableDataset reads its files only while it is iterated, so no key can see them change; "
                     "pass a Dataset (load_dataset without streaming), or name its files with files=")


register_library_hasher(datasets.Dataset, _dataset_key)
register_library_hasher(datasets.IterableDataset, _streaming_key)
