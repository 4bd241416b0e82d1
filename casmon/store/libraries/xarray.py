"""xarray: a Dataset or DataArray as one numeric part per variable (coordinates included) and its names, dims,
attributes and encoding (numpy scalars, dtypes and tuples, as a netCDF file gives them, tagged in JSON), so the zarr
view presents it as a group ``xr.open_zarr`` opens; a 1-D variable of text (object dtype, every value exactly
``str``) as its UTF-8 bytes and offsets, which the view shows as zarr strings. Variables backed by
dask, of other object dtypes, with attributes or encoding JSON does not keep, or any value whose structure (variable
order, indexes, name) the layout does not rebuild exactly are pickled whole instead."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

from casmon.store.libraries.columns import string_dtype, string_info
from casmon.store.libraries.strings import as_objects, decode_text, encode_text, text_parts
from casmon.store.libraries.tabular import MAX_PARTS, as_part, from_part, plain_json, tagged, untagged

__all__ = ["XarrayHandler"]

#: A DataArray without a name is stored as a Dataset's variable of this name.
UNNAMED = "data"


def _name_ok(n: Any) -> bool:
    return type(n) is str and bool(n) and "/" not in n and not n.startswith(("__", "%")) and n not in (".", "..")


def _encoding(enc: Any) -> Any:
    """An encoding as compared: its tagged JSON (a NaN ``_FillValue`` equals itself; types count)."""
    try:
        return tagged(enc)
    except ValueError:
        return ("untagged", id(enc))  # equal to no other: such a value is pickled


def _variable(x: Any) -> tuple[Any, ...]:
    return tuple(x.dims), x.shape, x.dtype, x.attrs, _encoding(x.encoding)


def _structure(v: Any) -> tuple[Any, ...]:
    """Everything of a Dataset or DataArray but its values: what a rebuilt one must match to be the original."""
    indexes = [(k, type(i), getattr(getattr(i, "index", None), "dtype", None)) for k, i in v.xindexes.items()]
    if isinstance(v, xr.DataArray):
        return (type(v), v.name, _variable(v.variable), [(k, _variable(c.variable)) for k, c in v.coords.items()],
                indexes)
    return (type(v), [(k, _variable(x)) for k, x in v.variables.items()], list(v.coords), list(v.data_vars),
            list(v.sizes.items()), v.attrs, _encoding(v.encoding), indexes)


def _stored_encoding(meta: dict[str, Any]) -> Any:
    """The encoding ``meta`` keeps: tagged (values stored now), or plain JSON (stored before numpy values were)."""
    return untagged(meta["tagged_encoding"]) if "tagged_encoding" in meta else meta.get("encoding")


class XarrayHandler:
    name = "xarray.Dataset"
    safe = True  # built from arrays, names and JSON attributes alone

    def encode(self, v: Any) -> tuple[dict[str, Any], list[Any]] | None:
        if type(v) is xr.DataArray:
            if v.name is not None and not _name_ok(v.name):
                return None
            var = UNNAMED if v.name is None else v.name
            if var in v.coords:
                return None
            kind, ds = "dataarray", v.to_dataset(name=var)
        elif type(v) is xr.Dataset:
            kind, ds, var = "dataset", v, None
        else:
            return None
        if len(ds.variables) > MAX_PARTS or not plain_json(ds.attrs):
            return None
        try:  # an encoding read from a netCDF file holds numpy scalars, dtypes and tuples: kept tagged
            encodings = [tagged(ds.encoding)] + [tagged(x.encoding) for x in ds.variables.values()]
        except ValueError:
            return None
        variables: list[dict[str, Any]] = []
        buffers: list[Any] = []
        for name, x in ds.variables.items():
            if not _name_ok(name) or not plain_json(x.attrs) or not all(_name_ok(d) for d in x.dims):
                return None
            data = x.data if name not in ds.indexes else x.values
            got = as_part(data)
            if got is not None:
                form: dict[str, Any] = {"array": got[0]}
                buffers.append(got[1])
            elif isinstance(data, np.ndarray) and data.dtype == object and data.ndim == 1 and \
                    (text := encode_text(data)) is not None:
                form = {"strings": {"dtype": "object", "missing": False, "rows": len(data)}}
                index = ds.indexes.get(name)
                if index is not None and index.dtype != object:  # pandas 3 labels a text index str: kept
                    info = string_info(index.dtype)
                    if info is None:
                        return None
                    form["strings"]["index"] = info
                buffers.extend(text_parts(*text))
            else:
                return None
            variables.append({"name": name, "dims": list(x.dims), "attrs": x.attrs, "coord": name in ds.coords,
                              **form, "tagged_encoding": encodings[len(variables) + 1]})
        meta = {"kind": kind, "var": var, "unnamed": kind == "dataarray" and v.name is None, "attrs": ds.attrs,
                "tagged_encoding": encodings[0], "variables": variables}
        try:  # the rebuilt value views the same buffers: only its structure can differ, and that is cheap to see
            same = _structure(self.decode(meta, [np.frombuffer(b.data, np.uint8) for b in buffers])) == _structure(v)
            # (text is decoded again to check it: a string variable is a coordinate's labels, seldom large)
        except (TypeError, ValueError, KeyError):
            same = False
        return (meta, buffers) if same else None

    def decode(self, meta: dict[str, Any], buffers: list[np.ndarray[Any, np.dtype[np.uint8]]]) -> Any:
        variables, at = {}, 0
        for v in meta["variables"]:
            n = 2 if "strings" in v else 1
            if at + n > len(buffers):
                raise ValueError(f"{len(buffers)} parts for the variables")
            variables[v["name"]] = xr.Variable(tuple(v["dims"]), _values(v, buffers[at : at + n]), attrs=v["attrs"],
                                               encoding=_stored_encoding(v))
            at += n
        # one mapping in the stored order, then the coordinates named: the variables keep their order
        ds = xr.Dataset(variables, attrs=meta["attrs"]).set_coords([v["name"] for v in meta["variables"] if v["coord"]])
        ds.encoding = dict(_stored_encoding(meta) or {})
        if meta["kind"] == "dataarray":
            da = ds[meta["var"]]
            return da.rename(None) if meta.get("unnamed", meta["var"] == UNNAMED) else da
        return ds

    def zarr_nodes(self, meta: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The group the zarr view presents: its attributes and one array per variable (part, layout, dims,
        attributes), with the non-index coordinates named as xarray reads them."""
        dims = {d for v in meta["variables"] for d in v["dims"]}
        others = " ".join(v["name"] for v in meta["variables"] if v["coord"] and v["name"] not in dims)
        arrays, at = [], 0
        for v in meta["variables"]:
            attrs = dict(v["attrs"])
            if others and not v["coord"]:
                attrs["coordinates"] = others
            if "strings" in v:  # zarr's variable-length strings, made from the stored offsets and bytes
                arrays.append({"name": v["name"], "strings": {"offsets": at, "data": at + 1}, "dims": v["dims"],
                               "attrs": attrs})
                at += 2
            else:
                arrays.append({"name": v["name"], "part": at, "array": v["array"], "dims": v["dims"], "attrs": attrs})
                at += 1
        attrs = dict(meta["attrs"])
        if meta["kind"] == "dataarray":
            attrs["casmon_dataarray"] = meta["var"]
        return attrs, arrays


def _values(v: dict[str, Any], buffers: list[np.ndarray[Any, np.dtype[np.uint8]]]) -> Any:
    """A variable's values from its parts: one numeric array, or text (an object array of ``str``)."""
    if "strings" not in v:
        return from_part(v["array"], buffers[0])
    info = dict(v["strings"])
    index = info.pop("index", None)
    if info != {"dtype": "object", "missing": False, "rows": buffers[0].size // 8 - 1}:
        raise ValueError("not a text variable's layout")
    values = as_objects(decode_text(buffers[0].view(np.int64), buffers[1]))
    # an index of pandas' text dtype: the labels as such an index, which xarray keeps as the coordinate's index
    return values if index is None else pd.Index(values, dtype=string_dtype(index))


HANDLER = XarrayHandler()


def handles(t: type) -> bool:
    """Whether :data:`HANDLER` saves values of exactly type ``t``."""
    return t in (xr.Dataset, xr.DataArray)
