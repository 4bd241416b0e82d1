"""pandas: a DataFrame or Series as stored parts per column (and for its index unless a range), with its column
labels (and their index's type), index, attributes and flags, so the zarr view presents it as a group of column
arrays plus the index. A column (or the index) of numbers, text (object of ``str``, ``string``/``str``),
categories, nullable integers or zoned datetimes is stored as :mod:`.columns` lays it out, a MultiIndex as its
levels so and its codes; a frame with anything else (mixed objects, tuple labels), or labels, indexes or attributes
the layout does not rebuild exactly, is pickled whole instead."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from casmon.store.libraries.columns import column_nodes, decode_column, encode_column, part_count
from casmon.store.libraries.tabular import MAX_PARTS, as_part, from_part, plain_json

__all__ = ["PandasHandler"]


def _name_ok(n: Any) -> bool:
    return n is None or type(n) in (str, int)


def _columns(layout: dict[str, Any], names: list[Any], name: Any) -> Any:
    """The columns' index: a range, or the labels as an index of the stored dtype."""
    if "range" in layout:
        start, stop, step = (int(n) for n in layout["range"])
        return pd.RangeIndex(start, stop, step, name=name)
    return pd.Index(names, dtype=str(layout["dtype"]), name=name)


#: A MultiIndex of more levels than this is pickled with its frame.
MAX_LEVELS = 32


def _as_index(values: Any, name: Any) -> Any:
    """Decoded values as an index of their dtype (an object array stays object, not inferred as text)."""
    if isinstance(values, np.ndarray) and values.dtype == object:
        return pd.Index(values, name=name, dtype=object)
    return pd.Index(values, name=name)


def _multi(idx: Any) -> tuple[dict[str, Any], list[Any]] | None:
    """A MultiIndex as each level's values (a column of the forms :mod:`.columns` stores) and its codes."""
    if idx.nlevels > MAX_LEVELS or not all(_name_ok(n) for n in idx.names):
        return None
    levels, parts = [], []
    for level, codes in zip(idx.levels, idx.codes):
        got, c = encode_column(_values(level)), as_part(np.asarray(codes))
        if got is None or c is None:
            return None
        levels.append({"level": got[0], "codes": c[0], "freq": getattr(level, "freqstr", None)})
        parts += [*got[1], c[1]]
    return {"multi": levels, "names": list(idx.names), "sortorder": idx.sortorder, "name": None}, parts


def _index(ix: dict[str, Any], bufs: list[np.ndarray[Any, np.dtype[np.uint8]]]) -> Any:
    """The rows' index as the layout :meth:`PandasHandler.encode` stored describes it."""
    if "range" in ix:
        return pd.RangeIndex(*ix["range"], name=ix["name"])
    if "multi" in ix:
        levels, codes, at = [], [], 0
        for lv in ix["multi"]:
            n = part_count(lv["level"])
            if at + n >= len(bufs):
                raise ValueError(f"{len(bufs)} parts for the index's levels")
            levels.append(_with_freq(_as_index(decode_column(lv["level"], bufs[at : at + n]), None), lv.get("freq")))
            codes.append(from_part(lv["codes"], bufs[at + n]))
            at += n + 1
        return pd.MultiIndex(levels=levels, codes=codes, names=ix["names"], sortorder=ix["sortorder"],
                             verify_integrity=True)
    return _with_freq(_as_index(decode_column(ix, bufs), ix["name"]), ix.get("freq"))


def _with_freq(index: Any, freq: Any) -> Any:
    if freq is not None and isinstance(index, (pd.DatetimeIndex, pd.TimedeltaIndex)):
        return type(index)(index, freq=freq)
    return index


