"""The UI's pages as HTML: runs, compare, run, calls, one call, cache, store; and the report file.

Every string from a store goes through :func:`casmon.view.display.esc` (or a
display building block that does); markup built here is
:class:`~casmon.view.display.Html`. Links and form fields are built with
``urllib.parse.quote``/``urlencode`` and then escaped for the attribute. The
pages use no inline script and no ``style=`` attribute (the server's
Content-Security-Policy forbids both); ``static/`` holds the one style sheet and
the one small script, which the report file inlines under a policy of hashes.
"""

from __future__ import annotations

import base64
import hashlib
import math
from importlib import resources
from typing import Any
from urllib.parse import quote, urlencode

from casmon.view import display
from casmon.view.display import Html, code, esc, kv_table, patch_html, seconds, status_badge, table, when
from casmon.view.text import plural, short_repr, size
from casmon.ui import charts, model

_STATIC = {"casmon-ui.css": "text/css; charset=utf-8", "casmon-ui.js": "text/javascript; charset=utf-8"}


def static_file(name: str) -> tuple[bytes, str] | None:
    """A file of ``static/`` (a fixed list: nothing else is ever read); the style sheet leads with display's."""
    if name not in _STATIC:
        return None
    data = resources.files(__package__).joinpath("static", name).read_bytes()
    if name.endswith(".css"):
        data = display.CSS.encode() + data
    return data, _STATIC[name]


def _bundled(name: str) -> str:
    """A static file's text, for a page that inlines it (one of the fixed list, so it is there)."""
    got = static_file(name)
    if got is None:
        raise LookupError(f"no static file {name!r}")
    return got[0].decode()


def csp_hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


#: display's views carry their own <style> (for notebooks); the policy allows exactly that one.
DISPLAY_STYLE = csp_hash(display.CSS)
CSP = ("default-src 'none'; script-src 'self'; style-src 'self' " + DISPLAY_STYLE + "; img-src 'self' data:; "
       "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'")


class Ctx:
    """What every page needs: the store's name, trust, and whether links lead anywhere (not in a report file)."""

    def __init__(self, store_url: str, trust: bool = False, standalone: bool = False) -> None:
        self.store_url = store_url
        self.trust = trust
        self.standalone = standalone

    def link(self, href: str, text: Any, cls: str = "") -> Html:
        c = f' class="{esc(cls)}"' if cls else ""
        if self.standalone:
            return Html(f"<span{c}>{display.cell(text)}</span>")
        return Html(f'<a href="{esc(href)}"{c}>{display.cell(text)}</a>')


def url(path: str, **params: Any) -> str:
    """A URL of this UI; lists become repeated parameters, None is left out."""
    items = []
    for k, v in params.items():
        if v is None or v == "":
            continue
        for x in (v if isinstance(v, (list, tuple)) else [v]):
            items.append((k, str(x)))
    return path + ("?" + urlencode(items) if items else "")


def run_url(tail: str) -> str:
    return "/run/" + quote(tail, safe="")


ACTIVE, NUM = ' class="active"', ' class="num"'


def layout(ctx: Ctx, title: str, body: Any, active: str = "") -> bytes:
    nav = "".join(
        f'<a href="{href}"{ACTIVE if name == active else ""}>{name}</a>'
        for name, href in (("Runs", "/"), ("Calls", "/calls"), ("Cache", "/cache"), ("Store", "/store")))
    trust = '<span class="badge warn">--trust: pickles are loaded</span>' if ctx.trust else ""
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<title>{esc(title)} · casmon</title><link rel="icon" href="data:,">'
            f'<link rel="stylesheet" href="/static/casmon-ui.css"><script src="/static/casmon-ui.js" defer></script>'
            f'</head><body><header class="top"><span class="brand">casmon</span><nav>{nav}</nav>'
            f'<span class="store">{esc(ctx.store_url)}</span>{trust}</header>'
            f'<main class="casmon-view">{display.cell(body)}</main></body></html>').encode("utf-8")


