"""The warm hit path: a call this process answered before, answered again with the least work that stays correct.

A call whose arguments are all small values of exact immutable types (``int``,
``float``, ``str``, ``bytes``, ``bool``, ``None``) is looked up by those values
themselves, each paired with its type, before any fingerprint is computed: two
such calls have equal fingerprints exactly when their ``(type, value)`` pairs
are equal (floats by their bits, so ``0.0`` and ``-0.0`` differ and every NaN is
one value, as fingerprints count them). The entry holds the call's key, its
result's digest and the result, and is used only while

* the code version is the one it was learnt under (the version tracker's
  identity checks, as every hit makes them), and
* the function still uses the open store the hit was read from, and
* the function's in-memory entry for the key still names that result: a
  ``cache clear`` (seen here or, within a second, elsewhere), ``refresh`` or
  eviction from memory drops it, and the call takes the full path.

A hit then costs the call-key tuple, two dictionary lookups and one copy of the
result (none for an immutable one). Functions with hashers, ``files=``,
``expires_after``, a bound object, or a default value that is not such an
immutable value never use it: their keys can change while the arguments stay
equal.
"""

from __future__ import annotations

import _thread  # threading's locks, without loading threading on a hit
from _weakref import ref as weak_ref  # weakref's own, without loading weakref.py on a hit
TYPE_CHECKING = False  # typing's flag without importing typing (~2 ms of a first hit)
if TYPE_CHECKING:
    from typing import Any


if TYPE_CHECKING:
    from casmon.caching.memoize import CacheState
    from casmon.keys.digest import Digest

__all__ = ["HotCalls", "eligible", "served", "SERVED", "SERVED_MAX", "NO_WEAKREF", "edges_module"]

_SCALARS = frozenset({int, str, bytes, bool, type(None)})
_SCALAR_IDS = frozenset(id(t) for t in _SCALARS)  # by identity: a user type's hash or == may raise
#: Strings and bytes up to this long count as small (a longer one is hashed the usual way).
SMALL_TEXT = 256
#: A result whose pickle is at most this long is kept here; a larger one is read from the store at each hit.
SMALL_RESULT = 64 << 10
#: Calls remembered per function at most (the oldest is forgotten first), and bytes of pickled results.
MAX_CALLS = 4096
MAX_BYTES = 8 << 20
#: The forms of stored values a pickle copies as faithfully as the store's own decoding does.
_COPIED = frozenset({"pickle", "json", "array"})


def _small(v: Any) -> bool:
    t = type(v)
    if id(t) in _SCALAR_IDS:
        return t is not str and t is not bytes or len(v) <= SMALL_TEXT
    return t is float


# -- a hit's result, kept for lineage -----------------------------------------------------------------------
# A hit's result, registered lazily: (weak reference, key, store url), turned into casmon.caching.edges' rows (with
# the numpy bases walked) by the next call that reads the rows -- a miss. A warm hit pays for one weak reference and
# an append, and a hit of a value that takes a weak reference loads no lineage code.
SERVED: list[tuple[Any, bytes, Any]] = []
SERVED_MAX = 1024
#: Types whose instances take no weak reference (a list, a dict): a hit of one is walked now, by edges.
NO_WEAKREF: set[type] = set()
_NOT_LINKED = frozenset({type(None), bool, int, float, complex, str, bytes})
_edges_module: Any = None
_pickle: Any = None  # pickle, bound by the first result copied here: a hit of an immutable value loads none


def _pickle_module() -> Any:
    global _pickle
    from casmon.keys.cpickle import pickle

    _pickle = pickle
    return pickle


def edges_module() -> Any:
    """:mod:`casmon.caching.edges`, bound once by the first hit that needs it (a miss, or a list's hit)."""
    global _edges_module
    if _edges_module is None:
        from casmon.caching import edges

        _edges_module = edges
    return _edges_module


def served(value: Any, key: bytes, where: Any = None, items: bool = True) -> None:
    """What a hit does in place of :func:`casmon.caching.edges.produced`: the same, deferred to the next read of the
    rows. A value that takes no weak reference (a list, a dict) is walked now, or, with ``items=False`` (the hot
    path's small copies), not remembered: content links it."""
    t = type(value)
    if t in _NOT_LINKED:
        return
    if t not in NO_WEAKREF:
        try:
            SERVED.append((weak_ref(value), key, where))
        except TypeError:
            NO_WEAKREF.add(t)
        else:
            if len(SERVED) > SERVED_MAX:
                edges_module().drain()
            return
    if items:
        edges_module().produced(value, key, where)


def eligible(state: CacheState, no_self: object, empty: object) -> bool:
    """Whether equal small arguments always give ``state``'s function the same key (given its code version)."""
    if state.hashers or state.files or state.expires is not None or state._custom_key or state._bound is not no_self:
        return False
    return all(p.default is empty or _small(p.default) for p in state.params)


