"""Content fingerprints: ``fingerprint(value) -> Digest``.

A fingerprint is xxh3-128 over a canonical, type-tagged encoding of a value.
It depends only on the value's type and content, never on ``hash()``,
``id()``, ``repr()`` or memory layout, so it is the same in every process, on
every machine and in every Python session. It is what cache keys are made of.

Rules worth knowing:

* Every encoding starts with a type tag, so ``1``, ``1.0``, ``True``, ``"1"``
  and ``b"1"`` all differ, and ``(1, 2)`` differs from ``[1, 2]``.
* dicts are hashed in iteration order (two dicts with the same items in a
  different order are different values); sets and frozensets are order-free.
* Floats are hashed by their bits, except that every NaN is one value:
  ``-0.0`` and ``0.0`` differ (functions such as ``copysign`` tell them apart).
* numpy arrays by dtype, shape and values in C order. A C-contiguous buffer is
  hashed in place without a copy; Fortran-ordered arrays and strided views give
  the same fingerprint as their C-ordered copy, and are hashed block by block.
* Other objects are hashed as pickle protocol 5 sees them (``__reduce_ex__``):
  the reconstructing callable and classes by their qualified name, arguments
  and state by the rules above, so arrays inside objects are hashed in place and
  instances of local classes work too. Functions count by qualified name;
  lambdas and local functions have none and cannot be fingerprinted.
* ``register_hasher(type, fn)``: ``fn(value)`` returns any value that is then
  fingerprinted in its place (tagged with the type's name).
"""

from __future__ import annotations

import copyreg
import dataclasses
import math
import pickle
import struct
import threading
import types
from collections.abc import Callable
from typing import Any

import numpy as np
import xxhash

from .digest import Digest
from .errors import UnpicklableError

__all__ = ["fingerprint", "register_hasher", "unregister_hasher", "Fingerprinter"]

_pack_q = struct.Struct("<q").pack
_pack_Q = struct.Struct("<Q").pack
_pack_d = struct.Struct("<d").pack
_pack_dd = struct.Struct("<dd").pack

#: Arrays larger than this are hashed straight from their buffer.
_INLINE_LIMIT = 1 << 16
#: Block size when an array must be copied into C order to be hashed.
_BLOCK_BYTES = 8 << 20

_hashers: dict[type, Callable[[Any], Any]] = {}
_hashers_lock = threading.Lock()


def register_hasher(typ: type, fn: Callable[[Any], Any]) -> None:
    """Fingerprint instances of ``typ`` (and its subclasses) as ``fn(value)``.

    ``fn`` returns any value casmon can fingerprint: a ``bytes`` key, a tuple of
    the fields that matter, an array. The result is tagged with the type's
    qualified name, so two types whose hashers return the same value differ.
    """
    if not isinstance(typ, type):
        raise TypeError(f"register_hasher: expected a type, got {typ!r}")
    if not callable(fn):
        raise TypeError(f"register_hasher: hasher for {typ.__qualname__} is not callable: {fn!r}")
    with _hashers_lock:
        _hashers[typ] = fn
        _Fingerprinter._user_cache.clear()


def unregister_hasher(typ: type) -> None:
    """Remove a hasher added with :func:`register_hasher`."""
    with _hashers_lock:
        _hashers.pop(typ, None)
        _Fingerprinter._user_cache.clear()


def _type_name(t: type) -> bytes:
    return f"{t.__module__}.{t.__qualname__}".encode()


class _PathError(Exception):
    """Carries a failing part's path up through the recursion, built lazily."""

    def __init__(self, parts: list[str], obj: Any, cause: BaseException) -> None:
        self.parts = parts
        self.obj = obj
        self.cause = cause


