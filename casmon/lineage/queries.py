"""The lineage queries: :func:`lineage` (upstream), :func:`used_by` (downstream, transitively) and :func:`stale`.

Edges (:mod:`casmon.caching.edges`): an entry's parameter whose content digest equals another entry's result
fingerprint, an argument that was another entry's very result object (same process), a ``files=`` file by its
content digest, a run's cache links and its params. Content equality is the rule across processes: a value
equal to a stored result links to it whatever code made it (values shorter than ``edges.CONTENT_MIN`` bytes
of key encoding -- ``None``, flags, small numbers, short strings -- link to nothing).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

import numpy as np

from casmon.caching import AmbiguousName, resolve_function
from casmon.caching.explain import compare_parts, file_changed
from casmon.errors import CasmonError
from casmon.lineage.graph import Graph, Node, entry_id, entry_link, file_id, run_id, run_link
from casmon.lineage.columns import HAS_RESULT, hexes
from casmon.lineage.index import CLEARED, LIVE, MISSING, UNKNOWN, Index, bulk, short_hex
from casmon.lineage.joins import downstream, groups, reach, stale_rows, status_of

if TYPE_CHECKING:
    from casmon.runs import RunInfo
    from casmon.store.store import Store

__all__ = ["lineage", "used_by", "stale", "Staleness", "resolve", "open_index"]

#: A key or digest prefix must be at least this long to name an entry.
PREFIX_MIN = 6


def open_index(store: Store | str | None) -> Index:
    if isinstance(store, Index):
        return store
    from casmon.store import default_store

    return Index(default_store(store, create=False))


# -- nodes --------------------------------------------------------------------------------------------------
def _fn_short(fn: str) -> str:
    return fn.rsplit(".", 1)[-1]


def entry_node(ix: Index, key: str, fn_hint: Any = None) -> Node:
    """``fn_hint``: the function a record naming the entry says it is (a run's link), for an entry gone from the
    store: it reads as ``clean 1ee1795a475e [missing]``, not as a bare key."""
    r = ix.entry(key)
    st = ix.status(key)
    if r is None:
        if isinstance(fn_hint, str) and fn_hint:
            return Node(entry_id(key), "entry", f"{_fn_short(fn_hint)} {short_hex(key)}", "",
                        {"key": key, "fn": fn_hint, "status": MISSING})
        return Node(entry_id(key), "entry", short_hex(key), "", {"key": key, "status": MISSING})
    fn = str(r.get("fn", "?"))
    data = {"key": key, "fn": fn, "version": r.get("v"), "result": r.get("result"), "status": st,
            "time": r.get("time")}
    if isinstance(r.get("label"), str):
        data["entry_label"] = r["label"]
    return Node(entry_id(key), "entry", f"{_fn_short(fn)} {short_hex(key)}", entry_link(fn, key), data)


def file_node(path: str, digest: str, now: str | None = None) -> Node:
    data: dict[str, Any] = {"path": path, "digest": digest}
    if now is not None and now != UNKNOWN:
        data["changed"] = now != digest
    return Node(file_id(path, digest), "file", f"{os.path.basename(path) or path} {digest[:8]}", "", data)


def run_node(run: RunInfo) -> Node:
    return Node(run_id(run.ref), "run", run.name, run_link(run.ref), {"name": run.name, "status": run.status})


# -- resolving what a query names ---------------------------------------------------------------------------
def resolve(ix: Index, target: Any, runs: bool = True) -> tuple[str, Any]:
    """What ``target`` names: ``("run", RunInfo)``, ``("entries", [keys])`` (an entry, a function, a function
    version ``FN@VERSION``, a result digest) or ``("file", (path, digest or None))`` (a path, ``FILE@DIGEST``). LookupError, in one line, if nothing."""
    what, found = resolve_rows(ix, target, runs)
    if what == "rows":
        return "entries", hexes(ix.cols.key[found])
    return what, found


def _prefixed(col: np.ndarray, order: np.ndarray | None, low: str) -> np.ndarray:
    """The rows whose 16-byte value in ``col`` starts with the hex ``low``: a range of the sorted column."""
    lo = np.array([bytes.fromhex(low.ljust(32, "0")[:32])], "S16")
    hi = np.array([bytes.fromhex(low.ljust(32, "f")[:32])], "S16")
    vals = col if order is None else col[order]
    a, b = int(np.searchsorted(vals, lo, "left")[0]), int(np.searchsorted(vals, hi, "right")[0])
    rows = np.arange(a, b) if order is None else order[a:b]
    return rows


def resolve_rows(ix: Index, target: Any, runs: bool = True) -> tuple[str, Any]:
    """:func:`resolve`, naming entries by row of :attr:`Index.cols` (``("rows", array)``)."""
    from casmon.runs import RunInfo

    if isinstance(target, RunInfo):
        return "run", target
    if hasattr(target, "key") and hasattr(target, "entry"):  # a ResultRef
        return _rows_of_keys(ix, [bytes(target.key).hex()])
    state = getattr(target, "__casmon_cache__", None)
    if state is None:
        state = getattr(target, "__casmon_intercept__", None)  # answered below as a logged function
    if state is not None:
        target = state.name
    if not isinstance(target, str) or not target:
        raise LookupError(f"lineage: {target!r} names no run, cached function, entry, file or digest")
    t = target.strip()
    low = t.lower()
    if len(low) >= PREFIX_MIN and len(low) <= 32 and not low.strip("0123456789abcdef"):
        if len(low) == 32 and ix.entry(low) is not None:
            return _rows_of_keys(ix, [low])  # a whole key: one lookup, not a read of every entry
        c = ix.cols
        res = np.flatnonzero(c.has & HAS_RESULT)
        rows = np.concatenate((_prefixed(c.key, None, low),
                               _prefixed(c.result, res[np.argsort(c.result[res], kind="stable")], low),
                               _prefixed(c.rf, c.sorted_rf()[0], low)))
        if len(rows):
            _u, first = np.unique(rows, return_index=True)
            return "rows", rows[np.sort(first)]
        files = [(p, d) for p, d in _all_files(ix) if d.startswith(low)]
        if files:
            return "file", files[0]
    if runs:
        from casmon.runs import load_run

        try:
            return "run", load_run(t, ix.store)
        except LookupError:
            pass
    fn, _, version = t.partition("@")
    c = ix.cols
    fns = np.unique(c.fn)
    try:
        full = resolve_function([c.strings[i] for i in fns.tolist()], fn)
    except LookupError as e:
        full = None
        why = e
    if full is not None:
        mine = c.fn == c.sid(full)
        if version:
            vs = np.unique(c.v[mine])
            ok = [i for i in vs.tolist() if i >= 0 and c.strings[i].startswith(version)] + \
                ([-1] if -1 in vs.tolist() and "".startswith(version) else [])
            mine &= np.isin(c.v, ok)
        rows = np.flatnonzero(mine)
        if not len(rows):
            raise LookupError(f"{full} has no entry of code version {version!r}")
        return "rows", rows
    if full is None and "@" in t:
        at = _file_at(ix, t)
        if at is not None:
            return "file", at
    paths = {p for p, _d in _all_files(ix)}
    if t in paths or os.path.abspath(t) in paths:
        return "file", (t if t in paths else os.path.abspath(t), None)
    if isinstance(why, AmbiguousName):  # names several, not none: say which, as one line
        raise LookupError(f"{why}; name one of them") from None
    if low and len(low) < PREFIX_MIN and not low.strip("0123456789abcdef"):
        n = len(_prefixed(c.key, None, low))
        if n:  # a key's first digits, as git's short hashes: too few to be sure which entry
            raise LookupError(f"{t!r} is too short to name an entry: give at least {PREFIX_MIN} hex digits of its key "
                              f"({n:,} {'entry starts' if n == 1 else 'entries start'} with these)")
    logged = _logged(ix, fn)
    if logged is not None:
        raise LookupError(
            f"{fn!r} is a logged (intercepted) function, not a cached one: call logs are not part of lineage's graph "
            f"of cached calls (a logged call shows in it only as taking a cached result, under used-by of that "
            f"cached function); `casmon calls {fn}` lists its calls, `casmon show {fn} N` one call's arguments and "
            f"result (Python: casmon.load(store).calls({logged!r}))")
    raise LookupError(f"{t!r} names no run, cached function, entry, file or digest ({why})")


def _logged(ix: Index, fn: str) -> str | None:
    """The full name of the intercepted function ``fn`` names in the store's call log, or None."""
    from casmon.calllog import CallLog

    try:
        return CallLog(ix.store).resolve(fn)
    except Exception:  # a log that cannot be read: the question was lineage's, answered by its own error
        return None


def _rows_of_keys(ix: Index, keys: list[str]) -> tuple[str, Any]:
    c = ix.cols
    return "rows", np.array([i for i in (c.row(k) for k in keys) if i >= 0], np.int64)


def _file_at(ix: Index, t: str) -> tuple[str, str] | None:
    """``FILE@DIGEST`` -- a ``files=`` file (its path, or its name where that is one file's) and a prefix of its
    content digest, as lineage prints them: ``(path, digest)``, or None if FILE names no such file. LookupError
    (one line) if it does but no content it was read with has that digest, or the prefix fits several."""
    path, _at, d = t.rpartition("@")
    d = d.lower()
    if not path or not d or d.strip("0123456789abcdef"):
        return None
    files = _all_files(ix)
    full = os.path.abspath(path)
    named = [(p, fd) for p, fd in files if p == path or os.path.abspath(p) == full]
    if not named and "/" not in path and os.sep not in path:
        named = [(p, fd) for p, fd in files if os.path.basename(p) == path]
    if not named:
        return None
    hits = sorted({(p, fd) for p, fd in named if fd.startswith(d)})
    if len(hits) == 1:
        return hits[0]
    if not hits:
        had = sorted({fd[:8] for _p, fd in named})
        more = f" and {len(had) - 10:,} more" if len(had) > 10 else ""
        raise LookupError(f"no content of {path!r:.200} read by a cached call has digest {d!r:.80} (it had: "
                          f"{', '.join(had[:10])}{more})")
    if len({fd for _p, fd in hits}) > 1:
        raise LookupError(f"{d!r:.80} is too short to name one content of {path!r:.200}: "
                          f"{', '.join(sorted({fd[:12] for _p, fd in hits})[:10])} start with it")
    raise LookupError(f"{path!r:.200} names {len(hits):,} files read with content {d!r:.80} "
                      f"({', '.join(p for p, _fd in hits[:5])}); give its path")


def _all_files(ix: Index) -> list[tuple[str, str]]:
    """Every ``(path, digest)`` a ``files=`` parameter recorded, once each."""
    c = ix.cols
    pairs = np.unique(np.stack((c.f_path.astype(np.int64), c.f_d.astype(np.int64)), axis=1), axis=0) \
        if len(c.f_path) else np.zeros((0, 2), np.int64)
    return [(c.strings[p], c.strings[d]) for p, d in pairs.tolist()]


def file_rows(ix: Index, path: str, digest: str | None) -> tuple[np.ndarray, np.ndarray]:
    """``(file item, its entry's row)`` of each ``files=`` parameter that read ``path`` (with ``digest``)."""
    c = ix.cols
    m = c.f_path == c.sid(path)
    if digest is not None:
        m &= c.f_d == c.sid(digest)
    items = np.flatnonzero(m)
    return items, np.searchsorted(c.f_ptr, items, "right") - 1


# -- lineage: upstream ----------------------------------------------------------------------------------------
def _upstream_into(ix: Index, g: Graph, keys: list[str]) -> None:
    todo = list(keys)
    done: set[str] = set()
    while todo:
        k = todo.pop()
        if k in done:
            continue
        done.add(k)
        g.add(entry_node(ix, k))
        for param, path, d in ix.files(k):
            fnode = g.add(file_node(path, d, ix.file_now(path)))
            g.link(fnode.id, entry_id(k), "file", param)
        for param, u in ix.upstream(k):
            g.add(entry_node(ix, u))
            g.link(entry_id(u), entry_id(k), "result", param)
            todo.append(u)


@bulk
def lineage(target: Any, store: Store | str | None = None) -> Graph:
    """The upstream graph of a run, a cached function (every entry of it), an entry (key or result digest, or a
    ``ResultRef``): the cached calls that made its inputs, with their code versions, the files they read with
    their digests, and a run's params. A missing upstream is a node with status ``missing``, never an error."""
    ix = open_index(store if store is not None else getattr(target, "store", None))
    what, found = resolve(ix, target)
    if what == "run":
        g = Graph(found.name)
        rn = g.add(run_node(found))
        keys = []
        for link in ix.run_links(found):
            k = link["key"]
            g.add(entry_node(ix, k, link.get("fn")))
            g.link(entry_id(k), rn.id, "used", "hit" if link.get("hit") else "computed")
            keys.append(k)
        _upstream_into(ix, g, keys)
        _run_own_into(g, found, rn)
        return g
    if what == "file":
        g = Graph(found[0])
        c = ix.cols
        for i in file_rows(ix, *found)[0].tolist():
            p, d = c.strings[c.f_path[i]], c.strings[c.f_d[i]]
            g.add(file_node(p, d, ix.file_now(p)))
        return g
    g = Graph(str(target) if isinstance(target, str) else ", ".join(short_hex(k) for k in found[:3]))
    _upstream_into(ix, g, found)
    return g


def _run_own_into(g: Graph, run: RunInfo, rn: Node) -> None:
    """A run's own inputs (params, tracked files, uncommitted changes) and outputs (artifacts)."""
    try:
        params = run.flat_params()
    except CasmonError:
        params = {}
    for name, v in params.items():
        pn = g.add(Node(f"param:{run.ref}:{name}", "param", f"{name}={v!r}"[:80], "", {"name": name}))
        g.link(pn.id, rn.id, "param", name)
    for path, f in (run.manifest.get("files") or {}).items():
        if isinstance(f, dict) and isinstance(f.get("digest"), str):
            fnode = g.add(file_node(str(path), f["digest"]))
            g.link(fnode.id, rn.id, "tracked", str(path))
    git = run.manifest.get("git")
    patch = git.get("patch") if isinstance(git, dict) else None
    if isinstance(patch, str):
        pn = g.add(Node(f"patch:{patch}", "patch", f"uncommitted changes {patch[:8]}", "", {"digest": patch}))
        g.link(pn.id, rn.id, "patch")
    try:
        artifacts = run.artifacts()
    except CasmonError:
        artifacts = []
    for a in artifacts:
        an = g.add(Node(f"artifact:{run.ref}:{a['name']}", "artifact", str(a["name"]), "",
                        {"name": a["name"], "digest": a.get("digest"), "artifact_kind": a.get("kind")}))
        g.link(rn.id, an.id, "saved")


# -- used by: downstream ------------------------------------------------------------------------------------
_STATUS = (LIVE, "cleared", "expired")


class _Rows:
    """Entry nodes made from columns, only for the rows shown (a big answer's nodes are made when asked)."""

    def __init__(self, ix: Index) -> None:
        self.ix = ix
        self.c = ix.cols
        self.st = status_of(self.c, ix.cleared, ix._now)

    def nodes(self, rows: np.ndarray) -> list[Node]:
        c = self.c
        keys = hexes(c.key[rows])
        res = hexes(c.result[rows])
        out = []
        for i, k, r in zip(rows.tolist(), keys, res):
            fn = c.strings[c.fn[i]]
            v = c.v[i]
            data = {"key": k, "fn": fn, "version": c.strings[v] if v >= 0 else None,
                    "result": r if c.has[i] & HAS_RESULT else None, "status": _STATUS[self.st[i]],
                    "time": float(c.time[i])}
            if c.label[i] >= 0:
                data["entry_label"] = c.strings[c.label[i]]
            out.append(Node(entry_id(k), "entry", f"{_fn_short(fn)} {k[:12]}", entry_link(fn, k), data))
        return out

    def links(self, g: Graph, src: np.ndarray, dst: np.ndarray, name: np.ndarray) -> None:
        c = self.c
        for a, b, n in zip(hexes(c.key[src]), hexes(c.key[dst]), name.tolist()):
            g.link(entry_id(a), entry_id(b), "result", c.strings[n])


def _pending(g: Graph, rs: _Rows, before: Graph, rows: np.ndarray, e: tuple[np.ndarray, np.ndarray, np.ndarray],
             later: Any, n_after: int, reasons: Any = None) -> Graph:
    """Make ``g`` answer ``before``'s nodes, then the entries of ``rows`` (in that order) with the edges ``e``
    between them, then the ``n_after`` nodes of the graph ``later()`` makes -- each node made when the graph
    is read."""
    made: list[Graph] = []

    def fill(out: Graph, take: np.ndarray, edges: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
        if not made:
            made.append(later())
        after = made[0]
        for n in before._nodes.values():
            out.add(n)
        for n in rs.nodes(take):
            n = out.add(n)
            if reasons is not None:
                n.data["reason"] = reasons(n.data["key"])
        for n in after._nodes.values():
            out.add(n)
        for x in before._edges:
            out.link(x.source, x.target, x.kind, x.label)
        rs.links(out, *edges)
        for x in after._edges:
            out.link(x.source, x.target, x.kind, x.label)

    def head(k: int) -> Graph:
        h = Graph(g.root, g.what)
        take = rows[:k]
        m = np.isin(e[0], take)
        fill(h, take, (e[0][m], e[1][m], e[2][m]))
        for x in list(h._nodes)[k:]:
            del h._nodes[x]
        return h

    extra = sum(1 for n in before._nodes.values() if n.kind != "entry") + n_after
    g.pending = lambda out: fill(out, rows, e)
    g.sizes = (len(rows) + extra, head)
    return g


@bulk
def used_by(target: Any, store: Store | str | None = None) -> Graph:
    """Every entry, run and logged (intercepted) call that consumed ``target`` -- a cached function (``FN`` or ``FN@VERSION``), an entry
    (key prefix), a file (path; ``path@digest`` for one content of it) or a digest (a result's, a file's) --
    transitively. A big answer's nodes are made
    when the graph is read (``len(g)`` and ``g.text(limit)`` make only what they show)."""
    ix = open_index(store if store is not None else getattr(target, "store", None))
    what, found = resolve_rows(ix, target, runs=False)
    g = Graph(str(target) if isinstance(target, str) else "", "used by")
    rs = _Rows(ix)
    c = rs.c
    before = Graph()
    if what == "file":
        items, seeds = file_rows(ix, *found)
        for i, n in zip(items.tolist(), rs.nodes(seeds)):
            p, d = c.strings[c.f_path[i]], c.strings[c.f_d[i]]
            fnode = before.add(file_node(p, d, ix.file_now(p)))
            before.add(n)
            before.link(fnode.id, n.id, "file", c.strings[c.f_param[i]])
    else:
        seeds = np.asarray(found, np.int64)
    seen, order = reach(c, seeds)
    e = downstream(c)
    m = seen[e.src]
    edges = (e.src[m], e.dst[m], e.name[m])
    runs = ix.runs()
    links = [(run, link) for run in runs for link in ix.run_links(run)]
    ix.keep_links()
    used = []
    if links:
        lrows = c.rows_of(np.array([_raw(link["key"]) for _r, link in links], "S16"))
        used = [(run, link) for (run, link), r in zip(links, lrows.tolist()) if r >= 0 and seen[r]]
    calls = _calls_taking(ix, c, seen)

    def later() -> Graph:
        """The runs and logged calls that used what was reached (a run's node made once, when read)."""
        after = Graph()
        made: dict[int, Node] = {}
        for run, link in used:
            rn = made.get(id(run))
            if rn is None:
                rn = made[id(run)] = after.add(run_node(run))
            after.link(entry_id(link["key"]), rn.id, "used", "hit" if link.get("hit") else "computed")
        for call, arg, _d, k in calls:
            cid = f"call:{call.name}:{call.session}:{call.n}"
            after.add(Node(cid, "call", f"{_fn_short(call.name)} #{call.n} (session {call.session})",
                           "/calls?" + urlencode({"fn": call.name, "session": call.session}),
                           {"fn": call.name, "session": call.session, "n": call.n}))
            after.link(entry_id(k), cid, "argument", arg)
        return after

    n_after = len({id(run) for run, _l in used}) + len({(x.name, x.session, x.n) for x, _a, _d, _k in calls})
    return _pending(g, rs, before, order, edges, later, n_after)


def _raw(key: str) -> bytes:
    try:
        b = bytes.fromhex(key)
    except ValueError:
        return b""
    return b if len(b) == 16 else b""


def _calls_taking(ix: Index, c: Any, seen: np.ndarray) -> list[tuple[Any, str, str, str]]:
    """``(logged call, argument, result digest, entry key)`` of the intercepted calls that took the result of a
    reached entry as an argument: a value is stored once by content, so the argument's cell names its digest."""
    calls = ix.calls_taking(None)
    if not calls:
        return []
    rows = np.flatnonzero(seen & ((c.has & HAS_RESULT) > 0))
    res = c.result[rows]
    o = np.argsort(res, kind="stable")
    res, rows = res[o], rows[o]
    out: list[tuple[Any, str, str, str]] = []
    for call, arg, d in calls:
        b = np.array([_raw(d)], "S16")
        lo, hi = int(np.searchsorted(res, b, "left")[0]), int(np.searchsorted(res, b, "right")[0])
        if _raw(d):
            out.extend((call, arg, d, k) for k in hexes(c.key[rows[lo:hi]]))
    return out


# -- stale --------------------------------------------------------------------------------------------------
class Staleness:
    """Why an entry or a run no longer stands for the code and data there are now (None: it does).

    An entry is stale when its function's code changed since it was stored (the newest version record of the
    function is another: a change is seen once the changed code has run once), a file it read changed or is
    gone, or an input came from an entry that is stale, cleared or expired -- unless another live, current
    entry holds that same value (then the input is still true). A run is stale when an entry it read or wrote
    is stale, or was cleared or expired since. A changed parameter makes nothing stale: the old entries still
    answer the calls they were made for.

    Settled for every entry at once, over columns (:func:`casmon.lineage.joins.stale_rows`); the reasons are
    worded only for the entries asked about.
    """

    def __init__(self, ix: Index) -> None:
        self.ix = ix
        c = self.c = ix.cols
        self.st = status_of(c, ix.cleared, ix._now)
        # the code: each row's version against its function's newest version record
        cur = np.full(len(c.strings) + 1, -3, np.int64)  # -3: no version record (nothing to compare)
        for fn, (_t, v) in ix.current.items():
            i = c.sid(fn)
            if i >= 0:
                cur[i] = c.sid(v)  # -2 where no entry has that version
        cv = cur[c.fn]
        self.code = (c.v >= 0) & (cv != -3) & (c.v != cv)
        # the files: each distinct path read once, each distinct (path, digest) judged once
        self.file_bad = np.zeros(len(c.f_path), bool)
        if len(c.f_path):
            pairs, inv = np.unique(np.stack((c.f_path.astype(np.int64), c.f_d.astype(np.int64)), axis=1), axis=0,
                                   return_inverse=True)
            bad = np.array([(lambda now, d: now != d and now != UNKNOWN)(ix.file_now(c.strings[p]), c.strings[d])
                            for p, d in pairs.tolist()], bool)
            self.file_bad = bad[inv.reshape(-1)]
        owner = np.repeat(np.arange(c.n), np.diff(c.f_ptr))
        self.files = np.zeros(c.n, bool)
        self.files[owner[self.file_bad]] = True
        self.g = groups(c)
        self.stale, self.good, self.cnt = stale_rows(c, self.st, self.code | self.files, self.g)
        self.roots: dict[int, str] = {}
        self.why: dict[int, str | None] = {}

    def entry(self, key: str) -> str | None:
        """Why entry ``key`` is stale, or None."""
        i = self.c.row(key)
        return self.reason(i) if i >= 0 else None

    def _src(self, u: int) -> str:
        c = self.c
        return f"{c.strings[c.fn[u]]} entry {short_hex(hexes(c.key[u:u + 1])[0])}"

    def _failing(self, h: int) -> tuple[str, int] | None:
        """The first input of row ``h`` none of whose makers holds it: ``(parameter, its first maker)``."""
        g, c = self.g, self.c
        a, b = np.searchsorted(g.ih, [h, h + 1])
        for u, name in zip(g.iu[a:b].tolist(), g.iname[a:b].tolist()):
            if u < 0 or self.good[u] or (g.cls[u] >= 0 and self.cnt[g.cls[u]] > 0):
                continue
            return c.strings[name], u
        a, b = np.searchsorted(g.ch, [h, h + 1])
        for cc, u, name in zip(g.cc[a:b].tolist(), g.cu[a:b].tolist(), g.cname[a:b].tolist()):
            if self.cnt[cc] == 0:
                return c.strings[name], u
        return None

    def reason(self, h: int) -> str | None:
        """Why row ``h`` is stale, or None; its upstream's reasons first, without recursion."""
        if h in self.why:
            return self.why[h]
        chain = [h]
        while True:
            k = chain[-1]
            got = self._own(k)
            if got is not None or not self.stale[k]:
                self.why[k] = got
                if got is not None:
                    self.roots.setdefault(k, got)
                break
            fail = self._failing(k)
            if fail is None:  # cannot be: stale, and no input fails (crafted cycle)
                self.why[k] = None
                break
            u = fail[1]
            if self.st[u] != 0 or u in self.why or u in chain:
                break
            chain.append(u)
        for k in reversed(chain):
            if k in self.why:
                continue
            fail = self._failing(k)
            if fail is None:
                self.why[k] = None
                continue
            name, u = fail
            src, what = self._src(u), f"its input {name!r}"
            if self.st[u] != 0:
                self.roots[k] = f"{src} was {_STATUS[self.st[u]]}"
                self.why[k] = f"{what} came from {src}, which was {_STATUS[self.st[u]]}"
            else:
                self.roots[k] = root = self.roots.get(u) or "its records link back to it: a cycle"
                self.why[k] = f"{what} came from {src}, which is stale ({root})"
        return self.why[h]

    def _own(self, h: int) -> str | None:
        """Why row ``h`` is stale of itself: its code, or a file it read."""
        c, ix = self.c, self.ix
        if self.code[h]:
            fn, v = c.strings[c.fn[h]], c.strings[c.v[h]]
            cur = ix.current[fn][1]
            old, new = ix.version_parts(fn, v), ix.version_parts(fn, cur)
            diffs = compare_parts(old, new) if old is not None and new is not None else []
            # its own code is what the sentence says already: named again only among other parts
            others = [d for d in diffs if not (d.what == "code" and d.name == fn)]
            if diffs and not others:
                return f"the code of {fn} changed since it was stored"
            what = "; ".join(d.clause() for d in diffs[:3]) or "its version differs"
            return f"the code of {fn} changed since it was stored: {what}"
        if self.files[h]:
            for i in range(int(c.f_ptr[h]), int(c.f_ptr[h + 1])):
                if self.file_bad[i]:
                    path = c.strings[c.f_path[i]]
                    now = ix.file_now(path)
                    detail = file_changed(c.strings[c.f_d[i]], now) if now is not None else "no longer exists"
                    return f"file {path!r}: {detail} (parameter {c.strings[c.f_param[i]]!r})"
        return None

    def run(self, run: RunInfo, rows: list[int] | None = None) -> str | None:
        ix = self.ix
        start = float(run.manifest.get("start") or 0.0)
        links = ix.run_links(run)
        if rows is None:
            rows = self.c.rows_of(np.array([_raw(x["key"]) for x in links], "S16")).tolist() if links else []
        for link, i in zip(links, rows):
            k, fn = link["key"], link["fn"]
            if i < 0:
                if ix.cleared.get(fn, 0.0) > start:
                    return f"its {fn} entry {short_hex(k)} was {CLEARED}"
                continue
            if self.st[i] != 0:
                return f"its {fn} entry {short_hex(k)} was {_STATUS[self.st[i]]}"
            if self.stale[i]:
                self.reason(i)
                return f"its {fn} entry {short_hex(k)} is stale ({self.roots.get(i, '')})"
        return None


@bulk
def stale(store: Store | str | None = None) -> Graph:
    """Entries and runs whose upstream changed since they were made, each node with its ``reason`` (worded as
    ``explain`` words a difference); edges join a stale node to the stale nodes it fed. A big answer's nodes
    (and their reasons) are made when the graph is read."""
    ix = open_index(store)
    s = Staleness(ix)
    c = s.c
    g = Graph(str(ix.store.url) if hasattr(ix.store, "url") else "", "stale")
    rs = _Rows(ix)
    shown = s.stale & (s.st == 0)
    rows = np.flatnonzero(shown)
    own = (s.code | s.files)[rows]
    # the causes first, then what they made stale; each group in the order it was stored, upstream before what
    # it fed (a key's order would list an entry before the one its reason names)
    rows = rows[np.lexsort((rows, c.time[rows], ~own))]
    e = downstream(c)
    m = shown[e.src] & shown[e.dst]
    after = Graph()
    runs = ix.runs()
    links = [(run, ix.run_links(run)) for run in runs]
    ix.keep_links()
    keys = [_raw(x["key"]) for _r, ls in links for x in ls]
    allrows = c.rows_of(np.array(keys, "S16")).tolist() if keys else []
    at = 0
    for run, ls in links:
        why = s.run(run, allrows[at:at + len(ls)])
        at += len(ls)
        if why is not None:
            n = after.add(run_node(run))
            n.data["reason"] = why
            for link in ls:
                k = link["key"]
                i = c.row(k)
                if i >= 0 and shown[i]:
                    after.link(entry_id(k), n.id, "used")
    return _pending(g, rs, Graph(), rows, (e.src[m], e.dst[m], e.name[m]), lambda: after, len(after._nodes),
                    reasons=lambda key: s.entry(key))
