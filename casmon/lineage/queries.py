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

from casmon.caching import resolve_function
from casmon.caching.explain import compare_parts
from casmon.errors import CasmonError
from casmon.lineage.graph import Graph, Node, entry_id, entry_link, file_id, run_id, run_link
from casmon.lineage.index import CLEARED, LIVE, MISSING, UNKNOWN, Index, bulk, short_hex

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


def entry_node(ix: Index, key: str) -> Node:
    r = ix.entry(key)
    st = ix.status(key)
    if r is None:
        return Node(entry_id(key), "entry", f"missing entry {short_hex(key)}", "", {"key": key, "status": MISSING})
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
    version ``FN@VERSION``, a result digest) or ``("file", (path, digest or None))``. LookupError, in one line, if nothing."""
    from casmon.runs import RunInfo

    if isinstance(target, RunInfo):
        return "run", target
    if hasattr(target, "key") and hasattr(target, "entry"):  # a ResultRef
        return "entries", [bytes(target.key).hex()]
    state = getattr(target, "__casmon_cache__", None)
    if state is not None:
        target = state.name
    if not isinstance(target, str) or not target:
        raise LookupError(f"lineage: {target!r} names no run, cached function, entry, file or digest")
    t = target.strip()
    low = t.lower()
    if len(low) >= PREFIX_MIN and not low.strip("0123456789abcdef"):
        if len(low) == 32 and ix.entry(low) is not None:
            return "entries", [low]  # a whole key: one lookup, not a read of every entry
        keys = [k for k in ix.entries if k.startswith(low)]
        keys += [k for d, ks in ix.by_result.items() if d.startswith(low) for k in ks]
        keys += [k for d, ks in ix.by_rf.items() if d.startswith(low) for k in ks]
        if keys:
            return "entries", list(dict.fromkeys(keys))
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
    try:
        full = resolve_function(ix.by_fn, fn)
    except LookupError as e:
        full = None
        why = str(e)
    if full is not None:
        keys = [k for k in ix.by_fn[full] if not version or str(ix.entries[k].get("v", "")).startswith(version)]
        if not keys:
            raise LookupError(f"{full} has no entry of code version {version!r}")
        return "entries", keys
    paths = {p for p, _d in _all_files(ix)}
    if t in paths or os.path.abspath(t) in paths:
        return "file", (t if t in paths else os.path.abspath(t), None)
    raise LookupError(f"{t!r} names no run, cached function, entry, file or digest ({why})")


def _all_files(ix: Index) -> list[tuple[str, str]]:
    return [(p, d) for k in ix.entries for _n, p, d in ix.files(k)]


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
            g.add(entry_node(ix, k))
            g.link(entry_id(k), rn.id, "used", "hit" if link.get("hit") else "computed")
            keys.append(k)
        _upstream_into(ix, g, keys)
        _run_own_into(g, found, rn)
        return g
    if what == "file":
        g = Graph(found[0])
        for k in ix.entries:
            for _param, p, d in ix.files(k):
                if p == found[0] and found[1] in (None, d):
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
@bulk
def used_by(target: Any, store: Store | str | None = None) -> Graph:
    """Every entry, run and logged (intercepted) call that consumed ``target`` -- a cached function (``FN`` or ``FN@VERSION``), an entry
    (key prefix), a file (path) or a digest (a result's, a file's) -- transitively."""
    ix = open_index(store if store is not None else getattr(target, "store", None))
    what, found = resolve(ix, target, runs=False)
    g = Graph(str(target) if isinstance(target, str) else "", "used by")
    seeds: list[str] = []
    if what == "file":
        path, digest = found
        for k in ix.entries:
            for param, p, d in ix.files(k):
                if p == path and digest in (None, d):
                    fnode = g.add(file_node(p, d, ix.file_now(p)))
                    g.add(entry_node(ix, k))
                    g.link(fnode.id, entry_id(k), "file", param)
                    seeds.append(k)
    else:
        seeds = list(found)
        for k in seeds:
            g.add(entry_node(ix, k))
    todo, done = list(seeds), set()
    while todo:
        k = todo.pop()
        if k in done:
            continue
        done.add(k)
        for param, d in ix.downstream(k):
            g.add(entry_node(ix, d))
            g.link(entry_id(k), entry_id(d), "result", param)
            todo.append(d)
    for run in ix.runs():
        for link in ix.run_links(run):
            if link["key"] in done:
                rn = g.add(run_node(run))
                g.link(entry_id(link["key"]), rn.id, "used", "hit" if link.get("hit") else "computed")
    results: dict[str, list[str]] = {}
    for k in done:
        res = (ix.entry(k) or {}).get("result")
        if isinstance(res, str):
            results.setdefault(res, []).append(k)
    for call, arg, d in ix.calls_taking(set(results)):
        cid = f"call:{call.name}:{call.session}:{call.n}"
        g.add(Node(cid, "call", f"{_fn_short(call.name)} #{call.n} (session {call.session})",
                   "/calls?" + urlencode({"fn": call.name, "session": call.session}),
                   {"fn": call.name, "session": call.session, "n": call.n}))
        for k in results[d]:
            g.link(entry_id(k), cid, "argument", arg)
    return g


# -- stale --------------------------------------------------------------------------------------------------
class Staleness:
    """Why an entry or a run no longer stands for the code and data there are now (None: it does).

    An entry is stale when its function's code changed since it was stored (the newest version record of the
    function is another: a change is seen once the changed code has run once), a file it read changed or is
    gone, or an input came from an entry that is stale, cleared or expired -- unless another live, current
    entry holds that same value (then the input is still true). A run is stale when an entry it read or wrote
    is stale, or was cleared or expired since. A changed parameter makes nothing stale: the old entries still
    answer the calls they were made for.
    """

    def __init__(self, ix: Index) -> None:
        self.ix = ix
        self.memo: dict[str, str | None] = {}
        self.roots: dict[str, str] = {}  # key -> the reason where its staleness starts (a code, file, clear)

    def entry(self, key: str) -> str | None:
        """Why entry ``key`` is stale, or None. Its upstream is settled first, without recursion: a chain of
        100,000 cached steps (``state = step(state)``) is no deeper than one."""
        if key in self.memo:
            return self.memo[key]
        stack, opened = [key], set()
        while stack:
            k = stack[-1]
            if k in self.memo:
                stack.pop()
                continue
            if k not in opened:
                opened.add(k)
                todo = [d for d in self._deps(k) if d not in self.memo and d not in opened]
                if todo:
                    stack.extend(todo)
                    continue
            stack.pop()
            self.memo[k] = None  # a cycle (crafted records) ends here
            why = self._entry(k)
            self.memo[k] = why
            if why is not None:
                self.roots.setdefault(k, why)
        return self.memo[key]

    def _deps(self, key: str) -> list[str]:
        """The entries whose staleness this one's depends on: its inputs' makers, and the entries holding the
        same values."""
        ix = self.ix
        out = []
        for _p, us in ix.upstream_groups(key):
            for u in us:
                out.append(u)
                rf = (ix.entry(u) or {}).get("rf")
                if rf is not None:
                    out.extend(ix.by_rf.get(rf, ()))
        return out

    def _entry(self, key: str) -> str | None:
        ix = self.ix
        r = ix.entry(key)
        if r is None:
            return None
        fn = str(r.get("fn", "?"))
        v, cur = r.get("v"), ix.current.get(fn)
        if isinstance(v, str) and cur is not None and cur[1] != v:
            old, new = ix.version_parts(fn, v), ix.version_parts(fn, cur[1])
            diffs = compare_parts(old, new) if old is not None and new is not None else []
            what = "; ".join(d.clause() for d in diffs[:3]) or "its version differs"
            return f"the code of {fn} changed since it was stored: {what}"
        for param, path, d in ix.files(key):
            now = ix.file_now(path)
            if now != d and now != UNKNOWN:
                detail = "its content changed" if now is not None else "no longer exists"
                return f"file {path!r} {detail} (parameter {param!r})"
        for param, us in ix.upstream_groups(key):
            if any(self._holds(u) for u in us):
                continue
            u = us[0]
            st = ix.status(u)
            ur = ix.entry(u) or {}
            src = f"{ur.get('fn', '?')} entry {short_hex(u)}"
            name = f"its input {param!r}"
            if st == MISSING:
                continue  # gone from the store (collected): shown in lineage as missing, not a change
            if st != LIVE:
                self.roots[key] = f"{src} was {st}"
                return f"{name} came from {src}, which was {st}"
            self.roots[key] = root = self.roots.get(u, "")
            return f"{name} came from {src}, which is stale ({root})"
        return None

    def _holds(self, key: str) -> bool:
        """Whether a live entry that is not stale holds ``key``'s result (it, or another with the same value)."""
        ix = self.ix
        if ix.status(key) == MISSING:
            return True
        if ix.status(key) == LIVE and self.memo.get(key) is None:  # settled before (entry() saw to it)
            return True
        rf = (ix.entry(key) or {}).get("rf")
        if not isinstance(rf, str):
            return False
        return any(h != key and ix.status(h) == LIVE and self.memo.get(h) is None for h in ix.by_rf.get(rf, ()))

    def run(self, run: RunInfo) -> str | None:
        ix = self.ix
        start = float(run.manifest.get("start") or 0.0)
        for link in ix.run_links(run):
            k, fn = link["key"], link["fn"]
            st = ix.status(k)
            if st == MISSING:
                if ix.cleared.get(fn, 0.0) > start:
                    return f"its {fn} entry {short_hex(k)} was {CLEARED}"
                continue
            if st != LIVE:
                return f"its {fn} entry {short_hex(k)} was {st}"
            if self.entry(k) is not None:
                return f"its {fn} entry {short_hex(k)} is stale ({self.roots.get(k, '')})"
        return None


@bulk
def stale(store: Store | str | None = None) -> Graph:
    """Entries and runs whose upstream changed since they were made, each node with its ``reason`` (worded as
    ``explain`` words a difference); edges join a stale node to the stale nodes it fed."""
    ix = open_index(store)
    s = Staleness(ix)
    g = Graph(str(ix.store.url) if hasattr(ix.store, "url") else "", "stale")
    for k in ix.entries:
        if ix.status(k) != LIVE:
            continue
        why = s.entry(k)
        if why is not None:
            n = g.add(entry_node(ix, k))
            n.data["reason"] = why
    for k in list(g.nodes):
        for param, u in ix.upstream(k.split(":", 1)[1]):
            if entry_id(u) in g.nodes:
                g.link(entry_id(u), k, "result", param)
    for run in ix.runs():
        why = s.run(run)
        if why is not None:
            n = g.add(run_node(run))
            n.data["reason"] = why
            for link in ix.run_links(run):
                if entry_id(link["key"]) in g.nodes:
                    g.link(entry_id(link["key"]), n.id, "used")
    return g