def _same_index(got: Any, want: Any) -> bool:
    """Whether a rebuilt index is the original: type, dtype, name, labels and their Python types, range, freq; a
    MultiIndex's names, sort order, levels (each such an index) and codes."""
    if isinstance(want, pd.MultiIndex):
        return type(got) is pd.MultiIndex and list(got.names) == list(want.names) and got.sortorder == want.sortorder \
            and got.nlevels == want.nlevels and all(_same_index(a, b) for a, b in zip(got.levels, want.levels)) and \
            all(a.dtype == b.dtype and np.array_equal(a, b) for a, b in zip(got.codes, want.codes))
    if type(got) is not type(want) or got.dtype != want.dtype or got.name != want.name or not got.equals(want):
        return False
    if isinstance(want, pd.RangeIndex):
        return bool((got.start, got.stop, got.step) == (want.start, want.stop, want.step))
    if getattr(want, "freq", None) != getattr(got, "freq", None):
        return False
    return want.dtype != object or [type(x) for x in got] == [type(x) for x in want]


def _values(column: Any) -> Any:
    """A column's (or an index's) values: the numpy array where its dtype is numpy's, else its pandas array."""
    return column.to_numpy() if isinstance(column.dtype, np.dtype) else column.array


def _series(values: Any) -> Any:
    """Decoded values as a Series of their own dtype (an object array stays object, not inferred as text)."""
    return pd.Series(values, dtype=values.dtype, copy=False)


def _rebuilt(got: tuple[dict[str, Any], list[Any]], dtype: Any) -> bool:
    """Whether the column ``got`` describes comes back of ``dtype`` (categories' dtype and zone type included)."""
    desc = got[0]
    if "array" in desc:
        return True
    if "strings" in desc:
        return True  # the dtype is rebuilt from what is stored: no need to decode every string
    try:
        back = decode_column(desc, [np.frombuffer(p.data, np.uint8) for p in got[1]]).dtype
    except (TypeError, ValueError, LookupError):
        return False
    if isinstance(dtype, pd.CategoricalDtype):  # the categories are the index they were (type, name, freq)
        return bool(back == dtype) and back.categories.dtype == dtype.categories.dtype and \
            _same_index(back.categories, dtype.categories)
    return bool(back == dtype)


