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
    A value saved by a handler registered with :func:`register_handler`, or by
    one of casmon's own for the ML libraries (:mod:`casmon.store.libraries`:
    torch, jax, pyarrow, polars, PIL, HF datasets), loaded the first time a value
    of that library is saved or loaded.

Registered handler types nested inside a pickled value are saved as values of
their own (``children``) and referenced from the pickle stream, and so are
strided numpy arrays (pickle would copy them into the stream).
"""

from __future__ import annotations

import io  # loaded with the interpreter (its standard streams): no cost to a hit
import _thread  # threading's locks, without loading threading on a hit
from sys import modules as _modules
from collections.abc import Callable, Iterator
TYPE_CHECKING = False  # typing's flag without importing typing (~2 ms of a first hit)
if TYPE_CHECKING:
    from typing import IO, Any, Protocol, runtime_checkable

from casmon.keys.names import keep_flat_names
from casmon.errors import DamagedObjectError, StoreFormatError, UntrustedStoreError
from casmon.plain import Plain
from casmon.store import plainpickle
from casmon.store.codec import is_ndarray, loaded_numpy

if TYPE_CHECKING:
    import numpy as np

    from casmon.store.encode import as_part, encode
    from casmon.store.manifestcheck import TAGS, check_manifest

__all__ = [
    "Part",
    "Encoded",
    "Handler",
    "ArrayHandler",
    "MemoryviewHandler",
    "register_handler",
    "register_library_handler",
    "register_library_handler_name",
    "unregister_handler",
    "handlers",
    "encode",
    "decode",
    "check_manifest",
]

#: The write half (:mod:`casmon.store.encode`) and the check of a manifest with parts
#: (:mod:`casmon.store.manifestcheck`), loaded on first use: a hit decodes, never encodes, and a plain
#: value's manifest has no fields to check.
_HOMES = {"encode": "casmon.store.encode", "as_part": "casmon.store.encode",
          "check_manifest": "casmon.store.manifestcheck", "TAGS": "casmon.store.manifestcheck"}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is not None:
        import importlib

        value = getattr(importlib.import_module(home), name)
        globals()[name] = value  # the next lookup is a plain attribute
        return value
    raise AttributeError(f"module 'casmon.store.serialize' has no attribute {name!r}")


#: Out-of-band buffers smaller than this stay inside the pickle stream.
OOB_MIN = 1 << 14
#: bytes values at least this large are stored chunked (deduplicated by chunk).
BYTES_MIN = 1 << 16
#: JSON form only for values whose text is at most this long.
JSON_MAX = 1 << 16


class Part(Plain):
    """A buffer to be stored as content-addressed chunks."""

    FIELDS = ("data", "row_bytes", "typesize", "numeric")
    data: memoryview  # 1-D, C-contiguous, format 'B'
    row_bytes: int  # chunk boundaries fall on multiples of this
    typesize: int  # element size, for byte shuffling
    numeric: bool  # True: compress with the array codec

    def __init__(self, data: memoryview, row_bytes: int = 1, typesize: int = 1, numeric: bool = False) -> None:
        self.data, self.row_bytes, self.typesize, self.numeric = data, row_bytes, typesize, numeric


class Encoded(Plain):
    """A value as ``encode`` made it: its form (``tag``), metadata, inline bytes, buffers and child values."""

    FIELDS = ("tag", "meta", "inline", "parts", "children", "nbytes")
    tag: str
    meta: dict[str, Any]
    inline: bytes
    parts: list[Part]
    children: list[Any]
    nbytes: int  # logical size, for stats

    def __init__(self, tag: str, meta: dict[str, Any] | None = None, inline: bytes = b"", parts: list[Part] | None = None,
                 children: list[Any] | None = None, nbytes: int = 0) -> None:
        self.tag, self.meta, self.inline, self.nbytes = tag, {} if meta is None else meta, inline, nbytes
        self.parts = [] if parts is None else parts
        self.children = [] if children is None else children


if TYPE_CHECKING:
    @runtime_checkable
    class Handler(Protocol):
        """Saves and loads one type of value (the run-time class below says how)."""

        name: str

        def encode(self, value: Any) -> tuple[dict[str, Any], list[Any]] | None: ...

        def decode(self, meta: dict[str, Any], buffers: list[np.ndarray[Any, np.dtype[np.uint8]]]) -> Any: ...
else:
    class _HandlerCheck(type):
        # What typing's runtime_checkable Protocol does, without loading typing on a fresh process's first hit.
        def __instancecheck__(cls, obj):
            return all(hasattr(obj, a) for a in ("name", "encode", "decode"))

    class Handler(metaclass=_HandlerCheck):
        """Saves and loads one type of value.

        ``name`` is stored in the manifest and must stay the same across versions.
        ``encode`` returns ``(meta, buffers)`` -- ``meta`` JSON-able, ``buffers`` a
        list of bytes-like objects -- or ``None`` to decline (the value is then
        pickled). A buffer may be a :class:`Part` to choose how it is stored: with
        ``numeric=True`` it takes the array codec, byte-shuffled by ``typesize``, with
        chunk boundaries on multiples of ``row_bytes``. ``decode(meta, buffers)`` gets
        writable ``numpy.uint8`` buffers that it may keep. A handler with a true
        ``safe`` attribute builds values from data alone, without running code the
        store names, and also loads from a store opened with ``trust=False``.
        """


class ArrayHandler:
    """numpy arrays: dtype, shape and memory order kept; data chunked by rows."""

    name = "numpy.ndarray"

    def encode(self, a: Any) -> tuple[dict[str, Any], list[Any]] | None:
        from casmon.keys.dtypes import dtype_extras  # arrays' only

        import numpy as np  # casmon never imports numpy itself: only the user's arrays reach here

        if type(a) is not np.ndarray or a.dtype.hasobject or dtype_extras(a.dtype) is not None:
            return None  # a dtype its descriptor does not hold (metadata, aligned, np.record) is pickled whole
        if a.flags.c_contiguous:
            order = "C"
        elif a.flags.f_contiguous:
            order = "F"
        else:
            a = np.ascontiguousarray(a)
            order = "C"
        meta = {"dtype": repr(np.lib.format.dtype_to_descr(a.dtype)), "shape": list(a.shape), "order": order}
        return meta, [a]

    def decode(self, meta: dict[str, Any], buffers: list[np.ndarray[Any, np.dtype[np.uint8]]]) -> np.ndarray[Any, Any]:
        import numpy as np

        dtype = dtype_from_meta(meta["dtype"])
        shape = tuple(meta["shape"])
        buf = buffers[0]
        if dtype.itemsize == 0:
            return np.zeros(shape, dtype=dtype, order=meta["order"])
        return buf.view(dtype).reshape(shape, order=meta["order"])


#: Formats ``memoryview.cast`` can rebuild a view in (native single items; ``@`` is native too).
_VIEW_FORMATS = frozenset("cbBhHiIlLqQnNfde?P") | {"@" + c for c in "cbBhHiIlLqQnNfde?P"}


class MemoryviewHandler:
    """memoryviews: their bytes in C order, format, shape and whether they are read-only (a view of
    ``bytes`` comes back as one, a writable view as a view of a ``bytearray``). Strides come back C-contiguous,
    as a strided array's do. Views in a format ``memoryview.cast`` cannot make are declined."""

    name = "memoryview"
    safe = True  # builds from data alone

    def encode(self, v: Any) -> tuple[dict[str, Any], list[Any]] | None:
        shape = v.shape or ()
        if type(v) is not memoryview or v.format not in _VIEW_FORMATS or v.suboffsets or (v.ndim > 1 and 0 in shape):
            return None
        data = v.cast("B") if v.c_contiguous and v.ndim else memoryview(v.tobytes())
        return {"format": v.format, "shape": list(shape), "readonly": bool(v.readonly)}, [Part(data)]

    def decode(self, meta: dict[str, Any], buffers: list[np.ndarray[Any, np.dtype[np.uint8]]]) -> memoryview:
        fmt, shape, readonly = meta["format"], meta["shape"], meta["readonly"]
        if fmt not in _VIEW_FORMATS or type(readonly) is not bool or not isinstance(shape, list) or len(shape) > MAX_NDIM \
                or not all(type(n) is int and n >= 0 for n in shape):
            raise ValueError(f"a memoryview of format {str(fmt)[:20]!r}, shape {str(shape)[:80]}")
        raw = buffers[0].tobytes() if readonly else bytearray(buffers[0])
        view = memoryview(raw)
        return view.cast(fmt) if len(shape) == 1 and 0 in shape else view.cast(fmt, shape)