def error_page(ctx: Ctx, status: int, message: str) -> bytes:
    return layout(ctx, f"{status}", Html(f'<h1>{status}</h1><p class="casmon-error" id="error">{esc(message)}</p>'))


def _h(text: str, level: int = 2, id_: str = "") -> Html:
    i = f' id="{esc(id_)}"' if id_ else ""
    return Html(f"<h{level}{i}>{esc(text)}</h{level}>")


def _cellv(v: Any, limit: int = 60) -> Html:
    """A value in a table cell: numbers right as they are, anything else its (cut) text, escaped."""
    if v is None:
        return Html("")
    if isinstance(v, bool):
        return Html(esc("yes" if v else "no"))
    if isinstance(v, float):
        return Html(esc(charts.fmt(v)))
    return Html(esc(display.show(v, limit)))


# -- runs ---------------------------------------------------------------------------------------------


_LABELS = {"run": "run", "comment": "comment", "status": "status", "start": "started", "duration": "duration",
           "commit": "commit", "dirty": "dirty"}


def runs_page(ctx: Ctx, view: model.RunsView, sort: str, desc: bool, q: str, per: int) -> bytes:
    cols = model.FIXED_COLUMNS + view.columns

    def head(col: str) -> str:
        label = _LABELS.get(col, col[5:] if col.startswith("info.") else col)
        new_desc = not desc if col == sort else col in ("start", "duration") or col.startswith("info.")
        arrow = (" ▼" if desc else " ▲") if col == sort else ""
        href = url("/", sort=col, order="desc" if new_desc else "asc", q=q or None, per=per if per != 50 else None)
        return (f'<th data-col="{esc(col)}"{NUM if col.startswith("info.") else ""}>'
                f'<a href="{esc(href)}">{esc(label)}{arrow}</a></th>')

    rows = []
    for e, r, row in view.rows:
        cells = [f'<td><input type="checkbox" name="run" value="{esc(e.tail)}" aria-label="select {esc(e.name)}"></td>',
                 f'<td class="name">{ctx.link(run_url(e.tail), e.name)}</td>',
                 f"<td>{esc(display.show(row['comment'], 80))}</td>",
                 f"<td>{status_badge(row['status'])}</td>",
                 f"<td>{esc(when(row['start']))}</td>",
                 f'<td class="num">{esc(seconds(row["duration"]))}</td>',
                 f"<td><code>{esc(display.hexshort(row['commit'], 10))}</code></td>",
                 f"<td>{'yes' if row['dirty'] else ''}</td>"]
        cells += [f'<td class="num">{_cellv(row.get(c))}</td>' for c in view.columns]
        rows.append(f'<tr data-run="{esc(e.tail)}">' + "".join(cells) + "</tr>")
    pager = _pager(view, sort, desc, q, per)
    filt = (f'<form class="filter" method="get" action="/"><input type="hidden" name="sort" value="{esc(sort)}">'
            f'<input type="hidden" name="order" value="{"desc" if desc else "asc"}">'
            f'<input type="search" name="q" value="{esc(q)}" placeholder="filter: words, or loss&lt;0.3 status=ok" '
            f'size="40" aria-label="filter"><button type="submit">Filter</button></form>')
    shown = f"{view.total:,} of {view.all_runs:,} runs" if q else plural(view.all_runs, "run")
    body = Html(
        f"<h1>Runs <span class=\"muted\">{esc(shown)}</span></h1>{filt}"
        f'<form id="compare-form" method="get" action="/compare">'
        f'<p><button type="submit" id="compare-button">Compare selected runs</button> '
        f'<span class="muted">select two or more</span></p>'
        f'<table class="runs" id="runs"><thead><tr><th></th>{"".join(head(c) for c in cols)}</tr></thead>'
        f'<tbody>{"".join(rows)}</tbody></table></form>{pager}')
    return layout(ctx, "Runs", body, "Runs")