class _Fingerprinter:
    """Feeds the canonical encoding of values into one xxh3-128 state.

    Small encodings collect in a bytearray and are hashed in one call; large
    buffers are passed to the hasher in place.
    """

    # type -> hasher or None, resolved through the MRO once per type
    _user_cache: dict[type, Callable[[Any], Any] | None] = {}

    __slots__ = ("h", "out", "stack")

    def __init__(self) -> None:
        self.h = xxhash.xxh3_128()
        self.out = bytearray()
        self.stack: dict[int, int] = {}  # id of containers being walked -> depth

    def digest(self) -> Digest:
        if self.out:
            self.h.update(self.out)
            self.out.clear()
        return Digest.from_raw(self.h.digest())

    def buffer(self, mv) -> None:
        """Hash a large contiguous buffer without copying it."""
        if self.out:
            self.h.update(self.out)
            self.out.clear()
        self.h.update(mv)

    def feed_value(self, value: Any, root: str = "value") -> None:
        """Feed ``value``; on failure raise :class:`UnpicklableError` naming the part (``root[1]['f']``)."""
        try:
            self.feed(value)
        except _PathError as e:
            path = root + "".join(reversed(e.parts))
            raise UnpicklableError(path, e.obj, e.cause) from None

    # -- dispatch ------------------------------------------------------------
    def feed(self, v: Any) -> None:
        t = type(v)
        f = _DISPATCH.get(t)
        if f is not None:
            f(self, v)
            return
        user = self._user_hasher(t)
        if user is not None:
            self.out += b"H" + _len_prefixed(_type_name(t))
            self.feed(user(v))
            return
        if isinstance(v, np.ndarray):
            self.ndarray(v)
        elif isinstance(v, np.generic):
            self.npscalar(v)
        elif dataclasses.is_dataclass(v) and not isinstance(v, type):
            self.dataclass(v)
        elif t.__module__.startswith("pandas") and _pandas_kind(v) is not None:
            self.pandas(v)
        elif isinstance(v, type):
            self.type_(v)
        elif isinstance(v, (types.FunctionType, types.BuiltinFunctionType, types.MethodType)):
            if isinstance(v, types.MethodType):
                self.out += b"M"
                self.feed(v.__self__)
                self.function(v.__func__)
            else:
                self.function(v)
        else:
            self.reduced(v)

    def _user_hasher(self, t: type):
        cache = self._user_cache
        try:
            return cache[t]
        except KeyError:
            pass
        fn = None
        if _hashers:
            for base in t.__mro__:
                if base in _hashers:
                    fn = _hashers[base]
                    break
        cache[t] = fn
        return fn

    # -- scalars -------------------------------------------------------------
    def none(self, v) -> None:
        self.out += b"N"

    def bool_(self, v) -> None:
        self.out += b"T" if v else b"F"

    def int_(self, v) -> None:
        if -(1 << 63) <= v < (1 << 63):
            self.out += b"q" + _pack_q(v)
        else:
            n = (v.bit_length() + 8) // 8
            self.out += b"I" + _pack_Q(n) + v.to_bytes(n, "little", signed=True)

    def float_(self, v) -> None:
        self.out += b"fN" if v != v else b"f" + _pack_d(v)

    def complex_(self, v) -> None:
        re, im = v.real, v.imag
        self.out += b"c" + _pack_dd(math.nan if re != re else re, math.nan if im != im else im)

    def str_(self, v) -> None:
        b = v.encode("utf-8", "surrogatepass")
        self.out += b"s" + _pack_Q(len(b)) + b

    def bytes_(self, v) -> None:
        self._blob(b"b", v)

    def bytearray_(self, v) -> None:
        self._blob(b"y", v)

    def memoryview_(self, v) -> None:
        self._blob(b"m", v.tobytes() if not v.c_contiguous else v.cast("B") if v.ndim else v.tobytes())

    def _blob(self, tag: bytes, v) -> None:
        n = len(v) if not isinstance(v, memoryview) else v.nbytes
        self.out += tag + _pack_Q(n)
        if n > _INLINE_LIMIT:
            self.buffer(v)
        else:
            self.out += v

    # -- containers ----------------------------------------------------------
    def _enter(self, v) -> bool:
        """Register a container on the walk; emit a back-reference if it is a cycle."""
        i = id(v)
        depth = self.stack.get(i)
        if depth is not None:
            self.out += b"R" + _pack_Q(len(self.stack) - depth)
            return False
        self.stack[i] = len(self.stack)
        return True

    def sequence(self, v, tag: bytes) -> None:
        if not self._enter(v):
            return
        self.out += tag + _pack_Q(len(v))
        feed = self.feed
        for i, item in enumerate(v):
            try:
                feed(item)
            except _PathError as e:
                e.parts.append(f"[{i}]")
                raise
        del self.stack[id(v)]

    def tuple_(self, v) -> None:
        self.sequence(v, b"(")

    def list_(self, v) -> None:
        self.sequence(v, b"[")

    def dict_(self, v) -> None:
        if not self._enter(v):
            return
        self.out += b"{" + _pack_Q(len(v))
        feed = self.feed
        for k, item in v.items():
            try:
                feed(k)
                feed(item)
            except _PathError as e:
                e.parts.append(f"[{k!r}]")
                raise
        del self.stack[id(v)]

    def set_(self, v, tag: bytes = b"S") -> None:
        if not self._enter(v):
            return
        parts = []
        for item in v:
            sub = _Fingerprinter()
            sub.stack = self.stack
            try:
                sub.feed(item)
            except _PathError as e:
                e.parts.append("{…}")
                raise
            parts.append(sub.digest())
        parts.sort()
        self.out += tag + _pack_Q(len(parts)) + b"".join(parts)
        del self.stack[id(v)]

    def frozenset_(self, v) -> None:
        self.set_(v, b"Z")

    def dataclass(self, v) -> None:
        if not self._enter(v):
            return
        fields = dataclasses.fields(v)
        self.out += b"D" + _len_prefixed(_type_name(type(v))) + _pack_Q(len(fields))
        for f in fields:
            self.str_(f.name)
            try:
                self.feed(getattr(v, f.name))
            except _PathError as e:
                e.parts.append(f".{f.name}")
                raise
        del self.stack[id(v)]

    # -- numpy -----------------------------------------------------------------
    def npscalar(self, v: np.generic) -> None:
        self.out += b"a" + _len_prefixed(_dtype_key(v.dtype))
        if v.dtype.hasobject:
            self.feed(v.item())
        else:
            self.out += np.asarray(v).tobytes()

    def ndarray(self, a: np.ndarray) -> None:
        t = type(a)
        tag = b"A" if t is np.ndarray else b"A" + _len_prefixed(_type_name(t))
        self.out += tag + _len_prefixed(_dtype_key(a.dtype)) + _pack_Q(a.ndim)
        for n in a.shape:
            self.out += _pack_Q(n)
        if a.dtype.hasobject:
            if not self._enter(a):
                return
            for i, item in enumerate(a.flat):
                try:
                    self.feed(item)
                except _PathError as e:
                    e.parts.append(f"[flat {i}]")
                    raise
            del self.stack[id(a)]
            return
        if a.size == 0:
            return
        if a.flags.c_contiguous:
            flat = a.reshape(-1).view(np.uint8)
            if flat.nbytes > _INLINE_LIMIT:
                self.buffer(flat)
            else:
                self.out += flat.data
            return
        # Fortran order or strided: hash the C-order bytes one block of rows at a time.
        if a.ndim == 0:
            self.out += a.tobytes()
            return
        row = a[0].nbytes or 1
        step = max(1, _BLOCK_BYTES // row)
        for start in range(0, a.shape[0], step):
            block = np.ascontiguousarray(a[start : start + step])
            self.buffer(block.reshape(-1).view(np.uint8))

    # -- pandas ----------------------------------------------------------------
    def pandas(self, v) -> None:
        kind = _pandas_kind(v)
        self.out += b"p" + _len_prefixed(_type_name(type(v)))
        if kind == "index":
            self.feed(v.names if getattr(v, "nlevels", 1) > 1 else v.name)
            self._pandas_values(v.dtype, v)
        elif kind == "series":
            self.feed(v.name)
            self.pandas(v.index)
            self._pandas_values(v.dtype, v)
        else:  # frame
            self.pandas(v.columns)
            self.pandas(v.index)
            self.out += _pack_Q(v.shape[1])
            for i in range(v.shape[1]):
                col = v.iloc[:, i]
                self._pandas_values(col.dtype, col)
            self.feed(dict(getattr(v, "attrs", {}) or {}))

    def _pandas_values(self, dtype, obj) -> None:
        self.out += _len_prefixed(str(dtype).encode())
        if isinstance(dtype, np.dtype) and not dtype.hasobject:
            self.ndarray(np.asarray(obj.to_numpy()))
        else:
            self.ndarray(np.asarray(obj.to_numpy(dtype=object), dtype=object))

    # -- everything else -------------------------------------------------------
    def type_(self, t: type) -> None:
        self.out += b"t" + _len_prefixed(_global_name(t))

    def function(self, f) -> None:
        name = getattr(f, "__qualname__", "") or getattr(f, "__name__", "")
        if "<lambda>" in name or "<locals>" in name:
            # No stable name: two different lambdas would look the same. Refuse (never a wrong hit).
            raise _PathError([], f, TypeError(f"{name} has no importable name to identify it by"))
        self.out += b"g" + _len_prefixed(_global_name(f))

    def reduced(self, v) -> None:
        """Hash an object the way pickle sees it (``__reduce_ex__(5)``), names by name."""
        if not self._enter(v):
            return
        try:
            reducer = copyreg.dispatch_table.get(type(v))  # as pickle does, e.g. numpy ufuncs
            rv = reducer(v) if reducer is not None else v.__reduce_ex__(5)
        except Exception as e:  # noqa: BLE001 - e.g. "cannot pickle '_thread.lock' object"
            raise _PathError([], v, e) from e
        if isinstance(rv, str):  # a global, pickled by name
            self.out += b"G" + _len_prefixed(f"{getattr(v, '__module__', '')}.{rv}".encode())
            del self.stack[id(v)]
            return
        if not isinstance(rv, tuple) or len(rv) < 2:
            raise _PathError([], v, TypeError(f"__reduce_ex__ returned {type(rv).__name__}"))
        func, args, state, listitems, dictitems = (tuple(rv) + (None, None, None))[:5]
        self.out += b"O"
        try:
            self.out += _len_prefixed(_global_name(func))
            self.feed(args)
            self.feed(state)
            self.feed(None if listitems is None else list(listitems))
            self.feed(None if dictitems is None else list(dictitems))
        except _PathError as e:
            e.parts.append(f"<{type(v).__qualname__}>")
            raise
        del self.stack[id(v)]

    def picklebuffer(self, pb: pickle.PickleBuffer) -> None:
        raw = pb.raw()
        self.out += b"o" + _pack_Q(raw.nbytes)
        self.buffer(raw)


def _global_name(obj) -> bytes:
    mod = getattr(obj, "__module__", None) or ""
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    if name is None:
        raise TypeError(f"{type(obj).__name__} object has no name to identify it by")
    return f"{mod}.{name}".encode()


def _len_prefixed(b: bytes) -> bytes:
    return _pack_Q(len(b)) + b


_dtype_keys: dict[np.dtype, bytes] = {}


def _dtype_key(dt: np.dtype) -> bytes:
    try:
        return _dtype_keys[dt]
    except KeyError:
        key = repr(np.lib.format.dtype_to_descr(dt)).encode()
        _dtype_keys[dt] = key
        return key


def _pandas_kind(v) -> str | None:
    try:
        import pandas as pd
    except ImportError:  # pragma: no cover - pandas is optional
        return None
    if isinstance(v, pd.DataFrame):
        return "frame"
    if isinstance(v, pd.Series):
        return "series"
    if isinstance(v, pd.Index):
        return "index"
    return None


_DISPATCH: dict[type, Callable[[_Fingerprinter, Any], None]] = {
    type(None): _Fingerprinter.none,
    bool: _Fingerprinter.bool_,
    int: _Fingerprinter.int_,
    float: _Fingerprinter.float_,
    complex: _Fingerprinter.complex_,
    str: _Fingerprinter.str_,
    bytes: _Fingerprinter.bytes_,
    bytearray: _Fingerprinter.bytearray_,
    memoryview: _Fingerprinter.memoryview_,
    tuple: _Fingerprinter.tuple_,
    list: _Fingerprinter.list_,
    dict: _Fingerprinter.dict_,
    set: _Fingerprinter.set_,
    frozenset: _Fingerprinter.frozenset_,
    np.ndarray: _Fingerprinter.ndarray,
    pickle.PickleBuffer: _Fingerprinter.picklebuffer,
}


def fingerprint(value: Any) -> Digest:
    """The content digest of ``value``: equal values give equal digests.

    Raises :class:`casmon.errors.UnpicklableError` (a ``TypeError``) naming the
    part of the value that has no canonical encoding and cannot be pickled.
    """
    fp = _Fingerprinter()
    fp.feed_value(value)
    return fp.digest()


# Module-level alias so other layers can build digests of several parts.
Fingerprinter = _Fingerprinter
