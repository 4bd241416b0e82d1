"""Lineage edges, recorded as calls happen: which stored results a call's arguments came from.

Two ways, both without annotation (``casmon.lineage`` reads them):

* **by content**: each entry records its result's fingerprint (``rf``, the key encoding's digest of the value,
  as a parameter of a later call would be keyed) and each parameter's content digest (``pc``: the 128-bit digest
  of its part of the key's encoding, which explain's ``a`` records too, so a miss hashes it once). A parameter
  whose digest equals a stored result's fingerprint is an edge from that entry, in any process, on any machine.
  Values whose encoding is shorter than :data:`CONTENT_MIN` bytes (``None``, flags, small numbers, short
  strings) get no fingerprint: equal by chance far too often to mean "came from".
* **by identity**, in this process: an argument that is, or holds (a tuple, list or dict, a numpy view's
  ``.base`` chain), the very object an earlier cached call returned or was served is an edge from that
  entry's key (``up``: parameter -> keys). Where a parameter has such an edge, its content digests are not
  used to link it (``casmon.lineage``): the object's producer is known, an equal value elsewhere is chance. Objects are held by weak reference only: one whose type takes none (a tuple, a dict)
  is not remembered itself, its items that take one are; content covers the rest.

Nothing here keeps a value alive or reads the store; a failure here never stops a call (the entry is stored
without the edge).
"""

from __future__ import annotations

import _thread  # threading's locks, without loading threading on a hit
from _weakref import ref as weak_ref  # weakref's own, without loading weakref.py on a hit
TYPE_CHECKING = False  # typing's flag without importing typing (~2 ms of a first hit)
if TYPE_CHECKING:
    from typing import Any

import xxhash

from casmon.caching.hot import NO_WEAKREF as _no_weakref, SERVED as _served, SERVED_MAX, served
from casmon.keys.codeversion import VersionedFingerprinter
from casmon.keys.fingerprint import Fingerprinter, encoded_name, small_array_digest

if TYPE_CHECKING:
    from casmon.caching.memoize import CacheState

__all__ = ["produced", "served", "upstream", "result_fingerprint", "content_digests", "annotate", "CONTENT_MIN", "forget_all",
           "encoded_name", "drain", "SERVED_MAX"]

#: A result whose key encoding is shorter gets no fingerprint (and a parameter that short links by content to
#: nothing): ``None``, ``True``, ``3`` or ``"ok"`` come from everywhere.
CONTENT_MIN = 24
#: A parameter that fed more bytes than this straight to the key's hasher gets no content digest of its own
#: (hashing it again would double the miss); identity still links it.
CONTENT_MAX = 64 << 20
#: How many objects one argument's walk looks at (containers' items, a view's bases).
WALK_MAX = 256
#: Items of a container result remembered by identity.
ITEMS_MAX = 64

_SKIP = frozenset({type(None), bool, int, float, complex, str, bytes})
_CONTAINERS = (tuple, list)
_PLAIN = frozenset({bytes, bytearray, str})
_h128 = xxhash.xxh3_128_hexdigest
_NOWHERE = object()
_OPENS = frozenset(b"([")  # a container's encoding starts so: its items get digests of their own

# id(object) -> (weak reference, key of the entry that produced it, whether the reference is to the object
# itself). A row counts only while its reference is alive (and, for the object itself, is that object), so an id
# the allocator hands out again is never taken for the old object; dead rows are swept when the rows reach
# ``_sweep_at`` (a reference without a callback costs a call less than one with). A numpy result's bases (the
# array or buffer that owns its memory, whatever its type) are held by id anchored on the result: they live at
# least as long.
_by_id: dict[int, tuple[weak_ref, bytes, bool, Any]] = {}
#: numpy's ndarray once a result of that type was seen (numpy is never imported here)
_ndarray: Any = None
SWEEP = 4096
# Rows reach this many: sweep. At least twice the live rows, so a sweep costs O(1) a row however many stay alive.
_sweep_at = [SWEEP]


