"""Serialization: a value becomes a small manifest plus buffers, and back.

``encode(value)`` returns an :class:`Encoded`: a tag, a JSON-able ``meta``
dict, optional inline bytes, and :class:`Part` buffers (array data, large
bytes, pickle's out-of-band buffers) that the store splits into chunks. Nothing
large is ever copied into a pickle stream: pickle protocol 5 hands arrays over
as out-of-band buffers, in place.

Forms, by tag:

``json``
    Small dicts and lists made only of dict (str keys), list, str, int, float,
    bool and None.
``array``
    A numpy array (the default handler), chunked along its first axis (its last
    axis if Fortran-ordered) so a chunk is a block of rows.
``bytes``
    Large ``bytes``/``bytearray`` values.
``pickle``
    Everything else: a pickle stream plus out-of-band buffers. Loading a pickle
    can run code: only load pickles from stores you trust. A store opened with
    ``trust=False`` still loads pickles that name no global at all (scalars,
    tuples, sets, dicts of them), which cannot run code.
``handler``
    A value saved by a handler registered with :func:`register_handler`.

Registered handler types nested inside a pickled value are saved as values of
their own (``children``) and referenced from the pickle stream.
"""

from __future__ import annotations

import ast
import io
import json
import pickle
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from .errors import UnpicklableError, UntrustedStoreError, locate_unpicklable

__all__ = [
    "Part",
    "Encoded",
    "Handler",
    "ArrayHandler",
    "register_handler",
    "unregister_handler",
    "handlers",
    "encode",
    "decode",
]

#: Out-of-band buffers smaller than this stay inside the pickle stream.
OOB_MIN = 1 << 14
#: bytes values at least this large are stored chunked (deduplicated by chunk).
BYTES_MIN = 1 << 16
#: JSON form only for values whose text is at most this long.
JSON_MAX = 1 << 16


@dataclass
class Part:
    """A buffer to be stored as content-addressed chunks."""

    data: memoryview  # 1-D, C-contiguous, format 'B'
    row_bytes: int = 1  # chunk boundaries fall on multiples of this
    typesize: int = 1  # element size, for byte shuffling
    numeric: bool = False  # True: compress with the array codec


@dataclass
class Encoded:
    tag: str
    meta: dict = field(default_factory=dict)
    inline: bytes = b""
    parts: list[Part] = field(default_factory=list)
    children: list[Any] = field(default_factory=list)
    nbytes: int = 0  # logical size, for stats


@runtime_checkable
class Handler(Protocol):
    """Saves and loads one type of value.

    ``name`` is stored in the manifest and must stay the same across versions.
    ``encode`` returns ``(meta, buffers)`` -- ``meta`` JSON-able, ``buffers`` a
    list of bytes-like objects -- or ``None`` to decline (the value is then
    pickled). ``decode(meta, buffers)`` gets writable ``numpy.uint8`` buffers
    that it may keep.
    """

    name: str

    def encode(self, value: Any) -> tuple[dict, list] | None: ...

    def decode(self, meta: dict, buffers: list[np.ndarray]) -> Any: ...


class ArrayHandler:
    """numpy arrays: dtype, shape and memory order kept; data chunked by rows."""

    name = "numpy.ndarray"

    def encode(self, a: Any):
        if type(a) is not np.ndarray or a.dtype.hasobject:
            return None
        if a.flags.c_contiguous:
            order = "C"
        elif a.flags.f_contiguous:
            order = "F"
        else:
            a = np.ascontiguousarray(a)
            order = "C"
        meta = {"dtype": repr(np.lib.format.dtype_to_descr(a.dtype)), "shape": list(a.shape), "order": order}
        return meta, [a]

    def decode(self, meta: dict, buffers: list[np.ndarray]) -> np.ndarray:
        dtype = dtype_from_meta(meta["dtype"])
        shape = tuple(meta["shape"])
        buf = buffers[0]
        if dtype.itemsize == 0:
            return np.zeros(shape, dtype=dtype, order=meta["order"])
        return buf.view(dtype).reshape(shape, order=meta["order"])


def dtype_from_meta(descr: str) -> np.dtype:
    return np.lib.format.descr_to_dtype(ast.literal_eval(descr))