def _pager(view: model.RunsView, sort: str, desc: bool, q: str, per: int) -> str:
    if view.pages <= 1:
        return ""

    def go(p: int, text: str) -> str:
        href = url("/", sort=sort, order="desc" if desc else "asc", q=q or None, page=p, per=per if per != 50 else None)
        return f'<a href="{esc(href)}">{esc(text)}</a>'

    parts = []
    if view.page > 1:
        parts += [go(1, "« first"), go(view.page - 1, "‹ previous")]
    parts.append(f'<span class="current">page {view.page:,} of {view.pages:,}</span>')
    if view.page < view.pages:
        parts += [go(view.page + 1, "next ›"), go(view.pages, "last »")]
    return '<nav class="pager">' + " ".join(parts) + "</nav>"


# -- compare ------------------------------------------------------------------------------------------


def compare_body(ctx: Ctx, cmp: model.Comparison, tails: list[str], metric: str | None) -> Html:
    names = [r.name for r in cmp.runs]
    ref = names[0]
    out: list[str] = [f"<h1>Compare {len(names)} runs</h1>",
                      "<p>" + ", ".join(str(ctx.link(run_url(t), n, "run-link")) for t, n in zip(tails, names))
                      + f' <span class="muted">(differences are against {esc(ref)})</span></p>']
    out.append(str(_summary(cmp)))
    # metrics side by side
    rows = []
    for k in cmp.keys:
        cls = ' class="differs"' if cmp.differs[k] else ""
        cells = "".join(f'<td class="num">{_cellv(v, 80)}</td>' for v in cmp.cells[k])
        rows.append(f'<tr{cls} data-key="{esc(k)}"><th>{esc(k)}</th>{cells}</tr>')
    out.append(str(_h("Metrics and info", 2, "metrics")))
    if rows:
        out.append(f'<table class="metrics"><thead><tr><th>key</th>{"".join(f"<th>{esc(n)}</th>" for n in names)}'
                   f'</tr></thead><tbody>{"".join(rows)}</tbody></table>')
    else:
        out.append('<p class="muted">None of these runs recorded info.</p>')
    # a chart of a metric across runs
    if cmp.metrics:
        chosen = metric if metric in cmp.metrics else next((k for k in cmp.metrics if cmp.differs[k]), cmp.metrics[0])
        opts = "".join(f'<option value="{esc(k)}"{" selected" if k == chosen else ""}>{esc(k)}</option>' for k in cmp.metrics)
        hidden = "".join(f'<input type="hidden" name="run" value="{esc(t)}">' for t in tails)
        out.append(str(_h("A metric across runs", 2, "chart")))
        choice = f'<label>metric <select name="metric" id="metric-select">{opts}</select></label>'
        if ctx.standalone:  # a file has no server to ask: the script shows the chosen chart (all show without it)
            out.append(f'<p class="metric-choice">{choice}</p>')
        else:
            out.append(f'<form class="metric-choice" method="get" action="/compare">{hidden}{choice}'
                       f'<noscript><button type="submit">Show</button></noscript></form>')
        for k in cmp.metrics:
            vals = [(n, v) for n, v in zip(names, cmp.cells[k]) if model.is_number(v) and type(v) is not bool]
            hide = "" if k == chosen else " hidden"
            out.append(f'<figure class="metric-chart" data-metric="{esc(k)}"{hide}>'
                       f'{charts.bars([n for n, _ in vals], [float(v) for _, v in vals], k)}</figure>')
    if cmp.sequences:
        out.append(str(_h("Curves", 2, "curves")))
        for k, seqs in cmp.sequences.items():
            note = "".join(f" {esc(s.run)}: {s.length:,} points, drawn from {len(s.ys):,}." for s in seqs
                           if s.length > len(s.ys))
            out.append(f'<figure class="curve" data-key="{esc(k)}">'
                       f'{charts.lines([(s.run, s.xs, s.ys) for s in seqs], k)}'
                       f'{f"<figcaption>{note}</figcaption>" if note else ""}</figure>')
    # identical outputs
    out.append(str(_h("Identical outputs", 2, "identical")))
    if cmp.groups:
        grows = "".join(f'<tr><th>{esc(what)}</th><td>{" ".join(_group(g) for g in groups)}</td></tr>'
                        for what, groups in cmp.groups)
        out.append('<p class="muted">Runs listed together stored byte-identical values (equal digests).</p>'
                   f'<table class="groups" id="groups">{grows}</table>')
    else:
        out.append('<p class="muted" id="groups">No two of these runs stored identical outputs.</p>')
    # calls: where they diverge
    if cmp.divergences or cmp.errors:
        out.append(str(_h("Logged calls", 2, "calls")))
        for d in cmp.divergences:
            out.append(str(_divergence(ctx, d)))
        for e in cmp.errors:
            out.append(str(display.error_line(e)))
    # against the reference: code, files, environment
    for other, d, why in cmp.diffs:
        out.append(str(_h(f"{ref} → {other.name}", 2)))
        if why:
            out.append(str(display.error_line(f"cannot compare: {why}")))
            continue
        out.append(str(_diff_section(ctx, d, [x for x in cmp.file_diffs if x[0] == other.name], cmp.runs[0], other)))
    return Html("".join(out))


