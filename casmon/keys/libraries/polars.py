"""polars: frames and series by their columns' Arrow buffers (see :mod:`.arrow`), polars dtypes and flags (sorted).

A ``LazyFrame`` is not keyed: it reads its sources when collected, and a key made of
its plan would not see a file change under it. The call runs uncached, with one
warning saying so; collect it first, or pass its files with ``files=``.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from casmon.errors import NotKeyable
from casmon.keys.fingerprint import register_library_hasher
from casmon.keys.libraries.arrow import column_key, table_key

__all__: list[str] = []


def _flags(s: Any) -> Any:
    flags = s.flags  # FAST_EXPLODE, also there for list columns, is polars' bookkeeping: not counted
    return (bool(flags.get("SORTED_ASC")), bool(flags.get("SORTED_DESC")))


def _frame_key(df: Any) -> Any:
    return (tuple((name, str(dt)) for name, dt in df.schema.items()), tuple(_flags(df[c]) for c in df.columns),
            table_key(df.to_arrow()))


def _series_key(s: Any) -> Any:
    return (s.name, str(s.dtype), _flags(s), column_key(s.to_arrow()))


def _lazy_key(lf: Any) -> Any:
    raise NotKeyable("a LazyFrame reads its sources only when collected, so no key can see them change; "
                     "pass lf.collect(), or name its files with files=")


register_library_hasher(pl.DataFrame, _frame_key)
register_library_hasher(pl.Series, _series_key)
register_library_hasher(pl.LazyFrame, _lazy_key)