# A hit's results (casmon.caching.hot.served) wait in ``_served`` until the next read of the rows drains them.
_drain_lock = _thread.allocate_lock()


def forget_all() -> None:
    """Forget every object remembered (tests; a forked child keeps its parent's, which stay true)."""
    _by_id.clear()
    _served.clear()
    _sweep_at[0] = SWEEP


def drain() -> None:
    with _drain_lock:  # in order: of two rows for one id, the later stands
        batch = _served[:]
        del _served[:len(batch)]  # hits appended meanwhile stay for the next drain
        for r, key, where in batch:
            v = r()
            if v is not None:
                produced(v, key, where)


def _sweep() -> None:
    for i, e in list(_by_id.items()):
        if e[0]() is None:
            _by_id.pop(i, None)
    _sweep_at[0] = max(SWEEP, 2 * len(_by_id))


def _known(v: Any, where: Any) -> bytes | None:
    e = _by_id.get(id(v))
    if e is None or e[3] != where:  # an entry of another store is no edge of this one's
        return None
    o = e[0]()
    return e[1] if (o is v if e[2] else o is not None) else None


def _remember(v: Any, key: bytes, where: Any) -> bool:
    t = type(v)
    if t in _SKIP or t in _no_weakref:
        return False
    i = id(v)
    e = _by_id.get(i)
    if e is not None and e[2] and e[1] == key and e[3] == where and e[0]() is v:
        return True
    try:
        r = weak_ref(v)
    except TypeError:
        _no_weakref.add(t)
        return False
    _by_id[i] = (r, key, True, where)
    if t.__module__ == "numpy":
        if t.__name__ == "ndarray":
            global _ndarray
            _ndarray = t
        b = getattr(v, "base", None)
        n = 0
        while b is not None and n < 8:
            _by_id[id(b)] = (r, key, False, where)
            n += 1
            b = getattr(b, "base", None) if type(b).__module__ == "numpy" else None
    if len(_by_id) >= _sweep_at[0]:
        _sweep()
    return True


def produced(value: Any, key: bytes, where: Any = None) -> None:
    """``value`` is what the entry ``key`` of the store at ``where`` (its url) holds: a call of that store that
    passes it on links to that entry."""
    try:
        t = type(value)
        if t is _ndarray and value.base is None:  # a fresh array that owns its memory (most results): one row
            _by_id[id(value)] = (weak_ref(value), key, True, where)
            if len(_by_id) >= _sweep_at[0]:
                _sweep()
            return
        if _remember(value, key, where):
            return
        if t in _CONTAINERS:
            items: Any = value[:ITEMS_MAX]
        elif t is dict:
            items = list(value.values())[:ITEMS_MAX]
        else:
            return
        for x in items:
            _remember(x, key, where)
    except Exception:  # noqa: BLE001 - an edge is never worth a failed call
        return


def upstream(values: Any, where: Any = None) -> list[bytes]:
    """Keys of the entries of the store at ``where`` whose results ``values`` (a call's arguments) are or hold,
    by identity, in order."""
    if _served:
        drain()
    if not _by_id:
        return []
    found: list[bytes] = []
    todo = [(v, 0) for v in values]
    seen = 0
    try:
        while todo and seen < WALK_MAX:
            v, depth = todo.pop(0)
            seen += 1
            t = type(v)
            if t in _SKIP:
                continue
            k = _known(v, where)
            if k is not None:
                if k not in found:
                    found.append(k)
                continue
            if depth >= 3:
                continue
            if t in _CONTAINERS:
                todo.extend((x, depth + 1) for x in v[:ITEMS_MAX])
            elif t is dict:
                todo.extend((x, depth + 1) for x in list(v.values())[:ITEMS_MAX])
            elif t.__module__ == "numpy":  # a view's base chain: a[::2] of an upstream result came from it
                b = getattr(v, "base", None)
                if b is not None:
                    todo.append((b, depth + 1))
    except Exception:  # noqa: BLE001
        return found
    return found


