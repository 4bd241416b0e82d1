"""Lineage in the UI: the lineage panel's graph (laid out here, drawn by ``static/casmon-lineage.js``), the "used
by" lists, the file page and the compare page's first difference in lineage.

The panels and lists are filled from ``/api/lineage/...`` and ``/api/used-by/...`` only when they come into
view, so a page pays nothing for lineage until it is looked at. The layout is casmon's own: nodes are put in
columns by the longest path from the sources (upstream left), ordered in each column by the barycentre of their
neighbours, a few sweeps each way; a graph over :data:`MAX_NODES` keeps the nodes nearest the root and says how
many more there are. Every string stays data: the script sets it as text, never as markup.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlencode

from casmon.errors import CasmonError
from casmon.lineage import FirstDifference, Graph, Index, first_difference, lineage, used_by
from casmon.lineage.graph import entry_id, run_id
from casmon.ui.cachepage import differences_html, entry_url
from casmon.ui.pages import Ctx, heading, layout, url
from casmon.view import display
from casmon.view.display import Html, code, esc, kv_table

#: Nodes one panel draws; the rest are counted ("N more").
MAX_NODES = 60
#: Items one page of a "used by" list holds.
USED_BY_PER = 50
#: Barycentre sweeps (each down and up): enough for a graph of dozens of nodes.
SWEEPS = 4
SCRIPT = "casmon-lineage.js"
#: First differences in lineage on one compare page: the first run against each of this many others.
MAX_PAIRS = 10


def same_index(ix: Index) -> Any:
    """The queries take an open :class:`Index` for their store (``open_index``): the request's one read of the
    records serves each query it makes."""
    return ix


# -- the graph, laid out ----------------------------------------------------------------------------------------
def _ui_link(n: dict[str, Any]) -> str:
    """The page a node opens: an entry's page, a run's, a file's (a missing entry has none)."""
    if n["kind"] == "file" and isinstance(n.get("path"), str):
        return file_url(n["path"], n.get("digest") if isinstance(n.get("digest"), str) else None)
    if n["kind"] == "entry" and n.get("status") == "missing":
        return ""
    link = str(n.get("link") or "")
    return link if link.startswith("/") and not link.startswith("//") else ""  # this UI's pages only


def file_url(path: str, digest: str | None, page: str = "/file") -> str:
    return page + "?" + urlencode([("path", path)] + ([("digest", digest)] if digest else []))


def _sub(n: dict[str, Any]) -> str:
    """The node's second line: what it is, in a few words."""
    kind, st = n["kind"], n.get("status")
    if kind == "entry":
        if st == "missing":
            return "missing: cleared or collected"
        v = n.get("version")
        text = f"code {str(v)[:8]}" if isinstance(v, str) else "code version not recorded"
        return text + (f" · {st}" if st and st != "live" else "")
    if kind == "file":
        d = str(n.get("digest") or "")[:12]
        return d + (" · changed since" if n.get("changed") else "")
    if kind == "run":
        return f"run · {n.get('status', '')}"
    return kind


def _nearest(nodes: list[str], edges: list[tuple[str, str]], root: str) -> list[str]:
    """Nodes by their distance from ``root`` along edges either way (unreached ones last, in order)."""
    adj: dict[str, list[str]] = {n: [] for n in nodes}
    for s, t in edges:
        adj[s].append(t)
        adj[t].append(s)
    seen = {root} if root in adj else set()
    order = [root] if root in adj else []
    i = 0
    while i < len(order):
        for m in adj[order[i]]:
            if m not in seen:
                seen.add(m)
                order.append(m)
        i += 1
    return order + [n for n in nodes if n not in seen]