def dtype_from_meta(descr: str) -> np.dtype[Any]:
    import numpy as np

    import ast  # an array's dtype text: not loaded by a hit that returns no array

    return np.lib.format.descr_to_dtype(ast.literal_eval(descr))


_handlers: dict[type, Handler] = {}
#: Types the pickler meets most: never a handler's (saves a lookup per object).
_PLAIN = frozenset({str, bytes, int, float, bool, tuple, list, dict, set, frozenset, type(None), complex, bytearray})
_handlers_by_name: dict[str, Handler] = {}
_lock = _thread.allocate_lock()
#: ``numpy.ndarray`` once numpy is imported (by the user: casmon never imports it to save a value that is not an array).
_NDARRAY: type | None = None


def _see_numpy() -> None:
    """Register the array handler for ``numpy.ndarray`` as soon as numpy is imported, as if at import."""
    global _NDARRAY
    if _NDARRAY is not None:
        return
    nd = getattr(loaded_numpy(), "ndarray", None)
    if nd is None:
        return
    with _lock:
        if _NDARRAY is None:
            _handlers.setdefault(nd, _ARRAYS)
            _NDARRAY = nd


def register_handler(typ: type, handler: Handler) -> None:
    """Save and load values of ``typ`` (exactly that type) with ``handler``.

    Handlers are for types that pickle badly or not at all (open files, GPU
    tensors, objects with large native buffers). numpy arrays are registered by
    default.
    """
    if not isinstance(typ, type):
        raise TypeError(f"register_handler: expected a type, got {typ!r}")
    _see_numpy()
    for attr in ("name", "encode", "decode"):
        if not hasattr(handler, attr):
            raise TypeError(f"register_handler: handler for {typ.__qualname__} has no {attr!r}")
    with _lock:
        _handlers[typ] = handler
        _handlers_by_name[handler.name] = handler
        _declined.discard(typ)