class _Linking(Fingerprinter):
    """Keys a result only to link it: a type new to the process is not rebuilt from its pickle to check its key
    (that runs the type's own unpickling code, for a value the user only returned)."""

    __slots__ = ()
    checks_types = False


class _LinkingVersioned(VersionedFingerprinter):
    __slots__ = ()
    checks_types = False


def _digest_of(v: Any) -> str | None:
    small = small_array_digest(v)  # a small array's encoding, hashed in one call: no walk
    if small is not None:
        return small.hex()
    # an array's encoding is the same under both: the plain fingerprinter costs less to start
    t = type(v)
    plain = t in _PLAIN or (t.__name__ == "ndarray" and t.__module__ == "numpy" and not v.dtype.hasobject)
    fp = _Linking() if plain else _LinkingVersioned()
    fp.feed_value(v)
    if fp.fed + len(fp.out) < CONTENT_MIN:
        return None
    return fp.digest().hex()


def result_fingerprint(result: Any) -> str | None:
    """The key encoding's digest of ``result`` (what a parameter holding it is keyed by), or None: too short
    to mean anything (:data:`CONTENT_MIN`), or not keyable."""
    try:
        return _digest_of(result)
    except Exception:  # noqa: BLE001 - a result casmon stores but cannot key links by identity only
        return None


def content_digests(state: CacheState, args: tuple, kwargs: dict, spans: Any,
                    known: Any = (), given: Any = None) -> dict[str, str]:
    """Parameter name -> content digest, read from the key's encoding where the key kept it (no second pass);
    a parameter that fed a large buffer straight to the hasher is hashed again up to :data:`CONTENT_MAX`
    bytes. The top-level items of a tuple or list parameter get digests too (``train((feats, labels))``). A
    parameter in ``known`` (linked by identity) gets only what its key's encoding gives for free. ``given``: the
    entry's ``a`` (:func:`casmon.caching.explain.arg_digests`), whose digest of a content-sized span is this one:
    the span is not hashed again."""
    out: dict[str, str] = {}
    if spans is None:
        return out
    raw, parts = spans
    mv = memoryview(raw)
    nlen = state._name_lens
    skip = state.files or state.hashers
    vals = None
    for name, a, b in parts:
        if skip and (name in state.files or name in state.hashers):
            continue  # files link by their own digests; a hasher's value is not the argument's content
        if a is not None:
            a += nlen.get(name, 0)
            if b - a >= CONTENT_MIN:
                d = given.get(name) if given else None
                out[name] = d if type(d) is str and len(d) == 32 else _h128(mv[a:b])
            if a >= b or raw[a] not in _OPENS:
                continue  # neither a container nor a large value: the span said everything
        if name in known:
            continue
        if vals is None:
            try:
                vals = dict(zip((p.name for p in state.params), state.bind(args, kwargs)))
            except Exception:  # noqa: BLE001
                vals = {}
        v = vals.get(name)
        try:
            if a is None and _small_enough(v):
                d = _digest_of(v)
                if d is not None:
                    out[name] = d
            if isinstance(v, _CONTAINERS) and type(v) in _CONTAINERS:
                for j, x in enumerate(v[:ITEMS_MAX]):
                    if type(x) not in _SKIP and _small_enough(x):
                        d = _digest_of(x)
                        if d is not None:
                            out[f"{name}[{j}]"] = d
        except Exception:  # noqa: BLE001
            continue
    return out


def _small_enough(v: Any) -> bool:
    n = getattr(v, "nbytes", 0)
    return not isinstance(n, int) or n <= CONTENT_MAX


def _unlinked(args: tuple) -> bool:
    """None of ``args`` is a remembered object or holds one (plain values, fresh arrays): no walk."""
    by_id = _by_id
    for v in args:
        t = type(v)
        if t is _ndarray:
            if v.base is not None:
                return False
            e = by_id.get(id(v))
            # a row of a dead result whose memory this array took (a fresh array often does) links nothing
            if e is not None and (e[0]() is v if e[2] else e[0]() is not None):
                return False
        elif t not in _SKIP:
            return False
    return True