_handlers: dict[type, Handler] = {}
_handlers_by_name: dict[str, Handler] = {}
_lock = threading.Lock()


def register_handler(typ: type, handler: Handler) -> None:
    """Save and load values of ``typ`` (exactly that type) with ``handler``.

    Handlers are for types that pickle badly or not at all (open files, GPU
    tensors, objects with large native buffers). numpy arrays are registered by
    default.
    """
    if not isinstance(typ, type):
        raise TypeError(f"register_handler: expected a type, got {typ!r}")
    for attr in ("name", "encode", "decode"):
        if not hasattr(handler, attr):
            raise TypeError(f"register_handler: handler for {typ.__qualname__} has no {attr!r}")
    with _lock:
        _handlers[typ] = handler
        _handlers_by_name[handler.name] = handler


def unregister_handler(typ: type) -> None:
    with _lock:
        h = _handlers.pop(typ, None)
        if h is not None and h not in _handlers.values():
            _handlers_by_name.pop(h.name, None)


class HandlerRegistry:
    """The registered handlers, by type (``casmon.handlers``): ``add``, lookup, iteration, a readable repr."""

    def add(self, typ: type, handler: Handler) -> None:
        register_handler(typ, handler)

    def remove(self, typ: type) -> None:
        unregister_handler(typ)

    def __getitem__(self, typ: type) -> Handler:
        return _handlers[typ]

    def __contains__(self, typ: object) -> bool:
        return typ in _handlers

    def __iter__(self):
        return iter(dict(_handlers))

    def __len__(self) -> int:
        return len(_handlers)

    def __call__(self) -> dict[type, Handler]:
        return dict(_handlers)

    def __repr__(self) -> str:
        lines = [f"    {t.__module__}.{t.__qualname__}: {h.name} ({type(h).__qualname__})" for t, h in _handlers.items()]
        return "HandlerRegistry{\n" + "\n".join(lines) + "\n}"


#: The registry; calling it returns a dict of the handlers by type.
handlers = HandlerRegistry()


def handler_named(name: str) -> Handler:
    try:
        return _handlers_by_name[name]
    except KeyError:
        raise LookupError(f"no handler named {name!r} is registered; register it before loading this value") from None


register_handler(np.ndarray, ArrayHandler())


def _as_part(buf, numeric: bool, row_bytes: int = 1) -> Part:
    if isinstance(buf, np.ndarray):
        ts = buf.dtype.itemsize if buf.dtype.itemsize in (1, 2, 4, 8, 16) else 1
        flat = buf.reshape(-1, order="A").view(np.uint8) if buf.size else np.empty(0, np.uint8)
        return Part(memoryview(flat), row_bytes=max(1, row_bytes), typesize=ts, numeric=numeric)
    mv = memoryview(buf)
    ts = mv.itemsize if mv.itemsize in (1, 2, 4, 8, 16) else 1
    if not mv.c_contiguous:
        mv = memoryview(mv.tobytes())
    return Part(mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv, row_bytes=max(1, row_bytes), typesize=ts, numeric=numeric)


def _jsonable(v: Any, budget: list[int], depth: int = 0) -> bool:
    """Small, shallow, acyclic JSON-like values only (a bounded walk: deep or recursive values are pickled)."""
    budget[0] -= 1
    if budget[0] < 0 or depth > 64:
        return False
    t = type(v)
    if t in (str, int, float, bool) or v is None:
        return True
    if t is list:
        return all(_jsonable(x, budget, depth + 1) for x in v)
    if t is dict:
        return all(type(k) is str and _jsonable(x, budget, depth + 1) for k, x in v.items())
    return False


class _Pickler(pickle.Pickler):
    def __init__(self, file, children: list, buffers: list) -> None:
        super().__init__(file, protocol=5, buffer_callback=self._oob)
        self._children = children
        self._buffers = buffers

    def _oob(self, pb: pickle.PickleBuffer) -> bool:
        raw = pb.raw()
        if raw.nbytes < OOB_MIN:
            return True  # in-band
        self._buffers.append(pb)
        return False

    def persistent_id(self, obj):
        t = type(obj)
        if t is np.ndarray or t not in _handlers:
            return None
        self._children.append(obj)
        return len(self._children) - 1