def register_library_handler(typ: type, handler: Handler) -> None:
    """casmon's own handler for a library's type (:mod:`casmon.store.libraries`): one the user registered wins."""
    _see_numpy()
    with _lock:
        if typ not in _handlers:
            _handlers[typ] = handler
            _handlers_by_name.setdefault(handler.name, handler)


def register_library_handler_name(handler: Handler) -> None:
    """Make casmon's own ``handler`` loadable by its stored name (a process that loads before it saves)."""
    with _lock:
        _handlers_by_name.setdefault(handler.name, handler)


_libraries: Any = None


def handler_for(t: type) -> Handler | None:
    """The handler that saves values of exactly type ``t``, loading casmon's own for ML libraries on first use."""
    global _libraries
    if _libraries is None:  # bound once (ML values' only: a plain hit loads none), not imported per write
        from casmon.store import libraries as _libraries

    libraries = _libraries
    h = _handlers.get(t)
    if h is None and _NDARRAY is None:
        _see_numpy()
        h = _handlers.get(t)
    if h is None and t not in _declined and libraries.ensure(t):
        h = _handlers.get(t)
    if h is None:
        _declined.add(t)
    return h


_declined: set[type] = set()


def unregister_handler(typ: type) -> None:
    _see_numpy()
    with _lock:
        h = _handlers.pop(typ, None)
        if h is not None and h not in _handlers.values():
            _handlers_by_name.pop(h.name, None)


