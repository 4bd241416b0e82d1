"""polars: frames and series in polars' own IPC form (uncompressed), so every polars dtype comes back."""

from __future__ import annotations

import io
import sys
from typing import Any

import numpy as np
import polars as pl

from casmon.store.serialize import Part

__all__ = ["PolarsHandler"]


class PolarsHandler:
    name = "polars.DataFrame"

    def encode(self, v: Any) -> tuple[dict[str, Any], list[Any]] | None:
        if isinstance(v, pl.Series):
            kind, df = "series", v.to_frame()
        elif isinstance(v, pl.DataFrame):
            kind, df = "frame", v
        else:
            return None
        f = io.BytesIO()
        try:
            df.write_ipc(f, compression="uncompressed")
        except Exception:  # noqa: BLE001 - Object columns and others IPC cannot hold: pickled
            return None
        sorted_ = {c: ("asc" if df[c].flags["SORTED_ASC"] else "desc") for c in df.columns
                   if df[c].flags["SORTED_ASC"] or df[c].flags["SORTED_DESC"]}
        return {"kind": kind, "sorted": sorted_}, [Part(f.getbuffer().cast("B"), numeric=True, typesize=8)]

    def decode(self, meta: dict[str, Any], buffers: list[np.ndarray[Any, np.dtype[np.uint8]]]) -> Any:
        pa = sys.modules.get("pyarrow")  # polars' reader copies a buffer it is given; Arrow's maps it in place
        if pa is not None:
            df = pl.from_arrow(pa.ipc.open_file(pa.py_buffer(buffers[0])).read_all())
        else:
            df = pl.read_ipc(io.BytesIO(buffers[0].tobytes()))
        flags = meta.get("sorted") or {}
        if flags:
            df = df.with_columns([df[c].set_sorted(descending=how == "desc") for c, how in flags.items()])
        return df.to_series(0) if meta.get("kind") == "series" else df


HANDLER = PolarsHandler()


def handles(t: type) -> bool:
    """Whether :data:`HANDLER` saves values of exactly type ``t``."""
    return t in (pl.DataFrame, pl.Series)