def _layers(nodes: list[str], edges: list[tuple[str, str]]) -> dict[str, int]:
    """Longest-path layering from the sources; an edge that closes a cycle (crafted records) is ignored."""
    out: dict[str, list[str]] = {n: [] for n in nodes}
    indeg = {n: 0 for n in nodes}
    for s, t in edges:
        out[s].append(t)
        indeg[t] += 1
    layer = {n: 0 for n in nodes}
    todo = [n for n in nodes if indeg[n] == 0]
    done: set[str] = set()
    while len(done) < len(nodes):
        if not todo:  # a cycle: start again from the first node left
            todo = [next(n for n in nodes if n not in done)]
        while todo:
            n = todo.pop()
            if n in done:
                continue
            done.add(n)
            for m in out[n]:
                if m in done:
                    continue
                layer[m] = max(layer[m], layer[n] + 1)
                indeg[m] -= 1
                if indeg[m] <= 0:
                    todo.append(m)
    for n in nodes:  # a source sits just before its first consumer (a run's params beside the run), not far left
        if not any(t == n for _s, t in edges) and out[n]:
            layer[n] = max(0, min(layer[m] for m in out[n]) - 1)
    return layer


def _order(layer: dict[str, int], edges: list[tuple[str, str]], nodes: list[str]) -> list[list[str]]:
    """Each column's nodes, ordered by the barycentre of their neighbours in the column before (then after)."""
    used = {v: i for i, v in enumerate(sorted(set(layer.values())))}  # no empty column
    cols: list[list[str]] = [[] for _ in used]
    for n in nodes:
        cols[used[layer[n]]].append(n)
    ins: dict[str, list[str]] = {n: [] for n in nodes}
    outs: dict[str, list[str]] = {n: [] for n in nodes}
    for s, t in edges:
        ins[t].append(s)
        outs[s].append(t)
    for sweep in range(SWEEPS * 2):
        down = sweep % 2 == 0
        rng = range(1, len(cols)) if down else range(len(cols) - 2, -1, -1)
        for i in rng:
            pos = {n: j for j, n in enumerate(cols[i - 1 if down else i + 1])}
            cur = {n: j for j, n in enumerate(cols[i])}

            def bary(n: str) -> float:
                ps = [pos[m] for m in (ins[n] if down else outs[n]) if m in pos]
                return sum(ps) / len(ps) if ps else float(cur[n])

            cols[i].sort(key=lambda n: (bary(n), cur[n]))
    return cols


def graph_json(g: Graph, root: str, cap: int = MAX_NODES) -> dict[str, Any]:
    """The graph as the panel draws it: nodes with ``kind``, ``label``, ``sub``, ``link``, ``missing``, ``col``,
    ``row``; edges ``from``/``to``/``kind``/``label``; ``more``: nodes left out (over ``cap``)."""
    d = g.to_dict()
    all_nodes = {n["id"]: n for n in d["nodes"]}
    pairs = [(e["from"], e["to"]) for e in d["edges"] if e["from"] in all_nodes and e["to"] in all_nodes]
    kept_ids = _nearest(list(all_nodes), pairs, root)[:cap]
    kept = set(kept_ids)
    edges = [e for e in d["edges"] if e["from"] in kept and e["to"] in kept and e["from"] != e["to"]]
    # A run used every entry of its pipeline; an edge from an entry whose consumer the run used too is implied by
    # that consumer's, and drawn it would cross every column between.
    used = {(e["from"], e["to"]) for e in edges if e["kind"] == "used"}
    feeds: dict[str, set[str]] = {}
    for e in edges:
        if e["kind"] != "used":
            feeds.setdefault(e["from"], set()).add(e["to"])
    edges = [e for e in edges if e["kind"] != "used" or not any((t, e["to"]) in used for t in feeds.get(e["from"], ()))]
    epairs = list(dict.fromkeys((e["from"], e["to"]) for e in edges))
    layer = _layers(kept_ids, epairs)
    cols = _order(layer, epairs, kept_ids)
    nodes = []
    for c, col in enumerate(cols):
        for r, nid in enumerate(col):
            n = all_nodes[nid]
            nodes.append({"id": nid, "kind": n["kind"], "label": str(n.get("label", "")), "sub": _sub(n),
                          "link": _ui_link(n), "missing": n["kind"] == "entry" and n.get("status") == "missing",
                          "status": n.get("status"), "root": nid == root, "col": c, "row": r})
    return {"root": root, "nodes": nodes,
            "edges": [{"from": e["from"], "to": e["to"], "kind": e["kind"], "label": e.get("label") or ""}
                      for e in edges],
            "more": len(all_nodes) - len(kept_ids), "columns": len(cols), "rows": max((len(c) for c in cols), default=0)}


