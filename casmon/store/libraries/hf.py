"""Hugging Face ``datasets``: a ``Dataset`` as its rows and index mapping (Arrow IPC), features, split and format.

A memory-mapped dataset is stored by content, so the cached value comes back in
memory and does not need the cache files it was read from. What else its
``DatasetInfo`` holds (description, citation) is not kept.
"""

from __future__ import annotations

from typing import Any

import datasets
import numpy as np
from datasets.table import InMemoryTable

from casmon.store.libraries.arrow import ipc_bytes, ipc_part, ipc_table

__all__ = ["DatasetHandler"]


class DatasetHandler:
    name = "datasets.Dataset"

    def encode(self, ds: Any) -> tuple[dict[str, Any], list[Any]] | None:
        fmt = ds.format
        if fmt.get("format_kwargs"):
            return None  # kwargs may hold anything: pickled instead
        meta = {"features": ds.features.to_dict(), "split": None if ds.split is None else str(ds.split),
                "format": {"type": fmt.get("type"), "columns": fmt.get("columns"),
                           "output_all_columns": bool(fmt.get("output_all_columns"))},
                "indices": ds._indices is not None}
        bufs = [ipc_part(ipc_bytes(ds.data.table))]
        if ds._indices is not None:
            bufs.append(ipc_part(ipc_bytes(ds._indices.table)))
        return meta, bufs

    def decode(self, meta: dict[str, Any], buffers: list[np.ndarray[Any, np.dtype[np.uint8]]]) -> Any:
        info = datasets.DatasetInfo(features=datasets.Features.from_dict(meta["features"]))
        split = datasets.NamedSplit(meta["split"]) if meta.get("split") else None
        indices = InMemoryTable(ipc_table(buffers[1])) if meta.get("indices") else None
        ds = datasets.Dataset(InMemoryTable(ipc_table(buffers[0])), info=info, split=split, indices_table=indices)
        fmt = meta.get("format") or {}
        columns = fmt.get("columns")
        if fmt.get("type") is not None or fmt.get("output_all_columns") or (columns is not None and columns != ds.column_names):
            ds.set_format(type=fmt.get("type"), columns=fmt.get("columns"),
                          output_all_columns=bool(fmt.get("output_all_columns")))
        return ds


HANDLER = DatasetHandler()


def handles(t: type) -> bool:
    """Whether :data:`HANDLER` saves values of exactly type ``t``."""
    return t is datasets.Dataset