class PandasHandler:
    name = "pandas.DataFrame"
    safe = True  # built from arrays, names and JSON attributes alone

    def encode(self, v: Any) -> tuple[dict[str, Any], list[Any]] | None:
        if type(v) is pd.Series:
            kind, df = "series", v.to_frame(name=0 if v.name is None else v.name)
            if not _name_ok(v.name):
                return None
        elif type(v) is pd.DataFrame:
            kind, df = "frame", v
        else:
            return None
        cols = df.columns
        if type(cols) not in (pd.Index, pd.RangeIndex) or cols.has_duplicates or len(cols) > MAX_PARTS or \
                not all(type(c) in (str, int) for c in cols) or not _name_ok(cols.name) or not plain_json(df.attrs):
            return None
        col_layout: dict[str, Any] = {"range": [cols.start, cols.stop, cols.step]} \
            if type(cols) is pd.RangeIndex else {"dtype": str(cols.dtype)}
        try:
            if not _same_index(_columns(col_layout, list(cols), cols.name), cols):
                return None  # labels the stored list and dtype do not rebuild exactly (e.g. string[pyarrow])
        except (TypeError, ValueError):
            return None
        columns, buffers = [], []
        for i, c in enumerate(cols):
            got = encode_column(_values(df.iloc[:, i]))
            if got is None or not _rebuilt(got, df.dtypes.iloc[i]):
                return None
            columns.append({"name": c, **got[0]})
            buffers.extend(got[1])
        if len(buffers) > 3 * MAX_PARTS:
            return None
        idx = df.index
        if not _name_ok(idx.name):
            return None
        if type(idx) is pd.RangeIndex:
            index: dict[str, Any] = {"range": [idx.start, idx.stop, idx.step], "name": idx.name}
        elif (type(idx) in (pd.Index, pd.DatetimeIndex, pd.TimedeltaIndex, pd.CategoricalIndex) and
              (got := encode_column(_values(idx))) is not None) or (type(idx) is pd.MultiIndex and (got := _multi(idx))):
            index = {**got[0], "name": idx.name, "freq": getattr(idx, "freqstr", None)}
            buffers.extend(got[1])
            if not _same_index(_index(index, [np.frombuffer(p.data, np.uint8) for p in got[1]]), idx):
                return None
        else:
            return None
        meta = {"kind": kind, "name": v.name if kind == "series" else None, "columns": columns, "index": index,
                "columns_range": type(cols) is pd.RangeIndex, "columns_name": cols.name, "attrs": df.attrs,
                "columns_index": col_layout, "allows_duplicate_labels": v.flags.allows_duplicate_labels}
        return meta, buffers

    def decode(self, meta: dict[str, Any], buffers: list[np.ndarray[Any, np.dtype[np.uint8]]]) -> Any:
        at, data = 0, {}
        for c in meta["columns"]:
            n = part_count(c)
            if at + n > len(buffers):
                raise ValueError(f"{len(buffers)} parts for the columns")
            data[c["name"]] = _series(decode_column(c, buffers[at : at + n]))
            at += n
        index = _index(meta["index"], buffers[at:])
        for v in data.values():
            if len(v) != len(index):
                raise ValueError(f"a column of {len(v)} rows beside an index of {len(index)}")
            v.index = index
        df = pd.DataFrame(data, index=index, columns=[c["name"] for c in meta["columns"]], copy=False)
        names = [c["name"] for c in meta["columns"]]
        if "columns_index" in meta:
            df.columns = _columns(meta["columns_index"], names, meta["columns_name"])
        else:  # stored before the columns' index type was kept
            if meta["columns_range"]:
                df.columns = pd.RangeIndex(len(df.columns))
            df.columns.name = meta["columns_name"]
        df.attrs = meta["attrs"]
        out = df
        if meta["kind"] == "series":
            out = df.iloc[:, 0]
            out.name = meta["name"]
        if not meta.get("allows_duplicate_labels", True):
            out = out.set_flags(allows_duplicate_labels=False)
        return out

    def zarr_nodes(self, meta: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The group the zarr view presents: one array per column along dimension ``index``, and the index (a
        column of text, categories, nullable values or zoned times as :func:`.columns.column_nodes` lays it out,
        with any array beside it). Each is named by its label as text; labels equal as text (``1`` and ``"1"``),
        and an index beside a column named ``index``, take a ``~n`` suffix, so no column hides another (``arrays``
        maps them)."""
        from casmon.store.zarrview import node_name  # only the view asks, and it has imported zarr

        used: set[str] = set()

        def unique(text: str) -> str:
            out, n = text, 0
            while out in used or node_name(out) in used:
                n += 1
                out = f"{text}~{n}"
            used.add(out)
            used.add(node_name(out))
            return out

        names = [unique(str(c["name"])) for c in meta["columns"]]
        ix = meta["index"]
        index_name = unique("index") if "range" not in ix and "multi" not in ix else None
        arrays: list[dict[str, Any]] = []
        at = 0
        for n, c in zip(names, meta["columns"]):
            arrays += column_nodes(c, n, at, unique)
            at += part_count(c)
        attrs: dict[str, Any] = {"columns": [c["name"] for c in meta["columns"]], "arrays": [node_name(n) for n in names],
                                 "index_name": ix["name"], **({"index_range": ix["range"]} if "range" in ix else {})}
        if index_name is not None:
            attrs["index_array"] = node_name(index_name)
            arrays += column_nodes(ix, index_name, at, unique)
        if "multi" in ix:  # each level's values along a dimension of their own, and its codes along index
            attrs.update(index_levels=[], index_codes=[], index_names=ix["names"])
            for i, lv in enumerate(ix["multi"]):
                level, codes = unique(f"index~level{i}"), unique(f"index~codes{i}")
                arrays += [{**n, "dims": n.get("dims", [level])} for n in column_nodes(lv["level"], level, at, unique)]
                at += part_count(lv["level"])
                arrays.append({"name": codes, "part": at, "array": lv["codes"], "attrs": {"level": level}})
                at += 1
                attrs["index_levels"].append(node_name(level))
                attrs["index_codes"].append(node_name(codes))
        for a in arrays:
            a.setdefault("dims", ["index"])
            for k in ("missing", "categories_array", "level"):
                if k in a["attrs"]:
                    a["attrs"][k] = node_name(a["attrs"][k])
        return attrs, arrays


HANDLER = PandasHandler()


def handles(t: type) -> bool:
    """Whether :data:`HANDLER` saves values of exactly type ``t``."""
    return t in (pd.DataFrame, pd.Series)
