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
* Floats (and numpy float and complex scalars) are hashed by their bits, except that every NaN is one value:
  ``-0.0`` and ``0.0`` differ (functions such as ``copysign`` tell them apart). An array's bytes are hashed
  unread, so its NaNs' bits count.
* memoryviews by format, shape, strides, read-only flag and bytes (a read-only
  flat byte view by its bytes alone).
* numpy arrays by dtype (with metadata, alignment, ``np.record``: see
  :mod:`casmon.keys.dtypes`), shape and values in C order (a structured
  dtype's padding bytes do not count). A C-contiguous buffer is
  hashed in place without a copy; Fortran-ordered arrays and strided views give
  the same fingerprint as their C-ordered copy, and are hashed block by block.
* Other objects are hashed as pickle protocol 5 sees them (``__reduce_ex__``):
  the reconstructing callable and classes by their qualified name, arguments
  and state by the rules above, so arrays inside objects are hashed in place and
  instances of local classes work too. Functions count by qualified name;
  lambdas and local functions have none and cannot be fingerprinted.
* ``register_hasher(type, fn)``: ``fn(value)`` returns any value that is then
  fingerprinted in its place (tagged with the type's name). The ML libraries
  (torch, jax, scipy.sparse, pyarrow, polars, xarray, PIL, HF datasets) have
  hashers of their own in :mod:`casmon.keys.libraries`, loaded the first time a
  value of the library's is keyed (casmon never imports a library itself).
* An object pickled by object's own rules counts its attributes (``__dict__`` and
  slots) by name, not by the order they were set in; a state a class's
  ``__getstate__`` or ``__reduce__`` builds keeps its order.
* The first time a type reaches the pickle-level rule in a process, a small value of
  it is fingerprinted again, and its copy through pickle too: if they differ, one
  :class:`casmon.errors.UnstableKeyWarning` names the type (its keys would never hit).
"""

from __future__ import annotations

import copyreg
import sys
import _thread  # threading's locks, without loading threading on a hit
import types
from operator import index as _index
import warnings
from collections.abc import Callable
TYPE_CHECKING = False  # typing's flag without importing typing (~2 ms of a first hit)
if TYPE_CHECKING:
    from typing import Any, ClassVar


if TYPE_CHECKING:
    import pickle

    import numpy as np

    from casmon.keys.segments import SegmentedRun
else:
    np = None  # numpy once it is imported (see _numpy_arrived): a program that never imports it never pays for it

from casmon.keys.digest import Digest, xxhash
from casmon.keys.names import canonical_module, casmon_key_module, key_class_module, qualified_name, type_name  # noqa: F401 - re-exported
from casmon import errors  # its rarer classes are made on first use: a key that fails or warns names them

__all__ = ["fingerprint", "encoded_name", "register_hasher", "unregister_hasher", "register_library_hasher", "Fingerprinter", "Concat",
           "canonical_module", "qualified_name", "small_array_digest"]

_NAN = float("nan")  # math.nan, without loading math
_BIG_ENDIAN = sys.byteorder == "big"


# int.to_bytes and a memoryview's cast rather than struct: a first hit then loads no _struct (~0.3 ms). Lengths
# and shapes may be any integer type a Struct would take (operator.index), as they always could.
def _pack_q(v: Any) -> bytes:
    return int.to_bytes(_index(v), 8, "little", signed=True)


def _pack_Q(n: Any) -> bytes:
    return int.to_bytes(_index(n), 8, "little")


def _pack_d(v: float) -> bytes:
    m = memoryview(bytearray(8)).cast("d")  # one per call: fingerprints run on several threads
    m[0] = v
    b = m.tobytes()
    return b[::-1] if _BIG_ENDIAN else b


def _pack_dd(a: float, b: float) -> bytes:
    return _pack_d(a) + _pack_d(b)

#: Arrays larger than this are hashed straight from their buffer.
_INLINE_LIMIT = 1 << 16
#: Block size when an array must be copied into C order to be hashed.
_BLOCK_BYTES = 8 << 20

_hashers: dict[type, Callable[[Any], Any]] = {}
_hashers_lock = _thread.allocate_lock()
_sys_modules = sys.modules


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


def register_library_hasher(typ: type, fn: Callable[[Any], Any]) -> None:
    """casmon's own hasher for a library's type (``casmon.keys.libraries``): one the user registered wins."""
    with _hashers_lock:
        if typ not in _hashers:
            _hashers[typ] = fn
        _Fingerprinter._user_cache.clear()


class Concat:
    """Bytes given in pieces, hashed as their concatenation: a hasher's way to make a value's
    key independent of how its buffers are cut (an Arrow column's chunks)."""

    __slots__ = ("pieces",)

    def __init__(self, pieces: list[Any]) -> None:
        import numpy

        _numpy_arrived()
        self.pieces = [p if isinstance(p, numpy.ndarray) else numpy.frombuffer(p, numpy.uint8) for p in pieces]


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
    #: Whether a type new to this process is checked for a stable key (a pickle round trip: see _self_check).
    #: Off where a digest only links values (lineage), so keying a result never rebuilds one from its pickle.
    checks_types: ClassVar[bool] = True

    __slots__ = ("h", "out", "stack", "fed", "run")

    def __init__(self) -> None:
        self.h = xxhash.xxh3_128()
        self.out = bytearray()
        self.stack: dict[int, int] = {}  # id of containers being walked -> depth
        self.fed = 0  # bytes passed to the hasher so far (plus len(out): the encoding's length)
        self.run: SegmentedRun | None = None  # a large run's segments being hashed (casmon.keys.segments)

    def child(self) -> "_Fingerprinter":
        """A fingerprinter of the same kind sharing this one's walk (for order-free parts)."""
        c = type(self)()
        c.stack = self.stack
        return c

    def digest(self) -> Digest:
        if self.out:
            self.fed += len(self.out)
            self.h.update(self.out)
            self.out.clear()
        return Digest.from_raw(self.h.digest())

    def begin_run(self, total: int) -> None:
        """The next ``total`` bytes given to :meth:`buffer` are one run: from :data:`RUN_MIN` bytes on, it is
        hashed in segments on every core, and its segments' digests stand for it (see ``casmon.keys.segments``)."""
        seg = _segments or _segments_module()  # large and strided values' only: a hit of small ones loads none
        if total >= seg.RUN_MIN:
            self.run = seg.SegmentedRun(total)

    def end_run(self) -> None:
        run = self.run
        if run is not None:
            self.run = None
            self.out += run.end()

    def buffer(self, mv: Any) -> None:
        """Hash a large contiguous buffer without copying it."""
        run = self.run
        if run is not None:
            self.fed += memoryview(mv).nbytes
            run.feed(mv)
            return
        if self.out:
            self.fed += len(self.out)
            self.h.update(self.out)
            self.out.clear()
        self.fed += memoryview(mv).nbytes
        self.h.update(mv)

    def feed_value(self, value: Any, root: str = "value") -> None:
        """Feed ``value``; on failure raise :class:`UnpicklableError` naming the part (``root[1]['f']``)."""
        try:
            self.feed(value)
        except _PathError as e:
            path = root + "".join(reversed(e.parts))
            if isinstance(e.cause, errors.NotKeyable):
                raise errors.NotKeyableError(path, e.obj, e.cause.reason) from None
            raise errors.UnpicklableError(path, e.obj, e.cause) from None

    # -- dispatch ------------------------------------------------------------
    def feed(self, v: Any) -> None:
        t = type(v)
        f = _DISPATCH.get(t)
        if f is not None:
            f(self, v)
            return
        if _picklebuffer_t is None and _pickle_arrived():
            self.feed(v)  # a PickleBuffer, now in the table
            return
        user = self._user_hasher(t)
        if user is not None:
            self.out += b"H" + _len_prefixed(type_name(t))
            try:
                stand_in = user(v)
            except _PathError:
                raise
            except Exception as e:  # noqa: BLE001 - a hasher's failure names the value it was given
                raise _PathError([], v, e) from e
            self.feed(stand_in)
            return
        if np is None and _numpy_arrived():
            self.feed(v)
        elif np is not None and isinstance(v, np.ndarray):
            self.ndarray(v)
        elif np is not None and isinstance(v, np.generic):
            self.npscalar(v)
        elif "pandas" in _sys_modules and _pandas_kind(v) is not None:
            self.pandas(v)
        elif isinstance(v, type):
            self.type_(v)
        elif isinstance(v, types.FunctionType):
            self.function(v)
        elif isinstance(v, types.MethodType):
            # A bound method is its object and its function: [1].append and [2].append differ.
            self.out += b"M"
            owner = v.__self__
            self.feed(owner)
            name = getattr(v.__func__, "__name__", None)
            cls = owner if isinstance(owner, type) else type(owner)
            found = getattr(cls, name, None) if isinstance(name, str) else None
            if getattr(found, "__func__", found) is v.__func__:
                self.out += b"n"  # the owner's class names it (also for classes without an importable name)
                self.str_(name)
            else:
                self.function(v.__func__)
        elif isinstance(v, types.BuiltinFunctionType):
            owner = v.__self__
            if owner is None or isinstance(owner, types.ModuleType):
                self.function(v)  # a module-level builtin such as len, by name
            else:
                # A bound builtin method ({}.get, np.zeros(3).sum, deque().extend): its object counts.
                self.out += b"m"
                try:
                    self.feed(owner)
                except _PathError as e:
                    e.parts.append(f".{v.__name__}.__self__")
                    raise
                self.str_(v.__name__)
        else:
            self.reduced(v)

    def _user_hasher(self, t: type) -> Callable[[Any], Any] | None:
        cache = self._user_cache
        try:
            return cache[t]
        except KeyError:
            pass
        fn = None
        mod = t.__module__  # a builtin or casmon's own type is no library's: its key loads no library table
        if mod != "builtins" and not (type(mod) is str and mod.startswith("casmon.")) and (
                _libraries or _libraries_module()).ensure(t):
            cache = self._user_cache  # loading a library's hashers cleared the cache
        if _hashers:
            for base in t.__mro__:
                if base in _hashers:
                    fn = _hashers[base]
                    break
        cache[t] = fn
        return fn

    # -- scalars -------------------------------------------------------------
    def none(self, v: Any) -> None:
        self.out += b"N"

    def bool_(self, v: Any) -> None:
        self.out += b"T" if v else b"F"

    def int_(self, v: Any) -> None:
        if -(1 << 63) <= v < (1 << 63):
            self.out += b"q" + v.to_bytes(8, "little", signed=True)
        else:
            n = (v.bit_length() + 8) // 8
            self.out += b"I" + n.to_bytes(8, "little") + v.to_bytes(n, "little", signed=True)

    def float_(self, v: Any) -> None:
        self.out += b"fN" if v != v else b"f" + _pack_d(v)

    def complex_(self, v: Any) -> None:
        re, im = v.real, v.imag
        self.out += b"c" + _pack_dd(_NAN if re != re else re, _NAN if im != im else im)

    def str_(self, v: Any) -> None:
        b = v.encode("utf-8", "surrogatepass")
        self.out += b"s" + len(b).to_bytes(8, "little") + b

    def bytes_(self, v: Any) -> None:
        self._blob(b"b", v)

    def bytearray_(self, v: Any) -> None:
        self._blob(b"y", v)

    def memoryview_(self, v: Any) -> None:
        data = v.tobytes() if not v.c_contiguous else v.cast("B") if v.ndim else v.tobytes()
        if not (v.readonly and v.format == "B" and v.ndim == 1 and v.c_contiguous):
            # Besides its bytes a function sees a view's format, shape, layout and whether it is read-only:
            # memoryview(raw) and memoryview(raw).cast("i") differ. A read-only flat byte view keeps its old key.
            # Strides count where they make the view non-contiguous (a C-contiguous view's are its shape's, but
            # for dimensions of one item, which nothing reads).
            self.out += b"v"
            self.str_(v.format)
            self.out += b"T" if v.readonly else b"F"
            for dims in (v.shape, () if v.c_contiguous else v.strides, v.suboffsets):
                self.out += len(dims).to_bytes(8, "little") + b"".join(_pack_q(n) for n in dims)
        self._blob(b"m", data)

    def _blob(self, tag: bytes, v: Any) -> None:
        n = len(v) if not isinstance(v, memoryview) else v.nbytes
        self.out += tag + n.to_bytes(8, "little")
        if n > _INLINE_LIMIT:
            self.begin_run(n)
            self.buffer(v)
            self.end_run()
        else:
            self.out += v

    # -- containers ----------------------------------------------------------
    def _enter(self, v: Any) -> bool:
        """Register a container on the walk; emit a back-reference if it is a cycle."""
        i = id(v)
        depth = self.stack.get(i)
        if depth is not None:
            self.out += b"R" + (len(self.stack) - depth).to_bytes(8, "little")
            return False
        self.stack[i] = len(self.stack)
        return True

    def sequence(self, v: Any, tag: bytes) -> None:
        if not self._enter(v):
            return
        self.out += tag + len(v).to_bytes(8, "little")
        feed = self.feed
        for i, item in enumerate(v):
            try:
                feed(item)
            except _PathError as e:
                e.parts.append(f"[{i}]")
                raise
        del self.stack[id(v)]

    def tuple_(self, v: Any) -> None:
        self.sequence(v, b"(")

    def list_(self, v: Any) -> None:
        self.sequence(v, b"[")

    def dict_(self, v: Any) -> None:
        if not self._enter(v):
            return
        self.out += b"{" + len(v).to_bytes(8, "little")
        feed = self.feed
        for k, item in v.items():
            try:
                feed(k)
                feed(item)
            except _PathError as e:
                e.parts.append(f"[{k!r}]")
                raise
        del self.stack[id(v)]

    def set_(self, v: Any, tag: bytes = b"S") -> None:
        if not self._enter(v):
            return
        parts = []
        for item in v:
            sub = self.child()
            try:
                sub.feed(item)
            except _PathError as e:
                e.parts.append("{…}")
                raise
            parts.append(sub.digest())
        parts.sort()
        self.out += tag + len(parts).to_bytes(8, "little") + b"".join(parts)
        del self.stack[id(v)]

    def frozenset_(self, v: Any) -> None:
        self.set_(v, b"Z")

    # -- numpy and pandas: casmon.keys.arrays, loaded by the first such value keyed ----------------------------
    def npscalar(self, v: np.generic) -> None:
        (_arrays or _arrays_module()).npscalar(self, v)

    def ndarray(self, a: np.ndarray) -> None:
        (_arrays or _arrays_module()).ndarray(self, a)

    def ndarray_subclass(self, a: np.ndarray) -> None:
        (_arrays or _arrays_module()).ndarray_subclass(self, a)

    def pandas(self, v: Any) -> None:
        (_arrays or _arrays_module()).pandas(self, v)

    # -- everything else -------------------------------------------------------
    def type_(self, t: type) -> None:
        self.out += b"t" + _len_prefixed(_global_name(t))

    def function(self, f: Any) -> None:
        name = getattr(f, "__qualname__", "") or getattr(f, "__name__", "")
        if "<lambda>" in name or "<locals>" in name:
            # No stable name: two different lambdas would look the same. Refuse (never a wrong hit).
            raise _PathError([], f, TypeError(f"{name} has no importable name to identify it by"))
        self.out += b"g" + _len_prefixed(_global_name(f))

    def reduced(self, v: Any) -> None:
        """Hash an object the way pickle sees it (``__reduce_ex__(5)``), names by name."""
        if not self._enter(v):
            return
        try:
            reducer = copyreg.dispatch_table.get(type(v))  # as pickle does, e.g. numpy ufuncs
            rv = reducer(v) if reducer is not None else v.__reduce_ex__(5)
        except Exception as e:  # noqa: BLE001 - e.g. "cannot pickle '_thread.lock' object"
            raise _PathError([], v, e) from e
        if isinstance(rv, str):  # a global, pickled by name
            mod = canonical_module(getattr(v, "__module__", None))
            self.out += b"G" + _len_prefixed(f"{mod}.{rv}".encode())
            del self.stack[id(v)]
            return
        if not isinstance(rv, tuple) or len(rv) < 2:
            raise _PathError([], v, TypeError(f"__reduce_ex__ returned {type(rv).__name__}"))
        func, args, state, listitems, dictitems = (tuple(rv) + (None, None, None))[:5]
        self.out += b"O"
        checking = self.checks_types and type(v) not in _checked_types and _self_check_on
        start = self.fed + len(self.out)
        try:
            self.feed(func)
            self.feed(args)
            self.feed(_by_name(state) if _default_reduction(type(v), reducer) else state)
            self.feed(None if listitems is None else list(listitems))
            self.feed(None if dictitems is None else list(dictitems))
        except _PathError as e:
            e.parts.append(f"<{type(v).__qualname__}>")
            raise
        del self.stack[id(v)]
        if checking:
            _checked_types.add(type(v))
            if self.fed + len(self.out) - start <= SELF_CHECK_MAX:
                _self_check(v)

    def picklebuffer(self, pb: pickle.PickleBuffer) -> None:
        raw = pb.raw()
        self.out += b"o" + raw.nbytes.to_bytes(8, "little")
        self.begin_run(raw.nbytes)
        self.buffer(raw)
        self.end_run()

    def concat(self, c: Concat) -> None:
        (_arrays or _arrays_module()).concat(self, c)

def _global_name(obj: Any) -> bytes:
    return qualified_name(obj).encode()


def _len_prefixed(b: bytes) -> bytes:
    return len(b).to_bytes(8, "little") + b


def encoded_name(name: str) -> bytes:
    """A parameter's name as a key's encoding holds it, before its value (a span starts with it)."""
    fp = Fingerprinter()
    fp.str_(name)
    return bytes(fp.out)


def small_array_digest(a: Any, hexed: bool = False) -> Any:
    """The raw 16-byte digest :class:`Fingerprinter` gives ``a`` alone (``hexed``: its hex), for a small
    plain numpy array with a plain dtype, in one xxh3 call without a walk (a miss's result
    fingerprint); None for any other value."""
    if type(a) is not _ndarray_t:
        if np is not None or not _numpy_arrived() or type(a) is not _ndarray_t:
            return None
    return (_arrays or _arrays_module()).small_array_digest(a, hexed)

#: numpy's ndarray once numpy is imported (a class no value has until then)
_ndarray_t: Any = type("_NoArray", (), {})


_arrays: Any = None


def _arrays_module() -> Any:
    """casmon.keys.arrays, bound by the first numpy or pandas value keyed; numpy's arrays then go to it straight."""
    global _arrays
    from casmon.keys import arrays

    _arrays = arrays
    if np is not None:
        _DISPATCH[np.ndarray] = arrays.ndarray
    return arrays


#: casmon.keys.segments once a large or strided array is keyed, for the same reason.
_libraries: Any = None


def _libraries_module() -> Any:
    """casmon.keys.libraries, bound by the first type no hasher here knows (a key of plain values loads none)."""
    global _libraries
    from casmon.keys import libraries

    _libraries = libraries
    return libraries


_segments: Any = None


def _segments_module() -> Any:
    global _segments
    from casmon.keys import segments

    _segments = segments
    return segments


def _pandas_kind(v: Any) -> str | None:
    pd = _sys_modules.get("pandas")  # a pandas object exists only once pandas is imported
    if pd is None:
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
    Concat: _Fingerprinter.concat,
}



#: pickle's PickleBuffer once pickle is loaded (none can exist before): a key of plain values loads no pickle.
_picklebuffer_t: Any = None


def _pickle_arrived() -> bool:
    """True the first time pickle's C module is found loaded: its PickleBuffer joins the dispatch table."""
    global _picklebuffer_t
    pb = getattr(_sys_modules.get("_pickle") or _sys_modules.get("pickle"), "PickleBuffer", None)
    if pb is None or _picklebuffer_t is not None:
        return False
    _DISPATCH[pb] = _Fingerprinter.picklebuffer
    _picklebuffer_t = pb
    return True


def _numpy_arrived() -> bool:
    """True the first time numpy is found imported: arrays join the dispatch table. Until then no value can be
    a numpy value, so fingerprints need not import it."""
    global np, _ndarray_t
    if np is not None or _sys_modules.get("numpy") is None:  # None: an import of numpy is blocked
        return False
    import numpy

    nd = getattr(numpy, "ndarray", None)  # None within numpy's own import, in the thread importing it
    if nd is None:
        return False
    _DISPATCH[nd] = _Fingerprinter.ndarray if _arrays is None else _arrays.ndarray
    _ndarray_t = nd
    np = numpy
    return True


#: Values whose pickle-level encoding is at most this long are checked for a stable key (see _self_check).
SELF_CHECK_MAX = 1 << 16
_self_check_on = True
# Digest (in every cache key's prefix) keys as its 16 bytes, the same through pickle: checking it would load
# pickle on every process's first cached call.
_checked_types: set[type] = {Digest}
_warned_types: set[type] = set()


_default_getstate = object.__getstate__


def _default_reduction(t: type, reducer: Any) -> bool:
    """True if pickle reduces ``t`` by object's own rules: its state is then its ``__dict__`` (and slots)."""
    return (reducer is None and getattr(t, "__getstate__", None) is _default_getstate
            and getattr(t, "__reduce_ex__", None) is object.__reduce_ex__ and getattr(t, "__reduce__", None) is object.__reduce__)


def _by_name(state: Any) -> Any:
    """The default pickled state (``__dict__``, or ``(__dict__, slots)``) with attributes by name: ``__dict__``
    order is only the order they were set in. Called only for classes pickled by object's own rules; a
    state a class builds itself keeps its order, which may mean something (oldest first)."""
    if type(state) is dict:
        keys = list(state)
        if all(type(k) is str for k in keys) and keys != sorted(keys):
            return {k: state[k] for k in sorted(keys)}
        return state
    if type(state) is tuple and len(state) == 2 and type(state[1]) is dict:  # (__dict__ or None, slots)
        return (_by_name(state[0]), _by_name(state[1]))
    return state


def _self_check(v: Any) -> None:
    """A type new to this process: its value, keyed again and after a pickle round trip (the value as
    another process would rebuild it), must key the same.

    Catches a pickle that names a pointer or a fresh object (torch storages and generators did),
    which makes every key of the type a miss. Warns once per type; never raises.
    """
    global _self_check_on
    from casmon.keys.cpickle import pickle  # once per type: a key of plain values loads none

    _self_check_on = False  # the copies' own parts are not checked again
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            first, again = fingerprint(v), fingerprint(v)
            twin = pickle.loads(pickle.dumps(v, protocol=5)) if first == again else None
            same = first == again and (twin is None or fingerprint(twin) == first)
    except Exception:  # noqa: BLE001 - a value that cannot be copied or keyed again: nothing to report
        return
    finally:
        _self_check_on = True
    t = type(v)
    if not same and t not in _warned_types:
        _warned_types.add(t)
        name = f"{canonical_module(t.__module__)}.{t.__qualname__}"
        how = "twice in a row" if first != again else "from their copies through pickle"
        warnings.warn(f"casmon: values of {name} key differently {how}: calls taking one would never be cache "
                      f"hits. Give the type a hasher with casmon.register_hasher({t.__qualname__}, fn), fn returning "
                      "the fields that matter", errors.UnstableKeyWarning, stacklevel=2)


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
