"""A cached call's miss half: the computed result stored, its cache entry written, and the first misses' key
checked again for arguments that never hash the same.

:class:`~casmon.caching.memoize.CacheState` calls these (``save``, ``end``); they are loaded by a process's
first miss, so a hit, and decorating a function, load none of this code.
"""

from __future__ import annotations

import binascii  # a miss's (this module is): a hit decodes inline values without it
import time
TYPE_CHECKING = False  # typing's flag without importing typing (~2 ms of a first hit)
if TYPE_CHECKING:
    from typing import Any

    from casmon.caching.memoize import CacheState
    from casmon.keys.digest import Digest

from casmon.caching import explain, hot, memoize
from casmon.caching.entries import KIND
from casmon.keys.fingerprint import fingerprint

__all__ = ["save", "end", "check_stable"]


def save(state: CacheState, key: Digest, result: Any, seconds: float, args: tuple, kwargs: dict,
         files: list | None = None, spans: Any = None) -> None:
    """Store a computed result; a failure is a warning, never an exception."""
    replaces = bytes(key) in state._replacing
    state._replacing.discard(bytes(key))
    try:
        store = state.store  # opened at first use: a store away then is a warning too
        d, size = store.put_sized(result, mmap=state.mmap)
    except TypeError as e:
        state.warn(("result", type(result)), f"casmon: the result of {state.name} is returned but not cached: {e}")
        return
    except Exception as e:  # noqa: BLE001 - a storage error must not lose the result
        state.warn(("store-error", type(e)), f"casmon: the result of {state.name} is returned but not cached: {e}")
        return
    now = time.time()
    entry: dict[str, Any] = {"fn": state.name, "result": d.hex(), "time": now, "seconds": round(seconds, 6), "size": size}
    raw = store.objects.peek_raw(d, memoize.INLINE_MAX)
    if raw is not None and raw[:1] in (b"j", b"p"):  # self-contained forms: no chunks, no children
        entry["inline"] = binascii.b2a_base64(raw, newline=False).decode()
    if state.version is not None:
        entry["v"] = state.version.hex()  # which code version made it: the code-change warning counts them
    if not state._custom_key:
        entry["a"] = explain.arg_digests(state, args, kwargs, spans)  # which parameter differs: f.explain
    if state.expires is not None:
        entry["expires"] = now + state.expires  # gc drops it after that
    if replaces:
        entry["replaces"] = True
    if files:
        # The input files' digests, so `casmon show` and run diffs can say which input changed.
        entry["files"] = [list(f) for f in files[:memoize.FILES_RECORDED]]
        if len(files) > memoize.FILES_RECORDED:
            entry["files_truncated"] = len(files)
    edges = hot.edges_module()  # lineage: loaded by the first miss, not by a hit
    edges.annotate(entry, state, args, kwargs, result, spans)  # where its arguments came from: casmon.lineage
    if state.label is not None:
        try:
            entry["label"] = state.label(*args, **kwargs) if callable(state.label) else str(state.label)
        except Exception as e:  # noqa: BLE001
            entry["label"] = f"<label failed: {e}>"
    try:
        store.append(KIND, entry, key=key, refs=[d])
    except Exception as e:  # noqa: BLE001
        state.warn(("store-error", type(e)), f"casmon: the result of {state.name} is returned but not cached: {e}")
        return
    state._remember(key, d, None if state.expires is None else now + state.expires)
    edges.produced(result, key, store.url)
    if memoize.observers:
        for ob in list(memoize.observers):
            ob(store, state.name, key, d, False)


def end(state: CacheState, ctx: Any, result: Any, t0: float, args: tuple, kwargs: dict) -> None:
    """The function returned ``result`` for the call ``ctx`` (:meth:`CacheState.begin`'s): store it, check the first
    misses' keys, and release the key for whoever waits on it."""
    key, trackers, files, spans = ctx[:4]
    seconds = time.perf_counter() - t0
    state._recent.append(seconds)
    try:  # what the function changed itself while it ran is not an edit of the values it reads
        if state.tracker is not None:
            state.tracker.observe()
        for t in trackers:
            t.observe()
        if key is not None:
            state.save(key, result, seconds, args, kwargs, files=files, spans=spans)  # a subclass may wrap it
            if state._stability_checks < memoize.STABILITY_CHECKS and not state._custom_key:
                check_stable(state, key, args, kwargs)
    finally:
        if len(ctx) > 4:
            state._done(ctx[4])


def check_stable(state: CacheState, key: Digest, args: tuple, kwargs: dict) -> None:
    """After the first misses: the key again. An argument that hashes differently each time (a
    ``__reduce__`` with a counter, a fresh id) makes every call a miss; say which, once."""
    state._stability_checks += 1
    try:
        again = state.key_ctx(args, kwargs)[0]
    except Exception:  # noqa: BLE001 - the first key was computed: nothing new to say
        return
    if again is None or again == key:
        return
    unstable = []
    for p, v in zip(state.params, state.bind(args, kwargs)):
        if p.name in state.ignore:
            continue
        try:
            if fingerprint(v) != fingerprint(v):
                unstable.append(p.name)
        except Exception:  # noqa: BLE001
            continue
    if not unstable:
        return  # the arguments are stable: the code's version changed meanwhile (the code-change warning's job)
    which = f"parameter {', '.join(map(repr, unstable))} hashes"
    state.warn(("unstable",), f"casmon: {state.name} will never be a cache hit: {which} differently each time "
                             f"(a value whose pickle is not the same twice, or one the call changed). Hash it "
                             f"yourself with hashers={{name: lambda v: ...}}, or leave it out with ignore=[...]")
