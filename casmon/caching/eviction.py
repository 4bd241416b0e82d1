"""Cache entries as ``casmon cache``, ``casmon gc`` and ``casmon ui`` read and drop them: entries one per key
(the newest record of each), per-function totals, eviction and duplicate plans and their runs.

Apart from :mod:`casmon.caching.entries` (what an entry's records are) because none of it runs on a call's path:
a script's first hit never loads it.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, NamedTuple

from casmon.caching.entries import KIND, KIND_CLEAR, KIND_USE, name_digest, newest_per_key, result_of
from casmon.errors import MAX_BYTES, CasmonError, DamagedObjectError, checked_number
from casmon.keys.digest import Digest

if TYPE_CHECKING:
    from casmon.store.store import Store

__all__ = ["cache_entries", "AmbiguousName", "resolve_function", "clear_function", "evict", "eviction_plan", "Eviction", "freed_bytes",
           "duplicates_plan", "superseded_entries", "drop_duplicates", "results_total", "use_hits", "held_elsewhere"]


def results_total(summary: dict[str, dict]) -> tuple[int, int]:
    """Of :func:`cache_entries`' answer: (bytes of the distinct values its entries hold, each counted once;
    bytes of the values entries of more than one function hold)."""
    owners: dict[str, int] = {}
    sizes: dict[str, int] = {}
    for s in summary.values():
        for d, n in s.get("results", {}).items():
            owners[d] = owners.get(d, 0) + 1
            sizes[d] = n
    return sum(sizes.values()), sum(sizes[d] for d, k in owners.items() if k > 1)


def cache_entries(store: Store) -> dict[str, dict]:
    """Per function: entries (one per key), bytes, hits, last use, ``duplicates``: records a newer
    record of the same key supersedes (two processes that missed one key at once), and ``replaced``: records
    superseded by one written to replace them (``refresh``, a damaged result computed again). gc drops both.

    ``bytes`` counts each stored value once, however many of its entries hold it; ``shared_bytes`` is the part
    of it that entries of other functions hold too (clearing the function does not free it); ``results`` maps
    each value's digest to its size (:func:`results_total` adds them up over functions, each value once)."""
    cleared: dict[str, float] = {}
    for _k, r in store.records(KIND_CLEAR):
        if "fn" in r:  # a clear whose function's name failed its check clears nothing
            cleared[r["fn"]] = max(cleared.get(r["fn"], 0.0), r.get("time", 0.0))
    records = [(k, r) for k, r in store.records(KIND) if r.get("time", 0) > cleared.get(r.get("fn", "?"), 0.0)]
    now = time.time()
    newest = newest_per_key(records)
    out: dict[str, dict] = {}
    live_keys: dict[str, str] = {}
    replaced_before: dict[bytes, float] = {}  # key -> time of its newest record that replaces the ones before it
    for k, r in records:
        if r.get("replaces") is True:
            kb = bytes(k)
            replaced_before[kb] = max(replaced_before.get(kb, 0.0), r.get("time", 0))
    for k, r in records:
        s = out.setdefault(r.get("fn", "?"), {"entries": 0, "bytes": 0, "shared_bytes": 0, "hits": 0, "last_used": 0.0,
                                             "seconds_saved": 0.0, "duplicates": 0, "replaced": 0, "results": {}})
        # every record; less the entries below
        s["replaced" if r.get("time", 0) < replaced_before.get(bytes(k), 0.0) else "duplicates"] += 1
    holders: dict[str, set[str]] = {}
    for kb, (k, r) in newest.items():
        fn = r.get("fn", "?")
        s = out[fn]
        s["replaced" if r.get("time", 0) < replaced_before.get(bytes(k), 0.0) else "duplicates"] -= 1
        exp = r.get("expires")
        if isinstance(exp, (int, float)) and exp <= now:
            continue  # past its expires_after: a miss, and gc drops it
        s["entries"] += 1
        d = result_of(kb, r)
        s["results"][d] = _size_of(r)
        holders.setdefault(d, set()).add(fn)
        s["last_used"] = max(s["last_used"], r.get("time", 0))
        live_keys[k.hex()] = fn
    for s in out.values():
        s["bytes"] = sum(s["results"].values())
        s["shared_bytes"] = sum(n for d, n in s["results"].items() if len(holders[d]) > 1)
    for _k, r in store.records(KIND_USE):
        for h, fn, n, last in use_hits(r):
            if live_keys.get(h) == fn:
                s = out[fn]
                s["hits"] += n
                s["last_used"] = max(s["last_used"], last)
    return out


