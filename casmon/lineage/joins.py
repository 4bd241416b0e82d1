"""The lineage joins over columns (:mod:`casmon.lineage.columns`): the edges between entries, what is downstream
of a set of entries, and which entries are stale -- each in bulk, numpy arrays in and out.

An edge ``u -> h`` (``h`` took ``u``'s result as parameter ``name``): ``u`` is in ``h``'s ``up`` (by identity),
or, for a parameter without an identity edge, ``u``'s result fingerprint equals the parameter's content digest
(``pc``, of it or of its items: ``name[i]`` is named ``name``); never ``h -> h``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from casmon.lineage.columns import Columns, ranges, spans

__all__ = ["Edges", "downstream", "reach", "status_of", "Groups", "groups", "stale_rows",
           "LIVE_", "CLEARED_", "EXPIRED_"]

LIVE_, CLEARED_, EXPIRED_ = 0, 1, 2


class Edges(NamedTuple):
    """Every edge once, sorted by ``src``; ``ptr``: ``src`` row ``i``'s edges are ``ptr[i]:ptr[i+1]``."""

    src: np.ndarray
    dst: np.ndarray
    name: np.ndarray
    ptr: np.ndarray


def _base_names(c: Columns, names: np.ndarray) -> np.ndarray:
    """The string index of each parameter name's base (``x[0]`` -> ``x``), the table grown where it lacks one."""
    uniq, inv = np.unique(names, return_inverse=True)
    out = np.empty(len(uniq), np.int64)
    for i, j in enumerate(uniq.tolist()):
        base = c.strings[j].split("[", 1)[0]
        k = c.sid(base)
        if k < 0:
            k = len(c.strings)
            c.strings.append(base)
            c._sid = None
        out[i] = k
    return out[inv] if len(names) else np.zeros(0, np.int64)