def hashable(what: Any) -> Any:
    """``what`` (a warning's once-only key), or where it names a type that cannot be hashed (its metaclass sets
    ``__hash__ = None``) the ids of what it names."""
    try:
        hash(what)
        return what
    except TypeError:
        return tuple(x if isinstance(x, (str, int)) else id(x) for x in what) if isinstance(what, tuple) else id(what)


def call_key(args: tuple, kwargs: dict) -> tuple | None:
    """``args`` and ``kwargs`` as ``(type, value)`` pairs, or None if one is not a small immutable value."""
    out: list[Any] = []
    for v in args:
        t = type(v)
        if t is float:
            out.append(v.hex())
        elif id(t) in _SCALAR_IDS and (t is not str and t is not bytes or len(v) <= SMALL_TEXT):
            out.append(t)
            out.append(v)
        else:
            return None
    if kwargs:
        out.append(None)  # where positional arguments end
        for k, v in kwargs.items():
            t = type(v)
            if t is float:
                out.append(k)
                out.append(v.hex())
            elif id(t) in _SCALAR_IDS and (t is not str and t is not bytes or len(v) <= SMALL_TEXT):
                out.append(k)
                out.append(t)
                out.append(v)
            else:
                return None
    return tuple(out)


def _immutable(v: Any, depth: int = 0) -> bool:
    t = type(v)
    if id(t) in _SCALAR_IDS or t is float or t is complex:
        return True
    if t is tuple or t is frozenset:
        return depth < 8 and len(v) <= 64 and all(_immutable(x, depth + 1) for x in v)
    return False


class HotCalls:
    """One function's remembered calls: call key -> (key, result digest, prefix, store, result or its pickle).

    At most as many calls as the function remembers entries (``memory_entries``, and :data:`MAX_CALLS`), and
    :data:`MAX_BYTES` of pickled results; a clear or a new code version empties it.
    """

    __slots__ = ("calls", "nbytes", "lock")

    def __init__(self) -> None:
        self.calls: dict[tuple, tuple[Digest, bytes, bytes, Any, bool, Any]] = {}
        self.nbytes = 0  # of the pickled results kept
        self.lock = _thread.allocate_lock()  # for learning and forgetting; answers read without it

    def clear(self) -> None:
        with self.lock:
            self.calls = {}
            self.nbytes = 0

    def _drop(self, ck: tuple) -> None:
        with self.lock:
            e = self.calls.pop(ck, None)
            if e is not None and not e[4]:
                self.nbytes -= len(e[5])

    def answer(self, state: CacheState, ck: tuple) -> tuple[Digest, bytes, Any] | None:
        """``(key, result digest, a fresh copy of the result)`` of the call ``ck``, or None: not remembered."""
        e = self.calls.get(ck)
        if e is None:
            return None
        key, d, prefix, store, same, value = e
        s = state._store
        if state.key_prefix() is not prefix or s is not store or s.closed or state._mem.get(key) != d:
            self._drop(ck)
            return None
        if same:
            return key, d, value
        try:
            value = (_pickle or _pickle_module()).loads(value)
        except Exception:  # noqa: BLE001 - a class that cannot be rebuilt now: the full path warns and computes
            self._drop(ck)
            return None
        served(value, bytes(key), s.url, items=False)  # a later call taking it links to this entry
        return key, d, value

    def learn(self, state: CacheState, ck: tuple, key: Digest, d: Digest, value: Any, prefix: bytes) -> None:
        """Remember the hit of call ``ck``: its ``key`` (computed under ``prefix``), the result ``d`` it read, and
        the value loaded from it."""
        store = state._store
        if store is None:
            return
        try:
            m = store.manifest(d)  # in memory: it was just read for this hit
        except Exception:  # noqa: BLE001 - nothing is remembered; the hit stands
            return
        if m.nbytes > SMALL_RESULT or m.tag not in _COPIED:
            return  # large, or rebuilt by a handler: read from the store at each hit, as always
        same = _immutable(value)
        if not same and m.tag == "pickle" and not m.parts and not m.children:
            value = m.inline  # the stored pickle, which the hit just read: a copy without loading the pickler
        elif not same:
            try:
                value = (_pickle or _pickle_module()).dumps(value, protocol=5)
            except Exception:  # noqa: BLE001 - a value pickle cannot copy is read from the store at each hit
                return
            if len(value) > SMALL_RESULT:
                return
        most = min(MAX_CALLS, state._mem_max)
        with self.lock:
            calls = self.calls
            old = calls.pop(ck, None)
            if old is not None and not old[4]:
                self.nbytes -= len(old[5])
            while calls and (len(calls) >= most or self.nbytes + (0 if same else len(value)) > MAX_BYTES):
                first = next(iter(calls))
                gone = calls.pop(first)
                if not gone[4]:
                    self.nbytes -= len(gone[5])
            if len(calls) < most:
                calls[ck] = (key, bytes(d), prefix, store, same, value)
                if not same:
                    self.nbytes += len(value)