def use_hits(record: dict) -> list[tuple[str, str, int, float]]:
    """A use record's hits as ``(key hex, function, count, last use)``. The record was read through its field
    checks (``_hits`` above): a malformed hit is already left out."""
    return [(h, fn, n, last) for h, (fn, n, last) in record.get("hits", {}).items()]


def _size_of(record: dict) -> int:
    try:
        n = int(record.get("size", 0) or 0)
    except (TypeError, ValueError, OverflowError):  # a crafted record's size counts as nothing
        return 0
    return max(n, 0)


class AmbiguousName(LookupError):
    """A short name that several cached functions end with (``__main__.clean`` and ``pipeline.clean``)."""


def resolve_function(names: Iterable[str], name: str) -> str:
    """Find a function by full name, or by a short name or suffix that only one has."""
    names = sorted(set(names))
    if name in names:
        return name
    matches = [n for n in names if n.endswith("." + name) or n.rsplit(".", 1)[-1] == name]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        from casmon.view.text import did_you_mean

        hint = did_you_mean(name, names)
        hint = f" ({hint})" if hint else ""
        raise LookupError(f"no cached function {name!r}{hint}; there are: {', '.join(names) or 'none'}")
    raise AmbiguousName(f"{name!r} is ambiguous: {', '.join(matches)}")


def clear_function(store: Store, name: str) -> str:
    """Forget every cached result of function ``name``; returns its full name."""
    full = resolve_function(cache_entries(store), name)
    store.append(KIND_CLEAR, {"fn": full, "time": time.time()}, key=name_digest(full))
    store.flush()
    return full


# The call form of NamedTuple: the class form compiles its annotations' text at import, on a first hit.
Eviction = NamedTuple("Eviction", [("fn", str), ("value", str), ("size", int), ("stays", bool), ("time", float)])
Eviction.__new__.__defaults__ = (False, float("inf"))
Eviction.__doc__ = """One entry :func:`eviction_plan` drops: its function, the value it holds (digest hex) and that value's size,
``stays``: a kept entry (or a run, a call log, a ref) holds the same value, so dropping this one frees nothing,
and ``time``: its newest record's, when planned (a record of its key stored after the plan is not the plan's)."""


def freed_bytes(plan: dict[bytes, Eviction]) -> int:
    """The bytes of the values a plan's entries hold and no kept entry does, each value counted once."""
    return sum({e.value: e.size for e in plan.values() if not e.stays}.values())


def evict(store: Store, max_size: int | None = None, older_than: float | None = None,
          plan: dict[bytes, Eviction] | None = None) -> tuple[int, int]:
    """Drop cache entries: unused for ``older_than`` seconds, then least recently used until
    the values they hold add up to at most ``max_size`` bytes. Also drops cleared and expired entries.

    Returns ``(entries dropped, bytes of the values no kept entry holds)``, each value counted once. The
    values' data is removed by the gc that follows (subject to its grace period). ``plan``: what
    :func:`eviction_plan` returned, to drop exactly what it showed.
    """
    if plan is None:
        plan = eviction_plan(store, max_size, older_than)
    if not plan:
        return 0, 0
    from casmon.store.lock import held
    from casmon.store.records import parse_record  # the store's layer: decorating a function never loads it

    stored_since: dict[bytes, str] = {}  # planned key -> the value a record stored after the plan holds
    freeing = {e.value for e in plan.values() if not e.stays}
    held_now: set[str] = set()  # of those values, the ones a record the plan does not drop holds

    def keep(k: Any, v: Any) -> bool:
        kb = bytes(k)
        e = plan.get(kb)
        if e is None:
            if freeing:  # another key may hold a planned value: stored since the plan, with the same result
                try:
                    d = result_of(kb, parse_record(KIND, k, v))
                except (ValueError, TypeError, OverflowError, DamagedObjectError):
                    return True
                if d in freeing:
                    held_now.add(d)
            return True
        try:  # a writer may have stored the key again since the plan (a refresh): that entry is new, and stays
            r = parse_record(KIND, k, v)
            t = float(r.get("time", 0.0))
        except (ValueError, TypeError, OverflowError, DamagedObjectError):
            return False
        if t > e.time:
            stored_since[kb] = result_of(kb, r)
            return True
        return False

    with held(store.backend, "cache eviction", store.url):  # no merge may bring the dropped entries back
        store.table(KIND).consolidate(force=True, keep=keep)
    if not stored_since and not held_now:
        return len(plan), freed_bytes(plan)
    held_again = set(stored_since.values()) | held_now
    left = {k: e for k, e in plan.items() if k not in stored_since}
    freed = {e.value: e.size for e in left.values() if not e.stays and e.value not in held_again}
    return len(left), sum(freed.values())