def _group(names: list[str]) -> str:
    return '<span class="group">' + ", ".join(f"<code>{esc(n)}</code>" for n in names) + "</span>"


def _summary(cmp: model.Comparison) -> Html:
    differ = sum(1 for k in cmp.keys if cmp.differs[k])
    parts = [f"{differ} of {len(cmp.keys)} info values differ"]
    for other, d, _ in cmp.diffs:
        if d is None:
            continue
        f = d["files"]
        changed = sum(len(v) for v in f.values())
        parts.append(f"{other.name}: " + ("same code" if d["commit"]["same"] and d["patch"]["same"] else "code differs")
                     + (f", {changed} tracked files differ" if changed else ""))
    return Html('<p class="summary">' + esc("; ".join(parts)) + "</p>")


def _patches(d: Any, ra: Any, rb: Any) -> list:
    """Only one run has uncommitted changes: its patch as it is; both have: how the patches differ."""
    pa, why_a = display.attempt(ra.patch, b"")
    pb, why_b = display.attempt(rb.patch, b"")
    out: list[Any] = [display.error_line(f"the patch of {r.name}: {w}") for r, w in ((ra, why_a), (rb, why_b)) if w]
    if not why_a and not why_b and (not pa) != (not pb):
        r, patch = (rb, pb) if pb else (ra, pa)
        return out + [display.heading(f"uncommitted changes: only {r.name} has them"),
                      patch_html(patch.decode("utf-8", "replace"))]
    return out + [display.heading(f"uncommitted changes: {ra.name}.patch → {rb.name}.patch"),
                  patch_html(str(d["patch"].get("diff") or ""))]


def _commit(h: Any) -> str:
    return display.hexshort(h, 10) if isinstance(h, str) and h else "none (not in git)"