def _registered() -> dict[type, Handler]:
    """The handlers by type, numpy's among them once numpy is imported."""
    _see_numpy()
    return _handlers


class HandlerRegistry:
    """The registered handlers, by type (``casmon.handlers``): ``add``, lookup, iteration, a readable repr."""

    def add(self, typ: type, handler: Handler) -> None:
        register_handler(typ, handler)

    def remove(self, typ: type) -> None:
        unregister_handler(typ)

    def __getitem__(self, typ: type) -> Handler:
        return _registered()[typ]

    def __contains__(self, typ: object) -> bool:
        return typ in _registered()

    def __iter__(self) -> Iterator[type]:
        return iter(dict(_registered()))

    def __len__(self) -> int:
        return len(_registered())

    def __call__(self) -> dict[type, Handler]:
        return dict(_registered())

    def __repr__(self) -> str:
        lines = [f"    {t.__module__}.{t.__qualname__}: {h.name} ({type(h).__qualname__})" for t, h in _registered().items()]
        return "HandlerRegistry{\n" + "\n".join(lines) + "\n}"


#: The registry; calling it returns a dict of the handlers by type.
handlers = HandlerRegistry()


def handler_named(name: str) -> Handler:
    try:
        return _handlers_by_name[name]
    except KeyError:
        raise LookupError(f"no handler named {name!r} is registered; register it before loading this value") from None


_ARRAYS = ArrayHandler()
_handlers_by_name[_ARRAYS.name] = _ARRAYS  # loads the array form; registered by type by _see_numpy
_VIEWS = MemoryviewHandler()
_handlers[memoryview] = _handlers_by_name[_VIEWS.name] = _VIEWS
#: casmon's own handlers: a failure to decode with one is damage (a user's handler's error is the user's).
_OWN = (ArrayHandler, MemoryviewHandler)


#: Where casmon's own classes lived before its modules became packages: a value stored then
#: names them by these paths, and still loads.
MOVED_MODULES = {
    "casmon.digest": "casmon.keys.digest", "casmon.fingerprint": "casmon.keys.fingerprint",
    "casmon.codeversion": "casmon.keys.codeversion", "casmon.cache": "casmon.caching.memoize",
    "casmon.calllog": "casmon.calllog", "casmon.runs": "casmon.runs",  # packages now: they export the classes their modules hold
    "casmon.display": "casmon.view.display", "casmon.importer": "casmon.compat.importer",
    "casmon.store": "casmon.store.store", "casmon.peek": "casmon.store.peek",
    "casmon.serialize": "casmon.store.serialize", "casmon.gc": "casmon.maintenance",
    "casmon.maintenance": "casmon.maintenance", "casmon.table": "casmon.store.table.table",
    "casmon.objects": "casmon.store.objects", "casmon.codec": "casmon.store.codec",
    "casmon.arrayview": "casmon.store.arrayview", "casmon.gitstate": "casmon.runs.gitstate",
    "casmon.capture": "casmon.runs.capture",
}
#: Classes that left their module's new home too.
MOVED_CLASSES = {("casmon.table", "StoreDamageWarning"): "casmon.errors"}


#: The longest pickle read by :mod:`casmon.store.plainpickle` (Python: ~60 ns a byte, 4-14x the C unpickler)
#: rather than by loading the C unpickler (~0.6 ms); once loaded, the C unpickler reads every pickle.
PLAIN_MAX = 4096


def _plain_first(n: int) -> bool:
    return n <= PLAIN_MAX and "_pickle" not in _modules


_unpicklers: Any = None