def duplicates_plan(store: Store) -> dict[tuple[bytes, bytes], tuple[str, int, float]]:
    """Cache records that a newer record of the same key supersedes: ``(key, record bytes) -> (function,
    bytes of its result, its time)``. Two processes (or threads) that miss one key at once both store an
    entry; lookups use the newest, so the others only take space. ``casmon gc`` drops them
    (:func:`drop_duplicates`). A record that cannot be read is never planned away.
    """
    return superseded_entries(store)[0]


def superseded_entries(store: Store) -> tuple[dict[tuple[bytes, bytes], tuple[str, int, float]], set[tuple[bytes, bytes]]]:
    """:func:`duplicates_plan`, and the records of it that a newer record written to replace them supersedes
    (``refresh``, a damaged result computed again): no race of two processes, and gc says so. One read."""
    from casmon.store.records import parse_record  # the store's layer: decorating a function never loads it

    store.flush()
    newest: dict[bytes, tuple[float, bytes]] = {}
    replaced_at: dict[bytes, float] = {}
    parsed: list[tuple[bytes, bytes, str, int, float]] = []
    for k, v in store.table(KIND).items():
        try:
            r = parse_record(KIND, k, v)
            t = float(r.get("time", 0.0))
            fn, size = str(r.get("fn", "?")), int(r.get("size", 0))
        except (ValueError, TypeError, OverflowError, DamagedObjectError):
            continue
        k, v = bytes(k), bytes(v)
        parsed.append((k, v, fn, size, t))
        best = newest.get(k)
        if best is None or (t, v) > best:  # the newest wins, as in lookups; equal times: one of them, always the same
            newest[k] = (t, v)
        if r.get("replaces") is True:
            replaced_at[k] = max(replaced_at.get(k, 0.0), t)
    plan = {(k, v): (fn, size, t) for k, v, fn, size, t in parsed if newest[k][1] != v}
    return plan, {(k, v) for (k, v), (_fn, _size, t) in plan.items() if t < replaced_at.get(k, float("-inf"))}


def drop_duplicates(store: Store, plan: dict[tuple[bytes, bytes], Any] | None = None) -> tuple[int, int]:
    """Drop the cache records :func:`duplicates_plan` names (every key keeps its newest record).

    Returns ``(records dropped, bytes of their results)``; the results nothing else references are
    removed by the gc runs that follow. Holds the store lock, like eviction.
    """
    if plan is None:
        plan = duplicates_plan(store)
    if not plan:
        return 0, 0
    from casmon.store.lock import held

    with held(store.backend, "cache deduplication", store.url):  # no merge may bring the dropped records back
        store.table(KIND).consolidate(force=True, keep=lambda k, v: (bytes(k), bytes(v)) not in plan)
    return len(plan), sum(p[1] for p in plan.values())