def _diff_section(ctx: Ctx, d: Any, file_diffs: list, ra: Any, rb: Any) -> Html:
    a, b = str(d["a"]), str(d["b"])
    c = d["commit"]
    pairs: list[tuple[str, Any]] = [
        ("commit", ("same " + _commit(c["a"])) if c["same"] else f"{_commit(c['a'])} → {_commit(c['b'])}"),
        ("uncommitted changes", "same" if d["patch"]["same"] else "differ (below)")]
    out: list[Any] = [kv_table(pairs)]
    files = d["files"]
    if any(files.values()):
        rows = [(code(p), k) for k in ("added", "removed", "changed") for p in files[k]]
        out += [display.heading("tracked files"), table(["path", "how"], rows)]
    for _n, path, kind, text in file_diffs:
        if kind == "text":
            out += [display.heading(f"{path}"), patch_html(text) if text else Html("<p>same text</p>")]
        else:
            out += [display.heading(f"{path} ({kind})"), Html(f"<p>{esc(text)}</p>")]
    meta = d["meta"]
    meta_rows: list[tuple[str, Html, Html]] = []
    for k, v in meta.items():
        if k == "packages" and isinstance(v, dict):
            meta_rows += [(f"package {p}", code(ab.get("a") or "-"), code(ab.get("b") or "-")) for p, ab in list(v.items())[:200]]
        elif k == "env" and isinstance(v, dict):
            env_a, env_b = v.get("a"), v.get("b")
            ea: dict[str, Any] = env_a if isinstance(env_a, dict) else {}
            eb: dict[str, Any] = env_b if isinstance(env_b, dict) else {}
            meta_rows += [(f"env {name}", code(ea.get(name, "-")), code(eb.get(name, "-")))
                          for name in sorted(set(ea) | set(eb)) if ea.get(name) != eb.get(name)]
        elif isinstance(v, dict):
            meta_rows.append((k, code(short_repr(v.get("a"), 200)), code(short_repr(v.get("b"), 200))))
    if meta_rows:
        out += [display.heading("environment and packages that differ"), table(["what", a, b], meta_rows)]
    # the cache's answer (model.compare asks casmon.diff without the call log: its divergence section answers)
    results = d.get("results") or []
    if results:
        out += [display.heading("same inputs, different results"),
                table(["function", "calls", "via"], [(code(x["function"]), x["calls"], x["via"]) for x in results], num=[1])]
    if not d["patch"]["same"]:
        out += _patches(d, ra, rb)
    return Html('<section class="diff">' + "".join(display.cell(x) for x in out) + "</section>")


def _call_href(c) -> str:
    return url("/call", fn=c.name, session=c.session, n=c.n)


def _divergence(ctx: Ctx, d: model.Divergence) -> Html:
    head = f"{d.a} → {d.b}"
    if d.note:
        return Html(f'<p class="divergence"><b>{esc(head)}</b>: {esc(d.note)}</p>')
    if d.first is None:
        text = f"{d.compared:,} calls paired by function and number; every pair with the same inputs has the same result"
        extra = ""
    else:
        k, x, y = d.first
        text = f"first call with the same inputs and a different result: {x.name} call {k}"
        extra = (f" ({ctx.link(_call_href(x), f'{d.a}: #{x.n} in session {x.session}')} · "
                 f"{ctx.link(_call_href(y), f'{d.b}: #{y.n} in session {y.session}')})")
    inputs = ""
    if d.first_inputs is not None:
        k, x, _y = d.first_inputs
        inputs = f"; inputs first differ at {esc(x.name)} call {k}"
    cls = "divergence found" if d.first else "divergence"
    return Html(f'<p class="{cls}"><b>{esc(head)}</b>: {esc(text)}{extra}{inputs}</p>')


def compare_page(ctx: Ctx, cmp: model.Comparison, tails: list[str], metric: str | None) -> bytes:
    return layout(ctx, "Compare " + ", ".join(r.name for r in cmp.runs), compare_body(ctx, cmp, tails, metric), "Runs")


def report(ctx: Ctx, cmp: model.Comparison, tails: list[str]) -> bytes:
    """The compare page as one file: style and script inline, allowed by their hashes, nothing fetched."""
    css, js = _bundled("casmon-ui.css"), _bundled("casmon-ui.js")
    policy = (f"default-src 'none'; style-src {csp_hash(css)} {DISPLAY_STYLE}; script-src {csp_hash(js)}; "
              "img-src data:; form-action 'none'; base-uri 'none'")
    names = ", ".join(r.name for r in cmp.runs)
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{esc(policy)}">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<title>casmon report: {esc(names)}</title><link rel="icon" href="data:,"><style>{css}</style>'
            f'<script>{js}</script></head><body class="report"><header class="top"><span class="brand">casmon report</span>'
            f'<span class="store">{esc(ctx.store_url)}</span><span class="muted">written {esc(when(_now()))}</span></header>'
            f'<main class="casmon-view">{compare_body(ctx, cmp, tails, None)}</main></body></html>').encode("utf-8")