def run_lineage(ix: Index, run: Any) -> dict[str, Any]:
    return graph_json(lineage(run, same_index(ix)), run_id(run.ref))


def entry_lineage(ix: Index, key: str) -> dict[str, Any]:
    """An entry's upstream; LookupError (a 404) for a key that is no entry."""
    if ix.entry(key) is None:
        raise LookupError(f"no cache entry {key}")
    return graph_json(lineage(key, same_index(ix)), entry_id(key))


# -- used by ------------------------------------------------------------------------------------------------
def _downstream_of(g: Graph, seeds: set[str]) -> list[dict[str, Any]]:
    """The nodes reached from ``seeds`` along the graph's edges (seeds left out), nearest first."""
    out: dict[str, list[str]] = {}
    for e in g.edges:
        out.setdefault(e.source, []).append(e.target)
    order, seen = list(seeds), set(seeds)
    i = 0
    while i < len(order):
        for m in out.get(order[i], ()):
            if m not in seen:
                seen.add(m)
                order.append(m)
        i += 1
    return [g.nodes[n].to_dict() for n in order if n not in seeds and n in g.nodes]


def used_by_json(items: list[dict[str, Any]], page: int, per: int = USED_BY_PER) -> dict[str, Any]:
    """One page of a "used by" list: entries, runs and logged calls downstream, each with its page."""
    shown = items[(page - 1) * per: page * per]
    rows = [{"kind": n["kind"], "label": str(n.get("label", "")), "sub": _sub(n), "link": _ui_link(n)} for n in shown]
    return {"items": rows, "total": len(items), "page": page, "per": per,
            "next": page + 1 if page * per < len(items) else None}


def entry_used_by(ix: Index, key: str) -> list[dict[str, Any]]:
    if ix.entry(key) is None:
        raise LookupError(f"no cache entry {key}")
    return _downstream_of(used_by(key, same_index(ix)), {entry_id(key)})


def file_used_by(ix: Index, path: str, digest: str | None) -> list[dict[str, Any]]:
    """What read the file (that content of it, when ``digest`` is given), and what used that, transitively."""
    if not file_versions(ix, path):
        raise LookupError(f"no cache entry read a file {path!r}")
    g = used_by(path, same_index(ix))
    seeds = {n.id for n in g.nodes.values() if n.kind == "file" and digest in (None, n.data.get("digest"))}
    if not seeds:
        raise LookupError(f"no cache entry read {path!r} with content {digest}")
    return _downstream_of(g, seeds)


def file_versions(ix: Index, path: str) -> dict[str, int]:
    """Digest -> how many entries read ``path`` with that content."""
    import numpy as np

    c = ix.cols
    ds, n = np.unique(c.f_d[c.f_path == c.sid(path)], return_counts=True)
    return {c.strings[d]: k for d, k in zip(ds.tolist(), n.tolist())}


# -- HTML -------------------------------------------------------------------------------------------------------
def panel(ctx: Ctx, src: str, what: str) -> Html:
    """The lineage panel: empty until the script loads ``src`` as the panel comes into view."""
    if ctx.standalone:
        return Html("")
    return Html(f'{heading("Lineage", 2, "lineage")}<p class="muted">where {esc(what)} came from: cached calls '
                "(function and code version), files (path and digest), parameters; each box opens its page. "
                "Upstream is on the left.</p>"
                f'<div class="lineage-panel" data-src="{esc(src)}"><p class="muted lineage-wait">lineage loads when '
                'shown</p><noscript><p class="muted">The lineage graph needs JavaScript.</p></noscript></div>')