def eviction_plan(store: Store, max_size: int | None = None, older_than: float | None = None) -> dict[bytes, Eviction]:
    """What :func:`evict` would drop, changing nothing: entry key -> :class:`Eviction`.

    Entries that hold one value share it: ``max_size`` limits the values, each counted once, and they go least
    recently used first -- a value, with every entry that holds it, when none of them was used since. Dropping an
    entry whose value a kept entry, a run, a call log or a ref holds frees nothing, so it is never dropped to make
    room, and such a value does not count against ``max_size``.
    ``casmon gc --dry-run`` shows the plan, and previews the gc after it from it.
    """
    if max_size is not None:
        max_size = int(checked_number(max_size, "max_size", high=MAX_BYTES, unit="bytes"))
    if older_than is not None:
        older_than = checked_number(older_than, "older_than")
    store.flush()
    cleared: dict[str, float] = {}
    for _k, r in store.records(KIND_CLEAR):
        if "fn" in r:  # a clear whose function's name failed its check clears nothing
            cleared[r["fn"]] = max(cleared.get(r["fn"], 0.0), r.get("time", 0.0))
    entries: dict[bytes, list] = {}  # key -> [last_use, size, dropped, function, value, record time]
    # The newest record decides, as in lookups: an entry computed again after a `cache clear` is live
    # though an older, cleared record of its key is still there (gc drops that one as a duplicate).
    # Deciding by any record would evict the live entry, and the preview -- made before duplicates
    # are dropped -- would differ from the real run.
    for kb, (_k, r) in newest_per_key(store.records(KIND)).items():
        t, fn = r.get("time", 0.0), str(r.get("fn", ""))
        exp = r.get("expires")  # expires_after= of the function that stored it
        expired = isinstance(exp, (int, float)) and exp <= time.time()
        entries[kb] = [t, _size_of(r), t <= cleared.get(fn, 0.0) or expired, fn, result_of(kb, r), _time_of(r)]
    for _k, r in store.records(KIND_USE):
        for h, _fn, _n, last in use_hits(r):
            e = entries.get(bytes.fromhex(h))
            if e is not None:
                e[0] = max(e[0], last)
    now = time.time()
    if older_than is not None:
        for e in entries.values():
            if now - e[0] >= older_than:
                e[2] = True
    values: dict[str, list[list]] = {}  # value -> the entries that hold it
    for e in entries.values():
        values.setdefault(e[4], []).append(e)
    # A value a run, a call log or a ref holds stays whatever the cache drops: evicting its entries frees nothing,
    # so they are not dropped to make room, and the limit counts only what evicting can free.
    elsewhere = held_elsewhere(store) if values and (max_size is not None or any(e[2] for e in entries.values())) \
        else set()
    if max_size is not None:
        kept = [(max(e[0] for e in es if not e[2]), d, es) for d, es in values.items()
                if not all(e[2] for e in es) and d not in elsewhere]
        total = sum(es[0][1] for _t, _d, es in kept)
        for _t, _d, es in sorted(kept, key=lambda v: (v[0], v[1])):
            if total <= max_size:
                break
            for e in es:
                e[2] = True
            total -= es[0][1]
    return {k: Eviction(e[3], e[4], e[1], e[4] in elsewhere or not all(o[2] for o in values[e[4]]), e[5])
            for k, e in entries.items() if e[2]}


def held_elsewhere(store: Store) -> set[str]:
    """The values (digest hex) that records other than cache entries (runs, call logs) and refs reach, read as
    far as they can be: what gc keeps whatever the cache drops. Damage is gc's to report; here it hides nothing
    that is readable."""
    from casmon.maintenance import reach

    roots: set[Digest] = set()
    for kind in store.record_kinds():
        if kind == KIND:
            continue
        for _k, rec in reach.readable_records(store, kind):
            for h in reach.named_refs(rec):
                try:
                    roots.add(Digest(h))
                except (TypeError, ValueError):
                    continue
    for name in store.refs():
        try:
            ref = store.get_ref(name)
        except CasmonError:
            continue
        if ref is not None and ref.target is not None:
            roots.add(ref.target)

    def open_value(d: Digest) -> Any:
        try:
            return reach.parts_of(store.manifest(d))
        except CasmonError:
            return None

    return {d.hex() for d in reach.closure(roots, open_value, phase="values held elsewhere").values}


def _time_of(record: dict) -> float:
    try:
        return float(record.get("time", 0.0))
    except (TypeError, ValueError, OverflowError):  # a crafted record's time: as old as can be
        return 0.0