def _now() -> float:
    import time

    return time.time()


# -- one run --------------------------------------------------------------------------------------------

OUTPUT_TAIL_LINES = 200


def run_page(ctx: Ctx, e: model.Entry, r: Any) -> bytes:
    m = r.manifest
    out: list[Any] = [Html(f"<h1>Run <code>{esc(r.name)}</code> {status_badge(m.get('status', '?'))}</h1>")]
    out.append(display.run_html(r))
    if m.get("traceback"):
        out += [_h("Traceback"), Html(f"<pre class=\"traceback\">{esc(m['traceback'])}</pre>")]
    g = m.get("git") or {}
    if g.get("patch"):
        patch, why = display.attempt(lambda: r.patch().decode("utf-8", "replace"), "")
        out.append(_h("Uncommitted changes (the patch)", 2, "patch"))
        out.append(display.error_line(why) if why else patch_html(patch))
    if m.get("output"):
        text, why = display.attempt(r.output, "")
        out.append(_h("Captured output", 2, "output"))
        if why:
            out.append(display.error_line(why))
        else:
            lines = text.splitlines()
            if len(lines) > OUTPUT_TAIL_LINES:
                out.append(Html(f'<p class="muted">the last {OUTPUT_TAIL_LINES} of {len(lines):,} lines</p>'
                                f'<pre class="output tail">{esc(chr(10).join(lines[-OUTPUT_TAIL_LINES:]))}</pre>'
                                f'<details><summary>all {len(lines):,} lines</summary>'
                                f'<pre class="output">{esc(text)}</pre></details>'))
            else:
                out.append(Html(f'<pre class="output">{esc(text)}</pre>'))
    links = m.get("links") or {}
    sessions = [s for s in links.get("call_sessions", []) if type(s) is int]
    cache = [x for x in links.get("cache", []) if isinstance(x, dict)]
    if sessions or cache:
        out.append(_h("Links", 2, "links"))
        if sessions:
            out.append(Html(f"<p>{ctx.link(url('/calls', run=e.tail), 'the calls made during this run', 'run-calls')}"
                            " · call-log sessions: " + ", ".join(
                                str(ctx.link(url("/calls", session=s), f"session {s}")) for s in sessions) + "</p>"))
        if cache:
            rows = [(ctx.link(url("/cache", fn=x.get("fn")), code(x.get("fn"))), code(display.hexshort(x.get("key"))),
                     code(display.hexshort(x.get("result"))), "hit" if x.get("hit") else "stored")
                    for x in cache[:500]]
            out += [display.heading(f"cache entries ({len(cache)})"), table(["function", "key", "result", "how"], rows)]
    return layout(ctx, f"Run {r.name}", Html("".join(display.cell(x) for x in out)), "Runs")


# -- calls ---------------------------------------------------------------------------------------------