def _identity(c: Columns) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(h, u, name)`` of every identity edge (``u``: -1 where the key is no entry's)."""
    got = c._cache.get("identity")
    if got is None:
        h = np.repeat(np.arange(c.n, dtype=np.int64), np.diff(c.up_ptr))
        got = c._cache["identity"] = (h, c.rows_of(c.up_key), c.up_name.astype(np.int64))
    return got


def _content_items(c: Columns) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(h, item, base name)`` of the ``pc`` items whose parameter has no identity edge."""
    got = c._cache.get("content")
    if got is None:
        h = np.repeat(np.arange(c.n, dtype=np.int64), np.diff(c.pc_ptr))
        base = _base_names(c, c.pc_name)
        m = len(c.strings) + 1
        uh, _u, uname = _identity(c)
        taken = np.sort(uh * m + uname)
        mine = h * m + base
        at = np.minimum(np.searchsorted(taken, mine), max(len(taken) - 1, 0))
        keep = np.flatnonzero(taken[at] != mine) if len(taken) else np.arange(len(mine))
        got = c._cache["content"] = (h[keep], keep, base[keep])
    return got


def downstream(c: Columns) -> Edges:
    """Every edge between entries, by upstream row (made once per :class:`Columns`)."""
    got = c._cache.get("edges")
    if got is not None:
        return got
    h1, u1, n1 = _identity(c)
    ok = (u1 >= 0) & (u1 != h1)
    h2, items, base = _content_items(c)
    which, u2 = c.with_rf(c.pc_d[items])
    h2, n2 = h2[which], base[which]
    ok2 = u2 != h2
    src = np.concatenate((u1[ok], u2[ok2]))
    dst = np.concatenate((h1[ok], h2[ok2]))
    name = np.concatenate((n1[ok], n2[ok2]))
    order = np.lexsort((name, dst, src))
    src, dst, name = src[order], dst[order], name[order]
    if len(src) > 1:
        first = np.ones(len(src), bool)
        first[1:] = (src[1:] != src[:-1]) | (dst[1:] != dst[:-1]) | (name[1:] != name[:-1])
        src, dst, name = src[first], dst[first], name[first]
    ptr = np.searchsorted(src, np.arange(c.n + 1))
    got = c._cache["edges"] = Edges(src, dst, name, ptr)
    return got


def reach(c: Columns, seeds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(reached mask, rows in the order found)``: ``seeds`` and every entry downstream of them, breadth first."""
    e = downstream(c)
    seen = np.zeros(c.n, bool)
    frontier = np.unique(seeds)
    seen[frontier] = True
    found = [np.asarray(seeds, np.int64)]
    while len(frontier):
        nxt = e.dst[ranges(e.ptr, frontier)]
        nxt = np.unique(nxt[~seen[nxt]])
        seen[nxt] = True
        found.append(nxt)
        frontier = nxt
    order = np.concatenate(found)
    _u, first = np.unique(order, return_index=True)
    return seen, order[np.sort(first)]


def status_of(c: Columns, cleared: dict[str, float], now: float) -> np.ndarray:
    """Each row's status: :data:`LIVE_`, :data:`CLEARED_` (stored before its function's newest clear) or
    :data:`EXPIRED_`."""
    ct = np.zeros(len(c.strings) + 1, np.float64)
    for fn, t in cleared.items():
        i = c.sid(fn)
        if i >= 0:
            ct[i] = t
    out = np.full(c.n, LIVE_, np.int8)
    with np.errstate(invalid="ignore"):
        out[c.expires <= now] = EXPIRED_
    out[c.time <= ct[c.fn]] = CLEARED_
    return out


class Groups(NamedTuple):
    """An entry's inputs, each a group any of whose makers holding it keeps it true: by identity (``ih`` took
    the result of ``iu``, -1 where it is no entry: gone, so it holds), by content (``ch`` took a value that the
    entries of fingerprint class ``cc`` made; ``cu``: the first of them other than ``ch``)."""

    ih: np.ndarray
    iu: np.ndarray
    iname: np.ndarray
    ch: np.ndarray
    cc: np.ndarray
    cu: np.ndarray
    cname: np.ndarray
    cls: np.ndarray  # each row's fingerprint class, -1 without one
    ncls: int


def groups(c: Columns) -> Groups:
    rows, rfs = c.sorted_rf()
    cls = np.full(c.n, -1, np.int64)
    if len(rows):
        starts = np.ones(len(rows), bool)
        starts[1:] = rfs[1:] != rfs[:-1]
        cls[rows] = np.cumsum(starts) - 1
        ncls = int(cls[rows].max()) + 1
    else:
        ncls = 0
    ih, iu, iname = _identity(c)
    keep = iu != ih
    ih, iu, iname = ih[keep], iu[keep], iname[keep]
    h, items, base = _content_items(c)
    lo, hi = c.find("rf", c.pc_d[items])
    # the group is the class less the entry itself: empty where the class is only it (or nothing)
    first = np.where(lo < hi, rows[np.minimum(lo, max(len(rows) - 1, 0))] if len(rows) else -1, -1)
    second = np.where(lo + 1 < hi, rows[np.minimum(lo + 1, max(len(rows) - 1, 0))] if len(rows) else -1, -1)
    cu = np.where(first == h, second, first)
    ok = cu >= 0
    cc = np.where(lo < hi, cls[first] if len(rows) else -1, -1)
    return Groups(ih, iu, iname, h[ok], cc[ok], cu[ok], base[ok], cls, ncls)


def stale_rows(c: Columns, status: np.ndarray, roots: np.ndarray, g: Groups) -> tuple[np.ndarray, np.ndarray,
                                                                                      np.ndarray]:
    """``(stale, good, class counts)``: which rows are stale -- ``roots`` (their code or a file changed), and every
    row with an input none of whose makers holds it -- a maker holds a value where it is good (live, not a root,
    every input of its own held), or another good entry has the same fingerprint; a maker gone from the store
    holds (it is shown missing, not changed), and so does a value no entry made before the one that took it. ``good`` grows from the entries without inputs in rounds, so no
    entry vouches for a value it was made from (``x * 1`` of a stale ``x``): a chain of cached steps costs its
    length in rounds."""
    cand = (status == LIVE_) & ~roots
    n = len(cand)
    hasc = g.cls >= 0
    good = np.zeros(n, bool)
    cnt = np.zeros(g.ncls, np.int64)
    icls = np.where(g.iu >= 0, g.cls[np.maximum(g.iu, 0)], -1)  # an identity input's maker's class
    held_i = g.iu < 0
    # A value no entry made before the one that took it came from outside the store (a literal a later call
    # returned again): it holds, as a maker gone from the store does, and so no cycle of such links stands alone.
    first_made = np.full(g.ncls, np.inf)
    if g.ncls:
        np.minimum.at(first_made, g.cls[hasc], c.time[hasc])
    held_c = first_made[g.cc] >= c.time[g.ch] if len(g.cc) else np.zeros(0, bool)
    need = np.bincount(g.ih[~held_i], minlength=n) + np.bincount(g.ch[~held_c], minlength=n)  # inputs not held yet
    # the edges by maker, by maker's class and by class: which to look at when a maker, or a class, holds
    io = np.argsort(g.iu, kind="stable")
    iptr = _offsets(g.iu[io], n)
    jo = np.argsort(icls, kind="stable")
    jptr = _offsets(icls[jo], g.ncls)
    co = np.argsort(g.cc, kind="stable")
    cptr = _offsets(g.cc[co], g.ncls)
    new = np.flatnonzero(cand & (need == 0))
    # Sets as masks, not np.unique: a hash of a million values each round cost five times the rest.
    fi, fc, rows = np.zeros(len(held_i), bool), np.zeros(len(held_c), bool), np.zeros(n, bool)
    while len(new):
        good[new] = True
        fi[io[spans(iptr[new], iptr[new + 1])]] = True
        nc = g.cls[new]
        nc = nc[nc >= 0]
        if len(nc):
            born = nc[cnt[nc] == 0]  # classes that now have a good entry (repeats do no harm: masks)
            cnt += np.bincount(nc, minlength=g.ncls)
            fi[jo[spans(jptr[born], jptr[born + 1])]] = True
            fc[co[spans(cptr[born], cptr[born + 1])]] = True
        fi &= ~held_i
        fc &= ~held_c
        held_i |= fi
        held_c |= fc
        touched = np.concatenate((g.ih[fi], g.ch[fc]))
        fi[:] = False
        fc[:] = False
        if not len(touched):
            break
        need -= np.bincount(touched, minlength=n)
        rows[touched] = True
        new = np.flatnonzero(rows & cand & ~good & (need == 0))
        rows[touched] = False
    return roots | (need > 0), good, cnt


def _offsets(sorted_vals: np.ndarray, size: int) -> np.ndarray:
    """Where each value ``v`` in ``0..size-1`` is in ``sorted_vals``: ``[ptr[v], ptr[v + 1])`` (-1s sort first)."""
    k0 = int(np.searchsorted(sorted_vals, 0))
    counts = np.bincount(sorted_vals[k0:], minlength=size)[:size]
    return k0 + np.concatenate(([0], np.cumsum(counts))).astype(np.int64)


def _among(sorted_vals: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """The positions in ``sorted_vals`` of every value in ``wanted``."""
    if not len(wanted) or not len(sorted_vals):
        return np.zeros(0, np.int64)
    lo = np.searchsorted(sorted_vals, wanted, "left")
    hi = np.searchsorted(sorted_vals, wanted, "right")
    return spans(lo, hi)