def annotate(entry: dict[str, Any], state: CacheState, args: tuple, kwargs: dict, result: Any, spans: Any) -> None:
    """Add the lineage fields to a new entry: ``rf``, ``pc``, ``up`` (each only where it has something, but an
    entry with none gets an empty ``pc``: an entry without any was stored before lineage, whose 64-bit parameter
    digests may be of long values, explain's :func:`~casmon.caching.explain.same_value`). A parameter linked by
    identity gets no second pass for its content: its producer is known."""
    try:
        try:
            rf = small_array_digest(result, True)  # a small array's, in one call; any other value's, by a walk
        except Exception:  # noqa: BLE001 - keyed by the walk instead (which may fail alone)
            rf = None
        if rf is None:
            rf = result_fingerprint(result)
        if rf is not None:
            entry["rf"] = rf
        if _served:
            drain()
        given = entry.get("a")  # explain's digest of a content-sized span is its content digest: one hash
        if len(args) == 1 and given and len(given) == 1 and not kwargs and state._simple:
            # The common miss: one argument, a plain value or a fresh array (no producer here, no items)
            v = args[0]
            t = type(v)
            if t is _ndarray:
                plain = v.base is None
                if plain:
                    e = _by_id.get(id(v))  # a dead result's row at this address links nothing
                    plain = e is None or not (e[0]() is v if e[2] else e[0]() is not None)
            else:
                plain = t in _SKIP
            if plain:
                name = state._names[0]
                d = given.get(name)  # None: that argument is ignored, the one digest a default's
                if d is not None:
                    if len(d) == 32:  # content-sized: arg_digests' rule is pc's, and ``a`` is {name: d}
                        entry["pc"] = given
                        return
                    if d != "~":  # short, or a hasher's value: no content digest
                        if rf is None:
                            entry["pc"] = {}  # says its short values' digests are no older casmon's (explain)
                        return
        up: dict[str, list[str]] = {}
        if _by_id and not (not kwargs and state._simple and _unlinked(args)):
            if state._simple:  # no *args/**kwargs: positions name themselves; defaults are no upstream results
                named: Any = zip(state._names, args) if not kwargs else \
                    list(zip(state._names, args)) + list(kwargs.items())
            else:
                try:
                    named = list(zip((p.name for p in state.params), state.bind(args, kwargs)))
                except TypeError:
                    named = [(f"[{i}]", v) for i, v in enumerate(args)] + list(kwargs.items())
            ignore = state.ignore
            by_id = _by_id
            where = _NOWHERE
            for name, v in named:
                t = type(v)
                # a value that is no remembered object and holds none (a plain value, a fresh array that owns
                # its memory) has no producer here: no walk
                if t in _SKIP or (id(v) not in by_id and t not in _CONTAINERS and t is not dict and (
                        v.base is None if t is _ndarray else
                        t.__module__ != "numpy" or getattr(v, "base", None) is None)) or name in ignore:
                    continue
                if where is _NOWHERE:
                    where = getattr(state._store, "url", None)
                keys = upstream([v], where)
                if keys:
                    up[name] = [bytes(k).hex() for k in keys]
            if up:
                entry["up"] = up
        if spans is not None and not state._custom_key:
            raw, parts = spans
            if len(parts) == 1 and not up:  # one parameter: its span is its content, unless it holds more
                name, a, b = parts[0]
                nl = state._name_lens.get(name)
                if nl is not None and a is not None and not (state.files or state.hashers):
                    a += nl
                    if a < b and raw[a] not in _OPENS:
                        if b - a >= CONTENT_MIN:
                            d = given.get(name) if given else None
                            entry["pc"] = {name: d if type(d) is str and len(d) == 32 else _h128(raw[a:b])}
                        elif rf is None:
                            entry["pc"] = {}
                        return
            pc = content_digests(state, args, kwargs, spans, up, given)
            if pc or not (up or rf):
                entry["pc"] = pc
    except Exception:  # noqa: BLE001 - the entry is stored without its edges
        return
