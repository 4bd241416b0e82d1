"""One pandas column (or index) of an everyday dtype as stored parts, described by a small JSON dict, and back.

Forms, by the dict's key (the parts they take, in order):

``array``
    A numpy dtype (numbers, bools, datetimes, fixed-width text): one part (:func:`tabular.as_part`).
``strings``
    Text: object dtype whose values are all exactly ``str``, or pandas' ``string``/``str`` dtypes (any storage,
    missing values as a mask): offsets, UTF-8 bytes (:mod:`.strings`), and the mask where a value is missing.
``categorical``
    Codes (the integer dtype pandas chose) then its categories, themselves a column of these forms; ``ordered``
    kept, and the categories as JSON too where they are few and plain (for the zarr view's attributes).
``masked``
    pandas' nullable integers, floats and booleans (``Int64``, ``Float64``, ``boolean``): values, then the mask of
    missing ones.
``tz``
    Datetimes with a time zone: the UTC instants (``datetime64``), and the zone's name.

Anything else (mixed objects, ``None`` in an object column, periods, intervals, sparse, a zone its name does not
rebuild) is declined: the frame is pickled whole, as before.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from casmon.store.libraries.strings import as_objects, decode_text, encode_text, text_parts
from casmon.store.libraries.tabular import as_part, from_part, plain_json
from casmon.store.serialize import Part

__all__ = ["encode_column", "decode_column", "part_count", "column_nodes", "string_info", "string_dtype",
           "JSON_CATEGORIES"]

#: Categories kept as JSON beside their parts (for the view's attributes) up to this many.
JSON_CATEGORIES = 4096
_MASKED = {"Int8", "Int16", "Int32", "Int64", "UInt8", "UInt16", "UInt32", "UInt64", "Float32", "Float64", "boolean"}


def _masked_type(name: str) -> Any:
    """The pandas array class of nullable dtype ``name``: built from its values and mask as they are."""
    return pd.arrays.BooleanArray if name == "boolean" else \
        pd.arrays.FloatingArray if name.startswith("Float") else pd.arrays.IntegerArray


def part_count(desc: dict[str, Any]) -> int:
    """How many parts the column ``desc`` describes takes."""
    if "strings" in desc:
        return 3 if desc["strings"].get("missing") else 2
    if "categorical" in desc:
        return 1 + part_count(desc["categorical"]["categories"])
    if "masked" in desc:
        return 2
    return 1


def string_info(dtype: Any) -> dict[str, Any] | None:
    """How a text dtype is stored (object, or pandas' string dtype: storage and missing value); None if not text."""
    if isinstance(dtype, np.dtype):
        return {"dtype": "object"} if dtype == object else None
    if isinstance(dtype, pd.StringDtype) and dtype.storage in ("python", "pyarrow"):
        na = "NA" if dtype.na_value is pd.NA else "nan" if dtype.na_value is np.nan else None
        return None if na is None else {"dtype": "string", "storage": dtype.storage, "na": na}
    return None


def string_dtype(info: dict[str, Any]) -> Any:
    """The dtype :func:`string_info` described; ValueError for one it did not write."""
    if info["dtype"] == "object":
        return np.dtype(object)
    if info.get("storage") not in ("python", "pyarrow") or info.get("na") not in ("NA", "nan"):
        raise ValueError(f"a string column of storage {str(info.get('storage'))[:20]!r}")
    if info["na"] == "NA":
        return pd.StringDtype(info["storage"])  # as pandas before 2.3 (no na_value) makes it too
    return pd.StringDtype(info["storage"], na_value=np.nan)


def _strings(values: Any, dtype: Any) -> tuple[dict[str, Any], list[Part]] | None:
    info = string_info(dtype)
    if info is None:
        return None
    missing = None
    if info["dtype"] == "object":
        got = encode_text(np.asarray(values, dtype=object))
    else:
        mask = np.asarray(values.isna(), dtype=bool)
        if mask.any():
            missing = mask
            values = values.copy()
            values[mask] = ""
        import sys

        pa = sys.modules.get("pyarrow")
        if pa is not None and info["storage"] == "pyarrow":
            got = encode_text(pa.array(values))
        else:
            got = encode_text(values.to_numpy(dtype=object))
    if got is None:
        return None
    parts = text_parts(*got)
    if missing is not None:
        parts.append(as_part(missing)[1])  # type: ignore[index]
    return {"strings": {**info, "missing": missing is not None, "rows": len(got[0]) - 1}}, parts


def _categorical(values: Any, dtype: Any) -> tuple[dict[str, Any], list[Part]] | None:
    if type(dtype.ordered) is not bool:
        return None
    codes = as_part(np.asarray(values.codes))
    cats = dtype.categories
    sub = encode_column(cats.array if not isinstance(cats.dtype, np.dtype) else cats.to_numpy(), inner=True)
    if codes is None or sub is None or "categorical" in sub[0]:
        return None
    desc: dict[str, Any] = {"ordered": dtype.ordered, "codes": codes[0], "categories": sub[0]}
    # the categories are an index: its name, freq and a range come back too (a hit's dtype is the same)
    if cats.name is not None:
        if type(cats.name) not in (str, int) or not plain_json([cats.name]):
            return None
        desc["name"] = cats.name
    if getattr(cats, "freqstr", None) is not None:
        desc["freq"] = cats.freqstr
    if type(cats) is pd.RangeIndex:
        desc["range"] = [cats.start, cats.stop, cats.step]
    labels = cats.tolist()
    if len(labels) <= JSON_CATEGORIES and all(type(x) in (str, int) for x in labels) and plain_json(labels):
        desc["labels"] = labels
    return {"categorical": desc}, [codes[1], *sub[1]]


def _categories_index(index: Any, info: dict[str, Any]) -> Any:
    """Decoded categories as the index they were: a range, with its freq and name. ValueError where they differ."""
    if "range" in info:
        start, stop, step = (int(x) for x in info["range"])
        rng = pd.RangeIndex(start, stop, step)
        if not index.equals(rng) or index.dtype != rng.dtype:
            raise ValueError("categories stored as a range are not that range")
        index = rng
    if info.get("freq") is not None:
        if not isinstance(index, (pd.DatetimeIndex, pd.TimedeltaIndex)):
            raise ValueError("a freq for categories that are no dates or durations")
        index = type(index)(index, freq=str(info["freq"]))
    name = info.get("name")
    if name is not None and type(name) not in (str, int):
        raise ValueError("categories named by no text or integer")
    return index.rename(name)


def _masked(values: Any, dtype: Any) -> tuple[dict[str, Any], list[Part]] | None:
    if str(dtype) not in _MASKED or type(values) is not _masked_type(str(dtype)):
        return None
    mask = np.asarray(values.isna(), dtype=bool)
    # the values under the mask as 0 (NaN for floats would do as well: they are missing either way)
    data = values.to_numpy(dtype=dtype.numpy_dtype, na_value=dtype.numpy_dtype.type(0))
    got, m = as_part(np.ascontiguousarray(data)), as_part(mask)
    if got is None or m is None:
        return None
    return {"masked": {"dtype": str(dtype), "values": got[0]}}, [got[1], m[1]]


def _tz(values: Any, dtype: Any) -> tuple[dict[str, Any], list[Part]] | None:
    tz = dtype.tz
    name = str(tz)
    try:
        back = pd.DatetimeTZDtype(dtype.unit, name)
    except (TypeError, ValueError, LookupError):
        return None
    if back != dtype or type(back.tz) is not type(tz) or str(back.tz) != name:
        return None  # a zone its name does not rebuild as it was
    got = as_part(np.asarray(values.tz_convert("UTC").tz_localize(None)))
    if got is None:
        return None
    return {"tz": {"tz": name, "values": got[0]}}, [got[1]]


def encode_column(values: Any, inner: bool = False) -> tuple[dict[str, Any], list[Part]] | None:
    """``(desc, parts)`` for a column's values (a numpy array or a pandas array), or None to pickle the frame."""
    dtype = values.dtype
    if isinstance(dtype, np.dtype) and not dtype.hasobject:
        got = as_part(np.asarray(values))
        return None if got is None else ({"array": got[0]}, [got[1]])
    if isinstance(dtype, pd.CategoricalDtype):
        return None if inner else _categorical(values, dtype)
    if isinstance(dtype, pd.DatetimeTZDtype):
        return _tz(values, dtype)
    if str(dtype) in _MASKED:
        return _masked(values, dtype)
    return _strings(values, dtype)


def decode_column(desc: dict[str, Any], buffers: list[np.ndarray[Any, np.dtype[np.uint8]]]) -> Any:
    """The values ``desc`` describes, from its parts' buffers (:func:`part_count` of them, in order): a numpy
    array or a pandas array. ValueError (or another decode error) for a layout that does not fit."""
    if "array" in desc:
        return from_part(desc["array"], buffers[0])
    if "strings" in desc:
        info = desc["strings"]
        dtype = string_dtype(info)
        missing = from_part({"dtype": "'|b1'", "shape": [buffers[0].size // 8 - 1], "order": "C"}, buffers[2]) \
            if info.get("missing") else None
        if missing is not None and dtype == object:
            raise ValueError("an object column of strings has no missing values")
        text = decode_text(buffers[0].view(np.int64), buffers[1], missing)
        if dtype == object:
            return as_objects(text)
        return pd.array(text if isinstance(text, np.ndarray) or dtype.storage == "pyarrow" else as_objects(text),
                        dtype=dtype)
    if "categorical" in desc:
        info = desc["categorical"]
        if type(info["ordered"]) is not bool or "categorical" in info["categories"]:
            raise ValueError("not a categorical layout")
        codes = from_part(info["codes"], buffers[0])
        cats = decode_column(info["categories"], buffers[1:])
        index = pd.Index(cats, dtype=object) if isinstance(cats, np.ndarray) and cats.dtype == object else pd.Index(cats)
        index = _categories_index(index, info)
        return pd.Categorical.from_codes(codes, dtype=pd.CategoricalDtype(index, ordered=info["ordered"]))
    if "masked" in desc:
        info = desc["masked"]
        if info["dtype"] not in _MASKED:
            raise ValueError(f"a masked column of dtype {str(info['dtype'])[:20]!r}")
        values = from_part(info["values"], buffers[0])
        mask = from_part({"dtype": "'|b1'", "shape": list(values.shape), "order": "C"}, buffers[1])
        if values.ndim != 1 or values.dtype != pd.api.types.pandas_dtype(info["dtype"]).numpy_dtype:
            raise ValueError(f"values of {values.dtype} for a {str(info['dtype'])[:20]} column")
        return _masked_type(info["dtype"])(values, mask)
    if "tz" in desc:
        utc = from_part(desc["tz"]["values"], buffers[0])
        if utc.dtype.kind != "M":
            raise ValueError("a time zone's instants are not datetimes")
        return pd.array(utc).tz_localize("UTC").tz_convert(str(desc["tz"]["tz"]))
    raise ValueError("an unknown column layout")


def column_nodes(desc: dict[str, Any], name: str, at: int, unique: Any) -> list[dict[str, Any]]:
    """The zarr view's arrays for the column ``desc`` describes, whose parts start at ``at``, the column's own
    first (named ``name``): a text column is a ``strings`` node (the view makes zarr's variable-length strings
    from its offsets and bytes), a categorical its codes with ``categories`` and ``ordered`` in its attributes
    (or its categories as an array beside it, where they are many or not plain), nullable values theirs with
    an array beside them saying which are missing, zoned datetimes the UTC instants with ``timezone``.
    ``unique(text)``: a node name no other array of the group has."""
    if "array" in desc:
        return [{"name": name, "part": at, "array": desc["array"], "attrs": {}}]
    if "strings" in desc:
        info = desc["strings"]
        node: dict[str, Any] = {"name": name, "strings": {"offsets": at, "data": at + 1}, "attrs": {}}
        if not info.get("missing"):
            return [node]
        mask = unique(f"{name}~missing")
        node["attrs"] = {"missing": mask}
        return [node, {"name": mask, "part": at + 2, "attrs": {},
                       "array": {"dtype": "'|b1'", "shape": [int(info["rows"])], "order": "C"}}]
    if "categorical" in desc:
        info = desc["categorical"]
        attrs: dict[str, Any] = {"ordered": info["ordered"]}
        out = [{"name": name, "part": at, "array": info["codes"], "attrs": attrs}]
        if "labels" in info:
            attrs["categories"] = info["labels"]
        else:
            cats = unique(f"{name}~categories")
            attrs["categories_array"] = cats
            out += [dict(n, dims=[cats]) for n in column_nodes(info["categories"], cats, at + 1, unique)]
        return out
    if "masked" in desc:
        values = desc["masked"]["values"]
        mask = unique(f"{name}~missing")
        return [{"name": name, "part": at, "array": values, "attrs": {"missing": mask, "pandas_dtype": desc["masked"]["dtype"]}},
                {"name": mask, "part": at + 1, "attrs": {},
                 "array": {"dtype": "'|b1'", "shape": list(values["shape"]), "order": "C"}}]
    if "tz" in desc:
        return [{"name": name, "part": at, "array": desc["tz"]["values"], "attrs": {"timezone": desc["tz"]["tz"]}}]
    raise ValueError("an unknown column layout")