def decode(enc: Encoded, buffers: list[np.ndarray[Any, np.dtype[np.uint8]]],
           load_child: Callable[[int], Any] | None = None, trusted: bool = True, key: str = "value") -> Any:
    """Rebuild a value from its manifest and freshly read buffers.

    With ``trusted=False`` a pickle loads only if it names no global (no code can run).
    A malformed value raises :class:`DamagedObjectError` naming ``key``; a
    value saved by a handler not registered here raises :class:`StoreFormatError`.
    """
    tag = enc.tag
    h: Handler | None = None
    if tag == "handler":
        name = enc.meta.get("handler") if isinstance(enc.meta, dict) else None
        h = _handlers_by_name.get(name) if isinstance(name, str) else None
        if h is None and isinstance(name, str):
            from casmon.store import libraries

            libraries.ensure_named(name)
            h = _handlers_by_name.get(name)
        if h is None:
            raise StoreFormatError(f"{key} was saved by handler {name!r}, which is not registered in this process; "
                                   "register it (casmon.register_handler) before loading this value")
        if not trusted and h.name != ArrayHandler.name and getattr(h, "safe", False) is not True:
            raise UntrustedStoreError(f"{key} is loaded by handler {name!r}, which runs code on data from the store; "
                                      "the store was opened with trust=False")
    try:
        if tag == "json":
            from casmon.store import metafile  # a JSON value's first load only

            return metafile.load(enc.inline, key, limit=metafile.DATA_MAX, depth=None, numbers=False)
        if tag == "array":
            return _handlers_by_name[ArrayHandler.name].decode(enc.meta, buffers)
        if tag == "bytes":
            data = buffers[0]
            return bytearray(data) if enc.meta.get("type") == "bytearray" else data.tobytes()
        if tag == "handler" and h is not None:
            return h.decode(enc.meta["meta"], buffers)
        if tag == "pickle":
            if not enc.children and not buffers and _plain_first(len(enc.inline)):  # no code can run there
                value = plainpickle.loads(enc.inline)
                if value is not plainpickle.NOT_PLAIN:
                    return value
            global _unpicklers
            if _unpicklers is None:  # bound once: a hit of a plain value never loads the pickler
                from casmon.store import unpicklers as _unpicklers
            unpicklers = _unpicklers
            if not trusted:
                return unpicklers.SafeUnpickler(io.BytesIO(enc.inline), buffers=buffers).load()
            return unpicklers.ChildUnpickler(io.BytesIO(enc.inline), buffers, load_child if enc.children else None).load()
    except (UntrustedStoreError, DamagedObjectError, StoreFormatError):
        raise
    except Exception as e:
        from casmon.store import unpicklers  # the error path's: it names pickle's own error

        if not isinstance(e, unpicklers.DECODE_ERRORS):
            raise
        # A user's handler's error is passed on; casmon's own handlers (numpy's, the libraries') failing on a
        # crafted manifest is damage like any other.
        own = isinstance(h, _OWN) or type(h).__module__.startswith("casmon.store.libraries.")
        if (tag == "handler" and not own) or (tag == "pickle" and trusted and not isinstance(e, (unpicklers.UnpicklingError, EOFError))):
            raise  # the user's own code (a handler, a class's __setstate__) failed: its error, not ours
        raise DamagedObjectError(key, f"cannot decode its {tag} form: {type(e).__name__}: {str(e)[:200]}") from None
    raise DamagedObjectError(key, f"unknown value form {tag!r}")


# ---------------------------------------------------------------------------
# Checking a manifest read from a store, before anything is allocated
# ---------------------------------------------------------------------------

#: The largest chunk a manifest may name (``Store(chunk_size=...)`` above this is refused).
MAX_CHUNK = 1 << 30
#: The most dimensions an array may have (numpy's own limit is 64).
MAX_NDIM = 64


# Pickles and keys name it where it was before the packages (casmon/keys/names.py).
keep_flat_names([Handler])
