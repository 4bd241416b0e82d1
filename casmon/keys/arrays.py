"""The content keys of numpy arrays and scalars and of pandas objects: the rules :mod:`casmon.keys.fingerprint`
states, loaded the first time such a value is keyed (so numpy is imported already: casmon never imports it).

Each function takes the :class:`~casmon.keys.fingerprint.Fingerprinter` feeding the key; once this module is
loaded, a numpy array goes to :func:`ndarray` straight from the fingerprinter's dispatch table.
"""

from __future__ import annotations

import functools
import sys
TYPE_CHECKING = False  # typing's flag without importing typing (~2 ms of a first hit)
if TYPE_CHECKING:
    from typing import Any

import numpy as np
import xxhash

from casmon.keys import fingerprint as _fp
from casmon.keys.fingerprint import _NAN, Concat, Fingerprinter, _len_prefixed, _pack_Q, _PathError

__all__ = ["ndarray", "ndarray_subclass", "npscalar", "pandas", "concat", "small_array_digest"]


def npscalar(fp: Fingerprinter, v: np.generic) -> None:
    fp.out += b"a" + _len_prefixed(_dtype_key(v.dtype))
    if v.dtype.hasobject:
        fp.feed(v.item())
    elif v.dtype.names is not None and (_dtypes or _dtypes_module()).has_padding(v.dtype):
        fp.out += _without_padding(np.asarray(v)).tobytes()
    elif v.dtype.char in "efdFD" and v != v:
        # Every NaN is one value, as for floats: 0/0 and np.nan differ in a sign bit no comparison sees. The NaN
        # written is np.nan's, whose key stays. (Not longdouble's: its bytes hold padding besides the value.)
        re, im = v.real, v.imag
        one = complex(_NAN if re != re else re, _NAN if im != im else im) if v.dtype.kind == "c" \
            else _NAN
        fp.out += np.array(one, v.dtype).tobytes()
    else:
        fp.out += np.asarray(v).tobytes()