def encode(value: Any, root: str = "value") -> Encoded:
    """Turn ``value`` into an :class:`Encoded`; raises :class:`UnpicklableError` naming the bad part."""
    t = type(value)
    h = _handlers.get(t)
    if h is not None:
        res = h.encode(value)
        if res is not None:
            meta, bufs = res
            if isinstance(h, ArrayHandler):
                a = bufs[0]
                if a.ndim == 0 or a.size == 0:
                    row = max(1, a.nbytes)
                elif meta["order"] == "C":
                    row = a.nbytes // a.shape[0]
                else:
                    row = a.nbytes // a.shape[-1]
                return Encoded("array", meta, parts=[_as_part(a, True, row)], nbytes=a.nbytes)
            parts = [_as_part(b, False) for b in bufs]
            return Encoded("handler", {"handler": h.name, "meta": meta}, parts=parts, nbytes=sum(p.data.nbytes for p in parts))
    if t in (bytes, bytearray) and len(value) >= BYTES_MIN:
        return Encoded("bytes", {"type": t.__name__}, parts=[_as_part(value, False)], nbytes=len(value))
    if t in (dict, list):  # containers: readable as JSON; scalars are faster to load as pickles
        if _jsonable(value, [10_000]):
            try:
                text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
            except (ValueError, TypeError):
                text = None
            if text is not None and len(text) <= JSON_MAX:
                data = text.encode("utf-8", "surrogatepass")
                return Encoded("json", inline=data, nbytes=len(data))
    children: list = []
    buffers: list = []
    f = io.BytesIO()
    try:
        _Pickler(f, children, buffers).dump(value)
    except RecursionError:
        raise TypeError(f"{root} is nested too deeply to pickle (Python's recursion limit, {sys.getrecursionlimit()})") from None
    except Exception as e:  # noqa: BLE001 - find and name the part that failed
        found = locate_unpicklable(value, root)
        raise (found or UnpicklableError(root, value, e)) from e
    stream = f.getbuffer()
    parts = [_as_part(pb.raw(), True) for pb in buffers]
    nbytes = stream.nbytes + sum(p.data.nbytes for p in parts)
    return Encoded("pickle", {"oob": len(parts)}, inline=bytes(stream), parts=parts, children=children, nbytes=nbytes)


class _SafeUnpickler(pickle.Unpickler):
    """Loads only pickles that name no global: builtin containers and scalars.

    Without ``find_class`` (and ``persistent_load``) a pickle cannot reach any
    callable, so it cannot run code (see "Restricting Globals" in the pickle docs).
    """

    def find_class(self, module: str, name: str):
        raise UntrustedStoreError(
            f"this value is a pickle that needs {module}.{name} to load, and loading it could run code; "
            "the store was opened with trust=False. Open it with trust=True if you trust who wrote it."
        )

    def persistent_load(self, pid):
        raise UntrustedStoreError("this value refers to other values through its pickle; the store was opened with trust=False")


def decode(enc: Encoded, buffers: list[np.ndarray], load_child=None, trusted: bool = True) -> Any:
    """Rebuild a value from its manifest and freshly read buffers.

    With ``trusted=False`` a pickle loads only if it names no global (no code can run).
    """
    tag = enc.tag
    if tag == "json":
        return json.loads(enc.inline)
    if tag == "array":
        return _handlers_by_name[ArrayHandler.name].decode(enc.meta, buffers)
    if tag == "bytes":
        data = buffers[0]
        return bytearray(data) if enc.meta.get("type") == "bytearray" else data.tobytes()
    if tag == "handler":
        return handler_named(enc.meta["handler"]).decode(enc.meta["meta"], buffers)
    if tag == "pickle":
        if not trusted:
            return _SafeUnpickler(io.BytesIO(enc.inline), buffers=buffers).load()
        up = pickle.Unpickler(io.BytesIO(enc.inline), buffers=buffers)
        if enc.children:
            up.persistent_load = lambda pid: load_child(pid)
        return up.load()
    raise ValueError(f"unknown value form {tag!r}")