def used_by_list(ctx: Ctx, src: str, what: str) -> Html:
    if ctx.standalone:
        return Html("")
    return Html(f'{heading("Used by", 2, "used-by")}<p class="muted">the cached calls, runs and logged calls '
                f"downstream of {esc(what)}, transitively</p>"
                f'<div class="used-by" data-src="{esc(src)}"><p class="muted lineage-wait">loads when shown</p></div>')


def file_page(ctx: Ctx, path: str, digest: str | None, versions: dict[str, int], now: str | None) -> bytes:
    state = ("gone" if now is None else "cannot be read here" if now == "unknown" else
             "as recorded" if digest is not None and now == digest else
             "changed since" if digest is not None else display.hexshort(now, 16))
    pairs: list[tuple[str, Any]] = [("path", code(path)), ("name", os.path.basename(path) or path)]
    if digest is not None:
        pairs.append(("content digest", code(digest)))
    pairs.append(("now", state))
    rows = "".join(f'<tr><td>{ctx.link(file_url(path, d), code(display.hexshort(d, 16)))}</td>'
                   f'<td class="num">{n:,}</td></tr>' for d, n in sorted(versions.items()))
    body = [Html(f"<h1>File <code>{esc(os.path.basename(path) or path)}</code></h1>"), kv_table(pairs),
            heading("Contents recorded", 2, "versions"),
            Html(f'<table id="file-versions"><tr><th>digest</th><th>entries that read it</th></tr>{rows}</table>'),
            used_by_list(ctx, file_url(path, digest, "/api/used-by/file"), "this file" if digest is None
                         else "this content of the file")]
    return layout(ctx, f"file {os.path.basename(path)}", Html("".join(display.cell(x) for x in body)), "Cache",
                  scripts=[SCRIPT])


def first_differences(store: Any, runs: list[Any]) -> list[tuple[str, FirstDifference | None, str]]:
    """The first difference in lineage of the first run and each other (at most :data:`MAX_PAIRS`), over one read
    of the records; records that cannot be joined are said, never a failed page."""
    if len(runs) < 2:
        return []
    ix = Index(store)
    out: list[tuple[str, FirstDifference | None, str]] = []
    for other in runs[1:1 + MAX_PAIRS]:
        pair = f"{runs[0].name} → {other.name}"
        try:
            out.append((pair, first_difference(runs[0], other, same_index(ix)), ""))
        except (CasmonError, LookupError, ValueError, TypeError) as e:
            out.append((pair, None, f"{type(e).__name__}: {e}"))
    return out


def first_difference_html(ctx: Ctx, got: list[tuple[str, FirstDifference | None, str]]) -> Html:
    """The compare page's "first difference in lineage", one section per pair of runs (``(other, answer, why
    it could not be told)``)."""
    if not got:
        return Html("")
    out = [str(heading("First difference in lineage", 2, "first-difference")),
           '<p class="muted">walking both runs\' cached calls from their outputs upstream: the earliest calls whose '
           "code, parameters or files differ</p>"]
    for pair, fd, why in got:
        out.append(f'<section class="first-difference" data-pair="{esc(pair)}">')
        if fd is None:
            out.append(str(display.error_line(f"{pair}: cannot be told: {why}")))
        elif not fd.partings:
            out.append(f'<p class="muted"><b>{esc(pair)}</b>: none (their cached calls agree)</p>')
        else:
            out.append(f"<h3>{esc(pair)}</h3>")
            for p in fd.partings:
                links = " → ".join(str(ctx.link(entry_url(fn, k), code(display.hexshort(k)))) if k else
                                   '<span class="muted">(no call)</span>' for fn, k in ((p.fn_a or p.fn, p.a), (p.fn, p.b)))
                names = f'{ctx.link(url("/cache", fn=p.fn_a), code(p.fn_a))} → ' if p.fn_a else ""  # a script's, imported
                out.append(f'<div class="parting" data-fn="{esc(p.fn)}"><h4>{names}{ctx.link(url("/cache", fn=p.fn), code(p.fn))}'
                           f' <span class="muted">{links}</span></h4>'
                           f'{differences_html(p.differences, f"in {fd.a}", f"in {fd.b}")}</div>')
        out.append("</section>")
    return Html("".join(out))