def calls_page(ctx: Ctx, log: Any, summary: model.CallsSummary, calls: list, bins: list, filters: dict, page: int,
               per: int, read_at: float) -> bytes:
    fn_rows = [(ctx.link(url("/calls", fn=name), code(name)), f"{n:,}", f"{ns:,}", seconds(total),
                seconds(total / n) if n else "-") for name, n, ns, total in summary.functions]
    total_calls = sum(n for _, n, _, _ in summary.functions)
    out: list[Any] = [Html(f"<h1>Calls <span class=\"muted\">{esc(plural(total_calls, 'call'))} of "
                           f"{esc(plural(len(summary.functions), 'function'))} in "
                           f"{esc(plural(len(summary.sessions), 'session'))}</span></h1>"),
                      Html(f'<p class="muted">read {esc(when(read_at))} · '
                           f'{ctx.link(url("/calls", reload=1, **filters), "read again")}</p>'),
                      _h("Functions", 2), table(["function", "calls", "sessions", "total time", "mean"], fn_rows, num=[1, 2, 3, 4])]
    sel = []
    for key, label, options in (("fn", "function", [f[0] for f in summary.functions]),
                                ("session", "session", summary.sessions), ("process", "process", summary.processes),
                                ("rank", "rank", summary.ranks)):
        cur = filters.get(key)
        opts = '<option value="">any</option>' + "".join(
            f'<option value="{esc(o)}"{" selected" if str(o) == str(cur) else ""}>{esc(o)}</option>' for o in options[:2000])
        sel.append(f'<label>{esc(label)} <select name="{key}">{opts}</select></label>')
    sel.append(f'<label>thread <input type="text" name="thread" value="{esc(filters.get("thread") or "")}" size="12"></label>')
    out.append(Html(f'<form class="filter" id="calls-filter" method="get" action="/calls">{" ".join(sel)} '
                    f'<button type="submit">Filter</button></form>'))
    what = " · ".join(f"{k} {v}" for k, v in filters.items() if v not in (None, "")) or "all calls"
    out.append(_h(f"Durations ({what}: {len(calls):,} calls)", 2, "durations"))
    out.append(Html(f'<figure class="histogram">{charts.histogram(bins, "calls by duration (log scale)", _dur_label)}'
                    "</figure>") if bins else Html('<p class="muted">no calls</p>'))
    pages = max(1, math.ceil(len(calls) / per))
    page = min(max(page, 1), pages)
    shown = calls[(page - 1) * per: page * per]
    rows = []
    for c in shown:
        status = Html(f'<span class="casmon-error">raised {esc(c.exception[0])}</span>') if c.exception else "ok"
        rows.append((ctx.link(_call_href(c), code(f"{c.name.rsplit('.', 1)[-1]} #{c.n}")), c.session, c.pid,
                     c.thread_name, "" if c.rank is None else c.rank, when(c.start), seconds(c.duration), status))
    out += [_h("Calls", 2, "list"), table(["call", "session", "process", "thread", "rank", "started", "duration", "status"],
                                          rows, num=[1, 2, 6])]
    if pages > 1:
        nav = []
        if page > 1:
            nav.append(f'<a href="{esc(url("/calls", page=page - 1, **filters))}">‹ previous</a>')
        nav.append(f'<span class="current">page {page:,} of {pages:,}</span>')
        if page < pages:
            nav.append(f'<a href="{esc(url("/calls", page=page + 1, **filters))}">next ›</a>')
        out.append(Html('<nav class="pager">' + " ".join(nav) + "</nav>"))
    return layout(ctx, "Calls", Html("".join(display.cell(x) for x in out)), "Calls")


def _dur_label(lo: float, hi: float) -> str:
    return seconds(lo) if lo == hi else f"{seconds(lo)} – {seconds(hi)}"


def call_page(ctx: Ctx, log: Any, c: Any) -> bytes:
    pairs = [("function", code(c.name)), ("signature", code(display.attempt(lambda: log.signature(c.name), c.name)[0])),
             ("call", f"#{c.n} in session {c.session}"), ("process", c.pid), ("thread", c.thread_name),
             ("rank", "-" if c.rank is None else c.rank), ("started", when(c.start)), ("took", seconds(c.duration)),
             ("status", Html(f'<span class="casmon-error">raised {esc(c.exception[0])}: {esc(c.exception[1])}</span>')
              if c.exception else "ok")]
    heads = ["name", "kind", "shape", "dtype", "size", "digest", "value" if ctx.trust else "described"]

    def row(name: str, cell: Any) -> tuple:
        d = model.cell_details(log, cell, ctx.trust)
        return (code(name), d["kind"], d["shape"], d["dtype"], size(d["size"]) if d["size"] is not None else "",
                code(d["digest"]), code(d["text"]))

    inputs = [row(n, cell) for n, cell in model.call_inputs(log, c)]
    out: list[Any] = [Html(f"<h1>Call <code>{esc(c.name)}</code> #{c.n}</h1>"), kv_table(pairs),
                      _h("Inputs", 2, "inputs"), table(heads, inputs)]
    if c.exception is None:
        out += [_h("Result", 2, "result"), table(heads, [row("result", c.result_cell)])]
    if not ctx.trust:
        out.append(Html('<p class="muted">Values are described from their manifests; nothing was unpickled '
                        "(<code>casmon ui --trust</code> loads them).</p>"))
    return layout(ctx, f"{c.name} #{c.n}", Html("".join(display.cell(x) for x in out)), "Calls")