def ndarray(fp: Fingerprinter, a: np.ndarray) -> None:
    if type(a) is not np.ndarray:
        ndarray_subclass(fp, a)
        return
    fp.out += b"A" + _len_prefixed(_dtype_key(a.dtype)) + _pack_Q(a.ndim)
    for n in a.shape:
        fp.out += _pack_Q(n)
    if a.dtype.hasobject:
        if not fp._enter(a):
            return
        for i, item in enumerate(a.flat):
            try:
                fp.feed(item)
            except _PathError as e:
                e.parts.append(f"[flat {i}]")
                raise
        del fp.stack[id(a)]
        return
    if a.size == 0:
        return
    # A structured dtype's padding holds whatever memory held (a copy's differs): its fields count, as
    # copies with the gaps zeroed, a block of rows at a time.
    padded = a.dtype.names is not None and (_dtypes or _dtypes_module()).has_padding(a.dtype)
    if a.flags.c_contiguous and not padded:
        flat = a.reshape(-1).view(np.uint8)
        if flat.nbytes > _fp._INLINE_LIMIT:
            fp.begin_run(flat.nbytes)
            fp.buffer(flat)
            fp.end_run()
        else:
            fp.out += flat.data
        return
    # Fortran order or strided: hash the C-order bytes one block of rows at a time.
    if a.ndim == 0:
        fp.out += (_without_padding(a) if padded else a).tobytes()
        return
    fp.begin_run(a.nbytes)  # the C-order bytes, in pieces: the same key as a contiguous copy's
    run = fp.run
    if run is not None and not padded and a[0].nbytes <= (_fp._segments or _fp._segments_module()).SEGMENT:
        # Each thread copies and hashes its own segments: the copy, not the hash, is most of the cost.
        fp.fed += a.nbytes
        from casmon.keys.corder import c_order_bytes

        run.feed_produced(functools.partial(c_order_bytes, a, {}))
    elif a.ndim == 2 and a.flags.f_contiguous and a.nbytes > _fp._INLINE_LIMIT and not padded:
        _transposed(fp, a)
    else:
        row = a[0].nbytes or 1
        step = max(1, _fp._BLOCK_BYTES // row)
        for start in range(0, a.shape[0], step):
            part = a[start : start + step]
            block = _without_padding(part) if padded else np.ascontiguousarray(part)
            fp.buffer(block.reshape(-1).view(np.uint8))
    fp.end_run()


def _transposed(fp: Fingerprinter, a: np.ndarray) -> None:
    """A Fortran-ordered matrix's C-order bytes, a block of rows at a time, copied in tiles (corder.py): a
    whole row at a time would touch a page per element (3-4x the time of C order instead of 13x)."""
    from casmon.keys.corder import STAGE_BYTES, tiled_copy

    rows, cols = a.shape
    height = max(1, min(rows, max(256, (1 << 20) // max(1, cols * a.dtype.itemsize))))
    buf = np.empty((height, cols), a.dtype)
    stage = np.empty(STAGE_BYTES, np.uint8)
    for start in range(0, rows, height):
        block = a[start : start + height]
        out = buf[: block.shape[0]]
        tiled_copy(out, block, stage)
        fp.buffer(out.reshape(-1).view(np.uint8))


def ndarray_subclass(fp: Fingerprinter, a: np.ndarray) -> None:
    """A subclass counts its type, its data, and the attributes its instances carry.

    Masked arrays count their data (also under the mask), their mask
    (``nomask`` and an all-False mask differ: ``a.mask`` differs), their
    fill value and hard-mask flag. ``np.memmap`` counts like its data (the
    open file handle and file name are how it is stored, not what it is).
    Other subclasses count every instance attribute (``__dict__`` and slots),
    so a units subclass with ``unit="km"`` differs from one with ``unit="m"``.
    """
    if not fp._enter(a):
        return
    t = type(a)
    fp.out += b"X"
    fp.type_(t)
    try:
        ndarray(fp, a.view(np.ndarray))
        attrs = dict(getattr(a, "__dict__", None) or {})
        for name in _slot_names(t):
            if hasattr(a, name):
                attrs[name] = getattr(a, name)
        if isinstance(a, np.ma.MaskedArray):
            m: Any = a  # numpy's stubs omit the internals a masked array pickles
            for k in _MASKED_INTERNALS:
                attrs.pop(k, None)
            mask = m._mask
            fp.feed(None if mask is np.ma.nomask else np.asarray(mask).view(np.ndarray))
            fp.feed(m._fill_value)
            fp.feed(bool(m._hardmask))
            fp.feed(m._baseclass)
        elif isinstance(a, np.memmap):
            for k in ("_mmap", "filename", "offset", "mode"):
                attrs.pop(k, None)
        fp.out += b"{" + _pack_Q(len(attrs))
        for k, item in attrs.items():
            try:
                fp.feed(k)
                fp.feed(item)
            except _PathError as e:
                e.parts.append(f".{k}")
                raise
    finally:
        fp.stack.pop(id(a), None)


def pandas(fp: Fingerprinter, v: Any) -> None:
    """pandas objects by everything a function can see: values with their exact dtype
    (a categorical's categories, their order and the ordered flag), index names and
    ``freq``, MultiIndex levels and codes, ``attrs``, ``flags`` and a subclass's ``_metadata``."""
    kind = _fp._pandas_kind(v)
    fp.out += b"p"
    fp.type_(type(v))
    if kind == "index":
        _pandas_index(fp, v)
    elif kind == "series":
        fp.feed(v.name)
        pandas(fp, v.index)
        _pandas_values(fp, v.dtype, v)
        fp.feed(dict(v.attrs))
        fp.feed(bool(v.flags.allows_duplicate_labels))
    else:  # frame
        pandas(fp, v.columns)
        pandas(fp, v.index)
        fp.out += _pack_Q(v.shape[1])
        for i in range(v.shape[1]):
            col = v.iloc[:, i]
            _pandas_values(fp, col.dtype, col)
        fp.feed(dict(v.attrs))
        fp.feed(bool(v.flags.allows_duplicate_labels))
    meta = getattr(type(v), "_metadata", None)
    if meta:
        fp.feed({m: getattr(v, m, None) for m in meta})


def _pandas_index(fp: Fingerprinter, v: Any) -> None:
    import pandas as pd

    if isinstance(v, pd.MultiIndex):
        fp.feed(list(v.names))
        fp.out += _pack_Q(v.nlevels)
        for level, codes in zip(v.levels, v.codes):
            pandas(fp, level)
            ndarray(fp, np.asarray(codes))
        fp.feed(v.sortorder)
        return
    fp.feed(v.name)
    _pandas_values(fp, v.dtype, v)
    freq = getattr(v, "freq", None) if isinstance(v, (pd.DatetimeIndex, pd.TimedeltaIndex)) else None
    fp.feed(freq)


def _pandas_values(fp: Fingerprinter, dtype: Any, obj: Any) -> None:
    if isinstance(dtype, np.dtype):
        fp.out += b"n" + _len_prefixed(_dtype_key(dtype))
        if not dtype.hasobject:
            ndarray(fp, np.asarray(obj.to_numpy()))
        else:
            ndarray(fp, np.asarray(obj.to_numpy(dtype=object), dtype=object))
        return
    # An extension dtype counts as the object it is (categories, order, tz, unit, closed, ...).
    fp.out += b"e"
    fp.feed(_without_memo(dtype))
    arr = obj.array
    arrow = getattr(arr, "_pa_array", None)  # pandas' Arrow-backed columns (pandas 3's default str)
    if arrow is not None and "pyarrow" in sys.modules:
        (_fp._libraries or _fp._libraries_module()).ensure_module("pyarrow")
        fp.feed(arrow)
        return
    codes = getattr(arr, "codes", None)
    if codes is not None and getattr(dtype, "name", "") == "category":
        ndarray(fp, np.asarray(codes))
        return
    asi8 = getattr(arr, "asi8", None)
    if asi8 is not None:
        ndarray(fp, np.asarray(asi8))
        return
    ndarray(fp, np.asarray(obj.to_numpy(dtype=object), dtype=object))


def concat(fp: Fingerprinter, c: Concat) -> None:
    total = sum(p.nbytes for p in c.pieces)
    fp.out += b"C" + _pack_Q(total)
    fp.begin_run(total)
    for p in c.pieces:
        flat = p.reshape(-1).view(np.uint8) if p.flags.c_contiguous else np.ascontiguousarray(p).reshape(-1).view(np.uint8)
        if flat.nbytes > _fp._INLINE_LIMIT or fp.run is not None:
            fp.buffer(flat)
        else:
            fp.out += flat.data
    fp.end_run()


def _without_padding(a: np.ndarray) -> np.ndarray:
    """A copy of a structured array with its padding bytes zero: assignment copies fields, never the gaps."""
    out = np.zeros(a.shape, a.dtype)
    out[...] = a
    return out


_MASKED_INTERNALS = ("_mask", "_fill_value", "_hardmask", "_baseclass", "_sharedmask", "_isfield", "_optinfo", "_basedict")


def _slot_names(t: type) -> list[str]:
    names = []
    for c in t.__mro__:
        sl = c.__dict__.get("__slots__")
        if sl:
            for n in [sl] if isinstance(sl, str) else sl:
                if n not in ("__dict__", "__weakref__") and n not in names:
                    names.append(n)
    return names


def small_array_digest(a: np.ndarray, hexed: bool = False) -> Any:
    """:func:`casmon.keys.fingerprint.small_array_digest` of a numpy array: the digest, or None for an array
    that is not small and plain."""
    nbytes = a.nbytes
    if nbytes > _fp._INLINE_LIMIT:  # any layout: its encoding is its C-order bytes, which tobytes gives
        return None
    dt, shape = a.dtype, a.shape
    last = _last_head  # one read: another thread may replace it
    if last[0] is dt and last[1] == shape:  # no tuple to build and hash
        head = last[2]
    else:
        cached = _small_heads.get((dt, shape))
        # an equal dtype that holds more (metadata: equal, and hashed alike) is another encoding: not the cached one's
        if cached is not None and (cached[0] is dt or _plain_dtype(dt)):
            head = cached[1]
        else:
            if dt.hasobject or dt.names is not None or not _plain_dtype(dt):
                return None
            head = b"A" + _len_prefixed(_dtype_key(dt)) + _pack_Q(len(shape)) + b"".join([_pack_Q(n) for n in shape])
            if len(_small_heads) < 4096:
                _small_heads[(dt, shape)] = (dt, head)
        _remember_head(dt, shape, head)
    if nbytes <= 4096:  # copying a few bytes costs less than a hasher object and a byte view
        return (_h128_hex if hexed else _h128_raw)(head + a.tobytes())
    h = xxhash.xxh3_128(head)
    h.update(a.reshape(-1).view(np.uint8).data)  # as bytes: a datetime64 array exports no buffer of its own
    return h.hexdigest() if hexed else h.digest()


#: (plain dtype, shape) -> (that dtype, the start of such an array's encoding) (a dtype that needs more than its
#: descriptor is never here): one lookup, where packing the shape costs more than the hash of a small array.
_small_heads: dict[tuple[Any, tuple[int, ...]], tuple[Any, bytes]] = {}
#: (plain dtype, shape, head) of the last small array digested: a loop's arrays are alike
_last_head: tuple[Any, Any, bytes] = (None, None, b"")
_h128_hex, _h128_raw = xxhash.xxh3_128_hexdigest, xxhash.xxh3_128_digest


def _plain_dtype(dt: Any) -> bool:
    return (_dtypes or _dtypes_module()).dtype_extras(dt) is None


def _remember_head(dt: Any, shape: tuple[int, ...], head: bytes) -> None:
    global _last_head
    _last_head = (dt, shape, head)


_dtype_keys: dict[np.dtype, bytes] = {}


#: casmon.keys.dtypes once an array's dtype is read (a small array's cached head needs none): an import statement
#: run by every array's key cost it a third more than the module's own name.
_dtypes: Any = None


def _dtypes_module() -> Any:
    global _dtypes
    from casmon.keys import dtypes

    _dtypes = dtypes
    return dtypes


def _dtype_key(dt: np.dtype) -> bytes:
    d = _dtypes or _dtypes_module()
    extras = d.dtype_extras(dt)
    if extras is not None:
        # Metadata, alignment, np.record, a non-legacy dtype: equal dtypes can differ here, so never cached by
        # dtype. After a NUL (which a descriptor's repr never holds): the digest of what the descriptor lacks.
        sub = Fingerprinter()
        try:
            sub.feed(extras)
        except _PathError as e:
            e.parts.append(".dtype")
            raise
        return repr(d.descr_of(dt)).encode() + b"\x00" + sub.digest()
    try:
        return _dtype_keys[dt]
    except KeyError:
        pass
    try:
        key = repr(np.lib.format.dtype_to_descr(dt)).encode()
    except ValueError:  # fields out of order or overlapping: by their layout (no descriptor holds it)
        key = repr(d.layout_of(dt)).encode()
    _dtype_keys[dt] = key
    return key


def _without_memo(dtype: Any) -> Any:
    """A pandas extension dtype without the memo of derived properties pandas fills in as they are first asked
    for (``Int64Dtype().numpy_dtype`` adds ``_cache``): the dtype is what it was, so its key stays what it was."""
    state = getattr(dtype, "__dict__", None)
    if not state or "_cache" not in state:
        return dtype
    import copy  # a structured dtype's only: a hit loads no copy (nor the weakref it imports)

    plain = copy.copy(dtype)
    vars(plain).pop("_cache", None)
    return plain