# -- cache and store ----------------------------------------------------------------------------------


def cache_page(ctx: Ctx, summary: dict, fn: str | None, entries: list, describe) -> bytes:
    rows = [(ctx.link(url("/cache", fn=name), code(name)), f"{s['entries']:,}", size(s["bytes"]), f"{s['hits']:,}",
             when(s["last_used"] or None)) for name, s in sorted(summary.items())]
    total = sum(s["bytes"] for s in summary.values())
    out: list[Any] = [Html(f"<h1>Cache <span class=\"muted\">{esc(plural(len(summary), 'function'))}, "
                           f"{esc(size(total))}</span></h1>"),
                      table(["function", "entries", "bytes", "hits", "last use"], rows, num=[1, 2, 3])]
    if fn is not None:
        erows = [(code(display.hexshort(k.hex(), 16)), code(describe(r.get("result"))), size(r.get("size")),
                  seconds(r.get("seconds")), when(r.get("time")), "" if r.get("label") is None else display.show(r["label"]))
                 for k, r in entries[:500]]
        out += [_h(f"Entries of {fn}", 2, "entries"),
                table(["key", "result", "size", "took", "stored", "label"], erows, num=[2, 3])]
        if len(entries) > 500:
            out.append(Html(f'<p class="muted">the newest 500 of {len(entries):,}</p>'))
    return layout(ctx, "Cache", Html("".join(display.cell(x) for x in out)), "Cache")


def store_page(ctx: Ctx, st: dict) -> bytes:
    g = st.get
    pairs = [("location", code(g("store"))),
             ("values", f"{g('values', 0):,} in {g('chunks', 0):,} chunks ({g('packs', 0):,} packs, "
                        f"{g('loose_objects', 0):,} loose objects)"),
             ("logical size", size(g("logical_bytes"))),
             ("after dedup", f"{size(g('chunk_bytes'))} (dedup ratio {display.ratio(g('dedup_ratio'))})"),
             ("objects on disk", f"{size(g('object_bytes'))} (compression ratio {display.ratio(g('compression_ratio'))})"),
             ("store on disk", f"{size(g('stored_bytes'))} in {g('files', 0):,} files"),
             ("refs", f"{g('refs', 0):,}"),
             ("damaged files", f"{g('damaged_files', 0):,}" + (" (casmon verify names them)" if g("damaged_files") else ""))]
    area = g("bytes_by_area") or {}
    files = g("files_by_area") or {}
    total = sum(area.values()) or 1
    arows = [(code(k), f"{files.get(k, 0):,}", size(v), f"{100 * v / total:.1f} %") for k, v in area.items()]
    recs = [(code(k), f"{v:,}") for k, v in (g("records") or {}).items()]
    bars = charts.bars(list(area), [float(v) / 2**20 for v in area.values()], "size by area (MiB)") if area else ""
    out = [Html("<h1>Store</h1>"), kv_table(pairs), _h("Size by area", 2, "areas"),
           table(["area", "files", "size", "share"], arows, num=[1, 2, 3]), Html(f"<figure>{bars}</figure>"),
           _h("Records", 2, "records"), table(["kind", "records"], recs, num=[1])]
    return layout(ctx, "Store", Html("".join(display.cell(x) for x in out)), "Store")
